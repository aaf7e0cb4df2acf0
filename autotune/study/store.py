"""Between trial results and the database: TrialResult → db records, db spans → profiler spans.

``db`` knows nothing of autotune or the profiler; this module is the one place that maps them:
a measured trial (``to_record``, and ``search_record`` with what the search predicted before it
ran), a trial that measured nothing (``unmeasured_record``: predicted not to fit, or failed),
and stored spans back to profiler spans (``load_spans``). No torch: it runs in the driver.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from datetime import UTC, datetime

from autotune.config import TrialConfig
from autotune.status import TrialStatus
from autotune.trial.result import RankResult, TrialResult
from db import (
    MEMORY_CATEGORIES,
    Database,
    RankMemoryRecord,
    RankNodeRecord,
    SpanRecord,
    StepMetricRecord,
    TrialRecord,
)
from profiler import Span, breakdown

# MEMORY_CATEGORIES (db.records): the memory rows stored per rank. peak_reserved is
# MemoryBreakdown.reserved_peak, outside_allocator RankResult.outside_allocator_bytes.


def _measured(rank: RankResult, category: str) -> int | None:
    if category == "peak_reserved":
        return rank.memory.reserved_peak
    if category == "outside_allocator":
        return rank.outside_allocator_bytes
    return getattr(rank.memory, category)


def step_phases(config: TrialConfig) -> list[str]:
    return list(config.step_schedule())


def trial_metrics(result: TrialResult) -> dict:
    """The trial's headline metrics plus the per-rank timeline breakdown (HTA definitions)."""
    spans = [s for r in result.ranks for s in r.spans]
    metrics = {
        "step_time_s": result.step_time_s,
        "throughput_tokens_per_s": result.throughput_tokens_per_s,
        "peak_memory_bytes": result.peak_memory_bytes,
        "peak_reserved_bytes": result.peak_reserved_bytes,
        "device_peak_bytes": result.device_peak_bytes,
        "mfu": result.mfu,
        "wall_s": result.wall_s,
        "steps_s": result.steps_s,
        "overhead_s": result.overhead_s,
        "cold_start": result.cold_start,
        "losses": result.losses,
    }
    if result.compile_s is not None:
        metrics["compile_s"] = result.compile_s
    if spans:
        metrics["ranks"] = rank_metrics(spans)
    return metrics


def rank_metrics(spans: Iterable[Span]) -> list[dict]:
    """The per-rank timeline breakdown a trial's metrics keep (``profiler.breakdown``)."""
    return [
        {
            "rank": b.rank,
            "window_ns": b.window_ns,
            "compute_ns": b.compute_ns,
            "comm_ns": b.comm_ns,
            "overlap": b.overlap,
            "exposed_comm_ns": b.exposed_comm_ns,
            "idle_ns": b.idle_ns,
            "num_steps": b.num_steps,
        }
        for b in breakdown(spans)
    ]


def to_record(
    result: TrialResult,
    *,
    study_id: int | None = None,
    number: int | None = None,
    status: TrialStatus = TrialStatus.COMPLETE,
) -> tuple[TrialRecord, list[SpanRecord]]:
    config = TrialConfig.from_dict(result.config)
    phases = step_phases(config)
    memory = tuple(
        RankMemoryRecord(r.rank, category, None, measured)
        for r in result.ranks
        for category in MEMORY_CATEGORIES
        if (measured := _measured(r, category)) is not None
    )
    steps = tuple(
        StepMetricRecord(r.rank, i, phases[i], t, result.losses[i])
        for r in result.ranks
        for i, t in enumerate(r.step_times)
    )
    record = TrialRecord(
        id=None,
        study_id=study_id,
        number=number,
        status=status,
        config=result.config,
        metrics=trial_metrics(result),
        env={**result.env, "memory_source": result.ranks[0].memory.source},
        error=None,
        created_at=datetime.now(UTC),
        memory=memory,
        steps=steps,
        nodes=tuple(
            RankNodeRecord(r.rank, r.node_id, r.hostname) for r in result.ranks if r.node_id
        ),
    )
    spans = [
        SpanRecord(
            s.rank, s.step, s.kind, s.name, s.category, s.start_ns, s.dur_ns, s.bytes, s.group
        )
        for r in result.ranks
        for s in r.spans
    ]
    return record, spans


def search_record(
    result: TrialResult,
    *,
    study_id: int,
    number: int,
    status: TrialStatus,
    predicted_peak: int | None,
    predictions: dict,
    error: str | None = None,
) -> tuple[TrialRecord, list[SpanRecord]]:
    """A trial the search ran: ``to_record`` plus what the search predicted before it ran (the
    performance model's ``predictions`` in the metrics, the memory model's peak beside each
    rank's measured one) and, for one that is not complete, why."""
    record, spans = to_record(result, study_id=study_id, number=number, status=status)
    record = dataclasses.replace(record, metrics={**record.metrics, **predictions})
    record = dataclasses.replace(
        record,
        memory=tuple(
            dataclasses.replace(m, predicted_bytes=predicted_peak) if m.category == "peak" else m
            for m in record.memory
        ),
    )
    if status != TrialStatus.COMPLETE:
        record = dataclasses.replace(record, error=error)
    return record, spans


def unmeasured_record(
    config: TrialConfig,
    *,
    study_id: int,
    number: int,
    status: TrialStatus,
    predicted_peak: int | None,
    predictions: dict,
    error: str,
) -> TrialRecord:
    """A trial the search stored without a measurement: predicted not to fit (not run), or
    failed or out of memory while running. Its metrics are the performance model's
    ``predictions``; its memory, the predicted peak alone."""
    return TrialRecord(
        id=None,
        study_id=study_id,
        number=number,
        status=status,
        config=config.resolved(),
        metrics=dict(predictions),
        env={},
        error=error,
        created_at=datetime.now(UTC),
        memory=(RankMemoryRecord(0, "peak", predicted_peak, None),),
    )


def store_result(db: Database, result: TrialResult, **kwargs) -> int:
    record, spans = to_record(result, **kwargs)
    return db.add_trial(record, spans)


def load_spans(db: Database, trial_id: int, rank: int | None = None) -> list[Span]:
    return [
        Span(s.rank, s.step, s.kind, s.name, s.category, s.start_ns, s.dur_ns, s.bytes, s.group)
        for s in db.trial_spans(trial_id, rank)
    ]
