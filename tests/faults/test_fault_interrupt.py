"""Ctrl-C ends ``autotune`` within a few seconds, whatever the load and whatever step of the
unwinding does not come back (``autotune.cli.interrupt``).

A driver on a loaded 2-core machine once failed to exit within 90 s of SIGINT (issue 23,
defect 12). The unwinding after a ``KeyboardInterrupt`` has unbounded steps (Ray's shutdown
joins threads and waits for processes; the interpreter's exit joins leftover threads; an
interrupt raised inside a finaliser is dropped and the search goes on), so the test does not
wait for a loaded machine to happen to hang: ``stalled_driver.py`` is the CLI whose
``ray.shutdown`` never returns, with CPU burners keeping every core busy from the Ctrl-C on.
The command must still exit 130 with its one line, take every process it started with it, and
leave a study that resumes.

Bounds here are liveness bounds, twice the guard's own ``FORCE_EXIT_AFTER_S``, not speeds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import driver_process
import optuna
import pytest
from cpu_burners import cpu_burners
from driver_process import counts, killed_on_failure, wait_for
from fault_checks import running, wait_gone

from autotune.cli.interrupt import EXIT_INTERRUPTED, FORCE_EXIT_AFTER_S, interrupt_guard
from autotune.search.search import Search, SearchSpec
from db import Database

ROOT = Path(__file__).resolve().parents[2]
FIXED = {
    "tp_degree": 1,
    "pp_degree": 1,
    "zero_stage": 0,
    "activation_checkpointing": "none",
    "cp_degree": 1,
    "dp_replicate": 1,
}
BUDGET = 18
"""The configurations FIXED leaves at world 2 (micro-batch 1, 2, 4 × overlap × bucket): more
than the search can run before the interrupt."""
EXIT_BOUND_S = 2 * FORCE_EXIT_AFTER_S
"""Liveness bound on the exit after Ctrl-C."""
BURNERS = max(2, os.cpu_count() or 2)
"""Busy loops: one per core at least."""


def _lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("autotune:")]


def test_ctrl_c_ends_a_search_whose_shutdown_hangs_on_a_busy_machine(executor, tmp_path, figures):
    path = tmp_path / "interrupt.db"
    url = f"sqlite:///{path}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    stalled = (str(Path(__file__).with_name("stalled_driver.py")),)
    procs: list[subprocess.Popen] = []
    pids: set[int] = set()
    with killed_on_failure(procs):
        proc = driver_process.start(
            procs,
            driver_process.search_args(url, tmp_path, BUDGET, FIXED, study="busy", entry=stalled),
            cwd=tmp_path,
            env=env,
        )
        wait_for(proc, lambda: min((counts(path, "busy") or (0, 0, 0))[:2]) >= 1, pids, timeout=300)
        stored_before = counts(path, "busy")[0]
        # The load is on from the Ctrl-C to the exit, the unwinding it must not stall: Ray's
        # start and the first trial need not run under it too (40 s of the suite's time).
        with cpu_burners(BURNERS):
            os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in a terminal: the whole group
            sent = time.monotonic()
            try:
                _, stderr = proc.communicate(timeout=EXIT_BOUND_S)
            except subprocess.TimeoutExpired:
                pytest.fail(f"the driver did not exit within {EXIT_BOUND_S:g}s of SIGINT")
            exited_s = time.monotonic() - sent
    left = wait_gone(pids)
    assert proc.returncode == EXIT_INTERRUPTED, stderr
    assert _lines(stderr) == ["autotune: interrupted"] and "Traceback" not in stderr, stderr
    # Ray's GCS, raylet, agents and the rank workers went with it, though Ray never shut down.
    assert pids and left == []
    figures["interrupt under load"] = (
        f"{BURNERS} CPU burners, ray.shutdown stalled: exit "
        f"{exited_s:.1f}s after SIGINT, {len(pids)} processes "
        "gone"
    )

    # Nothing stored is lost, and the study resumes: the cut-short trial is failed, one more
    # runs, none twice.
    stored, running_at_interrupt, _ = counts(path, "busy")
    assert stored >= stored_before >= 1 and running_at_interrupt <= 1
    spec = SearchSpec(
        world_size=2,
        n_trials=stored + 1,
        patience=None,
        fixed=FIXED,
        num_timed_steps=1,
        top_k=1,
        remeasure_repeats=0,
        study_name="busy",
    )
    with Database.open(url) as database:
        Search.open(spec, database, executor, resume=True, out=None).run()
        trials = database.list_trials(database.get_study("busy").id)
    assert len(trials) == stored + 1 and all(t.status == "complete" for t in trials)
    assert len({json.dumps(t.config, sort_keys=True) for t in trials}) == len(trials)
    states = [
        t.state.name for t in optuna.load_study(study_name="autotune:busy", storage=url).trials
    ]
    assert "RUNNING" not in states and states.count("FAIL") == running_at_interrupt


_IGNORES_CTRL_C = textwrap.dedent("""
    import signal, subprocess, sys, time
    from autotune.cli.interrupt import interrupt_guard
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with interrupt_guard(grace_s=float(sys.argv[1])):
        # The command goes on after Ctrl-C, as one whose KeyboardInterrupt is raised inside a
        # finaliser and dropped. A handler that only says so, rather than a KeyboardInterrupt
        # caught, so that no second one can escape between the catch and the next try.
        signal.signal(signal.SIGINT, lambda *_: print("dropped", flush=True))
        print(child.pid, flush=True)
        while True:
            time.sleep(0.05)
""")


def _ignoring_ctrl_c(grace_s: float) -> tuple[subprocess.Popen, int]:
    """A process that goes on after every Ctrl-C under the guard, and the pid of its child."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _IGNORES_CTRL_C, str(grace_s)],
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    return proc, int(proc.stdout.readline())


@pytest.mark.parametrize("second_ctrl_c", [False, True], ids=["grace", "second"])
def test_the_guard_ends_a_command_that_goes_on_after_ctrl_c(second_ctrl_c):
    """One Ctrl-C: ended when the grace runs out (1 s here). Two: ended at once, long before
    the grace (60 s here) could."""
    grace_s = 60.0 if second_ctrl_c else 1.0
    proc, child = _ignoring_ctrl_c(grace_s)
    try:
        proc.send_signal(signal.SIGINT)
        if second_ctrl_c:
            # Two SIGINTs sent before the first is handled are one pending signal: send the
            # second once the first has been dropped, however long a loaded machine takes.
            assert proc.stdout.readline() == "dropped\n"
            proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=EXIT_BOUND_S)
    finally:
        proc.kill()
        if running(child):  # it holds the pipes: a failure must report, not hang
            os.kill(child, signal.SIGKILL)
        proc.communicate()
    assert proc.returncode == EXIT_INTERRUPTED, stderr
    assert _lines(stderr) == ["autotune: interrupted"]
    assert wait_gone([child]) == [] and not running(child)  # what it started went with it


def test_the_guard_leaves_nothing_behind_without_ctrl_c():
    import signal as signals
    import threading

    before = signals.set_wakeup_fd(-1)
    signals.set_wakeup_fd(before)
    with interrupt_guard():
        listening = signals.set_wakeup_fd(-1)
        signals.set_wakeup_fd(listening)
    assert listening >= 0 and listening != before  # it listened while the block ran
    assert signals.set_wakeup_fd(before) == before  # and gave the previous one back
    time.sleep(0.1)
    assert not any(t.name == "autotune-interrupt" for t in threading.enumerate())
