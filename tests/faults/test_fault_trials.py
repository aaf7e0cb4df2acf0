"""Faults inside trials, each injected into a real search (the tiny GPT, local Ray, SQLite in
tmp_path): the search goes on, every finished trial stays as it was stored, the broken trial is
recorded with its status and a reason, its worker group is replaced, and none of its processes
is left running.

Each search covers micro-batches 4, 2 and 1 (dp 2, global batch 8, everything else fixed); it
starts from 4 (the baseline), and with seed 0 proposes 2, the faulty one, second, so a trial runs
after the fault. The fault workloads (fault_workloads.py) break micro-batch 2 only.
"""

from __future__ import annotations

import dataclasses
import re
import time

import optuna
import pytest
from fault_checks import RecordingExecutor, Run, estimated_as_builtin, wait_gone
from fault_checks import without_remeasurements as first_stored
from fault_workloads import FAULTY_MICRO_BATCH, HANG_SLEEP_S, OVER_LIMIT_MICRO_BATCH

from autotune.config import WorkloadSpec
from autotune.search.search import CONSTRAINT_ATTR, GIB, Search, SearchOutcome, SearchSpec
from autotune.trial.executor import ExecutorSettings
from db import Database, TrialRecord

FIXED = {
    "tp_degree": 1,
    "cp_degree": 1,
    "dp_replicate": 1,
    "pp_degree": 1,
    "zero_stage": 0,
    "overlap_enabled": True,
    "bucket_mb": 25.0,
    "activation_checkpointing": "none",
}
HANG_TIMEOUT_S = 15.0
"""Trial timeout of the hang test: warm trials take well under a second and a cold one ~2 s
on an idle machine, several times that while other processes keep both cores busy; the group
built under it also rendezvouses within it (``init_process_group``'s timeout)."""


def spec(fault: str, **kw) -> SearchSpec:
    defaults = {
        "workload": WorkloadSpec(
            workload=f"tests.faults.fault_workloads:build_{fault}", seq_len=16
        ),
        "world_size": 2,
        "n_trials": 3,
        "patience": None,
        "device": "cpu",
        "num_warmup_steps": 0,
        "num_timed_steps": 1,
        "num_profiled_steps": 0,
        "top_k": 1,
        "remeasure_repeats": 1,
        "remeasure_max_repeats": 1,
        "fixed": FIXED,
        "study_name": fault,
    }
    return SearchSpec(**{**defaults, **kw})


@dataclasses.dataclass
class FaultRun:
    outcome: SearchOutcome
    runs: list[Run]
    trials: list[TrialRecord]
    """The study's trials at the end."""
    optuna_states: dict[int, str]
    """Optuna's state of each trial number."""
    memory_excess: dict[int, float | None]
    """What Optuna was told of each trial's memory over the limit, in GiB (> 0: infeasible)."""
    seconds: float
    gone_s: float | None = None
    """How long the broken group's processes took to disappear."""

    def trial(self, micro_batch: int) -> TrialRecord:
        (found,) = [t for t in self.trials if t.config["micro_batch_size"] == micro_batch]
        return found

    def run_of(self, micro_batch: int) -> int:
        """Index in ``runs`` of the search's (first) run of that micro-batch."""
        return next(i for i, r in enumerate(self.runs) if r.config.micro_batch_size == micro_batch)


def run_search(executor, path, search_spec: SearchSpec) -> FaultRun:
    database = Database.open(f"sqlite:///{path}")
    try:
        recorder = RecordingExecutor(executor, database)
        start = time.monotonic()
        with estimated_as_builtin():
            outcome = Search.open(search_spec, database, recorder, out=None).run()
        seconds = time.monotonic() - start
        study = optuna.load_study(
            study_name=f"autotune:{search_spec.study_name}", storage=database.connect_url
        )
        return FaultRun(
            outcome,
            recorder.runs,
            database.list_trials(outcome.study_id),
            {t.number: t.state.name for t in study.trials},
            {t.number: t.user_attrs.get(CONSTRAINT_ATTR) for t in study.trials},
            seconds,
        )
    finally:
        database.close()


def check_survived(fr: FaultRun, *, status: str, reason: str) -> Run:
    """The checks every trial fault must pass; returns the broken run."""
    # The broken trial is stored once, with its status and a reason naming the cause.
    assert sorted(t.config["micro_batch_size"] for t in fr.trials) == [1, 2, 4]
    broken = fr.trial(FAULTY_MICRO_BATCH)
    assert broken.status == status
    assert re.search(reason, broken.error), broken.error
    # The study went on: the configuration after the fault ran and completed, the budget ended
    # the search, and the best configuration was measured again.
    index = fr.run_of(FAULTY_MICRO_BATCH)
    broken_run, after = fr.runs[index], fr.runs[index + 1]
    assert broken_run.error is not None and after.error is None
    assert fr.trial(after.config.micro_batch_size).status == "complete"
    assert fr.outcome.stopped_because == "trial budget"
    assert fr.outcome.best is not None and len(fr.outcome.best.throughputs) == 2
    # Every trial stored before any run (the fault's included) is unchanged at the end, apart
    # from the re-measurements the end of a search appends to its finalists.
    final = {t.id: first_stored(t) for t in fr.trials}
    assert broken_run.stored_before, "no trial was stored before the fault"
    for run in fr.runs:
        for trial_id, before in run.stored_before.items():
            assert final[trial_id] == first_stored(before)
    # The group the fault broke was replaced, and none of its processes is left.
    assert broken_run.pids, "the faulty trial did not run on a warm group"
    assert after.cold and not set(after.pids) & set(broken_run.pids)
    start = time.monotonic()
    assert wait_gone(broken_run.pids) == []
    fr.gone_s = time.monotonic() - start
    return broken_run


def note(figures: dict, name: str, fr: FaultRun, broken: Run) -> None:
    index = fr.runs.index(broken)
    statuses = ", ".join(
        f"{sum(t.status == s for t in fr.trials)} {s}"
        for s in sorted({t.status for t in fr.trials})
    )
    figures[name] = (
        f"{len(fr.trials)} trials ({statuses}); faulty trial {broken.seconds:.1f}s, "
        f"next trial on a new group {fr.runs[index + 1].seconds:.1f}s, old ranks "
        f"gone {fr.gone_s:.1f}s after the search; search {fr.seconds:.1f}s"
    )


# ---- a rank raises -----------------------------------------------------------------------------
def test_a_rank_raises(executor, tmp_path, figures):
    fr = run_search(executor, tmp_path / "raise.db", spec("raising"))
    broken = check_survived(
        fr, status="failed", reason=r"^rank 1: RuntimeError: injected failure \(micro-batch 2\)$"
    )
    assert fr.optuna_states[fr.trial(FAULTY_MICRO_BATCH).number] == "FAIL"
    assert broken.error.rank == 1 and "Traceback" in broken.error.traceback  # --debug shows it
    note(figures, "rank raises", fr, broken)


# ---- out of memory, and a measured peak over the limit -----------------------------------------
def test_out_of_memory_and_over_the_limit(executor, tmp_path, figures):
    """Micro-batch 4 measures 256 MiB more than predicted: over the 128 MiB limit that its
    prediction fits under, it is infeasible (measured) and the group is kept. Micro-batch 2 runs
    out of memory on every rank: infeasible (measured), and the group is replaced."""
    limit_gib = 128 / 1024
    fr = run_search(executor, tmp_path / "oom.db", spec("oom", memory_limit_gib=limit_gib))
    broken = check_survived(
        fr,
        status="infeasible_measured",
        reason=r"^rank \d: OutOfMemoryError: injected: CPU out of memory",
    )
    over = fr.trial(OVER_LIMIT_MICRO_BATCH)
    assert over.status == "infeasible_measured"
    assert over.metrics["peak_memory_bytes"] > limit_gib * GIB
    assert over.error == (
        f"measured peak {over.metrics['peak_memory_bytes'] / GIB:.3g} GiB > "
        f"limit {limit_gib:.3g} GiB"
    )
    # A peak over the limit is a result, not a fault: the next trial reused the same processes.
    over_run = fr.runs[fr.run_of(OVER_LIMIT_MICRO_BATCH)]
    assert fr.runs[fr.runs.index(over_run) + 1].pids == over_run.pids
    # Optuna is told both finished over the memory limit, so that it steers away from them.
    for micro_batch in (FAULTY_MICRO_BATCH, OVER_LIMIT_MICRO_BATCH):
        number = fr.trial(micro_batch).number
        assert fr.optuna_states[number] == "COMPLETE" and fr.memory_excess[number] > 0
    assert fr.memory_excess[over.number] == pytest.approx(
        over.metrics["peak_memory_bytes"] / GIB - limit_gib
    )
    note(figures, "out of memory", fr, broken)


# ---- a worker process is killed ----------------------------------------------------------------
@pytest.fixture(scope="module")
def killed(executor, tmp_path_factory) -> FaultRun:
    return run_search(executor, tmp_path_factory.mktemp("killed") / "killed.db", spec("killed"))


def test_a_worker_killed_mid_trial(killed, figures):
    """Rank 1 SIGKILLs itself in its third forward pass (inside the second optimizer step), as
    the kernel's OOM killer would."""
    broken = check_survived(killed, status="failed", reason=r"^rank \d: ")
    assert killed.optuna_states[killed.trial(FAULTY_MICRO_BATCH).number] == "FAIL"
    note(figures, "worker SIGKILLed", killed, broken)


def test_a_killed_worker_is_named_as_the_cause(killed):
    """Rank 0's gloo 'Connection reset by peer' is the consequence; rank 1's death the cause."""
    error = killed.trial(FAULTY_MICRO_BATCH).error
    assert error.startswith("rank 1: ") and "died" in error, error


# ---- a collective hangs ------------------------------------------------------------------------
@pytest.fixture
def short_timeout(executor, monkeypatch):
    """The session's executor with a short trial timeout (its warm group is reused, which saves
    a cold start); the group built under it, whose collectives time out as soon, is discarded
    afterwards."""
    monkeypatch.setattr(executor, "settings", ExecutorSettings(trial_timeout_s=HANG_TIMEOUT_S))
    yield executor
    executor.discard_group()


def test_a_hung_collective_times_out(short_timeout, tmp_path, figures):
    """Rank 1 sleeps in forward; rank 0 waits in DDP's all-reduce until the trial timeout."""
    fr = run_search(short_timeout, tmp_path / "hang.db", spec("hanging"))
    broken = check_survived(
        fr,
        status="failed",
        reason=rf"^trial did not finish within {HANG_TIMEOUT_S:g}s \(a hung collective\?\); "
        "raise --timeout",
    )
    # It waited out the timeout, not the hang (a liveness bound, not a speed).
    assert HANG_TIMEOUT_S <= broken.seconds < HANG_SLEEP_S
    assert fr.optuna_states[fr.trial(FAULTY_MICRO_BATCH).number] == "FAIL"
    note(figures, "hung collective", fr, broken)


# ---- a user workload ---------------------------------------------------------------------------
def test_search_over_a_user_workload(executor, tmp_path):
    """The memory model does not know a user workload's shape: its configurations run
    unpredicted (none is skipped, even under a limit) and the measurement decides."""
    with Database.open(f"sqlite:///{tmp_path / 'user.db'}") as database:
        outcome = Search.open(
            spec("healthy", n_trials=1, remeasure_repeats=0, memory_limit_gib=1.0),
            database,
            executor,
            out=None,
        ).run()
    assert [e.status for e in outcome.leaderboard] == ["complete"]
    assert outcome.leaderboard[0].predicted_peak is None
    assert outcome.num_infeasible_predicted == 0
