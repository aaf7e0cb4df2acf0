"""Exports of the best layout for the trainers people use, beside ``ds_config.json``.

- ``accelerate_config.yaml``: Hugging Face Accelerate's launch config (the file ``accelerate
  config`` writes and ``accelerate launch --config_file`` reads): FSDP2 keys
  (``fsdp_version: 2``, ``fsdp_reshard_after_forward``, the decoder-layer class to wrap,
  activation checkpointing, offload), ``parallelism_config`` sizes (dp_replicate × dp_shard ×
  tp) and ``mixed_precision``. Keys follow accelerate 1.x ``commands/config/config_args.py`` and
  ``commands/launch.py``.
- ``torchtitan_config.py``: a job config for torchtitan 0.3, which loads Python configs (no TOML
  since 0.3): ``--module torchtitan_config --config autotune_best`` with the folder on
  ``PYTHONPATH``. It starts from one of torchtitan's own model configs (torchtitan trains its own
  model implementations, not HF ones) and sets ``parallelism``, ``training`` and
  ``activation_checkpoint`` (``torchtitan/config/configs.py``, ``torchtitan/trainer.py``).

Each file states what its target cannot express (YAML comments; the module's docstring and
``CANNOT_EXPRESS``). Optimizer offload is not among it: ``fsdp_offload_params`` and
``enable_cpu_offload`` are FSDP2's ``CPUOffloadPolicy``, autotune's own mechanism (sharded
parameters, gradients and optimizer state in host memory); ``ds_config.json`` notes where
DeepSpeed's offload differs. ``tests/test_hf.py`` loads each with the target library's own loader.
"""

from __future__ import annotations

import json
import pprint
from pathlib import Path

from autotune.config import TrialConfig

ACCELERATE_FILE = "accelerate_config.yaml"
TORCHTITAN_FILE = "torchtitan_config.py"

# Accelerate's mixed_precision: autocast with fp32 master weights, i.e. the *-mixed precisions.
_ACCELERATE_PRECISION = {
    "32-true": "no",
    "bf16-mixed": "bf16",
    "16-mixed": "fp16",
    "bf16-true": "bf16",
    "16-true": "fp16",
}


def export_precision(config: TrialConfig) -> str:
    """The precision the exported job trains in: the trial's, or the GPU default."""
    return config.resolved_precision("cuda")


_TORCHTITAN_SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved_1f1b": "Interleaved1F1B"}


def decoder_layer_class(config: TrialConfig) -> str:
    """The class name FSDP wraps and checkpointing recomputes: the HF decoder layer, the
    built-in TransformerBlock, or a placeholder for a user workload."""
    if config.workload.hf_model is not None:
        from autotune.hf_config import decoder_layer_class_name

        return decoder_layer_class_name(config.workload.hf_model)
    if config.workload.workload is None:
        return "TransformerBlock"
    return "YourDecoderLayer"


# ---- Accelerate ------------------------------------------------------------------------------
def accelerate_config(config: TrialConfig, layer_class: str) -> tuple[dict, list[str]]:
    """(the config dict, what Accelerate cannot express)."""
    tp, pp, dp, zero, cp = (
        config.tp_degree,
        config.pp_degree,
        config.dp_degree,
        config.zero_stage,
        config.cp_degree,
    )
    notes = [
        f"micro-batch {config.micro_batch_size} and {config.grad_accum_steps} accumulation "
        "steps belong in the training script (DataLoader batch_size, "
        "Accelerator(gradient_accumulation_steps=...)), not in this file"
    ]
    processes = dp * tp * cp
    if pp > 1:
        notes.append(
            f"pipeline parallelism (pp {pp}, {config.pp_schedule}) has no Accelerate "
            f"training key: this file runs the dp × cp × tp = {processes} part of the "
            f"world of {config.world_size}"
        )
    # Accelerate's FSDP2 needs a dimension to shard: dp_shard or cp above 1 (ParallelismConfig.
    # _validate_accelerator), and its launcher takes a parallelism_config only with FSDP2.
    sharded = zero >= 2 and config.dp_shard > 1
    use_fsdp = sharded or cp > 1
    precision = export_precision(config)
    if precision.endswith("-true") and precision != "32-true":
        notes.append(
            f"{precision} (the whole model in half precision, no fp32 master copy) "
            "has no Accelerate key: written as its mixed precision"
        )
    doc: dict = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "distributed_type": "FSDP" if use_fsdp else ("MULTI_GPU" if processes > 1 else "NO"),
        "downcast_bf16": "no",
        "machine_rank": 0,
        "main_training_function": "main",
        "mixed_precision": "fp8" if config.float8 else _ACCELERATE_PRECISION[precision],
        "num_machines": 1,
        "num_processes": processes,
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": config.device == "cpu",
    }
    doc.update(_accelerate_knobs(config, notes))
    if config.ep_degree > 1:
        notes.append(
            f"expert parallelism ep {config.ep_degree} has no Accelerate key (its "
            "parallelism_config sizes dp_replicate, dp_shard, tp, cp and sp only): load the "
            "model with transformers' DistributedConfig(enable_expert_parallel=True, "
            f"ep_size={config.ep_degree}); as written the experts are data-parallel like "
            "the rest"
        )
    if zero == 1:
        notes.append(
            "ZeRO-1 (optimizer state sharded, gradients all-reduced) has no FSDP "
            "equivalent: written as plain data parallelism; use ds_config.json "
            "(Accelerate's DeepSpeed plugin) to keep it"
        )
    if use_fsdp:
        doc.update(_accelerate_fsdp(config, layer_class, notes))
    else:
        notes += _accelerate_unsharded(config)
    notes.append(
        f"bucket size {config.bucket_mb:g} MB and overlap "
        f"{'on' if config.overlap_enabled else 'off'} have no Accelerate key"
    )
    if config.device == "cpu":
        notes.append("measured on CPU (gloo); on GPUs set use_cpu false")
    return doc, notes


def _accelerate_knobs(config: TrialConfig, notes: list[str]) -> dict:
    """compile (regional compilation of the repeated blocks) and float8 (torchao's backend)."""
    doc: dict = {}
    if config.compile:
        doc["dynamo_config"] = {
            "dynamo_backend": "INDUCTOR",
            "dynamo_use_fullgraph": True,
            "dynamo_use_regional_compilation": True,
        }
    if config.float8:
        doc["fp8_config"] = {"backend": "AO"}
        notes.append(
            "float8: Accelerate's torchao backend converts the linears with its own "
            "filter (first and last linear kept in bf16), not every 16-aligned one"
        )
    if config.sequence_parallel:
        notes.append(
            "sequence parallelism (Megatron-style norms and dropout on sequence "
            "shards) is chosen by the model's tp_plan in transformers, not by a key "
            "here; parallelism_config_sp_size is DeepSpeed's Ulysses, a different "
            "scheme"
        )
    return doc


def _accelerate_unsharded(config: TrialConfig) -> list[str]:
    """What a layout with nothing for FSDP2 to shard runs as: DDP, TP from the model."""
    notes = []
    if config.activation_checkpointing != "none":
        notes.append(
            "activation checkpointing without FSDP has no Accelerate key: call "
            "model.gradient_checkpointing_enable() in the script"
        )
    if config.tp_degree > 1:
        notes.append(
            f"tp {config.tp_degree} without a dimension to shard: Accelerate's "
            "parallelism_config needs FSDP2 with dp_shard or cp above 1; load the model with "
            f"transformers' tp_plan='auto' (DistributedConfig(tp_size={config.tp_degree})) "
            "and launch as written (MULTI_GPU)"
        )
    if config.zero_stage >= 2:
        notes.append(
            f"ZeRO-{config.zero_stage} over shard groups of one rank shards nothing: "
            "written as plain data parallelism"
        )
    return notes


def _accelerate_fsdp(config: TrialConfig, layer_class: str, notes: list[str]) -> dict:
    """FSDP2 keys and the parallelism_config sizes (HSDP: dp_replicate × dp_shard; CP)."""
    zero, dp = config.zero_stage, config.dp_degree
    shard = config.dp_shard if zero >= 2 else 1
    if config.cp_degree > 1 and shard == 1 and dp > 1:
        # Accelerate composes CP with sharded data parallelism only (ParallelismConfig)
        shard = dp
        notes.append(
            f"ZeRO-{zero} replicas with cp {config.cp_degree}: Accelerate composes context "
            f"parallelism only with FSDP sharding; written as FSDP over the {dp} "
            "data-parallel ranks (gradients and optimizer state sharded, no more memory)"
        )
    fsdp = {
        "fsdp_version": 2,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_transformer_layer_cls_to_wrap": layer_class,
        "fsdp_reshard_after_forward": zero == 3,
        "fsdp_activation_checkpointing": config.activation_checkpointing != "none",
        "fsdp_offload_params": config.optimizer_offload_enabled,
        "fsdp_cpu_ram_efficient_loading": False,
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
    }
    parallelism = {
        "parallelism_config_dp_replicate_size": dp // shard,
        "parallelism_config_dp_shard_size": shard,
        "parallelism_config_tp_size": config.tp_degree,
        "parallelism_config_cp_size": config.cp_degree,
    }
    if config.cp_degree > 1:  # torch's context_parallel with K/V all-gathered, as the trials
        parallelism["parallelism_config_cp_backend"] = "torch"
        parallelism["parallelism_config_cp_comm_strategy"] = "allgather"
    if zero < 2 and dp == 1:
        notes.append(
            f"ZeRO-{zero} with cp {config.cp_degree}: FSDP2 over the cp ranks, the "
            "closest Accelerate layout"
        )
    if config.activation_checkpointing in ("selective", "op"):
        notes.append(
            f"{config.activation_checkpointing} recomputation (attention core / "
            "op-level) has no key: fsdp_activation_checkpointing recomputes whole "
            "decoder layers"
        )
    if config.ac_layers is not None:
        notes.append(
            f"ac_layers {config.ac_layers}: fsdp_activation_checkpointing "
            "recomputes every decoder layer"
        )
    return {"fsdp_config": fsdp, "parallelism_config": parallelism}


def accelerate_yaml(config: TrialConfig, layer_class: str) -> str:
    doc, notes = accelerate_config(config, layer_class)
    head = [
        f"# Accelerate launch config for autotune's best layout of {config.workload.name}",
        "# (accelerate launch --config_file accelerate_config.yaml train.py).",
        "# What Accelerate cannot express:",
    ]
    head += [f"#   - {n}" for n in notes]
    return "\n".join(head) + "\n" + _yaml(doc) + "\n"


def _yaml(value: dict, indent: int = 0) -> str:
    """Block YAML of a dict of scalars and dicts; scalars as JSON, which YAML reads as-is."""
    lines = []
    for key, v in value.items():
        if isinstance(v, dict):
            lines.append(" " * indent + f"{key}:")
            lines.append(_yaml(v, indent + 2))
        else:
            lines.append(" " * indent + f"{key}: {json.dumps(v)}")
    return "\n".join(lines)


# ---- torchtitan ------------------------------------------------------------------------------
def torchtitan_settings(config: TrialConfig) -> tuple[dict, list[str]]:
    """(fields to set on torchtitan's Trainer.Config, what torchtitan cannot express)."""
    tp, pp, dp, zero = config.tp_degree, config.pp_degree, config.dp_degree, config.zero_stage
    w = config.workload
    notes = [
        "torchtitan trains its own model implementations: BASE_MODULE / BASE_CONFIG name "
        "the torchtitan model config this layout is applied to; pick the flavor matching "
        f"{w.name}"
    ]
    # ZeRO-2/3 are FSDP (dp_shard, within each of dp_replicate groups under HSDP); ZeRO-0 is
    # replication (dp_replicate, DDP).
    shard = config.dp_shard if zero >= 2 else 1
    if zero == 1:
        notes.append(
            "ZeRO-1 has no torchtitan equivalent: written as dp_replicate (DDP); "
            "ZeRO-2 (dp_shard with fsdp_reshard_after_forward 'never') is the nearest "
            "sharded choice"
        )
    per_dp = w.global_batch_size // dp
    parallelism = {
        "data_parallel_replicate_degree": dp // shard,
        "data_parallel_shard_degree": shard,
        "fsdp_reshard_after_forward": "always" if zero == 3 else "never",
        "tensor_parallel_degree": tp,
        "enable_sequence_parallel": config.sequence_parallel,
        "context_parallel_degree": config.cp_degree,
        "pipeline_parallel_degree": pp,
        "pipeline_parallel_schedule": _TORCHTITAN_SCHEDULES[config.pp_schedule],
        "pipeline_parallel_microbatch_size": config.micro_batch_size,
        **_torchtitan_stages(config, notes),
        **_torchtitan_experts(config, notes),
    }
    # Without a pipeline torchtitan accumulates global / (local × dp) micro-batches of
    # local_batch_size; with one, local_batch_size is the rank's batch, cut into microbatches.
    training = {
        "local_batch_size": per_dp if pp > 1 else config.micro_batch_size,
        "global_batch_size": w.global_batch_size,
        "seq_len": w.seq_len,
        "enable_cpu_offload": config.optimizer_offload_enabled,
    }
    # torchtitan 0.3 refuses CUDA graphs under a pipeline, and under ep with its all-to-all
    # dispatcher, which synchronises with the CPU for the splits (Trainer.Config)
    if pp > 1 or config.ep_degree > 1:
        training["disable_cuda_graphs"] = True
    precision = export_precision(config)
    if precision.startswith("16-"):
        notes.append(
            f"{precision}: torchtitan has no float16 key (bfloat16 or float32 only): "
            "written as bfloat16 mixed precision"
        )
    elif precision == "bf16-true":
        notes.append(
            "bf16-true: torchtitan keeps fp32 master weights under FSDP: written as "
            "bfloat16 mixed precision"
        )
    training["mixed_precision_param"] = "float32" if precision == "32-true" else "bfloat16"
    if config.attention == "eager":
        notes.append(
            "eager attention: torchtitan's models choose their attention backend "
            "in the model config"
        )
    notes.append(
        f"bucket size {config.bucket_mb:g} MB and overlap "
        f"{'on' if config.overlap_enabled else 'off'} have no torchtitan key"
    )
    ac = _torchtitan_ac(config, notes)
    if config.float8:
        notes.append(
            "float8: torchtitan 0.3's Float8LinearConverter scales row-wise (its "
            "recipes are rowwise and rowwise_with_gw_hp); the trial scaled per tensor "
            "(torchao's default recipe)"
        )
    return {
        "parallelism": parallelism,
        "training": training,
        "activation_checkpoint": ac,
        "compile": {"enable": config.compile, "components": ["model"]},
        "float8": config.float8,
    }, notes


def _torchtitan_ac(config: TrialConfig, notes: list[str]) -> str | None:
    """torchtitan 0.3's activation-checkpointing class (``torchtitan/distributed/
    activation_checkpoint.py``): ``FullAC`` wraps every block; ``SelectiveAC`` is the op-level
    policy (SDPA's, the collectives' and every second matmul's outputs saved), which torchtitan
    up to 0.2 spelled ``mode = "selective", selective_ac_option = "op"`` and autotune's ``op``
    runs. torchtitan has no form of ``ac_layers``: 0.3 has no layer count, and 0.2's
    ``selective_ac_option = "<n>"`` checkpointed every n-th block, not the first n of each stage
    (Megatron's ``--recompute-method block``, which autotune runs): written as ``FullAC``, which
    recomputes every block — slower than the measured layout, never larger — with a note."""
    mode = config.activation_checkpointing
    if config.ac_layers is not None:
        notes.append(
            f"ac_layers {config.ac_layers}: torchtitan cannot recompute only the first "
            f"{config.ac_layers} blocks of each stage; written as FullAC (every block: "
            "slower than measured, no more memory); megatron_args.txt runs it as "
            "measured (--recompute-method block)"
        )
    if mode == "selective":
        notes.append(
            "selective: torchtitan has no attention-core recomputation; written as "
            "SelectiveAC, its op-level policy (autotune's op), which recomputes more"
        )
    return {"none": None, "full": "FullAC", "selective": "SelectiveAC", "op": "SelectiveAC"}[mode]


def _torchtitan_stages(config: TrialConfig, notes: list[str]) -> dict:
    """The pipeline split: torchtitan weighs the embedding and the output as
    ``pipeline_parallel_{first,last}_stage_less_layers`` layers and cuts ceil((L + first + last)
    / pipeline_parallel_layers_per_stage) stages (``torchtitan/distributed/pipeline_parallel.py``).
    autotune splits evenly where the layers divide (weights 0) and weighs each as one layer
    otherwise (``shapes.stage_layer_counts``)."""
    shape, stages = config.workload.shape, config.num_pp_stages
    if config.pp_degree == 1 or shape is None:
        return {}
    layers = shape.num_layers
    weight = 0 if layers % stages == 0 else 1
    per_stage = -(-(layers + 2 * weight) // stages)
    if -(-(layers + 2 * weight) // per_stage) != stages:
        notes.append(
            f"{stages} pipeline stages of {layers} layers: no "
            "pipeline_parallel_layers_per_stage gives torchtitan that many; set "
            "module_fqns_per_model_part by hand"
        )
    return {
        "pipeline_parallel_first_stage_less_layers": weight,
        "pipeline_parallel_last_stage_less_layers": weight,
        "pipeline_parallel_layers_per_stage": per_stage,
    }


def _torchtitan_experts(config: TrialConfig, notes: list[str]) -> dict:
    """A mixture of experts: ``parallelism.expert_parallel_degree`` (torchtitan 0.3's
    ``ParallelismConfig``: carved from dp_shard × cp × tp, the experts FSDP-sharded over the
    rest, as the trial ran them); the experts themselves are the model config's."""
    spec = config.workload.shape.moe if config.workload.shape is not None else None
    if spec is None and config.ep_degree == 1:
        return {}
    if spec is not None:
        notes.append(
            f"the experts ({spec.num_experts} routed, top-{spec.top_k}, width "
            f"{spec.expert_ffn_size}, {spec.num_shared_experts} shared) are the model "
            "config's, not the job's: set them in BASE_CONFIG's MoE arguments"
        )
    return {"expert_parallel_degree": config.ep_degree}


def torchtitan_module(config: TrialConfig) -> str:
    settings, notes = torchtitan_settings(config)
    family = config.workload.shape.family if config.workload.shape else "llama"
    base_module, base_config = "torchtitan.models.llama3.config_registry", "llama3_debugmodel"
    if config.workload.shape is not None and config.workload.shape.moe is not None:
        # torchtitan's MoE decoder nearest the built-in one: sigmoid routing with the
        # aux-loss-free bias and shared experts (its attention is MLA, not GQA)
        base_module = "torchtitan.models.deepseek_v3.config_registry"
        base_config = "deepseek_v3_debugmodel"
        notes.insert(
            1,
            "the base is torchtitan's DeepSeek-V3 debug model (MLA attention): "
            "change BASE_MODULE / BASE_CONFIG to the model's own",
        )
    elif family != "llama":
        notes.insert(
            1,
            f"torchtitan has no {family.upper()}-style model: the base is its "
            "Llama 3 config; change BASE_MODULE / BASE_CONFIG",
        )
    note_lines = "\n".join(f"- {n}" for n in notes)
    return f'''"""autotune's best layout of {config.workload.name} as a torchtitan job config.

Run: PYTHONPATH=. torchrun --nproc-per-node {config.world_size} -m torchtitan.train \\
         --module torchtitan_config --config autotune_best

What torchtitan cannot express:
{note_lines}
"""

import importlib

BASE_MODULE = {base_module!r}
BASE_CONFIG = {base_config!r}
SETTINGS = {pprint.pformat(settings, sort_dicts=False)}
CANNOT_EXPRESS = {pprint.pformat(notes)}


def autotune_best():
    config = getattr(importlib.import_module(BASE_MODULE), BASE_CONFIG)()
    for section in ("parallelism", "training", "compile"):
        for key, value in SETTINGS[section].items():
            setattr(getattr(config, section), key, value)
    if SETTINGS["float8"]:  # a converter on the model spec, as torchtitan's *_float8 configs
        from torchtitan.components.quantization import Float8LinearConverter

        registry = importlib.import_module(BASE_MODULE.rpartition(".")[0]).model_registry
        config.model_spec = registry(config.model_spec.flavor, converters=[
            Float8LinearConverter.Config(model_compile_enabled=SETTINGS["compile"]["enable"])])
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

    config.activation_checkpoint = {{None: None, "FullAC": FullAC.Config(),
                                     "SelectiveAC": SelectiveAC.Config()}}[
        SETTINGS["activation_checkpoint"]]
    return config
'''


def write_trainer_exports(config: TrialConfig, out: Path) -> list[Path]:
    """Write accelerate_config.yaml and torchtitan_config.py into ``out``."""
    from autotune.export.files import write_text_atomically

    accelerate = out / ACCELERATE_FILE
    write_text_atomically(accelerate, accelerate_yaml(config, decoder_layer_class(config)))
    titan = out / TORCHTITAN_FILE
    write_text_atomically(titan, torchtitan_module(config))
    return [accelerate, titan]
