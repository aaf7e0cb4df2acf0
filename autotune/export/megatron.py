"""``megatron_args.txt``: the best layout as Megatron-LM command-line arguments
(``pretrain_gpt.py``), one flag a line, beside the lines (``#``) naming what Megatron cannot
express of it. Use: ``torchrun ... pretrain_gpt.py $(grep -v '^#' megatron_args.txt) <model and
data flags>``.

Flag names and meanings are Megatron-LM's ``megatron/training/arguments.py``; the training
script copies each into the Megatron-Core config field of the same name
(``core_transformer_config_from_args``: ``TransformerConfig`` and its ``ModelParallelConfig``
base; ``DistributedDataParallelConfig``). The ``megatron-core`` wheel ships no
``megatron/training``, so ``tests/export/test_exports.py`` checks the file against those
Megatron-Core 0.16 configs, whose own validation runs on construction.

- TP, PP, ``--num-virtual-stages-per-pipeline-rank`` (interleaved 1F1B), ``--sequence-parallel``,
  ``--context-parallel-size`` with ``--cp-comm-type allgather`` (the trial's K/V all-gather);
- ZeRO-1 is ``--use-distributed-optimizer``; ZeRO-2/3 are Megatron FSDP
  (``--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads[_params]``), HSDP its
  ``--num-distributed-optimizer-instances`` replica groups;
- overlap: ``--overlap-grad-reduce`` (+ ``--overlap-param-gather`` where parameters are
  gathered); recomputation: ``--recompute-granularity full --recompute-method uniform
  --recompute-num-layers 1`` (every block), ``block`` with the trial's ``ac_layers`` (Megatron's
  block method recomputes the first n layers of each pipeline stage, as the trial does), or
  ``selective`` (Megatron's default module is the attention core, as autotune's selective);
  ``op`` has no Megatron form and is named, not written;
- a mixture of experts: ``--num-experts``, ``--moe-router-topk``, ``--moe-ffn-hidden-size``,
  its router and balancing, ``--moe-token-dispatcher-type alltoall``, ``--moe-grouped-gemm``,
  ``--expert-model-parallel-size`` and ``--expert-tensor-parallel-size 1``;
- ``--micro-batch-size``, ``--global-batch-size``, ``--seq-length``, the model's shape;
  ``--bf16`` / ``--fp16``; float8 as ``--fp8-format hybrid --fp8-recipe tensorwise`` (e4m3
  forward, e5m2 gradients, dynamic per-tensor scales: torchao's default recipe).
"""

from __future__ import annotations

from autotune.config import TrialConfig
from autotune.export.trainers import export_precision

MEGATRON_FILE = "megatron_args.txt"
_SHARDING = {2: "optim_grads", 3: "optim_grads_params"}


def megatron_args(config: TrialConfig) -> tuple[list[list[str]], list[str]]:
    """(the flags, each with its values, what Megatron cannot express)."""
    notes: list[str] = []
    w = config.workload
    flags = [
        ["--tensor-model-parallel-size", str(config.tp_degree)],
        ["--pipeline-model-parallel-size", str(config.pp_degree)],
        ["--context-parallel-size", str(config.cp_degree)],
    ]
    if config.pp_degree > 1 and config.pp_schedule == "interleaved_1f1b":
        flags.append(["--num-virtual-stages-per-pipeline-rank", str(config.virtual_stages)])
    elif config.pp_degree > 1 and config.pp_schedule == "gpipe":
        notes.append("the GPipe schedule: Megatron runs 1F1B (or interleaved); written as 1F1B")
    if config.sequence_parallel:
        flags.append(["--sequence-parallel"])
    if config.cp_degree > 1:
        flags.append(["--cp-comm-type", "allgather"])
    flags += _data_parallel_flags(config, notes)
    flags += _recompute_flags(config, notes)
    flags += [
        ["--micro-batch-size", str(config.micro_batch_size)],
        ["--global-batch-size", str(w.global_batch_size)],
        ["--seq-length", str(w.seq_len)],
    ]
    flags += _shape_flags(config, notes)
    flags += _expert_flags(config, notes)
    flags += _precision_flags(config, notes)
    if config.compile:
        notes.append(
            "compile: Megatron-LM has no torch.compile flag for its blocks (it fuses "
            "kernels through Transformer Engine and its fusions instead)"
        )
    if config.attention == "eager":
        notes.append(
            "eager attention: Megatron chooses its attention backend itself (--attention-backend)"
        )
    if config.device == "cpu":
        notes.append("measured on CPU (gloo); Megatron-LM trains on GPUs (NCCL)")
    return flags, notes


def _data_parallel_flags(config: TrialConfig, notes: list[str]) -> list[list[str]]:
    zero, flags = config.zero_stage, []
    if zero == 1:
        flags.append(["--use-distributed-optimizer"])
    elif zero >= 2:
        flags += [["--use-megatron-fsdp"], ["--data-parallel-sharding-strategy", _SHARDING[zero]]]
    if config.dp_replicate > 1:
        flags += [
            ["--num-distributed-optimizer-instances", str(config.dp_replicate)],
            ["--outer-dp-sharding-strategy", "no_shard"],
        ]
    if config.overlap_enabled and config.dp_degree > 1:
        flags.append(["--overlap-grad-reduce"])
        if zero >= 1:
            flags.append(["--overlap-param-gather"])
    if config.optimizer_offload_enabled:
        flags += [["--optimizer-cpu-offload"], ["--optimizer-offload-fraction", "1.0"]]
        notes.append(
            "optimizer offload: Megatron's --optimizer-cpu-offload moves the optimizer "
            "state and step to the CPU; the parameters stay on the GPU"
        )
    notes.append(
        f"bucket size {config.bucket_mb:g} MB: Megatron sizes its buckets in elements "
        "(--ddp-bucket-size), not written"
    )
    return flags


def _recompute_flags(config: TrialConfig, notes: list[str]) -> list[list[str]]:
    mode = config.activation_checkpointing
    if mode == "none":
        return []
    if mode == "selective":
        return [["--recompute-granularity", "selective"]]
    if mode == "full" and config.ac_layers is not None:
        return [
            ["--recompute-granularity", "full"],
            ["--recompute-method", "block"],
            ["--recompute-num-layers", str(config.ac_layers)],
        ]
    if mode == "full":
        return [
            ["--recompute-granularity", "full"],
            ["--recompute-method", "uniform"],
            ["--recompute-num-layers", "1"],
        ]
    # op: torchtitan's op-level policy (every second matmul recomputed) is no Megatron
    # granularity; --recompute-modules recomputes whole modules (core_attn, mlp, layernorm, ...).
    notes.append(
        f"activation checkpointing {mode!r} (op-level, every second matmul recomputed) "
        "has no Megatron flag: not written, so the job keeps every activation; add "
        "--recompute-granularity full --recompute-method uniform --recompute-num-layers "
        "1 if it does not fit"
    )
    return []


def _shape_flags(config: TrialConfig, notes: list[str]) -> list[list[str]]:
    shape = config.workload.shape
    if shape is None:
        notes.append(
            "a user workload: add the model's --num-layers, --hidden-size and --num-attention-heads"
        )
        return []
    flags = [
        ["--num-layers", str(shape.num_layers)],
        ["--hidden-size", str(shape.hidden_size)],
        ["--num-attention-heads", str(shape.num_heads)],
        ["--ffn-hidden-size", str(shape.ffn_hidden_size)],
        ["--max-position-embeddings", str(shape.max_seq_len)],
    ]
    if shape.num_kv_heads != shape.num_heads:
        flags += [["--group-query-attention"], ["--num-query-groups", str(shape.num_kv_heads)]]
    if shape.family == "llama":
        flags += [
            ["--normalization", "RMSNorm"],
            ["--swiglu"],
            ["--position-embedding-type", "rope"],
        ]
    stages = config.num_pp_stages
    if stages > 1 and shape.num_layers % stages:
        notes.append(
            f"{shape.num_layers} layers on {stages} stages: the trial gave the first "
            "and last stage a layer fewer (shapes.stage_layer_counts); set "
            "--decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers"
        )
    return flags


def _expert_flags(config: TrialConfig, notes: list[str]) -> list[list[str]]:
    """A mixture of experts (``arguments.py``'s MoE group): the routed experts, top-k, expert
    width and shared experts, sigmoid scores normalised over the chosen k with the
    aux-loss-free bias (``--moe-router-enable-expert-bias``, updated at the model's rate) or the
    auxiliary loss, the dense leading layers as ``--moe-layer-freq``; dropless (no capacity
    factor); grouped GEMM and all-to-all dispatch, as the trial; experts split over
    ``--expert-model-parallel-size`` ranks without tensor parallelism
    (``--expert-tensor-parallel-size 1``: MoE parallel folding, the experts' data-parallel
    ranks the rest)."""
    shape = config.workload.shape
    spec = shape.moe if shape is not None else None
    if spec is None:
        if config.ep_degree > 1:  # a user workload: its experts are not known here
            notes.append("a user workload: add the model's --num-experts and --moe-* flags")
            return [["--expert-model-parallel-size", str(config.ep_degree)]]
        return []
    flags = [
        ["--num-experts", str(spec.num_experts)],
        ["--moe-router-topk", str(spec.top_k)],
        ["--moe-ffn-hidden-size", str(spec.expert_ffn_size)],
        ["--moe-router-score-function", "sigmoid"],
    ]
    if spec.num_shared_experts:
        width = spec.num_shared_experts * spec.expert_ffn_size
        flags.append(["--moe-shared-expert-intermediate-size", str(width)])
    if spec.load_balance_coeff is not None:
        flags += [
            ["--moe-router-enable-expert-bias"],
            ["--moe-router-bias-update-rate", f"{spec.load_balance_coeff:g}"],
        ]
    balance = "aux_loss" if spec.aux_loss_coeff > 0 else "none"
    flags.append(["--moe-router-load-balancing-type", balance])
    if spec.aux_loss_coeff > 0:
        flags.append(["--moe-aux-loss-coeff", f"{spec.aux_loss_coeff:g}"])
    if spec.first_dense_layers:
        dense, moe = spec.first_dense_layers, shape.num_layers - spec.first_dense_layers
        flags.append(["--moe-layer-freq", f"([0]*{dense}+[1]*{moe})"])
    if config.ep_degree > 1 and config.tp_degree > 1 and not config.sequence_parallel:
        notes.append(
            f"ep {config.ep_degree} with tp {config.tp_degree}: Megatron wants "
            "--sequence-parallel beside expert and tensor parallelism "
            "(model_parallel_config.py); the trial ran without it: add it"
        )
    return flags + [
        ["--moe-token-dispatcher-type", "alltoall"],
        ["--moe-grouped-gemm"],
        ["--expert-model-parallel-size", str(config.ep_degree)],
        ["--expert-tensor-parallel-size", "1"],
    ]


def _precision_flags(config: TrialConfig, notes: list[str]) -> list[list[str]]:
    precision = export_precision(config)
    flags = {"bf16": [["--bf16"]], "16": [["--fp16"]], "32": []}[precision.split("-")[0]]
    if precision.endswith("-true") and precision != "32-true":
        notes.append(
            f"{precision} (no fp32 master copy): Megatron keeps fp32 main parameters; "
            "written as its mixed precision"
        )
    if config.float8:
        flags += [["--fp8-format", "hybrid"], ["--fp8-recipe", "tensorwise"]]
    return flags


def megatron_text(config: TrialConfig) -> str:
    flags, notes = megatron_args(config)
    head = [
        f"# Megatron-LM arguments of autotune's best layout of {config.workload.name}",
        "# (torchrun ... pretrain_gpt.py $(grep -v '^#' megatron_args.txt) <data flags>).",
        "# What Megatron cannot express:",
    ]
    head += [f"#   - {n}" for n in notes]
    return "\n".join(head + [" ".join(f) for f in flags]) + "\n"
