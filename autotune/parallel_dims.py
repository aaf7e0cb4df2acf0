"""The parallel degrees of a layout, as one object: ``ParallelDims``.

As torchtitan's ``ParallelDims`` (``torchtitan/distributed/parallel_dims.py``, 0.3.0) it owns
the degrees — pipeline (pp), data-parallel replicas (dp_replicate, HSDP), data-parallel shards
(dp_shard), context (cp), tensor (tp), and expert (ep, carved from dp_shard × cp × tp; always 1
until a layout sets it) —, their rules (each positive, their product the world size, what may
combine), the device mesh's order (``MESH_ORDER``: pp outermost, tp fastest, as
``trial/parallel/mesh.py`` builds it) and the ``*_enabled`` properties. ``TrialConfig.dims``
builds it from a config's degrees; ``TrialConfig.validate`` asks it for the degrees' rules.

It imports nothing of the project but its errors: the config imports it, not the reverse.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.errors import ConfigError

MESH_ORDER = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
"""The device mesh's dimensions, outermost first: ranks are numbered with tp fastest
(torchtitan's ``["pp", "dp_replicate", "dp_shard", "cp", "tp"]``)."""


EXPERT_MESH_ORDER = ("pp", "dp_replicate", "efsdp", "ep")
"""The experts' mesh over the same ranks (torchtitan's sparse mesh, ``parallel_dims.py`` at
b5bcd76: ``["pp", "dp_replicate", "efsdp", "ep"]``): ep fastest, so an ep group is consecutive
ranks, and efsdp = dp_shard × cp × tp / ep."""


@dataclass(frozen=True, slots=True)
class ParallelDims:
    """A layout's degrees: world_size = pp × dp_replicate × dp_shard × cp × tp."""

    world_size: int
    pp: int = 1
    dp_replicate: int = 1
    dp_shard: int = 1
    cp: int = 1
    tp: int = 1
    ep: int = 1
    """Expert-parallel degree, carved from dp_shard × cp × tp (it adds no ranks)."""

    @classmethod
    def of(
        cls,
        world_size: int,
        *,
        tp: int = 1,
        pp: int = 1,
        cp: int = 1,
        dp_replicate: int = 1,
        ep: int = 1,
    ) -> ParallelDims:
        """The dims of a config's degrees: dp = world / (tp × pp × cp), dp_shard = dp /
        dp_replicate (floor division: ``check`` says whether they divide)."""
        dp = world_size // (tp * pp * cp)
        return cls(world_size, pp, dp_replicate, dp // dp_replicate, cp, tp, ep)

    @staticmethod
    def check(
        world_size: int,
        *,
        tp: int = 1,
        pp: int = 1,
        cp: int = 1,
        dp_replicate: int = 1,
        ep: int = 1,
    ) -> None:
        """Raise ``ConfigError`` naming the first broken rule of these degrees and its fix:
        each a positive integer, tp × pp × cp dividing the world, dp_replicate dividing dp,
        ep dividing dp_shard × cp × tp (torchtitan's rule, ``parallel_dims.py``)."""
        for name, value in (
            ("world_size", world_size),
            ("tp_degree", tp),
            ("pp_degree", pp),
            ("cp_degree", cp),
            ("dp_replicate", dp_replicate),
            ("ep_degree", ep),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, not {value!r}")
        model_ranks = tp * pp * cp
        if world_size % model_ranks:
            if cp == 1:
                raise ConfigError(
                    f"tp_degree × pp_degree = {tp * pp} must divide world_size {world_size} "
                    "(tp × pp × dp = world size)"
                )
            raise ConfigError(
                f"tp_degree × pp_degree × cp_degree = {model_ranks} must divide world_size "
                f"{world_size} (dp × cp × tp × pp = world size)"
            )
        dp = world_size // model_ranks
        if dp % dp_replicate:
            raise ConfigError(
                f"dp_replicate {dp_replicate} must divide dp_degree {dp} (HSDP: replica "
                f"groups × shard size = dp); choose among {_divisors(dp)}"
            )
        _check_ep(ep, dp // dp_replicate * cp * tp)

    def check_combination(self, *, seq_len: int, zero_stage: int) -> None:
        """The rules on what may combine: context parallelism needs seq_len divisible by
        2 × cp (causal load balancing gives each rank two chunks), HSDP needs FSDP2 (ZeRO-2/3),
        and ep must divide the ranks it is carved from."""
        if self.cp > 1 and seq_len % (2 * self.cp):
            raise ConfigError(
                f"cp_degree {self.cp} needs seq_len divisible by 2 × cp_degree = "
                f"{2 * self.cp} (causal load balancing gives each rank two chunks), not "
                f"{seq_len}; choose a cp_degree among "
                f"{[d for d in _divisors(seq_len) if seq_len % (2 * d) == 0]}"
            )
        _check_ep(self.ep, self.dp_shard * self.cp * self.tp)
        if self.dp_replicate > 1 and zero_stage < 2:
            raise ConfigError(
                f"dp_replicate {self.dp_replicate} (HSDP) shards with FSDP2: it needs "
                "zero_stage 2 or 3; raise zero_stage or set dp_replicate to 1"
            )

    # ---- derived degrees ---------------------------------------------------------------
    @property
    def dp(self) -> int:
        """Data-parallel ranks, the batch's slices: dp_replicate × dp_shard."""
        return self.dp_replicate * self.dp_shard

    @property
    def dp_shard_cp(self) -> int:
        """Ranks model states are sharded over (FSDP2's ``dp_shard_cp``): dp_shard × cp."""
        return self.dp_shard * self.cp

    @property
    def dp_cp(self) -> int:
        """Ranks gradients are averaged over: dp × cp (cp ranks hold other tokens)."""
        return self.dp * self.cp

    @property
    def efsdp(self) -> int:
        """Ranks each expert's states are sharded over: dp_shard × cp × tp / ep (torchtitan's
        ``efsdp``)."""
        return self.dp_shard * self.cp * self.tp // self.ep

    @property
    def expert_mesh_shape(self) -> tuple[int, ...]:
        """The experts' mesh, outermost first: (pp, dp_replicate, efsdp, ep)
        (``EXPERT_MESH_ORDER``)."""
        return (self.pp, self.dp_replicate, self.efsdp, self.ep)

    @property
    def non_data_parallel_size(self) -> int:
        """Ranks one data-parallel slice spans: cp × tp × pp."""
        return self.cp * self.tp * self.pp

    @property
    def seq_len_divisor(self) -> int:
        """What a sequence's length must be a multiple of: tp (sequence parallelism's shards)
        × 2 · cp (two load-balanced chunks a cp rank)."""
        return self.tp * 2 * self.cp

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        """The degrees in ``MESH_ORDER``."""
        return tuple(getattr(self, name) for name in MESH_ORDER)

    # ---- what is on --------------------------------------------------------------------
    @property
    def dp_enabled(self) -> bool:
        return self.dp > 1

    @property
    def dp_replicate_enabled(self) -> bool:
        return self.dp_replicate > 1

    @property
    def dp_shard_enabled(self) -> bool:
        return self.dp_shard > 1

    @property
    def cp_enabled(self) -> bool:
        return self.cp > 1

    @property
    def dp_cp_enabled(self) -> bool:
        return self.dp_enabled or self.cp_enabled

    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    @property
    def pp_enabled(self) -> bool:
        return self.pp > 1

    @property
    def ep_enabled(self) -> bool:
        return self.ep > 1


def _check_ep(ep: int, carved: int) -> None:
    """ep divides dp_shard × cp × tp (``carved``), the ranks the experts are split over."""
    if carved % ep:
        raise ConfigError(
            f"ep_degree {ep} must divide dp_shard × cp × tp = {carved} (experts are carved "
            f"from those ranks); choose an ep_degree among {_divisors(carved)}"
        )


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]
