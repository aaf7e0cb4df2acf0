"""Where each rank ran: stored with its trial, read back by get_trial and list_trials, refused
whole when malformed, and added to a version-2 database (before the table) on opening."""

from __future__ import annotations

import dataclasses
import sqlite3

import pytest
import sqlalchemy as sa
from db_testdata import make_trial

from db import Database, RankNodeRecord, StorageError
from db.schema import MIGRATIONS, VERSION_TABLE, latest_version

NODES = (
    RankNodeRecord(0, "a" * 56, "host-1"),
    RankNodeRecord(1, "a" * 56, "host-1"),
    RankNodeRecord(2, "b" * 56, "host-2"),
    RankNodeRecord(3, "b" * 56, "host-2"),
)


def test_nodes_round_trip_and_bad_ones_store_nothing(tmp_path):
    with Database.open(f"sqlite:///{tmp_path / 'n.db'}") as database:
        study = database.create_study("s", {})
        placed = database.add_trial(
            dataclasses.replace(make_trial(study.id, 0, ranks=4), nodes=NODES)
        )
        unplaced = database.add_trial(make_trial(study.id, 1))
        assert database.get_trial(placed).nodes == NODES
        assert database.get_trial(unplaced).nodes == ()
        assert [t.nodes for t in database.list_trials(study.id)] == [NODES, ()]
        bad = dataclasses.replace(make_trial(study.id, 2), nodes=(RankNodeRecord(0, 7, "h"),))
        with pytest.raises(StorageError, match=r"trial nodes\[0\] .* str node_id"):
            database.add_trial(bad)
        duplicate = dataclasses.replace(make_trial(study.id, 3), nodes=NODES[:1] * 2)
        with pytest.raises(StorageError):
            database.add_trial(duplicate)
        assert len(database.list_trials(study.id)) == 2  # nothing half-stored


def test_a_version_2_database_gains_the_rank_node_table(tmp_path):
    path = tmp_path / "v2.db"
    url = f"sqlite:///{path}"
    with Database.open(url) as database:
        study = database.create_study("s", {})
        trial_id = database.add_trial(make_trial(study.id, 0))
        before = database.get_trial(trial_id)
    connection = sqlite3.connect(path)
    try:  # version 2's layout: today's without the rank-node table
        connection.execute("DROP TABLE autotune_rank_nodes")
        connection.execute(f"UPDATE {VERSION_TABLE} SET version = 2")
        connection.commit()
    finally:
        connection.close()
    with Database.open(url) as migrated:
        assert migrated.schema_version == latest_version(MIGRATIONS) >= 3
        assert migrated.get_trial(trial_id) == before
        placed = migrated.add_trial(
            dataclasses.replace(make_trial(study.id, 1, ranks=4), nodes=NODES)
        )
        assert migrated.get_trial(placed).nodes == NODES
    fresh = tmp_path / "fresh.db"
    Database.open(f"sqlite:///{fresh}").close()
    assert _columns(url) == _columns(f"sqlite:///{fresh}")


def _columns(url: str) -> tuple:
    engine = sa.create_engine(url)
    try:
        inspector = sa.inspect(engine)
        return (
            [
                (c["name"], str(c["type"]), c["nullable"])
                for c in inspector.get_columns("autotune_rank_nodes")
            ],
            sorted(
                tuple(u["column_names"])
                for u in inspector.get_unique_constraints("autotune_rank_nodes")
            ),
            [
                (tuple(f["constrained_columns"]), f["referred_table"])
                for f in inspector.get_foreign_keys("autotune_rank_nodes")
            ],
        )
    finally:
        engine.dispose()
