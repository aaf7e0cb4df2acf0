"""``best_config.json`` of a study's best trial, written with DeepSpeed's ``ds_config.json``
(``ds_config``), the trainers' configs (``trainers``: Accelerate, torchtitan) and Megatron-LM's
arguments (``megatron``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from autotune.config import TrialConfig
from autotune.errors import AutotuneError
from autotune.export.ds_config import check_batch_identity, deepspeed_cannot_run, ds_config
from autotune.export.files import write_json_atomically

DS_CONFIG_FILE = "ds_config.json"


class Exports(tuple):
    """The paths written, best_config.json first, and ``left_out``: one line for each file not
    written because its target has no way to run the layout."""

    left_out: tuple[str, ...] = ()

    def __new__(cls, paths, left_out=()) -> Exports:
        exports = super().__new__(cls, paths)
        exports.left_out = tuple(left_out)
        return exports


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


def export_study(
    database, study_name: str, out_dir: str | Path, *, stream: TextIO | None = None
) -> Exports:
    """Write best_config.json, ds_config.json, the other trainers' configs (``export.trainers``)
    and megatron_args.txt of a stored study's best trial; their paths, best_config first. A
    layout DeepSpeed has no way to run gets no ds_config.json (an older one there is removed)
    and a line saying why, on ``stream`` (standard error) and in ``left_out``."""
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
        best_path = out / "best_config.json"
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
        exports = write_layout_exports(best.config, out)
    except OSError as e:
        raise AutotuneError(f"cannot write exports to '{out}': {e.strerror}") from None
    for line in exports.left_out:
        print(line, file=stream if stream is not None else sys.stderr, flush=True)
    return Exports([best_path, *exports], exports.left_out)


def write_layout_exports(config: TrialConfig, out: Path) -> Exports:
    """The targets' files of ``config`` in ``out``: ds_config.json where DeepSpeed can run the
    layout (else none, an older one removed so that it is not taken for this layout's, and a
    line in ``left_out``), the trainers' configs and megatron_args.txt, in that order."""
    from autotune.export.files import write_text_atomically
    from autotune.export.megatron import MEGATRON_FILE, megatron_text
    from autotune.export.trainers import write_trainer_exports

    ds_path, cannot_run = out / DS_CONFIG_FILE, deepspeed_cannot_run(config)
    if cannot_run is None:
        ds = ds_config(config)
        check_batch_identity(ds, config.dp_degree)
        write_json_atomically(ds_path, ds)
    else:
        ds_path.unlink(missing_ok=True)
    # megatron_args.txt first: the trainer files' notes name it as the way to run ac_layers
    megatron_path = out / MEGATRON_FILE
    write_text_atomically(megatron_path, megatron_text(config))
    others = write_trainer_exports(config, out)
    return Exports(
        [*([ds_path] if cannot_run is None else []), *others, megatron_path],
        () if cannot_run is None else (f"{DS_CONFIG_FILE} not written: {cannot_run}",),
    )
