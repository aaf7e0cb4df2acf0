"""Round trips through real SQLite files and a real PostgreSQL server: what is stored is what is
read back, as frozen records. Tests on ``database`` run on both backends."""

from __future__ import annotations

import dataclasses
import json
import math
import sqlite3
from datetime import UTC

import pytest
import sqlalchemy as sa
from db_testdata import count_rows, make_spans, make_trial, timeline_order

from db import (
    Database,
    RankMemoryRecord,
    SpanRecord,
    StepMetricRecord,
    StorageError,
    StudyRecord,
    TrialRecord,
)
from db.models import Base
from db.schema import MIGRATIONS
from db.storage import SPAN_CHUNK


@pytest.fixture
def database(db_url):
    database = Database.open(db_url)
    yield database
    database.close()


@pytest.fixture
def db_path(tmp_path):
    return tmp_path / "autotune.db"


@pytest.fixture
def sqlite_database(db_path):
    database = Database.open(f"sqlite:///{db_path}")
    yield database
    database.close()


def test_trial_with_memory_steps_and_spans_round_trips(database):
    study = database.create_study("gpt2-8gpu", {"world_size": 2, "budget": {"trials": 10}})
    trial = make_trial(study.id, 0)
    spans = make_spans(3_000)
    trial_id = database.add_trial(trial, spans)

    stored = database.get_trial(trial_id)
    assert stored == dataclasses.replace(trial, id=trial_id)
    assert stored.config == trial.config and stored.metrics["mfu"] is None
    assert stored.memory == trial.memory and stored.steps == trial.steps
    # Stored at +02:00, read back as the same instant in UTC.
    assert stored.created_at == trial.created_at
    assert stored.created_at.tzinfo is UTC

    assert database.trial_spans(trial_id) == timeline_order(spans)
    assert database.trial_spans(trial_id, rank=1) == [
        s for s in timeline_order(spans) if s.rank == 1
    ]
    assert database.count_spans(trial_id) == database.count_spans() == len(spans)
    ties = [s for s in spans if s.kind == "step"]
    assert ties, "the data must contain spans with equal starts on one rank"


def test_reads_are_frozen_records_not_orm_rows(database):
    study = database.create_study("s", {})
    trial_id = database.add_trial(make_trial(study.id, 0), make_spans(20))
    trial = database.get_trial(trial_id)
    records = [
        study,
        database.get_study("s"),
        trial,
        trial.memory[0],
        trial.steps[0],
        database.trial_spans(trial_id)[0],
        database.list_trials()[0],
        database.list_studies()[0],
    ]
    expected_types = [
        StudyRecord,
        StudyRecord,
        TrialRecord,
        RankMemoryRecord,
        StepMetricRecord,
        SpanRecord,
        TrialRecord,
        StudyRecord,
    ]
    for record, expected in zip(records, expected_types):
        assert type(record) is expected and not isinstance(record, Base)
        first_field = dataclasses.fields(record)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(record, first_field, 99)
    database.close()
    assert trial.memory[0].measured_bytes == 4_000_000  # still readable with the database closed


def test_studies_create_get_list_duplicate_missing(database):
    first = database.create_study("alpha", {"seq_len": 1024})
    second = database.create_study("beta", {"seq_len": 2048})
    assert database.get_study("beta") == second
    assert database.list_studies() == [first, second]
    assert first.created_at.tzinfo is UTC

    with pytest.raises(StorageError, match="a study named 'alpha' already exists") as excinfo:
        database.create_study("alpha", {})
    assert "\n" not in str(excinfo.value)
    with pytest.raises(StorageError) as excinfo:
        database.get_study("gamma")
    assert str(excinfo.value) == (
        f"no study named 'gamma' in {database.url_for_display}; existing: alpha, beta"
    )
    assert excinfo.value.exit_code == 1
    assert len(database.list_studies()) == 2


def test_list_trials_by_study_with_memory_and_steps(database):
    a = database.create_study("a", {})
    b = database.create_study("b", {})
    a0 = database.add_trial(make_trial(a.id, 0))
    b0 = database.add_trial(make_trial(b.id, 0, ranks=1))
    a1 = database.add_trial(make_trial(a.id, 1, status="infeasible_predicted"))
    lone = database.add_trial(make_trial(None, None, status="failed"))

    in_a = database.list_trials(a.id)
    assert [t.id for t in in_a] == [a0, a1]
    assert in_a == [database.get_trial(a0), database.get_trial(a1)]
    assert [t.id for t in database.list_trials()] == [a0, b0, a1, lone]
    assert database.list_trials(b.id)[0].memory == make_trial(ranks=1).memory
    assert database.get_trial(lone).study_id is None


def test_update_trial(database):
    trial_id = database.add_trial(make_trial(status="running"))
    database.update_trial(trial_id, status="failed", error="rank 1: CUDA out of memory")
    database.update_trial(trial_id, status="complete", metrics={"step_time_s": 0.04})
    trial = database.get_trial(trial_id)
    assert (trial.status, trial.metrics, trial.error) == (
        "complete",
        {"step_time_s": 0.04},
        "rank 1: CUDA out of memory",
    )
    with pytest.raises(StorageError, match="no trial with id 999"):
        database.update_trial(999, status="complete")
    with pytest.raises(StorageError, match="trial status 'done' is not one of complete"):
        database.update_trial(trial_id, status="done")
    with pytest.raises(StorageError, match="no trial with id 999"):
        database.get_trial(999)
    with pytest.raises(StorageError, match="no trial with id 999"):
        database.trial_spans(999)


def test_spans_from_a_generator_across_chunks(database):
    spans = make_spans(SPAN_CHUNK * 2 + 123, ranks=8, seed=1)
    trial_id = database.add_trial(make_trial(ranks=8), (s for s in spans))
    assert database.count_spans(trial_id) == len(spans)
    assert database.trial_spans(trial_id, rank=7) == [
        s for s in timeline_order(spans) if s.rank == 7
    ]
    empty = database.add_trial(make_trial())
    assert database.trial_spans(empty) == [] and database.count_spans(empty) == 0
    assert database.count_spans() == len(spans)


def test_core_insert_path_stores_the_same_spans(sqlite_database):
    """Drivers with named parameters (psycopg2's pyformat) take Core's insert(); same result."""
    database = sqlite_database
    spans = make_spans(SPAN_CHUNK + 50, ranks=4, seed=2)
    fast_id = database.add_trial(make_trial(ranks=4), spans)
    database._spans._executemany_sql = None  # what SpanWriter sets for a named paramstyle
    core_id = database.add_trial(make_trial(ranks=4), spans)
    assert database.trial_spans(core_id) == database.trial_spans(fast_id) == timeline_order(spans)


def test_span_strings_are_interned_once(database, db_url):
    spans = make_spans(2_000)
    database.add_trial(make_trial(), spans)
    database.add_trial(make_trial(), spans)
    distinct = {(s.kind, s.name, s.category, s.group) for s in spans}
    assert count_rows(db_url, "autotune_span_names") == len(distinct)
    assert count_rows(db_url, "autotune_spans") == 2 * len(spans)


def test_reopen_and_concurrent_reader_see_committed_data(db_url, database):
    trial_id = database.add_trial(make_trial(), make_spans(100))
    reader = Database.open(db_url, create=False)
    try:
        assert reader.get_trial(trial_id) == database.get_trial(trial_id)
        assert reader.schema_version == database.schema_version == len(MIGRATIONS) + 1
    finally:
        reader.close()
    database.close()
    with Database.open(db_url) as reopened:
        assert reopened.trial_spans(trial_id) == timeline_order(make_spans(100))


def test_sqlite_file_is_wal_and_spans_are_strict_without_rowid(db_path, sqlite_database):
    sqlite_database.add_trial(make_trial(), make_spans(10))
    connection = sqlite3.connect(db_path)
    try:
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        (sql,) = connection.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'autotune_spans'"
        ).fetchone()
        assert "WITHOUT ROWID" in sql and "STRICT" in sql
    finally:
        connection.close()


def test_foreign_keys_are_enforced(database):
    """On the database's own connections (SQLite enforces foreign keys only when told to)."""
    trial_id = database.add_trial(make_trial(), make_spans(10))
    with database._engine.connect() as connection:
        with pytest.raises(sa.exc.IntegrityError, match="(?i)foreign key"):
            connection.execute(
                sa.text(
                    "INSERT INTO autotune_rank_memory (trial_id, rank, "
                    "category) VALUES (:trial, 0, 'peak')"
                ),
                {"trial": trial_id + 1},
            )
    assert count_rows(database.connect_url, "autotune_rank_memory") == len(make_trial().memory)


def _strict_json(text: str):
    """Parses ``text`` as RFC 8259 JSON: the bare NaN/Infinity tokens are refused."""

    def refuse(token):
        raise ValueError(f"{token} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_non_finite_floats_round_trip_as_strict_json(database, db_url):
    """PostgreSQL's json type refuses NaN and Infinity: they are stored as tagged objects, on
    both backends, and read back as the same floats; a string "NaN" stays a string."""
    metrics = {
        "loss": math.nan,
        "mfu": math.inf,
        "spread": [-math.inf, 1.5, None, "NaN"],
        "nested": {"ratio": math.nan, "ok": 0.25},
    }
    study = database.create_study("s", {"memory_limit_gib": math.inf})
    trial_id = database.add_trial(dataclasses.replace(make_trial(study.id, 0), metrics=metrics))
    other_id = database.add_trial(make_trial(study.id, 1))
    database.update_trial(other_id, status="failed", metrics={"loss": -math.inf})
    database.add_calibration(
        study.id,
        num_trials=1,
        cluster={},
        calibration={"x": math.nan},
        residuals={"mape": math.inf},
    )

    # json.dumps writes NaN and infinities as tokens on both sides: equal text, equal floats.
    assert json.dumps(database.get_trial(trial_id).metrics) == json.dumps(metrics)
    assert math.isinf(database.get_study("s").spec["memory_limit_gib"])
    assert database.get_trial(other_id).metrics == {"loss": -math.inf}
    calibration = database.latest_calibration(study.id)
    assert math.isnan(calibration.calibration["x"]) and calibration.residuals == {"mape": math.inf}
    assert json.dumps(database.list_trials(study.id)[0].metrics) == json.dumps(metrics)

    # What the database holds is strict JSON, read by the server itself.
    with database._engine.connect() as connection:
        stored = connection.scalar(
            sa.text("SELECT CAST(metrics AS TEXT) FROM autotune_trials WHERE id = :id"),
            {"id": trial_id},
        )
    assert _strict_json(stored)["loss"] == {"$float": "NaN"}
    assert _strict_json(stored)["spread"][:1] == [{"$float": "-Infinity"}]


def test_bare_nan_tokens_written_before_the_encoding_still_read(db_path, sqlite_database):
    trial_id = sqlite_database.add_trial(make_trial())
    with sqlite3.connect(db_path) as connection:
        connection.execute(
            "UPDATE autotune_trials SET metrics = ? WHERE id = ?",
            ('{"loss": NaN, "mfu": -Infinity}', trial_id),
        )
    metrics = sqlite_database.get_trial(trial_id).metrics
    assert math.isnan(metrics["loss"]) and metrics["mfu"] == -math.inf
