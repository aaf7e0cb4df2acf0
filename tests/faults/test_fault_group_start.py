"""A process group that cannot start is a failed trial, and the search goes on.

The faults are planted where the group starts (``executor.start_process_group``, on the
driver), on the search's first two starts:

- at the first, the ranks are asked for NCCL on device 0, which they refuse (torch without
  CUDA cannot set a device; with one GPU for two ranks, NCCL refuses a duplicate GPU), as a
  rank's NCCL init error reaches the driver: a ``RayTaskError``;
- at the second, a third rank is planted on rank 0's own worker, so it never reaches the
  rendezvous (a worker runs one call at a time) and the others wait for it: the start times out.

Each trial is stored failed with the cause in one line, and the third configuration starts a
new group and completes.
"""

from __future__ import annotations

import re

from test_fault_trials import run_search, spec

from autotune.trial import executor as executor_module
from autotune.trial.executor import ExecutorSettings

START_TIMEOUT_S = 20.0
"""The trial timeout: what the start waits for the missing rank, and what each trial has (a warm
trial takes under a second, a cold one a few)."""


def test_groups_that_cannot_start_fail_their_trials_and_the_search_goes_on(
    executor, tmp_path, monkeypatch, figures
):
    real = executor_module.start_process_group
    planted: list[str] = []

    def planted_twice(workers, backend, devices, timeout_s):
        planted.append(backend)
        if len(planted) == 1:  # NCCL, which the ranks refuse
            return real(workers, "nccl", [0] * len(workers), timeout_s)
        if len(planted) == 2:  # a third rank that never arrives
            return real([*workers, workers[0]], backend, [*devices, devices[0]], timeout_s)
        return real(workers, backend, devices, timeout_s)

    monkeypatch.setattr(executor_module, "start_process_group", planted_twice)
    monkeypatch.setattr(executor, "settings", ExecutorSettings(trial_timeout_s=START_TIMEOUT_S))
    executor.discard_group()  # the search's first trial starts a group: the planted one
    try:
        fr = run_search(executor, tmp_path / "start.db", spec("healthy", study_name="start"))
    finally:
        executor.discard_group()  # built under the short timeout
    assert planted[:3] == ["gloo"] * 3
    refused, late, after = fr.runs[:3]
    # The refused start: the rank's own error, in one line.
    stored = fr.trial(refused.config.micro_batch_size)
    assert stored.status == "failed" and refused.error.kind == "error"
    assert re.match(r"^process group did not start: rank \d: \w+: \S", stored.error), stored.error
    assert "\n" not in stored.error
    assert fr.optuna_states[stored.number] == "FAIL"
    # The start whose peer never arrived: it waited out the trial's timeout (not gloo's or the
    # store's 30 minutes; the ranks' own start comes before it) and named who was waiting.
    timed_out = fr.trial(late.config.micro_batch_size)
    assert timed_out.status == "failed" and late.error.kind == "timeout"
    assert timed_out.error.startswith(
        f"process group did not start within {START_TIMEOUT_S:g} s: rank(s) 0, 1, 2 still waiting"
    ), timed_out.error
    assert START_TIMEOUT_S <= late.seconds < 300
    # The search went on: the next configuration started a group of its own and completed,
    # and the budget (not the failures) ended the search.
    assert after.error is None and after.cold
    assert fr.trial(after.config.micro_batch_size).status == "complete"
    assert fr.outcome.stopped_because == "trial budget"
    figures["group cannot start"] = (
        f"stored '{stored.error}' ({refused.seconds:.1f}s, with Ray's own start when first) and "
        f"'{timed_out.error}' ({late.seconds:.1f}s); next trial on a new group "
        f"{after.seconds:.1f}s"
    )
