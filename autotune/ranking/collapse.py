"""Layouts the models cannot tell apart, one row: those that differ only in bucket size and
whose predicted step and peak agree within ``COLLAPSE_TOLERANCE``."""

from __future__ import annotations

import dataclasses

from autotune.model.layout_quantities import fields_key
from autotune.ranking.scored import ScoredLayout

COLLAPSE_TOLERANCE = 1e-3
"""Relative difference in predicted step time and in peak under which two layouts that differ
only in bucket size are one row: the models say the bucket changes nothing there (at ZeRO-3 the
bucket only groups FSDP units, whose gathers the step-time model overlaps)."""


_BUCKET = frozenset({"bucket_mb"})


def collapse_equivalent(fitting: list[ScoredLayout]) -> list[ScoredLayout]:
    """``fitting`` (fastest first) with each layout that differs from a faster listed one only
    in bucket size, and whose predicted step and peak are within ``COLLAPSE_TOLERANCE`` of that
    row's, folded into the first such row (its ``collapsed_buckets_mb``)."""
    rows: list[ScoredLayout] = []
    folded: list[list[float]] = []  # per row, the buckets folded into it
    listed: dict[tuple, list[int]] = {}  # the layout less its bucket → its rows
    for s in fitting:
        same = listed.setdefault(fields_key(s.config, _BUCKET), [])
        i = next((i for i in same if _same_prediction(rows[i], s)), None)
        if i is None:
            same.append(len(rows))
            rows.append(s)
            folded.append([])
        else:
            folded[i].append(s.config.bucket_mb)
    return [
        dataclasses.replace(r, collapsed_buckets_mb=(*r.collapsed_buckets_mb, *f)) if f else r
        for r, f in zip(rows, folded)
    ]


def _same_prediction(a: ScoredLayout, b: ScoredLayout) -> bool:
    return (
        abs(a.time.step_time_s - b.time.step_time_s) <= COLLAPSE_TOLERANCE * a.time.step_time_s
        and abs(a.peak_memory_bytes - b.peak_memory_bytes)
        <= COLLAPSE_TOLERANCE * a.peak_memory_bytes
    )
