"""A mixture of experts' memory terms: the experts' states as each rank holds them, and what a
MoE layer's MLP saves for backward. ``memory`` (autotune's runtime) and ``engine_memory`` (the
other engines) call these; neither counts an expert of its own.

**States.** A MoE layer's tensors are the description's (``ModelShape.layer_tensors``): the
router's gate and the shared experts as a dense layer's tensors (TP-sharded as its MLP, or
whole where the runtime leaves the MoE MLP whole), the routed experts' stacked ``[E, …]``
weights (``TP_EXPERT``) with E / ep rows on each rank of an ep group. Who shards the experts:

- autotune's runtime (``trial/parallel/expert.py``, :func:`expert_states`): with ep > 1 under
  DDP or replicate the experts are outside data parallelism (``expert.local_params``), held
  whole with their gradients and AdamW state on every rank of their expert-data group; under
  FSDP2 (ZeRO-2/3) each MoE layer's experts are a unit of their own sharded over efsdp (as
  torchtitan's), whole where efsdp is 1; with ep 1 they are parameters like any other.
- torchtitan (``parallel_dims.py`` at b5bcd76): FSDP2 over efsdp = dp_shard · cp · tp / ep.
- Megatron-Core: the distributed optimizer over the expert data-parallel group, EDP = world /
  (pp · ep · etp) (``parallel_state.py``, MoE parallel folding).

**Activations** (:func:`routed_mlp_bytes`), counted tensor by tensor from
``trial/models/moe.py`` and ``trial/parallel/expert.py`` (``tests/model/test_moe_memory.py``
asserts the count against ``torch.autograd.graph.saved_tensors_hooks``). For ``t`` tokens on
the rank, ``p = top_k · t`` (token, slot) pairs and ``r`` rows its experts receive:

- the router: the sigmoid's fp32 scores (t · E), the top-k indices (int64, p), the gathered
  fp32 gate weights and their sum (p + t); the pairs' source tokens and their order by expert
  (int64, 2p); the combine: the gate weights per pair in the compute dtype (p) and the
  experts' outputs in pair order (p · h), which the gating product saves, and that product
  (p · h), which ``index_add`` saves as its source;
- the routed experts: their input rows (r · h; at ep > 1 the rows the all-to-all brought,
  regrouped by local expert, with that permutation: int64, r) and each SwiGLU's w1 and w3
  outputs, silu's and the product (4 · r · f); at ep > 1 also their outputs (r · h), which
  ``index_copy`` saves as its source before the all-to-all takes them back;
- the shared experts: a SwiGLU of width shared · f over the t tokens (4 · t · shared · f).

The layer's input, the norm's output, is the norm's (``memory._norm_bytes``). The all-to-all
saves nothing (its backward is the reverse exchange). Dropless routing gives a rank ``r = p``
rows on average (every rank of an ep group routes its own t tokens and receives its experts'
share of all of them); the worst rank takes more: :data:`ROUTED_ALLOWANCE` at ep > 1.

The other engines (``engine_memory``) read the same count over the tokens that enter their MoE
layer (b · s / tp under sequence parallelism, which Megatron and torchtitan keep through the
router): an approximation, their grouped GEMMs and permutation buffers not counted apart. A
Hugging Face MoE block (``HFShape``) keeps its dense block's activation count for now.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from autotune.model.description import LocalTensors, local_block, local_shape
from autotune.model.moe_time import expert_data_parallel
from autotune.moe import MoESpec
from autotune.shapes import TP_EXPERT, ModelShape

FP32_BYTES = 4
INDEX_BYTES = 8
"""Bytes of an int64 index (``torch.topk``'s, ``argsort``'s)."""

ROUTED_ALLOWANCE = 1.25
"""The worst rank's received rows over the even share, at ep > 1: a stated allowance, not a
measurement. The CPU trials of ``bench/moe_memory.py`` measured 1.02 to 1.06 on moe-tiny (the
worst rank's pairs summed over its MoE layers, from ``RankResult.extra["tokens_per_expert"]``
summed over its ep group), which the bench prints beside each row; at scale the balancing bias
(aux-loss-free, Wang et al. 2024) steers the experts towards their share, and a peak is read at
the worst step, so the allowance keeps a quarter above it until trials at scale measure it."""


@dataclass(frozen=True, slots=True)
class ExpertStates:
    """A rank's routed experts as its runtime holds them (elements, TP- and EP-local)."""

    held: int
    """Elements at rest (parameters; as many gradients and optimizer-state elements)."""
    tensors: int
    """Their tensors (AdamW's step counters)."""
    gathered: int = 0
    """Elements FSDP2 gathers for compute (0: the experts are outside FSDP)."""
    units: tuple[int, ...] = ()
    """FSDP2 units of their own, unsharded (one per MoE layer)."""
    outside: int = 0
    """Elements data parallelism leaves alone (DDP, replicate, FSDP2 skip them)."""


def expert_states(local: tuple[LocalTensors, ...], dp: int, tp: int, ep: int, zero: int):
    """Each block's local experts (``local``, E / ep rows each) as autotune's runtime holds
    them on a rank of ``dp`` state shards (dp_shard × cp) and ``tp``: under ZeRO-2/3 with
    efsdp = dp · tp / ep > 1 each MoE layer's experts are an FSDP2 unit of their own sharded
    over efsdp (``expert.shard_experts``, torchtitan's ``apply_fsdp``; dim 1 where efsdp · ep
    exceeds the experts, counted here as its columns ÷ efsdp, exact where efsdp divides
    them), else they stay whole, outside data parallelism, at ep > 1 (with ep 1 they are in
    the blocks). HSDP's replicas of those units (dp_replicate) are not counted apart."""
    tensors = sum(len(x.shapes) for x in local)
    whole = sum(x.numel for x in local)
    efsdp = dp * tp // ep
    if not (zero >= 2 and efsdp > 1 and whole):
        return ExpertStates(whole, tensors, outside=whole)
    held = 0
    for x in local:
        for rows, cols in x.shapes:
            dim0 = rows >= efsdp  # Shard(0) unless fewer local experts than shards
            held += -(-rows // efsdp) * cols if dim0 else rows * -(-cols // efsdp)
    units = tuple(x.numel for x in local if x.numel)
    return ExpertStates(held, tensors, gathered=whole, units=units)


def received_rows(spec: MoESpec, tokens: int, ep: int, allowance: float | None = None) -> int:
    """Rows the rank's experts take for ``tokens`` tokens on each rank of its ep group:
    every (token, slot) pair at ep 1; at ep > 1 the even share (top_k · tokens) times the
    worst rank's allowance (:data:`ROUTED_ALLOWANCE` unless given)."""
    pairs = spec.top_k * tokens
    if ep == 1:
        return pairs
    return math.ceil(pairs * (ROUTED_ALLOWANCE if allowance is None else allowance))


def routed_mlp_bytes(
    spec: MoESpec, hidden: int, tokens: int, e: int, ep: int, allowance: float | None = None
) -> int:
    """What one MoE layer's MLP (router, routed and shared experts) saves for backward for
    ``tokens`` tokens on the rank, activations of ``e`` bytes (the module docstring counts
    it)."""
    h, f = hidden, spec.expert_ffn_size
    pairs = spec.top_k * tokens
    rows = received_rows(spec, tokens, ep, allowance)
    router = FP32_BYTES * (tokens * spec.num_experts + pairs + tokens) + INDEX_BYTES * pairs
    if spec.aux_loss_coeff > 0:
        router += FP32_BYTES * tokens  # the auxiliary loss's normalising sum of the scores
    combine = 2 * INDEX_BYTES * pairs + e * pairs * (2 * h + 1)
    experts = e * rows * (h + 4 * f)
    if ep > 1:  # the arrival order by local expert, and the outputs index_copy saves
        experts += INDEX_BYTES * rows + e * rows * h
    shared = 4 * e * tokens * spec.num_shared_experts * f
    return router + combine + experts + shared


def moe_backward_bytes(
    spec: MoESpec, hidden: int, tokens: int, e: int, ep: int, allowance: float | None = None
) -> int:
    """The largest temporary of one MoE layer's backward above what it saved: the gradient of
    the experts' outputs in pair order (p · h), and at ep > 1 that of the rows the all-to-all
    brought (r · h) before it sends it back (measured with the profiler's allocation events on
    two moe-tiny blocks, t = 256: within 2% with no checkpointing; the experts' f-wide
    gradients are per expert, r / E rows at a time, and the saved tensors they replace are
    freed as they go)."""
    pairs = spec.top_k * tokens
    rows = received_rows(spec, tokens, ep, allowance) if ep > 1 else 0
    return e * hidden * (pairs + rows)


@lru_cache(maxsize=4096)
def layer_tensors(
    shape: ModelShape, layer: int, tp: int, ep: int, engine: bool = False
) -> tuple[LocalTensors, LocalTensors]:
    """(the tensors data parallelism holds, the experts it leaves alone) of layer ``layer`` on
    one rank: TP-sharded as the description says (a MoE layer's router and shared experts
    whole on every TP rank, as autotune's TP plan leaves its MoE MLP, unless ``engine``), the
    experts' rows ÷ ep; the experts are the second with ep > 1 in autotune's runtime, always
    for an ``engine`` (Megatron, DeepSpeed: sharded over their own group)."""
    held, experts = [], []
    moe_layer = shape.moe is not None and shape.moe.is_moe_layer(layer)
    for t in shape.layer_tensors(layer):
        if t.tp == TP_EXPERT:
            (experts if ep > 1 or engine else held).append((-(-t.rows // ep), t.cols))
        elif moe_layer and not engine and t.name.startswith(("router.", "shared_experts.")):
            held.append((t.rows, t.cols))
        else:
            held.append(local_shape(t, tp, 1))
    return LocalTensors(tuple(held)), LocalTensors(tuple(experts))


def expert_data_ranks(config) -> int:
    """The ranks one expert's states are sharded over in Megatron-Core (EDP = world / (pp · ep
    · etp), MoE parallel folding; etp 1 here) and DeepSpeed's expert data-parallel group: the
    step-time model's group (``moe_time.expert_data_parallel``), read from the config."""
    return expert_data_parallel(config.world_size, config.pp_degree, config.ep_degree)


def rank_numel(shape: ModelShape, parts: tuple, tp: int, ep: int) -> tuple[int, int]:
    """(the blocks' elements but the routed experts', the routed experts' elements) a rank of
    ``parts`` holds as an engine shards them (:func:`layer_tensors` with ``engine``)."""
    if shape.moe is None:
        return sum(p.num_layers for p in parts) * local_block(shape, tp).numel, 0
    blocks = experts = 0
    for p in parts:
        for i in range(p.first_layer, p.first_layer + p.num_layers):
            held, local = layer_tensors(shape, i, tp, ep, engine=True)
            blocks, experts = blocks + held.numel, experts + local.numel
    return blocks, experts


def part_blocks(
    shape: ModelShape, first_layer: int, num_layers: int, tp: int, ep: int
) -> tuple[tuple[LocalTensors, LocalTensors], ...]:
    """Each layer's :func:`layer_tensors` of a part holding layers ``first_layer`` … on."""
    return tuple(
        layer_tensors(shape, i, tp, ep) for i in range(first_layer, first_layer + num_layers)
    )


@lru_cache(maxsize=4096)
def rank_blocks(
    shape: ModelShape, parts: tuple, tp: int, ep: int
) -> tuple[tuple[tuple[tuple[LocalTensors, int], ...], ...], tuple[LocalTensors, ...]]:
    """The blocks of a rank's ``parts`` (``memory._Part``: first layer, layers) as data
    parallelism holds them, per part as runs of (tensors, consecutive blocks holding them), and
    each block's experts it leaves alone, in order (:func:`layer_tensors`)."""
    runs, local = [], []
    for part in parts:
        part_runs: list[tuple[LocalTensors, int]] = []
        for held, experts in part_blocks(shape, part.first_layer, part.num_layers, tp, ep):
            if part_runs and part_runs[-1][0] == held:
                part_runs[-1] = (held, part_runs[-1][1] + 1)
            else:
                part_runs.append((held, 1))
            local.append(experts)
        runs.append(tuple(part_runs))
    return tuple(runs), tuple(local)


def layer_kinds(spec: MoESpec | None, parts: tuple) -> tuple[bool, ...]:
    """Whether each kind of layer a rank's ``parts`` hold is a MoE layer: (False,) for a dense
    model; a mixture of experts' dense layers (False) and MoE layers (True) where it holds
    them."""
    if spec is None:
        return (False,)
    layers = (i for p in parts for i in range(p.first_layer, p.first_layer + p.num_layers))
    return tuple(sorted({spec.is_moe_layer(i) for i in layers})) or (False,)


def tp_reductions(spec: MoESpec | None, parts: tuple) -> int:
    """The TP all-reduces of a layer's output the rank's ``parts`` run per micro-batch: two
    per dense layer (attention's and the MLP's row-parallel outputs), one per MoE layer, whose
    MLP autotune's TP plan leaves whole on every rank (``models/workload.builtin_tp_plan``)."""
    layers = [i for p in parts for i in range(p.first_layer, p.first_layer + p.num_layers)]
    return sum(1 if spec is not None and spec.is_moe_layer(i) else 2 for i in layers)


def part_saved_bytes(
    spec: MoESpec,
    first_layer: int,
    num_layers: int,
    ac_layers: int | None,
    kept: dict[bool, tuple[int, int]],
) -> int:
    """A part's blocks' saved bytes per micro-batch (``description.part_block_bytes`` per
    layer kind): ``kept[moe_layer]`` is (the config's mode, 'none') bytes of one layer of that
    kind; with ``ac_layers`` the first that many blocks take the first (full), the rest the
    second."""
    checkpointed = num_layers if ac_layers is None else min(ac_layers, num_layers)
    total = 0
    for i in range(num_layers):
        own, whole = kept[spec.is_moe_layer(first_layer + i)]
        total += own if i < checkpointed else whole
    return total
