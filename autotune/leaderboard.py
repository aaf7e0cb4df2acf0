"""The leaderboard: a study's trial records ranked, and printed.

``build_leaderboard`` takes trial records (``db.TrialRecord``s, however they were read), not a
database handle: the search ranks the records it reads once, and the dashboard the ones it has
already loaded, so both show the same order and the same medians. Order: complete trials by
median throughput (the first run and every re-measurement), then the others by
``status.STATUS_ORDER`` (infeasible measured, infeasible predicted, failed).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autotune.config import TrialConfig
from autotune.status import TrialStatus, status_rank

if TYPE_CHECKING:
    from autotune.search_loop import SearchOutcome
    from db import TrialRecord


@dataclass(frozen=True)
class Entry:
    """One configuration on the leaderboard."""

    trial_id: int
    number: int
    config: TrialConfig
    status: TrialStatus
    throughputs: list[float]
    """Every measurement of tokens/s (first run, then re-measurements)."""
    predicted_peak: int | None
    measured_peak: int | None
    error: str | None = None
    step_time_s: float | None = None
    """Measured step time of the trial's run (None when it measured none)."""
    predicted_step_time_s: float | None = None
    """The performance model's step time, as the search stored it before the trial ran (None
    for trials stored without one)."""

    @property
    def step_time_error(self) -> float | None:
        """predicted / measured − 1 of the step time; None unless both are known."""
        if self.predicted_step_time_s is None or not self.step_time_s:
            return None
        return self.predicted_step_time_s / self.step_time_s - 1

    @property
    def throughput(self) -> float:
        return statistics.median(self.throughputs) if self.throughputs else 0.0

    @property
    def spread(self) -> float:
        """(max − min) / median of the measurements; 0 with one measurement."""
        if len(self.throughputs) < 2 or not self.throughput:
            return 0.0
        return (max(self.throughputs) - min(self.throughputs)) / self.throughput


def build_leaderboard(records: Iterable[TrialRecord]) -> list[Entry]:
    """Trial records as leaderboard entries: complete ones by median throughput, then infeasible
    (measured, predicted) and failed ones. Records without a trial number (stored outside a
    search) are left out."""
    entries = []
    for t in records:
        if t.number is None:
            continue
        throughputs = list(t.metrics.get("remeasured_throughputs", []))
        if t.status == TrialStatus.COMPLETE:
            throughputs = [t.metrics["throughput_tokens_per_s"]] + throughputs
        predicted = next((m.predicted_bytes for m in t.memory if m.category == "peak"), None)
        entries.append(Entry(t.id, t.number, TrialConfig.from_dict(t.config),
                             TrialStatus(t.status), throughputs, predicted,
                             t.metrics.get("peak_memory_bytes"), t.error,
                             _seconds(t.metrics.get("step_time_s")),
                             _seconds(t.metrics.get("predicted_step_time_s"))))
    entries.sort(key=lambda e: (status_rank(e.status), -e.throughput, e.number))
    return entries


def best_entry(entries: Iterable[Entry]) -> Entry | None:
    """The first complete entry of a leaderboard (the best), or None when none completed."""
    return next((e for e in entries if e.status == TrialStatus.COMPLETE), None)


def _seconds(value) -> float | None:
    """A stored time in seconds, or None when absent or not a finite number ≥ 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def step_time_mape(entries: Sequence[Entry]) -> tuple[float, int] | None:
    """(mean absolute percentage error of the predicted step time, trials counted) over the
    complete entries that have both a prediction and a measurement; None when none has."""
    errors = [abs(e.step_time_error) for e in entries
              if e.status == TrialStatus.COMPLETE and e.step_time_error is not None]
    return (sum(errors) / len(errors), len(errors)) if errors else None


def format_leaderboard(outcome: SearchOutcome, limit_bytes: int | None, top: int = 10) -> str:
    """The search's leaderboard as the CLI prints it (the first ``top`` entries)."""
    from autotune.layouts import short_name

    lines = [f"{'#':>3} {'trial':>5}  {'configuration':<44} {'tok/s':>10} {'spread':>7} "
             f"{'step ms':>9} {'pred ms':>9} {'error':>8} {'peak MiB':>9} {'pred MiB':>9}  "
             "status"]
    for i, e in enumerate(outcome.leaderboard[:top], 1):
        complete = e.status == TrialStatus.COMPLETE
        peak = f"{e.measured_peak / 2**20:.1f}" if e.measured_peak else "-"
        pred = f"{e.predicted_peak / 2**20:.1f}" if e.predicted_peak else "-"
        tput = f"{e.throughput:,.0f}" if complete else "-"
        spread = f"{e.spread:.1%}" if len(e.throughputs) > 1 else "-"
        step = f"{e.step_time_s * 1e3:.1f}" if e.step_time_s is not None else "-"
        pred_step = (f"{e.predicted_step_time_s * 1e3:.1f}"
                     if e.predicted_step_time_s is not None else "-")
        error = f"{e.step_time_error:+.1%}" if e.step_time_error is not None else "-"
        status = e.status if not e.error or complete else f"{e.status}: {e.error}"
        lines.append(f"{i:>3} {e.number:>5}  {short_name(e.config):<44} {tput:>10} "
                     f"{spread:>7} {step:>9} {pred_step:>9} {error:>8} {peak:>9} {pred:>9}  "
                     f"{status[:120]}")
    limit = f"{limit_bytes / 2**20:.1f} MiB" if limit_bytes else "none"
    lines.append(f"memory limit per device: {limit}; spread = (max − min) / median of the "
                 "re-measurements")
    if any(e.predicted_step_time_s is not None for e in outcome.leaderboard):
        mape = step_time_mape(outcome.leaderboard)
        lines.append("pred ms = the performance model's step time before the trial ran; error "
                     "= predicted / measured − 1" + (
                         f"; MAPE {mape[0]:.1%} over {mape[1]} complete trials" if mape else ""))
    return "\n".join(lines)
