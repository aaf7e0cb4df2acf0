"""Peak memory per GPU of a layout as another training engine runs it (Megatron-LM,
Megatron-DeepSpeed, torchtitan), from arithmetic alone.

``memory.estimate_memory`` predicts autotune's own runtime, calibrated on its measured CPU
trials. The engines the field trains with store different things: sequence parallelism, a
vocabulary-parallel loss, fused norms, flash attention, their own activation-checkpointing
modes, their own optimizer layouts. :class:`memory.MemoryTraits` names those choices;
:func:`estimate_engine_memory` turns a layout and a traits object into the bytes the caching
allocator reserves on the worst pipeline rank. The per-category terms:

- **Activations** per transformer block and micro-batch (:func:`block_activation_bytes`):
  Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
  §4, Table 2) count sbh(34 + 5as/h) bytes without parallelism, sbh(10 + 24/t + 5as/(ht)) with
  tensor parallelism t, sbh(34/t + 5as/(ht)) with sequence parallelism too, the 5as/h term gone
  under selective recomputation and 2sbh (2sbh/t with SP) under full recomputation. The same
  count is kept tensor by tensor here so that it also covers SwiGLU, grouped KV heads, no
  dropout, flash attention (no s² term; its fp32 log-sum-exp instead) and torchtitan's
  selective ``op`` mode (the outputs of wq, wv, w1, w2 and of SDPA only: torchtitan
  ``_apply_ac_to_transformer_block``'s policy saves every second matmul) and ``layer`` mode
  (every k-th block checkpointed). Context parallelism divides the sequence.
- **Pipeline**: 1F1B (Megatron, DeepSpeed's ``TrainSchedule``) keeps min(M, p − r) micro-
  batches on rank r (``memory.microbatches_in_flight``), interleaved more; each held
  micro-batch's stage input is kept too.
- **The loss** (last stage): the logits b·s·V (V/t vocabulary-parallel, /cp) in the compute
  dtype plus the fp32 logits-sized tensors alive at the loss's forward or backward peak
  (torchtitan's ``cross_entropy(pred.float())``: the upcast and log-softmax's output in
  forward; the kept output, nll's gradient and log-softmax's input gradient in backward; under
  ``loss_parallel`` one more, as torch/distributed/tensor/parallel/loss.py builds log-softmax
  from ``shifted``, ``exp(shifted)`` and the result and its gradient as
  ``(grad_input + exp(x)) * grad_output``; Megatron's ``vocab_parallel_cross_entropy``: one
  fp32 copy, softmax and gradient in place).
- **Model states** by the engine's optimizer (:func:`engine_states`): FSDP2 (torchtitan: fp32
  shards, ``memory._states``); Megatron's distributed optimizer (bf16 parameters, fp32 main
  gradients, fp32 master and moments sharded); DeepSpeed ZeRO-1's fp16 optimizer (fp16
  parameters and gradients, fp32 master, moments and gradient partition sharded) and its
  BF16_Optimizer (adds fp32 gradient accumulation for every parameter). A mixture of experts'
  routed experts (E / ep rows per rank) are sharded over the expert data-parallel group
  instead (Megatron's EDP = world / (pp · ep), torchtitan's efsdp: ``moe_memory``), and its MoE
  layers keep ``moe_memory.routed_mlp_bytes`` for their MLP.
- **FSDP's gathered units**: the unit in use and the one prefetched, in the compute dtype,
  with their fp32 reduce-scatter gradients, and the root (embeddings, head) while it is used.
- **The allocator**: reserved ≈ ``fragmentation`` × allocated + ``context_bytes`` (the CUDA
  context and NCCL's buffers when the figure is nvidia-smi's), measured factors per engine;
  where an engine's are unmeasured (None) the total is of the allocated bytes, and the memory
  screen (``search.screen.allowance``) adds the device's instead, never both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from autotune.config import TrialConfig
from autotune.errors import ConfigError
from autotune.model import layout_quantities, moe_memory
from autotune.model.description import block_params, local_roots, part_block_bytes
from autotune.model.engines import (  # noqa: F401  (the presets: re-exported)
    AUTOTUNE_MEMORY,
    BIGSCIENCE,
    BIGSCIENCE_CONTEXT_BYTES,
    BIGSCIENCE_FRAGMENTATION,
    DEEPSPEED,
    MEGATRON,
    TORCHTITAN,
    TORCHTITAN_MULTINODE,
    MemoryTraits,
)
from autotune.model.layout_quantities import (
    BoundedMemo,
    LayoutQuantities,
    fields_key,
    state_bytes,
)
from autotune.model.memory import (
    FP32_BYTES,
    PHASE_AFTER_BACKWARD,
    PHASE_FORWARD_BACKWARD,
    MemoryEstimate,
    _Part,
    _parts,
    _resolve_shape,
    _states,
    block_saved_bytes,
    estimate_memory,
    held_microbatches,
    worst_rank_candidates,
)
from autotune.shapes import ModelShape, even_split


@dataclass(frozen=True, slots=True)
class _Dims:
    """One micro-batch's dimensions on one rank: b sequences of s tokens, s/cp of each on the
    rank, and the TP degree."""

    seq_len: int
    """The length each query attends over: s."""
    micro_batch: int
    cp: int
    tp: int
    elem_bytes: int
    """Bytes per activation element (the compute dtype)."""
    sp: bool = False
    """Sequence parallelism (the config's ``sequence_parallel``, with tp > 1)."""

    @property
    def tokens(self) -> int:
        """Tokens of one micro-batch on the rank (``LayoutQuantities.microbatch_tokens``)."""
        return self.seq_len * self.micro_batch // self.cp


def block_activation_bytes(
    shape: ModelShape,
    traits: MemoryTraits,
    *,
    seq_len: int,
    micro_batch: int,
    tp: int,
    e: int,
    mode: str,
    sp: bool = False,
    cp: int = 1,
    ep: int = 0,
) -> int:
    """Bytes one transformer block keeps for backward, per micro-batch on one rank, under
    checkpointing ``mode``: 'none', 'selective' (Megatron: the attention core recomputed),
    'op' (torchtitan: matmul and SDPA outputs kept, every second matmul recomputed) or 'full'
    (the block input only): ``memory.block_saved_bytes``, the one count, for the engine's
    ``traits`` (its attention kernel: flash or eager). ``sp``: sequence parallelism, which
    shards what lies outside the TP region. ``ep`` > 0: a mixture of experts' MoE layer (its
    router and experts over the rank's tokens, ``moe_memory.routed_mlp_bytes``). See the module
    docstring."""
    return block_saved_bytes(
        shape,
        traits,
        s=seq_len,
        b=micro_batch,
        cp=cp,
        tp=tp,
        e=e,
        sp=tp if sp else 1,
        checkpointing=mode,
        attention="sdpa" if traits.flash_attention else "eager",
        ep=ep,
    )


def _block_bytes(
    shape: ModelShape, traits: MemoryTraits, d: _Dims, ac: str, ep: int = 0
) -> tuple[int, int]:
    """(kept per block on average, the largest temporary of one block's backward) for the
    engine's checkpointing of the config's mode ``ac``; ``ep`` > 0: of a MoE layer."""
    kw = dict(
        seq_len=d.seq_len, micro_batch=d.micro_batch, cp=d.cp, tp=d.tp, e=d.elem_bytes, sp=d.sp
    )
    kw["ep"] = ep
    mode = traits.selective_mode if ac == "selective" else ac
    none = block_activation_bytes(shape, traits, mode="none", **kw)
    if mode == "layer":  # every k-th block checkpointed whole, the others keep everything
        k = traits.ac_layer_every
        full = block_activation_bytes(shape, traits, mode="full", **kw)
        kept = (full + (k - 1) * none) // k
        rebuilt = none
    else:
        kept = block_activation_bytes(shape, traits, mode=mode, **kw)
        rebuilt = none - kept if mode != "full" else none
    # Backward's gradient buffers of the block's widest tensors (memory.block_backward_bytes).
    grads = (
        2 * d.elem_bytes * d.tokens * shape.ffn_hidden_size // d.tp
        + d.elem_bytes * d.tokens * shape.hidden_size
    )
    if ep:
        tokens = d.tokens // (d.tp if d.sp else 1)
        grads = moe_memory.moe_backward_bytes(
            shape.moe, shape.hidden_size, tokens, d.elem_bytes, ep
        )
    return kept, rebuilt + grads


def _local_vocab(vocab: int, tp: int, traits: MemoryTraits) -> int:
    """The vocabulary rows one TP rank holds (Megatron's VocabParallelEmbedding, torchtitan's
    loss_parallel), padded to a multiple of tp."""
    return -(-vocab // tp) if traits.vocab_parallel_loss else vocab


def _loss_bytes(traits: MemoryTraits, d: _Dims, vocab: int) -> tuple[int, int]:
    """(kept for backward, the loss's peak above what it keeps) of the last stage, per micro-
    batch: the logits in the compute dtype plus fp32 logits-sized tensors, the larger of the
    forward's and the backward's count."""
    logits = d.tokens * _local_vocab(vocab, d.tp, traits)
    extra = traits.loss_parallel_extra_fp32 if traits.vocab_parallel_loss and d.tp > 1 else 0
    fp32 = max(traits.loss_forward_fp32, traits.loss_backward_fp32) + extra
    kept = FP32_BYTES * logits * traits.loss_kept_fp32
    return kept, d.elem_bytes * logits + FP32_BYTES * logits * fp32 - kept


def engine_states(
    config: TrialConfig,
    shape: ModelShape,
    traits: MemoryTraits,
    vocab: int,
    parts: tuple,
    precision: str,
) -> tuple[int, int, int, int]:
    """(parameters, gradients, optimizer state, step temporaries) in bytes on one rank, its
    states sharded over the engine's group (:func:`engine_state_shards`); a mixture of experts'
    routed experts (E / ep rows each) over the expert data-parallel group instead
    (``moe_memory.expert_data_ranks``: Megatron's EDP; torchtitan's efsdp, as ``_states``
    shards them)."""
    tp, zero = config.tp_degree, config.zero_stage
    shards = engine_state_shards(config, traits)
    bytes_per = state_bytes(precision, fsdp=shards > 1 and zero >= 2)
    vocab = _local_vocab(vocab, tp, traits)
    if traits.optimizer == "fsdp2":
        states = _states(
            shape, vocab, parts, tp, shards, zero, bytes_per, config.bucket_mb, ep=config.ep_degree
        )  # TP-local vocab
        return states.parameters, states.gradients, states.optimizer_state, 0
    roots = [local_roots(shape, vocab, p.first, p.last) for p in parts]
    blocks, experts = moe_memory.rank_numel(shape, parts, tp, config.ep_degree)
    numel = blocks + sum(r.numel for r in roots)
    edp = moe_memory.expert_data_ranks(config) if zero >= 1 else 1
    dense = _optimizer_states(traits, bytes_per.compute, numel, shards if zero >= 1 else 1, zero)
    routed = _optimizer_states(traits, bytes_per.compute, experts, edp, zero)
    return tuple(a + b for a, b in zip(dense, routed))  # type: ignore[return-value]


def _optimizer_states(
    traits: MemoryTraits, compute: int, numel: int, n: int, zero: int
) -> tuple[int, int, int, int]:
    """(parameters, gradients, optimizer state, step temporaries) of ``numel`` TP-local
    elements under Megatron's or DeepSpeed's optimizer, sharded over ``n`` ranks (``compute``:
    bytes per element of the 16-bit copies)."""
    if traits.optimizer == "megatron":
        # Megatron-LM: 16-bit parameters, fp32 main_grad buffers, fp32 master copy and Adam
        # moments sharded over DP by the distributed optimizer (docs: 18 → 6 + 12/d bytes).
        return compute * numel, FP32_BYTES * numel, -(-12 * numel // n), 0
    if traits.optimizer in ("deepspeed-fp16", "deepspeed-bf16"):
        # DeepSpeed ZeRO-1 (stage_1_and_2.py): 16-bit parameters and gradients; the fp32 master
        # partition and both moments per rank; at the step the partition's gradients in fp32
        # (``single_grad_partition``). BF16_Optimizer accumulates every gradient in fp32 too.
        # ZeRO-2 shards the 16-bit gradients too, ZeRO-3 the parameters (their gathers are
        # comm buffers, as FSDP's).
        grad_numel = -(-numel // n) if zero >= 2 else numel
        grads = compute * grad_numel
        if traits.optimizer == "deepspeed-bf16":
            grads += FP32_BYTES * grad_numel
        params = compute * (-(-numel // n) if zero == 3 else numel)
        if zero == 0 and traits.optimizer == "deepspeed-fp16":
            # FP16_Optimizer (no ZeRO): the flat fp32 gradient and its per-tensor fp32 copies
            # at the step (fused_optimizer.py ``step``)
            return params, grads, 12 * numel, 2 * FP32_BYTES * numel
        return params, grads, -(-12 * numel // n), FP32_BYTES * -(-numel // n)
    raise ConfigError(
        f"unknown optimizer layout {traits.optimizer!r}; choose fsdp2, megatron, "
        "deepspeed-fp16 or deepspeed-bf16"
    )


def engine_state_shards(config: TrialConfig, traits: MemoryTraits) -> int:
    """The ranks the engine's ZeRO shards model states over (``MemoryTraits.state_shards``):
    dp_shard × cp (torchtitan's FSDP mesh, Megatron's distributed optimizer within one of
    ``--num-distributed-optimizer-instances``), or dp × cp (DeepSpeed's ZeRO, which the HSDP
    groups do not reach)."""
    if traits.state_shards == "dp_cp":
        return config.dp_degree * config.cp_degree
    return config.dp_shard * config.cp_degree


def engine_parts(
    num_layers: int,
    pp: int,
    interleaved: bool,
    pp_rank: int,
    traits: MemoryTraits,
    virtual_stages: int = 2,
) -> tuple[_Part, ...]:
    """The rank's (virtual) stages: the L layers split evenly, earlier stages taking the
    remainder, or with ``embedding_counts_as_layer`` the L + 2 units so, the first and last
    stage one transformer layer short for their embeddings (interleaved: ``memory._parts``)."""
    if pp == 1 or interleaved:
        return _parts(num_layers, pp, interleaved, pp_rank, virtual_stages)
    if traits.embedding_counts_as_layer:
        counts = even_split(num_layers + 2, pp)
        counts[0] -= 1
        counts[-1] -= 1
    else:  # Megatron's and DeepSpeed's uniform split: earlier stages take the remainder
        counts = even_split(num_layers, pp)
    first_layer = sum(counts[:pp_rank])
    return (_Part(pp_rank, counts[pp_rank], pp_rank == 0, pp_rank == pp - 1, first_layer),)


def estimate_engine_memory(
    config: TrialConfig,
    shape: ModelShape | None,
    traits: MemoryTraits | None,
    *,
    device_type: str = "cuda",
    checked: bool = False,
    screen: Callable[[int], bool] | None = None,
) -> MemoryEstimate:
    """The worst pipeline rank's reserved bytes when ``traits``' engine runs ``config``
    (``traits`` None: autotune's own runtime, ``memory.estimate_memory``). ``checked``: the
    caller validated ``config`` against ``shape`` already.

    ``screen``: a screen's verdict on a peak (``rank``'s memory screen). Pipeline rank 0 is
    estimated first, and returned if the screen refuses it: the worst rank holds at least as
    much, so a layout it drops needs no other rank, and is not memoised."""
    if traits is None or traits.own_runtime:
        return estimate_memory(config, shape, device_type=device_type, checked=checked)
    shape = (shape or config.workload.shape) if checked else _resolve_shape(config, shape)
    precision = config.resolved_precision(device_type)
    key = (shape, traits, precision, fields_key(config, ENGINE_MEMORY_IGNORE))
    first = None
    if screen is not None and key not in _ENGINE_ESTIMATES:
        first = _engine_stage(config, shape, traits, 0, precision)
        if not screen(first.total):
            return first
    return _ENGINE_ESTIMATES.get(
        key, partial(_worst_engine_stage, config, shape, traits, precision, first)
    )


ENGINE_MEMORY_IGNORE = layout_quantities.ENGINE_MEMORY_IGNORE  # declared in knobs.py
"""The fields another engine's memory does not read: its buckets and overlap change no stored
byte here (``engine_states`` shards over the engine's group alone; FSDP2's units are its
blocks). ``rank`` lists
six layouts per (micro-batch, checkpointing, SP) branch that differ only in them, and they share
one estimate (``tests/model/test_scoring_memos.py``)."""
_ENGINE_ESTIMATES: BoundedMemo[MemoryEstimate] = BoundedMemo()


def _worst_engine_stage(
    config: TrialConfig,
    shape: ModelShape,
    traits: MemoryTraits,
    precision: str,
    first: MemoryEstimate | None = None,
) -> MemoryEstimate:
    """The worst of ``worst_rank_candidates``' estimates; ``first``: rank 0's, known already."""
    worst = None
    for r in worst_rank_candidates(config.pp_degree):
        est = (
            first
            if r == 0 and first is not None
            else _engine_stage(config, shape, traits, r, precision)
        )
        if worst is None or est.total > worst.total:
            worst = est
    return worst


def engine_states_lower_bound(
    config: TrialConfig, shape: ModelShape, traits: MemoryTraits, *, device_type: str
) -> int:
    """At most ``estimate_engine_memory(config, shape, traits).total``, and at most that of
    every layout that differs from ``config`` only in micro-batch, checkpointing or sequence
    parallelism: pipeline rank 0's parameters, gradients and optimizer state, with the
    allocator's share of them and the context (``_engine_stage``'s overhead grows with what is
    allocated). ``rank`` drops a (tp, pp, cp, ZeRO, HSDP, schedule) group on it."""
    precision = config.resolved_precision(device_type)
    layout = LayoutQuantities.of(config, shape, precision)
    parts = engine_parts(
        shape.num_layers, config.pp_degree, layout.interleaved, 0, traits, config.virtual_stages
    )
    params, grads, optimizer, _ = engine_states(
        config, shape, traits, layout.vocab, parts, precision
    )
    allocated = params + grads + optimizer
    return allocated + traits.overhead_bytes(allocated)


def _engine_saved(
    config: TrialConfig,
    shape: ModelShape,
    traits: MemoryTraits,
    layout: LayoutQuantities,
    parts: tuple[_Part, ...],
    pp_rank: int,
) -> tuple[int, int]:
    """(saved for backward, the largest temporary above it) of the micro-batches the rank's
    schedule holds: the blocks, each part's stage input, the loss on the last stage."""
    # The config's knobs: context parallelism divides each sequence, sequence parallelism what
    # lies outside the TP region.
    d = _Dims(
        seq_len=config.workload.seq_len,
        micro_batch=config.micro_batch_size,
        cp=config.cp_degree,
        tp=config.tp_degree,
        elem_bytes=layout.elem_bytes,
        sp=layout.sequence_shards > 1,
    )
    kinds = {  # per layer kind (MoE layer or not): (kept, whole, its backward's peak)
        kind: _kept_and_whole(shape, traits, d, config, config.ep_degree if kind else 0)
        for kind in moe_memory.layer_kinds(shape.moe, parts)
    }
    block_peak = max(peak for _, _, peak in kinds.values())
    loss_kept, loss_peak = _loss_bytes(traits, d, layout.vocab)
    stage_io = layout.elem_bytes * layout.stream_elems  # a micro-batch's stage input or output
    per_mb = []
    for part in parts:
        held = _engine_part_saved(shape, part, config.ac_layers, kinds)
        held += stage_io if config.pp_degree > 1 else 0
        if part.last:
            held += loss_kept + stage_io  # and the final norm's input
        per_mb.append(held)
    held_counts = held_microbatches(config, layout, pp_rank, tuple(per_mb))
    saved = sum(n * a for n, a in zip(held_counts, per_mb))
    return saved, max(block_peak, loss_peak if any(p.last for p in parts) else 0)


def _kept_and_whole(
    shape: ModelShape, traits: MemoryTraits, d: _Dims, config: TrialConfig, ep: int
) -> tuple[int, int, int]:
    """(kept per block in the config's mode, kept with no checkpointing, the larger backward
    peak of the two) of one kind of block: ``whole`` is the mode's own without ``ac_layers``."""
    kept, peak = _block_bytes(shape, traits, d, config.activation_checkpointing, ep)
    if config.ac_layers is None:
        return kept, kept, peak
    whole, whole_peak = _block_bytes(shape, traits, d, "none", ep)  # the blocks not recomputed
    return kept, whole, max(peak, whole_peak)


def _engine_part_saved(
    shape: ModelShape, part: _Part, ac_layers: int | None, kinds: dict[bool, tuple]
) -> int:
    """A part's blocks' saved bytes per micro-batch (``part_block_bytes``; a mixture of
    experts' per layer kind, ``moe_memory.part_saved_bytes``)."""
    if shape.moe is None:
        kept, whole, _ = kinds[False]
        return part_block_bytes(part.num_layers, ac_layers, whole, kept)
    kept = {kind: (k, w) for kind, (k, w, _) in kinds.items()}
    return moe_memory.part_saved_bytes(
        shape.moe, part.first_layer, part.num_layers, ac_layers, kept
    )


def _engine_stage(
    config: TrialConfig, shape: ModelShape, traits: MemoryTraits, pp_rank: int, precision: str
) -> MemoryEstimate:
    pp = config.pp_degree
    layout = LayoutQuantities.of(config, shape, precision)
    vocab, elem_bytes = layout.vocab, layout.elem_bytes
    parts = engine_parts(
        shape.num_layers, pp, layout.interleaved, pp_rank, traits, config.virtual_stages
    )
    saved, transient = _engine_saved(config, shape, traits, layout, parts, pp_rank)
    params, grads, optimizer, step_temps = engine_states(
        config, shape, traits, vocab, parts, precision
    )
    comm = _fsdp_gathered(config, shape, traits, parts, vocab, elem_bytes)
    pipe = 2 * elem_bytes * layout.stream_elems if pp > 1 else 0  # send and receive buffers
    fb, post = saved + transient + comm + pipe, step_temps
    allocated = params + grads + optimizer + max(fb, post)
    overhead = traits.overhead_bytes(allocated)
    if fb >= post:
        return MemoryEstimate(
            params,
            grads,
            optimizer,
            saved + transient,
            comm,
            pipe + overhead,
            pp_rank,
            PHASE_FORWARD_BACKWARD,
        )
    return MemoryEstimate(
        params, grads, optimizer, 0, 0, post + overhead, pp_rank, PHASE_AFTER_BACKWARD
    )


def _fsdp_gathered(
    config: TrialConfig,
    shape: ModelShape,
    traits: MemoryTraits,
    parts: tuple[_Part, ...],
    vocab: int,
    elem_bytes: int,
) -> int:
    """FSDP2's unsharded bytes during forward/backward (torchtitan: one unit per block, the
    root holding embeddings, final norm and head): the unit in use and the one prefetched in
    the compute dtype, the gradients of one unit in the compute dtype and cast to fp32 for the
    reduce-scatter (MixedPrecisionPolicy reduce_dtype float32), and the root, which FSDP2 does
    not reshard after forward."""
    shards = engine_state_shards(config, traits)
    if shards == 1 or config.zero_stage < (2 if traits.optimizer == "fsdp2" else 3):
        return 0  # DeepSpeed's and Megatron's ZeRO-2 keep the parameters whole
    block = block_params(shape, config.tp_degree)
    local_vocab = _local_vocab(vocab, config.tp_degree, traits)
    root = sum(local_roots(shape, local_vocab, p.first, p.last).numel for p in parts)
    # every unit kept from forward to backward (under a pipeline: MemoryTraits.reshard_under_pp)
    if config.zero_stage == 2 or (config.pp_degree > 1 and not traits.reshard_under_pp):
        blocks = sum(p.num_layers for p in parts) * block * elem_bytes
    else:
        blocks = 2 * block * elem_bytes
    return blocks + block * (elem_bytes + FP32_BYTES) + root * elem_bytes


MEMORY_TRAITS: dict[str, MemoryTraits | None] = {
    "autotune": None,
    "megatron": MEGATRON,
    "torchtitan": TORCHTITAN,
    "deepspeed": DEEPSPEED,
}
"""Each engine's memory traits by the engine's name (``--engine``); None: autotune's own
runtime (``memory.estimate_memory``). torchtitan across nodes is ``TORCHTITAN_MULTINODE``."""


def engine_layout(config: TrialConfig, traits: MemoryTraits | None) -> TrialConfig:
    """``config`` as ``traits``' engine runs it: sequence parallelism on wherever TP is, for the
    engines whose recipes turn it on (``MemoryTraits.sequence_parallel``); otherwise as given."""
    if (
        traits is not None
        and traits.sequence_parallel
        and config.tp_degree > 1
        and not config.sequence_parallel
    ):
        return dataclasses.replace(config, sequence_parallel=True)
    return config
