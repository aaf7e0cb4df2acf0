"""The search loop: ask, screen, run, tell, until a budget is spent; then re-measure the best.

    ask Optuna → config (``SearchSpace.suggest``)
        tried before? tell Optuna its known outcome (from the index), run nothing
      → predicted step time (the study's calibration), kept for the trial's metrics
      → predicted peak, with the screen's allowances, > limit? store infeasible_predicted, run
        nothing (``autotune.search.screen``)
      → executor.run → measured device peak (the allocator's reserve + memory outside it)
        > limit or OOM? infeasible_measured; other failure: failed
      → store trial + spans (one transaction; records built by ``autotune.study.store``)
      → tell Optuna (value, and the memory constraint)
      → complete? refit the study's calibration (``study_calibration``)
    stop: trial budget, every valid configuration tried, time budget, or no improvement for
          ``patience`` trials
    then: re-measure the top few and the baseline in interleaved rounds (each round measures
          every one of them once, in rotated order), at least ``remeasure_repeats`` rounds and
          more, up to ``remeasure_max_repeats``, while the runner-up is tied with the fastest
          within noise; the leaderboard ranks by median throughput and declares the best with
          its interval (``leaderboard.declare_best``).

The first trial on a newly built worker group is measured again and its cold figure discarded
(kept in the trial's metrics as ``cold_start_discarded_tokens_per_s``): a cold group measured
20,155 tok/s where its re-measurements gave 34,801 and 31,995 (issue 9), so the baseline, the
search's first trial, would otherwise start behind by chance of being first.

Up to the executor's ``slots`` trials run at once, each on a thread of its own that only
measures; storing and telling Optuna happen on the loop's thread as each one finishes. With one
slot no thread is started, so Ctrl-C reaches the trial where it runs.

``search.Search`` sets a loop up (the study, the space, the limit, the calibration) and runs it
once. The loop keeps an index of the configurations tried so far and their outcomes, read from
the study once when it starts (a resumed study's trials) and updated as each trial is stored,
so a configuration Optuna proposes again is answered from memory.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from autotune.config import GIB, TrialConfig
from autotune.errors import ClusterError, PlacementError, TrialFailed
from autotune.study.leaderboard import Entry, best_entry, build_leaderboard, declare_best
from autotune.status import FailureKind, TrialStatus

if TYPE_CHECKING:
    from autotune.trial.result import TrialResult
    from autotune.search.spec import SearchSpec
    from autotune.search.space import SearchSpace
    from autotune.search.strategies.model_guided import ModelGuided
    from autotune.search.study_calibration import StudyCalibration

CONSTRAINT_ATTR = "memory_excess_gib"
SKIPPED_RECORDED = 3
"""When the model-guided strategy stops, this many of the untried configurations it ranks best
are stored as skipped, with its reason (the rest rank lower still)."""
MAX_DUPLICATES = 20
"""Proposals of already-measured configurations tolerated in a row before an untried one is
taken instead (TPE re-proposes its favourites once a small space is mostly explored)."""


class TrialExecutor(Protocol):
    """What runs the search's trials: a ``RayExecutor``, a ``TrialPool``, or a replay.

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


@dataclass(frozen=True, slots=True)
class Known:
    """A tried configuration's stored outcome: what Optuna is told when it proposes it again."""

    status: TrialStatus
    value: float
    """The objective Optuna was told: tokens/s of the first run when complete, else 0."""
    peak: int
    """Measured device peak bytes (``TrialResult.device_peak_bytes``; the allocated peak for a
    trial stored before that was kept), else the predicted peak, else 0 (an infeasible one's
    constraint)."""


def set_excess(trial, excess_gib: float) -> None:
    """Tell Optuna how far over the memory limit a trial was (its constraint; ≤ 0 feasible)."""
    trial.set_constraint(CONSTRAINT_ATTR, excess_gib)
    trial.set_user_attr(CONSTRAINT_ATTR, excess_gib)


class SearchLoop:
    """One run of the loop over a study that ``search.Search`` has set up."""

    def __init__(self, *, spec: SearchSpec, space: SearchSpace, study, database, study_id: int,
                 executor: TrialExecutor, limit: int | None, device_type: str,
                 calibration: StudyCalibration, say: Callable[[str], None],
                 strategy: ModelGuided | None = None) -> None:
        self.spec, self.space, self.study, self.db = spec, space, study, database
        self.study_id, self.executor, self.limit = study_id, executor, limit
        self.device_type, self.calibration, self._say = device_type, calibration, say
        self._known: dict[TrialConfig, Known] = {}
        """The index: every configuration stored in the study, and its outcome."""
        self._predictions: dict[int, dict[str, Any]] = {}
        """Trial number → the predicted step time metrics, until the trial is stored."""
        self._duplicates = 0
        self.strategy = strategy
        """The model-guided strategy, or None: Optuna's sampler proposes."""
        self._strategy_stopped: str | None = None
        self._cold: dict[TrialConfig, float] = {}
        """Configuration → the tokens/s of a cold first run that was discarded, until stored."""
        self._cluster_stopped: str | None = None
        """Why the Ray cluster can run no more trials (a node lost, too few left)."""

    def leaderboard(self) -> list[Entry]:
        return build_leaderboard(self.db.list_trials(self.study_id))

    # ---- the loop ---------------------------------------------------------------------------
    def run(self, start: float) -> SearchOutcome:
        """Propose, screen and measure until a budget is spent (the time budget counts from
        ``start``, a ``time.monotonic()``); up to the executor's ``slots`` trials run at once,
        each told to Optuna as it finishes."""
        from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

        board = self.leaderboard()
        for e in board:  # a resumed study's trials
            self._known.setdefault(e.config, Known(
                e.status, e.throughputs[0] if e.throughputs else 0.0,
                e.device_peak or e.measured_peak or e.predicted_peak or 0))
        self._best = max((e.throughput for e in board if e.status == TrialStatus.COMPLETE),
                         default=0.0)
        self._since_best = 0
        self._num_run, num_pred = 0, 0
        tried = set(self._known)
        self._initial_done = len(tried)
        width = executor_slots(self.executor)
        threads = ThreadPoolExecutor(width, "trial") if width > 1 else None
        in_flight: dict = {}  # future → (optuna trial, config, predicted peak)
        stopped = None
        try:
            while True:
                while stopped is None and len(in_flight) < width:
                    stopped = self._stop_reason(len(tried), start)
                    if stopped is not None:
                        break
                    trial, config = self._propose(tried, in_flight)
                    if trial is None:
                        continue
                    tried.add(config)
                    run, predicted = self._screen(trial, config, len(tried), start)
                    if not run:
                        num_pred += 1
                        continue
                    future = (threads.submit(self._run_trial, config) if threads
                              else _done_future(self._run_trial, config))
                    in_flight[future] = (trial, config, predicted)
                if not in_flight:
                    break
                finished, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                for future in sorted(finished, key=lambda f: in_flight[f][0].number):
                    trial, config, predicted = in_flight.pop(future)
                    self._finish(trial, config, predicted, future.result(),
                                 len(tried) - len(in_flight), start)
        finally:
            if threads is not None:
                threads.shutdown(wait=False, cancel_futures=True)
        board = self._remeasure_top()
        return SearchOutcome(self.study_id, board, self._num_run, num_pred,
                             time.monotonic() - start, stopped or "trial budget")

    def _stop_reason(self, done: int, start: float) -> str | None:
        spec = self.spec
        if self._cluster_stopped:
            return self._cluster_stopped
        if done >= spec.n_trials:
            return "trial budget"
        if done >= len(self.space):
            return "every valid configuration tried"
        if spec.timeout_s is not None and time.monotonic() - start >= spec.timeout_s:
            return "time budget"
        if spec.patience is not None and self._since_best >= spec.patience:
            return f"no improvement in {spec.patience} trials"
        return self._strategy_stopped

    # ---- ask --------------------------------------------------------------------------------
    def _propose(self, tried: set[TrialConfig], in_flight: dict):
        """Ask Optuna for an untried configuration: (trial, config), or (None, None) when it
        proposed one already measured or running (then told and counted)."""
        from optuna.trial import TrialState

        if self.strategy is not None and not self._enqueue_model_choice(tried, in_flight):
            return None, None
        trial = self.study.ask()
        config = self.space.suggest(trial)
        if config not in tried:
            self._duplicates = 0
            return trial, config
        # Optuna proposed a configuration already measured: tell it the stored outcome instead
        # of paying for the trial again; after a run of these, take an untried configuration so
        # the search keeps moving. One still running has no outcome yet: it is dropped.
        if any(c == config for _, c, _ in in_flight.values()):
            self.study.tell(trial, state=TrialState.FAIL)
        else:
            self._tell_known(trial, config)
        self._duplicates += 1
        if self._duplicates < MAX_DUPLICATES:
            return None, None
        self._duplicates = 0
        return self.study.ask(), self._untried(tried)  # a parameter-less trial, an untried config

    def _enqueue_model_choice(self, tried: set[TrialConfig], in_flight: dict) -> bool:
        """Ask the model-guided strategy for the next configuration and enqueue it, so Optuna's
        next trial is that one (the study stays an Optuna study: resume, optuna-dashboard).
        False when the strategy stops: the best few it passed over are stored as skipped."""
        from autotune.search import screen
        from autotune.status import RowStatus
        from autotune.search.strategies.base import Measured

        if self._queued():
            return True  # the baseline (or an earlier choice) is still waiting to be asked
        history = [Measured(c, c.tokens_per_step / k.value if k.value > 0 else None,
                            RowStatus.COMPLETE if k.status == TrialStatus.COMPLETE
                            else RowStatus.FAILED)
                   for c, k in self._known.items()]
        busy = {c for _, c, _ in in_flight.values()}
        peaks = {c: screen.predict_peak(c, self.device_type) for c in self.space.configs
                 if c not in tried and c not in busy}
        candidates = [c for c, peak in peaks.items() if self._fits(peak)]
        proposal = self.strategy.propose(candidates, history)
        if proposal is None:
            if not in_flight:
                self._record_skipped(candidates, history)
                self._record_ruled_out({c: peak for c, peak in peaks.items()
                                        if not self._fits(peak)}, history)
            self._strategy_stopped = ("the performance model predicts no untried configuration "
                                      f"faster than the best measured by "
                                      f"{self.strategy.tolerance:.0%}")
            return False
        self.study.enqueue_trial(self.space.params_for(proposal.config))
        self._say(f"model-guided: next {_short(proposal.config)}: {proposal.reason}")
        return True

    def _queued(self) -> bool:
        from optuna.trial import TrialState

        return bool(self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))

    def _record_skipped(self, candidates: list[TrialConfig], history: list) -> None:
        """Store the best few configurations the strategy will not run, with its reason."""
        from autotune.search import screen
        from autotune.study.store import unmeasured_record

        ranked = self.strategy.ranked(candidates, history)
        for _, _, config in ranked[:SKIPPED_RECORDED]:
            reason = self.strategy.skip_reason(config, history)
            if reason is None:
                continue
            self.db.add_trial(unmeasured_record(
                config, study_id=self.study_id, number=None,
                status=TrialStatus.SKIPPED_PREDICTED,
                predicted_peak=screen.predict_peak(config, self.device_type),
                predictions=self.calibration.predict(config), error=f"skipped: {reason}"))
            self._known[config] = Known(TrialStatus.SKIPPED_PREDICTED, 0.0, 0)
            self._say(f"skipped {_short(config)}: {reason}")

    def _record_ruled_out(self, over: dict[TrialConfig, int], history: list) -> None:
        """Store the best few configurations the memory screen kept from the strategy (those
        it ranks fastest among ``over``, the untried ones predicted not to fit, with their
        predicted peaks), so the study shows which faster layouts memory ruled out, as a
        sampler's screened proposals are shown."""
        from autotune.study.store import unmeasured_record

        over = {c: peak for c, peak in over.items() if c not in self._known}
        for _, predicted_s, config in self.strategy.ranked(list(over), history)[
                :SKIPPED_RECORDED]:
            peak = over[config]
            self.db.add_trial(unmeasured_record(
                config, study_id=self.study_id, number=None,
                status=TrialStatus.INFEASIBLE_PREDICTED, predicted_peak=peak,
                predictions=self.calibration.predict(config),
                error=self._over_limit(peak)))
            self._known[config] = Known(TrialStatus.INFEASIBLE_PREDICTED, 0.0, peak)
            self._say(f"ruled out by memory {_short(config)}: predicted "
                      f"{predicted_s * 1e3:.1f} ms, but a peak of {peak / GIB:.3g} GiB")

    def _tell_known(self, trial, config: TrialConfig) -> None:
        from optuna.trial import TrialState

        known = self._known[config]
        if known.status == TrialStatus.FAILED:
            self.study.tell(trial, state=TrialState.FAIL)
            return
        if known.status.infeasible:
            excess = (known.peak - self.limit) / GIB if self.limit is not None else 0.0
            set_excess(trial, max(excess, 1e-9))
        else:
            self._set_feasible(trial, known.peak)
        self.study.tell(trial, known.value)

    def _set_feasible(self, trial, peak: int | None) -> None:
        """Under a memory limit every trial told with a value carries the constraint, feasible
        ones too (≤ 0): GP refuses a history where only some trials have one."""
        if self.limit is not None:
            set_excess(trial, min((peak or 0) - self.limit, 0) / GIB)

    def _untried(self, tried: set[TrialConfig]) -> TrialConfig:
        import random

        untried = [c for c in self.space.configs if c not in tried]
        return random.Random(self.spec.seed + len(tried)).choice(untried)

    # ---- screen -----------------------------------------------------------------------------
    def _fits(self, predicted: int | None) -> bool:
        from autotune.search import screen  # through the module: tests may stand in for it

        return screen.predicted_to_fit(predicted, self.limit, self.device_type)

    def _over_limit(self, predicted: int) -> str:
        """Why a predicted peak was screened out, with the allowances the screen added."""
        from autotune.search import screen

        allowance = screen.allowance(self.device_type)
        return (f"predicted peak {predicted / GIB:.3g} GiB ({allowance.describe()}: "
                f"{allowance.required_bytes(predicted) / GIB:.3g} GiB) > "
                f"limit {self.limit / GIB:.3g} GiB")

    def _screen(self, trial, config: TrialConfig, done: int,
                start: float) -> tuple[bool, int | None]:
        """(run it?, predicted peak or None if unknown); one predicted not to fit is recorded
        as infeasible and told to Optuna without running anything."""
        from autotune.search import screen  # through the module: tests may stand in for the model

        self._predictions[trial.number] = self.calibration.predict(config)
        predicted = screen.predict_peak(config, self.device_type)
        trial.set_user_attr("predicted_peak_bytes", predicted)
        if self._fits(predicted):
            return True, predicted
        required = screen.required_bytes(predicted, self.device_type)
        set_excess(trial, (required - self.limit) / GIB)
        self._store_unmeasured(
            trial.number, config, TrialStatus.INFEASIBLE_PREDICTED, predicted,
            error=self._over_limit(predicted))
        self.study.tell(trial, 0.0)
        self._progress(done, config, "infeasible (predicted)", start)
        return False, predicted

    # ---- run --------------------------------------------------------------------------------
    def _run_trial(self, config: TrialConfig):
        """Runs on a trial thread: the measurement only; the database and Optuna are touched
        on the loop's own thread."""
        try:
            return self._measure(config)
        except (TrialFailed, ClusterError) as e:
            return e

    def _measure(self, config: TrialConfig) -> TrialResult:
        """One measurement of ``config``; a run that had to build its worker group is run again
        and the warm figure kept (the cold one is remembered for the trial's metrics)."""
        result = self.executor.run(config)
        if result.cold_start:
            self._cold[config] = result.throughput_tokens_per_s
            result = self.executor.run(config)
        return result

    # ---- tell -------------------------------------------------------------------------------
    def _finish(self, trial, config: TrialConfig, predicted: int | None, outcome, done: int,
                start: float) -> None:
        from optuna.trial import TrialState

        if isinstance(outcome, ClusterError):
            # Nothing ran: the cluster cannot hold the world size. Before any trial that is
            # the user's error to fix; later (a node was lost, say) the search stops on that
            # one line and what it measured stands.
            if self._num_run == 0:
                self.study.tell(trial, state=TrialState.FAIL)
                raise outcome
            self._cluster_stopped = f"the Ray cluster cannot run more trials: {outcome}"
            self.study.tell(trial, state=TrialState.FAIL)
            return
        value, status = self._store(trial, config, predicted, outcome)
        self._num_run += 1
        if status == TrialStatus.FAILED:
            self.study.tell(trial, state=TrialState.FAIL)
        else:
            self.study.tell(trial, value)
        if status == TrialStatus.COMPLETE and value > self._best:
            self._best, self._since_best = value, 0
        else:
            self._since_best += 1
        self._progress(done, config, status, start)

    def _store(self, trial, config: TrialConfig, predicted: int | None,
               result: TrialResult | TrialFailed) -> tuple[float, TrialStatus]:
        """Classify and store a measured trial (a TrialResult, or the TrialFailed it raised):
        (the value to tell Optuna, its status)."""
        from autotune.study.store import search_record

        if isinstance(result, TrialFailed):
            status = (TrialStatus.INFEASIBLE_MEASURED if result.kind == FailureKind.OOM
                      else TrialStatus.FAILED)
            if status == TrialStatus.INFEASIBLE_MEASURED:
                set_excess(trial, 1.0)
            # A layout the nodes cannot hold (a TP group wider than a node) ran nothing.
            error = f"not run: {result}" if isinstance(result, PlacementError) else str(result)
            self._store_unmeasured(trial.number, config, status, predicted, error=error)
            return 0.0, status
        # The device's peak (the allocator's reserve plus what lies outside it), not the
        # allocated bytes alone: a trial whose tensors fit can still run out of memory.
        measured = result.device_peak_bytes
        status, error = TrialStatus.COMPLETE, None
        if self.limit is not None and measured > self.limit:
            status = TrialStatus.INFEASIBLE_MEASURED
            set_excess(trial, (measured - self.limit) / GIB)
            error = measured_over_limit(result, self.limit)
        else:
            self._set_feasible(trial, measured)
        predictions = self._predictions.pop(trial.number, {})
        if config in self._cold:
            predictions = {**predictions,
                           "cold_start_discarded_tokens_per_s": self._cold.pop(config)}
        interval = run_interval(result, config)
        if interval is not None:  # re-measurements replace it with one over the runs
            predictions = {**predictions, "throughput_interval": interval.to_dict()}
        record, spans = search_record(
            result, study_id=self.study_id, number=trial.number, status=status,
            predicted_peak=predicted, predictions=predictions, error=error)
        trial_id = self.db.add_trial(record, spans)
        if status == TrialStatus.COMPLETE:
            self.calibration.remember_spans(trial_id, config,
                                            [s for r in result.ranks for s in r.spans])
            self.calibration.refit()
        value = result.throughput_tokens_per_s if status == TrialStatus.COMPLETE else 0.0
        self._known[config] = Known(status, value, measured or predicted or 0)
        return value, status

    def _store_unmeasured(self, number: int, config: TrialConfig, status: TrialStatus,
                          predicted: int | None, *, error: str) -> None:
        from autotune.study.store import unmeasured_record

        self.db.add_trial(unmeasured_record(
            config, study_id=self.study_id, number=number, status=status,
            predicted_peak=predicted, predictions=self._predictions.pop(number, {}),
            error=error))
        self._known[config] = Known(status, 0.0, predicted or 0)

    def _progress(self, i: int, config: TrialConfig, status: str, start: float) -> None:
        from autotune.layouts import short_name

        elapsed = time.monotonic() - start
        per = elapsed / max(1, i - self._initial_done)
        left = max(0, self.spec.n_trials - i)
        eta = f", ~{per * left:.0f}s left" if per else ""
        self._say(f"[{i}/{self.spec.n_trials}] {short_name(config)}: {status}; best "
                  f"{self._best:,.0f} tok/s; {elapsed:.0f}s elapsed{eta}")

    # ---- then -------------------------------------------------------------------------------
    def _remeasure_top(self) -> list[Entry]:
        """Measure the top_k again in interleaved rounds and store each figure with its round;
        the final leaderboard.

        The finalists (``finalist_ids``) are fixed before the first round, so every round
        compares the same ones. Each round measures every
        finalist once, starting one further along each round (A B C, B C A, …), so drift over a
        round's minutes falls on all of them alike and the per-round ratios cancel it
        (``leaderboard.compare``). Rounds continue until each finalist has
        ``remeasure_repeats`` of them and the runner-up is no longer tied with the fastest, or
        ``remeasure_max_repeats`` rounds have run. A finalist that fails is measured no more."""
        spec = self.spec
        board = self.leaderboard()
        most = (max(spec.remeasure_repeats, spec.remeasure_max_repeats)
                if spec.remeasure_repeats else 0)
        next_round = 1 + max((r for e in board for r in e.rounds if r > 0), default=0)
        finalists = finalist_ids(board, spec.top_k)
        failed: set[int] = set()
        for done in range(most):
            if self._cluster_stopped:
                break
            top = [e for e in board if e.trial_id in finalists and e.trial_id not in failed]
            short = [e for e in top if len(e.rounds) < spec.remeasure_repeats]
            if not top or (not short and not self._tie_to_resolve(board, top)):
                break
            shift = done % len(top)
            figures = []
            for entry in top[shift:] + top[:shift]:
                if self._cluster_stopped:
                    break
                try:
                    x = self._measure(entry.config).throughput_tokens_per_s
                except (TrialFailed, ClusterError) as e:
                    failed.add(entry.trial_id)
                    self._say(f"re-measuring trial {entry.number} failed: {e}")
                    continue
                self._add_remeasurement(entry.trial_id, x, next_round)
                figures.append(f"trial {entry.number} {x:,.0f}")
            self._say(f"re-measured, round {next_round}: {'; '.join(figures)} tok/s")
            next_round += 1
            board = self.leaderboard()
        return board

    @staticmethod
    def _tie_to_resolve(board: list[Entry], top: list[Entry]) -> bool:
        """The runner-up is tied with the fastest and both are among those re-measured (with
        top_k 1 another round cannot separate them)."""
        verdict = declare_best(board)
        ids = {e.trial_id for e in top}
        return (verdict is not None and verdict.is_tie and verdict.fastest.trial_id in ids
                and verdict.runner_up.trial_id in ids)

    def _add_remeasurement(self, trial_id: int, throughput: float, round_: int) -> None:
        """Append a re-measurement and its round to a trial's metrics, and store its interval
        over all its runs now (``throughput_interval``)."""
        from autotune.model.noise import throughput_interval

        record = self.db.get_trial(trial_id)
        m = record.metrics
        runs = m.get("remeasured_throughputs", []) + [throughput]
        metrics = {**m, "remeasured_throughputs": runs,
                   "remeasured_rounds": m.get("remeasured_rounds", []) + [round_],
                   "throughput_interval": throughput_interval(
                       [m["throughput_tokens_per_s"], *runs]).to_dict()}
        self.db.update_trial(trial_id, status=record.status, metrics=metrics)


def finalist_ids(board: list[Entry], top_k: int) -> set[int]:
    """The trials re-measured before a best is declared: the top_k complete ones by the figure
    each measured during the search, and the study's first trial if it completed.

    The first trial is the plain baseline (``search.plain_baseline``) unless the search was
    started without one: the layout a user would run without autotune. A recommendation has to
    beat it side by side, in the same interleaved rounds. Its one search figure alone can miss
    the top_k by noise (10-23% between trials on a shared machine): in ``bench/
    ranking_stability.py`` the plain layout, the truth's best by 30%, was dropped that way."""
    complete = [e for e in board if e.status == TrialStatus.COMPLETE]
    ranked = sorted(complete, key=lambda e: -e.throughputs[0])
    finalists = {e.trial_id for e in ranked[:top_k]}
    first = min(board, key=lambda e: e.number, default=None)
    if first is not None and first.status == TrialStatus.COMPLETE:
        finalists.add(first.trial_id)
    return finalists


def measured_over_limit(result: TrialResult, limit: int) -> str:
    """Why a measured trial is infeasible: its device peak and, where that is more than the
    allocated peak (on CUDA), what the highest rank's is made of."""
    rank = max(result.ranks, key=lambda r: r.device_peak_bytes)
    why = f"measured peak {rank.device_peak_bytes / GIB:.3g} GiB > limit {limit / GIB:.3g} GiB"
    if rank.device_peak_bytes == rank.memory.peak:
        return why  # on CPU: the allocated peak alone
    parts = [f"allocated {rank.memory.peak / GIB:.3g}"]
    if rank.memory.reserved_peak is not None:
        parts.append(f"reserved {rank.memory.reserved_peak / GIB:.3g}")
    if rank.outside_allocator_bytes is not None:
        parts.append(f"outside the allocator {rank.outside_allocator_bytes / GIB:.3g}")
    return f"{why} (rank {rank.rank}: {', '.join(parts)} GiB)"


def run_interval(result: TrialResult, config: TrialConfig):
    """The interval of one run's tokens/s from its timed steps (the slowest rank's each), or
    None with fewer than two (``noise.throughput_interval``)."""
    from autotune.model.noise import throughput_interval

    timed = range(config.num_warmup_steps, config.num_warmup_steps + config.num_timed_steps)
    steps = [max(r.step_times[i] for r in result.ranks) for i in timed]
    return throughput_interval([result.throughput_tokens_per_s], steps,
                               config.tokens_per_step)


def _short(config: TrialConfig) -> str:
    from autotune.layouts import short_name

    return short_name(config)


def _done_future(fn, *args):
    """A future already resolved by calling ``fn`` here (one trial at a time: no thread, so
    Ctrl-C reaches the trial where it runs)."""
    from concurrent.futures import Future

    future: Future = Future()
    future.set_result(fn(*args))
    return future
