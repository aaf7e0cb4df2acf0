"""Two drivers write two studies into one PostgreSQL database at once, and both come out intact.

Each writer is a process that does what a search driver does with the database, in the same
order and through the same code: it opens a new database (creating the schema unless the other
did), makes Optuna's storage (``autotune.search.search._optuna_storage``, creating Optuna's tables
unless the other did), creates its two studies (autotune's and Optuna's), and then, from a
common start, asks Optuna for trials and stores each with its memory, steps and spans, a
calibration after it, and tells Optuna its value. The trials themselves are not run: running
them would start one Ray cluster per driver, which measures the machine, not the database. The
first trial of each writer names the same 60 new ops in opposite orders, the case in which two
transactions wait on each other's unique-index entries unless interning is serialised.
"""

from __future__ import annotations

import dataclasses
import multiprocessing

import optuna
from db_testdata import count_rows, make_spans, make_trial, timeline_order
from password_scan import rows_holding

from db import Database, SpanRecord

STUDIES = ("alpha", "beta")
TRIALS = 3
NEW_NAMES = [f"aten::op_{i:03d}" for i in range(60)]


def _spans(writer: int, number: int) -> list[SpanRecord]:
    """make_spans' data; the first trial of each writer starts with the 60 new names, in
    opposite orders for the two writers."""
    spans = make_spans(2_000, seed=100 * writer + number)
    if number > 0:
        return spans
    names = NEW_NAMES if writer == 0 else NEW_NAMES[::-1]
    return [
        SpanRecord(0, 0, "compute", name, "op", spans[0].start_ns + i, 10)
        for i, name in enumerate(names)
    ] + spans


def _value(writer: int, number: int) -> float:
    return 1000.0 * (writer + 1) + number


def _driver(url: str, writer: int, barrier, results) -> None:
    try:
        from autotune.search.search import _optuna_storage

        name = STUDIES[writer]
        with Database.open(url) as database:
            storage = _optuna_storage(database)
            optuna.logging.set_verbosity(optuna.logging.WARNING)
            study = optuna.create_study(
                study_name=f"autotune:{name}",
                storage=storage,
                direction="maximize",
                load_if_exists=True,
            )
            record = database.create_study(name, {"writer": writer})
            barrier.wait(timeout=300)
            for _ in range(TRIALS):
                trial = study.ask()
                trial.suggest_int("micro_batch_size", 1, 8)
                database.add_trial(
                    make_trial(record.id, trial.number), _spans(writer, trial.number)
                )
                database.add_calibration(
                    record.id,
                    num_trials=trial.number + 1,
                    cluster={},
                    calibration={"trial": trial.number},
                )
                study.tell(trial, _value(writer, trial.number))
        results.put((writer, ""))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        results.put((writer, f"{type(e).__name__}: {e}"))


def test_two_drivers_write_two_studies_into_one_database_at_once(postgres):
    url = postgres.create_database("two_drivers")
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(len(STUDIES)), context.Queue()
    drivers = [
        context.Process(target=_driver, args=(url, writer, barrier, results))
        for writer in range(len(STUDIES))
    ]
    for driver in drivers:
        driver.start()
    outcomes = sorted(results.get(timeout=500) for _ in drivers)
    for driver in drivers:
        driver.join(timeout=60)
    assert outcomes == [(0, ""), (1, "")]

    with Database.open(url, create=False) as database:
        assert [s.name for s in database.list_studies()] in (list(STUDIES), list(STUDIES[::-1]))
        for writer, name in enumerate(STUDIES):
            study = database.get_study(name)
            trials = database.list_trials(study.id)
            assert [t.number for t in trials] == list(range(TRIALS))
            for trial in trials:
                expected = make_trial(study.id, trial.number)
                assert dataclasses.replace(trial, id=None) == expected
                assert database.trial_spans(trial.id) == timeline_order(
                    _spans(writer, trial.number)
                )
            assert [c.calibration["trial"] for c in database.list_calibrations(study.id)] == list(
                range(TRIALS)
            )
            optuna_trials = optuna.load_study(study_name=f"autotune:{name}", storage=url).trials
            assert [(t.number, t.state.name, t.value) for t in optuna_trials] == [
                (n, "COMPLETE", _value(writer, n)) for n in range(TRIALS)
            ]
        assert database.count_spans() == sum(
            len(_spans(w, n)) for w in range(len(STUDIES)) for n in range(TRIALS)
        )
    distinct = {
        (s.kind, s.name, s.category, s.group)
        for w in range(len(STUDIES))
        for n in range(TRIALS)
        for s in _spans(w, n)
    }
    assert count_rows(url, "autotune_span_names") == len(distinct)  # each interned once
    assert rows_holding(url, postgres.password) == []
