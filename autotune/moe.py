"""A mixture-of-experts MLP, as a model shape's part: ``MoESpec``.

A shape with ``moe`` set replaces the MLP of each layer from ``first_dense_layers`` on by a
router choosing ``top_k`` of ``num_experts`` experts per token (each a SwiGLU MLP of width
``expert_ffn_size``) plus ``num_shared_experts`` experts every token passes through
(``trial/models/moe.py`` builds it). The router scores with a sigmoid and balances the experts
by a bias on the scores that only chooses (aux-loss-free balancing, Wang et al. 2024, as
DeepSeek-V3 and torchtitan's ``models/common/moe.py`` route); an auxiliary load-balancing loss
(Switch Transformer's, Fedus et al. 2021, eq. 4) is optional. Routing is dropless unless a
capacity factor is given.

It imports nothing of the project but its errors.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.errors import ConfigError


@dataclass(frozen=True, slots=True)
class MoESpec:
    """The experts of a mixture-of-experts model."""

    num_experts: int
    """Routed experts per MoE layer."""
    top_k: int
    """Experts each token is routed to."""
    expert_ffn_size: int
    """Each expert's SwiGLU width (w1 and w3: h → f, w2: f → h)."""
    num_shared_experts: int = 0
    """Experts every token passes through (one SwiGLU of width shared × expert_ffn_size)."""
    first_dense_layers: int = 0
    """Leading layers with the dense MLP instead (DeepSeek-V3's ``first_k_dense_replace``)."""
    capacity_factor: float | None = None
    """Tokens an expert takes at most, as a multiple of its even share; None: dropless."""
    load_balance_coeff: float | None = 1e-3
    """The balancing bias's step per optimizer step (torchtitan's ``load_balance_coeff``);
    None: no bias."""
    aux_loss_coeff: float = 0.0
    """Weight of the auxiliary load-balancing loss (0: none)."""

    def __post_init__(self) -> None:
        for name in ("num_experts", "top_k", "expert_ffn_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"moe {name} must be a positive integer, not {value!r}")
        for name in ("num_shared_experts", "first_dense_layers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"moe {name} must be an integer ≥ 0, not {value!r}")
        if self.top_k > self.num_experts:
            raise ConfigError(
                f"moe top_k {self.top_k} exceeds num_experts {self.num_experts}; lower top_k"
            )
        if self.capacity_factor is not None and not self.capacity_factor > 0:
            raise ConfigError(
                f"moe capacity_factor must be > 0, not {self.capacity_factor!r}; leave it "
                "unset for dropless routing"
            )
        if self.load_balance_coeff is not None and not self.load_balance_coeff > 0:
            raise ConfigError(
                f"moe load_balance_coeff must be > 0 or None, not {self.load_balance_coeff!r}"
            )
        if not self.aux_loss_coeff >= 0:
            raise ConfigError(f"moe aux_loss_coeff must be ≥ 0, not {self.aux_loss_coeff!r}")

    def is_moe_layer(self, layer: int) -> bool:
        """Whether layer ``layer`` (global index) has the experts."""
        return layer >= self.first_dense_layers


MOE_TINY = MoESpec(
    num_experts=8, top_k=2, expert_ffn_size=32, num_shared_experts=1, first_dense_layers=1
)
"""The built-in ``moe-tiny``'s experts: 8 experts, top-2, width 32, one shared expert, the
first layer dense (small enough that a CPU trial step takes milliseconds)."""
