"""What each training engine runs, for the step-time model: its tensor-parallel plan, sequence
parallelism, what it overlaps, its optimizer's collectives, its kernels and its AC modes.

One engine name (``--engine autotune|megatron|torchtitan|deepspeed``) selects both these time
traits (``engine_traits``) and the memory traits of ``engine_memory.MEMORY_TRAITS``. Each trait
cites the framework source it describes. ``perf_model`` reads them; nothing here computes.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.errors import ConfigError


@dataclass(frozen=True, kw_only=True, slots=True)
class EngineTraits:
    """How a training code base turns a layout into kernels and collectives.

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
    source: str = ""


AUTOTUNE_ENGINE = EngineTraits(
    name="autotune",
    vocab_parallel=False,
    fused_column_inputs=False,
    fsdp2_data_parallel=True,
    source="autotune/trial/parallel: DTensor ColwiseParallel q/k/v, FSDP2/DDP data parallelism",
)
TORCHTITAN_EAGER_ELEMENTWISE = 4.0
"""torchtitan without ``torch.compile`` (its 2024 defaults) runs the element-wise ops eagerly,
one kernel each (torchtitan/models/llama3/model.py): RMSNorm as ``x.float()``, ``pow``,
``mean``, ``rsqrt``, two ``mul`` and ``type_as`` (about 40 bytes per element against a fused
norm's 4), rotary embeddings on q and k in fp32 complex arithmetic, SwiGLU's ``silu`` and
``mul`` apart: about 4× the fused kernels' bytes (~100 against 22 per b·s·h element; 35
against 16 per sharded element)."""
MEGATRON_LEGACY_ENGINE = EngineTraits(
    name="megatron-legacy",
    vocab_parallel=True,
    fused_column_inputs=True,
    source="Megatron-LM's TP plan alone, as autotune modelled it before engines had overlap: "
    "what bench/perf_model_accuracy.py calibrates on vTrain's single-node table",
)
"""Megatron's TP plan without SP or overlap, on the size curve: the engine the vTrain table's
fits (``bench/perf_model_accuracy.py``) were made with, kept so their figures stay comparable."""
MEGATRON_ENGINE = EngineTraits(
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
TORCHTITAN_ENGINE = EngineTraits(
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
DEEPSPEED_ENGINE = EngineTraits(
    name="deepspeed",
    vocab_parallel=True,
    fused_column_inputs=True,
    sequence_parallel=False,
    tp_comm_overlap=0.0,
    grad_reduce_overlap=True,
    param_gather_overlap=False,
    distributed_optimizer=True,
    roofline=True,
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


def engine_traits(name: str) -> EngineTraits:
    """The time traits of an engine by name; ConfigError naming the choices otherwise."""
    if name not in ENGINES:
        raise ConfigError(f"unknown engine '{name}'; choose one of {', '.join(ENGINE_NAMES)}")
    return ENGINES[name]
