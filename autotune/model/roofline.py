"""Device time of a transformer layer's kernels by the roofline: each GEMM's FLOPs against the
device's peak (at an efficiency that rises with each of its dimensions), its bytes against the
memory bandwidth; causal flash attention by its FLOPs; element-wise kernels by their bytes.

Williams, Waterman and Patterson, "Roofline: An Insightful Visual Performance Model", CACM 2009:
a kernel takes max(FLOPs / peak, bytes / bandwidth). A GEMM of (m × k) · (k × n) does 2mnk FLOPs
and moves at least (mk + kn + mn) elements. Below the roofline, a GEMM reaches a fraction of peak
that falls when a dimension is too small to fill the device's tiles (wave quantisation, short K
loops): ``eff = e_max · Π d / (d + d½)`` over m, n and k, one half-size ``d½`` for all three
(so a backward pass, whose two GEMMs per forward GEMM are the same shapes permuted, costs twice
the forward). The curve is dimensionless, so a fit on one GPU transfers to another whose tiles
are alike; the peak and bandwidth come from the datasheet (``autotune.hardware.GPUS``).

The decoder layer's GEMMs per rank under Megatron's tensor parallelism (Shoeybi et al. 2019,
§3): QKV (n = (h + 2·kv)/t, k = h), the attention output (n = h, k = h/t), the MLP input
(n = j·f/t, k = h, j = 2 for a gated MLP's fused gate and up) and output (n = h, k = f/t), with
m = b·s/cp tokens.

Attention's score FLOPs are 4·b·s²·h per layer forward (Narayanan et al. 2021 §5.1); a causal
FlashAttention kernel (Dao 2023, "FlashAttention-2", §3.1.1: blocks above the diagonal are
skipped) does half, and its backward 2.5× its forward (five matmuls against two; Dao 2023 §3.1.2).
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.model.description import attention_width, window_share
from autotune.shapes import ModelShape


@dataclass(frozen=True, slots=True)
class Gemm:
    """One GEMM (m × k) · (k × n) and how many times a layer's forward runs it."""

    m: float
    n: float
    k: float


def gemm_efficiency(g: Gemm, e_max: float, half_dim: float) -> float:
    """Fraction of peak the GEMM reaches: e_max · Π d / (d + half_dim)."""
    eff = e_max
    for d in (g.m, g.n, g.k):
        eff *= d / (d + half_dim)
    return max(eff, 1e-6)


def gemm_time(
    g: Gemm, *, peak: float, mem_bw: float, elem_bytes: float, e_max: float, half_dim: float
) -> float:
    """Seconds of one GEMM: the longer of its FLOPs at the curve's efficiency and its bytes."""
    flops_s = 2 * g.m * g.n * g.k / (peak * gemm_efficiency(g, e_max, half_dim))
    bytes_s = elem_bytes * (g.m * g.k + g.k * g.n + g.m * g.n) / mem_bw
    return max(flops_s, bytes_s)


def layer_gemms(shape: ModelShape, *, tokens: float, tp: int) -> list[Gemm]:
    """The four GEMMs of one decoder layer's forward on one TP rank (module docstring);
    multi-head latent attention's own (:func:`mla_gemms`) in place of QKV and the output.
    An MLP of width 0 (a MoE layer without shared experts, ``moe_time.non_routed_shape``)
    has none."""
    h, f = shape.hidden_size, shape.ffn_hidden_size
    kv = shape.num_kv_heads * shape.head_dim
    gated = 2 if shape.family == "llama" else 1
    if getattr(shape, "mla", ()):
        attention = mla_gemms(shape, tokens=tokens, tp=tp)
    else:
        attention = [Gemm(tokens, (h + 2 * kv) / tp, h), Gemm(tokens, h, h / tp)]
    mlp = [Gemm(tokens, gated * f / tp, h), Gemm(tokens, h, f / tp)] if f else []
    return attention + mlp


def mla_gemms(shape: ModelShape, *, tokens: float, tp: int) -> list[Gemm]:
    """Multi-head latent attention's GEMMs on one TP rank (DeepSeek-AI 2024, "DeepSeek-V2",
    §2.1.2, the shape's ``mla`` sizes): the query's down-projection to q_lora_rank (none at
    rank 0: the query projected at full rank) and its up-projection to heads × (nope + rope),
    the keys' and values' joint down-projection to kv_lora_rank with the shared rope key, their
    up-projection to heads × (nope + v), the output from heads × v. The down-projections are
    whole on every TP rank (Megatron-Core's MLA; transformers' plan leaves q_a_proj out and
    gives kv_a_proj_with_mqa its own style), the rest column- and row-parallel."""
    h, heads = shape.hidden_size, shape.num_heads
    q_rank, kv_rank, nope, rope, v = shape.mla
    query = (
        [Gemm(tokens, q_rank, h), Gemm(tokens, heads * (nope + rope) / tp, q_rank)]
        if q_rank
        else [Gemm(tokens, heads * (nope + rope) / tp, h)]
    )
    return [
        *query,
        Gemm(tokens, kv_rank + rope, h),
        Gemm(tokens, heads * (nope + v) / tp, kv_rank),
        Gemm(tokens, h, heads * v / tp),
    ]


def layer_gemm_time(
    shape: ModelShape,
    *,
    tokens: float,
    tp: int,
    peak: float,
    mem_bw: float,
    elem_bytes: float,
    e_max: float,
    half_dim: float,
) -> float:
    """Forward seconds of one layer's GEMMs on one rank (``layer_gemms``)."""
    return sum(
        gemm_time(
            g, peak=peak, mem_bw=mem_bw, elem_bytes=elem_bytes, e_max=e_max, half_dim=half_dim
        )
        for g in layer_gemms(shape, tokens=tokens, tp=tp)
    )


FLASH_BACKWARD_RATIO = 2.5
"""FlashAttention's backward over its forward: five matmuls against two (Dao 2023, §3.1.2)."""


def causal_flash_flops(
    shape: ModelShape, *, batch: float, seq: float, keys: float, tp: int
) -> float:
    """Forward FLOPs of causal flash attention on one TP rank: 4·b·s·keys·q / 2 / t (the
    blocks above the diagonal skipped; q the query width, heads × head_dim), times the share
    of key pairs the layers' sliding windows leave (``description.window_share``). ``keys``:
    the keys each query block sees (s without context parallelism)."""
    width = attention_width(shape)
    return 4 * batch * seq * keys * width / 2 / tp * window_share(shape, int(keys))
