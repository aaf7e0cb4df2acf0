"""Concluding a trial (``search/conclude.py``): each outcome's verdict, and the one function
that applies it to a real Optuna study and a real database."""

from __future__ import annotations

import optuna
import pytest

from autotune.config import GIB, TrialConfig, WorkloadSpec
from autotune.errors import PlacementError, TrialFailed
from autotune.search import conclude
from autotune.search.conclude import CONSTRAINT_ATTR, Concluder, Known
from autotune.search.strategies.base import PassedOver
from autotune.status import TrialStatus
from db import Database

LIMIT = 4 * GIB
CONFIG = TrialConfig(
    workload=WorkloadSpec(family="gpt", size="tiny", seq_len=64, global_batch_size=16),
    world_size=2,
    device="cpu",
)


class NoCalibration:
    def predict(self, config):
        return {"predicted_step_time_s": 0.25}


def test_each_outcome_has_its_verdict():
    screened = conclude.of_screen(5 * GIB, 6 * GIB, LIMIT, "too big")
    assert (screened.status, screened.value, screened.excess_gib, screened.peak) == (
        TrialStatus.INFEASIBLE_PREDICTED,
        0.0,
        2.0,
        5 * GIB,
    )  # (6 − 4) GiB over
    oom = conclude.of_failure(TrialFailed("CUDA out of memory", kind="oom"), 3 * GIB)
    assert (oom.status, oom.excess_gib, oom.peak) == (TrialStatus.INFEASIBLE_MEASURED, 1.0, 3 * GIB)
    placed = conclude.of_failure(PlacementError("tp 4 > 2 per node"), None)
    assert (placed.status, placed.excess_gib, placed.error) == (
        TrialStatus.FAILED,
        None,
        "not run: tp 4 > 2 per node",
    )
    # Proposed again: infeasible is told at least 1e-9 over, feasible its (≤ 0) excess.
    over = conclude.of_known(Known(TrialStatus.INFEASIBLE_MEASURED, 0.0, 0), LIMIT)
    assert (over.excess_gib, over.store) == (1e-9, False)
    fine = conclude.of_known(Known(TrialStatus.COMPLETE, 900.0, 3 * GIB), LIMIT)
    assert (fine.value, fine.excess_gib) == (900.0, -1.0)
    assert conclude.of_known(Known(TrialStatus.COMPLETE, 900.0, 3 * GIB), None).excess_gib is None
    assert conclude.of_known(Known(TrialStatus.FAILED, 0.0, 0), LIMIT) is conclude.DROPPED
    skipped = conclude.of_passed(PassedOver(CONFIG, "slow"), "")
    assert (skipped.status, skipped.error, skipped.peak) == (
        TrialStatus.SKIPPED_PREDICTED,
        "skipped: slow",
        0,
    )


@pytest.fixture
def books(tmp_path):
    db = Database.open(f"sqlite:///{tmp_path / 'c.db'}")
    study_id = db.create_study("c", {}).id
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    return Concluder(study, db, study_id, NoCalibration()), study, db, study_id


def test_conclude_sets_the_constraint_stores_and_tells_once(books):
    concluder, study, db, study_id = books
    trial = study.ask()
    concluder.predictions[trial.number] = {"predicted_step_time_s": 0.5}
    verdict = conclude.of_screen(5 * GIB, 6 * GIB, LIMIT, "predicted peak 5 GiB > limit 4 GiB")
    concluder.conclude(trial, CONFIG, verdict, predicted=5 * GIB)
    (told,) = study.trials
    assert told.state == optuna.trial.TrialState.COMPLETE and told.value == 0.0
    assert told.user_attrs[CONSTRAINT_ATTR] == 2.0
    (stored,) = db.list_trials(study_id)
    assert (stored.number, stored.status, stored.error) == (
        0,
        TrialStatus.INFEASIBLE_PREDICTED,
        "predicted peak 5 GiB > limit 4 GiB",
    )
    assert stored.metrics["predicted_step_time_s"] == 0.5  # the trial's own prediction
    assert concluder.known[CONFIG] == Known(TrialStatus.INFEASIBLE_PREDICTED, 0.0, 5 * GIB)


def test_a_failed_or_repeated_trial_is_told_failed_and_a_repeat_not_stored(books):
    concluder, study, db, study_id = books
    concluder.conclude(
        study.ask(),
        CONFIG,
        conclude.of_failure(TrialFailed("NCCL timeout", kind="error"), 2 * GIB),
        predicted=2 * GIB,
    )
    concluder.conclude(study.ask(), CONFIG, conclude.DROPPED)
    states = [t.state for t in study.trials]
    assert states == [optuna.trial.TrialState.FAIL] * 2
    (stored,) = db.list_trials(study_id)  # the dropped one is not stored
    assert (stored.status, stored.error) == (TrialStatus.FAILED, "NCCL timeout")


def test_a_passed_over_configuration_is_stored_with_no_trial(books):
    concluder, study, db, study_id = books
    concluder.conclude(
        None, CONFIG, conclude.of_passed(PassedOver(CONFIG, "slow"), ""), predicted=GIB
    )
    assert study.trials == []
    (stored,) = db.list_trials(study_id)
    assert (stored.number, stored.status, stored.error) == (
        None,
        TrialStatus.SKIPPED_PREDICTED,
        "skipped: slow",
    )
    assert stored.metrics["predicted_step_time_s"] == 0.25  # the calibration's, asked now
