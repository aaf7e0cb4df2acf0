"""The lookups that raise (``find_or_raise_by_id`` on the models) and the loading of a trial's
child rows through relationships (``selectinload``), on SQLite and PostgreSQL."""

from __future__ import annotations

import dataclasses
import random
from datetime import UTC

import pytest
import sqlalchemy as sa
from db_testdata import make_spans, make_trial
from sqlalchemy.orm import Session

from db import Database, RankNodeRecord, StorageError
from db.models import StudyRow, TrialRow


def _trial_with_children(study_id: int, number: int, seed: int):
    """A trial whose memory and step rows come in a shuffled order and whose nodes come in
    reverse rank order: what is read back must keep the first two as given and sort the third
    by rank (``TrialRecord``'s documented orders)."""
    rng = random.Random(seed)
    trial = make_trial(study_id, number, ranks=3)
    memory = list(trial.memory)
    steps = list(trial.steps)
    rng.shuffle(memory)
    rng.shuffle(steps)
    nodes = tuple(
        RankNodeRecord(rank, f"node-{seed}-{rank}", f"host{rank % 2}") for rank in (2, 1, 0)
    )
    return dataclasses.replace(trial, memory=tuple(memory), steps=tuple(steps), nodes=nodes)


def _expected(trial, trial_id: int):
    """The record a read must give, built from the input alone."""
    return dataclasses.replace(
        trial,
        id=trial_id,
        created_at=trial.created_at.astimezone(UTC),
        nodes=tuple(sorted(trial.nodes, key=lambda n: n.rank)),
    )


def test_child_rows_come_with_their_trial_in_their_order(db_url):
    with Database.open(db_url) as database:
        studies = [database.create_study(name, {}) for name in ("a", "b")]
        inputs = {}
        # Interleaved studies, so that a trial's children are not contiguous in their tables.
        for number in range(3):
            for study in studies:
                trial = _trial_with_children(study.id, number, seed=10 * study.id + number)
                inputs[database.add_trial(trial)] = trial
        lone = make_trial()  # no study, no nodes
        inputs[database.add_trial(lone)] = lone
        expected = {trial_id: _expected(trial, trial_id) for trial_id, trial in inputs.items()}
        oldest_first = [expected[i] for i in sorted(expected)]

        assert database.list_trials() == oldest_first
        for study in studies:
            assert database.list_trials(study.id) == [
                trial for trial in oldest_first if trial.study_id == study.id
            ]
        for trial_id, record in expected.items():
            assert database.get_trial(trial_id) == record


def test_list_trials_reads_children_in_one_query_per_relationship(tmp_path):
    """Four SELECTs for 30 trials, as for one: the children are not read per trial."""
    statements = []

    def count(conn, cursor, statement, *args):
        if statement.lstrip().upper().startswith("SELECT"):
            statements.append(statement)

    with Database.open(f"sqlite:///{tmp_path / 'a.db'}") as database:
        study = database.create_study("s", {})
        for number in range(30):
            database.add_trial(_trial_with_children(study.id, number, seed=number))
        sa.event.listen(sa.engine.Engine, "before_cursor_execute", count)
        try:
            trials = database.list_trials(study.id)
        finally:
            sa.event.remove(sa.engine.Engine, "before_cursor_execute", count)
    assert len(trials) == 30 and all(len(t.nodes) == 3 for t in trials)
    assert len(statements) == 4, statements


def test_find_or_raise_by_id(db_url):
    with Database.open(db_url) as database:
        study = database.create_study("s", {})
        trial_id = database.add_trial(make_trial(study.id, 0), make_spans(10))
        engine = sa.create_engine(database.connect_url, poolclass=sa.pool.NullPool)
        try:
            with Session(engine) as session:
                assert TrialRow.find_or_raise_by_id(trial_id, session, "DB").number == 0
                assert StudyRow.find_or_raise_by_id(study.id, session, "DB").name == "s"
                with pytest.raises(StorageError) as missing_trial:
                    TrialRow.find_or_raise_by_id(trial_id + 1, session, "DB")
                with pytest.raises(StorageError) as missing_study:
                    StudyRow.find_or_raise_by_id(study.id + 1, session, "DB")
        finally:
            engine.dispose()
    assert str(missing_trial.value) == (
        f"no trial with id {trial_id + 1} in DB; check the id (each stored trial's id is printed)"
    )
    assert str(missing_study.value) == (
        f"no study with id {study.id + 1} in DB; create the study first"
    )


def test_every_lookup_of_a_missing_trial_says_the_same(tmp_path):
    url = f"sqlite:///{tmp_path / 'a.db'}"
    with Database.open(url) as database:
        messages = set()
        for call in (
            lambda: database.get_trial(7),
            lambda: database.trial_spans(7),
            lambda: database.update_trial(7, status="failed"),
        ):
            with pytest.raises(StorageError) as excinfo:
                call()
            messages.add(str(excinfo.value))
    assert messages == {
        (f"no trial with id 7 in {url}; check the id (each stored trial's id is printed)")
    }
