"""Concluding a trial: the one place where its state, its memory excess, Optuna's tell and the
stored record are set (as optuna's ``_optimize._run_trial`` decides a state once and hands it to
``_tell_with_warning``).

Each outcome has one function that builds its ``Verdict``:

    measured result      → ``of_result``     complete, or infeasible (measured peak > limit)
    TrialFailed raised   → ``of_failure``    infeasible (out of memory), or failed
    screened out         → ``of_screen``     infeasible (predicted peak + allowances > limit)
    proposed again       → ``of_known``      the stored outcome, told again (nothing stored)
    passed over          → ``of_passed``     skipped, or infeasible (predicted); no trial
    still running / nothing ran → ``DROPPED``  told failed (nothing stored)

and ``Concluder.conclude`` applies a verdict: the constraint, the tell, the record, the index
of known outcomes. Called from the loop's thread only.

The memory constraint (Optuna's ``Trial.set_constraint``, ≤ 0 feasible) is the excess over the
limit in GiB: the predicted peak with the screen's allowances for one screened out, the
measured device peak for one measured, 1 GiB for one that ran out of memory (how far is not
known), at least 1e-9 for one known infeasible. Under a limit every trial told with a value
carries it, feasible ones too (≤ 0): GP refuses a history where only some trials have one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from autotune.config import GIB, TrialConfig
from autotune.errors import PlacementError, TrialFailed
from autotune.status import FailureKind, TrialStatus

if TYPE_CHECKING:
    from autotune.search.strategies.base import PassedOver
    from autotune.search.study_calibration import StudyCalibration
    from autotune.trial.result import TrialResult

CONSTRAINT_ATTR = "memory_excess_gib"
OOM_EXCESS_GIB = 1.0
"""The excess told for a trial that ran out of memory: over the limit by an unknown amount."""


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


@dataclass(frozen=True, slots=True)
class Verdict:
    """How one trial concludes."""

    status: TrialStatus
    value: float = 0.0
    """Told to Optuna (tokens/s when complete, else 0); not told for a failed trial."""
    excess_gib: float | None = None
    """The memory constraint to set; None: none (no limit, or a failed trial)."""
    peak: int = 0
    """Kept in the index of known outcomes (``Known.peak``)."""
    error: str | None = None
    store: bool = True
    """False: told to Optuna only (proposed again, or nothing ran)."""
    result: Any = field(default=None, compare=False)
    """The measured ``TrialResult``, for a verdict of one."""


DROPPED = Verdict(TrialStatus.FAILED, store=False)
"""A trial closed without an outcome: its configuration is still running, or nothing ran."""


def _feasible(peak: int | None, limit: int | None) -> float | None:
    return None if limit is None else min((peak or 0) - limit, 0) / GIB


def of_result(result: TrialResult, limit: int | None, predicted: int | None) -> Verdict:
    """A measured trial: infeasible when its device peak (the allocator's reserve plus what
    lies outside it, not the allocated bytes alone: a trial whose tensors fit can still run
    out of memory) is over the limit, else complete."""
    measured = result.device_peak_bytes
    peak = measured or predicted or 0
    if limit is not None and measured > limit:
        return Verdict(
            TrialStatus.INFEASIBLE_MEASURED,
            0.0,
            (measured - limit) / GIB,
            peak,
            measured_over_limit(result, limit),
            result=result,
        )
    return Verdict(
        TrialStatus.COMPLETE,
        result.throughput_tokens_per_s,
        _feasible(measured, limit),
        peak,
        result=result,
    )


def of_failure(failure: TrialFailed, predicted: int | None) -> Verdict:
    """A trial that raised: out of memory is infeasible, anything else failed. A layout the
    nodes cannot hold (a TP group wider than a node) ran nothing."""
    error = f"not run: {failure}" if isinstance(failure, PlacementError) else str(failure)
    if failure.kind == FailureKind.OOM:
        return Verdict(TrialStatus.INFEASIBLE_MEASURED, 0.0, OOM_EXCESS_GIB, predicted or 0, error)
    return Verdict(TrialStatus.FAILED, peak=predicted or 0, error=error)


def of_screen(predicted: int, required: int, limit: int, why: str) -> Verdict:
    """Screened out: the predicted peak with the screen's allowances (``required``) is over
    the limit."""
    return Verdict(TrialStatus.INFEASIBLE_PREDICTED, 0.0, (required - limit) / GIB, predicted, why)


def of_known(known: Known, limit: int | None) -> Verdict:
    """A configuration proposed again: its stored outcome, told again and not stored."""
    if known.status == TrialStatus.FAILED:
        return DROPPED
    if known.status.infeasible:
        excess = (known.peak - limit) / GIB if limit is not None else 0.0
        return Verdict(known.status, known.value, max(excess, 1e-9), store=False)
    return Verdict(known.status, known.value, _feasible(known.peak, limit), store=False)


def of_passed(passed: PassedOver, over_limit: str) -> Verdict:
    """A configuration the strategy passed over: skipped, or kept out by the memory screen
    (``over_limit`` says why); no trial, so nothing is told."""
    if passed.over_memory_peak is not None:
        return Verdict(
            TrialStatus.INFEASIBLE_PREDICTED, peak=passed.over_memory_peak, error=over_limit
        )
    return Verdict(TrialStatus.SKIPPED_PREDICTED, error=f"skipped: {passed.reason}")


def set_excess(trial, excess_gib: float) -> None:
    """Tell Optuna how far over the memory limit a trial was (its constraint; ≤ 0 feasible)."""
    trial.set_constraint(CONSTRAINT_ATTR, excess_gib)
    trial.set_user_attr(CONSTRAINT_ATTR, excess_gib)


@dataclass
class Concluder:
    """Applies verdicts to one study: Optuna's trial, the database's record, the index."""

    study: Any
    database: Any
    study_id: int
    calibration: StudyCalibration
    known: dict[TrialConfig, Known] = field(default_factory=dict)
    """The index: every configuration stored in the study, and its outcome."""
    predictions: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Trial number → the predicted step time metrics, until the trial is stored."""
    extra_metrics: Callable[[TrialConfig, Any], dict[str, Any]] = lambda config, result: {}
    """Metrics a measured trial's record adds (the loop's cold-start figure, the interval)."""

    def conclude(
        self, trial, config: TrialConfig, verdict: Verdict, *, predicted: int | None = None
    ) -> int | None:
        """Set the constraint, store the record, tell Optuna: the one place each is done.
        ``trial`` is None for a configuration passed over (stored, not told). The stored
        trial's id, or None when nothing is stored."""
        from optuna.trial import TrialState

        if trial is not None and verdict.excess_gib is not None:
            set_excess(trial, verdict.excess_gib)
        trial_id = self._store(trial, config, verdict, predicted) if verdict.store else None
        if trial is not None:
            if verdict.status == TrialStatus.FAILED:
                self.study.tell(trial, state=TrialState.FAIL)
            else:
                self.study.tell(trial, verdict.value)
        return trial_id

    def _store(self, trial, config: TrialConfig, verdict: Verdict, predicted: int | None) -> int:
        from autotune.study.store import search_record, unmeasured_record

        number = trial.number if trial is not None else None
        predictions = (
            self.predictions.pop(number, {})
            if number is not None
            else self.calibration.predict(config)
        )
        if verdict.result is None:
            trial_id = self.database.add_trial(
                unmeasured_record(
                    config,
                    study_id=self.study_id,
                    number=number,
                    status=verdict.status,
                    predicted_peak=predicted,
                    predictions=predictions,
                    error=verdict.error,
                )
            )
        else:
            result = verdict.result
            record, spans = search_record(
                result,
                study_id=self.study_id,
                number=number,
                status=verdict.status,
                predicted_peak=predicted,
                predictions={**predictions, **self.extra_metrics(config, result)},
                error=verdict.error,
            )
            trial_id = self.database.add_trial(record, spans)
            if verdict.status == TrialStatus.COMPLETE:
                self.calibration.remember_spans(
                    trial_id, config, [s for r in result.ranks for s in r.spans]
                )
                self.calibration.refit()
        self.known[config] = Known(verdict.status, verdict.value, verdict.peak or 0)
        return trial_id


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
