"""Bad URLs, files and records: one-line StorageErrors that name the fix; nothing half-written."""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
import re
from datetime import datetime

import pytest
from db_testdata import count_rows, make_spans, make_trial

from db import Database, RankMemoryRecord, StorageError
from db.storage import SPAN_CHUNK

AUTOTUNE_TABLES = (
    "autotune_trials",
    "autotune_rank_memory",
    "autotune_step_metrics",
    "autotune_spans",
    "autotune_span_names",
)


def _open_error(url: str, **kwargs) -> str:
    with pytest.raises(StorageError) as excinfo:
        Database.open(url, **kwargs)
    message = str(excinfo.value)
    assert "\n" not in message and excinfo.value.exit_code == 1
    return message


@pytest.mark.parametrize(
    "url, expected",
    [
        (
            "not a url",
            "cannot parse database URL 'not a url'; give a SQLAlchemy URL such as "
            "sqlite:///autotune.db",
        ),
        (
            "sqlite//x.db",
            "malformed database URL 'sqlite//x.db': it needs '://' after the dialect, "
            "e.g. sqlite:///x.db",
        ),
        ("x.db", "'x.db' is a file path, not a database URL; use sqlite:///x.db"),
        ("foo://x", "unknown database dialect or driver 'foo' in foo://x; use a SQLAlchemy URL"),
        ("sqlite+nodriver:///x.db", "unknown database dialect or driver 'sqlite+nodriver'"),
        (
            "postgres://user:secret@db.example/x",
            "unknown database dialect or driver 'postgres' in "
            "postgres://user:***@db.example/x; use postgresql://",
        ),
        (
            "postgres//user:secret@db.example/x",
            "malformed database URL 'postgres//user:***@db.example"
            "/x': it needs '://' after the dialect, e.g. "
            "postgresql://user@host/dbname",
        ),
    ],
)
def test_malformed_or_unknown_urls(tmp_path, monkeypatch, url, expected):
    monkeypatch.chdir(tmp_path)
    message = _open_error(url)
    assert message.startswith(expected)
    assert "secret" not in message
    assert os.listdir(tmp_path) == []


def test_unreachable_server_never_shows_the_password():
    url = "postgresql://user:secret@127.0.0.1:1/db"
    message = _open_error(url)
    assert "secret" not in message and "postgresql://user:***@127.0.0.1:1/db" in message
    # No PostgreSQL server runs here; which error comes depends on whether a driver is installed.
    if importlib.util.find_spec("psycopg") is None:
        assert message.endswith("is not installed; pip install 'psycopg[binary]'")
    else:
        assert "check the host and port" in message


def test_a_password_in_the_query_string_is_hidden_too():
    url = "postgresql://user@127.0.0.1:1/db?password=secret&sslmode=disable"
    message = _open_error(url)
    assert "secret" not in message and "?password=***&sslmode=disable" in message


@pytest.mark.parametrize(
    "content", [os.urandom(8192), b"step,time\n1,0.5\n" * 200], ids=["random-bytes", "csv-text"]
)
def test_a_file_that_is_not_a_database(tmp_path, content):
    path = tmp_path / "results.db"
    path.write_bytes(content)
    message = _open_error(f"sqlite:///{path}")
    assert message == (
        f"opening the database failed on sqlite:///{path}: file is not a "
        "database; point the URL at an autotune database or at a new file"
    )
    assert path.read_bytes() == content
    assert sorted(os.listdir(tmp_path)) == ["results.db"]


def test_unwritable_locations(tmp_path):
    missing_dir = tmp_path / "no" / "such" / "dir"
    message = _open_error(f"sqlite:///{missing_dir}/x.db")
    assert message == (
        f"cannot open sqlite:///{missing_dir}/x.db: directory {missing_dir} does "
        "not exist; create it first or choose another path"
    )
    assert not (tmp_path / "no").exists()
    # /proc exists, but no file can be created in it (not even by root).
    message = _open_error("sqlite:////proc/autotune-test.db")
    assert message.startswith(
        "opening the database failed on sqlite:////proc/autotune-test.db: "
        "unable to open database file; check that the path is right and "
        "its directory exists and is writable"
    )
    message = _open_error(f"sqlite:///{tmp_path}")
    assert message.endswith("is a directory; give a file path")


@pytest.mark.skipif(
    os.geteuid() == 0,
    reason="root writes into a chmod 0o555 directory anyway; "
    "the /proc case above covers it under root",
)
def test_read_only_directory(tmp_path):
    directory = tmp_path / "locked"
    directory.mkdir()
    directory.chmod(0o555)
    try:
        message = _open_error(f"sqlite:///{directory}/x.db")
        assert "unable to open database file" in message
    finally:
        directory.chmod(0o755)


def test_read_only_uri(tmp_path):
    path = tmp_path / "ro.db"
    read_only = f"sqlite:///file:{path}?mode=ro&uri=true"
    assert _open_error(read_only) == (
        f"no SQLite database at {path} ({read_only}); a read-only URL (mode=ro) cannot create "
        "one: check the path"
    )
    assert not path.exists()

    with Database.open(f"sqlite:///{path}") as writer:
        trial_id = writer.add_trial(make_trial(), make_spans(50))
    with Database.open(read_only) as reader:
        assert reader.get_trial(trial_id).status == "complete"
        assert reader.count_spans() == count_rows(path, "autotune_spans")
        with pytest.raises(StorageError) as excinfo:
            reader.add_trial(make_trial(), make_spans(50))
        assert str(excinfo.value) == (
            f"storing a trial failed on {read_only}: attempt to write a readonly database; the "
            "database is read-only: use a writable file (and no mode=ro)"
        )
        assert len(reader.list_trials()) == 1


def _bad_span(index, **changes):
    def corrupt(spans):
        spans[index] = dataclasses.replace(spans[index], **changes)
        return spans

    return corrupt


_FAILURES = [
    # Found in Python while converting (exact int checks), in the third chunk: two chunks of
    # 20,000 spans are already in the transaction when it fails.
    (
        _bad_span(2 * SPAN_CHUNK + 7, start_ns="1764000000000000000"),
        f"span {2 * SPAN_CHUNK + 7} has start_ns='1764000000000000000' (str); it must be an int",
    ),
    (
        _bad_span(2 * SPAN_CHUNK + 9, dur_ns=12.5),
        f"span {2 * SPAN_CHUNK + 9} has dur_ns=12.5 (float); it must be an int",
    ),
    # A whole float would pass SQLite's STRICT check (it converts losslessly); refused anyway.
    (
        _bad_span(SPAN_CHUNK + 1, start_ns=1.764e18),
        f"span {SPAN_CHUNK + 1} has start_ns=1.764e+18 (float); it must be an int",
    ),
    (_bad_span(0, rank=None), "span 0 has rank=None (NoneType); it must be an int"),
    (
        _bad_span(SPAN_CHUNK + 2, kind="kernel"),
        f"span {SPAN_CHUNK + 2} has kind 'kernel', not one of compute, comm, p2p, step",
    ),
    (
        lambda spans: spans[:100] + [("not", "a", "span")] + spans[100:],
        "span 100 is a tuple, not a SpanRecord",
    ),
    # Found by the database: the driver cannot bind a 65-bit int; the CHECK constraint refuses a
    # negative duration in the second chunk, after the first was inserted.
    (_bad_span(3, bytes=2**64), "span 3 has bytes outside the 64-bit integer range"),
    (_bad_span(SPAN_CHUNK + 5, dur_ns=-1), f"span {SPAN_CHUNK + 5} has dur_ns=-1; it must be >= 0"),
]
_FAILURE_IDS = [
    "str-start",
    "float-dur",
    "whole-float-start",
    "none-rank",
    "bad-kind",
    "not-a-span",
    "huge-bytes",
    "negative-dur",
]
_FOUND_BY_THE_SERVER = "negative-dur"


@pytest.mark.parametrize(
    "corrupt, expected, db_url",
    [
        pytest.param(corrupt, expected, backend, id=f"{name}-{backend}")
        for (corrupt, expected), name in zip(_FAILURES, _FAILURE_IDS)
        # On PostgreSQL the case its server refuses (a CHECK constraint, after a chunk went in):
        # what Python refuses first is the same code on every backend (trimmed for time).
        for backend in (("sqlite", "postgresql") if name == _FOUND_BY_THE_SERVER else ("sqlite",))
    ],
    indirect=["db_url"],
)
def test_failure_in_the_middle_of_add_trial_stores_nothing(db_url, corrupt, expected):
    with Database.open(db_url) as database:
        study = database.create_study("s", {})
        spans = corrupt(make_spans(3 * SPAN_CHUNK, ranks=8))
        with pytest.raises(StorageError) as excinfo:
            database.add_trial(make_trial(study.id, 0, ranks=8), spans)
        assert str(excinfo.value) == expected + "; nothing was stored"
        for table in AUTOTUNE_TABLES:
            assert count_rows(db_url, table) == 0, table
        assert database.count_spans() == 0 and database.list_trials() == []
        # The database is fine afterwards: the same trial, without the bad span, goes in.
        good = make_spans(3 * SPAN_CHUNK, ranks=8)
        trial_id = database.add_trial(make_trial(study.id, 0, ranks=8), good)
        assert database.count_spans(trial_id) == len(good)


# (change, expected message, backends): checks made in Python run on SQLite alone, those the
# database answers on both.
_BAD_TRIALS = [
    (
        {"status": "done"},
        "trial status 'done' is not one of complete, infeasible_predicted",
        ("sqlite",),
    ),
    (
        {"config": {"layers": {1, 2}}},
        "trial config is not JSON-serialisable (Object of type set "
        "is not JSON serializable); convert it to dicts",
        ("sqlite",),
    ),
    (
        {"created_at": datetime(2025, 1, 1)},
        "trial created_at must be a timezone-aware datetime",
        ("sqlite",),
    ),
    ({"id": 5}, "add_trial stores a new trial (id None), got id 5; use update_trial", ("sqlite",)),
    ({"study_id": 42}, "no study with id 42 in {url}", ("sqlite", "postgresql")),
    (
        {"memory": (RankMemoryRecord(0, "peak", 1, 2), RankMemoryRecord(0, "peak", 3, 4))},
        "storing a trial failed on {url}",
        ("sqlite", "postgresql"),
    ),
]


@pytest.mark.parametrize(
    "change, expected, db_url",
    [
        pytest.param(change, expected, backend, id=f"{'-'.join(change)}-{backend}")
        for change, expected, backends in _BAD_TRIALS
        for backend in backends
    ],
    indirect=["db_url"],
)
def test_bad_trials_store_nothing(db_url, change, expected):
    with Database.open(db_url) as database:
        with pytest.raises(StorageError) as excinfo:
            database.add_trial(dataclasses.replace(make_trial(), **change), make_spans(100))
        message = str(excinfo.value)
        assert message.startswith(expected.format(url=database.url_for_display))
        assert "\n" not in message
    for table in AUTOTUNE_TABLES:
        assert count_rows(db_url, table) == 0, table


def test_duplicate_memory_category_names_the_constraint(db_url):
    with Database.open(db_url) as database:
        trial = dataclasses.replace(
            make_trial(),
            memory=(RankMemoryRecord(0, "peak", 1, 2), RankMemoryRecord(0, "peak", 3, 4)),
        )
        with pytest.raises(StorageError) as excinfo:
            database.add_trial(trial)
    # Each backend's words for the same constraint, then the same hint.
    assert re.search(
        r"UNIQUE constraint failed: autotune_rank_memory\.trial_id|"
        r'violates unique constraint "uq_autotune_rank_memory"',
        str(excinfo.value),
    )
    assert str(excinfo.value).endswith(
        "; a row with that key is already stored (study name, "
        "trial number in its study, or a rank's memory category "
        "or step)"
    )


@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
def test_a_wrong_password_on_a_real_server_is_named_never_shown(postgres, capsys, caplog, debug):
    """The server refuses the password: one line that says so (or the --debug traceback), and
    neither the wrong password nor the right one anywhere in the output or the log."""
    from autotune.cli.main import main

    wrong = "wr0ng-" + postgres.password[::-1]
    url = postgres.url("postgres").replace(postgres.password, wrong)
    caplog.set_level(logging.DEBUG)
    code = main((["--debug"] if debug else []) + ["export", "--db", url])
    out, err = capsys.readouterr()
    assert code == 1
    assert (
        'password authentication failed for user "autotune"; check the user name and password'
    ) in err
    assert "postgresql+psycopg://autotune:***@127.0.0.1:" in err
    assert ("Traceback" in err) is debug
    for secret in (wrong, postgres.password):
        assert secret not in out + err + caplog.text
