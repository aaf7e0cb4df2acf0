"""Predicted step time of any layout on any cluster, from FLOPs, bytes and a calibration.

``predict_step_time(config, cluster, calibration)`` returns a :class:`StepTimeEstimate`: the
seconds of one optimizer step and their breakdown into compute, tensor-parallel collectives,
pipeline point-to-point transfers, the pipeline bubble, the exposed part of data-parallel
synchronisation, the optimizer step and fixed overheads. It builds nothing and touches no
tensor: thousands of layouts are scored a second (``autotune rank``).

The terms, each with its source:

- **Compute** per micro-batch per stage. Forward FLOPs of one decoder layer are
  ``2bs(2h² + 2h·kv) + 4bs²h + 2bs·h·f·k`` (k = 2 for a GELU MLP, 3 for SwiGLU): the
  Megatron count of Narayanan et al. 2021 (SC'21, "Efficient Large-Scale Language Model
  Training on GPU Clusters", §5.1: 24bsh² + 4bs²h for kv = h, f = 4h), generalised to
  grouped-query attention and gated MLPs. The output head adds 2bshV. Backward costs twice the
  forward (same source); full recomputation adds one forward of the layers, selective
  recomputation the attention core (Korthikanti et al. 2022, §4). Time = FLOPs ÷ (peak ×
  efficiency), with the efficiency a calibrated saturating curve of the per-rank matmul size
  w = b·s·h·h/tp: ``eff = e_max · w / (w + w_half)`` (the roofline's rise of GEMM efficiency
  with size), plus the memory-bound element-wise kernels (norms, activations, residuals,
  dropout, and a materialised softmax with eager attention) as bytes ÷ memory bandwidth, and
  a fixed cost per layer pass (kernel launches).
- **Tensor parallelism**: all-reduces of the b·s·h activation per layer per micro-batch —
  forward two (Megatron, Shoeybi et al. 2019, §3: one after attention, one after the MLP),
  backward one per column-parallel input (two with a fused QKV and MLP input, as Megatron has;
  more for an engine whose plan keeps q, k, v separate), and the forward's again under full
  recomputation. Ring time ``2(t−1)/t · S / busbw`` (nccl-tests' bus bandwidth).
- **Pipeline**: with stage times T_i per micro-batch, the step takes ``m · max T_i +
  (Σ T_i − max T_i) / v`` for m micro-batches and v virtual stages per rank, which is
  Narayanan et al. 2021's bubble (p−1)/m of the ideal time for equal stages, and (p−1)/(v·m)
  for the interleaved schedule (§2.2). With fewer micro-batches than stages (which torch's
  flexible interleaved schedule runs) interleaving hides nothing: ``Σ T_i + (m − 1) · max
  T_i / v`` (``pipeline_bubble``). Each boundary moves the b·s·h activation forward and its
  gradient back per micro-batch (point-to-point, over the link the boundary crosses); a rank
  takes part in ``stage_boundaries`` of them, the interleaved schedule's wrap-around from the
  last rank to the first included. On a CPU rank each is host work as well (gloo's send and
  recv run on the rank's own thread; torch's pipelining issues and waits on each as Python
  actions): a calibrated ``p2p_overhead_s`` per boundary per micro-batch.
- **CPU ranks sharing cores** (``cores_per_node``): a rank's compute and host work run on
  cores/ranks of a core (the cluster's peak per rank, and ``host_share``); in the pipeline's
  fill and drain only one stage's tp·dp ranks work and share the cores among themselves
  (``core_sharing``); a collective over more ranks than cores waits about group/cores turns
  for its members to be scheduled (``uncoscheduled``: no gang scheduling).
- **Data parallelism** by ZeRO stage (Rajbhandari et al. 2020, §7): stages 0–1 all-reduce the
  gradients (2Φ bytes moved per parameter byte in a ring); ZeRO-1 also gathers the updated
  parameters; ZeRO-2 reduce-scatters gradients and all-gathers parameters once per
  micro-batch; ZeRO-3 all-gathers twice per micro-batch (forward and backward): 3Φ, 1.5× the
  all-reduce, with one micro-batch. Gloo runs reduce-scatter as a full all-reduce. Each
  collective is sized in the dtype it moves (``data_parallel_bytes``): under mixed precision
  DDP all-reduces the half-precision model's gradients, while FSDP2 reduce-scatters in fp32
  and gathers in half precision, so ZeRO-2's traffic is ¾ of 32-true's, not ½. With
  overlap on, the gradient sync hides behind the last micro-batch's backward except its last
  bucket, and FSDP's all-gathers behind compute; the calibrated ``overlap_efficiency`` says
  how much of the hideable part really hides (on CPUs overlap is contention for the cores).
- **Links by placement**: ranks are numbered as the executor's mesh ``(pp, dp, tp)`` numbers
  them (tp fastest), so a TP group is inside a node when tp ≤ devices per node, a DP group
  spans ⌈tp·dp / devices per node⌉ nodes. A group inside a node uses the intra-node curve; one
  that crosses nodes shares each node's network bandwidth with the node's other groups that
  communicate at the same time (all of them, in a symmetric layout): time = c · 2(n−1)/n · S
  ÷ node bandwidth, with c groups per node — the ring's per-node traffic.
- **FSDP2's hooks** (autotune's engine): each ``fully_shard`` / ``replicate`` unit runs
  Python hooks around every forward and backward, a host cost per unit per micro-batch
  (``hooked_units`` × the calibrated ``unit_overhead_s``); torch's DDP does its bookkeeping in
  C++ and has none.
- **Optimizer step**: memory-bound, ``bytes per parameter × parameters the rank updates ÷
  memory bandwidth`` (AdamW reads parameter, gradient and two moments and writes three:
  28 bytes per fp32 parameter).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from autotune.config import TrialConfig
from autotune.errors import ConfigError
from autotune.hardware import flops_per_token
from autotune.model import layout_quantities, moe_time, roofline
from autotune.model.cluster import GB, ClusterSpec, _ring_factor
from autotune.model.description import attention_keys, attention_width, local_block
from autotune.model.engines import (  # noqa: F401  (re-exported)
    AUTOTUNE_ENGINE,
    DEEPSPEED_ENGINE,
    ENGINES,
    MEGATRON_ENGINE,
    MEGATRON_LEGACY_ENGINE,
    TORCHTITAN_ENGINE,
    EngineProfile,
    engine_traits,
)
from autotune.model.layout_quantities import (
    BoundedMemo,
    LayoutQuantities,
    StateBytes,
    fields_key,
    fsdp_shards,
    state_bytes,
)
from autotune.model.memory import state_shards, sync_ranks
from autotune.shapes import TP_VOCAB, ModelShape

TERMS = ("compute", "tp_comm", "pp_p2p", "pp_bubble", "dp_comm", "optimizer", "overhead")
"""The breakdown of a predicted step, in seconds; they add up to the step time."""
MOE_TERMS = ("experts", "ep_alltoall")
"""The terms a mixture of experts' breakdown adds (``moe_time``): its router and routed
experts' compute (``compute`` is then the rest), and the exposed dispatch and combine."""
ALL_TERMS = ("compute", "experts", "tp_comm", "ep_alltoall", *TERMS[2:])
"""Every term a breakdown may hold, in the order the CLI prints them (those it holds)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Calibration:
    """The model's fitted parameters; defaults are priors for an uncalibrated cluster."""

    compute_efficiency: float = 0.6
    """Asymptotic fraction of peak FLOP/s reached by large matmuls."""
    half_efficiency_rows: float = 512.0
    """Matmul rows (tokens per micro-batch, b·s) at which efficiency is half its asymptote."""
    half_efficiency_cols: float = 128.0
    """Matmul columns per rank (h/tp) at which efficiency is half its asymptote."""
    elementwise_bytes: float = 30.0
    """Element-wise bytes moved per activation element b·s·h per layer forward pass."""
    elementwise_sharded_bytes: float = 10.0
    """Element-wise bytes per activation element per layer forward on TP-sharded tensors."""
    score_bytes: float = 8.0
    """Bytes moved per attention-score element b·(a/tp)·s² per layer forward (eager attention)."""
    layer_overhead_s: float = 20e-6
    """Host seconds per layer per pass (forward, backward, recompute): launching its kernels."""
    tp_layer_overhead_s: float = 0.0
    """Extra host seconds per layer pass when tensor parallel (sharded-tensor dispatch)."""
    collective_overhead_s: float = 10e-6
    """Host seconds per collective (launch and the ranks' synchronisation)."""
    microbatch_overhead_s: float = 0.0
    """Fixed seconds per micro-batch per stage (schedule and framework work)."""
    unit_overhead_s: float = 0.0
    """Host seconds per FSDP2 unit per micro-batch: its forward and backward hooks, run in
    Python (``hooked_units``)."""
    p2p_overhead_s: float = 0.0
    """Host seconds per pipeline boundary a CPU rank takes part in, per micro-batch: issuing
    and waiting on its point-to-point transfers (``stage_boundaries``). A GPU rank's transfers
    run on the device's streams and leave the host free (not charged)."""
    step_overhead_s: float = 0.0
    """Fixed seconds per optimizer step (synchronisation, bookkeeping)."""
    comm_efficiency: float = 1.0
    """Multiplies the links' bandwidth: achieved over described."""
    overlap_efficiency: float = 1.0
    """Fraction of the hideable communication that overlap actually hides (0-1)."""
    gemm_half_dim: float = 128.0
    """GEMM dimension at which that dimension's efficiency factor is half (``roofline``;
    engines with ``roofline`` only)."""
    ring_step_latency_s: float = 0.0
    """Seconds per step of a ring all-gather / reduce-scatter across nodes (n − 1 steps), for
    ZeRO-3's per-module collectives (``_zero3_ring_latency``)."""
    flash_efficiency: float = 0.5
    """Fraction of peak causal flash attention reaches in its forward (``roofline``)."""
    optimizer_bytes_per_param: float = 28.0
    """Memory traffic of the optimizer step per parameter the rank updates."""
    layer_shape_factors: dict[str, float] = field(default_factory=dict)
    """Measured correction of a layer's device time per per-rank shape (``layer_shape_key``):
    what a kernel profile knows and a smooth efficiency curve cannot (a GEMM shape the
    library tiles badly). Shapes never measured take the curve alone (factor 1)."""
    host_shape_factors: dict[str, float] = field(default_factory=dict)
    """Measured correction of a layer's host launch time per shape, for shapes whose measured
    steps are launch-bound (their device time cannot be seen, their host time can)."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> Calibration:
        if not isinstance(data, dict):
            raise ConfigError("a calibration must be an object of Calibration fields")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(
                f"unknown calibration key(s) {', '.join(unknown)}; valid keys: "
                f"{', '.join(sorted(names))}"
            )
        data = dict(data)
        tables = {name: data.pop(name, {}) for name in SHAPE_TABLES}
        for name, table in tables.items():
            if not isinstance(table, dict):
                raise ConfigError(f"calibration '{name}' must map shapes to numbers")
        for key, value in [*data.items(), *(kv for t in tables.values() for kv in t.items())]:
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not (math.isfinite(value) and value >= 0)
            ):
                raise ConfigError(f"calibration '{key}' must be a number ≥ 0, not {value!r}")
        return cls(
            **{k: float(v) for k, v in data.items()},
            **{
                name: {str(k): float(v) for k, v in table.items()} for name, table in tables.items()
            },
        )

    @classmethod
    def for_cluster(cls, cluster: ClusterSpec) -> Calibration:
        """The cluster's stored calibration, or the defaults."""
        return cls.from_dict(cluster.calibration) if cluster.calibration else cls()


SHAPE_TABLES = ("layer_shape_factors", "host_shape_factors")
"""The calibration's per-shape corrections (maps of ``layer_shape_key`` to a factor)."""


@dataclass(frozen=True, slots=True)
class StepTimeEstimate:
    """Predicted seconds of one optimizer step and where they go."""

    step_time_s: float
    breakdown: dict[str, float]
    """Seconds per term of ``TERMS``; they sum to ``step_time_s``."""
    tokens_per_s: float
    mfu: float | None
    """Model FLOPs utilisation (PaLM definition, recomputation not counted)."""
    bottleneck_stage: int
    """The pipeline rank whose per-micro-batch time sets the pace."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "mfu": self.mfu,
            "bottleneck_stage": self.bottleneck_stage,
            "breakdown": dict(self.breakdown),
        }


# ---- the model's arithmetic ----------------------------------------------------------------
def layer_forward_flops(
    shape: ModelShape, *, seq_len: int, micro_batch: int
) -> tuple[float, float]:
    """(matmul FLOPs, attention-score FLOPs) of one layer's forward for one micro-batch, whole
    (divide by tp for a rank). Narayanan et al. 2021 §5.1, generalised to GQA, SwiGLU and any
    block the description lists: 2·b·s FLOPs per element of each of its matrices (the block's
    2-D tensors: q, k, v, o and the MLP's, fused or not), and Q·Kᵀ with softmax·V over the
    query width (heads × head_dim) and the keys each layer's attention sees
    (``description.attention_keys``: s² counted whole, a sliding window's masked pairs twice)."""
    b, s = micro_batch, seq_len
    matrices = sum(r * c for r, c in local_block(shape, 1).shapes if c > 1)
    return 2 * b * s * matrices, 4 * b * attention_keys(shape, s) * attention_width(shape)


@lru_cache(maxsize=64)
def layer_params(shape: ModelShape) -> int:
    """Parameters of one decoder layer: its tensors as ``ModelShape.num_params`` counts them
    (``ModelShape.block_tensors``)."""
    return sum(t.numel for t in shape.block_tensors())


def root_params(
    shape: ModelShape, vocab: int, vocab_shards: int, *, first: bool, last: bool
) -> float:
    """Parameters outside the blocks on a pipeline rank (``ModelShape.root_tensors``): the first
    stage's embeddings, the last stage's final norm and output head, a tied head counted once
    where one rank holds both; the vocabulary's tensors divided over ``vocab_shards``."""
    tensors = shape.root_tensors(vocab, first=first, last=last)
    return sum(t.numel / (vocab_shards if t.tp == TP_VOCAB else 1) for t in tensors)


def layer_shape_key(config: TrialConfig, shape: ModelShape, device_type: str = "cuda") -> str:
    """The key of a per-rank layer shape: the block's architecture (family, hidden, MLP width,
    heads), the tokens per micro-batch, tp and dtype — what decides its kernels."""
    rows = config.micro_batch_size * config.workload.seq_len
    return (
        f"{shape.family} h{shape.hidden_size} f{shape.ffn_hidden_size} "
        f"a{shape.num_heads}/{shape.num_kv_heads} rows{rows} tp{config.tp_degree} "
        f"{config.compute_dtype(device_type)}"
    )


SOFT_MAX_POWER = 32.0
"""max(a, b) ≈ (a⁴ + b⁴)^¼: host and device work overlap imperfectly near the crossover."""


def _soft_max(a: float, b: float) -> float:
    if a <= 0 or b <= 0:
        return max(a, b)
    big = max(a, b)
    return big * ((a / big) ** SOFT_MAX_POWER + (b / big) ** SOFT_MAX_POWER) ** (1 / SOFT_MAX_POWER)


def matmul_efficiency(cal: Calibration, rows: float, cols: float) -> float:
    """Fraction of peak a (rows × h) · (h × cols) matmul reaches: e_max · r/(r + r½) ·
    c/(c + c½). Each dimension saturates on its own (tiles fill the GPU's SMs along both);
    a thin per-rank width h/tp is what makes high tensor parallelism inefficient."""
    return max(
        cal.compute_efficiency
        * rows
        / (rows + cal.half_efficiency_rows)
        * cols
        / (cols + cal.half_efficiency_cols),
        1e-6,
    )


@dataclass(frozen=True, slots=True)
class _Group:
    """Where a communication group's ranks sit."""

    size: int
    nodes: int
    """Nodes it spans."""
    concurrent: int
    """Groups of its kind on one node that talk at the same time (share the node's network)."""


def _groups(config: TrialConfig, devices_per_node: int) -> tuple[_Group, _Group, bool, int]:
    """(tp group, data-parallel sync group, whether some pipeline boundary crosses nodes,
    ranks per node that cross it together), for the mesh (pp, dp, cp, tp) numbered with tp
    fastest. The sync group is the ranks that average gradients, dp × cp (``memory.sync_ranks``,
    the trials' ``mesh.data_parallel_mesh``): the ranks sharing pp and tp."""
    tp, pp = config.tp_degree, config.pp_degree
    n = devices_per_node
    tp_nodes = max(1, math.ceil(tp / n))
    tp_group = _Group(tp, tp_nodes, max(1, n // tp) if tp_nodes > 1 else 1)
    sync = sync_ranks(config)
    span = tp * sync
    dp_nodes = max(1, math.ceil(span / n))
    dp_members_per_node = max(1, sync // dp_nodes)
    dp_group = _Group(sync, dp_nodes, max(1, n // dp_members_per_node) if dp_nodes > 1 else 1)
    pp_crosses = pp > 1 and config.world_size > n
    return tp_group, dp_group, pp_crosses, min(n, span)


def collective_time(
    cluster: ClusterSpec,
    calibration: Calibration,
    group: _Group,
    nbytes: float,
    *,
    kind: str = "all_reduce",
) -> float:
    """Seconds of one collective of ``nbytes`` (nccl-tests' size) over ``group``.

    all_reduce moves 2(n−1)/n·S per rank, all_gather and reduce_scatter (n−1)/n·S (nccl-tests
    ``PERFORMANCE.md``); gloo's reduce_scatter is an all-reduce."""
    n = group.size
    if n <= 1 or nbytes <= 0:
        return 0.0
    if kind == "reduce_scatter" and cluster.backend == "gloo":
        kind = "all_reduce"
    factor = 1.0 if kind == "all_reduce" else 0.5
    eff = calibration.comm_efficiency
    intra_n = min(n, cluster.devices_per_node)
    link = cluster.intra_node
    t = factor * _ring_factor(n) * nbytes / (link.busbw(nbytes, intra_n) * eff)
    if group.nodes > 1:
        inter = cluster.inter_node
        node_bw = inter.bandwidth_gbs * GB * eff
        t_inter = inter.latency_us * 1e-6 + (
            group.concurrent * factor * _ring_factor(n) * nbytes / node_bw
        )
        t = max(t, t_inter)
    return t


def p2p_time(
    cluster: ClusterSpec,
    calibration: Calibration,
    nbytes: float,
    *,
    crosses_nodes: bool,
    concurrent: int,
) -> float:
    """Seconds of one point-to-point transfer between adjacent pipeline stages."""
    eff = calibration.comm_efficiency
    if crosses_nodes:
        link = cluster.inter_node
        bw = link.bandwidth_gbs * GB * eff / max(1, concurrent)
    else:
        link = cluster.intra_node
        bw = link.bandwidth_gbs * GB * eff
    return link.latency_us * 1e-6 + nbytes / bw


def pipeline_bubble(stage_s: list[float], m: int, v: int) -> float:
    """Seconds a pipeline of stages taking ``stage_s`` seconds per micro-batch spends beyond
    ``m · max T_i`` (m micro-batches, v virtual stages per rank).

    With m ≥ p: ``(Σ T_i − max T_i) / v``, Narayanan et al. 2021's bubble (p−1)/(v·m) of the
    ideal time (§2.2). With m < p interleaving cannot hide it: a micro-batch's chunks run one
    after another, so the first micro-batch crosses every chunk (Σ T_i) and each later one
    trails it by a chunk of the slowest stage (max T_i / v): ``Σ T_i + (m − 1) · max T_i / v −
    m · max T_i``. For v = 1 both are Σ T_i − max T_i (GPipe's and 1F1B's (p−1)/m), and they
    agree at m = p."""
    p, t_max, total = len(stage_s), max(stage_s), sum(stage_s)
    if m >= p or v == 1:
        return (total - t_max) / v
    return total + (m - 1) * t_max / v - m * t_max


def stage_boundaries(rank: int, p: int, v: int) -> int:
    """Stage boundaries pipeline rank ``rank`` of ``p`` takes part in, each crossed once per
    micro-batch: its v chunks' incoming and outgoing ones, but for the pipeline's first chunk
    (rank 0 receives nothing) and its last (rank p − 1 sends nothing). Rank r holds virtual
    stages r, r + p, … (Narayanan et al. 2021 §2.2), so with v > 1 rank p − 1 also sends to
    rank 0 (its chunk j to rank 0's chunk j + 1): 2v − 1 at either end, 2v between; 1, 2, …, 1
    for v = 1. 0 without a pipeline."""
    if p <= 1:
        return 0
    return 2 * v - (rank == 0) - (rank == p - 1)


def ranks_per_core(cluster: ClusterSpec, ranks: int) -> float:
    """How many of ``ranks`` runnable ranks of one node share each core (at least 1): a CPU
    rank then runs at 1/this of a core (the OS scheduler's processor sharing). 1 for a device
    per rank (no ``cores_per_node``, or an asynchronous device)."""
    cores = cluster.cores_per_node
    if not cores or cluster.device.asynchronous:
        return 1.0
    return max(1.0, min(ranks, cluster.devices_per_node) / cores)


def core_sharing(cluster: ClusterSpec, active: int) -> float:
    """How much faster CPU ranks run when only ``active`` of a node's ranks work at once than
    when all ``devices_per_node`` do (the stage times' speed): the ratio of the ranks per core
    (``ranks_per_core``), max(1, active/cores) / max(1, ranks/cores). 1 without
    ``cores_per_node`` (a device per rank)."""
    return ranks_per_core(cluster, active) / ranks_per_core(cluster, cluster.devices_per_node)


def uncoscheduled(cluster: ClusterSpec, group: int) -> float:
    """Factor on a collective's host cost when its ``group`` ranks outnumber the cores.

    A collective returns only when every member has taken part, so with more members than
    cores it cannot be run by all of them at once: without gang scheduling (Ousterhout 1982,
    "Scheduling Techniques for Concurrent Systems": coscheduling) the operating system runs
    them a core's worth at a time and each message waits for its peer's turn, about
    ``group / cores`` turns in all. 1 while the group fits the cores, and for a device per rank
    (no ``cores_per_node``). The share of the cores the rank gets otherwise (``host_share``)
    is a separate factor: it slows the rank's own work, not its waiting for peers."""
    return ranks_per_core(cluster, group)  # the members on one node


def hooked_units(
    config: TrialConfig, chunk_layers: Sequence[int], per_layer_bytes: float, engine: EngineProfile
) -> int:
    """FSDP2 units on one pipeline rank whose Python hooks run every micro-batch.

    autotune's engine (``parallel/zero.py``) shards ZeRO-2/3 with ``fully_shard`` and, with
    overlap on beside TP or a pipeline, replicates ZeRO-0/1 with ``replicate`` (FSDP2's DDP);
    both group a part's blocks up to ``bucket_mb`` into units and wrap the part itself (the
    root). Each unit's ``FSDPState`` registers forward pre/post hooks and backward hooks that
    run in Python on every forward and backward (torch 2.13
    ``distributed/fsdp/_fully_shard/_fsdp_state.py``: ``_pre_forward``, ``_post_forward``,
    ``_pre_backward``, ``_root_post_backward_final_callback``; ``replicate_with_fsdp.py``'s
    state is a subclass), whether the gradient is synchronised that micro-batch or not.
    torch's DDP keeps its bookkeeping in the C++ Reducer, and the non-overlapped path
    all-reduces once after the backward: no per-unit hooks. ``chunk_layers``: the layers of
    each of the rank's parts (virtual stages), each a part with its own root;
    ``per_layer_bytes``: one block's parameter bytes on the rank."""
    if not engine.fsdp2_data_parallel or sync_ranks(config) <= 1:
        return 0
    fsdp2 = config.zero_stage >= 2 or (
        config.overlap_enabled and (config.tp_degree > 1 or config.pp_degree > 1)
    )
    if not fsdp2:
        return 0
    per_unit = max(1, math.ceil(config.bucket_mb * 2**20 / max(per_layer_bytes, 1.0)))
    return sum(math.ceil(n / per_unit) + 1 for n in chunk_layers)


@dataclass(frozen=True, slots=True)
class _Step:
    """What every term of a predicted step reads: the layout, the cluster, the calibration and
    the quantities derived from them once."""

    config: TrialConfig
    cluster: ClusterSpec
    cal: Calibration
    shape: ModelShape
    engine: EngineProfile
    device_type: str
    layout: LayoutQuantities
    """What the layout derives for both models: element sizes, tokens, micro-batches, chunks."""
    peak_flops: float
    """The device's dense peak FLOP/s in the compute dtype."""
    mem_bw: float
    """The device's memory bandwidth, bytes/s."""
    host_share: float
    """Ranks per core of a node whose ranks all work (``ranks_per_core``; 1 on GPUs)."""

    @property
    def vocab_shards(self) -> int:
        """What the vocabulary dimension is divided by on a rank (tp when vocab-parallel)."""
        return self.config.tp_degree if self.engine.vocab_parallel else 1

    @property
    def activation_bytes(self) -> float:
        """One micro-batch's b·s·h activation on a rank (s/cp tokens under context
        parallelism), in bytes."""
        return float(self.layout.activation_elems * self.layout.elem_bytes)

    @property
    def data_parallel_bytes(self) -> DataParallelBytes:
        """The element sizes of the data-parallel collectives (:func:`data_parallel_bytes`)."""
        return _moved_bytes(self.layout.state_bytes, self.layout.fsdp)


@dataclass(frozen=True, slots=True)
class _LayerCost:
    """Seconds of one decoder layer per micro-batch, and of the output head."""

    device_s: float
    """Device work: forward, backward and recomputation (shape factor applied)."""
    head_s: float
    """The output head's forward and backward (last stage)."""
    tp_s: float
    """Tensor-parallel all-reduces."""
    tp_embed_s: float
    """The vocab-parallel embedding's all-reduce (first stage)."""
    host_s: float
    """Host launch time of its kernels and collectives."""
    excess_s: float
    """What the host adds beyond the device's work (all of it on a CPU rank)."""


def predict_step_time(
    config: TrialConfig,
    cluster: ClusterSpec,
    calibration: Calibration | None = None,
    *,
    shape: ModelShape | None = None,
    engine: EngineProfile = AUTOTUNE_ENGINE,
) -> StepTimeEstimate:
    """Predicted step time of ``config`` on ``cluster`` (see the module docstring).

    ``shape`` None takes the built-in workload's shape; a user workload needs one. The layout
    is placed on ``cluster`` as the executor places it; ``cluster`` must have at least
    ``config.world_size`` devices."""
    return StepTimeModel(cluster, calibration, shape=shape, engine=engine).predict(config)


SHARDING_BLIND = layout_quantities.STEP_LAYER_IGNORE  # declared in knobs.py
"""The fields a layer's cost (``_layer_cost``) and the parameters per pipeline rank do not
read: how the data-parallel ranks shard and synchronise (ZeRO stage, HSDP, bucket, overlap,
offload), and how a trial is measured."""


class StepTimeModel:
    """``predict_step_time`` for many layouts of one model on one cluster, as ``rank`` scores
    them: the terms data-parallel sharding does not change (a layer's cost, the parameters of
    the fullest pipeline rank) are computed once per value of the other fields
    (``SHARDING_BLIND``) and shared by the layouts that differ only in ZeRO stage, HSDP, bucket
    or overlap. Each prediction equals ``predict_step_time``'s
    (``tests/model/test_scoring_memos.py``)."""

    def __init__(
        self,
        cluster: ClusterSpec,
        calibration: Calibration | None = None,
        *,
        shape: ModelShape | None = None,
        engine: EngineProfile = AUTOTUNE_ENGINE,
    ) -> None:
        self.cluster, self.shape, self.engine = cluster, shape, engine
        self.calibration = calibration or Calibration.for_cluster(cluster)
        self._shared: BoundedMemo[tuple[_LayerCost, float, _MoECost | None]] = BoundedMemo()

    def predict(self, config: TrialConfig) -> StepTimeEstimate:
        step = _setup(config, self.cluster, self.calibration, self.shape, self.engine)
        layer, params_rank, moe = self._shared.get(
            (step.shape, fields_key(config, SHARDING_BLIND)), lambda: _shared_terms(step)
        )
        return _predict(step, layer, params_rank, moe)


def _shared_terms(step: _Step) -> tuple[_LayerCost, float, _MoECost | None]:
    """What the layouts differing only in data-parallel sharding share: a layer's cost, the
    parameters of the fullest pipeline rank, and a mixture of experts' MoE layer terms (its
    parameters there the non-routed ones)."""
    rank_layers = [sum(c) for c in step.layout.chunk_layers]
    if step.shape.moe is None:
        return _layer_cost(step), _params_per_rank(step, rank_layers), None
    moe = _moe_cost(step)
    return _layer_cost(step), moe.params_rank, moe


def _predict(
    step: _Step, layer: _LayerCost, params_rank: float, moe: _MoECost | None = None
) -> StepTimeEstimate:
    """The step of ``step``'s layout from its layer's cost, the parameters of its fullest
    pipeline rank and, for a mixture of experts, its MoE layers' terms."""
    config, layout = step.config, step.layout
    microbatches, v = layout.num_microbatches, layout.chunks_per_rank
    # Layers per pipeline rank: its v virtual stages, round-robin (Narayanan et al. §2.2).
    chunks = layout.chunk_layers
    rank_layers = [sum(c) for c in chunks]
    stages = _stage_times(step, layer, chunks, v, moe)
    totals = [sum(t) for t in stages]
    slowest = totals.index(max(totals))  # the first slowest
    slowest_s = totals[slowest]
    bubble_s = _bubble_time(step, totals, v)
    pipe_s = microbatches * slowest_s + bubble_s
    compute_s, tp_comm_s, p2p_s, overhead_s, *moe_s = stages[slowest]
    window_s = compute_s + (moe_s[0] if moe_s else 0.0)
    breakdown = {
        "compute": microbatches * compute_s,
        "tp_comm": microbatches * tp_comm_s,
        "pp_p2p": microbatches * p2p_s,
        "pp_bubble": pipe_s - microbatches * slowest_s,
        "dp_comm": _dp_time(step, params_rank, rank_layers, window_s),
        "optimizer": _optimizer_time(step, params_rank),
        "overhead": microbatches * overhead_s + step.cal.step_overhead_s * step.host_share,
    }
    if moe is not None:
        breakdown = _moe_breakdown(step, breakdown, moe, moe_s, window_s)
    step_s = sum(breakdown.values())
    tokens = config.tokens_per_step
    total_params = (
        _num_params(step.shape, layout.vocab)
        if step.shape.moe is None
        else moe_time.active_params(step.shape, layout.vocab)
    )
    model_flops = (
        flops_per_token(
            total_params, step.shape.num_layers, step.shape.hidden_size, config.workload.seq_len
        )
        * tokens
    )
    mfu = model_flops / step_s / (config.world_size * step.peak_flops)
    return StepTimeEstimate(
        step_time_s=step_s,
        breakdown=breakdown,
        tokens_per_s=tokens / step_s,
        mfu=mfu,
        bottleneck_stage=slowest,
    )


@lru_cache(maxsize=64)
def _num_params(shape: ModelShape, vocab: int) -> int:
    """``shape.num_params(vocab)``, once per shape: it lists the model's tensors."""
    return shape.num_params(vocab)


def _setup(
    config: TrialConfig,
    cluster: ClusterSpec,
    calibration: Calibration | None,
    shape: ModelShape | None,
    engine: EngineProfile,
) -> _Step:
    """The step's inputs, checked, and the figures every term reads."""
    cal = calibration or Calibration.for_cluster(cluster)
    shape = shape or config.workload.shape
    if shape is None:
        raise ConfigError(
            f"cannot predict the step time of user workload "
            f"'{config.workload.workload}' without its shape; pass a ModelShape"
        )
    # Mixed precision computes at the half-precision peak; a config naming no precision
    # trains in the cluster's default (gloo: CPU ranks).
    device_type = cluster.device_type
    precision = config.resolved_precision(device_type)
    return _Step(
        config=config,
        cluster=cluster,
        cal=cal,
        shape=shape,
        engine=engine,
        device_type=device_type,
        layout=LayoutQuantities.of(config, shape, precision),
        peak_flops=cluster.device.flops(config.compute_dtype(device_type)),
        mem_bw=cluster.device.memory_bandwidth_gbs * GB,
        # CPU ranks that outnumber the cores run their interpreter on a share of one.
        host_share=ranks_per_core(cluster, cluster.devices_per_node),
    )


def _layer_cost(step: _Step) -> _LayerCost:
    """One layer's device work, TP collectives and host launches per micro-batch; the head's.

    Compute: Narayanan et al. 2021 §5.1 FLOPs (``layer_forward_flops``) ÷ (peak ×
    ``matmul_efficiency``), backward twice the forward, recomputation per Korthikanti et al.
    2022 §4, plus the element-wise kernels as bytes ÷ memory bandwidth. TP: Megatron's
    all-reduces (Shoeybi et al. 2019 §3), each a ring ``collective_time``."""
    config, cal, shape = step.config, step.cal, step.shape
    full = config.activation_checkpointing == "full"
    shape_key = layer_shape_key(config, shape, step.device_type)
    if step.engine.roofline:
        layer_fwd_s, layer_bwd_s, attn_core_s = _roofline_layer(step)
    else:
        layer_fwd_s, layer_bwd_s, attn_core_s = _analytic_layer(step)
    head_s = _head_time(step)
    recompute_s = _recompute_time(step, layer_fwd_s, attn_core_s)
    device_s = (layer_fwd_s + layer_bwd_s + recompute_s) * cal.layer_shape_factors.get(
        shape_key, 1.0
    )
    tp_collectives, tp_s, tp_embed_s = _tp_layer_time(step, full)
    tp_s += context_parallel_time(step)
    host_s = _host_layer_time(step, tp_collectives, 3 if full else 2, shape_key)
    if step.cluster.device.asynchronous:
        busy = device_s + tp_s
        excess_s = _soft_max(host_s, busy) - busy
    else:
        excess_s = host_s
    return _LayerCost(device_s, head_s, tp_s, tp_embed_s, host_s, excess_s)


def _analytic_layer(step: _Step) -> tuple[float, float, float]:
    """(forward, backward, attention core's forward) seconds of one layer on one rank, by FLOPs."""
    config, cal, shape = step.config, step.cal, step.shape
    tp = config.tp_degree
    b, s, cp = config.micro_batch_size, config.workload.seq_len, config.cp_degree
    h, a, mem_bw = shape.hidden_size, shape.num_heads, step.mem_bw
    elem_bytes = step.layout.elem_bytes
    tokens = step.layout.microbatch_tokens  # b·s/cp: a rank's queries under context parallelism
    # A context-parallel rank computes its s/cp queries against all s keys: the matmuls
    # and the scores both divide by cp (Liu et al. 2023, ring attention).
    mat_flops, score_flops = (f / cp for f in layer_forward_flops(shape, seq_len=s, micro_batch=b))
    flop_rate = step.peak_flops * matmul_efficiency(cal, tokens, h / tp)
    eager = config.attention == "eager"
    act_elems = tokens * h
    # Norms, residuals and dropout act on the whole b·s·h on every TP rank (no sequence
    # parallelism); the MLP activation and biases on the rank's shard.
    elementwise_s = (cal.elementwise_bytes + cal.elementwise_sharded_bytes / tp) * (
        act_elems * elem_bytes / mem_bw
    )
    score_s = (cal.score_bytes * b * (a / tp) * s * s / cp * elem_bytes / mem_bw) if eager else 0.0
    layer_fwd_s = (mat_flops + score_flops) / tp / flop_rate + elementwise_s + score_s
    return layer_fwd_s, 2 * layer_fwd_s, score_flops / tp / flop_rate + score_s


def _head_time(step: _Step) -> float:
    """Seconds of the output head's forward and backward (3× its GEMM) per micro-batch."""
    cal, h = step.cal, step.shape.hidden_size
    tokens = step.layout.microbatch_tokens
    if step.engine.roofline:
        return 3 * roofline.gemm_time(
            roofline.Gemm(tokens, step.layout.vocab / step.vocab_shards, h),
            peak=step.peak_flops,
            mem_bw=step.mem_bw,
            elem_bytes=step.layout.elem_bytes,
            e_max=cal.compute_efficiency,
            half_dim=cal.gemm_half_dim,
        )
    head_work = tokens * h * step.layout.vocab / step.vocab_shards
    return (
        3
        * 2
        * head_work
        / (step.peak_flops * matmul_efficiency(cal, tokens, step.layout.vocab / step.vocab_shards))
    )


def _recompute_time(step: _Step, layer_fwd_s: float, attn_core_s: float) -> float:
    """Seconds of one layer's forward recomputed in backward under activation checkpointing."""
    ac, engine = step.config.activation_checkpointing, step.engine
    if ac == "full":
        return layer_fwd_s * full_recompute_share(step.config, step.shape.num_layers)
    if ac == "op":  # the trial runs torchtitan's op-level policy (activation_checkpoint.py)
        return selective_op_recompute(layer_fwd_s, attn_core_s)
    if ac == "selective":
        if engine.selective_recompute == "op" and engine.roofline:
            return selective_op_recompute(layer_fwd_s, attn_core_s)
        return attn_core_s
    return 0.0


def _tp_layer_time(step: _Step, full: bool) -> tuple[int, float, float]:
    """(TP collectives, their seconds, the embedding's all-reduce) of one layer per micro-batch."""
    config, engine = step.config, step.engine
    tp_group = _groups(config, step.cluster.devices_per_node)[0]
    if config.tp_degree <= 1:
        return 0, 0.0, 0.0
    backward_inputs = (
        2 if engine.fused_column_inputs else (3 + (2 if step.shape.family == "llama" else 1))
    )
    tp_collectives = 2 * (2 if full else 1) + backward_inputs
    allreduce_s = collective_time(step.cluster, step.cal, tp_group, step.activation_bytes)
    # Overlapped TP communication (Megatron's --tp-comm-overlap) hides behind the GEMMs.
    tp_s = tp_collectives * allreduce_s * (1 - engine.tp_comm_overlap * step.cal.overlap_efficiency)
    return tp_collectives, tp_s, allreduce_s if engine.vocab_parallel else 0.0


def _inner_group(size: int, inner: int, devices_per_node: int) -> _Group:
    """A group of ``size`` ranks strided by ``inner`` ranks (the mesh dimensions inside it):
    the nodes it spans and how many such groups share each node's network."""
    nodes = (
        size if inner >= devices_per_node else max(1, math.ceil(size * inner / devices_per_node))
    )
    per_node = max(1, size // nodes)
    return _Group(size, nodes, max(1, devices_per_node // per_node) if nodes > 1 else 1)


def context_parallel_time(step: _Step) -> float:
    """Seconds of context parallelism's collectives per layer per micro-batch: the all-gather of
    K and V over the cp group before attention (each rank holds s/cp of b·s·2·kv), the
    reduce-scatter of their gradients in backward, and the all-gather again under full
    recomputation (torch's ``context_parallel`` all-gather rotation; Llama 3 §3.3.2: "all-gather
    K and V, then compute attention for the local query chunk"). The cp group sits inside the
    tp ranks of the mesh (pp, dp, cp, tp)."""
    config, shape = step.config, step.shape
    cp = config.cp_degree
    if cp <= 1:
        return 0.0
    group = _inner_group(cp, config.tp_degree, step.cluster.devices_per_node)
    kv = shape.num_kv_heads * shape.head_dim / config.tp_degree
    gathered = config.micro_batch_size * config.workload.seq_len * 2 * kv * step.layout.elem_bytes
    passes = 2 + (config.activation_checkpointing == "full")
    return passes * collective_time(step.cluster, step.cal, group, gathered, kind="all_gather")


def full_recompute_share(config: TrialConfig, num_layers: int) -> float:
    """Share of a pipeline rank's layers that full checkpointing recomputes: all of them, or
    ``ac_layers`` of them (Megatron's ``--recompute-num-layers`` per stage; torchtitan's
    ``selective`` ``layer`` mode checkpoints every ac_freq-th block: ac_layers = L / ac_freq)."""
    if config.ac_layers is None:
        return 1.0
    return min(1.0, config.ac_layers * config.pp_degree / num_layers)


def selective_op_recompute(layer_fwd_s: float, attn_core_s: float) -> float:
    """Recompute seconds of torchtitan's selective ``op`` mode per layer: its policy saves
    SDPA's output and every second matmul's (``_apply_ac_to_transformer_block``,
    ``_save_list`` with ``mm_count % 2``), so the backward reruns half of the GEMMs and the
    element-wise kernels: half of the forward less attention."""
    return 0.5 * (layer_fwd_s - attn_core_s)


def sequence_parallel(step: _Step) -> bool:
    """Whether the layout runs sequence parallelism: the config asks for it, or the engine
    runs it whenever tp > 1 (``EngineProfile.sequence_parallel``)."""
    return step.config.tp_degree > 1 and (
        step.config.sequence_parallel or step.engine.sequence_parallel
    )


def _roofline_layer(step: _Step) -> tuple[float, float, float]:
    """(forward, backward, attention core's forward) seconds of one layer per micro-batch on
    one rank, by ``roofline``: the four GEMMs at their efficiency; attention as causal flash
    (sdpa: half the score FLOPs at ``flash_efficiency``, backward 2.5×) or as materialised
    scores (eager: two batched GEMMs of head_dim depth and the softmax's bytes); the
    element-wise kernels by their bytes, on s/t tokens under sequence parallelism (Korthikanti
    et al. 2022 §4.2.2) and their sharded part on the rank's shard."""
    config, cal, shape = step.config, step.cal, step.shape
    tp, b, s, h = (
        config.tp_degree,
        config.micro_batch_size,
        config.workload.seq_len,
        shape.hidden_size,
    )
    elem_bytes = step.layout.elem_bytes
    s_rank = s / config.cp_degree  # the queries of one sequence on the rank
    tokens = float(step.layout.microbatch_tokens)
    fig = dict(
        peak=step.peak_flops,
        mem_bw=step.mem_bw,
        elem_bytes=elem_bytes,
        e_max=cal.compute_efficiency,
        half_dim=cal.gemm_half_dim,
    )
    fp8 = float8_peak(step)
    gemm_fig = fig if fp8 is None else {**fig, "peak": fp8, "elem_bytes": 1}
    gemm_s = roofline.layer_gemm_time(shape, tokens=tokens, tp=tp, **gemm_fig)
    cast_s = 0.0 if fp8 is None else float8_cast_time(step, tokens)
    heads = b * shape.num_heads / tp
    if config.attention == "sdpa":
        flops = roofline.causal_flash_flops(shape, batch=b, seq=s_rank, keys=s, tp=tp)
        attn_fwd = flops / (step.peak_flops * cal.flash_efficiency)
        attn_bwd = roofline.FLASH_BACKWARD_RATIO * attn_fwd
    else:
        score = roofline.gemm_time(roofline.Gemm(s_rank, s, shape.head_dim), **fig)
        softmax_s = cal.score_bytes * heads * s_rank * s * elem_bytes / step.mem_bw
        attn_fwd = 2 * heads * score + softmax_s
        attn_bwd = 2 * attn_fwd
    whole = cal.elementwise_bytes / (tp if sequence_parallel(step) else 1)
    elementwise_s = (whole + cal.elementwise_sharded_bytes / tp) * (
        elementwise_factor(step) * tokens * h * elem_bytes / step.mem_bw
    )
    forward = gemm_s + attn_fwd + elementwise_s + cast_s / 3
    backward = 2 * (gemm_s + elementwise_s + cast_s / 3) + attn_bwd
    return forward, backward, attn_fwd


def elementwise_factor(step: _Step) -> float:
    """The engine's element-wise bytes over fused kernels' (``EngineProfile.elementwise_factor``);
    with ``compile`` at most 1: regional ``torch.compile`` fuses each block's norm, rotary and
    activation chains into Triton kernels that read and write each tensor once, as Megatron's
    hand-fused kernels do (torchtitan ``apply_compile``)."""
    factor = step.engine.elementwise_factor
    return min(factor, 1.0) if step.config.compile else factor


FLOAT8_CAST_BYTES = 5.0
"""Bytes per element of a dynamic float8 cast: the amax reduction reads the bf16 tensor (2), the
scaled cast reads it again (2) and writes float8 (1) (torchao ``float8`` training, tensorwise
dynamic scaling)."""


def float8_peak(step: _Step) -> float | None:
    """The float8 peak the linear layers run at under ``float8``, where the device has one
    (``hardware.GPUS``' ``float8``: Hopper and later); None otherwise."""
    if not step.config.float8:
        return None
    return step.cluster.device.peak_flops.get("float8")


def float8_cast_time(step: _Step, tokens: float) -> float:
    """Seconds of one layer's float8 casts per micro-batch (forward and backward): each GEMM's
    input and weight in forward, its output gradient and the weight again in backward, at
    ``FLOAT8_CAST_BYTES`` per element (the input's cast is reused by the weight gradient)."""
    gemms = roofline.layer_gemms(step.shape, tokens=tokens, tp=step.config.tp_degree)
    elements = sum(g.m * g.k + 2 * g.k * g.n + g.m * g.n for g in gemms)
    return FLOAT8_CAST_BYTES * elements / step.mem_bw


def _host_layer_time(step: _Step, tp_collectives: int, passes: int, shape_key: str) -> float:
    """Host seconds to launch one layer's kernels and collectives per micro-batch (``passes``:
    forward, backward, and recompute; launches counted per pass).

    On a GPU they queue on a stream, so a layer takes the longer of the host's launch time and
    the device's work (small layers are launch-bound); a CPU rank does both itself, so they
    add. A TP collective over more ranks than cores waits for its members' turns
    (``uncoscheduled``)."""
    cal, tp = step.cal, step.config.tp_degree
    tp_dispatch_s = passes * cal.tp_layer_overhead_s if tp > 1 else 0.0
    return (
        (
            passes * cal.layer_overhead_s
            + tp_dispatch_s
            + tp_collectives * cal.collective_overhead_s * uncoscheduled(step.cluster, tp)
        )
        * cal.host_shape_factors.get(shape_key, 1.0)
        * step.host_share
    )


def _stage_times(
    step: _Step,
    layer: _LayerCost,
    chunks: tuple[tuple[int, ...], ...],
    v: int,
    moe: _MoECost | None = None,
) -> list[tuple[float, ...]]:
    """Per pipeline rank, seconds per micro-batch of (compute, TP collectives, point-to-point
    transfers, overheads), and for a mixture of experts (its routed experts, its all-to-alls);
    ``chunks``: per rank, its chunks' layers. Each boundary the rank takes part in
    (``stage_boundaries``) moves the b·s·h activation or its gradient (``p2p_time``); FSDP2
    units add their hooks (``hooked_units``)."""
    config, cal = step.config, step.cal
    pp, tp = config.pp_degree, config.tp_degree
    transfer_s = _boundary_transfer_time(step) if pp > 1 else 0.0
    # FSDP2 units' hooks: host work per micro-batch on each pipeline rank (hooked_units).
    at_rest = step.data_parallel_bytes.at_rest
    per_layer_bytes = layer_params(step.shape) / tp * at_rest
    busy = layer.device_s + layer.tp_s
    # A rank's times follow from its chunks and whether it is first or last: computed once for
    # each such kind of rank (a pipeline of 80 has three or four).
    kinds: dict[tuple, tuple[float, ...]] = {}
    stages = []
    for rank in range(pp):
        kind = (chunks[rank], rank == 0, rank == pp - 1)
        key = kind if moe is None else (*kind, moe.rank_layers[rank])
        times = kinds.get(key)
        if times is None:
            unit_s = hooked_units(config, chunks[rank], per_layer_bytes, step.engine)
            if moe is None:
                times = _rank_times(
                    step, layer, kind, stage_boundaries(rank, pp, v), transfer_s, busy,
                    unit_s * cal.unit_overhead_s,
                )  # fmt: skip
            else:
                times = _moe_rank_times(
                    step, layer, moe, kind, moe.rank_layers[rank],
                    (stage_boundaries(rank, pp, v), transfer_s, unit_s * cal.unit_overhead_s),
                )  # fmt: skip
            kinds[key] = times
        stages.append(times)
    return stages


def _boundary_transfer_time(step: _Step) -> float:
    """Seconds of one pipeline boundary's transfer of the activation (``p2p_time``)."""
    cluster = step.cluster
    _, _, pp_crosses, boundary_ranks = _groups(step.config, cluster.devices_per_node)
    return p2p_time(
        cluster,
        step.cal,
        step.activation_bytes / step.vocab_shards,
        crosses_nodes=pp_crosses,
        concurrent=boundary_ranks,
    )


def _rank_times(
    step: _Step,
    layer: _LayerCost,
    kind: tuple[tuple[int, ...], bool, bool],
    boundaries: int,
    transfer_s: float,
    busy: float,
    unit_s: float,
) -> tuple[float, float, float, float]:
    """(compute, TP collectives, point-to-point transfers, overheads) per micro-batch of a
    pipeline rank whose chunks, first and last are ``kind``; ``unit_s``: its FSDP2 units'
    hooks."""
    cal, cluster = step.cal, step.cluster
    chunk_layers, first, last = kind
    layers = sum(chunk_layers)
    compute = layers * layer.device_s + (layer.head_s if last else 0.0)
    tp_s = layers * layer.tp_s + (layer.tp_embed_s if first else 0.0)
    p2p = transfer_s * boundaries
    if not cluster.device.asynchronous:
        p2p += boundaries * cal.p2p_overhead_s * step.host_share
    if unit_s and cluster.device.asynchronous:
        # The hooks are host work too: on a GPU they hide behind queued kernels as the
        # layers' launches do (the same max, over the rank's layers and units).
        hooks_s = (
            _soft_max(layers * layer.host_s + unit_s, layers * busy)
            - (layers * busy)
            - layers * layer.excess_s
        )
    else:
        hooks_s = unit_s * step.host_share
    overhead = layers * layer.excess_s + cal.microbatch_overhead_s * step.host_share + hooks_s
    return compute, tp_s, p2p, overhead


def _bubble_time(step: _Step, totals: list[float], v: int) -> float:
    """The pipeline's fill and drain (``pipeline_bubble``, Narayanan et al. 2021 §2.2).

    More CPU ranks than cores: the stage times are at the speed of a core shared by all the
    node's ranks, but in the fill and drain only one pipeline rank's tp·dp ranks work, and the
    waiting ranks leave their cores to them (processor sharing, ``core_sharing``; 1 on
    GPUs)."""
    config = step.config
    bubble_s = pipeline_bubble(totals, step.layout.num_microbatches, v)
    return bubble_s * core_sharing(step.cluster, config.tp_degree * config.dp_degree)


def _params_per_rank(step: _Step, rank_layers: list[int]) -> float:
    """Parameters of the pipeline rank that holds the most: its blocks ÷ tp, and the
    parameters outside the blocks (``root_params``, as ``ModelShape.num_params`` counts them)."""
    shape, config = step.shape, step.config
    tp, pp = config.tp_degree, config.pp_degree
    return max(
        rank_layers[r] * layer_params(shape) / tp
        + root_params(shape, step.layout.vocab, step.vocab_shards, first=r == 0, last=r == pp - 1)
        for r in range(pp)
    )


@dataclass(frozen=True, slots=True)
class DataParallelBytes:
    """Bytes per parameter element that data parallelism moves, in the dtype each collective
    really moves (``autotune/trial/parallel/zero.py`` and ``precision.py``)."""

    reduce: int
    """The gradient reduction. DDP (ZeRO-0/1) all-reduces the gradients in their own dtype, the
    model's (half precision under mixed precision, whose model is cast to it); FSDP2 (ZeRO-2/3)
    reduce-scatters in ``MixedPrecisionPolicy.reduce_dtype``: fp32 under mixed precision (the
    dtype of its gradient shards too), else the parameters' dtype."""
    gather: int
    """The parameter gather. FSDP2 all-gathers in ``param_dtype`` (the compute dtype); ZeRO-1
    gathers the updated parameters as the model holds them."""
    at_rest: int
    """A parameter as the wrapper measures it when grouping blocks into units of ``bucket_mb``
    (``zero.group_blocks``): FSDP2's fp32 shards under mixed precision, else the model's."""


def data_parallel_bytes(config: TrialConfig, device_type: str) -> DataParallelBytes:
    """The element sizes of ``config``'s data-parallel collectives on ``device_type``
    (the memory model's ``state_bytes`` of its precision and mechanism)."""
    fsdp = fsdp_shards(config)
    return _moved_bytes(state_bytes(config.resolved_precision(device_type), fsdp=fsdp), fsdp)


@lru_cache(maxsize=64)
def _moved_bytes(bytes_per: StateBytes, fsdp: bool) -> DataParallelBytes:
    """``data_parallel_bytes`` from the model states' element sizes (``fsdp``: ZeRO-2/3 over
    dp > 1, whose gather moves the compute dtype)."""
    return DataParallelBytes(
        reduce=bytes_per.gradient,
        gather=bytes_per.compute if fsdp else bytes_per.parameter,
        at_rest=bytes_per.parameter,
    )


def _dp_time(step: _Step, params_rank: float, rank_layers: list[int], compute_s: float) -> float:
    """Exposed seconds of data-parallel synchronisation per step, by ZeRO stage (Rajbhandari
    et al. 2020, §7), with its host launch costs.

    Stages 0–1 all-reduce the gradients, ZeRO-1 also gathers the updated parameters
    (``_ddp_times``); ZeRO-2 reduce-scatters and all-gathers once per micro-batch, ZeRO-3
    all-gathers twice (``_fsdp_times``); each in the dtype it moves (``data_parallel_bytes``).
    What overlap hides is ``_exposed_sync``'s (``compute_s``: the slowest stage's compute per
    micro-batch)."""
    config, cal, cluster = step.config, step.cal, step.cluster
    dp = sync_ranks(config)
    if dp <= 1:
        return 0.0
    dp_group = _groups(config, cluster.devices_per_node)[1]
    exposed_s = _group_sync_time(step, dp_group, params_rank, compute_s, _fsdp_times)
    if config.zero_stage == 1 and step.engine.distributed_optimizer:
        return exposed_s
    grad_bytes = _sync_bytes(step, params_rank)[0]
    return exposed_s + (
        _dp_collectives(step, grad_bytes, rank_layers)
        * cal.collective_overhead_s
        * step.host_share
        * uncoscheduled(cluster, dp)
    )


def _group_sync_time(
    step: _Step, group: _Group, params: float, compute_s: float, fsdp_times
) -> float:
    """Exposed seconds of synchronising ``params`` elements over ``group`` by the ZeRO stage:
    a distributed optimizer's reduce-scatter and gather (``_distributed_optimizer_time``), or
    ``_ddp_times`` (ZeRO-0/1) or ``fsdp_times`` (ZeRO-2/3), hidden as ``_exposed_sync`` says."""
    grad_bytes, param_bytes = _sync_bytes(step, params)
    zero = step.config.zero_stage
    if zero == 1 and step.engine.distributed_optimizer:
        return _distributed_optimizer_time(step, group, grad_bytes, param_bytes, compute_s)
    if zero <= 1:
        sync_s, gather_s = _ddp_times(step, group, grad_bytes, param_bytes)
    else:
        sync_s, gather_s = fsdp_times(step, group, grad_bytes, param_bytes)
    return _exposed_sync(step, sync_s, gather_s, grad_bytes, compute_s)


def _sync_bytes(step: _Step, params: float) -> tuple[float, float]:
    """(gradient, parameter) bytes data parallelism moves for ``params`` elements, in the
    dtypes it moves them (``data_parallel_bytes``; fp32 where the engine reduces in fp32)."""
    moved = step.data_parallel_bytes
    reduce_bytes = 4 if step.engine.fp32_grad_reduce else moved.reduce
    return params * reduce_bytes, params * moved.gather


def _ddp_times(
    step: _Step, dp_group: _Group, grad_bytes: float, param_bytes: float
) -> tuple[float, float]:
    """(gradient sync, parameter gather) seconds of ZeRO-0/1: the gradients' all-reduce over
    the sync group, and under ZeRO-1 the updated parameters' all-gather."""
    cluster, cal = step.cluster, step.cal
    sync_s = collective_time(cluster, cal, dp_group, grad_bytes)
    gather_s = 0.0
    if step.config.zero_stage == 1:
        gather_s = collective_time(cluster, cal, dp_group, param_bytes, kind="all_gather")
    return sync_s, gather_s


def _fsdp_times(
    step: _Step, dp_group: _Group, grad_bytes: float, param_bytes: float
) -> tuple[float, float]:
    """(gradient sync, parameter gathers) seconds of ZeRO-2/3 per step: the reduce-scatter
    within the shard group (and HSDP's all-reduce across replicas), and the all-gathers, once
    per micro-batch under ZeRO-2, twice under ZeRO-3."""
    config, cluster, cal, engine = step.config, step.cluster, step.cal, step.engine
    microbatches, zero = step.layout.num_microbatches, config.zero_stage
    if config.dp_replicate > 1:
        dp_group = shard_group(config, cluster.devices_per_node)
    sync_s = collective_time(cluster, cal, dp_group, grad_bytes, kind="reduce_scatter")
    sync_s += hsdp_replica_time(step, grad_bytes)
    gathers = microbatches * (2 if zero == 3 else 1)
    if engine.ac_regather and zero == 3 and config.activation_checkpointing == "full":
        gathers += microbatches  # the recomputed forward gathers again (``ac_regather``)
    gather_s = gathers * collective_time(cluster, cal, dp_group, param_bytes, kind="all_gather")
    if zero == 3:
        gather_s += _zero3_ring_latency(step, dp_group, gathers)
    return sync_s, gather_s


def _exposed_sync(
    step: _Step, sync_s: float, gather_s: float, grad_bytes: float, compute_s: float
) -> float:
    """The part of the gradient sync and the parameter gathers that compute does not hide.

    With overlap on, the sync hides behind the last micro-batch's backward but for its last
    bucket, FSDP's all-gathers behind each micro-batch's compute but for its first layer's,
    each to ``overlap_efficiency``. They share one window and one link: the step's compute
    (``compute_s`` per micro-batch) hides at most that much of their total once, so the
    exposed part is at least their sum less it, and the step never beats its links' bound."""
    config, cal = step.config, step.cal
    if not (config.overlap_enabled and step.engine.grad_reduce_overlap):
        return sync_s + gather_s
    hide, microbatches = cal.overlap_efficiency, step.layout.num_microbatches
    last_bucket = sync_s * min(1.0, config.bucket_mb * 2**20 / max(grad_bytes, 1.0))
    backward_last = (2 / 3) * compute_s
    sync_exposed = max(last_bucket, sync_s - hide * backward_last)
    gather_exposed = gather_s
    if config.zero_stage >= 2:
        per_mb = gather_s / microbatches
        layers = max(1, step.shape.num_layers // config.pp_degree)
        gather_exposed = microbatches * max(per_mb / layers, per_mb - hide * compute_s)
    window = hide * microbatches * compute_s
    return max(sync_exposed + gather_exposed, sync_s + gather_s - window)


def hsdp_replica_time(step: _Step, grad_bytes: float) -> float:
    """HSDP's all-reduce across replicas (FSDP2 on a 2-D (replicate, shard) mesh,
    ``dp_replicate`` groups of dp / dp_replicate shards): after the reduce-scatter within its
    shard group, each rank all-reduces its gradient shard (``grad_bytes`` / dp_shard) with the
    ranks holding the same shard in the other replicas (torch ``_fsdp_collectives.py``:
    ``foreach_reduce`` all-reduces over the replicate dimension). 0 without HSDP."""
    config = step.config
    if config.dp_replicate <= 1:
        return 0.0
    group = replica_group(config, step.cluster.devices_per_node)
    return collective_time(step.cluster, step.cal, group, grad_bytes / state_shards(config))


def shard_group(config: TrialConfig, devices_per_node: int) -> _Group:
    """The ranks FSDP2 shards states over and reduce-scatters and gathers within: dp_shard × cp
    (``memory.state_shards``, the trials' ``dp_shard_cp`` dim), ranks strided by tp."""
    return _inner_group(state_shards(config), config.tp_degree, devices_per_node)


def replica_group(config: TrialConfig, devices_per_node: int) -> _Group:
    """HSDP's replicas of one shard: dp_replicate ranks strided by the shard group and tp."""
    inner = config.tp_degree * state_shards(config)
    return _inner_group(config.dp_replicate, inner, devices_per_node)


def _distributed_optimizer_time(
    step: _Step, dp_group: _Group, grad_bytes: float, param_bytes: float, compute_s: float
) -> float:
    """Exposed seconds of a distributed optimizer's step (Megatron's
    ``--use-distributed-optimizer``, DeepSpeed ZeRO-1/2): a reduce-scatter of the gradients and
    an all-gather of the updated parameters, together the all-reduce's bytes. With
    ``grad_reduce_overlap`` the reduce-scatter hides behind the last micro-batch's backward but
    for its last bucket; with ``param_gather_overlap`` the gather behind the next step's first
    forward (``compute_s / 3``) but for its first bucket; each to ``overlap_efficiency``."""
    config, cal, cluster, engine = step.config, step.cal, step.cluster, step.engine
    sync_s = collective_time(cluster, cal, dp_group, grad_bytes, kind="reduce_scatter")
    gather_s = collective_time(cluster, cal, dp_group, param_bytes, kind="all_gather")
    overlap = config.overlap_enabled
    bucket = min(1.0, config.bucket_mb * 2**20 / max(grad_bytes, 1.0))
    hide = cal.overlap_efficiency
    if overlap and engine.grad_reduce_overlap:
        sync_s = max(bucket * sync_s, sync_s - hide * (2 / 3) * compute_s)
    if overlap and engine.param_gather_overlap:
        gather_s = max(bucket * gather_s, gather_s - hide * compute_s / 3)
    launches = 2 * math.ceil(1 / bucket) if bucket > 0 else 2
    return (
        sync_s
        + gather_s
        + launches * cal.collective_overhead_s * uncoscheduled(cluster, sync_ranks(config))
    )


def _zero3_ring_latency(step: _Step, dp_group: _Group, gathers: int) -> float:
    """The ring steps of ZeRO-3's per-unit collectives across nodes, for every engine: each of
    the rank's ``zero3_units`` is gathered on its own in each of ``gathers`` passes, and its
    gradient reduce-scattered per micro-batch; a ring all-gather or reduce-scatter over n ranks
    takes n − 1 steps of ``ring_step_latency_s`` (nccl-tests ``PERFORMANCE.md``: rings have no
    tree)."""
    if dp_group.nodes <= 1 or not step.cal.ring_step_latency_s:
        return 0.0
    passes = gathers + step.layout.num_microbatches  # + the gradients' reduce-scatters
    per_pass = zero3_units(step, max(step.shape.num_layers // step.config.pp_degree, 1))
    return passes * per_pass * (dp_group.size - 1) * step.cal.ring_step_latency_s


def zero3_units(step: _Step, layers: int) -> int:
    """The units a rank's ``layers`` blocks gather one by one under ZeRO-3, by the engine's
    ``fsdp_unit``: ``ZERO3_MODULES_PER_BLOCK`` per block (``submodule``), one per block
    (``block``), or blocks grouped up to bucket_mb by their bytes at rest (``bucket``)."""
    unit = step.engine.fsdp_unit
    if unit == "submodule":
        return layers * ZERO3_MODULES_PER_BLOCK
    return layers if unit == "block" else bucket_units(step, layers)


def bucket_units(step: _Step, layers: int) -> int:
    """FSDP units of ``layers`` blocks grouped up to bucket_mb by their parameters' bytes at
    rest (``trial/parallel/zero.py``, ``group_blocks``)."""
    unit_bytes = layer_params(step.shape) / step.config.tp_degree
    unit_bytes *= step.data_parallel_bytes.at_rest
    per_unit = max(1, math.ceil(step.config.bucket_mb * 2**20 / max(unit_bytes, 1.0)))
    return math.ceil(layers / per_unit)


ZERO3_MODULES_PER_BLOCK = 4
"""Parameter groups a decoder block gathers one by one where ZeRO-3 fetches per submodule
(DeepSpeed ``stage3.py``): QKV, the attention output and the MLP's two linears (norm weights
ride with them)."""


def _dp_collectives(step: _Step, grad_bytes: float, rank_layers: list[int]) -> int:
    """Data-parallel collectives the host launches per step: DDP all-reduces one bucket at a
    time (``grad_bytes``: the gradients as it reduces them), FSDP gathers and reduces one unit
    (blocks grouped up to bucket_mb, by their parameters' bytes at rest) at a time."""
    config = step.config
    zero, microbatches = config.zero_stage, step.layout.num_microbatches
    if zero <= 1:
        return math.ceil(grad_bytes / (config.bucket_mb * 2**20)) * (2 if zero == 1 else 1)
    units = bucket_units(step, max(rank_layers)) + 1  # + the root's unit
    return units * (1 + microbatches * (2 if zero == 3 else 1))


def _optimizer_time(step: _Step, params_rank: float) -> float:
    """The optimizer step, memory-bound: bytes per parameter × the parameters the rank updates
    (its ZeRO share) ÷ memory bandwidth (AdamW: 28 bytes per fp32 parameter)."""
    config = step.config
    zero = config.zero_stage if sync_ranks(config) > 1 else 0
    updated = params_rank / (state_shards(config) if zero >= 1 else 1)
    return step.cal.optimizer_bytes_per_param * updated / step.mem_bw


# ---- a mixture of experts (``moe_time``) ------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _MoECost:
    """A mixture of experts' MoE layer terms per micro-batch, and its parameters per rank."""

    layer: _LayerCost
    """A MoE layer but its router and routed experts (``moe_time.non_routed_shape``), priced
    by the layer terms as a dense layer."""
    experts_s: float
    """Its router's and routed experts' device seconds: forward, backward, recomputation."""
    alltoall_s: float
    """Its dispatch and combine all-to-alls, exposed (:func:`alltoall_seconds`)."""
    rank_layers: tuple[int, ...]
    """MoE layers per pipeline rank (``moe_time.rank_moe_layers``)."""
    params_rank: float
    """The fullest pipeline rank's parameters but its routed experts (synchronised over dp)."""
    expert_params: float
    """Its routed experts' parameters (over the expert data-parallel group)."""


def _moe_cost(step: _Step) -> _MoECost:
    """The MoE layer's terms of ``step``'s layout (``moe_time``): the layer without its
    routed experts by ``_layer_cost``; the router and the rank's experts as GEMMs at the
    tokens each receives, backward twice the forward, recomputed as the layer is."""
    config, shape = step.config, step.shape
    ml = moe_layout(step)
    layer = _layer_cost(dataclasses.replace(step, shape=moe_time.non_routed_shape(shape)))
    forward = ml.local_experts * sum(_gemm_s(step, g) for g in moe_time.expert_gemms(shape, ml))
    forward += _gemm_s(step, moe_time.router_gemm(shape, ml))
    experts_s = 3 * forward + _recompute_time(step, forward, 0.0)
    rank_layers = moe_time.rank_moe_layers(shape, config.pp_degree, step.layout.chunks_per_rank)
    params_rank, expert_params = _moe_params_per_rank(step, rank_layers)
    return _MoECost(
        layer, experts_s, alltoall_seconds(step, ml), rank_layers, params_rank, expert_params
    )


def moe_layout(step: _Step) -> moe_time.MoELayout:
    """``moe_time.moe_layout`` of ``step``'s layout: its micro-batch's tokens, tp and ep."""
    config = step.config
    return moe_time.moe_layout(
        step.shape,
        microbatch_tokens=step.layout.microbatch_tokens,
        tp=config.tp_degree,
        ep=config.ep_degree,
    )


def _gemm_s(step: _Step, g: roofline.Gemm) -> float:
    """Seconds of one GEMM as the engine's dense GEMMs are priced: by ``roofline.gemm_time``
    (per-dimension efficiency), or at ``matmul_efficiency`` of its rows and columns."""
    cal = step.cal
    if step.engine.roofline:
        return roofline.gemm_time(
            g,
            peak=step.peak_flops,
            mem_bw=step.mem_bw,
            elem_bytes=step.layout.elem_bytes,
            e_max=cal.compute_efficiency,
            half_dim=cal.gemm_half_dim,
        )
    return 2 * g.m * g.n * g.k / (step.peak_flops * matmul_efficiency(cal, g.m, g.n))


def alltoall_seconds(step: _Step, ml: moe_time.MoELayout) -> float:
    """Exposed seconds of one MoE layer's all-to-alls per micro-batch: ``moe_time.alltoalls``
    of them (full recomputation's share again), each ``moe_time.alltoall_time`` of
    ``dispatch_bytes`` at the busiest rank's load (the allowance), less the engine's overlap
    (``ep_comm_overlap``), and their launches. 0 without expert parallelism."""
    config, cal, ep = step.config, step.cal, step.config.ep_degree
    if ep <= 1:
        return 0.0
    full = config.activation_checkpointing == "full"
    count = moe_time.alltoalls(full_recompute_share(config, step.shape.num_layers) if full else 0)
    nbytes = moe_time.dispatch_bytes(step.shape, ml, step.layout.elem_bytes)
    one = moe_time.alltoall_time(step.cluster, cal.comm_efficiency, ep, nbytes)
    exposed = 1 - step.engine.ep_comm_overlap * cal.overlap_efficiency
    launch = cal.collective_overhead_s * step.host_share * uncoscheduled(step.cluster, ep)
    return count * (one * ml.allowance * exposed + launch)


def _moe_params_per_rank(step: _Step, rank_moe: tuple[int, ...]) -> tuple[float, float]:
    """(parameters but routed experts, routed experts' parameters) of the pipeline rank that
    holds the most: its dense layers' blocks and MoE layers' non-routed tensors ÷ tp with the
    roots (``root_params``), and its MoE layers' routed experts ÷ ep (whole on each TP rank,
    ``shapes.TP_EXPERT``)."""
    shape, config = step.shape, step.config
    tp, pp, ep = config.tp_degree, config.pp_degree, config.ep_degree
    dense, non_routed = layer_params(shape), moe_time.non_routed_params(shape)
    routed = moe_time.routed_params(shape)
    best = (0.0, 0.0)
    for r, c in enumerate(step.layout.chunk_layers):
        k = rank_moe[r]
        roots = root_params(
            shape, step.layout.vocab, step.vocab_shards, first=r == 0, last=r == pp - 1
        )
        held = ((sum(c) - k) * dense / tp + k * non_routed / tp + roots, k * routed / ep)
        if sum(held) > sum(best):
            best = held
    return best


def _moe_rank_times(
    step: _Step,
    layer: _LayerCost,
    moe: _MoECost,
    kind: tuple[tuple[int, ...], bool, bool],
    moe_layers: int,
    pipe: tuple[int, float, float],
) -> tuple[float, ...]:
    """``_rank_times`` of a pipeline rank holding ``moe_layers`` MoE layers among its layers
    (its per-layer costs their mean), then its routed experts' and all-to-alls' seconds.
    ``pipe``: its boundaries, one transfer's seconds and its FSDP2 units' hooks."""
    layers = sum(kind[0])
    k, d = moe_layers, layers - moe_layers

    def mean(dense: float, sparse: float) -> float:
        return (d * dense + k * sparse) / layers

    m = moe.layer
    mixed = _LayerCost(
        mean(layer.device_s, m.device_s),
        layer.head_s,
        mean(layer.tp_s, m.tp_s),
        layer.tp_embed_s,
        mean(layer.host_s, m.host_s),
        mean(layer.excess_s, m.excess_s),
    )
    experts_s, alltoall_s = k * moe.experts_s, k * moe.alltoall_s
    busy = mixed.device_s + mixed.tp_s + (experts_s + alltoall_s) / layers
    boundaries, transfer_s, unit_s = pipe
    times = _rank_times(step, mixed, kind, boundaries, transfer_s, busy, unit_s)
    return (*times, experts_s, alltoall_s)


def _moe_breakdown(
    step: _Step, breakdown: dict[str, float], moe: _MoECost, moe_s: list[float], window_s: float
) -> dict[str, float]:
    """``breakdown`` with the MoE terms (``MOE_TERMS``, per step), the experts' gradient sync
    in ``dp_comm`` and their optimizer step in ``optimizer``, in ``ALL_TERMS`` order."""
    microbatches = step.layout.num_microbatches
    out = dict(breakdown)
    out["experts"], out["ep_alltoall"] = (microbatches * t for t in moe_s)
    out["dp_comm"] += _expert_sync_time(step, moe.expert_params, window_s)
    out["optimizer"] += _expert_optimizer_time(step, moe.expert_params)
    return {term: out[term] for term in ALL_TERMS}


def _expert_group(step: _Step) -> _Group:
    """The expert data-parallel group (``moe_time.expert_data_parallel``): ranks strided by
    the ep group, the fastest mesh dimension."""
    config = step.config
    edp = moe_time.expert_data_parallel(config.world_size, config.pp_degree, config.ep_degree)
    return _inner_group(edp, config.ep_degree, step.cluster.devices_per_node)


def _expert_sync_time(step: _Step, expert_params: float, compute_s: float) -> float:
    """Exposed seconds of the routed experts' gradient sync per step, over the expert
    data-parallel group as the ZeRO stage syncs the rest (``_ddp_times``, a distributed
    optimizer's reduce-scatter and gather, FSDP's reduce-scatter and gathers per micro-batch)
    and hidden as they are (``_exposed_sync``, the same window)."""
    group = _expert_group(step)
    if group.size <= 1 or expert_params <= 0:
        return 0.0
    return _group_sync_time(step, group, expert_params, compute_s, _expert_fsdp_times)


def _expert_fsdp_times(
    step: _Step, group: _Group, grad_bytes: float, param_bytes: float
) -> tuple[float, float]:
    """(gradient sync, parameter gathers) seconds of the experts under ZeRO-2/3: the
    reduce-scatter over the expert data-parallel group, the all-gathers once per micro-batch
    under ZeRO-2, twice under ZeRO-3 (experts sharded over efsdp, torchtitan's rule)."""
    cluster, cal, zero = step.cluster, step.cal, step.config.zero_stage
    sync_s = collective_time(cluster, cal, group, grad_bytes, kind="reduce_scatter")
    gathers = step.layout.num_microbatches * (2 if zero == 3 else 1)
    return sync_s, gathers * collective_time(cluster, cal, group, param_bytes, kind="all_gather")


def _expert_optimizer_time(step: _Step, expert_params: float) -> float:
    """The routed experts' optimizer step: ``_optimizer_time``'s bytes over the experts the
    rank updates, sharded over the expert data-parallel group under ZeRO ≥ 1."""
    shards = _expert_group(step).size if step.config.zero_stage >= 1 else 1
    return step.cal.optimizer_bytes_per_param * expert_params / shards / step.mem_bw
