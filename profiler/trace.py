"""Chrome / Perfetto trace export (the JSON Trace Event Format).

One process per rank (``pid`` = rank), one track per kind: compute (tid 0), collectives (tid 1),
pipeline send/recv (tid 2), steps (tid 3). Timestamps are microseconds on the shared clock,
shifted so the trace starts at 0. chrome://tracing and ui.perfetto.dev open the file.
Format: https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from profiler.spans import COMM, COMPUTE, P2P, STEP, Span

TRACKS = {
    COMPUTE: (0, "compute"),
    COMM: (1, "communication"),
    P2P: (2, "send/recv"),
    STEP: (3, "steps"),
}


def chrome_trace(spans: Iterable[Span], *, title: str = "autotune") -> dict:
    spans = list(spans)
    origin = min((s.start_ns for s in spans), default=0)
    events: list[dict] = []
    for rank in sorted({s.rank for s in spans}):
        events.append(
            {
                "ph": "M",
                "name": "process_name",
                "pid": rank,
                "tid": 0,
                "args": {"name": f"rank {rank}"},
            }
        )
        events.append(
            {
                "ph": "M",
                "name": "process_sort_index",
                "pid": rank,
                "tid": 0,
                "args": {"sort_index": rank},
            }
        )
        for tid, label in TRACKS.values():
            events.append(
                {"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": label}}
            )
    for s in spans:
        tid, _ = TRACKS.get(s.kind, (4, s.kind))
        args = {"step": s.step}
        if s.category:
            args["category"] = s.category
        if s.kind in (COMM, P2P):
            args.update(bytes=s.bytes, group=s.group)
        events.append(
            {
                "ph": "X",
                "name": s.name if s.kind != STEP else f"step {s.step}",
                "cat": s.category or s.kind,
                "pid": s.rank,
                "tid": tid,
                "ts": (s.start_ns - origin) / 1e3,
                "dur": s.dur_ns / 1e3,
                "args": args,
            }
        )
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"title": title}}


def write_chrome_trace(spans: Iterable[Span], path: str | Path, *, title: str = "autotune") -> int:
    """Write the trace; returns the number of span events written."""
    trace = chrome_trace(spans, title=title)
    Path(path).write_text(json.dumps(trace, separators=(",", ":")))
    return sum(1 for e in trace["traceEvents"] if e["ph"] == "X")
