"""The leaderboard: a study's trial records ranked, and printed.

``build_leaderboard`` takes trial records (``db.TrialRecord``s, however they were read), not a
database handle: the search ranks the records it reads once, and the dashboard the ones it has
already loaded, so both show the same order and the same medians. Order: complete trials by
median throughput (the first run and every re-measurement) — first the finalists, those the
search re-measured in interleaved rounds, then those measured once — then the others by
``status.STATUS_ORDER`` (infeasible measured, infeasible predicted, failed). A figure measured
once, at another time, is not comparable with figures measured side by side under the same
drift (issue 9: a trial's runs vary by 10–23% with the machine's load), so a lucky single run
does not overtake the finalists.

Every complete entry has a confidence interval of its tokens/s (``autotune.model.noise``): over its
runs once it was re-measured, else over the timed steps of its one run. ``declare_best`` names
the best with its interval and says when the runner-up is tied with it within noise (``TIE_RULE``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from autotune.config import AC_ORDER, TrialConfig
from autotune.model.noise import Interval, paired_ratio_interval, throughput_interval
from autotune.status import TrialStatus, status_rank

if TYPE_CHECKING:
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
    rounds: tuple[int, ...] = ()
    """The interleaved re-measurement round of each re-measurement (``throughputs[1:]``)."""
    step_times: tuple[float, ...] = ()
    """The first run's timed steps (seconds, the slowest rank's), for a one-run interval."""
    device_peak: int | None = None
    """The measured device peak held against the memory limit (the allocator's reserved peak
    plus memory outside it, ``TrialResult.device_peak_bytes``); None when not stored."""

    @property
    def interval(self) -> Interval | None:
        """The confidence interval of its tokens/s (``noise.throughput_interval``); None unless
        complete with two runs or two timed steps."""
        if self.status != TrialStatus.COMPLETE:
            return None
        return throughput_interval(self.throughputs, self.step_times, self.config.tokens_per_step)

    def by_round(self) -> dict[int, float]:
        """Re-measured tokens/s by interleaved round."""
        return dict(zip(self.rounds, self.throughputs[1:]))

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
        rounds = tuple(t.metrics.get("remeasured_rounds", ()))
        if len(rounds) != len(throughputs):  # stored before rounds were: none of them paired
            rounds = tuple(-i for i in range(1, len(throughputs) + 1))
        if t.status == TrialStatus.COMPLETE:
            throughputs = [t.metrics["throughput_tokens_per_s"]] + throughputs
        predicted = next((m.predicted_bytes for m in t.memory if m.category == "peak"), None)
        entries.append(
            Entry(
                t.id,
                t.number,
                TrialConfig.from_dict(t.config),
                TrialStatus(t.status),
                throughputs,
                predicted,
                t.metrics.get("peak_memory_bytes"),
                t.error,
                _seconds(t.metrics.get("step_time_s")),
                _seconds(t.metrics.get("predicted_step_time_s")),
                rounds,
                timed_steps(t),
                t.metrics.get("device_peak_bytes"),
            )
        )
    entries.sort(key=lambda e: (status_rank(e.status), not e.rounds, -e.throughput, e.number))
    return entries


def timed_steps(record: TrialRecord) -> tuple[float, ...]:
    """The slowest rank's time of each timed step of a stored trial's run."""
    by_step: dict[int, float] = {}
    for s in record.steps:
        if s.phase == "timed":
            by_step[s.step] = max(by_step.get(s.step, 0.0), s.time_s)
    return tuple(by_step[k] for k in sorted(by_step))


def best_entry(entries: Iterable[Entry]) -> Entry | None:
    """The declared best of a leaderboard (``declare_best``'s pick), or None when no trial
    completed."""
    verdict = declare_best(list(entries))
    return verdict.pick if verdict else None


# ---- the declared best ---------------------------------------------------------------------
EQUIVALENT_WITHIN = 0.03
"""Two configurations are equivalent when the paired interval of their ratio lies within
1 ± 3%: the 3% within which the project calls two throughputs equal (``replay.WITHIN``, the
model-guided strategy's tolerance)."""
TIE_RULE = (
    "tied within noise: the fastest by median is kept, unless a configuration tied with "
    "it is shown equivalent — the paired interval of its ratio to the fastest within "
    f"1 ± {EQUIVALENT_WITHIN:.0%} — and uses less measured peak memory or, with equal "
    "memory, a simpler layout (fewer tp × pp ranks, less recomputation, a lower ZeRO "
    "stage)"
)


def simplicity(config: TrialConfig) -> tuple[int, int, int]:
    """Smaller is simpler: tp × pp, recomputation, ZeRO stage."""
    return (
        config.tp_degree * config.pp_degree,
        AC_ORDER[config.activation_checkpointing],
        config.zero_stage,
    )


def compare(fastest: Entry, other: Entry) -> tuple[bool, Interval | None]:
    """(tied within noise?, the interval of other / fastest from shared rounds, or None).

    With two or more interleaved rounds in common, the paired interval of the per-round ratio
    decides (machine-wide drift cancels within a round): tied when it contains 1. Otherwise the
    two configurations' own intervals decide: tied when they overlap."""
    a, b = fastest.by_round(), other.by_round()
    shared = sorted(a.keys() & b.keys())
    ratio = paired_ratio_interval([b[r] for r in shared], [a[r] for r in shared])
    if ratio is not None:
        return ratio.contains(1.0), ratio
    ia, ib = fastest.interval, other.interval
    return (ia is not None and ib is not None and ia.overlaps(ib)), None


def equivalent(fastest: Entry, other: Entry) -> bool:
    """The paired interval of other / fastest over their shared rounds lies within
    1 ± ``EQUIVALENT_WITHIN`` (an equivalence test by two one-sided intervals, Schuirmann 1987,
    here at the 95% two-sided level: conservative). Without two shared rounds, never."""
    _, ratio = compare(fastest, other)
    return (
        ratio is not None
        and ratio.low >= 1 - EQUIVALENT_WITHIN
        and ratio.high <= 1 + EQUIVALENT_WITHIN
    )


@dataclass(frozen=True)
class Verdict:
    """The declared best of a leaderboard and how sure that is."""

    fastest: Entry
    """The first complete entry: the highest median tokens/s among the finalists (those
    re-measured in rounds), or among all complete ones when none was re-measured."""
    pick: Entry
    """The declared best: the fastest, or by ``TIE_RULE`` one tied with it."""
    runner_up: Entry | None
    runner_up_ratio: Interval | None
    """runner-up / fastest from their shared interleaved rounds (None with fewer than two)."""
    tied: tuple[Entry, ...]
    """The other complete entries tied with the fastest within noise, in leaderboard order."""

    @property
    def is_tie(self) -> bool:
        """The runner-up cannot be told apart from the fastest."""
        return bool(self.tied) and self.runner_up is not None and self.runner_up in self.tied

    def describe(self) -> str:
        """The verdict in a few lines, as the CLI prints it."""
        from autotune.layouts import short_name

        lines = [
            f"best: trial {self.pick.number} {short_name(self.pick.config)}, "
            f"{self.pick.throughput:,.0f} tok/s ({_interval_text(self.pick.interval)})"
        ]
        if self.runner_up is None:
            return lines[0] + "; the only complete trial"
        second = self.runner_up
        how = (
            f"runner-up / fastest {_ratio_text(self.runner_up_ratio)} over "
            f"{self.runner_up_ratio.n} interleaved rounds"
            if self.runner_up_ratio
            else "their intervals " + ("overlap" if self.is_tie else "do not overlap")
        )
        if self.is_tie:
            names = ", ".join(f"trial {e.number}" for e in (self.fastest, *self.tied))
            lines.append(f"tied within noise: {names} ({how})")
            lines.append(
                f"picked by the rule — {TIE_RULE}"
                if self.pick is not self.fastest
                else "kept the fastest: no tied configuration is shown within "
                f"{EQUIVALENT_WITHIN:.0%} of it with less memory or a simpler "
                "layout"
            )
        else:
            lines.append(
                f"ahead of trial {second.number} ({second.throughput:,.0f} tok/s) "
                f"beyond noise: {how}"
            )
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """For best_config.json: the pick's interval and the tie, if any."""
        interval = self.pick.interval
        return {
            "throughput_interval": interval.to_dict() if interval else None,
            "fastest_trial": self.fastest.number,
            "picked_trial": self.pick.number,
            "tied_within_noise": self.is_tie,
            "tied_trials": [e.number for e in self.tied],
            "runner_up_trial": self.runner_up.number if self.runner_up else None,
            "runner_up_ratio": (self.runner_up_ratio.to_dict() if self.runner_up_ratio else None),
            "rule": TIE_RULE if self.is_tie else "the fastest by median tokens/s",
        }


def declare_best(entries: Sequence[Entry]) -> Verdict | None:
    """The best of a leaderboard with its interval; None when no entry is complete.

    The fastest is the first complete entry (``build_leaderboard``'s order: finalists first,
    by median). Every other complete entry is
    compared with it (``compare``); if the runner-up is tied with it, the pick follows
    ``TIE_RULE`` among the tied entries shown ``equivalent`` to the fastest."""
    complete = [e for e in entries if e.status == TrialStatus.COMPLETE]
    if not complete:
        return None
    fastest = complete[0]
    runner_up = complete[1] if len(complete) > 1 else None
    tied, ratio = [], None
    for e in complete[1:]:
        is_tied, r = compare(fastest, e)
        if e is runner_up:
            ratio = r
        if is_tied:
            tied.append(e)
    pick = fastest
    if runner_up is not None and runner_up in tied:
        candidates = [fastest] + [e for e in tied if equivalent(fastest, e)]
        pick = min(
            candidates,
            key=lambda e: (
                e.measured_peak if e.measured_peak is not None else math.inf,
                simplicity(e.config),
                -e.throughput,
            ),
        )
    return Verdict(fastest, pick, runner_up, ratio, tuple(tied))


def _interval_text(interval: Interval | None) -> str:
    if interval is None:
        return "no interval: one measurement"
    what = (
        "runs"
        if interval.source == "runs"
        else "timed steps of one run; drift between trials not seen"
    )
    return (
        f"{interval.confidence:.0%} CI {interval.low:,.0f}–{interval.high:,.0f} over "
        f"{interval.n} {what}"
    )


def _ratio_text(ratio: Interval) -> str:
    return f"{ratio.estimate:.3f} [{ratio.low:.3f}, {ratio.high:.3f}]"


def _seconds(value) -> float | None:
    """A stored time in seconds, or None when absent or not a finite number ≥ 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def step_time_mape(entries: Sequence[Entry]) -> tuple[float, int] | None:
    """(mean absolute percentage error of the predicted step time, trials counted) over the
    complete entries that have both a prediction and a measurement; None when none has."""
    errors = [
        abs(e.step_time_error)
        for e in entries
        if e.status == TrialStatus.COMPLETE and e.step_time_error is not None
    ]
    return (sum(errors) / len(errors), len(errors)) if errors else None


class Ranked(Protocol):
    """What ``format_leaderboard`` reads of a search's outcome (``search.loop.SearchOutcome``)."""

    leaderboard: list[Entry]


def format_leaderboard(outcome: Ranked, limit_bytes: int | None, top: int = 10) -> str:
    """The search's leaderboard as the CLI prints it (the first ``top`` entries)."""
    from autotune.layouts import short_name

    verdict = declare_best(outcome.leaderboard)
    lines = [
        f"{'#':>3} {'trial':>5}  {'configuration':<44} {'tok/s':>10} "
        f"{'95% CI':>17} {'n':>3} {'step ms':>9} {'pred ms':>9} {'error':>8} "
        f"{'peak MiB':>9} {'pred MiB':>9}  status"
    ]
    for i, e in enumerate(outcome.leaderboard[:top], 1):
        complete = e.status == TrialStatus.COMPLETE
        peak = f"{e.measured_peak / 2**20:.1f}" if e.measured_peak else "-"
        pred = f"{e.predicted_peak / 2**20:.1f}" if e.predicted_peak else "-"
        tput = f"{e.throughput:,.0f}" if complete else "-"
        interval = e.interval
        ci = f"{interval.low:,.0f}–{interval.high:,.0f}" if interval else "-"
        n = (
            (
                f"{len(e.throughputs)}"
                + ("" if interval is None or interval.source == "runs" else "s")
            )
            if complete
            else "-"
        )
        step = f"{e.step_time_s * 1e3:.1f}" if e.step_time_s is not None else "-"
        pred_step = (
            f"{e.predicted_step_time_s * 1e3:.1f}" if e.predicted_step_time_s is not None else "-"
        )
        error = f"{e.step_time_error:+.1%}" if e.step_time_error is not None else "-"
        status = e.status if not e.error or complete else f"{e.status}: {e.error}"
        mark = "*" if verdict and e is verdict.pick else " "
        lines.append(
            f"{i:>3}{mark}{e.number:>5}  {short_name(e.config):<44} {tput:>10} "
            f"{ci:>17} {n:>3} {step:>9} {pred_step:>9} {error:>8} {peak:>9} "
            f"{pred:>9}  {status[:120]}"
        )
    limit = f"{limit_bytes / 2**20:.1f} MiB" if limit_bytes else "none"
    lines.append(
        f"memory limit per device: {limit}; tok/s = median of the n runs (first trial "
        "and interleaved re-measurements); 95% CI = Student-t interval of the mean "
        "log tokens/s over the runs, or over the timed steps where n ends in s (one "
        "run: drift between trials not seen)"
    )
    if any(e.predicted_step_time_s is not None for e in outcome.leaderboard):
        mape = step_time_mape(outcome.leaderboard)
        lines.append(
            "pred ms = the performance model's step time before the trial ran; error "
            "= predicted / measured − 1"
            + (f"; MAPE {mape[0]:.1%} over {mape[1]} complete trials" if mape else "")
        )
    if verdict is not None:
        lines.append(verdict.describe() + "  (* on the board)")
    return "\n".join(lines)
