"""Schema versions, migrations, and sharing the database with Optuna's RDB storage."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sqlite3
import subprocess
import sys

import optuna
import pytest
import sqlalchemy as sa
from db_testdata import count_rows, make_spans, make_trial, timeline_order

from db import Database, StorageError
from db.schema import VERSION_TABLE, Migration, latest_version

LATEST = latest_version(Database.migrations)
"""The version this code writes; the tests below build the one after it."""


def _next_rebuild_trials(op) -> None:
    """A migration of the kind SQLite makes hard: it rebuilds autotune_trials, the parent of
    memory, steps and spans (with foreign keys on, dropping the old table would cascade-delete
    every child row)."""
    op.add_column("autotune_trials", sa.Column("note", sa.Text(), nullable=True))
    with op.batch_alter_table("autotune_trials", recreate="always") as batch:
        batch.alter_column(
            "status", type_=sa.String(64), existing_type=sa.String(32), existing_nullable=False
        )
    op.execute(f"UPDATE autotune_trials SET note = 'migrated from v{LATEST}'")


class DatabaseNext(Database):
    """The same code one schema version later, as a future release would ship it."""

    migrations = Database.migrations + (
        Migration(LATEST + 1, "trials gain a note; status widened", _next_rebuild_trials),
    )


def _failing_next(op) -> None:
    op.add_column("autotune_trials", sa.Column("note", sa.Text(), nullable=True))
    op.execute("UPDATE autotune_no_such_table SET x = 1")


class BrokenDatabaseNext(Database):
    migrations = Database.migrations + (Migration(LATEST + 1, "fails half-way", _failing_next),)


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _stored_version(path) -> int:
    connection = sqlite3.connect(path)
    try:
        return connection.execute(f"SELECT version FROM {VERSION_TABLE}").fetchone()[0]
    finally:
        connection.close()


def test_open_migrates_an_older_schema_and_keeps_the_data(tmp_path):
    path = tmp_path / "old.db"
    url = f"sqlite:///{path}"
    spans = make_spans(5_000, ranks=4)
    with Database.open(url) as current:
        study = current.create_study("s", {"world_size": 4})
        trial_id = current.add_trial(make_trial(study.id, 0, ranks=4), spans)
        before = current.get_trial(trial_id)
        calibration = current.add_calibration(
            study.id, num_trials=1, cluster={"name": "c"}, calibration={"compute_efficiency": 0.5}
        )
    assert _stored_version(path) == LATEST

    with DatabaseNext.open(url) as upgraded:
        assert upgraded.schema_version == LATEST + 1
        assert upgraded.get_trial(trial_id) == before
        assert upgraded.trial_spans(trial_id) == timeline_order(spans)
        assert upgraded.get_study("s") == study
        assert upgraded.latest_calibration(study.id) == calibration
        # Still writable, and the constraints survived the rebuild.
        second = upgraded.add_trial(make_trial(study.id, 1), make_spans(10))
        with pytest.raises(StorageError, match="UNIQUE constraint failed"):
            upgraded.add_trial(make_trial(study.id, 1))
    assert _stored_version(path) == LATEST + 1
    connection = sqlite3.connect(path)
    try:
        notes = connection.execute("SELECT id, note FROM autotune_trials ORDER BY id").fetchall()
        assert notes == [(trial_id, f"migrated from v{LATEST}"), (second, None)]
        assert connection.execute("PRAGMA foreign_key_check").fetchall() == []
    finally:
        connection.close()
    assert count_rows(path, "autotune_rank_memory") == (
        len(before.memory) + len(make_trial(study.id, 1).memory)
    )

    # The current code now meets a schema from its future.
    digest = _digest(path)
    with pytest.raises(StorageError) as excinfo:
        Database.open(url)
    assert str(excinfo.value) == (
        f"database schema version {LATEST + 1} is newer than this "
        f"autotune understands ({LATEST}); upgrade autotune ({url})"
    )
    assert _digest(path) == digest


def test_a_failing_migration_leaves_the_old_schema_untouched(tmp_path):
    path = tmp_path / "old.db"
    url = f"sqlite:///{path}"
    spans = make_spans(100)
    with Database.open(url) as current:
        trial_id = current.add_trial(make_trial(), spans)
    with pytest.raises(
        StorageError,
        match=f"migrating the autotune schema from version {LATEST} "
        f"to {LATEST + 1} failed.*no such table",
    ):
        BrokenDatabaseNext.open(url)
    assert _stored_version(path) == LATEST
    connection = sqlite3.connect(path)
    try:
        columns = [row[1] for row in connection.execute("PRAGMA table_info(autotune_trials)")]
    finally:
        connection.close()
    assert "note" not in columns  # the ALTER TABLE was rolled back with the rest
    with Database.open(url) as current:
        assert current.count_spans(trial_id) == len(spans)


def test_newer_schema_is_refused_before_anything_is_written(tmp_path):
    path = tmp_path / "future.db"
    with Database.open(f"sqlite:///{path}") as database:
        database.add_trial(make_trial())
    connection = sqlite3.connect(path)
    connection.execute(f"UPDATE {VERSION_TABLE} SET version = 7")
    connection.commit()
    connection.close()
    digest = _digest(path)
    for create in (True, False):
        with pytest.raises(
            StorageError,
            match=r"^database schema version 7 is newer than this "
            rf"autotune understands \({LATEST}\); upgrade "
            "autotune",
        ):
            Database.open(f"sqlite:///{path}", create=create)
    assert _digest(path) == digest


def test_create_false_creates_nothing(tmp_path):
    missing = tmp_path / "missing.db"
    with pytest.raises(StorageError, match="no SQLite database at .*missing.db"):
        Database.open(f"sqlite:///{missing}", create=False)
    assert not missing.exists()

    optuna_only = tmp_path / "optuna.db"
    optuna.create_study(storage=f"sqlite:///{optuna_only}", study_name="x")
    with pytest.raises(StorageError, match="holds no autotune data"):
        Database.open(f"sqlite:///{optuna_only}", create=False)
    with sqlite3.connect(optuna_only) as connection:
        tables = [r[0] for r in connection.execute("SELECT name FROM sqlite_master")]
    assert not [t for t in tables if t.startswith("autotune_")]


def test_tables_of_another_program_without_a_version_are_refused(tmp_path):
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE autotune_trials (id INTEGER PRIMARY KEY)")
    with pytest.raises(StorageError, match="has autotune_\\* tables but no schema version"):
        Database.open(f"sqlite:///{path}")


def test_optuna_and_autotune_share_one_sqlite_file(tmp_path):
    path = tmp_path / "shared.db"
    url = f"sqlite:///{path}"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=url, study_name="search-1", direction="maximize")
    study.optimize(lambda trial: -(trial.suggest_float("x", -1, 1) ** 2), n_trials=3)

    with Database.open(url) as database:
        ours = database.create_study("search-1", {"world_size": 2})  # same name: other tables
        trial_id = database.add_trial(make_trial(ours.id, 0), make_spans(200))
        assert database.get_trial(trial_id).config == make_trial().config

    loaded = optuna.load_study(study_name="search-1", storage=url)
    assert len(loaded.trials) == 3 and loaded.best_value <= 0
    loaded.optimize(lambda trial: trial.suggest_float("x", -1, 1), n_trials=1)  # still writable

    # The optuna console script, installed next to this interpreter; optuna has no __main__, so
    # where the script is missing run what it runs (optuna.cli.main).
    script = os.path.join(os.path.dirname(sys.executable), "optuna")
    command = (
        [script]
        if os.path.exists(script)
        else [sys.executable, "-c", "import sys; from optuna.cli import main; sys.exit(main())"]
    )
    listed = subprocess.run(
        command + ["studies", "--storage", url, "-f", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    studies = json.loads(listed.stdout)
    assert [(s["name"], s["n_trials"]) for s in studies] == [("search-1", 4)]

    with sqlite3.connect(path) as connection:
        tables = {
            r[0] for r in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
        optuna_revision = connection.execute("SELECT version_num FROM alembic_version").fetchone()
    assert {"studies", "trials", "alembic_version", "version_info"} <= tables
    ours_tables = {t for t in tables if t.startswith("autotune_")}
    assert ours_tables == {
        "autotune_schema_version",
        "autotune_studies",
        "autotune_trials",
        "autotune_rank_memory",
        "autotune_step_metrics",
        "autotune_span_names",
        "autotune_spans",
        "autotune_calibrations",
        "autotune_rank_nodes",
    }
    assert optuna_revision is not None

    # And the other way round: autotune first, then Optuna creates its tables next to ours.
    second = tmp_path / "autotune-first.db"
    with Database.open(f"sqlite:///{second}") as database:
        trial_id = database.add_trial(make_trial())
    optuna.create_study(storage=f"sqlite:///{second}", study_name="s").optimize(
        lambda trial: trial.suggest_float("x", 0, 1), n_trials=1
    )
    with Database.open(f"sqlite:///{second}") as database:
        assert dataclasses.replace(database.get_trial(trial_id), id=None) == make_trial()
