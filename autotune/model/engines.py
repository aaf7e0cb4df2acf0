"""What each training engine runs, for the step-time model: its tensor-parallel plan, sequence
parallelism, what it overlaps, its optimizer's collectives, its kernels and its AC modes.

One engine name (``--engine autotune|megatron|torchtitan|deepspeed``) selects one
:class:`EngineProfile` (``engine_traits``): these time traits, and what the engine stores
(:class:`MemoryTraits`, its ``memory`` part; autotune's own runtime is ``AUTOTUNE_MEMORY``).
Each trait cites the framework source it describes. ``perf_model`` reads the time traits,
``engine_memory`` the memory ones; nothing here computes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from autotune.errors import ConfigError


@dataclass(frozen=True, slots=True)
class MemoryTraits:
    """What a training engine stores, as far as memory goes: the memory part of its
    :class:`EngineProfile`. ``engine_memory.estimate_engine_memory`` reads it;
    ``own_runtime`` (``AUTOTUNE_MEMORY``) is autotune's trial runtime, whose arithmetic is
    ``memory.estimate_memory``'s."""

    name: str
    own_runtime: bool = False
    """autotune's own trial runtime (``memory.estimate_memory``, calibrated on its trials)."""
    sequence_parallel: bool = False
    """The engine runs sequence parallelism wherever TP is on (Megatron's recipes'
    ``--sequence-parallel``, torchtitan's TP plan): ``engine_layout`` turns the config's
    ``sequence_parallel`` on for tp > 1, and ``rank`` lists its tp > 1 layouts with SP only.
    The arithmetic reads the config's knob (norms, dropout and the block input sharded over
    TP), as it reads ``cp_degree``."""
    vocab_parallel_loss: bool = False
    """Embedding, head, logits and loss sharded over TP (vocabulary-parallel)."""
    loss_kept_fp32: int = 1
    """fp32 logits-sized tensors the loss keeps for backward (log-softmax output, softmax)."""
    loss_forward_fp32: int = 1
    """fp32 logits-sized tensors beside the logits at the loss's forward peak (the upcast,
    log-softmax's output)."""
    loss_backward_fp32: int = 1
    """fp32 logits-sized tensors at the loss's backward peak (the kept one, the incoming and
    the input gradient), beside the gradient cast back to the compute dtype."""
    loss_parallel_extra_fp32: int = 0
    """More of each when the loss is vocabulary-parallel over tp > 1 (torch's loss_parallel
    composes log-softmax and its gradient from separate tensors)."""
    fused_norm: bool = True
    """Norms keep their input and statistics only, no fp32 copies."""
    flash_attention: bool = True
    """No s² scores kept (FlashAttention, SDPA's flash/cuDNN kernels)."""
    dropout: bool = False
    """1-byte dropout masks kept (and the attention dropout's output without flash)."""
    repeat_kv: bool = False
    """Grouped KV heads repeated to all heads before attention (and kept so)."""
    built_block: bool = False
    """The block counted as autograd saves the one autotune builds: its norms as
    ``memory._norm_bytes`` counts them (LayerNorm's input, mean and rstd; RMSNorm's fp32 input,
    normalised input and rstd; the output, whole under SP, as DTensor's ``ColwiseParallel``
    saves the gathered input), a Hugging Face block's own parts (``block_parts``), and the
    'op' policy on that block (GPT: four mms; eager attention kept out). False: Korthikanti et
    al. 2022's count, each norm's input and output (÷ t under SP, Megatron gathering again in
    backward: ``LinearWithGradAccumulationAndAsyncCommunication``, megatron/core/
    tensor_parallel/layers.py), the fp32 copies unless ``fused_norm``, and 'op' on torchtitan's
    Llama block (seven mms and SDPA, ``torchtitan/models/llama3/model.py``)."""
    rotary_cache: bool = False
    """A rotary cos/sin table kept per block (autotune's Llama block builds it per forward,
    ``trial/models/transformer.py``); engines keep one precomputed buffer (torchtitan's
    ``freqs_cis``, Megatron's ``RotaryEmbedding``), not counted."""
    cp_whole_kv: bool = False
    """Context parallelism keeps the all-gathered keys and values of the whole sequence for
    backward (autotune's all-gather attention, ``trial/parallel``); False: each rank keeps its
    own s/cp shard (ring attention: torch's ``context_parallel``, Megatron's p2p CP)."""
    eager_mask: bool = False
    """Eager attention keeps an s² bool causal mask (autotune's eager path); False: the engine's
    fused softmax builds it in the kernel (Megatron's ``FusedScaleMaskSoftmax``)."""
    selective_mode: str = "selective"
    """What the config's 'selective' checkpointing means: 'selective' (Megatron: attention core
    recomputed), 'op' (torchtitan: matmul outputs kept), 'layer' (every k-th block whole)."""
    ac_layer_every: int = 2
    """'layer' mode: one block in this many is checkpointed."""
    optimizer: str = "fsdp2"
    """Model-state layout: fsdp2, megatron (distributed optimizer), deepspeed-fp16, -bf16."""
    state_shards: str = "dp_shard_cp"
    """The group ZeRO shards model states over. ``dp_shard_cp``: dp_shard × cp, replicated
    across the dp_replicate groups — torchtitan 0.3.0's FSDP mesh ``fsdp`` = dp_shard · cp
    (``torchtitan/distributed/parallel_dims.py``, ``parallelize.py``'s
    ``get_mesh(["dp_replicate", "fsdp"])``), Megatron-core 0.16's distributed optimizer over
    ``intra_dp_cp_group``, the data- and context-parallel ranks of one of
    ``--num-distributed-optimizer-instances`` (``megatron/core/optimizer/__init__.py``; the
    export writes dp_replicate instances). ``dp_cp``: dp × cp — DeepSpeed 0.19's ZeRO
    partitions over ``seq_data_parallel_group`` (``deepspeed/runtime/engine.py``,
    ``_configure_zero_optimizer``), data and Ulysses sequence ranks, and has no HSDP (the
    export writes ZeRO over the whole dp)."""
    reshard_under_pp: bool = False
    """FSDP's ZeRO-3 reshards each unit after forward under a pipeline too (else it keeps every
    unit gathered from its forward through its backward, as ZeRO-2). False for torchtitan
    0.3.0 (``torchtitan/distributed/fsdp.py``, ``get_fsdp_reshard_after_forward_policy``:
    'default' is ``not pp_enabled``, "to avoid per-microbatch all-gathers") and for autotune's
    runtime (``memory._comm_buffers``: resharding after backward off under a pipeline)."""
    embedding_counts_as_layer: bool = False
    """Pipeline split counts each embedding as a layer (DeepSpeed's 'type:transformer|embedding',
    Llama 3's first and last stages one layer short): L + 2 units over the stages."""
    fragmentation: float | None = None
    """Reserved / allocated bytes of the engine's caching allocator, measured (1.0: none, as
    under expandable segments). None: not modelled; the estimate is of the allocated bytes, and
    the memory screen adds the device's factor (``search.screen.allowance``)."""
    context_bytes: int | None = None
    """Bytes outside the allocator in the engine's measured figure (CUDA context, NCCL's
    buffers). None: not in it; the memory screen adds the device's."""

    @property
    def peak_kind(self) -> str:
        """What the engine estimate's total counts, in words."""
        if self.fragmentation is None:
            return "allocated"
        return "reserved" if self.context_bytes is None else "reserved + context"

    def overhead_bytes(self, allocated: int) -> int:
        """The allocator's reserve on ``allocated`` bytes and the bytes outside it, as far as
        the engine's figure includes them."""
        reserve = 0 if self.fragmentation is None else int((self.fragmentation - 1) * allocated)
        return reserve + (self.context_bytes or 0)


# ---- memory presets: what each engine stores -----------------------------------------------
AUTOTUNE_MEMORY = MemoryTraits(
    name="autotune",
    own_runtime=True,
    fused_norm=False,
    repeat_kv=True,
    built_block=True,
    rotary_cache=True,
    cp_whole_kv=True,
    eager_mask=True,
    selective_mode="selective",
    optimizer="fsdp2",
)
"""autotune's trial runtime (``autotune/trial``): what the config's knobs choose (SP, flash or
eager attention, the checkpointing mode), the block ``trial/models/transformer.py`` builds
(RMSNorm in fp32, grouped KV heads repeated before attention, the whole vocabulary on every TP
rank), FSDP2 sharding over dp_shard × cp (``parallel/mesh.py``). Its bytes are
``memory.estimate_memory``'s, tensor by tensor as autograd saves them."""
BIGSCIENCE_FRAGMENTATION = 1.15
BIGSCIENCE_CONTEXT_BYTES = int(7.35 * 2**30)
"""The allocator's factor and the bytes outside it in nvidia-smi's figure (CUDA context, NCCL's
buffers, the cached blocks of the fp32 model Megatron builds before casting it), measured: the
least-squares line through the even-numbered rows of BigScience's sweep with a stated peak
(``bench/published_memory.py --fit``: 1.152 and 7.35 GiB); the odd-numbered rows are predicted."""
TORCHTITAN = MemoryTraits(
    name="torchtitan",
    sequence_parallel=True,
    vocab_parallel_loss=True,
    loss_kept_fp32=1,
    loss_forward_fp32=2,
    loss_backward_fp32=3,
    loss_parallel_extra_fp32=1,
    fused_norm=True,
    flash_attention=True,
    dropout=False,
    repeat_kv=True,
    selective_mode="op",
    optimizer="fsdp2",
    fragmentation=1.0,
)
"""torchtitan (pytorch/torchtitan, 2024–25): TP with SequenceParallel norms and loss_parallel
(``parallelize_llama``); ``cross_entropy(pred.flatten(0, 1).float(), ...)``, the logits freed
(``del pred``) before backward (see the module docstring for the fp32 copies); SDPA flash
kernels; ``repeat_kv`` before SDPA; selective AC ``op`` by default; FSDP2 with fp32 shards
and bf16 compute. Its reported memory is the allocator's max reserved (no context: the
memory screen adds the device's bytes outside the allocator). Its single-node launcher
``run_train.sh`` sets ``PYTORCH_ALLOC_CONF=expandable_segments:True``, under which freed
segments are remapped rather than split: no fragmentation factor. ``TORCHTITAN_MULTINODE``
is its multi-node launch."""
TORCHTITAN_MULTINODE = dataclasses.replace(
    TORCHTITAN, name="torchtitan-multinode", fragmentation=BIGSCIENCE_FRAGMENTATION
)
"""torchtitan launched across nodes by ``multinode_trainer.slurm``, which leaves the allocator's
default (no expandable segments): the caching allocator's fragmentation as measured on
BigScience's sweep, still without context (max reserved)."""
MEGATRON = MemoryTraits(
    name="megatron",
    sequence_parallel=True,
    vocab_parallel_loss=True,
    loss_kept_fp32=1,
    loss_forward_fp32=1,
    loss_backward_fp32=1,
    fused_norm=True,
    flash_attention=True,
    dropout=False,
    selective_mode="selective",
    optimizer="megatron",
)
"""Megatron-LM (megatron/core, 2024–25) as its large-model recipes run it: sequence parallelism
with TP (``--sequence-parallel``), ``vocab_parallel_cross_entropy`` (one fp32 copy, in place),
Transformer Engine's fused norms and flash attention, dropout 0 (the Llama recipes), selective
recomputation of the attention core, the distributed optimizer with fp32 main gradients. The
allocator factor is unmeasured for it: the estimate is of the allocated bytes, and the memory
screen adds the device's factor and context (``search.screen.allowance``)."""
BIGSCIENCE = MemoryTraits(
    name="megatron-deepspeed",
    sequence_parallel=False,
    vocab_parallel_loss=True,
    loss_kept_fp32=1,
    loss_forward_fp32=1,
    loss_backward_fp32=1,
    fused_norm=True,
    flash_attention=False,
    dropout=False,
    optimizer="deepspeed-fp16",
    state_shards="dp_cp",
    fragmentation=BIGSCIENCE_FRAGMENTATION,
    context_bytes=BIGSCIENCE_CONTEXT_BYTES,
)
"""Megatron-DeepSpeed as BigScience trained BLOOM in 2022 (bigscience-workshop/bigscience,
train/tr11-176B-ml): TP without sequence parallelism, ``vocab_parallel_cross_entropy`` on an fp32
copy of the logits (one in-place fp32 softmax kept), apex's fused LayerNorm, the fused
scaled-masked softmax (no flash), dropout 0, DeepSpeed ZeRO-1."""
DEEPSPEED = dataclasses.replace(BIGSCIENCE, name="deepspeed")
"""Megatron-DeepSpeed's traits for the ``deepspeed`` engine: BigScience's, with its measured
allocator factor and context. Its optimizer layout is ZeRO's (``deepspeed-fp16``) in bf16 too:
under ZeRO, DeepSpeed accumulates gradients in the model's dtype unless the config's
``data_types.grad_accum_dtype`` says fp32 (``deepspeed/runtime/engine.py``, ``get_data_types``
and ``_do_optimizer_sanity_check``), and only then wraps ZeRO-1 in BF16_Optimizer, the
``deepspeed-bf16`` layout BigScience's 2022 runs chose (``bench/published_memory.py`` reads it
from their notes)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class EngineProfile:
    """One engine: how its code base turns a layout into kernels and collectives (the time
    traits below, which ``perf_model`` reads) and what it stores (``memory``, which
    ``engine_memory`` reads; autotune's own runtime is a preset like the others).

    autotune's own engine (``AUTOTUNE_ENGINE``) keeps the output head and embeddings whole on
    every TP rank and shards q, k, v (and SwiGLU's two inputs) as separate column-parallel
    linears, each of whose input gradients is all-reduced; Megatron-LM shards the vocabulary
    over TP and fuses QKV and the MLP input.
    """

    name: str
    vocab_parallel: bool
    """Output head, loss and embedding sharded over TP (Megatron's VocabParallelEmbedding)."""
    fused_column_inputs: bool
    """One column-parallel input per attention and per MLP (fused QKV, fused gate/up)."""
    fsdp2_data_parallel: bool = False
    """ZeRO-2/3 by FSDP2's ``fully_shard``, and overlapped ZeRO-0/1 beside TP or a pipeline by
    its ``replicate`` (``parallel/zero.py``): units whose hooks run in Python each micro-batch
    (``hooked_units``)."""
    sequence_parallel: bool = False
    """Runs sequence parallelism whenever tp > 1 (norms and dropout on s/t tokens; all-gather
    and reduce-scatter in place of TP's all-reduces, the same bytes)."""
    tp_comm_overlap: float = 0.0
    """Share of the TP collectives hidden behind the GEMMs they feed (0: none)."""
    grad_reduce_overlap: bool = True
    """The gradient reduction overlaps the last micro-batch's backward (else after it)."""
    param_gather_overlap: bool = False
    """A distributed optimizer's parameter all-gather overlaps the next forward."""
    distributed_optimizer: bool = False
    """ZeRO-1 as reduce-scatter of gradients + all-gather of parameters (same bytes as the
    all-reduce), the optimizer step on 1/dp of the parameters."""
    fp32_grad_reduce: bool = False
    """Gradients reduced in fp32 (main gradients) whatever the compute dtype."""
    roofline: bool = False
    """Device time by ``roofline``: per-GEMM efficiency, causal flash attention under sdpa.
    False keeps the calibrated size curve autotune's CPU trials fit."""
    selective_recompute: str = "attention"
    """What ``selective`` recomputes: the attention core (Korthikanti et al. 2022 §5, Megatron's
    ``--recompute-granularity selective``) or torchtitan's ``op`` policy (half the matmuls and
    the element-wise kernels, ``perf_model.selective_op_recompute``)."""
    ac_modes: tuple[str, ...] = ("none", "selective", "full")
    """The activation-checkpointing modes the engine offers."""
    elementwise_factor: float = 1.0
    """The engine's element-wise bytes over fused kernels' (the calibration's
    ``elementwise_bytes`` counts Megatron's fused norms, bias-GELU and bias-dropout-add)."""
    fsdp_unit: str = "block"
    """What ZeRO-3 gathers as one unit, each its own ring of collectives across nodes:
    ``block``, one ``fully_shard`` per decoder block (torchtitan 0.3.0
    ``models/llama3/infra/parallelize.py`` ``apply_fsdp``); ``bucket``, blocks grouped up to
    ``bucket_mb`` (autotune's ``trial/parallel/zero.py`` ``_apply_fsdp``, ``group_blocks``);
    ``submodule``, each parameterised submodule fetched on its own (DeepSpeed 0.19
    ``runtime/zero/stage3.py``, ``partitioned_param_coordinator.py`` per-submodule fetch):
    ``ZERO3_MODULES_PER_BLOCK`` per block."""
    ac_regather: bool = False
    """Under ZeRO-3 with full AC, the recomputed forward gathers the parameters again. False
    for FSDP2 (torch 2.13 ``distributed/fsdp/_fully_shard/_fsdp_state.py`` ``_pre_forward``
    unshards only groups not already unsharded, and the backward's pre-hook has just gathered
    the block the recomputation runs in); True for DeepSpeed (``stage3.py``: the recomputed
    submodules' forward pre-hooks fetch their partitioned parameters again)."""
    ep_comm_overlap: float = 0.0
    """Share of a mixture of experts' dispatch and combine all-to-alls hidden behind compute
    (``moe_time``). 0 for every engine as it runs by default: Megatron-Core's
    ``--overlap-moe-expert-parallel-comm`` (overlapping one micro-batch's all-to-all with
    another's compute) is off unless asked for (``megatron/training/arguments.py``,
    ``store_true``); torchtitan's ``AllToAllTokenDispatcher`` (main at b5bcd76,
    ``torchtitan/models/common/token_dispatcher.py``) runs the counts' and the tokens'
    ``all_to_all_single`` between the router and the grouped GEMM, which waits on them; its
    overlap passes are experiments (``experiments/graph_trainer/ep_overlap_pass.py``);
    DeepSpeed's ``_AllToAll`` (``deepspeed/moe/sharded_moe.py``) and autotune's runtime
    (``trial/parallel/expert.py``) are synchronous: exposed."""
    memory: MemoryTraits = AUTOTUNE_MEMORY
    """What the engine stores (its memory traits)."""
    source: str = ""


AUTOTUNE_ENGINE = EngineProfile(
    memory=AUTOTUNE_MEMORY,
    name="autotune",
    vocab_parallel=False,
    fused_column_inputs=False,
    fsdp2_data_parallel=True,
    fsdp_unit="bucket",
    source="autotune/trial/parallel: DTensor ColwiseParallel q/k/v, FSDP2/DDP data parallelism",
)
TORCHTITAN_EAGER_ELEMENTWISE = 4.0
"""torchtitan without ``torch.compile`` (its 2024 defaults) runs the element-wise ops eagerly,
one kernel each (torchtitan/models/llama3/model.py): RMSNorm as ``x.float()``, ``pow``,
``mean``, ``rsqrt``, two ``mul`` and ``type_as`` (about 40 bytes per element against a fused
norm's 4), rotary embeddings on q and k in fp32 complex arithmetic, SwiGLU's ``silu`` and
``mul`` apart: about 4× the fused kernels' bytes (~100 against 22 per b·s·h element; 35
against 16 per sharded element)."""
MEGATRON_LEGACY_ENGINE = EngineProfile(
    memory=MEGATRON,
    name="megatron-legacy",
    vocab_parallel=True,
    fused_column_inputs=True,
    source="Megatron-LM's TP plan alone, as autotune modelled it before engines had overlap: "
    "what bench/perf_model_accuracy.py calibrates on vTrain's single-node table",
)
"""Megatron's TP plan without SP or overlap, on the size curve: the engine the vTrain table's
fits (``bench/perf_model_accuracy.py``) were made with, kept so their figures stay comparable."""
MEGATRON_ENGINE = EngineProfile(
    memory=MEGATRON,
    name="megatron",
    vocab_parallel=True,
    fused_column_inputs=True,
    sequence_parallel=True,
    tp_comm_overlap=0.8,
    grad_reduce_overlap=True,
    param_gather_overlap=True,
    distributed_optimizer=True,
    fp32_grad_reduce=True,
    roofline=True,
    fsdp_unit="submodule",  # as modelled before the trait; Megatron's FSDP not yet read
    ac_regather=True,
    ac_modes=("none", "selective", "full"),
    source="NVIDIA/Megatron-LM megatron/core: VocabParallelEmbedding and "
    "vocab_parallel_cross_entropy (tensor_parallel/layers.py, cross_entropy.py); fused "
    "linear_qkv and linear_fc1 (transformer/attention.py, mlp.py); --sequence-parallel; "
    "--tp-comm-overlap (Transformer Engine userbuffers: GEMM/collective pipelining, "
    "most but not all of the bytes hidden, 0.8 assumed); --overlap-grad-reduce and "
    "--overlap-param-gather (distributed/param_and_grad_buffer.py); "
    "--use-distributed-optimizer (optimizer/distrib_optimizer.py); main gradients in "
    "fp32 under bf16 (arguments.py: accumulate_allreduce_grads_in_fp32); "
    "--recompute-granularity selective|full with --recompute-num-layers",
)
TORCHTITAN_ENGINE = EngineProfile(
    memory=TORCHTITAN,
    name="torchtitan",
    vocab_parallel=True,
    fused_column_inputs=False,
    sequence_parallel=True,
    tp_comm_overlap=0.0,
    grad_reduce_overlap=True,
    param_gather_overlap=True,
    fp32_grad_reduce=True,
    roofline=True,
    selective_recompute="op",
    ac_modes=("none", "selective", "full"),
    elementwise_factor=TORCHTITAN_EAGER_ELEMENTWISE,
    source="pytorch/torchtitan torchtitan/models/llama3/infra/parallelize.py: ColwiseParallel "
    "wq/wk/wv and w1/w3 (separate), SequenceParallel norms, loss_parallel; FSDP2 "
    "fully_shard with implicit prefetch and MixedPrecisionPolicy(reduce_dtype=float32); "
    "async TP only with enable_async_tensor_parallel (off by default: 0 here); AC "
    "'selective' op|layer and 'full'",
)
DEEPSPEED_ENGINE = EngineProfile(
    memory=DEEPSPEED,
    name="deepspeed",
    vocab_parallel=True,
    fused_column_inputs=True,
    sequence_parallel=False,
    tp_comm_overlap=0.0,
    grad_reduce_overlap=True,
    param_gather_overlap=False,
    distributed_optimizer=True,
    roofline=True,
    fsdp_unit="submodule",
    ac_regather=True,
    ac_modes=("none", "full"),
    source="microsoft/Megatron-DeepSpeed with deepspeed/runtime/zero: Megatron's TP plan "
    "without sequence parallelism (BigScience tr11), ZeRO-1/2 reduce-scatter with "
    "overlap_comm, ZeRO-3 parameter prefetch (stage3.py); "
    "deepspeed.checkpointing full recomputation",
)
ENGINES = {
    e.name: e
    for e in (
        AUTOTUNE_ENGINE,
        MEGATRON_ENGINE,
        TORCHTITAN_ENGINE,
        DEEPSPEED_ENGINE,
        MEGATRON_LEGACY_ENGINE,
    )
}
ENGINE_NAMES = ("autotune", "megatron", "torchtitan", "deepspeed")
"""What ``--engine`` offers."""


def engine_traits(name: str) -> EngineProfile:
    """The profile of an engine by name; ConfigError naming the choices otherwise."""
    if name not in ENGINES:
        raise ConfigError(f"unknown engine '{name}'; choose one of {', '.join(ENGINE_NAMES)}")
    return ENGINES[name]
