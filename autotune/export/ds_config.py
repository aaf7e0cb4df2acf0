"""DeepSpeed's ``ds_config.json`` of a configuration.

DeepSpeed keys follow its configuration reference (deepspeed.ai/docs/config-json):
``train_batch_size`` must equal ``train_micro_batch_size_per_gpu × gradient_accumulation_steps ×
data-parallel size`` (DeepSpeed asserts it: the mpu's data-parallel size, else world /
``sequence_parallel_size``, ``runtime/config.py``), and ZeRO bucket sizes are counted in elements.
Context parallelism is written as Ulysses (``sequence_parallel_size``); a layout DeepSpeed has no
way to run (``deepspeed_cannot_run``) gets no file.
"""

from __future__ import annotations

from autotune.config import (
    BYTES_PER_ELEMENT,
    MIXED_PRECISIONS,
    PRECISION_COMPUTE_DTYPE,
    TrialConfig,
)
from autotune.errors import ConfigError


def _precision_sections(precision: str) -> dict:
    """DeepSpeed's ``bf16`` / ``fp16`` sections. Both keep fp32 master weights and optimizer
    state (DeepSpeed's mixed precision); ``fp16.loss_scale`` 0 is its dynamic loss scale,
    starting at 2^initial_scale_power as 16-mixed's does (``parallel/precision.py``)."""
    dtype = PRECISION_COMPUTE_DTYPE[precision]
    fp16: dict = {"enabled": dtype == "float16"}
    if precision == "16-mixed":
        fp16.update(
            loss_scale=0,
            initial_scale_power=16,
            loss_scale_window=2000,
            hysteresis=1,
            min_loss_scale=1,
        )
    return {"bf16": {"enabled": dtype == "bfloat16"}, "fp16": fp16}


def ds_config(config: TrialConfig) -> dict:
    """The same choice in DeepSpeed's keys, with notes where DeepSpeed cannot follow it."""
    w = config.workload
    device_type = "cpu" if config.device == "cpu" else "cuda"
    precision = config.resolved_precision(device_type)
    bucket_elements = int(
        config.bucket_mb * 2**20 // BYTES_PER_ELEMENT[config.compute_dtype(device_type)]
    )
    ds: dict = {
        "train_batch_size": w.global_batch_size,
        "train_micro_batch_size_per_gpu": config.micro_batch_size,
        "gradient_accumulation_steps": config.grad_accum_steps,
        "zero_optimization": {
            "stage": config.zero_stage,
            "reduce_bucket_size": bucket_elements,
            "allgather_bucket_size": bucket_elements,
            "overlap_comm": config.overlap_enabled,
            "contiguous_gradients": True,
        },
        **_precision_sections(precision),
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.0}},
    }
    if config.optimizer_offload_enabled:
        # autotune offloads with FSDP2's CPUOffloadPolicy: sharded parameters, gradients and
        # optimizer state in pinned host memory, the step on the CPU. DeepSpeed's
        # offload_optimizer moves the optimizer state, its step and the gradients;
        # offload_param the parameters, at stage 3 only (its config reference).
        zero_optimization = ds["zero_optimization"]
        zero_optimization["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        if config.zero_stage == 3:
            zero_optimization["offload_param"] = {"device": "cpu", "pin_memory": True}
    if config.activation_checkpointing != "none":
        ds["activation_checkpointing"] = {
            "partition_activations": False,
            "contiguous_memory_optimization": False,
        }
    if config.tp_degree > 1:
        ds["tensor_parallel"] = {"autotp_size": config.tp_degree}
    if config.ep_degree > 1:
        ds["expert_parallel"] = _autoep_section(config)
    if config.cp_degree > 1:
        # Ulysses: without an mpu DeepSpeedConfig counts the batch over world /
        # sequence_parallel_size ranks (runtime/config.py): the trial's dp, tp and pp being 1
        # wherever a file is written (deepspeed_cannot_run).
        ds["sequence_parallel_size"] = config.cp_degree
    notes = _notes(config, precision)
    if notes:
        ds["autotune_notes"] = notes
    return ds


def _notes(config: TrialConfig, precision: str) -> list[str]:
    """What DeepSpeed cannot follow of the layout, and how to run what it can."""
    notes = []
    if precision not in MIXED_PRECISIONS and precision != "32-true":
        notes.append(
            f"precision {precision} (no fp32 master copy) has no DeepSpeed "
            "equivalent: its bf16/fp16 modes keep fp32 master weights and optimizer "
            "state, as bf16-mixed/16-mixed do"
        )
    if config.pp_degree > 1:
        notes.append(
            f"pipeline parallelism (pp_degree {config.pp_degree}, schedule "
            f"{config.pp_schedule}) is configured in DeepSpeed's PipelineModule "
            "(num_stages), not in this file"
        )
        if config.zero_stage >= 2:
            notes.append(
                "DeepSpeed's pipeline engine refuses ZeRO stages 2 and 3; with "
                "DeepSpeed use zero_stage ≤ 1 for this layout"
            )
    if config.tp_degree > 1 and config.zero_stage > 2:
        notes.append("DeepSpeed AutoTP needs ZeRO stage ≤ 2")
    if config.tp_degree > 1:
        notes.append(
            f"AutoTP: give deepspeed.initialize an mpu whose data-parallel size is "
            f"{config.dp_degree}; without one DeepSpeed counts train_batch_size over all "
            f"{config.world_size} ranks and refuses this file"
        )
    if config.optimizer_offload_enabled and config.zero_stage < 3:
        notes.append(
            f"DeepSpeed offloads parameters only at ZeRO stage 3 (offload_param): at "
            f"stage {config.zero_stage} its parameters stay on the GPU, where autotune's "
            "offload (FSDP2 CPUOffloadPolicy) keeps their shards in host memory"
        )
    if config.activation_checkpointing == "selective":
        notes.append(
            "selective recomputation (attention core) has no DeepSpeed key: apply "
            "deepspeed.checkpointing to the attention core in the model"
        )
    if config.activation_checkpointing == "op":
        notes.append(
            "op-level recomputation (every second matmul, torchtitan's SelectiveAC) "
            "has no DeepSpeed key: deepspeed.checkpointing wraps whole modules"
        )
    return notes + newer_knob_notes(config) + _expert_notes(config)


AUTOEP_PRESETS = ("mixtral", "qwen3_moe", "qwen3_5_moe", "deepseek_v2", "deepseek_v3")
"""The Hugging Face model types DeepSpeed 0.19's AutoEP replaces the MoE layers of by a preset
(``module_inject/auto_ep_presets/registry.py``)."""


def _autoep_section(config: TrialConfig) -> dict:
    """DeepSpeed's AutoEP (``expert_parallel``, ``module_inject/auto_ep_config.py`` of 0.19):
    experts split over ``autoep_size`` ranks, not tensor-parallel (``expert_tensor_parallel_size``
    1, the only value it takes), tokens exchanged by all-to-all (``comm_backend`` "comm")."""
    section: dict = {
        "enabled": True,
        "autoep_size": config.ep_degree,
        "expert_tensor_parallel_size": 1,
        "comm_backend": "comm",
    }
    model_type = _hf_model_type(config)
    if model_type in AUTOEP_PRESETS:
        section["preset_model"] = model_type
    spec = config.workload.shape.moe if config.workload.shape is not None else None
    if spec is not None:
        section["top_k"] = spec.top_k
    return section


def _hf_model_type(config: TrialConfig) -> str | None:
    if config.workload.hf_model is None:
        return None
    from autotune.hf_config import load_config

    return getattr(load_config(config.workload.hf_model), "model_type", None)


def _expert_notes(config: TrialConfig) -> list[str]:
    """What AutoEP cannot express of expert parallelism: DeepSpeed's MoE is the model's code."""
    if config.ep_degree == 1:
        return []
    notes = []
    if _hf_model_type(config) not in AUTOEP_PRESETS:
        notes.append(
            f"expert parallelism ep {config.ep_degree}: AutoEP replaces the MoE layers of "
            f"the Hugging Face models it has a preset for ({', '.join(AUTOEP_PRESETS)}); "
            f"{config.workload.name} is none of them: set expert_parallel's moe_layer_pattern, "
            "expert_pattern and router_pattern to its modules, or build its MoE layers with "
            f"deepspeed.moe.layer.MoE(ep_size={config.ep_degree})"
        )
    spec = config.workload.shape.moe if config.workload.shape is not None else None
    if spec is not None and spec.load_balance_coeff is not None:
        notes.append(
            "the auxiliary-loss-free balancing bias (load_balance_coeff "
            f"{spec.load_balance_coeff:g}) is refused by AutoEP: its experts are balanced by "
            "the router's auxiliary loss only"
        )
    return notes


def newer_knob_notes(config: TrialConfig) -> list[str]:
    """What DeepSpeed cannot express of sequence and context parallelism, HSDP, virtual
    stages, compile and float8 (its configuration reference; ``runtime/config.py`` of 0.19)."""
    notes = []
    if config.sequence_parallel:
        notes.append(
            "sequence parallelism here is Megatron's (norms and dropout on sequence "
            "shards inside TP); DeepSpeed's sequence_parallel_size is Ulysses (an "
            "all-to-all over attention heads), a different scheme, and AutoTP has no SP: "
            "not written"
        )
    if config.cp_degree > 1:
        notes.append(_ulysses_note(config))
    if config.dp_replicate > 1:
        notes.append(
            f"HSDP ({config.dp_replicate} replica groups of {config.dp_shard} shards): "
            "DeepSpeed removed MiCS (mics_shard_size); ZeRO++ hpZ "
            "(zero_hpz_partition_size) shards only a secondary parameter copy within "
            "groups: written as ZeRO over the whole dp"
        )
    if config.pp_degree > 1 and config.pp_schedule == "interleaved_1f1b":
        notes.append(
            f"interleaved 1F1B with {config.virtual_stages} virtual stages per rank: "
            "DeepSpeed's pipeline engine runs one stage per rank (1F1B)"
        )
    if config.compile:
        notes.append(
            "compile: call engine.compile() after deepspeed.initialize; it compiles "
            "the whole module, where the trial compiled each block"
        )
    if config.float8:
        notes.append(
            "float8 linears have no DeepSpeed key: use Transformer Engine's or "
            "torchao's float8 linears in the model"
        )
    return notes


def _ulysses_note(config: TrialConfig) -> str:
    cp, shape = config.cp_degree, config.workload.shape
    heads = (
        f"{shape.num_heads} heads and {shape.num_kv_heads} KV heads"
        if shape is not None
        else "the model's heads and KV heads (a user workload: check them)"
    )
    return (
        f"context parallelism cp {cp} (K/V all-gathered, causal load balancing) runs in "
        f"DeepSpeed as Ulysses sequence parallelism (sequence_parallel_size {cp}): an "
        f"all-to-all over attention heads, which needs {heads} divisible by {cp}; "
        f"DeepSpeed counts train_batch_size over world / {cp} ranks"
    )


def deepspeed_cannot_run(config: TrialConfig) -> str | None:
    """Why DeepSpeed 0.19 has no way to run this layout (its ``ds_config.json`` is then not
    written), or None. Its pipeline engine asserts ZeRO ≤ 1 (``runtime/pipe/engine.py``);
    context parallelism runs as Ulysses, whose all-to-all splits the heads, and neither the
    pipeline topology (pipe × data × model, ``runtime/pipe/topology.py``) nor AutoTP's mesh
    (data × tensor, ``utils/groups._init_tp_mesh_device``) has a sequence axis beside it."""
    cp, shape = config.cp_degree, config.workload.shape
    if config.pp_degree > 1 and config.zero_stage >= 2:
        return (
            f"DeepSpeed's pipeline engine refuses ZeRO-{config.zero_stage} (ZeRO-2 and "
            f"ZeRO-3 are incompatible with pipeline parallelism): pp {config.pp_degree} runs "
            "there with zero_stage 0 or 1"
        )
    if cp == 1:
        return None
    ulysses = f"cp {cp} runs in DeepSpeed as Ulysses (sequence_parallel_size)"
    if config.pp_degree > 1:
        return f"{ulysses}, and its pipeline engine's topology has no sequence axis: use pp 1"
    if config.tp_degree > 1:
        return f"{ulysses}, and AutoTP's data × tensor mesh has no sequence axis: use tp 1"
    if shape is not None and (shape.num_heads % cp or shape.num_kv_heads % cp):
        return (
            f"{ulysses}, whose all-to-all needs the heads and KV heads divisible by {cp}; "
            f"{config.workload.name} has {shape.num_heads} and {shape.num_kv_heads}"
        )
    return None


def check_batch_identity(ds: dict, dp_degree: int) -> None:
    """The identity DeepSpeed asserts at start-up."""
    expected = ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * dp_degree
    if ds["train_batch_size"] != expected:
        raise ConfigError(
            f"train_batch_size {ds['train_batch_size']} != micro × accumulation × dp = {expected}"
        )
