"""The printed leaderboard carries the performance model's step time beside the measured one.

A study in a real SQLite database, its trials stored as the search stores them (no Ray): complete
trials whose metrics hold the prediction the search made before running them (from
``predict_step_time`` on the local CPU cluster), one older trial stored before predictions
existed, one predicted not to fit (a prediction, nothing measured) and one failed. The expected
milliseconds and errors are computed here from the stored numbers.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from autotune.config import TrialConfig
from autotune.layouts import short_name
from autotune.model.cluster import local_cpu_cluster
from autotune.model.perf_model import predict_step_time
from autotune.search.loop import SearchOutcome
from autotune.study.leaderboard import build_leaderboard, format_leaderboard
from db import Database, RankMemoryRecord, TrialRecord

# (micro-batch, measured step time ÷ predicted, tokens/s, store the prediction?): one trial
# the model over-predicts, one it under-predicts (errors of both signs in the MAPE), and one
# stored before the model (measured 0.2 s, no prediction).
COMPLETE = [(1, 0.8, 4_000.0, True), (2, 1.25, 6_000.0, True), (4, None, 2_400.0, False)]
OLDER_STEP_S = 0.2


def config(micro_batch: int, **kw) -> TrialConfig:
    return TrialConfig(world_size=2, device="cpu", micro_batch_size=micro_batch, **kw)


def predicted(c: TrialConfig) -> tuple[float, dict[str, float]]:
    estimate = predict_step_time(c, local_cpu_cluster(c.world_size))
    return estimate.step_time_s, dict(estimate.breakdown)


@pytest.fixture
def study(tmp_path):
    """(database, study id, {trial number: stored metrics})."""
    database = Database.open(f"sqlite:///{tmp_path / 'board.db'}")
    record = database.create_study("board", {"world_size": 2})
    stored = {}
    for number, (mb, ratio, tput, with_prediction) in enumerate(COMPLETE):
        metrics = {
            "step_time_s": OLDER_STEP_S,
            "throughput_tokens_per_s": tput,
            "peak_memory_bytes": 1 << 20,
        }
        if with_prediction:
            seconds, terms = predicted(config(mb))
            metrics |= {
                "step_time_s": seconds * ratio,
                "predicted_step_time_s": seconds,
                "predicted_breakdown": terms,
            }
        database.add_trial(_trial(record.id, number, config(mb), "complete", metrics))
        stored[number] = metrics
    # Predicted not to fit: the search keeps its prediction, nothing was measured.
    over = config(1, activation_checkpointing="full")
    seconds, terms = predicted(over)
    metrics = {"predicted_step_time_s": seconds, "predicted_breakdown": terms}
    database.add_trial(
        _trial(
            record.id,
            3,
            over,
            "infeasible_predicted",
            metrics,
            error="predicted peak over the limit",
        )
    )
    stored[3] = metrics
    database.add_trial(_trial(record.id, 4, config(1, zero_stage=3), "failed", {}, error="boom"))
    stored[4] = {}
    yield database, record.id, stored
    database.close()


def _trial(
    study_id: int, number: int, c: TrialConfig, status: str, metrics: dict, error: str | None = None
) -> TrialRecord:
    return TrialRecord(
        id=None,
        study_id=study_id,
        number=number,
        status=status,
        config=c.resolved(),
        metrics=metrics,
        env={},
        error=error,
        created_at=datetime.now(UTC),
        memory=(RankMemoryRecord(0, "peak", 1 << 20, None),),
    )


def test_entries_carry_the_stored_prediction(study):
    database, study_id, stored = study
    board = build_leaderboard(database.list_trials(study_id))
    assert len(board) == 5
    for e in board:
        metrics = stored[e.number]
        assert e.step_time_s == metrics.get("step_time_s")
        assert e.predicted_step_time_s == metrics.get("predicted_step_time_s")
        if "step_time_s" in metrics and "predicted_step_time_s" in metrics:
            assert e.step_time_error == pytest.approx(
                metrics["predicted_step_time_s"] / metrics["step_time_s"] - 1
            )
        else:
            assert e.step_time_error is None


def columns(row: str, entry) -> list[str]:
    """A printed row's cells after the configuration's name: tok/s, 95% CI, n, step ms,
    pred ms, error, peak MiB, pred MiB, status…"""
    return row.split(short_name(entry.config), 1)[1].split()


def test_printed_leaderboard_shows_predicted_ms_and_error(study):
    database, study_id, stored = study
    board = build_leaderboard(database.list_trials(study_id))
    text = format_leaderboard(SearchOutcome(study_id, board, 3, 1, 1.0, "trial budget"), None)
    lines = text.splitlines()
    assert "step ms   pred ms    error" in lines[0]
    rows = lines[1 : 1 + len(board)]
    errors = []
    for entry, row in zip(board, rows):
        assert int(row.split()[1]) == entry.number
        metrics = stored[entry.number]
        measured, prediction = metrics.get("step_time_s"), metrics.get("predicted_step_time_s")
        expected = [
            f"{measured * 1e3:.1f}" if measured is not None else "-",
            f"{prediction * 1e3:.1f}" if prediction is not None else "-",
            "-",
        ]
        if measured is not None and prediction is not None:
            error = prediction / measured - 1
            expected[2] = f"{error:+.1%}"
            errors.append(error)
        assert columns(row, entry)[3:6] == expected, row
    assert len(errors) == 2 and min(errors) < 0 < max(errors)  # over- and under-predicted
    mape = sum(abs(e) for e in errors) / len(errors)
    assert any(f"MAPE {mape:.1%} over 2 complete trials" in line for line in lines)


def test_a_study_without_predictions_prints_as_before(tmp_path):
    with Database.open(f"sqlite:///{tmp_path / 'old.db'}") as database:
        record = database.create_study("old", {"world_size": 2})
        database.add_trial(
            _trial(
                record.id,
                0,
                config(2),
                "complete",
                {"step_time_s": 0.05, "throughput_tokens_per_s": 9_000.0},
            )
        )
        board = build_leaderboard(database.list_trials(record.id))
        text = format_leaderboard(SearchOutcome(record.id, board, 1, 0, 1.0, "trial budget"), None)
    assert board[0].predicted_step_time_s is None and board[0].step_time_error is None
    assert columns(text.splitlines()[1], board[0])[3:6] == ["50.0", "-", "-"]
    assert "MAPE" not in text and "pred ms =" not in text
