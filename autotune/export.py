"""Exports of a study's best configuration: ``best_config.json`` and DeepSpeed's ``ds_config.json``
(Accelerate's and torchtitan's configs: ``trainer_exports``).

DeepSpeed keys follow its configuration reference (deepspeed.ai/docs/config-json):
``train_batch_size`` must equal ``train_micro_batch_size_per_gpu × gradient_accumulation_steps ×
data-parallel size`` (DeepSpeed asserts it), and ZeRO bucket sizes are counted in elements.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from autotune.config import MIXED_PRECISIONS, PRECISION_COMPUTE_DTYPE, TrialConfig
from autotune.errors import AutotuneError, ConfigError

ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def _precision_sections(precision: str) -> dict:
    """DeepSpeed's ``bf16`` / ``fp16`` sections. Both keep fp32 master weights and optimizer
    state (DeepSpeed's mixed precision); ``fp16.loss_scale`` 0 is its dynamic loss scale,
    starting at 2^initial_scale_power as 16-mixed's does (``parallel/precision.py``)."""
    dtype = PRECISION_COMPUTE_DTYPE[precision]
    fp16: dict = {"enabled": dtype == "float16"}
    if precision == "16-mixed":
        fp16.update(loss_scale=0, initial_scale_power=16, loss_scale_window=2000,
                    hysteresis=1, min_loss_scale=1)
    return {"bf16": {"enabled": dtype == "bfloat16"}, "fp16": fp16}


def ds_config(config: TrialConfig) -> dict:
    """The same choice in DeepSpeed's keys, with notes where DeepSpeed cannot follow it."""
    w = config.workload
    device_type = "cpu" if config.device == "cpu" else "cuda"
    precision = config.resolved_precision(device_type)
    bucket_elements = int(config.bucket_mb * 2**20
                          // ELEMENT_BYTES[config.compute_dtype(device_type)])
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
        ds["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if config.activation_checkpointing != "none":
        ds["activation_checkpointing"] = {"partition_activations": False,
                                          "contiguous_memory_optimization": False}
    if config.tp_degree > 1:
        ds["tensor_parallel"] = {"autotp_size": config.tp_degree}
    notes = []
    if precision not in MIXED_PRECISIONS and precision != "32-true":
        notes.append(f"precision {precision} (no fp32 master copy) has no DeepSpeed "
                     "equivalent: its bf16/fp16 modes keep fp32 master weights and optimizer "
                     "state, as bf16-mixed/16-mixed do")
    if config.pp_degree > 1:
        notes.append(f"pipeline parallelism (pp_degree {config.pp_degree}, schedule "
                     f"{config.pp_schedule}) is configured in DeepSpeed's PipelineModule "
                     "(num_stages), not in this file")
        if config.zero_stage >= 2:
            notes.append("DeepSpeed's pipeline engine refuses ZeRO stages 2 and 3; with "
                         "DeepSpeed use zero_stage ≤ 1 for this layout")
    if config.tp_degree > 1 and config.zero_stage > 2:
        notes.append("DeepSpeed AutoTP needs ZeRO stage ≤ 2")
    if config.activation_checkpointing == "selective":
        notes.append("selective recomputation (attention core) has no DeepSpeed key: apply "
                     "deepspeed.checkpointing to the attention core in the model")
    if notes:
        ds["autotune_notes"] = notes
    return ds


def check_batch_identity(ds: dict, dp_degree: int) -> None:
    """The identity DeepSpeed asserts at start-up."""
    expected = (ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"]
                * dp_degree)
    if ds["train_batch_size"] != expected:
        raise ConfigError(f"train_batch_size {ds['train_batch_size']} != micro × accumulation "
                          f"× dp = {expected}")


def best_config_document(config: TrialConfig, metrics: dict, env: dict, *, study: str,
                         trial_number: int, db_display: str) -> dict:
    return {
        "config": config.to_dict(),
        "derived": config.resolved()["derived"],
        "metrics": metrics,
        "environment": env,
        "study": study, "trial": trial_number, "database": db_display,
        "reproduce": "autotune trial --config best_config.json",
    }


def write_json_atomically(path: Path, data: dict) -> None:
    def write(f) -> None:
        json.dump(data, f, indent=2)
        f.write("\n")
    _write_atomically(path, write)


def write_text_atomically(path: Path, text: str) -> None:
    _write_atomically(path, lambda f: f.write(text))


def _write_atomically(path: Path, write) -> None:
    """Write to a temporary file in the same folder, then rename: an interrupted export never
    leaves a half-written file behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            write(f)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it owner-only; a plain file is not
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def export_study(database, study_name: str, out_dir: str | Path) -> tuple[Path, ...]:
    """Write best_config.json, ds_config.json and the other trainers' configs
    (``trainer_exports``) of a stored study's best trial; their paths, best_config first."""
    from autotune.leaderboard import build_leaderboard, declare_best
    from autotune.trainer_exports import write_trainer_exports

    study = database.get_study(study_name)
    verdict = declare_best(build_leaderboard(database.list_trials(study.id)))
    if verdict is None:
        raise AutotuneError(f"study '{study_name}' has no complete trial to export; run or "
                            "resume the search first")
    best = verdict.pick
    record = database.get_trial(best.trial_id)
    # The pick's confidence interval and, when the runner-up is tied with the fastest within
    # noise, the tie and the rule that chose (leaderboard.declare_best).
    metrics = {**record.metrics, "median_throughput_tokens_per_s": best.throughput,
               "throughput_spread": best.spread, "num_measurements": len(best.throughputs),
               **verdict.to_dict()}
    out = Path(out_dir)
    try:
        ds = ds_config(best.config)
        check_batch_identity(ds, best.config.dp_degree)
        best_path, ds_path = out / "best_config.json", out / "ds_config.json"
        write_json_atomically(best_path, best_config_document(
            best.config, metrics, record.env, study=study_name, trial_number=best.number,
            db_display=database.url_for_display))
        write_json_atomically(ds_path, ds)
        others = write_trainer_exports(best.config, out)
    except OSError as e:
        raise AutotuneError(f"cannot write exports to '{out}': {e.strerror}") from None
    return best_path, ds_path, *others
