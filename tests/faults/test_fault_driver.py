"""The driver itself: ``autotune search`` interrupted with Ctrl-C mid-search and resumed, while a
second search writes to the same SQLite file and another process reads it as the dashboard does.

One scenario, run once for the module (about half a minute; its figures are in
docs/reliability.md):

1. ``autotune search`` (study 'interrupted') runs in a session of its own with a budget of its
   whole space (72 configurations), which it cannot spend before the interrupt: once a trial is
   stored and the next one is running, the whole process group gets SIGINT, as Ctrl-C in a
   terminal sends it. The interrupt is keyed to the database, not to the clock: however fast
   or slow the trials run, the driver is still searching when it comes (a budget of 5 out of 9
   configurations was once spent before a loaded machine's poll saw the first trial).
2. ``autotune search --resume`` continues the study with a budget of the trials stored at the
   interrupt plus ``NUM_RESUMED``. Once it has stored a new trial, a second search (study
   'second') writes to the same file from this test's process, on the session's Ray cluster.

Throughout, ``read_while_writing.py`` reads studies, trials and spans in a loop and rebuilds
each study's dashboard report as it grows.

The second writer is this process rather than another ``autotune`` process: a second driver
would start its own workers (and, without ``--ray-address``, a Ray node), which doubles the
scenario's time on two cores; what is under test, two processes writing one SQLite file through
their own connections, is the same. For the same reason the resumed driver joins the session's
Ray cluster; the interrupted one starts its own node, as a user's first search does, and its
Ctrl-C must take that node's processes with it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import driver_process
import optuna
import pytest
from driver_process import counts, killed_on_failure, wait_for
from fault_checks import wait_gone
from read_while_writing import trial_digest

from autotune.config import TrialConfig
from autotune.search.search import Search, SearchSpec, base_config
from autotune.search.space import SearchSpace
from db import Database

ROOT = Path(__file__).resolve().parents[2]
FIXED = {"tp_degree": 1, "pp_degree": 1, "zero_stage": 0, "cp_degree": 1, "dp_replicate": 1}
SPACE_SIZE = 72
"""Configurations left by FIXED at world 2: micro-batch 1, 2, 4 × no, selective, op, full
recomputation × overlap on, off × bucket 5, 25, 100 MB (all DDP on the tiny GPT, equally
cheap). The interrupted search's budget is all of them."""
NUM_RESUMED = 4
"""Trials the resumed search runs (its budget is the trials stored at the interrupt plus
these): the one the interrupt cut short, and enough after its first new trial to write while
the second search does."""
SECOND_FIXED = {**FIXED, "overlap_enabled": True, "bucket_mb": 25.0}


def search_args(db_url: str, out: Path, budget: int, *extra: str) -> list[str]:
    return driver_process.search_args(db_url, out, budget, FIXED, *extra)


def digests(url: str) -> dict[int, str]:
    """Every stored trial's digest (record, memory, steps, spans), by trial id."""
    with Database.open(url, create=False) as database:
        return {t.id: trial_digest(t, database.trial_spans(t.id)) for t in database.list_trials()}


def optuna_states(url: str, study: str) -> list[str]:
    return [
        t.state.name for t in optuna.load_study(study_name=f"autotune:{study}", storage=url).trials
    ]


@dataclasses.dataclass
class Scenario:
    url: str
    out: Path
    interrupted: subprocess.CompletedProcess
    stored_at_interrupt: int
    """Trials of the study stored when the interrupted driver had exited."""
    before_interrupt: dict[int, str]
    """Digests of the trials stored when SIGINT was sent."""
    running_at_interrupt: int
    """Optuna trials of the study left RUNNING by the interrupt (the trial it cut short)."""
    interrupted_left: list[int]
    resumed: subprocess.CompletedProcess
    resumed_budget: int
    resumed_left: list[int]
    second_study_id: int
    reader: dict
    final: dict[int, str]
    figures: dict


@pytest.fixture(scope="module")
def scenario(executor, tmp_path_factory) -> Scenario:
    work = tmp_path_factory.mktemp("driver")
    path, out = work / "shared.db", work / "out"
    url = f"sqlite:///{path}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # The second search's worker group, warm before phase 2 so that it writes at once.
    executor.run(
        TrialConfig(
            world_size=2,
            micro_batch_size=4,
            num_warmup_steps=0,
            num_timed_steps=1,
            num_profiled_steps=0,
            device="cpu",
        )
    )

    procs: list[subprocess.Popen] = []
    with killed_on_failure(procs):
        return _run_scenario(executor, work, path, out, url, env, procs)


def _run_scenario(
    executor, work: Path, path: Path, out: Path, url: str, env: dict, procs: list
) -> Scenario:
    figures = {}
    stop = work / "stop-reading"
    reader = driver_process.start(
        procs,
        [
            sys.executable,
            str(Path(__file__).with_name("read_while_writing.py")),
            url,
            str(stop),
            str(work),
        ],
        env=env,
    )
    # 1. Ctrl-C in the middle of the search, whose budget it cannot have spent by then.
    assert (
        len(SearchSpace(base_config(SearchSpec(world_size=2, device="cpu")), fixed=FIXED))
        == SPACE_SIZE
    )
    start = time.monotonic()
    proc = driver_process.start(procs, search_args(url, out, SPACE_SIZE), cwd=work, env=env)
    pids: set[int] = set()
    wait_for(proc, lambda: min((counts(path, "interrupted") or (0, 0, 0))[:2]) >= 1, pids)
    before = digests(url)
    time.sleep(0.2)  # into the running trial
    os.killpg(proc.pid, signal.SIGINT)
    sent = time.monotonic()
    stdout, stderr = proc.communicate(timeout=90)
    figures["interrupt"] = (
        f"first trial stored {sent - start - 0.2:.1f}s after start; exit "
        f"{time.monotonic() - sent:.1f}s after SIGINT; {len(pids)} processes"
    )
    interrupted = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    interrupted_left = wait_gone(pids)
    figures["interrupt"] += f", all gone {time.monotonic() - sent:.1f}s after SIGINT"
    stored_at_interrupt, running, _ = counts(path, "interrupted")

    assert 1 <= stored_at_interrupt < SPACE_SIZE

    # 2. Resume, with a second writer and a reader. The resumed driver joins the session's Ray
    # cluster (``--ray-address``), beside the second search's warm group: what it is judged on
    # (the study finished, nothing rerun, the driver gone) does not hang on whose node it is,
    # and a node of its own cost 20-30 CPU-seconds on two cores (step 1 keeps that case).
    import ray

    start = time.monotonic()
    resumed_budget = stored_at_interrupt + NUM_RESUMED
    joined = ("--ray-address", ray.get_runtime_context().gcs_address)
    proc = driver_process.start(
        procs, search_args(url, out, resumed_budget, "--resume", *joined), cwd=work, env=env
    )
    pids = set()
    # Until the resumed search has stored a new trial (its worker group is up); the others are
    # still to come.
    wait_for(proc, lambda: (counts(path, "interrupted") or (0,))[0] > stored_at_interrupt, pids)
    first_new_s = time.monotonic() - start
    second = SearchSpec(
        world_size=2,
        n_trials=3,
        patience=None,
        device="cpu",
        fixed=SECOND_FIXED,
        narrowed={"activation_checkpointing": ["none"]},
        num_warmup_steps=0,
        num_timed_steps=1,
        num_profiled_steps=1,
        top_k=1,
        remeasure_repeats=0,
        study_name="second",
    )
    with Database.open(url) as database:
        second_start = time.monotonic()
        outcome = Search.open(second, database, executor, out=None).run()
        second_s = time.monotonic() - second_start
    wait_for(proc, lambda: False, pids, exits=True)
    stdout, stderr = proc.communicate(timeout=30)
    resumed = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    stop.touch()
    read_out, read_err = reader.communicate(timeout=60)
    assert reader.returncode == 0, read_err
    figures["resume"] = (
        f"resumed search {time.monotonic() - start:.1f}s (first new trial "
        f"stored at {first_new_s:.1f}s); the second search {second_s:.1f}s "
        "while it ran"
    )
    return Scenario(
        url,
        out,
        interrupted,
        stored_at_interrupt,
        before,
        running,
        interrupted_left,
        resumed,
        resumed_budget,
        wait_gone(pids),
        outcome.study_id,
        json.loads(read_out),
        digests(url),
        figures,
    )


def _errors(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("autotune:")]


def test_ctrl_c_stops_the_driver_and_its_processes(scenario, figures):
    interrupted = scenario.interrupted
    assert interrupted.returncode == 130, interrupted.stderr
    assert _errors(interrupted) == ["autotune: interrupted"]
    assert "Traceback" not in interrupted.stderr
    # Ray's GCS, raylet, agents and the rank workers all went with the driver.
    assert scenario.interrupted_left == []
    # Interrupted mid-trial: the trial it cut short is the only one Optuna still held running.
    assert scenario.running_at_interrupt <= 1
    # What was stored before the interrupt is there at the end, unchanged.
    assert scenario.before_interrupt
    for trial_id, digest in scenario.before_interrupt.items():
        assert scenario.final[trial_id] == digest
    figures["interrupt"] = scenario.figures["interrupt"]


def test_resume_finishes_the_study_without_rerunning(scenario):
    resumed = scenario.resumed
    assert resumed.returncode == 0, resumed.stderr
    assert "Traceback" not in resumed.stderr and "best: trial" in resumed.stdout
    assert scenario.resumed_left == []
    with Database.open(scenario.url, create=False) as database:
        trials = database.list_trials(database.get_study("interrupted").id)
    configs = [json.dumps(t.config, sort_keys=True) for t in trials]
    # The budget counts the whole study: the resumed search ran NUM_RESUMED new trials.
    assert len(trials) == scenario.resumed_budget == scenario.stored_at_interrupt + NUM_RESUMED
    assert len(set(configs)) == len(trials)  # none run twice
    assert all(t.status == "complete" for t in trials)
    # The trial the interrupt cut short was marked failed on resume; none is left running.
    states = optuna_states(scenario.url, "interrupted")
    assert "RUNNING" not in states
    assert states.count("FAIL") == scenario.running_at_interrupt
    best = json.loads((scenario.out / "best_config.json").read_text())
    assert best["study"] == "interrupted" and best["metrics"]["throughput_tokens_per_s"] > 0


def test_two_searches_share_one_database(scenario, figures):
    with Database.open(scenario.url, create=False) as database:
        first = database.get_study("interrupted")
        second = database.get_study("second")
        assert second.id == scenario.second_study_id
        a, b = database.list_trials(first.id), database.list_trials(second.id)
    assert len(b) == 3 and all(t.status == "complete" for t in b)
    assert len({t.number for t in a}) == len(a) and len({t.number for t in b}) == len(b)
    assert "RUNNING" not in optuna_states(scenario.url, "second")
    # The two wrote at the same time: the second search's trials fall between the resumed
    # search's first and last new ones.
    resumed = [t.created_at for t in a if t.id not in scenario.before_interrupt]
    written = sorted(t.created_at for t in b)
    assert min(resumed) < written[0] and written[0] < max(resumed), (resumed, written)
    overlap = min(max(resumed), written[-1]) - max(min(resumed), written[0])
    figures["two writers"] = (
        f"{len(a)} + {len(b)} trials; writes overlapped for "
        f"{overlap.total_seconds():.1f}s; {scenario.figures['resume']}"
    )


def test_a_reader_sees_only_whole_trials_while_searches_write(scenario, figures):
    """It reads trials and spans, and writes each study's dashboard report when it changed."""
    reader = scenario.reader
    assert reader["errors"] == []
    seen = {int(k): v for k, v in reader["digests"].items()}
    assert all(scenario.final[trial_id] == digest for trial_id, digest in seen.items())
    # It read while both wrote: the trial count grew under it up to the final one, and it saw
    # the second search's trials.
    per_pass = reader["trials_per_pass"]
    assert per_pass == sorted(per_pass) and per_pass[0] < per_pass[-1] == len(scenario.final)
    with Database.open(scenario.url, create=False) as database:
        second = {t.id for t in database.list_trials(scenario.second_study_id)}
    assert second <= set(seen)
    if importlib.util.find_spec("dashboards.report") is not None:
        assert reader["reports"] >= 2  # both studies' reports, rebuilt as they grew
    figures["reader"] = (
        f"{len(per_pass)} read passes (studies, trials, spans) and "
        f"{reader['reports']} dashboard reports while the searches wrote, "
        f"{per_pass[0]} → {per_pass[-1]} trials; every trial read was identical "
        "to its final state"
    )
