"""Predicted per-rank memory of a trial, by category, from arithmetic alone.

``estimate_memory(config)`` says how many bytes the worst rank of a :class:`TrialConfig` will
hold at its peak, split into the categories the runner measures (``runner.MemoryBreakdown``):
parameters, gradients, optimizer state, activations, communication buffers and other. It builds
no model and touches no tensor, so a search can score thousands of configurations a second
(``tests/test_memory.py`` asserts at least 1,000/s; about 50,000/s were measured on one core of
the 2-core CPU development machine).

The formulas are the textbook ones, each cited beside its code, *re-derived for this
implementation* wherever it stores something differently from the paper's setting:

- **Model states** (Rajbhandari et al. 2020, "ZeRO", §3.1 and §5): mixed-precision Adam holds
  2Φ (fp16 parameters) + 2Φ (fp16 gradients) + 12Φ (fp32 master parameters, momentum and
  variance) bytes for Φ parameters, i.e. 16Φ; ZeRO-1 shards the 12Φ over N data-parallel ranks
  (4Φ + 12Φ/N), ZeRO-2 also the gradients (2Φ + 14Φ/N), ZeRO-3 everything (16Φ/N). Here the
  bytes per element follow the trial's precision and the mechanism that trains it
  (:func:`state_bytes`, ``parallel/precision.py``): bf16-mixed/16-mixed under DDP, ZeRO-1 or no
  data parallelism keep the paper's split exactly (half-precision parameters and gradients,
  the optimizer holding fp32 master copies and moments: 2 + 2 + 12 bytes); under FSDP2
  (ZeRO-2/3) the fp32 shards are the master copy, so a shard holds 4 + 4 + 8 bytes and the
  parameters are gathered in half precision for compute (``comm_buffers``; ZeRO-2 keeps them from
  forward through backward, the paper's whole 2Φ). 32-true holds 4 + 4 + 8, bf16-true and
  16-true 2 + 2 + 4 (no master copy). AdamW adds one 4-byte fp32 step counter per parameter
  tensor. What is sharded follows ``parallel/zero.py``:
  ZeRO-1 (``ZeroRedundancyOptimizer``) shards only the optimizer state (master copies
  included), assigning whole tensors
  greedily, largest first, to the least-loaded rank (reproduced exactly, so the worst rank's share
  is exact); for DTensor parameters (tp > 1, or a pipeline with overlap) ZeRO-1 is Megatron's
  distributed optimizer, which splits each bucket of the TP-local parameters into N equal
  shares (reproduced exactly too); ZeRO-2/3 (FSDP2) shard parameters, gradients and state at
  rest, each tensor on dim 0 padded to a multiple of N. With dp_degree 1 nothing is sharded. Tensor
  parallelism divides the
  Megatron-sharded Linear weights by tp (``builtin_tp_plan``); embeddings, norms and the output
  head are replicated. A pipeline rank holds its stages' layers (``split_for_pipeline``), the
  first stage the embeddings, the last the final norm and head.
- **Activations** (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
  Transformer Models", Table 2): see :func:`layer_activation_bytes` for the per-layer
  formula of *this* model, counted tensor by tensor from what autograd saves, and
  :func:`microbatches_in_flight` for how many micro-batches a pipeline schedule keeps.
- **A mixture of experts** (``moe_memory``): each layer's tensors as the description lists them
  (``ModelShape.layer_tensors``), the routed experts E / ep rows per rank, outside data
  parallelism under DDP and sharded over efsdp under FSDP2 as ``trial/parallel/expert.py``
  holds them; a MoE layer's MLP saves the router's, the routed rows' and the shared experts'
  tensors (``moe_memory.routed_mlp_bytes``), the worst rank's rows an allowance above the share.
- **Communication buffers**: DDP's bucket copy of the gradients while ``no_sync`` accumulates
  outside it (``gradient_as_bucket_view`` makes the bucket the gradients otherwise), FSDP2's
  unsharded parameters (ZeRO-2: every unit from forward through backward; ZeRO-3: two units at
  a time) with their all-gather staging buffers, its unsharded gradients while accumulating,
  the flat bucket of the non-overlapped all-reduce, and the distributed optimizer's all-gather
  of one bucket (its share and the gathered bucket).
- **Other**: torch pipelining's receive buffers (one per micro-batch, allocated once), and with
  ``device_type="cpu"`` an allowance for the CPU measurement's blind spot (see below).

The peak is the larger of two moments: forward/backward (saved activations of the micro-batches
in flight, the largest temporary, communication buffers) and after the last backward (gradient
sync and the optimizer step). Gradients are always counted whole — the runner measures them at
rest — which over-predicts by up to the gradients when a single micro-batch peaks before they
exist.

Calibration: the coefficients were fitted to and checked against the runner's measurement of
2,181 (trial, stage) pairs of real CPU trials (world 2 and 4, every ZeRO stage, TP, PP with all
three schedules, every checkpointing mode, micro-batch 1/2/4, sequence 64/128, GPT and Llama,
float32 and bfloat16, SDPA and eager); ``tests/test_memory.py`` states the tolerance reached per
category and re-measures a dozen trials. The CPU measurement (profiler allocation events) sees
neither frees on gloo's threads nor buffers allocated before the measured step, so it varies
between runs; nothing was measured on CUDA (no GPU here): the CUDA-specific terms (foreach AdamW
temporaries) come from reading torch's code.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache, partial

from autotune.config import (
    BYTES_PER_ELEMENT,
    INTERLEAVED_STAGES_PER_RANK,
    MASTER_STEP_CHUNK_NUMEL,
    MIB,
    PRECISION_COMPUTE_DTYPE,
    TrialConfig,
)
from autotune.errors import ConfigError
from autotune.model import layout_quantities, moe_memory
from autotune.model.block_parts import attention_kernel, hf_block_bytes
from autotune.model.description import (
    LocalTensors,
    block_params,
    embedding_tensors,
    local_block,
    local_roots,
    part_block_bytes,
)
from autotune.model.engines import AUTOTUNE_MEMORY, MemoryTraits  # noqa: F401  (re-exported)
from autotune.model.layout_quantities import (  # noqa: F401  (StateBytes, state_bytes: re-exported)
    DATA_PARALLEL_SHARDING_FIELDS,
    FP32_BYTES,
    RUN_FIELDS,
    BoundedMemo,
    LayoutQuantities,
    StateBytes,
    fields_key,
    is_interleaved,
    pipeline_chunk_layers,
    state_bytes,
)
from autotune.shapes import HFShape, ModelShape, stage_layer_counts  # noqa: F401  (re-exported)

ADAM_STEP_BYTES = 4
"""AdamW's per-tensor ``step`` counter: a float32 scalar tensor."""

PIPELINE_RETURNS_OUTPUTS = False
"""Whether the runner's pipeline step keeps and concatenates every micro-batch's logits
(torch's default ``return_outputs=True``: 2·M·e·s·b·V bytes on the last stage). The runner passes
``return_outputs=False``, so they are not kept."""

PHASE_FORWARD_BACKWARD = "forward/backward"
PHASE_AFTER_BACKWARD = "after backward"

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "comm_buffers", "other")


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    """Predicted bytes on one rank at its peak, by category (the runner's categories)."""

    parameters: int
    gradients: int
    optimizer_state: int
    activations: int
    """Tensors saved for backward of the micro-batches in flight, plus backward temporaries."""
    comm_buffers: int
    """Gradient copies outside DDP buckets, FSDP unsharded parameters/gradients, staging."""
    other: int
    """Pipeline receive buffers, the CPU measurement allowance, optimizer-step temporaries."""
    stage: int = 0
    """The pipeline rank (pp rank) this estimate is for."""
    phase: str = "forward/backward"
    """When the peak happens: 'forward/backward', or 'after backward' (gradient sync and
    optimizer step, whose temporaries are then under ``other``)."""

    @property
    def total(self) -> int:
        """Predicted peak bytes on this rank: the sum of the categories."""
        return (
            self.parameters
            + self.gradients
            + self.optimizer_state
            + self.activations
            + self.comm_buffers
            + self.other
        )

    @property
    def model_states(self) -> int:
        return self.parameters + self.gradients + self.optimizer_state

    def as_dict(self) -> dict[str, int]:
        d = {name: getattr(self, name) for name in CATEGORIES}
        d["total"] = self.total
        return d


# ---- the parameter tensors a rank holds: the cost description's (``description``) ---------


@dataclass(frozen=True, slots=True)
class _Part:
    """One (virtual) pipeline stage held by a rank."""

    index: int
    num_layers: int
    first: bool
    last: bool
    first_layer: int = 0
    """The global index of its first layer (a mixture of experts' layers differ)."""


@lru_cache(maxsize=4096)
def _parts(
    num_layers: int,
    pp: int,
    interleaved: bool,
    pp_rank: int,
    virtual_stages: int = INTERLEAVED_STAGES_PER_RANK,
) -> tuple[_Part, ...]:
    """The (virtual) stages of pipeline rank ``pp_rank``: stage i of pp·v on rank i mod pp
    (``virtual_stages`` v per rank when ``interleaved``), layers by ``pipeline_chunk_layers``."""
    chunks_per_rank = virtual_stages if interleaved else 1
    stages = pp * chunks_per_rank
    chunks = pipeline_chunk_layers(num_layers, pp, chunks_per_rank)
    counts = [chunks[i % pp][i // pp] for i in range(stages)]  # by stage
    return tuple(
        _Part(i, counts[i], i == 0, i == stages - 1, sum(counts[:i]))
        for i in range(pp_rank, stages, pp)
    )


@dataclass(frozen=True, slots=True)
class _States:
    """Model-state bytes of one rank plus what FSDP gathers."""

    parameters: int
    gradients: int
    optimizer_state: int
    unsharded_numel: int
    """Parameters of this rank's parts before dp sharding (TP-local)."""
    root_numel: int
    """Of which outside any block (the FSDP root units)."""
    unit_numels: tuple[int, ...]
    """FSDP units (blocks grouped up to bucket_mb, and each part's root), unsharded."""
    largest_tensor_numel: int
    optimizer_numel: int
    """Parameters whose AdamW state this rank holds (its ZeRO-1 share, or its FSDP shard)."""
    gather_numel: int = 0
    """The distributed optimizer's largest bucket, padded (its all-gather output)."""
    expert_numel: int = 0
    """Of the parameters held, the experts data parallelism leaves alone (ep > 1 outside FSDP2:
    whole, with their gradients and optimizer state; ``moe_memory.expert_states``)."""

    def dp_gradients(self, bytes_per: StateBytes) -> int:
        """Gradient bytes in data parallelism's buffers: all but the experts it leaves alone."""
        return self.gradients - self.expert_numel * bytes_per.gradient


@lru_cache(maxsize=65536)
def _states(
    shape: ModelShape,
    vocab: int,
    parts: tuple[_Part, ...],
    tp: int,
    dp: int,
    zero: int,
    bytes_per: StateBytes,
    bucket_mb: float,
    flat_zero1: bool = False,
    ep: int = 1,
) -> _States:
    roots = [local_roots(shape, vocab, p.first, p.last) for p in parts]
    if shape.moe is None:
        layer = local_block(shape, tp)
        runs = tuple(((layer, p.num_layers),) for p in parts)
        units = _fsdp_units(parts, layer, roots, bytes_per.parameter, bucket_mb)
        local, experts = (), moe_memory.ExpertStates(0, 0)
    else:  # a mixture of experts' layers, and its routed experts (moe_memory)
        runs, local = moe_memory.rank_blocks(shape, parts, tp, ep)
        experts = moe_memory.expert_states(local, dp, tp, ep, zero)
        units = _grouped_units(runs, local, roots, bytes_per.parameter, bucket_mb)
        units += experts.units
    blocks = [run for part in runs for run in part]
    numel = sum(n * b.numel for b, n in blocks) + sum(r.numel for r in roots)
    root_numel = sum(r.numel for r in roots)
    tensors = (*(b for b, _ in blocks), *roots, *local)
    biggest = max((r * c for t in tensors for r, c in t.shapes), default=0)
    # optimizer bytes per element: master copy, moments
    state = bytes_per.master + 2 * bytes_per.moment
    bucket_numel = bucket_mb * MIB / bytes_per.parameter
    share = _rank_share(shape, parts, runs, roots, dp, zero, state, bucket_numel, flat_zero1)
    held, optimizer_numel, optimizer_tensors, gather = share
    held, optimizer_numel = held + experts.held, optimizer_numel + experts.held
    return _States(
        held * bytes_per.parameter,
        held * bytes_per.gradient,
        state * optimizer_numel + ADAM_STEP_BYTES * (optimizer_tensors + experts.tensors),
        numel + experts.gathered,
        root_numel,
        units,
        biggest,
        optimizer_numel,
        gather,
        experts.outside,
    )


def _rank_share(
    shape: ModelShape,
    parts: tuple[_Part, ...],
    runs: tuple[tuple[tuple[LocalTensors, int], ...], ...],
    roots: list[LocalTensors],
    dp: int,
    zero: int,
    state: int,
    bucket_numel: float,
    flat_zero1: bool,
) -> tuple[int, int, int, int]:
    """(parameters held, parameters whose optimizer state it holds, their tensors, the
    distributed optimizer's largest gathered bucket) of the worst rank of ``dp`` under ZeRO
    stage ``zero`` (``state``: optimizer bytes per element); ``runs``: per part, its blocks as
    (tensors, consecutive blocks holding them)."""
    blocks = [run for part in runs for run in part]
    numel = sum(n * b.numel for b, n in blocks) + sum(r.numel for r in roots)
    num_tensors = sum(n * len(b.shapes) for b, n in blocks) + sum(len(r.shapes) for r in roots)
    gather = 0
    if dp == 1 or zero == 0:
        # Nothing sharded: parameters, gradients, master copy and two AdamW moments, one step
        # per tensor.
        held = optimizer_numel = numel
        optimizer_tensors = num_tensors
    elif zero == 1 and flat_zero1:
        # DistributedOptimizer (DTensor parameters): the rank's parameters in model order, in
        # buckets of bucket_mb, each split into N equal shares (``distributed_optimizer``).
        held = numel
        optimizer_numel, optimizer_tensors, gather = _flat_partition(
            _model_order_sizes(shape, parts, runs, roots),
            dp,
            bucket_numel,
            state,
        )
    elif zero == 1:
        # ZeroRedundancyOptimizer: whole tensors, largest first, each to the least-loaded rank
        # (``_partition_parameters``); the worst rank's moments and step counters.
        held = numel
        sizes = [r * c for b, n in blocks for r, c in b.shapes * n]
        for root in roots:
            sizes += [r * c for r, c in root.shapes]
        optimizer_numel, optimizer_tensors = _greedy_worst(tuple(sorted(sizes, reverse=True)), dp)
    else:
        # FSDP2 (ZeRO-2/3): every tensor sharded on dim 0, padded to a multiple of N.
        held = optimizer_numel = sum(n * b.fsdp_shard_numel(dp) for b, n in blocks) + sum(
            r.fsdp_shard_numel(dp) for r in roots
        )
        optimizer_tensors = num_tensors
    return held, optimizer_numel, optimizer_tensors, gather


def _fsdp_units(
    parts: tuple[_Part, ...],
    layer: LocalTensors,
    roots: list[LocalTensors],
    parameter_bytes: int,
    bucket_mb: float,
) -> tuple[int, ...]:
    """Unsharded elements of each FSDP unit of the rank's parts, in order."""
    # FSDP units: consecutive blocks grouped until their bytes reach bucket_mb
    # (``zero.group_blocks``), per part; each part's root is a unit of its own.
    per_unit = _layers_per_unit(layer.numel, parameter_bytes, bucket_mb)
    units: list[int] = []
    for p, r in zip(parts, roots):
        full, rest = divmod(p.num_layers, per_unit)
        units += [per_unit * layer.numel] * full + ([rest * layer.numel] if rest else [])
        if r.numel:
            units.append(r.numel)
    return tuple(units)


def _grouped_units(
    runs: tuple[tuple[tuple[LocalTensors, int], ...], ...],
    experts: tuple[LocalTensors, ...],
    roots: list[LocalTensors],
    parameter_bytes: int,
    bucket_mb: float,
) -> tuple[int, ...]:
    """:func:`_fsdp_units` for blocks that differ (a mixture of experts'): consecutive blocks
    grouped until their bytes, the experts data parallelism leaves alone included
    (``experts``: each block's, in order), reach bucket_mb (``zero.group_blocks``); each unit
    gathers its blocks' other tensors."""
    limit, units, local = bucket_mb * MIB, [], iter(experts)
    for part_runs, root in zip(runs, roots):
        unit = size = 0
        for layer, count in part_runs:
            for _ in range(count):
                unit += layer.numel
                size += (layer.numel + next(local).numel) * parameter_bytes
                if size >= limit:
                    units.append(unit)
                    unit = size = 0
        units += [unit] if unit else []
        units += [root.numel] if root.numel else []
    return tuple(units)


def _layers_per_unit(layer_numel: int, parameter_bytes: int, bucket_mb: float) -> int:
    """Blocks per FSDP unit: consecutive blocks grouped until their bytes reach bucket_mb."""
    return max(1, math.ceil(bucket_mb * MIB / (layer_numel * parameter_bytes)))


def _model_order_sizes(
    shape: ModelShape,
    parts: tuple[_Part, ...],
    runs: tuple[tuple[tuple[LocalTensors, int], ...], ...],
    roots: list[LocalTensors],
) -> tuple[int, ...]:
    """Elements of each of the rank's tensors in model order: embeddings, blocks, the rest."""
    sizes = []
    for p, part_runs, r in zip(parts, runs, roots):
        head = embedding_tensors(shape, p.first)
        sizes += [a * b for a, b in r.shapes[:head]]
        for layer, count in part_runs:
            sizes += [a * b for a, b in layer.shapes] * count
        sizes += [a * b for a, b in r.shapes[head:]]
    return tuple(sizes)


@lru_cache(maxsize=4096)
def _greedy_worst(sizes: tuple[int, ...], n: int) -> tuple[int, int]:
    """(elements, tensors) of the most loaded rank after ZeroRedundancyOptimizer's greedy
    partition of ``sizes`` (sorted, largest first) over n ranks (ties go to the lowest rank)."""
    heap = [(0, rank, 0) for rank in range(n)]  # (elements, rank, tensors)
    for size in sizes:
        elements, rank, count = heapq.heappop(heap)
        heapq.heappush(heap, (elements + size, rank, count + 1))
    elements, _, count = max(heap)
    return elements, count


def sync_ranks(config: TrialConfig) -> int:
    """The ranks that hold the same parameters and average their gradients: dp × cp, since
    context-parallel ranks see other tokens of the same sequences (``parallel/zero.py`` syncs,
    and shards, over ``mesh.data_parallel_mesh``). DDP, replicate, ZeRO-1 and FSDP2 and their
    buffers are there wherever this exceeds 1, also at dp 1 under cp."""
    return config.dp_degree * config.cp_degree


def state_shards(config: TrialConfig) -> int:
    """The ranks a ZeRO stage shards model states over. HSDP shards within groups of dp_shard =
    dp / dp_replicate ranks and replicates the shards across the groups (FSDP2 ``fully_shard``
    on a 2-D mesh); cp ranks shard with them: dp_shard × cp (``trial/parallel/mesh.py``,
    torchtitan's ``dp_shard_cp``; ZeRO-1 over dp × cp)."""
    return config.dp_shard * config.cp_degree


def _uses_distributed_optimizer(config: TrialConfig) -> bool:
    """ZeRO-1 of DTensor parameters (``parallel/zero.py``): TP's, or those of FSDP2's replicate,
    which carries data parallelism under a pipeline with overlap on."""
    return (
        config.zero_stage == 1
        and sync_ranks(config) > 1
        and (config.tp_degree > 1 or (config.pp_degree > 1 and config.overlap_enabled))
    )


def flat_buckets(sizes: tuple[int, ...], bucket_numel: float) -> Iterator[tuple[int, int, int]]:
    """(first tensor, tensor past the last, elements) of each of the distributed optimizer's
    buckets over tensors of ``sizes`` in order: a bucket closes once it reaches
    ``bucket_numel``."""
    start = 0
    while start < len(sizes):
        stop, total = start, 0
        while stop < len(sizes) and (stop == start or total < bucket_numel):
            total += sizes[stop]
            stop += 1
        yield start, stop, total
        start = stop


@lru_cache(maxsize=4096)
def _flat_partition(
    sizes: tuple[int, ...], n: int, bucket_numel: float, state_bytes_per_element: int
) -> tuple[int, int, int]:
    """(elements, tensors) of the rank of n with the most optimizer-state bytes, and the largest
    padded bucket, under the
    distributed optimizer's partition of tensors of ``sizes`` (in order): buckets closed once
    they reach ``bucket_numel``, each padded to a multiple of n and split into n equal shares.
    A tensor cut between two ranks has a share, and a step counter, on both."""
    # Per rank, elements and tensors as differences (added at the first rank, taken off after
    # the last): each bucket gives its full shares and its remainder to consecutive ranks, and
    # each tensor counts on the ranks its span [offset, offset + size) meets.
    d_elements, d_tensors = [0] * (n + 2), [0] * (n + 2)
    largest = 0
    for start, stop, total in flat_buckets(sizes, bucket_numel):
        share = -(-total // n)
        largest = max(largest, share * n)
        full, rest = divmod(total, share)
        d_elements[0] += share
        d_elements[full] += rest - share
        d_elements[full + 1] -= rest
        offset = 0
        for size in sizes[start:stop]:
            d_tensors[offset // share] += 1
            d_tensors[(offset + size - 1) // share + 1] -= 1
            offset += size
    elements = list(itertools.accumulate(d_elements[:n]))
    tensors = list(itertools.accumulate(d_tensors[:n]))
    worst = max(
        range(n), key=lambda r: state_bytes_per_element * elements[r] + ADAM_STEP_BYTES * tensors[r]
    )
    return elements[worst], tensors[worst], largest


def model_state_bytes(
    num_params: int,
    *,
    zero_stage: int,
    dp_degree: int,
    tp_degree: int = 1,
    pp_degree: int = 1,
    precision: str = "32-true",
) -> tuple[int, int, int]:
    """(parameters, gradients, optimizer state) bytes per rank at rest for Φ parameters spread
    evenly over tp × pp, when only the count is known (no tensor shapes: no padding, no step
    counters). The optimizer state includes the fp32 master copy.

    ZeRO (Rajbhandari et al. 2020, §5) with this implementation's element sizes
    (:func:`state_bytes`). In 16-mixed / bf16-mixed: ZeRO-0 2Φ + 2Φ + 12Φ = 16Φ and ZeRO-1
    2Φ + 2Φ + 12Φ/N, the paper's; ZeRO-2/3 (FSDP2, fp32 shards) 16Φ/N at rest, ZeRO-2 adding
    the 2Φ it gathers (:func:`gathered_parameter_bytes`; the paper's 2Φ + 14Φ/N). In 32-true
    4Φ + 4Φ + 8Φ (ZeRO-1: 8Φ + 8Φ/N); in bf16-true half of that.
    """
    n = dp_degree
    fsdp = n > 1 and zero_stage >= 2
    bytes_per = state_bytes(precision, fsdp=fsdp)
    phi = _ceil(num_params, tp_degree * pp_degree)
    parameters, gradients = bytes_per.parameter * phi, bytes_per.gradient * phi
    optimizer_state = (bytes_per.master + 2 * bytes_per.moment) * phi
    if n > 1 and zero_stage >= 1:
        optimizer_state = _ceil(optimizer_state, n)
    if fsdp:
        parameters, gradients = _ceil(parameters, n), _ceil(gradients, n)
    return parameters, gradients, optimizer_state


def gathered_parameter_bytes(
    num_params: int,
    *,
    zero_stage: int,
    dp_degree: int,
    tp_degree: int = 1,
    pp_degree: int = 1,
    precision: str = "32-true",
) -> int:
    """Parameter bytes ZeRO-2 holds gathered, in the compute dtype, from forward through
    backward (FSDP2 ``reshard_after_forward=False``); 0 for the other stages (ZeRO-3 gathers
    one unit at a time, which needs the architecture)."""
    if zero_stage != 2 or dp_degree == 1:
        return 0
    phi = _ceil(num_params, tp_degree * pp_degree)
    return state_bytes(precision, fsdp=True).compute * phi


# ---- activations ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class LayoutKnobs:
    """The newer knobs that change what a block keeps (``TrialConfig``'s fields of the same
    meaning); the defaults keep today's arithmetic."""

    sequence_parallel: bool = False
    """Norms on sequence shards over the TP group (DTensor ``SequenceParallel``)."""
    cp: int = 1
    """Context-parallel degree: each rank holds s / cp of every sequence's queries."""
    compiled: bool = False
    """Regional ``torch.compile`` per block."""
    float8: bool = False
    """torchao float8 linears."""
    ep: int = 1
    """Expert-parallel degree: the rows a mixture of experts' rank receives
    (``moe_memory.received_rows``)."""

    @classmethod
    def of(cls, config: TrialConfig) -> LayoutKnobs:
        return cls(
            config.sequence_parallel and config.tp_degree > 1,
            config.cp_degree,
            config.compile,
            config.float8,
            config.ep_degree,
        )


NO_KNOBS = LayoutKnobs()


# ---- what one block saves for backward (layer_activation_bytes) ----------------------------
# Korthikanti et al. 2022 (Table 2) give sbh(34 + 5as/h) bytes per layer with no parallelism
# and sbh(10 + 24/t + 5as/(ht)) with tensor parallelism t, for 16-bit activations, a 4h GELU
# MLP, 1-byte dropout masks and an explicit softmax; selective recomputation drops the 5as²b
# attention term; full recomputation keeps only the 2sbh layer input. Our block differs, so the
# coefficients are recounted for it (every saved tensor was listed with
# ``torch.autograd.graph.saved_tensors_hooks`` and the sum is asserted by
# ``tests/test_memory.py::test_layer_formula_matches_saved_tensors``):
#
# - no dropout: the paper's 1-byte masks (as²b + 2sbh) and the softmax-dropout output
#   (2as²b) do not exist;
# - element size ``e`` = the compute dtype (4 bytes in 32-true, not the paper's 2);
# - SDPA's CPU/flash kernel saves its output and a fp32 log-sum-exp (4·asb/t) instead of the
#   as²b softmax; eager attention saves the softmax (e·as²b/t) and an s² bool mask;
# - replicated under TP (no sequence parallelism): the layer input and the norm outputs that
#   feed the column-parallel matmuls; everything between the column- and row-parallel
#   Linears is divided by t, as in the paper;
# - GPT block (LayerNorm, GELU MLP with f = ffn size):
#     e·sbh·(4 + 4/t) + 2e·sbf/t + 4e·sb (norm statistics) + attention core;
#   with f = 4h, float32, t = 1 and eager attention that is sbh(64 + 4as/h), against the
#   paper's sbh(34 + 5as/h);
# - Llama block (RMSNorm in fp32, SwiGLU with three f-wide tensors plus their product,
#   rotary cos/sin, grouped KV heads repeated to all heads before attention):
#     2·(8·sbh + 4·sb + e·sbh) + e·sbh·4/t + 4e·sbf/t + 2e·s·head_dim + attention core.
# - selective (``checkpoint`` around the attention core): the core's saved tensors are
#   recomputed; q, k, v and the output stay. ``op`` (torchtitan's op-level selective AC):
#   :func:`_op_kept_bytes`. full (``checkpoint_wrapper`` per block): e·sbh, the block input.
#
# The newer knobs (``knobs``) change it as :func:`_norm_bytes`, :func:`_mlp_bytes` and
# :func:`_attention_bytes` say: sequence parallelism shards the norms (Korthikanti §4.2.2),
# context parallelism the queries (s/cp tokens per rank) while the all-gathered keys and
# values of the whole sequence stay for backward, compile lets the partitioner recompute the
# elementwise intermediates. float8 keeps no less: torchao's ``matmul_with_hp_or_float8_args``
# saves the high-precision input and weight (``torchao/float8/float8_linear.py``, its
# ``ctx.save_for_backward(input_hp, weight_hp_t)``) and casts again in backward; its casts are
# temporaries (:func:`block_backward_bytes`).
def layer_activation_bytes(
    shape: ModelShape,
    *,
    seq_len: int,
    micro_batch: int,
    tp: int,
    checkpointing: str,
    attention: str,
    dtype: str,
    knobs: LayoutKnobs = NO_KNOBS,
    moe_layer: bool = False,
) -> int:
    """Bytes one transformer block saves for backward, for one micro-batch on one TP rank, in
    autotune's own runtime (:func:`block_saved_bytes` with ``AUTOTUNE_MEMORY``): Korthikanti et
    al. 2022's count recounted for this block, as the comment above derives, with the newer
    knobs (``knobs``) as :func:`_norm_bytes`, :func:`_mlp_bytes` and :func:`_attention_bytes`
    say; ``moe_layer``: one of a mixture of experts' MoE layers (its MLP
    ``moe_memory.routed_mlp_bytes``)."""
    return block_saved_bytes(
        shape,
        AUTOTUNE_MEMORY,
        s=seq_len,
        b=micro_batch,
        cp=knobs.cp,
        tp=tp,
        e=BYTES_PER_ELEMENT[dtype],
        sp=tp if knobs.sequence_parallel else 1,
        checkpointing=checkpointing,
        attention=attention_kernel(shape, attention),
        compiled=knobs.compiled,
        ep=knobs.ep if moe_layer else 0,
    )


def block_saved_bytes(
    shape: ModelShape,
    traits: MemoryTraits,
    *,
    s: int,
    b: int,
    cp: int,
    tp: int,
    e: int,
    sp: int,
    checkpointing: str,
    attention: str,
    compiled: bool = False,
    ep: int = 0,
) -> int:
    """Bytes one block saves for backward, per micro-batch of ``b`` sequences of ``s`` tokens
    on one rank of ``cp`` × ``tp`` (``sp`` = tp under sequence parallelism, else 1), as the
    engine ``traits`` runs it: the one count both ``memory`` and ``engine_memory`` read. The
    engines differ in the block they run (``traits.built_block``, ``fused_norm``), the
    rotary cache, CP's keys and values, eager's mask and dropout (each trait cites its code).
    ``ep`` > 0: a MoE layer at that expert-parallel degree (``moe_memory.routed_mlp_bytes``)."""
    t = s * b // cp  # tokens (queries) on this rank
    if checkpointing == "full":
        return e * t * shape.hidden_size // sp
    if checkpointing == "op":
        if not traits.built_block:  # torchtitan's Llama block: seven mms and SDPA
            return _op_kept_bytes(shape, t, tp, e, sp, "sdpa", seven_mms=True)
        return _op_kept_bytes(shape, t, tp, e, sp, attention, shape.family == "llama")
    if not traits.built_block:
        norms = _engine_norm_bytes(shape, traits, t, e) // sp
    else:
        norms = 2 * _norm_bytes(shape, t, e, sp, compiled)
    if traits.rotary_cache and shape.family == "llama":
        norms += 2 * e * (s // cp) * shape.head_dim  # rotary cos and sin: 4 × (s, d/2)
    if traits.built_block and isinstance(shape, HFShape):
        return norms + hf_block_bytes(
            shape,
            s=s,
            b=b,
            tp=tp,
            e=e,
            cp=cp,
            sp=sp,
            checkpointing=checkpointing,
            attention=attention,
            compiled=compiled,
            ep=ep,
        )
    mlp = _mlp_bytes(shape, t // sp if ep else t, tp, e, compiled, ep)  # MoE: SP's tokens
    return norms + mlp + _attention_bytes(shape, traits, s, b, tp, e, cp, checkpointing, attention)


def _engine_norm_bytes(shape: ModelShape, traits: MemoryTraits, t: int, e: int) -> int:
    """Outside the TP region, as Korthikanti et al. 2022 count it (÷ t only with SP): each
    norm's input and output (the next linear's input), the norms' fp32 copies unless fused,
    and the 1-byte dropout masks."""
    th = t * shape.hidden_size
    kept = 4 * e * th
    if not traits.fused_norm and shape.family == "llama":
        kept += 2 * 2 * FP32_BYTES * th  # RMSNorm's fp32 upcast and normalised input
    if traits.dropout:
        kept += 2 * th
    return kept


def _norm_bytes(shape: ModelShape, t: int, e: int, sp: int, compiled: bool) -> int:
    """What one norm keeps for ``t`` tokens: its input and statistics (÷ t under sequence
    parallelism ``sp``), and its output, which the column-parallel Linears after it keep as
    their input. Under sequence parallelism that input is the all-gathered, whole sequence:
    DTensor's ``PrepareModuleInput`` / ``ColwiseParallel(input_layouts=Shard(1))`` redistribute
    to ``Replicate()`` before the matmul, which saves what it multiplies (torchtitan's plan,
    ``torch/distributed/tensor/parallel/style.py``) — unlike Megatron, which gathers it again in
    backward (Korthikanti §4.2.2; ``engine_memory``).

    LayerNorm keeps its input, mean and rstd; RMSNorm upcasts to fp32 and keeps the fp32 input
    and normalised input and the rstd. Compiled (AOTAutograd's
    ``min_cut_rematerialization_partition``, inductor's default, recomputes fusible pointwise
    ops in backward rather than saving them): the input in its own dtype and the statistics,
    the fp32 copies and the output recomputed from them (the gathered output stays under SP:
    collectives are not recomputed)."""
    th = t * shape.hidden_size
    stats = 2 * e * t if shape.family == "gpt" else FP32_BYTES * t
    if compiled:
        return (e * th + stats) // sp + (e * th if sp > 1 else 0)
    kept_in = e * th if shape.family == "gpt" else 2 * FP32_BYTES * th
    return (kept_in + stats) // sp + e * th


def _mlp_bytes(shape: ModelShape, t: int, tp: int, e: int, compiled: bool, ep: int = 0) -> int:
    """The MLP's f-wide tensors between its column- and row-parallel Linears (÷ t): GELU's input
    and output; SwiGLU's w1 and w3 outputs, silu's and their product. Compiled: the matmul
    outputs only (GELU's input; w1's and w3's), the pointwise ones recomputed. ``ep`` > 0: a
    MoE layer's MLP (``moe_memory.routed_mlp_bytes``)."""
    if ep:
        return moe_memory.routed_mlp_bytes(shape.moe, shape.hidden_size, t, e, ep)
    tf = t * shape.ffn_hidden_size
    wide = (1 if compiled else 2) if shape.family == "gpt" else (2 if compiled else 4)
    return wide * e * tf // tp


def _attention_bytes(
    shape: ModelShape,
    traits: MemoryTraits,
    s: int,
    b: int,
    tp: int,
    e: int,
    cp: int,
    checkpointing: str,
    attention: str,
) -> int:
    """q and the attention output for the rank's s/cp queries, k and v (repeated to all heads
    under ``traits.repeat_kv``) for the keys they attend over, and the core: SDPA's fp32
    log-sum-exp, or eager's softmax (with dropout's mask and output under ``traits.dropout``)
    and the causal mask (``traits.eager_mask``); none under selective recomputation. With
    context parallelism and ``traits.cp_whole_kv`` the keys and values are all-gathered over
    the cp group (Llama 3's all-gather attention, Dubey et al. 2024 §3.3.2) and SDPA keeps the
    gathered ones for backward: 2e·b·s·h/t."""
    h, a = shape.hidden_size, shape.num_heads
    q = s // cp  # queries on the rank
    kv_tokens = s * b if traits.cp_whole_kv else q * b
    width = h if traits.repeat_kv or shape.family == "gpt" else shape.num_kv_heads * shape.head_dim
    kept = (2 * e * q * b * h + 2 * e * kv_tokens * width) // tp
    if checkpointing == "selective":
        return kept
    if attention == "sdpa":
        return kept + FP32_BYTES * a * q * b // tp  # log-sum-exp
    scores = (e + (1 + e if traits.dropout else 0)) * a * q * s * b  # softmax, dropout's
    return kept + scores // tp + (q * s if traits.eager_mask else 0)  # and the causal mask


def _op_kept_bytes(
    shape: ModelShape, t: int, tp: int, e: int, sp: int, attention: str, seven_mms: bool
) -> int:
    """torchtitan's op-level selective AC (``_apply_ac_to_transformer_block``, mode 'op'): the
    block input, and the outputs of the ops its policy saves — every second ``aten.mm`` of the
    block counted from the first (so wq, wv and w1 of either block, and the Llama block's w2,
    the seventh), SDPA (output and log-sum-exp) and, under SP, the reduce-scatters. The mm
    outputs are TP-local: wq's and w1's ÷ t, w2's the whole partial sum before its reduction
    (÷ t when SP reduce-scatters it). Eager attention's ``bmm`` and softmax are not in the
    list: recomputed."""
    h, f = shape.hidden_size, shape.ffn_hidden_size
    kv = shape.num_kv_heads * shape.head_dim
    kept = e * t * h // sp + e * t * (h + kv + f) // tp  # input; wq, wv, w1
    if seven_mms:  # the Llama block's
        kept += e * t * h // sp  # w2
    if attention == "sdpa":
        kept += e * t * h // tp + FP32_BYTES * shape.num_heads * t // tp
    return kept


def block_backward_bytes(
    shape: ModelShape,
    *,
    seq_len: int,
    micro_batch: int,
    tp: int,
    checkpointing: str,
    attention: str,
    dtype: str,
    knobs: LayoutKnobs = NO_KNOBS,
    moe_layer: bool = False,
) -> int:
    """Temporary bytes while one block runs its backward, above what it saved (measured).

    Gradient buffers of the block's widest tensors (measured with the profiler's allocation
    events on single blocks, s·b from 64 to 512): ≈ e·sbf/t + e·sbh for the GELU MLP, 2e·sbf/t
    for SwiGLU, plus e·as²b/t for eager attention's softmax gradient. Recomputation first
    rebuilds what was not saved: the whole block, one at a time (full recomputation,
    Korthikanti et al. 2022), or what selective / op recomputation dropped. Context
    parallelism adds the gradients of the gathered keys and values (2e·sbh/t) before their
    reduce-scatter; float8 its casts of the widest Linear (w1): weight, input and output
    gradient at 1 byte each (torchao casts them per matmul, ``float8_linear.py``). A mixture of
    experts' MoE layer (``moe_layer``): its MLP's, ``moe_memory.moe_backward_bytes``.
    """
    s, b, h, f = seq_len, micro_batch, shape.hidden_size, shape.ffn_hidden_size
    e = BYTES_PER_ELEMENT[dtype]
    t = s * b // knobs.cp
    attention = attention_kernel(shape, attention)
    if moe_layer:
        grads = moe_memory.moe_backward_bytes(shape.moe, h, t, e, knobs.ep)
    elif shape.family == "gpt":
        grads = e * t * f // tp + e * t * h
    else:
        grads = 2 * e * t * f // tp
    if attention == "eager":
        grads += e * shape.num_heads * t * s // tp
    if knobs.cp > 1:
        grads += 2 * e * s * b * h // tp
    if knobs.float8:
        grads += f * h // tp + t * h + t * f // tp
    if checkpointing == "none":
        return grads
    kwargs = dict(seq_len=s, micro_batch=b, tp=tp, attention=attention, dtype=dtype, knobs=knobs)
    kwargs["moe_layer"] = moe_layer
    rebuilt = layer_activation_bytes(shape, checkpointing="none", **kwargs)
    if checkpointing in ("selective", "op"):
        rebuilt -= layer_activation_bytes(shape, checkpointing=checkpointing, **kwargs)
    return rebuilt + grads


def _head_bytes(shape: ModelShape, t: int, e: int, sp: int) -> int:
    """The final norm's saved tensors (:func:`_norm_bytes`) for ``t`` tokens."""
    return _norm_bytes(shape, t, e, sp, compiled=False)


def held_microbatches(
    config: TrialConfig, layout: LayoutQuantities, pp_rank: int, per_microbatch: tuple[int, ...]
) -> tuple[int, ...]:
    """Per local stage of pipeline rank ``pp_rank``, the micro-batches whose activations it
    holds at its peak, ``per_microbatch`` weighing each stage's: one without a pipeline
    (accumulation runs one micro-batch at a time), the interleaved schedule's replay
    (:func:`_interleaved_peak`), else :func:`microbatches_in_flight`."""
    pp, microbatches = config.pp_degree, layout.num_microbatches
    if pp == 1:
        return (1,)
    if layout.interleaved:
        return _interleaved_peak(pp, pp_rank, microbatches, per_microbatch)
    return microbatches_in_flight(
        config.pp_schedule, pp, pp_rank, microbatches, config.virtual_stages
    )


def microbatches_in_flight(
    schedule: str,
    pp: int,
    pp_rank: int,
    num_microbatches: int,
    virtual_stages: int = INTERLEAVED_STAGES_PER_RANK,
) -> tuple[int, ...]:
    """Micro-batches whose activations a pipeline rank holds at once, per local stage.

    GPipe (Huang et al. 2019): every micro-batch's forward runs before any backward: M.
    1F1B (Narayanan et al. 2021, §2.2, PipeDream-Flush; torch's ``Schedule1F1B``): stage i runs
    min(M, pp − i) warm-up forwards before its first backward, then alternates: min(M, pp − i).
    Interleaved 1F1B (Narayanan et al. 2021, §2.2; torch's ``ScheduleInterleaved1F1B``): see
    :func:`_interleaved_peak`; with equal stage sizes this is the warm-up count plus one, split
    over the rank's ``virtual_stages`` virtual stages.
    """
    if schedule == "gpipe":
        return (num_microbatches,)
    if schedule == "1f1b":
        return (min(num_microbatches, pp - pp_rank),)
    return _interleaved_peak(pp, pp_rank, num_microbatches, (1,) * virtual_stages)


@lru_cache(maxsize=4096)
def _interleaved_peak(pp: int, pp_rank: int, m: int, weights: tuple[int, ...]) -> tuple[int, ...]:
    """Per local stage, the micro-batches held when the weighted sum held is largest.

    Replays torch's order (``_get_warmup_ops`` / ``_get_1f1b_rank_ops``): with v local stages
    and m' = M / max(1, M // pp) micro-batches per round, (v − 1)·m' + 2·(pp − 1 − rank)
    warm-up forwards (at most v·M), then one forward and one backward alternately, then the
    remaining backwards. Forward k runs local stage (k // m') mod v; backward k runs local stage
    v − 1 − (k // m') mod v, each on its oldest micro-batch.

    After the warm-up both stage sequences repeat every v·m' steps, and over such a period each
    local stage gains and loses m' micro-batches: the held counts repeat with that period, so
    the replay stops one period after the warm-up (O(v·pp) steps, not O(v·M)); the drain only
    lowers the load."""
    v = len(weights)
    per_round = m // max(1, m // pp)
    total_ops = v * m
    warmup = min((v - 1) * per_round + 2 * (pp - 1 - pp_rank), total_ops)
    held = [0] * v
    load, best, best_held = 0, -1, tuple(held)
    for k in range(min(total_ops, warmup + v * per_round)):
        forward_stage = (k // per_round) % v
        held[forward_stage] += 1
        load += weights[forward_stage]
        if load > best:
            best, best_held = load, tuple(held)
        if k >= warmup:  # after the warm-up each forward is followed by a backward
            backward_stage = v - 1 - ((k - warmup) // per_round) % v
            held[backward_stage] -= 1
            load -= weights[backward_stage]
    return best_held


def estimate_all_stages(
    config: TrialConfig, shape: ModelShape | None = None, *, device_type: str = "cpu"
) -> list[MemoryEstimate]:
    """One estimate per pipeline rank (pp rank 0 … pp − 1), in the precision the config
    trains in on ``device_type``."""
    shape = _resolve_shape(config, shape)
    config = config.with_precision(device_type)
    layout = LayoutQuantities.of(config, shape, config.precision)
    return [_estimate_stage(config, shape, r, device_type, layout) for r in range(config.pp_degree)]


def worst_rank_candidates(pp: int) -> tuple[int, ...]:
    """The pipeline ranks among which the worst one is: the first (embeddings, the most
    micro-batches in flight), the second (receive buffers both ways, the most layers and
    micro-batches of any middle rank) and the last (head, logits).

    Every middle rank r holds what rank 1 holds or less: no roots, layers non-increasing in r
    (``stage_layer_counts`` gives earlier stages the remainder, also per virtual stage), micro-
    batches in flight non-increasing in r (1F1B: pp − r; GPipe: M; interleaved: a warm-up of
    2·(pp − 1 − r) more), and the same receive buffers, so its estimate is at most rank 1's.
    ``tests/test_memory.py::test_worst_rank_is_among_the_candidates`` checks this against every
    rank on a sweep of layouts."""
    return tuple(sorted({0, min(1, pp - 1), pp - 1}))


def estimate_memory(
    config: TrialConfig,
    shape: ModelShape | None = None,
    *,
    device_type: str = "cpu",
    checked: bool = False,
    stop_above: int | None = None,
) -> MemoryEstimate:
    """The worst rank's predicted peak memory by category (the first such rank on a tie).

    ``shape`` None takes the built-in workload's shape; a user workload needs an explicit
    ``ModelShape`` (its architecture is not known without building it). ``checked``: the caller
    already validated ``config`` against ``shape`` (``rank`` and the search, scoring thousands),
    so it is not validated again. Another engine's memory (Megatron-LM, torchtitan, DeepSpeed)
    is ``engine_memory.estimate_engine_memory``'s. ``stop_above``: return the first rank whose
    total exceeds it (a screen needs no more: the worst is at least as large)."""
    shape = (shape or config.workload.shape) if checked else _resolve_shape(config, shape)
    if config.precision is None:
        config = config.with_precision(device_type)
    layout = LayoutQuantities.of(config, shape, config.precision)
    key = (shape, device_type, _stage_key(config, shape, layout))
    worst = None
    for r in worst_rank_candidates(config.pp_degree):
        stage = partial(_estimate_stage, config, shape, r, device_type, layout)
        est = _STAGES.get((r, key), stage)
        if worst is None or est.total > worst.total:
            worst = est
        if stop_above is not None and worst.total > stop_above:
            break
    return worst


_STAGES: BoundedMemo[MemoryEstimate] = BoundedMemo()
_SHARDED_BLIND = layout_quantities.SHARDED_STAGE_IGNORE  # declared in knobs.py


def _stage_key(config: TrialConfig, shape: ModelShape, layout: LayoutQuantities) -> tuple:
    """What a rank's estimate (``_estimate_stage``) reads of ``config``, for ``estimate_memory``
    to share one estimate among the layouts ``rank`` lists that it cannot tell apart: every
    field but ``RUN_FIELDS``, less what the estimate does not read at ZeRO-2/3. Overlap only
    chooses DDP's buckets and ZeRO-1's flat partition (``_comm_buffers``,
    ``_uses_distributed_optimizer``); the bucket only groups blocks into FSDP units
    (``_fsdp_units``), so the blocks per unit stand for it (one at every bucket for a block of
    SC21's 145.6B); under a pipeline ZeRO-3 keeps its units gathered through backward as
    ZeRO-2 does (``_comm_buffers``), and both shard the same states.
    ``tests/model/test_scoring_memos.py`` compares shared and fresh estimates over grids."""
    if config.zero_stage >= 2:
        zero = 2 if config.pp_degree > 1 else config.zero_stage
        layer = block_params(shape, config.tp_degree)
        per_unit = _layers_per_unit(layer, layout.state_bytes.parameter, config.bucket_mb)
        return (zero, per_unit, fields_key(config, _SHARDED_BLIND))
    return fields_key(config, RUN_FIELDS)


def peak_lower_bound(config: TrialConfig, shape: ModelShape, *, device_type: str) -> int:
    """At most ``estimate_memory(config, shape).total``, in a few dictionary look-ups: rank 0's
    model states (``states_lower_bound``) plus the blocks' activations its schedule holds
    (``activation_lower_bound``). ``rank`` screens layouts with it before estimating them."""
    return states_lower_bound(config, shape, device_type=device_type) + activation_lower_bound(
        config, shape, device_type=device_type
    )


def states_lower_bound(config: TrialConfig, shape: ModelShape, *, device_type: str) -> int:
    """Pipeline rank 0's model-state bytes (cached per tp, pp, dp, state shards, ZeRO stage,
    schedule, bucket and precision): what no micro-batch, checkpointing or sequence knob
    changes, so ``rank`` drops a whole group of layouts on it."""
    precision = config.precision or config.resolved_precision(device_type)
    return _rank0_states(
        shape,
        config.workload.vocab_size or shape.vocab_size,
        config.tp_degree,
        config.pp_degree,
        config.dp_degree,
        state_shards(config),
        config.zero_stage,
        is_interleaved(config),
        config.virtual_stages,
        precision,
        config.bucket_mb,
        _uses_distributed_optimizer(config),
        config.optimizer_offload_enabled and device_type == "cuda",
        config.ep_degree,
    )[0]


ACTIVATIONS_IGNORE = layout_quantities.ACTIVATIONS_IGNORE  # declared in knobs.py
"""The fields a rank's activations (``_activations``, ``activation_lower_bound``) do not read:
layouts that differ only in them (ZeRO stage, HSDP, bucket, overlap) share one computation
(``tests/model/test_scoring_memos.py``)."""
_ACTIVATION_BOUNDS: BoundedMemo[int] = BoundedMemo()


def activation_lower_bound(config: TrialConfig, shape: ModelShape, *, device_type: str) -> int:
    """The blocks' saved bytes pipeline rank 0 holds at least, shared by layouts that differ
    only in what it does not read (``ACTIVATIONS_IGNORE``)."""
    precision = config.precision or config.resolved_precision(device_type)
    key = (shape, precision, fields_key(config, ACTIVATIONS_IGNORE))
    return _ACTIVATION_BOUNDS.get(key, partial(_activation_lower_bound, config, shape, precision))


def _activation_lower_bound(config: TrialConfig, shape: ModelShape, precision: str) -> int:
    pp, v, m = config.pp_degree, config.virtual_stages, config.grad_accum_steps
    interleaved = is_interleaved(config)
    part_layers = tuple(p.num_layers for p in _parts(shape.num_layers, pp, interleaved, 0, v))
    kw = (
        shape,
        config.workload.seq_len,
        config.micro_batch_size,
        config.tp_degree,
        config.attention,
        PRECISION_COMPUTE_DTYPE[precision],
        LayoutKnobs.of(config),
    )
    ac = config.activation_checkpointing
    none = full = _cached_layer_bytes(*kw, ac)
    if ac == "full" and config.ac_layers is not None:
        none = _cached_layer_bytes(*kw, "none")
    weights = [part_block_bytes(n, config.ac_layers, none, full) for n in part_layers]
    if pp == 1:
        return weights[0]
    if interleaved:
        # Before rank 0's first backward it has run every warm-up forward and one more, each
        # holding one part's activations (``_interleaved_peak``): at least the lightest part's.
        per_round = m // max(1, m // pp)
        warmup = min((v - 1) * per_round + 2 * (pp - 1), v * m - 1)
        return (warmup + 1) * min(weights)
    return microbatches_in_flight(config.pp_schedule, pp, 0, m)[0] * weights[0]


@lru_cache(maxsize=65536)
def _rank0_states(
    shape: ModelShape,
    vocab: int,
    tp: int,
    pp: int,
    dp: int,
    shards: int,
    zero: int,
    interleaved: bool,
    virtual_stages: int,
    precision: str,
    bucket_mb: float,
    flat_zero1: bool,
    offloaded: bool,
    ep: int = 1,
) -> tuple[int, tuple[int, ...]]:
    """(model-state bytes, layers per part) of pipeline rank 0, as ``_stage`` computes them."""
    parts = _parts(shape.num_layers, pp, interleaved, 0, virtual_stages)
    bytes_per = state_bytes(precision, fsdp=dp > 1 and zero >= 2)
    states = _states(
        shape, vocab, parts, tp, shards, zero, bytes_per, bucket_mb, flat_zero1=flat_zero1, ep=ep
    )
    held = 0 if offloaded else states.parameters + states.gradients + states.optimizer_state
    return held, tuple(p.num_layers for p in parts)


@lru_cache(maxsize=65536)
def _cached_layer_bytes(
    shape: ModelShape,
    seq_len: int,
    micro_batch: int,
    tp: int,
    attention: str,
    dtype: str,
    knobs: LayoutKnobs,
    checkpointing: str,
) -> int:
    return layer_activation_bytes(
        shape,
        seq_len=seq_len,
        micro_batch=micro_batch,
        tp=tp,
        checkpointing=checkpointing,
        attention=attention,
        dtype=dtype,
        knobs=knobs,
    )


def _resolve_shape(config: TrialConfig, shape: ModelShape | None) -> ModelShape:
    """The shape to estimate, after checking the layout's structural rules."""
    checked = config
    if shape is None:
        shape = config.workload.shape
        if shape is None:
            raise ConfigError(
                f"cannot estimate the memory of user workload '{config.workload.workload}' "
                "without its shape; pass an explicit ModelShape (autotune estimate: "
                "--num-layers, --hidden-size, --num-heads, --vocab-size)"
            )
        checked.validate()
    else:
        checked = dataclasses.replace(
            checked, workload=dataclasses.replace(config.workload, workload="explicit:shape")
        )
        checked.validate(
            num_heads=shape.num_heads, num_kv_heads=shape.num_kv_heads, num_layers=shape.num_layers
        )
        if shape.family == "gpt" and config.workload.seq_len > shape.max_seq_len:
            raise ConfigError(
                f"seq_len {config.workload.seq_len} exceeds the shape's context "
                f"{shape.max_seq_len}; lower seq_len"
            )
    return shape


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True, slots=True)
class _Stage:
    """One pipeline rank of a trial, as every memory category reads it."""

    config: TrialConfig
    shape: ModelShape
    pp_rank: int
    device_type: str
    layout: LayoutQuantities
    """What the layout derives for both models: element sizes, tokens, SP divisor, chunks."""
    parts: tuple[_Part, ...]
    """The rank's (virtual) stages (``_parts``)."""
    states: _States
    """The rank's model states (``_states``)."""

    @property
    def last(self) -> bool:
        """Whether the rank holds the pipeline's last stage (final norm, head, loss)."""
        return any(p.last for p in self.parts)

    @property
    def logits_elems(self) -> int:
        """Elements of one micro-batch's logits, b·s·V (its tokens on this rank)."""
        return self.layout.microbatch_tokens * self.layout.vocab

    @property
    def two_largest_units(self) -> int:
        """Bytes of FSDP's two largest units, gathered."""
        return sum(sorted(self.states.unit_numels, reverse=True)[:2]) * self.layout.elem_bytes


def _estimate_stage(
    config: TrialConfig,
    shape: ModelShape,
    pp_rank: int,
    device_type: str,
    layout: LayoutQuantities | None = None,
) -> MemoryEstimate:
    stage = _stage(config, shape, pp_rank, device_type, layout)
    saved, transient, pp_outputs = _activations(stage)
    comm_held, extra, comm_post = _comm_buffers(stage, transient)
    other = _other(stage)
    optimizer_temps = _optimizer_temporaries(stage)

    # ---- the peak: the larger of forward/backward and after backward -------------------
    # Each candidate peak is (activations, comm_buffers, other) during forward/backward;
    # ``after_backward`` is after the last backward (gradient sync, optimizer step).
    forward_backward = max(
        ((saved + pp_outputs + a, comm_held + c, other) for a, c in extra), key=sum
    )
    after_backward = (2 * pp_outputs, comm_post, other + optimizer_temps)
    phase = (
        PHASE_AFTER_BACKWARD
        if sum(after_backward) > sum(forward_backward)
        else PHASE_FORWARD_BACKWARD
    )
    activations, comm, other = after_backward if phase == PHASE_AFTER_BACKWARD else forward_backward
    states = stage.states
    parameters, grads, optimizer_state = (
        states.parameters,
        states.gradients,
        states.optimizer_state,
    )
    if _offloaded(config, device_type):
        # ZeRO-Offload through FSDP2's CPUOffloadPolicy: sharded parameters, gradients and
        # optimizer state live in host memory, where the step runs; the device holds what is
        # gathered and the unsharded gradients before their reduce-scatter (comm_buffers).
        parameters = grads = optimizer_state = 0
    return MemoryEstimate(
        parameters, grads, optimizer_state, activations, comm, other, pp_rank, phase
    )


def _offloaded(config: TrialConfig, device_type: str) -> bool:
    """Whether model states live in host memory (``parallel/zero.py``: FSDP2's
    ``CPUOffloadPolicy``, which ``TrialConfig.validate`` allows on CUDA at ZeRO-2/3, dp > 1)."""
    return config.optimizer_offload_enabled and device_type == "cuda"


def _stage(
    config: TrialConfig,
    shape: ModelShape,
    pp_rank: int,
    device_type: str,
    layout: LayoutQuantities | None = None,
) -> _Stage:
    """The rank's parts (virtual stages) and model states (``_states``); ``layout``: the
    config's ``LayoutQuantities`` (derived here when not given)."""
    if layout is None:
        layout = LayoutQuantities.of(config, shape, config.resolved_precision(device_type))
    parts = _parts(
        shape.num_layers, config.pp_degree, layout.interleaved, pp_rank, config.virtual_stages
    )
    states = _states(
        shape,
        layout.vocab,
        parts,
        config.tp_degree,
        state_shards(config),
        config.zero_stage,
        layout.state_bytes,
        config.bucket_mb,
        flat_zero1=_uses_distributed_optimizer(config),
        ep=config.ep_degree,
    )
    return _Stage(config, shape, pp_rank, device_type, layout, parts, states)


_ACTIVATIONS: BoundedMemo[tuple[int, int, int]] = BoundedMemo()


def clear_memos() -> None:
    """Forget every memoised estimate and part of one (the memos key on the config and shape,
    not on this module's code: a test that swaps a formula clears them first)."""
    for memo in (_STAGES, _ACTIVATION_BOUNDS, _ACTIVATIONS):
        memo.clear()
    for cached in (_parts, _states, _rank0_states, _cached_layer_bytes):
        cached.cache_clear()


def _activations(stage: _Stage) -> tuple[int, int, int]:
    """``_stage_activations``, memoised per rank, precision and the fields it reads."""
    key = (
        stage.shape,
        stage.pp_rank,
        stage.layout.precision,
        fields_key(stage.config, ACTIVATIONS_IGNORE),
    )
    return _ACTIVATIONS.get(key, lambda: _stage_activations(stage))


def _stage_activations(stage: _Stage) -> tuple[int, int, int]:
    """(saved for backward, the largest temporary on top of them, the pipeline's kept
    outputs) in bytes: Korthikanti et al. 2022's per-layer activations
    (``layer_activation_bytes``) times the micro-batches the schedule keeps in flight
    (``microbatches_in_flight``). With ``ac_layers`` (Megatron's --recompute-num-layers, block
    method) the first ``ac_layers`` blocks of each (virtual) stage are recomputed whole and the
    others keep everything."""
    config, shape, layout = stage.config, stage.shape, stage.layout
    elem_bytes, microbatches, pp = layout.elem_bytes, layout.num_microbatches, config.pp_degree
    modes, kw = _block_modes(config), _block_arguments(config, layout.precision)
    # (MoE layer, mode) of the rank's blocks: (False, mode) only for a dense model
    blocks = list(itertools.product(moe_memory.layer_kinds(shape.moe, stage.parts), modes))
    kept = {
        b: layer_activation_bytes(shape, checkpointing=b[1], moe_layer=b[0], **kw) for b in blocks
    }
    logits_elems = stage.logits_elems
    per_microbatch = []
    for part in stage.parts:
        saved = _part_saved(shape, part, config.ac_layers, modes, kept)
        if part.last:  # the final norm, and the fp32 log-probabilities
            saved += (
                _head_bytes(shape, layout.microbatch_tokens, elem_bytes, layout.sequence_shards)
                + FP32_BYTES * logits_elems
            )
        elif pp > 1:
            # the stage output, kept by the schedule until backward
            saved += elem_bytes * layout.stream_elems
        per_microbatch.append(saved)
    held = held_microbatches(config, layout, stage.pp_rank, tuple(per_microbatch))
    saved = sum(n * a for n, a in zip(held, per_microbatch))
    # The largest temporary on top of them: the loss's gradients w.r.t. the fp32
    # log-probabilities and logits (2 × 4·sbV) on the last stage, or one block's backward.
    transient = max(
        2 * FP32_BYTES * logits_elems if stage.last else 0,
        *(block_backward_bytes(shape, checkpointing=m, moe_layer=k, **kw) for k, m in blocks),
    )
    # Pipeline schedules keep every micro-batch's output (the logits, e·sbV) on the last stage
    # and concatenate them after the last backward, since the runner calls ``schedule.step``
    # with its default return_outputs=True (see PIPELINE_RETURNS_OUTPUTS).
    pp_outputs = (
        microbatches * elem_bytes * logits_elems
        if (pp > 1 and stage.last and PIPELINE_RETURNS_OUTPUTS)
        else 0
    )
    return saved, transient, pp_outputs


def _block_arguments(config: TrialConfig, precision: str) -> dict:
    """What ``layer_activation_bytes`` and ``block_backward_bytes`` read of a layout."""
    return dict(
        seq_len=config.workload.seq_len,
        micro_batch=config.micro_batch_size,
        tp=config.tp_degree,
        attention=config.attention,
        dtype=PRECISION_COMPUTE_DTYPE[precision],
        knobs=LayoutKnobs.of(config),
    )


def _part_saved(
    shape: ModelShape,
    part: _Part,
    ac_layers: int | None,
    modes: tuple[str, ...],
    kept: dict[tuple[bool, str], int],
) -> int:
    """A part's blocks' saved bytes per micro-batch: ``kept`` per (MoE layer, mode), the
    config's mode ``modes[0]`` on every block, or with ``ac_layers`` on that many and
    ``modes[-1]`` on the rest (``part_block_bytes``; a mixture of experts' per layer kind)."""
    if shape.moe is None:
        none, full = kept[False, modes[-1]], kept[False, modes[0]]
        return part_block_bytes(part.num_layers, ac_layers, none, full)
    return moe_memory.part_saved_bytes(
        shape.moe,
        part.first_layer,
        part.num_layers,
        ac_layers,
        {kind: (kept[kind, modes[0]], kept[kind, modes[-1]]) for kind, _ in kept},
    )


def _block_modes(config: TrialConfig) -> tuple[str, ...]:
    """The checkpointing modes the blocks run under: the config's, and with ``ac_layers`` set
    ('full' on that many blocks per stage) 'none' for the others."""
    ac = config.activation_checkpointing
    return (ac, "none") if ac == "full" and config.ac_layers is not None else (ac,)


def _comm_buffers(stage: _Stage, transient: int) -> tuple[int, list[tuple[int, int]], int]:
    """(communication buffers alive throughout forward/backward, the (activations,
    comm_buffers) temporaries that do not coexist — ``transient`` among them — and the
    buffers after the last backward): DDP's and the flat all-reduce's buckets, FSDP2's
    unsharded parameters and gradients, the distributed optimizer's gathered bucket."""
    config, states, layout = stage.config, stage.states, stage.layout
    bytes_per, elem_bytes = layout.state_bytes, layout.elem_bytes
    dp, zero, pp = sync_ranks(config), config.zero_stage, config.pp_degree
    accumulates = layout.num_microbatches > 1
    grads = 0 if _offloaded(config, stage.device_type) else states.dp_gradients(bytes_per)
    comm_held = comm_post = 0  # buffers alive throughout forward/backward; after it
    extra: list[tuple[int, int]] = [(transient, 0)]  # temporaries that do not coexist
    if dp > 1 and zero <= 1 and not config.overlap_enabled:
        # BucketedAllReduce: one flat bucket (bucket_mb plus the tensor that overfilled it).
        comm_post = min(
            grads, int(config.bucket_mb * MIB) + states.largest_tensor_numel * bytes_per.gradient
        )
    elif dp > 1 and zero <= 1:
        # DDP (gradient_as_bucket_view) and replicate: while no_sync accumulates, gradients
        # live outside the buckets, which hold a second copy from the last micro-batch on.
        if accumulates:
            comm_held = grads
    elif dp > 1:
        # FSDP2 (measured). Unsharded gradients accumulate without reduce-scatter over every
        # micro-batch but the last (set_requires_gradient_sync(False)); the sharded ones
        # (under ``gradients``) only appear as those are reduced, so they are not counted twice.
        if accumulates:
            comm_held = states.unsharded_numel * elem_bytes - grads
        two_largest = stage.two_largest_units
        if zero == 2 or pp > 1:
            # ZeRO-2 — and ZeRO-3 under a pipeline, whose runtime turns resharding after
            # backward off — keeps every unit gathered from its forward through backward and
            # gathers only in forward: the staging buffers of the unit in use and the one
            # prefetched (each lives until the next all-gather completes) never meet the loss's
            # temporaries.
            comm_held += states.unsharded_numel * elem_bytes
            extra.append((0, two_largest))
        else:
            # ZeRO-3 reshards every unit (the root too) after forward and gathers again in
            # backward: the root (parameters + staging) while the loss's gradients are still
            # alive, later the two units in use and their two staging buffers.
            extra = [(transient, 2 * states.root_numel * elem_bytes), (0, 2 * two_largest)]

    if states.gather_numel:
        # DistributedOptimizer: one bucket gathered at a time after the step (its share and the
        # gathered bucket, padded); the gradient sync's buffers are gone by then.
        comm_post = max(
            comm_post, (states.gather_numel + states.gather_numel // dp) * bytes_per.parameter
        )
    return comm_held, extra, comm_post


def _other(stage: _Stage) -> int:
    """Torch pipelining's receive buffers, and on CPU the measurement's allowance."""
    config, layout = stage.config, stage.layout
    elem_bytes, stream_elems = layout.elem_bytes, layout.stream_elems
    tp, pp, dp, zero = config.tp_degree, config.pp_degree, sync_ranks(config), config.zero_stage
    microbatches = layout.num_microbatches
    other = 0
    if pp > 1:
        # Receive buffers, one per micro-batch, allocated when the schedule first runs:
        # activations into every stage but the first, gradients into every one but the last.
        for part in stage.parts:
            other += microbatches * elem_bytes * stream_elems * ((not part.first) + (not part.last))
    if stage.device_type == "cpu":
        # The CPU measurement (the profiler's allocation events, runner.measure_memory) misses
        # frees that happen on gloo's threads — a collective's buffers released when its work
        # object dies there — so its peak carries tensors already freed, more with every
        # micro-batch. Fitted to the sweep (tests/test_memory.py): a quarter of FSDP's two
        # largest units plus 15% of them per further micro-batch, and under TP half a layer
        # output (the all-reduced sbh) per layer and micro-batch. An allowance, not memory.
        if dp > 1 and zero >= 2:
            two_largest = stage.two_largest_units
            other += two_largest // 4 + 3 * two_largest * (microbatches - 1) // 20
        if tp > 1:  # a quarter per all-reduce: a dense layer has two, a MoE layer one
            reduced = moe_memory.tp_reductions(stage.shape.moe, stage.parts)
            other += microbatches * reduced * elem_bytes * stream_elems // 4
    return other


def _optimizer_temporaries(stage: _Stage) -> int:
    """Bytes of the optimizer step's temporaries on the device.

    Single-tensor AdamW (CPU, and DTensor parameters — FSDP, TP, replicate — which torch's
    foreach path does not take): about two of the largest tensor (measured on CPU). Foreach
    AdamW (CUDA, plain parameters; torch.optim.adam ``_multi_tensor_adam``):
    ``_foreach_sqrt(exp_avg_sqs)``, one moment of every tensor. Mixed precision's
    master-weight AdamW (parallel/precision.py) steps in chunks of at most
    ``max(largest tensor, MASTER_STEP_CHUNK_NUMEL)`` elements through one fp32 buffer (the
    gradients read as fp32, then the denominator). Under optimizer offload the step runs on the
    host: nothing on the device."""
    config, states, bytes_per = stage.config, stage.states, stage.layout.state_bytes
    tp, pp, dp, zero = config.tp_degree, config.pp_degree, sync_ranks(config), config.zero_stage
    if _offloaded(config, stage.device_type):
        return 0
    if bytes_per.master:
        return FP32_BYTES * min(
            states.optimizer_numel, max(states.largest_tensor_numel, MASTER_STEP_CHUNK_NUMEL)
        )
    optimizer_temps = 2 * states.largest_tensor_numel * bytes_per.moment
    # ZeRO-1's optimizers step on plain tensors (the distributed optimizer on slices of the
    # DTensors' local tensors).
    plain_params = (zero == 1 and dp > 1) or (tp == 1 and (dp == 1 or (zero == 0 and pp == 1)))
    if stage.device_type == "cuda" and plain_params:
        optimizer_temps = max(optimizer_temps, states.optimizer_numel * bytes_per.moment)
    return optimizer_temps
