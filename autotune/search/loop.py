"""The search loop: propose, screen, run, conclude, until a budget is spent; then re-measure.

    a trial waiting in the study (the baseline)? take it; else the strategy proposes
      (``strategies.base.Strategy``: Optuna's sampler, model-guided, …) or says it is done
        tried before? conclude it from the stored outcome (``conclude.of_known``), run nothing
      → predicted step time (the study's calibration), kept for the trial's metrics
      → predicted peak, with the screen's allowances, > limit? conclude infeasible (predicted),
        run nothing (``autotune.search.screen``)
      → run, up to the executor's slots at once (``schedule``)
      → conclude (``conclude``): the state, the memory constraint, Optuna's tell and the stored
        record (trial + spans), all in one function; a complete trial refits the study's
        calibration (``study_calibration``)
    stop: trial budget, every valid configuration tried, time budget, no improvement for
          ``patience`` trials, the strategy is done, or the cluster can run no more
    then: re-measure the finalists in interleaved rounds (``remeasure``)

The loop knows strategies only through their interface, executors only through ``run`` and
``slots``. It keeps an index of the configurations tried so far and their outcomes, read from
the study once when it starts (a resumed study's trials) and updated as each trial is
concluded, so a configuration proposed again is answered from memory. Every configuration run
is a trial of the Optuna study, whichever strategy proposed it (enqueued with its parameters
when the strategy is not Optuna's sampler): the study resumes and shows in optuna-dashboard
alike.

``search.Search`` opens a study and runs a loop over it; a replay over a measured table is this
same loop with a table for its executor (``bench/replay_table.py``).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autotune.config import GIB, TrialConfig
from autotune.errors import ClusterError
from autotune.search import conclude
from autotune.search.conclude import CONSTRAINT_ATTR, Concluder, Known
from autotune.search.remeasure import finalist_ids, remeasure_top
from autotune.search.schedule import Measurer, Slots, TrialExecutor, executor_slots
from autotune.search.strategies.base import Measured, Proposal, SearchState, Strategy
from autotune.status import RowStatus, TrialStatus
from autotune.study.leaderboard import Entry, best_entry, build_leaderboard

if TYPE_CHECKING:
    from autotune.search.space import SearchSpace
    from autotune.search.spec import SearchSpec
    from autotune.search.study_calibration import StudyCalibration
    from autotune.shapes import ModelShape
    from autotune.trial.result import TrialResult

__all__ = [
    "CONSTRAINT_ATTR",
    "MAX_DUPLICATES",
    "SearchLoop",
    "SearchOutcome",
    "TrialExecutor",
    "executor_slots",
    "finalist_ids",
    "run_interval",
]

MAX_DUPLICATES = 20
"""Proposals of already-measured configurations tolerated in a row before an untried one is
taken instead (TPE re-proposes its favourites once a small space is mostly explored)."""


@dataclass
class SearchOutcome:
    study_id: int
    leaderboard: list[Entry]
    """Complete trials by median throughput, then the infeasible and failed ones."""
    num_run: int
    num_infeasible_predicted: int
    elapsed_s: float
    stopped_because: str

    @property
    def best(self) -> Entry | None:
        return best_entry(self.leaderboard)


class SearchLoop:
    """One run of the loop over a study that ``search.Search`` has opened (see the module
    docstring); ``run`` schedules, ``_propose`` / ``_screen`` / ``_finish`` are its phases."""

    def __init__(
        self,
        *,
        spec: SearchSpec,
        space: SearchSpace,
        study,
        database,
        study_id: int,
        executor: TrialExecutor,
        limit: int | None,
        device_type: str,
        calibration: StudyCalibration,
        say: Callable[[str], None],
        strategy: Strategy,
        until: Callable[[], str | None] | None = None,
        shape: ModelShape | None = None,
    ) -> None:
        self.spec, self.space, self.study, self.db = spec, space, study, database
        self.study_id, self.limit, self.device_type = study_id, limit, device_type
        self.strategy, self._say = strategy, say
        self._until, self._shape = until, shape
        """A caller's own stop (why, or None: a replay's target reached); the model's shape
        where the workload is not built in (a replayed table's)."""
        self.measurer = Measurer(executor)
        self.executor = executor
        self.concluder = Concluder(
            study, database, study_id, calibration, extra_metrics=self._extra_metrics
        )
        self.calibration = calibration
        self._duplicates = 0
        self._strategy_stopped: str | None = None
        self._cluster_stopped: str | None = None
        """Why the Ray cluster can run no more trials (a node lost, too few left)."""

    @property
    def known(self) -> dict[TrialConfig, Known]:
        """Every configuration stored in the study, and its outcome."""
        return self.concluder.known

    def leaderboard(self) -> list[Entry]:
        return build_leaderboard(self.db.list_trials(self.study_id))

    # ---- scheduling -------------------------------------------------------------------------
    def run(self, start: float) -> SearchOutcome:
        """Propose, screen and measure until a budget is spent (the time budget counts from
        ``start``, a ``time.monotonic()``); up to the executor's ``slots`` trials run at once,
        each concluded as it finishes; then re-measure the finalists."""
        self._read_study()
        self._start = start
        self._tried = set(self.known)
        self._initial_done = len(self._tried)
        self._num_run = self._num_predicted = 0
        slots = Slots(executor_slots(self.executor))
        stopped = None
        try:
            while True:
                stopped = self._fill(slots, stopped)
                if not slots.in_flight:
                    break
                for trial, config, predicted, outcome in slots.finished():
                    self._finish(
                        trial, config, predicted, outcome, len(self._tried) - len(slots.in_flight)
                    )
        finally:
            slots.close()
        board = remeasure_top(
            self.spec,
            self.db,
            self.study_id,
            self.measurer,
            self._say,
            lambda: self._cluster_stopped,
        )
        return SearchOutcome(
            self.study_id,
            board,
            self._num_run,
            self._num_predicted,
            time.monotonic() - start,
            stopped or "trial budget",
        )

    def _fill(self, slots: Slots, stopped: str | None) -> str | None:
        """Start trials until the slots are full or a budget is spent: why it is, or None."""
        while stopped is None and slots.free():
            stopped = self._stop_reason(len(self._tried))
            if stopped is not None:
                break
            proposed = self._propose(slots.running())
            if proposed is None:
                continue
            trial, config = proposed
            self._tried.add(config)
            run, predicted = self._screen(trial, config, len(self._tried))
            if not run:
                self._num_predicted += 1
                continue
            slots.start(self.measurer.outcome, trial, config, predicted)
        return stopped

    def _read_study(self) -> None:
        """The index of known outcomes and the best so far, from the study's trials (a resumed
        study's)."""
        board = self.leaderboard()
        for e in board:
            self.known.setdefault(
                e.config,
                Known(
                    e.status,
                    e.throughputs[0] if e.throughputs else 0.0,
                    e.device_peak or e.measured_peak or e.predicted_peak or 0,
                ),
            )
        self._best = max(
            (e.throughput for e in board if e.status == TrialStatus.COMPLETE), default=0.0
        )
        self._since_best = 0

    def _stop_reason(self, done: int) -> str | None:
        spec = self.spec
        if self._cluster_stopped:
            return self._cluster_stopped
        if done >= spec.n_trials:
            return "trial budget"
        if done >= len(self.space):
            return "every valid configuration tried"
        if spec.timeout_s is not None and time.monotonic() - self._start >= spec.timeout_s:
            return "time budget"
        if spec.patience is not None and self._since_best >= spec.patience:
            return f"no improvement in {spec.patience} trials"
        return self._strategy_stopped or (self._until() if self._until else None)

    # ---- propose ----------------------------------------------------------------------------
    def _propose(self, running: set[TrialConfig]) -> tuple[object, TrialConfig] | None:
        """An untried configuration and its Optuna trial, or None when the strategy is done or
        proposed one already tried (then concluded from what is known, and counted)."""
        proposal = self._ask(running)
        if proposal is None:
            return None
        trial, config = proposal.trial, proposal.config
        if config not in self._tried:
            self._duplicates = 0
            return trial, config
        # Proposed again: tell the stored outcome instead of paying for the trial again; after
        # a run of these, take an untried configuration so the search keeps moving. One still
        # running has no outcome yet: it is dropped.
        verdict = (
            conclude.DROPPED
            if config in running
            else conclude.of_known(self.known[config], self.limit)
        )
        self.concluder.conclude(trial, config, verdict)
        self._duplicates += 1
        if self._duplicates < MAX_DUPLICATES:
            return None
        self._duplicates = 0
        return self.study.ask(), self._untried()  # a parameter-less trial, an untried config

    def _ask(self, running: set[TrialConfig]) -> Proposal | None:
        """A trial waiting in the study (the baseline) first, else the strategy's proposal;
        every proposal comes with its Optuna trial. None: the strategy is done."""
        if not self._queued():
            state = self._state()
            proposal = self.strategy.propose(state)
            if proposal is None:
                self._strategy_done(state, running)
                return None
            if proposal.trial is not None:
                return proposal
            self.study.enqueue_trial(self.space.params_for(proposal.config))
            self._say(f"{self.strategy.label}: next {_short(proposal.config)}: {proposal.reason}")
        trial = self.study.ask()
        return Proposal(self.space.suggest(trial), trial=trial)

    def _queued(self) -> bool:
        from optuna.trial import TrialState

        return bool(self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))

    def _state(self) -> SearchState:
        history = [
            Measured(c, c.tokens_per_step / k.value if k.value > 0 else None, _row_status(k.status))
            for c, k in self.known.items()
        ]
        return SearchState(
            configs=self.space.configs,
            tried=frozenset(self._tried),
            history=history,
            fits=self._fits_with_peak,
            shape=self._shape,
        )

    def _strategy_done(self, state: SearchState, running: set[TrialConfig]) -> None:
        """The strategy proposes nothing more: store what it passed over (when nothing runs)."""
        from autotune.search import screen

        if not running:
            for passed in self.strategy.passed_over(state):
                peak = passed.over_memory_peak
                over = self._over_limit(peak) if peak is not None else ""
                self.concluder.conclude(
                    None,
                    passed.config,
                    conclude.of_passed(passed, over),
                    predicted=peak
                    if peak is not None
                    else screen.predict_peak(passed.config, self.device_type),
                )
                self._say(
                    f"{'ruled out by memory' if peak is not None else 'skipped'} "
                    f"{_short(passed.config)}: {passed.reason}"
                )
        self._strategy_stopped = self.strategy.stop_reason()

    def _untried(self) -> TrialConfig:
        untried = [c for c in self.space.configs if c not in self._tried]
        return random.Random(self.spec.seed + len(self._tried)).choice(untried)

    # ---- screen -----------------------------------------------------------------------------
    def _fits_with_peak(self, config: TrialConfig) -> tuple[bool, int | None]:
        from autotune.search import screen  # through the module: tests may stand in for it

        peak = screen.predict_peak(config, self.device_type)
        return screen.predicted_to_fit(peak, self.limit, self.device_type), peak

    def _over_limit(self, predicted: int) -> str:
        """Why a predicted peak was screened out, with the allowances the screen added."""
        from autotune.search import screen

        allowance = screen.allowance(self.device_type)
        return (
            f"predicted peak {predicted / GIB:.3g} GiB ({allowance.describe()}: "
            f"{allowance.required_bytes(predicted) / GIB:.3g} GiB) > "
            f"limit {self.limit / GIB:.3g} GiB"
        )

    def _screen(self, trial, config: TrialConfig, done: int) -> tuple[bool, int | None]:
        """(run it?, predicted peak or None if unknown); one predicted not to fit is concluded
        infeasible without running anything."""
        from autotune.search import screen  # through the module: tests may stand in for the model

        self.concluder.predictions[trial.number] = self.calibration.predict(config)
        predicted = screen.predict_peak(config, self.device_type)
        trial.set_user_attr("predicted_peak_bytes", predicted)
        if screen.predicted_to_fit(predicted, self.limit, self.device_type):
            return True, predicted
        required = screen.required_bytes(predicted, self.device_type)
        verdict = conclude.of_screen(predicted, required, self.limit, self._over_limit(predicted))
        self.concluder.conclude(trial, config, verdict, predicted=predicted)
        self._progress(done, config, "infeasible (predicted)")
        return False, predicted

    # ---- conclude ---------------------------------------------------------------------------
    def _finish(
        self, trial, config: TrialConfig, predicted: int | None, outcome, done: int
    ) -> None:
        if isinstance(outcome, ClusterError):
            # Nothing ran: the cluster cannot hold the world size. Before any trial that is
            # the user's error to fix; later (a node was lost, say) the search stops on that
            # one line and what it measured stands.
            self.concluder.conclude(trial, config, conclude.DROPPED)
            if self._num_run == 0:
                raise outcome
            self._cluster_stopped = f"the Ray cluster cannot run more trials: {outcome}"
            return
        verdict = (
            conclude.of_failure(outcome, predicted)
            if isinstance(outcome, Exception)
            else conclude.of_result(outcome, self.limit, predicted)
        )
        self.concluder.conclude(trial, config, verdict, predicted=predicted)
        self._num_run += 1
        if verdict.status == TrialStatus.COMPLETE and verdict.value > self._best:
            self._best, self._since_best = verdict.value, 0
        else:
            self._since_best += 1
        self._progress(done, config, verdict.status)

    def _extra_metrics(self, config: TrialConfig, result: TrialResult) -> dict:
        """A measured trial's metrics beyond its record: the discarded cold figure, the
        interval of its timed steps (re-measurements replace it with one over the runs)."""
        extra = {}
        if config in self.measurer.cold:
            extra["cold_start_discarded_tokens_per_s"] = self.measurer.cold.pop(config)
        interval = run_interval(result, config)
        if interval is not None:
            extra["throughput_interval"] = interval.to_dict()
        return extra

    def _progress(self, i: int, config: TrialConfig, status: str) -> None:
        elapsed = time.monotonic() - self._start
        per = elapsed / max(1, i - self._initial_done)
        left = max(0, self.spec.n_trials - i)
        eta = f", ~{per * left:.0f}s left" if per else ""
        self._say(
            f"[{i}/{self.spec.n_trials}] {_short(config)}: {status}; best "
            f"{self._best:,.0f} tok/s; {elapsed:.0f}s elapsed{eta}"
        )


def run_interval(result: TrialResult, config: TrialConfig):
    """The interval of one run's tokens/s from its timed steps (the slowest rank's each), or
    None with fewer than two (``noise.throughput_interval``)."""
    from autotune.model.noise import throughput_interval

    steps = [max(r.step_times[i] for r in result.ranks) for i in config.timed_steps]
    return throughput_interval([result.throughput_tokens_per_s], steps, config.tokens_per_step)


def _row_status(status: TrialStatus) -> RowStatus:
    """A stored trial's status as a strategy's history reads it."""
    if status == TrialStatus.COMPLETE:
        return RowStatus.COMPLETE
    return RowStatus.INFEASIBLE if status.infeasible else RowStatus.FAILED


def _short(config: TrialConfig) -> str:
    from autotune.layouts import short_name

    return short_name(config)
