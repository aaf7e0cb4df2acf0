"""Security: what the local Ray cluster exposes, where a database password can show, and that
nothing read from the database is unpickled or evaluated."""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fault_checks import command_line, complete_trial, descendants, listening_sockets

from autotune.cli.main import main
from autotune.config import TrialConfig
from db import Database, SpanRecord

ROOT = Path(__file__).resolve().parents[2]
TINY = TrialConfig(
    world_size=2,
    micro_batch_size=4,
    num_warmup_steps=0,
    num_timed_steps=1,
    num_profiled_steps=0,
    device="cpu",
)
RAY_DASHBOARD_PORT = 8265


@pytest.fixture
def cluster_listeners(executor):
    """The listening sockets of this process's local Ray cluster, with a warm worker group
    (its ranks and their process group listen too)."""
    executor.run(TINY)
    listeners = listening_sockets(descendants(os.getpid()))
    assert {command_line(s.pid).split()[0] for s in listeners} >= {"ray::RankWorker"}
    return listeners


def test_local_ray_starts_no_dashboard(cluster_listeners):
    assert [s for s in cluster_listeners if s.port == RAY_DASHBOARD_PORT] == []
    heads = {
        command_line(s.pid)
        for s in cluster_listeners
        if "ray/dashboard/dashboard.py" in command_line(s.pid)
    }
    # Ray still runs its dashboard head process for its own bookkeeping; without the web UI.
    assert all("--disable-frontend" in head for head in heads)


def test_local_ray_listens_on_loopback_only(cluster_listeners):
    exposed = sorted(
        {
            f"{s.address}:{s.port} ({command_line(s.pid)[:40]})"
            for s in cluster_listeners
            if not s.loopback
        }
    )
    assert exposed == []


# ---- database passwords ------------------------------------------------------------------------
SECRET = "Pa55-w0rd-8f3e"
URL = f"postgresql://autotune:{SECRET}@127.0.0.1:1/autotune"
COMMANDS = {
    "search": ["search", "--db", URL, "--trials", "1"],
    "export": ["export", "--db", URL],
    "trace": ["trace", "--db", URL, "--trial", "1", "-o", "trace.json"],
    "trial": ["trial", "--db", URL],
}


@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_database_password_is_never_shown(tmp_path, monkeypatch, capsys, caplog, command, debug):
    """A server URL with a password that cannot connect (no server on port 1; no driver, or a
    refused connection): the error, the --debug traceback and every log record show '***'."""
    monkeypatch.chdir(tmp_path)
    caplog.set_level(logging.DEBUG)
    code = main((["--debug"] if debug else []) + COMMANDS[command])
    out, err = capsys.readouterr()
    assert code == 1
    assert "postgresql://autotune:***@127.0.0.1:1/autotune" in err
    assert ("Traceback" in err) is debug
    assert SECRET not in out + err + caplog.text
    assert os.listdir(tmp_path) == []


# ---- nothing read is unpickled or evaluated ----------------------------------------------------
class _Touch:
    """Unpickling this runs ``touch PATH``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return os.system, (f"touch {self.path}",)


def test_stored_payloads_come_back_as_text(tmp_path, capsys):
    """A pickle (protocol 0 is text) and a Python expression stored in every free-text field
    come back as the same strings, through db reads, the export and the trace; running either
    would create the sentinel file."""
    sentinel = tmp_path / "was-executed"
    pickled = pickle.dumps(_Touch(sentinel), protocol=0).decode("ascii")
    expression = f"__import__('pathlib').Path({str(sentinel)!r}).touch()"
    assert pickle.loads(pickled.encode()) == 0 and sentinel.exists()  # the payload is live
    sentinel.unlink()
    url = f"sqlite:///{tmp_path / 'payload.db'}"
    span = SpanRecord(
        0, 0, "compute", pickled, expression, 1_764_000_000_000_000_000, 1000, 0, expression
    )
    with Database.open(url) as database:
        study = database.create_study("s", {"note": pickled, "formula": expression})
        trial_id = database.add_trial(
            complete_trial(
                study.id,
                error=pickled,
                metrics={**complete_trial(0).metrics, "note": pickled},
                env={"note": expression},
                created_at=datetime.now(UTC),
            ),
            [span],
        )
        trial = database.get_trial(trial_id)
        assert database.get_study("s").spec == {"note": pickled, "formula": expression}
        assert (trial.error, trial.metrics["note"], trial.env["note"]) == (
            pickled,
            pickled,
            expression,
        )
        assert database.list_trials(study.id) == [trial]
        assert database.trial_spans(trial_id) == [span]
    assert main(["export", "--db", url, "--study", "s", "--out", str(tmp_path)]) == 0
    best = json.loads((tmp_path / "best_config.json").read_text())
    assert (best["metrics"]["note"], best["environment"]["note"]) == (pickled, expression)
    assert (
        main(["trace", "--db", url, "--trial", str(trial_id), "-o", str(tmp_path / "trace.json")])
        == 0
    )
    trace = (tmp_path / "trace.json").read_text()
    assert json.dumps(pickled) in trace and json.dumps(expression) in trace
    capsys.readouterr()
    assert not sentinel.exists()


UNSAFE = re.compile(
    r"\bpickle\b|\bcPickle\b|\bdill\b|\bmarshal\b|\bshelve\b|PickleType|"
    r"(?<![.\w])eval\(|(?<![.\w])exec\(|yaml\.load\(|yaml\.unsafe_load"
)


def test_nothing_that_reads_the_database_can_unpickle_or_evaluate():
    """The database layer and everything that reads through it: no pickle-like loader, no
    eval/exec, and no column of a type that unpickles."""
    from sqlalchemy import PickleType

    from db.models import Base

    readers = [
        path
        for folder in ("db", "dashboards", "autotune/study", "autotune/export", "autotune/cli")
        for path in sorted((ROOT / folder).glob("*.py"))
    ] + [ROOT / "autotune" / "search" / name for name in ("search.py", "loop.py")]
    assert all(path.is_file() for path in readers) and len(readers) > 20
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in readers
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if UNSAFE.search(line)
    ]
    assert found == []
    columns = [c for table in Base.metadata.tables.values() for c in table.columns]
    assert columns and not [c for c in columns if isinstance(c.type, PickleType)]
