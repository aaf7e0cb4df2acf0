"""Scheduling trials: how many run at once, on which thread, and the cold-start re-run. Nothing
here stores or tells anything: the loop concludes each outcome on its own thread
(``autotune.search.conclude``).

Up to the executor's ``slots`` trials run at once, each on a thread of its own that only
measures (optuna's ``_optimize`` runs ``n_jobs`` trials on a ``ThreadPoolExecutor`` and waits
``FIRST_COMPLETED`` alike). With one slot no thread is started, so Ctrl-C reaches the trial
where it runs.

The first trial on a newly built worker group is measured again and its cold figure discarded
(kept in the trial's metrics as ``cold_start_discarded_tokens_per_s``): a cold group measured
20,155 tok/s where its re-measurements gave 34,801 and 31,995 (issue 9), so the baseline, the
search's first trial, would otherwise start behind by chance of being first.
"""

from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any, Protocol

from autotune.config import TrialConfig
from autotune.errors import ClusterError, TrialFailed

if TYPE_CHECKING:
    from autotune.trial.result import TrialResult


class TrialExecutor(Protocol):
    """What runs the search's trials: a ``RayExecutor``, a ``TrialPool``, or a table
    (``bench/replay_table.py``'s ``ReplayTrialExecutor``).

    ``run`` measures one configuration and returns its ``TrialResult``, or raises
    ``TrialFailed`` (of kind ``oom``: the trial is infeasible; any other kind: it failed;
    a ``PlacementError``: the nodes cannot hold the layout, stored as not run).
    An executor may also have ``slots`` (an int; 1 when absent): how many trials it runs at
    once. With more than one, ``run`` is called from that many threads at once and must be
    thread-safe (``TrialPool.run`` is). The loop calls nothing else on it; whoever made the
    executor closes it."""

    def run(self, config: TrialConfig) -> TrialResult: ...


def executor_slots(executor: TrialExecutor) -> int:
    """How many trials ``executor`` runs at once (its ``slots``, 1 without)."""
    return max(1, int(getattr(executor, "slots", 1)))


class Measurer:
    """Measures configurations on an executor, re-running a cold first run."""

    def __init__(self, executor: TrialExecutor) -> None:
        self.executor = executor
        self.cold: dict[TrialConfig, float] = {}
        """Configuration → the tokens/s of a cold first run that was discarded, until stored."""

    def measure(self, config: TrialConfig) -> TrialResult:
        """One measurement of ``config``; a run that had to build its worker group is run again
        and the warm figure kept (the cold one is remembered for the trial's metrics)."""
        result = self.executor.run(config)
        if result.cold_start:
            self.cold[config] = result.throughput_tokens_per_s
            result = self.executor.run(config)
        return result

    def outcome(self, config: TrialConfig) -> TrialResult | TrialFailed | ClusterError:
        """Runs on a trial thread: the measurement, or the error it raised, returned."""
        try:
            return self.measure(config)
        except (TrialFailed, ClusterError) as e:
            return e


class Slots:
    """Trials in flight: started on threads (or inline with one slot), finished in order."""

    def __init__(self, width: int) -> None:
        self.width = width
        self._threads = ThreadPoolExecutor(width, "trial") if width > 1 else None
        self.in_flight: dict[Future, tuple[Any, TrialConfig, int | None]] = {}
        """future → (Optuna trial, configuration, predicted peak)."""

    def free(self) -> bool:
        return len(self.in_flight) < self.width

    def running(self) -> set[TrialConfig]:
        return {config for _, config, _ in self.in_flight.values()}

    def start(self, fn, trial, config: TrialConfig, predicted: int | None) -> None:
        """Run ``fn(config)`` on a thread of its own, or here and now with one slot."""
        if self._threads is not None:
            future = self._threads.submit(fn, config)
        else:
            future = Future()
            future.set_result(fn(config))
        self.in_flight[future] = (trial, config, predicted)

    def finished(self) -> list[tuple[Any, TrialConfig, int | None, Any]]:
        """Wait for at least one trial; those finished, by trial number: (trial, config,
        predicted peak, outcome)."""
        done, _ = wait(self.in_flight, return_when=FIRST_COMPLETED)
        out = []
        for future in sorted(done, key=lambda f: self.in_flight[f][0].number):
            trial, config, predicted = self.in_flight.pop(future)
            out.append((trial, config, predicted, future.result()))
        return out

    def close(self) -> None:
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
