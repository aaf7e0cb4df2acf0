"""Timeline metrics, after Holistic Trace Analysis (HTA) where it defines one.

Per rank, over the profiled steps, with intervals merged before measuring:
- compute = |∪ compute intervals|; comm = |∪ communication intervals| (collectives and p2p);
- overlap = |comm ∩ compute| / |comm| (HTA's "comm/comp overlap");
- exposed_comm = |comm \\ compute|;
- idle = |step windows| − |comm ∪ compute| (pipeline bubbles land here).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from profiler.spans import COMM, COMPUTE, P2P, STEP, Span

Interval = tuple[int, int]


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """Union of half-open intervals [start, end), sorted and disjoint."""
    out: list[list[int]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(s, e) for s, e in out]


def length(merged: list[Interval]) -> int:
    return sum(e - s for s, e in merged)


def intersect(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """Intersection of two merged interval lists (two-pointer sweep)."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def clip(merged: list[Interval], window: list[Interval]) -> list[Interval]:
    return intersect(merged, window)


@dataclass(frozen=True)
class RankBreakdown:
    """Nanoseconds per category on one rank over its step windows."""

    rank: int
    window_ns: int
    compute_ns: int
    comm_ns: int
    overlap_ns: int
    exposed_comm_ns: int
    idle_ns: int
    num_steps: int

    @property
    def overlap(self) -> float:
        """|comm ∩ compute| / |comm|; 0 when there is no communication."""
        return self.overlap_ns / self.comm_ns if self.comm_ns else 0.0


def rank_breakdown(spans: Iterable[Span], rank: int) -> RankBreakdown:
    """Breakdown of one rank's spans, measured inside its step windows (the 'step' spans).

    Without step spans the window is the extent of all spans."""
    spans = [s for s in spans if s.rank == rank]
    windows = merge((s.start_ns, s.end_ns) for s in spans if s.kind == STEP)
    if not windows:
        others = [s for s in spans if s.kind != STEP]
        windows = (
            [(min(s.start_ns for s in others), max(s.end_ns for s in others))] if others else []
        )
    compute = clip(merge((s.start_ns, s.end_ns) for s in spans if s.kind == COMPUTE), windows)
    comm = clip(merge((s.start_ns, s.end_ns) for s in spans if s.kind in (COMM, P2P)), windows)
    both = intersect(compute, comm)
    busy = length(compute) + length(comm) - length(both)
    return RankBreakdown(
        rank=rank,
        window_ns=length(windows),
        compute_ns=length(compute),
        comm_ns=length(comm),
        overlap_ns=length(both),
        exposed_comm_ns=length(comm) - length(both),
        idle_ns=length(windows) - busy,
        num_steps=sum(1 for s in spans if s.kind == STEP),
    )


def breakdown(spans: Iterable[Span]) -> list[RankBreakdown]:
    spans = list(spans)
    return [rank_breakdown(spans, r) for r in sorted({s.rank for s in spans})]


def bytes_per_step(spans: Iterable[Span]) -> dict[int, dict[tuple[str, str, str], float]]:
    """Per rank: {(kind, name, group): payload bytes per step}, averaged over the steps seen."""
    totals: dict[int, dict[tuple[str, str, str], int]] = defaultdict(lambda: defaultdict(int))
    steps: dict[int, set[int]] = defaultdict(set)
    for s in spans:
        if s.kind == STEP:
            steps[s.rank].add(s.step)
        elif s.kind in (COMM, P2P):
            totals[s.rank][(s.kind, s.name, s.group)] += s.bytes
    return {
        rank: {k: v / max(1, len(steps[rank])) for k, v in by_key.items()}
        for rank, by_key in totals.items()
    }
