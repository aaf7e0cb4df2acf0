"""``best_config.json`` of a study's best trial, written with DeepSpeed's ``ds_config.json``
(``ds_config``), the trainers' configs (``trainers``: Accelerate, torchtitan) and Megatron-LM's
arguments (``megatron``).
"""

from __future__ import annotations

from pathlib import Path

from autotune.config import TrialConfig
from autotune.errors import AutotuneError
from autotune.export.ds_config import check_batch_identity, ds_config
from autotune.export.files import write_json_atomically


def best_config_document(
    config: TrialConfig, metrics: dict, env: dict, *, study: str, trial_number: int, db_display: str
) -> dict:
    return {
        "config": config.to_dict(),
        "derived": config.resolved()["derived"],
        "metrics": metrics,
        "environment": env,
        "study": study,
        "trial": trial_number,
        "database": db_display,
        "reproduce": "autotune trial --config best_config.json",
    }


def export_study(database, study_name: str, out_dir: str | Path) -> tuple[Path, ...]:
    """Write best_config.json, ds_config.json, the other trainers' configs (``export.trainers``)
    and megatron_args.txt of a stored study's best trial; their paths, best_config first."""
    from autotune.export.files import write_text_atomically
    from autotune.export.megatron import MEGATRON_FILE, megatron_text
    from autotune.export.trainers import write_trainer_exports
    from autotune.study.leaderboard import build_leaderboard, declare_best

    study = database.get_study(study_name)
    verdict = declare_best(build_leaderboard(database.list_trials(study.id)))
    if verdict is None:
        raise AutotuneError(
            f"study '{study_name}' has no complete trial to export; run or resume the search first"
        )
    best = verdict.pick
    record = database.get_trial(best.trial_id)
    # The pick's confidence interval and, when the runner-up is tied with the fastest within
    # noise, the tie and the rule that chose (leaderboard.declare_best).
    metrics = {
        **record.metrics,
        "median_throughput_tokens_per_s": best.throughput,
        "throughput_spread": best.spread,
        "num_measurements": len(best.throughputs),
        **verdict.to_dict(),
    }
    out = Path(out_dir)
    try:
        ds = ds_config(best.config)
        check_batch_identity(ds, best.config.dp_degree)
        best_path, ds_path = out / "best_config.json", out / "ds_config.json"
        write_json_atomically(
            best_path,
            best_config_document(
                best.config,
                metrics,
                record.env,
                study=study_name,
                trial_number=best.number,
                db_display=database.url_for_display,
            ),
        )
        write_json_atomically(ds_path, ds)
        # megatron_args.txt first: the trainer files' notes name it as the way to run ac_layers
        megatron_path = out / MEGATRON_FILE
        write_text_atomically(megatron_path, megatron_text(best.config))
        others = write_trainer_exports(best.config, out)
    except OSError as e:
        raise AutotuneError(f"cannot write exports to '{out}': {e.strerror}") from None
    return best_path, ds_path, *others, megatron_path
