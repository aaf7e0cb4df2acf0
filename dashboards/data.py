"""A study read out of the database into plain frozen data, the one input of every figure.

``load_study`` reads through ``db`` only (``list_trials``, ``trial_spans``) and orders the trials
it read as the search's leaderboard does (``autotune.study.leaderboard.build_leaderboard``), so the
dashboard and the printed leaderboard never disagree. Nothing here draws; nothing here escapes (the
figures and the
report escape what they show).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import time
from dataclasses import dataclass
from typing import TextIO

from autotune.config import GIB, TrialConfig, WorkloadSpec
from autotune.errors import AutotuneError
from autotune.layouts import short_name
from autotune.model.noise import Interval
from autotune.model.perf_model import TERMS
from autotune.progress import Progress
from autotune.status import TrialStatus
from autotune.study.leaderboard import Entry, build_leaderboard, declare_best
from db import Database, RankMemoryRecord, SpanRecord, StudyRecord, TrialRecord

MAX_TIMELINES = 10
"""Timelines embedded in one report: the first trials on the leaderboard that have one."""
MAX_SPANS_PER_TIMELINE = 2_500
"""Spans drawn per timeline. A tiny trial profiles ~12,000 spans (2 ranks × 2 steps × ~3,000
ops) at ~60 bytes each in the figure's JSON, and a browser draws each as an SVG path; capped,
ten timelines take 1.5 MB of the report (plotly.js 4.8 MB). Step and communication spans are
always kept, then the longest compute ops: the ones visible at the timeline's scale."""

RAN = tuple(s for s in TrialStatus if s.ran)
"""Statuses of trials that ran (and so may have a timeline and a per-rank breakdown)."""


@dataclass(frozen=True, slots=True)
class RankTimes:
    """One rank's time over a trial's profiled steps, as ``autotune.study.store`` keeps it in the
    trial's metrics['ranks'] from ``profiler.breakdown`` (HTA definitions; read, not
    recomputed: the dashboard never imports ``profiler``)."""

    rank: int
    window_ns: int
    compute_ns: int
    exposed_comm_ns: int
    idle_ns: int
    overlap: float
    """|comm ∩ compute| / |comm|."""
    num_steps: int


@dataclass(frozen=True, slots=True)
class TrialView:
    """One trial as the dashboard shows it, in leaderboard order."""

    position: int
    """1-based place on the leaderboard."""
    trial_id: int
    number: int | None
    """The trial's number in its study (Optuna's trial number); None for a configuration the
    strategy passed over when it stopped (stored, never an Optuna trial)."""
    status: str
    config: TrialConfig
    name: str
    """``layouts.short_name`` of the config."""
    throughput: float | None
    """Median tokens/s of every measurement (the leaderboard's figure); None unless complete."""
    num_measurements: int
    spread: float
    """(max − min) / median of the measurements; 0 with one."""
    run_throughput: float | None
    """Tokens/s the trial measured when it ran (also for one over the memory limit)."""
    step_time_s: float | None
    measured_peak: int | None
    """Measured peak bytes of the worst rank (None when the trial did not run to the end)."""
    predicted_peak: int | None
    """The memory model's peak of the worst rank, as the search screened it."""
    error: str | None
    memory: tuple[RankMemoryRecord, ...]
    ranks: tuple[RankTimes, ...]
    """Per-rank timeline breakdown over the profiled steps (``profiler.analysis``); () without
    a timeline."""
    predicted_step_time_s: float | None = None
    """The performance model's step time, stored by the search before the trial ran; None for
    trials stored without one."""
    predicted_breakdown: tuple[tuple[str, float], ...] = ()
    """(term, seconds per step) of that prediction, in ``perf_model.TERMS`` order; ()
    without one."""
    interval: Interval | None = None
    """The 95% confidence interval of its tokens/s (``Entry.interval``); None unless
    complete with two runs or two timed steps."""

    @property
    def has_timeline(self) -> bool:
        return bool(self.ranks)

    @property
    def label(self) -> str:
        """'trial 3', or 'passed over' for one without a trial number."""
        return "passed over" if self.number is None else f"trial {self.number}"

    @property
    def step_time_error(self) -> float | None:
        """predicted / measured − 1 of the step time; None unless both are known."""
        if self.predicted_step_time_s is None or not self.step_time_s:
            return None
        return self.predicted_step_time_s / self.step_time_s - 1


@dataclass(frozen=True, slots=True)
class Timeline:
    """The spans of one trial drawn on its timeline (at most ``max_spans`` of them)."""

    trial_id: int
    number: int
    name: str
    spans: tuple[SpanRecord, ...]
    """Ordered by (rank, start_ns); all of the trial's spans unless ``total_spans`` is larger."""
    total_spans: int
    ranks: tuple[int, ...]
    """Every rank of the trial (a rank keeps its lane even if the cap left it no span)."""
    nodes: tuple[str, ...] = ()
    """The node each of ``ranks`` ran on, 'host/node id prefix' ('' where unknown)."""


@dataclass(frozen=True, slots=True)
class StudyData:
    """Everything the report shows about one study."""

    name: str
    spec: dict
    database: str
    """The database URL with the password hidden."""
    workload: str
    limit_bytes: int | None
    """The per-device memory limit the search used; None when the spec records none."""
    trials: tuple[TrialView, ...]
    """Leaderboard order (complete trials by median throughput, then infeasible, skipped,
    failed and running), then the configurations passed over without a trial number."""
    timelines: tuple[Timeline, ...]
    """Leaderboard order, so the best trial's comes first when it has one."""
    num_with_timeline: int
    """Trials that have a timeline, embedded or not."""
    best_trial_id: int | None = None
    """The declared best (``leaderboard.declare_best``); None when no trial completed."""
    verdict: str = ""
    """The declared best with its interval, and the tie when there is one
    (``Verdict.describe``)."""

    @property
    def best(self) -> TrialView | None:
        """The declared best: the fastest, or by the tie rule one tied with it."""
        return next(
            (t for t in self.trials if t.trial_id == self.best_trial_id),
            next((t for t in self.trials if t.status == TrialStatus.COMPLETE), None),
        )

    def by_status(self, *statuses: str) -> list[TrialView]:
        return [t for t in self.trials if t.status in statuses]


def load_study(
    database: Database,
    name: str | None = None,
    *,
    max_timelines: int = MAX_TIMELINES,
    max_spans: int = MAX_SPANS_PER_TIMELINE,
    progress: BuildProgress | None = None,
) -> StudyData:
    """Reads study ``name`` (None: the most recent study) with its trials and timelines;
    ``progress`` (the report's build) begins once the study's size is known."""
    study = _find_study(database, name)
    trials_read = database.list_trials(study.id)
    entries = build_leaderboard(trials_read)
    trials = _trial_views(entries, trials_read)
    candidates = [t for t in trials if t.status in RAN and t.has_timeline]
    if progress is not None:
        progress.begin(len(trials), min(len(candidates), max_timelines))
    records = {t.id: t for t in trials_read}
    timelines = []
    for trial in candidates:
        if len(timelines) >= max_timelines:
            break
        spans = database.trial_spans(trial.trial_id)
        if spans:
            timelines.append(_timeline(trial, records[trial.trial_id], spans, max_spans))
            if progress is not None:
                progress.step()
    if progress is not None:  # a trial with a breakdown but no spans: no timeline to draw
        progress.step(2 * (min(len(candidates), max_timelines) - len(timelines)))
    verdict = declare_best(entries)
    return StudyData(
        name=study.name,
        spec=study.spec,
        database=database.url_for_display,
        workload=_workload_name(study, trials),
        limit_bytes=limit_bytes(study.spec),
        trials=trials,
        timelines=tuple(timelines),
        num_with_timeline=sum(t.has_timeline for t in trials),
        best_trial_id=verdict.pick.trial_id if verdict else None,
        verdict=verdict.describe() if verdict else "",
    )


def _trial_views(entries: list[Entry], records: list[TrialRecord]) -> tuple[TrialView, ...]:
    """The leaderboard's entries, then the configurations passed over without a trial number
    (the leaderboard leaves those out), in the leaderboard's status order."""
    by_id = {t.id: t for t in records}
    # A stand-in number lets build_leaderboard read them; the views say they have none.
    passed = build_leaderboard(
        [dataclasses.replace(t, number=-1) for t in records if t.number is None]
    )
    return tuple(_trial_view(i, e, by_id[e.trial_id]) for i, e in enumerate([*entries, *passed], 1))


def _timeline(
    trial: TrialView, record: TrialRecord, spans: list[SpanRecord], max_spans: int
) -> Timeline:
    ranks = tuple(sorted({s.rank for s in spans}))
    where = {n.rank: node_label(n.hostname, n.node_id) for n in record.nodes}
    return Timeline(
        trial.trial_id,
        trial.number,
        trial.name,
        cap_spans(spans, max_spans),
        len(spans),
        ranks,
        tuple(where.get(r, "") for r in ranks),
    )


FIGURES_DRAWN_ONCE = 7
"""The report's figures drawn once per study, whatever its size (``report._figures``)."""


class BuildProgress:
    """A report's build as one ``autotune.progress.Progress`` line (``stream``: standard error
    when None): a rewritten line on a terminal, one summary line at the end on a terminal and
    off it. ``load_study`` begins it once it knows the study's size; a step is each timeline
    read, each figure drawn (the ones drawn once, each timeline, each trial's memory) and the
    page's encoding."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream
        self.line: Progress | None = None
        self.done = 0
        self.started = time.perf_counter()

    def begin(self, num_trials: int, num_timelines: int) -> None:
        total = 2 * num_timelines + FIGURES_DRAWN_ONCE + num_trials + 1
        self.line = Progress(total, "building the dashboard", self.stream)
        self.line.start = self.started  # the elapsed time counts reading the trials too
        self.line.update(0)

    def step(self, steps: int = 1) -> None:
        self.done += steps
        if self.line is not None and steps:
            self.line.update(self.done)

    def close(self, summary: str) -> None:
        """The summary line (``{elapsed}`` in it: the seconds since the build began)."""
        if self.line is not None:
            self.line.close(summary)

    def abandon(self) -> None:
        """Ends a terminal's progress line, so that an error printed next starts its own."""
        if self.line is not None and self.line.tty:
            self.line.stream.write("\n")
            self.line.stream.flush()


def node_label(hostname: str, node_id: str) -> str:
    """'host/3f2a1c': several Ray nodes may share a host, so the node id's prefix is kept."""
    return f"{hostname}/{node_id[:6]}" if hostname else node_id[:6]


def latest_study_name(database: Database) -> str:
    studies = database.list_studies()
    if not studies:
        raise AutotuneError(
            f"no study in {database.url_for_display}; run "
            "'autotune search' first, or point --db at the database it wrote"
        )
    return studies[-1].name


def _find_study(database: Database, name: str | None) -> StudyRecord:
    # get_study names the existing studies when the name is unknown.
    return database.get_study(latest_study_name(database) if name is None else name)


def limit_bytes(spec: dict) -> int | None:
    """The memory limit the search used: the study's spec records it resolved (``--memory-limit``
    or, on a GPU without one, the device's memory); None when there was none (CPU)."""
    gib = spec.get("memory_limit_gib")
    return int(gib * GIB) if gib is not None else None


def _trial_view(position: int, entry: Entry, record: TrialRecord) -> TrialView:
    metrics = record.metrics
    ranks = tuple(
        RankTimes(
            rank=r["rank"],
            window_ns=r["window_ns"],
            compute_ns=r["compute_ns"],
            exposed_comm_ns=r["exposed_comm_ns"],
            idle_ns=r["idle_ns"],
            overlap=r["overlap"],
            num_steps=r["num_steps"],
        )
        for r in metrics.get("ranks", ())
    )
    return TrialView(
        position=position,
        trial_id=entry.trial_id,
        number=record.number,
        status=entry.status,
        config=entry.config,
        name=short_name(entry.config),
        throughput=entry.throughput if entry.throughputs else None,
        num_measurements=len(entry.throughputs),
        spread=entry.spread,
        run_throughput=metrics.get("throughput_tokens_per_s"),
        step_time_s=metrics.get("step_time_s"),
        measured_peak=entry.measured_peak,
        predicted_peak=entry.predicted_peak,
        error=entry.error,
        memory=record.memory,
        ranks=ranks,
        predicted_step_time_s=entry.predicted_step_time_s,
        predicted_breakdown=predicted_terms(metrics.get("predicted_breakdown")),
        interval=entry.interval,
    )


def predicted_terms(stored) -> tuple[tuple[str, float], ...]:
    """A stored predicted breakdown as (term, seconds) in ``TERMS`` order, then any term this
    version does not know; () when there is none or it is not a {term: seconds ≥ 0} object."""
    if not isinstance(stored, dict) or not stored:
        return ()
    if not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
        for v in stored.values()
    ):
        return ()
    order = [t for t in TERMS if t in stored] + sorted(set(stored) - set(TERMS), key=str)
    return tuple((str(term), float(stored[term])) for term in order)


def cap_spans(spans: list[SpanRecord], max_spans: int) -> tuple[SpanRecord, ...]:
    """At most ``max_spans`` of ``spans``: the step spans, then communication (collectives and
    send/recv), then compute ops, the longest first within each; back in (rank, start) order."""
    if len(spans) <= max_spans:
        return tuple(spans)
    kept: list[int] = []
    for kinds in (("step",), ("comm", "p2p"), ("compute",)):
        room = max_spans - len(kept)
        group = [i for i, s in enumerate(spans) if s.kind in kinds]
        kept += heapq.nlargest(room, group, key=lambda i: spans[i].dur_ns)
    return tuple(spans[i] for i in sorted(kept))


def _workload_name(study: StudyRecord, trials: tuple[TrialView, ...]) -> str:
    if trials:
        return trials[0].config.workload.name
    try:
        return WorkloadSpec(**study.spec.get("workload", {})).name
    except TypeError:
        return "unknown workload"
