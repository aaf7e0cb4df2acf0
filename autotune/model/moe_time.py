"""The step-time terms of a mixture of experts: what its MoE layers add to a step beyond the
attention and the dense MLP the layer terms of ``perf_model`` already price.

A MoE layer (``shapes.ModelShape.layer_tensors``, ``MoESpec``) is priced in three parts:

- **The layer without its routed experts** (:func:`non_routed_shape`): attention (MLA
  included, as the description's tensors give it), the norms and the shared experts as the
  layer's MLP, a dense shape the layer terms read as they read any other layer.
- **The router and the routed experts** (:func:`expert_gemms`): the router's GEMM over the
  rank's tokens, and each of the rank's E/ep experts as GEMMs of the tokens it receives,
  m = tokens · top_k / E of the ep group's tokens (:func:`moe_layout`), n × k its tensor's
  elements per expert (the FLOPs the description counts: 2·m per element). A grouped GEMM
  (``torch._grouped_mm``, Megatron's ``--moe-grouped-gemm``: CUTLASS grouped GEMM) runs each
  expert's rows in tiles of its own, so an expert with few tokens fills few tiles and reaches
  a smaller share of peak, as a small-M GEMM does: NVIDIA, "Matrix Multiplication Background
  User's Guide" (docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication,
  tile and wave quantization). The curve is the one the dense GEMMs use, at m tokens per
  expert: the roofline's per-dimension ``d / (d + d½)`` (``roofline.gemm_efficiency``), or
  the analytic engines' ``perf_model.matmul_efficiency``; nothing else is fitted here.
  Backward is twice the forward, recomputed as the layer's forward is.
- **The dispatch and the combine** (:func:`alltoall_time`): an all-to-all over the ep group
  each, twice forward and twice backward (the gradients go back the way the tokens came), again
  under full recomputation. Each rank sends ``tokens · top_k · h`` elements
  (:func:`dispatch_bytes`), of which (ep − 1)/ep leave it. The ep group is the ranks' fastest
  mesh dimension (torchtitan's ``[pp, dp_replicate, efsdp, ep]``, Megatron's expert mesh with
  ETP 1), so it sits inside a node when it fits one: its time is that share over the
  intra-node link's bus bandwidth (nccl-tests ``PERFORMANCE.md``: an all-to-all's bus
  bandwidth is algbw · (n − 1)/n, the bytes a rank sends to the others; the link's measured
  all-reduce bus bandwidth is taken for it), and across nodes the share bound for other nodes
  over the node's network, which all of its ranks cross at once (the placement rule of
  ``perf_model.collective_time``).

The routing is uneven: the rank whose experts receive the most tokens sets the pace of the
grouped GEMMs and of the all-to-all's receive side. :data:`IMBALANCE_ALLOWANCE` is the
allowance for it where routing is dropless; with a capacity factor, no expert takes more than
that factor of its even share. No engine overlaps the all-to-all with compute by default
(``EngineProfile.ep_comm_overlap``): it is exposed.

Expert gradients synchronise over the expert data-parallel group, world / (pp · ep) ranks
(ETP 1: experts are whole on each TP rank, ``shapes.TP_EXPERT``), not over dp
(:func:`expert_data_parallel`). It imports the description and the cluster, not
``perf_model``, which calls it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache

from autotune.model.cluster import GB, ClusterSpec
from autotune.model.roofline import Gemm
from autotune.shapes import TP_EXPERT, TP_REPLICATED, ModelShape, ParamTensor, stage_layer_counts

IMBALANCE_ALLOWANCE = 1.25
"""The worst expert's tokens over its even share, under dropless routing: the capacity factor
1.25 the Switch Transformer trained with (Fedus et al. 2021, "Switch Transformers", §2.1 and
Table 1: capacity factors 1.0 and 1.25), taken as the load the busiest rank's experts carry."""

ALLTOALLS_FORWARD = 2
"""All-to-alls per MoE layer forward: the dispatch of the tokens to their experts and the
combine of the experts' outputs back (torchtitan ``distributed/expert_parallel.py``,
Megatron's ``MoEAlltoAllTokenDispatcher``); the backward runs two more, the other way."""


@dataclass(frozen=True, slots=True)
class MoELayout:
    """What a layout gives one MoE layer on one rank, per micro-batch."""

    tokens: float
    """Tokens the rank routes: its micro-batch's b·s/cp, ÷ tp (the tokens of a TP group are
    split over it before dispatch: sequence parallelism in Megatron, which MoE with TP needs;
    torchtitan carves ep from the TP ranks)."""
    ep: int
    local_experts: int
    """Routed experts on the rank, E / ep."""
    tokens_per_expert: float
    """Rows each expert's GEMMs take, evenly routed: the ep group's tokens · top_k / E."""
    allowance: float
    """The busiest rank's load over the even share (:data:`IMBALANCE_ALLOWANCE`, or the
    capacity factor when it is smaller)."""


def moe_layout(shape: ModelShape, *, microbatch_tokens: float, tp: int, ep: int) -> MoELayout:
    """The rank's MoE quantities for a micro-batch of ``microbatch_tokens`` (b·s/cp)."""
    spec = shape.moe
    tokens = microbatch_tokens / tp
    cap = spec.capacity_factor
    allowance = IMBALANCE_ALLOWANCE if cap is None else min(IMBALANCE_ALLOWANCE, cap)
    return MoELayout(
        tokens=tokens,
        ep=ep,
        local_experts=spec.num_experts // ep,
        tokens_per_expert=tokens * ep * spec.top_k / spec.num_experts,
        allowance=allowance,
    )


# ---- the description's MoE tensors ---------------------------------------------------------
@lru_cache(maxsize=64)
def moe_layer_tensors(shape: ModelShape) -> tuple[ParamTensor, ...]:
    """A MoE layer's tensors (its first: every MoE layer has the same)."""
    return shape.layer_tensors(shape.moe.first_dense_layers)


def _is_router(t: ParamTensor, shape: ModelShape) -> bool:
    """The router's gate: a replicated [E, h] matrix (``router.gate``, HF's ``mlp.gate`` or
    ``mlp.router``)."""
    return t.tp == TP_REPLICATED and t.rows == shape.moe.num_experts and t.cols == shape.hidden_size


def _per_expert(t: ParamTensor, shape: ModelShape) -> bool:
    """A tensor with a row per expert outside the attention: the routed experts, the router's
    gate and bias, the experts' biases (GPT-OSS's ``experts.gate_up_proj_bias``: 2-D, so not
    among the stacked ``TP_EXPERT`` weights)."""
    return t.tp == TP_EXPERT or (t.rows == shape.moe.num_experts and "attn" not in t.name)


@lru_cache(maxsize=64)
def routed_tensors(shape: ModelShape) -> tuple[ParamTensor, ...]:
    """The routed experts' stacked tensors of a MoE layer (``TP_EXPERT``: E rows of one
    expert's elements each)."""
    return tuple(t for t in moe_layer_tensors(shape) if t.tp == TP_EXPERT)


@lru_cache(maxsize=64)
def router_tensor(shape: ModelShape) -> ParamTensor:
    return next(t for t in moe_layer_tensors(shape) if _is_router(t, shape))


@lru_cache(maxsize=64)
def routed_params(shape: ModelShape) -> int:
    """Elements of a MoE layer's routed experts, all of them."""
    return sum(t.numel for t in routed_tensors(shape))


@lru_cache(maxsize=64)
def non_routed_params(shape: ModelShape) -> int:
    """Elements of a MoE layer but its routed experts: attention, norms, router, shared."""
    return sum(t.numel for t in moe_layer_tensors(shape) if t.tp != TP_EXPERT)


@lru_cache(maxsize=64)
def non_routed_shape(shape: ModelShape) -> ModelShape:
    """A MoE layer without its router and routed experts, as a dense shape: its attention and
    norms as they are, its shared experts as the MLP (width shared · f; none: width 0). The
    experts' biases go with them (added to the experts' outputs, not multiplied)."""
    width = _shared_width(shape)
    if hasattr(shape, "moe_block"):  # an HF shape: the layer's own tensors
        kept = tuple(t for t in moe_layer_tensors(shape) if not _per_expert(t, shape))
        return dataclasses.replace(shape, block=kept, ffn_hidden_size=width, moe=None)
    return dataclasses.replace(shape, ffn_hidden_size=width, moe=None)


def _shared_width(shape: ModelShape) -> int:
    """The shared experts' MLP width: the spec's shared · f for a built-in shape; for an HF
    shape the elements of its shared-expert matrices (2-D, neither attention nor per expert)
    over the MLP's matrices per unit of width (3h gated, 2h not), as Qwen2-MoE's
    ``shared_expert_intermediate_size`` builds them."""
    spec, h = shape.moe, shape.hidden_size
    if not hasattr(shape, "moe_block"):
        return spec.num_shared_experts * spec.expert_ffn_size
    shared = sum(
        t.numel
        for t in moe_layer_tensors(shape)
        if not _per_expert(t, shape) and "attn" not in t.name and min(t.rows, t.cols) > 1
    )
    return shared // ((3 if shape.mlp_kind == "swiglu" else 2) * h)


@lru_cache(maxsize=64)
def active_params(shape: ModelShape, vocab: int) -> float:
    """Parameters a token passes through (for MFU): the roots, the dense layers whole, and
    each MoE layer's non-routed tensors with top_k / E of its routed experts."""
    spec = shape.moe
    roots = sum(t.numel for t in shape.root_tensors(vocab))
    dense = spec.first_dense_layers * sum(t.numel for t in shape.block_tensors())
    moe_layers = shape.num_layers - spec.first_dense_layers
    per_moe = non_routed_params(shape) + routed_params(shape) * spec.top_k / spec.num_experts
    return roots + dense + moe_layers * per_moe


def expert_gemms(shape: ModelShape, ml: MoELayout) -> list[Gemm]:
    """One local expert's GEMMs on the busiest rank, forward: each routed tensor as (m × k) ·
    (k × n) with m its tokens (the even share × the allowance), k = h and n its elements per
    expert ÷ h (the product curve and the bytes are symmetric in n and k, so w2's (h × f) is
    priced as w1's (f × h))."""
    h, m = shape.hidden_size, ml.tokens_per_expert * ml.allowance
    return [Gemm(m, t.cols / h, h) for t in routed_tensors(shape)]


def router_gemm(shape: ModelShape, ml: MoELayout) -> Gemm:
    """The router's GEMM over the rank's tokens: (tokens × h) · (h × E)."""
    return Gemm(ml.tokens, router_tensor(shape).rows, shape.hidden_size)


def expert_flops(shape: ModelShape, ml: MoELayout) -> float:
    """Forward FLOPs of the rank's routed experts and router per MoE layer, evenly routed:
    2·m per element of each expert's tensors (the description's count), over its experts."""
    per_expert = sum(2 * ml.tokens_per_expert * t.cols for t in routed_tensors(shape))
    return ml.local_experts * per_expert + 2 * ml.tokens * router_tensor(shape).numel


# ---- the all-to-all ----------------------------------------------------------------------
def dispatch_bytes(shape: ModelShape, ml: MoELayout, elem_bytes: int) -> float:
    """Bytes one rank's dispatch (or combine) all-to-all moves, in and out of it: its tokens ·
    top_k rows of h elements (the share that stays on the rank included)."""
    return ml.tokens * shape.moe.top_k * shape.hidden_size * elem_bytes


def alltoall_time(cluster: ClusterSpec, efficiency: float, ep: int, nbytes: float) -> float:
    """Seconds of one all-to-all of ``nbytes`` per rank over an ep group of consecutive
    ranks (module docstring): (ep − 1)/ep of it leaves the rank; the share to the group's
    ranks on its node over the intra-node link, the share to other nodes over the node's
    network, which every rank of the node crosses at once; the longer of the two."""
    if ep <= 1 or nbytes <= 0:
        return 0.0
    n = cluster.devices_per_node
    local = min(ep, n)
    intra = cluster.intra_node
    t = (local - 1) / ep * nbytes / (intra.busbw(nbytes, local) * efficiency)
    if ep > n:
        inter = cluster.inter_node
        node_bytes = n * (ep - local) / ep * nbytes
        t = max(t, inter.latency_us * 1e-6 + node_bytes / (inter.bandwidth_gbs * GB * efficiency))
    return t


def alltoalls(recompute_share: float) -> float:
    """All-to-alls per MoE layer per micro-batch: two forward, two backward, and the forward's
    again for the share of layers full recomputation reruns."""
    return 2 * ALLTOALLS_FORWARD + ALLTOALLS_FORWARD * recompute_share


# ---- layers and groups -------------------------------------------------------------------
def rank_moe_layers(shape: ModelShape, pp: int, chunks_per_rank: int) -> tuple[int, ...]:
    """MoE layers on each pipeline rank: its stages r, r + pp, … (``pipeline_chunk_layers``'
    split), less the leading dense layers they hold."""
    counts = stage_layer_counts(shape.num_layers, pp * chunks_per_rank)
    first, out, start = shape.moe.first_dense_layers, [0] * pp, 0
    for stage, count in enumerate(counts):
        out[stage % pp] += max(0, start + count - max(start, first))
        start += count
    return tuple(out)


def expert_data_parallel(world: int, pp: int, ep: int) -> int:
    """Ranks that hold the same experts and average their gradients: world / (pp · ep) (ETP
    1: Megatron's EDP, torchtitan's dp_replicate · efsdp)."""
    return max(1, world // (pp * ep))
