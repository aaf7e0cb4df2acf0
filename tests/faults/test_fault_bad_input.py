"""Bad input the other suites leave out: one line naming the fix, the documented exit code (2
usage, 1 runtime, 130 interrupted), no traceback, and nothing written.

Run through ``autotune.cli.main.main`` in this process (no interpreter start per case; every case
fails before Ray). The cases already proven elsewhere are listed in docs/reliability.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from fault_checks import complete_trial

from autotune.cli.main import main
from autotune.config import TrialConfig
from autotune.errors import ConfigError
from autotune.export.files import write_json_atomically
from autotune.search.space import SearchSpace
from db import Database
from db.schema import MIGRATIONS, latest_version

ROOT = Path(__file__).resolve().parents[2]


def cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def one_line(result: tuple[int, str, str], code: int, text: str) -> str:
    got, _, err = result
    lines = [line for line in err.splitlines() if line.startswith("autotune:")]
    assert got == code, err
    assert len(lines) == 1 and text in lines[0], err
    assert "Traceback" not in err
    return lines[0]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def study_db(tmp_path) -> Path:
    """A database holding study 's' with one complete trial (and Optuna's tables)."""
    path = tmp_path / "study.db"
    with Database.open(f"sqlite:///{path}") as database:
        study = database.create_study("s", {})
        database.add_trial(complete_trial(study.id))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(f"sqlite:///{path}")
    optuna.create_study(study_name="autotune:s", storage=storage)
    storage.engine.dispose()  # closed, as a finished search leaves it: no -wal/-shm files
    return path


# ---- a workload that does not import -----------------------------------------------------------
@pytest.mark.parametrize(
    "workload, message",
    [
        (
            "no_such_package.module:build",
            "does not import: ModuleNotFoundError: No module named 'no_such_package'",
        ),
        (
            "tests.faults.fault_workloads:no_such_function",
            "module 'tests.faults.fault_workloads' has no function 'no_such_function'",
        ),
        ("broken_on_import:build", "does not import: ZeroDivisionError: division by zero"),
    ],
    ids=["no-module", "no-function", "raises-on-import"],
)
def test_search_with_a_workload_that_does_not_import(
    tmp_path, monkeypatch, capsys, workload, message
):
    (tmp_path / "broken_on_import.py").write_text("1 / 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    db = tmp_path / "new.db"
    one_line(cli(capsys, "search", "--workload", workload, "--db", f"sqlite:///{db}"), 2, message)
    assert not db.exists()  # refused before the database was opened


# ---- the database: missing, corrupt, newer, locked ---------------------------------------------
COMMANDS = {
    "search": ["search", "--trials", "1", "--study", "new"],
    "export": ["export", "--study", "s"],
    "trace": ["trace", "--trial", "1", "-o", "trace.json"],
}


def _newer(path: Path) -> None:
    with contextlib.closing(sqlite3.connect(path)) as connection:
        connection.execute("UPDATE autotune_schema_version SET version = 99")
        connection.commit()


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize(
    "kind, message",
    [
        (
            "damaged",
            (
                "database disk image is malformed; the file is damaged: restore it from a "
                "backup or use a new database"
            ),
        ),
        (
            "newer",
            (
                "database schema version 99 is newer than this autotune understands "
                f"({latest_version(MIGRATIONS)}); upgrade autotune"
            ),
        ),
    ],
    ids=["damaged", "newer"],
)
def test_a_damaged_or_newer_database(
    study_db, tmp_path, monkeypatch, capsys, command, kind, message
):
    """Damaged: an autotune database whose pages after the first (the schema) are overwritten,
    as a disk or a copy cut short leaves it. (A file that is no database at all is in
    tests/cli/test_cli.py and tests/db/test_db_bad_input.py.)"""
    monkeypatch.chdir(tmp_path)
    if kind == "damaged":
        data = study_db.read_bytes()
        study_db.write_bytes(data[:4096] + os.urandom(len(data) - 4096))
    else:
        _newer(study_db)
    before = digest(study_db)
    argv = [COMMANDS[command][0], "--db", f"sqlite:///{study_db}", *COMMANDS[command][1:]]
    one_line(cli(capsys, *argv), 1, message)
    assert digest(study_db) == before  # nothing written
    assert not (tmp_path / "trace.json").exists() and not (tmp_path / "best_config.json").exists()


@pytest.mark.parametrize("command", ["export", "trace"])
def test_a_missing_database_is_not_created_by_readers(tmp_path, monkeypatch, capsys, command):
    monkeypatch.chdir(tmp_path)
    argv = [command, "--db", "sqlite:///missing.db", *COMMANDS[command][1:]]
    one_line(cli(capsys, *argv), 1, f"no SQLite database at {tmp_path / 'missing.db'}")
    assert os.listdir(tmp_path) == []


def test_a_database_locked_by_another_writer(study_db, monkeypatch, capsys):
    """Another process holds the write lock for longer than the busy timeout (30 s; 0.3 s
    here): the search stops with one line naming the cause, having written nothing."""
    monkeypatch.setattr("db.engine.SQLITE_BUSY_TIMEOUT_MS", 300)
    other = sqlite3.connect(study_db, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        line = one_line(
            cli(
                capsys, "search", "--db", f"sqlite:///{study_db}", "--study", "new", "--trials", "1"
            ),
            1,
            "database is locked",
        )
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert line.endswith(
        "another process is writing to it (the search driver must be the "
        "only writer): wait for it to finish or use another database"
    )
    with Database.open(f"sqlite:///{study_db}", create=False) as database:
        assert [s.name for s in database.list_studies()] == ["s"]


# ---- an interrupted export ---------------------------------------------------------------------
def test_export_into_an_unwritable_place(study_db, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    one_line(
        cli(
            capsys,
            "export",
            "--db",
            f"sqlite:///{study_db}",
            "--study",
            "s",
            "--out",
            str(blocker / "out"),
        ),
        1,
        f"cannot write exports to '{blocker / 'out'}'",
    )
    assert sorted(os.listdir(tmp_path)) == ["a-file", "study.db"]  # nothing created


def test_export_interrupted_mid_write_keeps_the_previous_files(
    study_db, tmp_path, capsys, monkeypatch
):
    """Ctrl-C while the second file is half-written: both files are the previous export's and
    no temporary file is left."""
    out = tmp_path / "out"
    assert (
        cli(capsys, "export", "--db", f"sqlite:///{study_db}", "--study", "s", "--out", str(out))[0]
        == 0
    )
    previous = {p.name: p.read_bytes() for p in out.iterdir()}
    with Database.open(f"sqlite:///{study_db}") as database:  # a better trial to export
        database.add_trial(
            complete_trial(
                database.get_study("s").id,
                1,
                metrics={"step_time_s": 0.01, "throughput_tokens_per_s": 51200.0},
            )
        )
    real_dump = json.dump
    calls = []

    def dump_then_interrupt(data, f, **kwargs):
        calls.append(f.name)
        if len(calls) == 2:  # ds_config.json, after best_config.json was replaced
            f.write(json.dumps(data)[:20])
            f.flush()
            raise KeyboardInterrupt
        real_dump(data, f, **kwargs)

    monkeypatch.setattr("autotune.export.files.json.dump", dump_then_interrupt)
    result = cli(
        capsys, "export", "--db", f"sqlite:///{study_db}", "--study", "s", "--out", str(out)
    )
    one_line(result, 130, "autotune: interrupted")
    assert sorted(os.listdir(out)) == [
        "accelerate_config.yaml",
        "best_config.json",
        "ds_config.json",
        "megatron_args.txt",
        "torchtitan_config.py",
    ]  # no temporary
    assert (out / "ds_config.json").read_bytes() == previous["ds_config.json"]
    # best_config.json was complete when replaced: the new trial, whole.
    assert json.loads((out / "best_config.json").read_text())["trial"] == 1


KILLED_WRITER = """
import sys
from pathlib import Path
from autotune.export.files import write_json_atomically
write_json_atomically(Path(sys.argv[1]), {"spans": list(range(5_000_000))})
"""


def test_export_killed_mid_write_leaves_the_target_whole(tmp_path, figures):
    """SIGKILL while the file is being written (no handler runs): the target is the previous
    version, whole; the unfinished data is in a hidden temporary file beside it, never under the
    target's name."""
    target = tmp_path / "best_config.json"
    write_json_atomically(target, {"trial": 0})
    previous = target.read_bytes()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(target)], env=env)
    deadline = time.monotonic() + 60
    partial = []
    while not partial and time.monotonic() < deadline and proc.poll() is None:
        partial = [p for p in tmp_path.glob(".best_config.json.*") if p.stat().st_size > 0]
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert partial, "the writer finished before it could be killed"
    assert target.read_bytes() == previous
    (temporary,) = tmp_path.glob(".best_config.json.*")
    with pytest.raises(json.JSONDecodeError):
        json.loads(temporary.read_text())
    figures["export killed"] = (
        f"killed with {temporary.stat().st_size / 2**20:.1f} MiB in the "
        "hidden temporary file; target unchanged"
    )


# ---- search space values of the wrong type or outside a knob's values ------------------------
@pytest.mark.parametrize(
    "fixed, narrowed",
    [
        ({}, {"zero_stage": [7]}),
        ({"zero_stage": 7}, {}),
        ({}, {"pp_schedule": [1]}),
        ({"bucket_mb": None}, {}),
        ({}, {"activation_checkpointing": [{"full": True}]}),
    ],
    ids=["zero-7", "fix-zero-7", "schedule-1", "bucket-null", "ac-object"],
)
def test_search_space_values_are_checked(fixed, narrowed):
    knob = next(iter({**fixed, **narrowed}))
    with pytest.raises(ConfigError, match=knob):
        SearchSpace(TrialConfig(world_size=2), fixed=fixed, narrowed=narrowed)
