"""``autotune search`` as a process of its own, for the tests that interrupt it: its command
line, what it has stored so far, waiting on it, and making sure nothing it started outlives the
test."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
from fault_checks import descendants


def search_args(
    db_url: str,
    out,
    budget: int,
    fixed: dict,
    *extra: str,
    study: str = "interrupted",
    entry: tuple[str, ...] = ("-m", "autotune"),
) -> list[str]:
    """The command line of a search of ``study`` with a budget (and patience) of ``budget``
    trials, no re-measurement, one timed step; ``entry`` runs something else than
    ``python -m autotune`` with the same arguments."""
    fixes = [a for k, v in fixed.items() for a in ("--fix", f"{k}={json.dumps(v)}")]
    return [
        sys.executable,
        *entry,
        "search",
        "--db",
        db_url,
        "--study",
        study,
        "--trials",
        str(budget),
        "--patience",
        str(budget),
        "--top-k",
        "1",
        "--remeasure",
        "0",
        "--timed-steps",
        "1",
        "--out",
        str(out),
        *fixes,
        *extra,
    ]


def counts(path, study: str) -> tuple[int, int, int] | None:
    """(trials stored in the study, Optuna trials of it RUNNING, FAILed); None before the tables
    exist."""
    if not path.exists():
        return None
    try:
        with contextlib.closing(sqlite3.connect(path, timeout=5)) as c:
            stored = c.execute(
                "SELECT count(*) FROM autotune_trials t JOIN autotune_studies s "
                "ON s.id = t.study_id WHERE s.name = ?",
                (study,),
            ).fetchone()[0]
            states = dict(
                c.execute(
                    "SELECT t.state, count(*) FROM trials t JOIN studies s "
                    "ON s.study_id = t.study_id WHERE s.study_name = ? GROUP BY t.state",
                    (f"autotune:{study}",),
                ).fetchall()
            )
    except sqlite3.Error:
        return None
    return stored, states.get("RUNNING", 0), states.get("FAIL", 0)


def wait_for(
    proc: subprocess.Popen, until, pids: set[int], *, exits: bool = False, timeout: float = 120.0
) -> None:
    """Poll until ``until()`` is true, noting the driver's processes; the driver must still run
    then (or, with ``exits``, poll until it has exited)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids |= descendants(proc.pid)
        if proc.poll() is not None:
            assert exits, f"the driver exited early:\n{proc.communicate()[1][-3000:]}"
            return
        if until():
            return
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for the driver: {' '.join(proc.args[2:])}")


@contextlib.contextmanager
def killed_on_failure(procs: list[subprocess.Popen]):
    """Whatever goes wrong, no process the block started outlives it."""
    try:
        yield
    finally:
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # the driver's group, Ray included
                proc.communicate()


def start(procs: list, args: list[str], **kwargs) -> subprocess.Popen:
    """Start ``args`` in a session of its own (so that Ctrl-C can be sent to its whole process
    group, as a terminal sends it), appended to ``procs``."""
    procs.append(
        subprocess.Popen(
            args,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            **kwargs,
        )
    )
    return procs[-1]
