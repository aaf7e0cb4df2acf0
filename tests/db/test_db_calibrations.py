"""A study's calibrations: stored and read back whole, newest wins, and a database of the schema
before them (version 1) gains their table on opening, its data intact; on SQLite and
PostgreSQL."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from db_testdata import count_rows, make_spans, make_trial, timeline_order

from db import CalibrationRecord, Database, StorageError
from db.models import CalibrationRow
from db.schema import MIGRATIONS, VERSION_TABLE, latest_version

LATEST = latest_version(MIGRATIONS)

CLUSTER = {
    "name": "cpu-local",
    "num_nodes": 1,
    "devices_per_node": 2,
    "device": {"name": "cpu", "peak_flops": {"float32": 8e10}},
    "intra_node": {"bandwidth_gbs": 2.0, "latency_us": 100.0, "busbw_curve": {}},
}
CALIBRATION = {"compute_efficiency": 0.31, "comm_efficiency": 0.8, "step_overhead_s": 1.5e-3}
RESIDUALS = {
    "trials": [{"number": 0, "measured_s": 0.05, "predicted_s": 0.051}],
    "mape": 0.02,
    "links": {"intra_node": {"latency_s": 1e-4, "residual": 0.03}},
}


@pytest.fixture
def database(db_url):
    with Database.open(db_url) as db:
        yield db


def test_round_trip_and_the_newest_is_the_latest(database):
    study = database.create_study("s", {"world_size": 2})
    other = database.create_study("other", {"world_size": 2})
    assert database.latest_calibration(study.id) is None
    assert database.list_calibrations(study.id) == []
    before = datetime.now(UTC)
    first = database.add_calibration(
        study.id, num_trials=0, cluster=CLUSTER, calibration={}, residuals=None
    )
    second = database.add_calibration(
        study.id, num_trials=3, cluster=CLUSTER, calibration=CALIBRATION, residuals=RESIDUALS
    )
    database.add_calibration(other.id, num_trials=9, cluster={}, calibration={})
    assert isinstance(second, CalibrationRecord)
    assert (
        second.study_id,
        second.num_trials,
        second.cluster,
        second.calibration,
        second.residuals,
    ) == (study.id, 3, CLUSTER, CALIBRATION, RESIDUALS)
    assert first.residuals == {} and second.id > first.id
    assert before <= second.created_at <= datetime.now(UTC)
    assert second.created_at.tzinfo is not None
    assert database.latest_calibration(study.id) == second
    assert database.list_calibrations(study.id) == [first, second]
    with pytest.raises(dataclasses.FrozenInstanceError):
        second.num_trials = 4  # type: ignore[misc]


def test_calibrations_go_with_their_study_and_bad_input_is_one_line(database):
    study = database.create_study("s", {})
    with pytest.raises(StorageError, match="no study with id 999 .*create the study first"):
        database.add_calibration(999, num_trials=0, cluster={}, calibration={})
    with pytest.raises(StorageError, match="num_trials must be an int ≥ 0"):
        database.add_calibration(study.id, num_trials=-1, cluster={}, calibration={})
    with pytest.raises(StorageError, match="the calibration is not JSON-serialisable"):
        database.add_calibration(study.id, num_trials=0, cluster={}, calibration={"x": object()})
    assert database.latest_calibration(study.id) is None  # nothing half-stored
    database.add_calibration(study.id, num_trials=0, cluster=CLUSTER, calibration={})
    # On the database's own connections (SQLite enforces foreign keys only when told to).
    with database._engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM autotune_studies WHERE id = :id"), {"id": study.id})
    assert count_rows(database.connect_url, "autotune_calibrations") == 0


def _make_version_1(url: str) -> None:
    """A database as version 1 wrote it: versions 2 and 3 only added the calibration and the
    rank-node tables, so the version-1 layout is today's without them."""
    engine = sa.create_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(sa.text("DROP TABLE autotune_rank_nodes"))
            connection.execute(sa.text("DROP INDEX ix_autotune_calibrations_study"))
            connection.execute(sa.text("DROP TABLE autotune_calibrations"))
            connection.execute(sa.text(f"UPDATE {VERSION_TABLE} SET version = 1"))
    finally:
        engine.dispose()


def _layout(url: str, table: str) -> tuple:
    engine = sa.create_engine(url)
    try:
        inspector = sa.inspect(engine)
        columns = [
            (c["name"], str(c["type"]), c["nullable"], bool(c.get("primary_key")))
            for c in inspector.get_columns(table)
        ]
        indexes = sorted(
            (i["name"], tuple(i["column_names"]), bool(i["unique"]))
            for i in inspector.get_indexes(table)
        )
        keys = [
            (
                tuple(f["constrained_columns"]),
                f["referred_table"],
                tuple(f["referred_columns"]),
                f.get("options", {}).get("ondelete"),
            )
            for f in inspector.get_foreign_keys(table)
        ]
        return columns, indexes, keys
    finally:
        engine.dispose()


def test_a_version_1_database_gains_the_calibration_table(db_url):
    url = db_url
    spans = make_spans(300)
    with Database.open(url) as database:
        study = database.create_study("s", {"world_size": 2})
        trial_id = database.add_trial(make_trial(study.id, 0), spans)
        before = database.get_trial(trial_id)
    _make_version_1(url)
    engine = sa.create_engine(url)
    assert "autotune_calibrations" not in sa.inspect(engine).get_table_names()
    engine.dispose()

    with Database.open(url) as migrated:
        assert migrated.schema_version == LATEST
        assert migrated.get_trial(trial_id) == before
        assert migrated.trial_spans(trial_id) == timeline_order(spans)
        assert migrated.latest_calibration(study.id) is None
        stored = migrated.add_calibration(
            study.id, num_trials=1, cluster=CLUSTER, calibration=CALIBRATION, residuals=RESIDUALS
        )
        assert migrated.latest_calibration(study.id) == stored
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            assert connection.scalar(sa.text(f"SELECT version FROM {VERSION_TABLE}")) == LATEST
            if url.startswith("sqlite"):
                assert connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall() == []
        # The migrated table is the one a new database gets: the models' table, made in its
        # place on the same backend.
        migrated = _layout(url, "autotune_calibrations")
        with engine.begin() as connection:
            CalibrationRow.__table__.drop(connection)
            CalibrationRow.__table__.create(connection)
        assert _layout(url, "autotune_calibrations") == migrated
    finally:
        engine.dispose()
