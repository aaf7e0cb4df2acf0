"""Between trial results and the database: TrialResult → db records, db spans → profiler spans.

``db`` knows nothing of autotune or the profiler; this module is the one place that maps them.
"""

from __future__ import annotations

from datetime import UTC, datetime

from autotune.config import TrialConfig
from autotune.result import TrialResult
from db import Database, RankMemoryRecord, SpanRecord, StepMetricRecord, TrialRecord
from profiler import Span, breakdown

MEMORY_CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "other",
                     "peak")


def step_phases(config: TrialConfig) -> list[str]:
    return (["warmup"] * config.num_warmup_steps + ["timed"] * config.num_timed_steps
            + ["profiled"] * config.num_profiled_steps + ["memory"])


def trial_metrics(result: TrialResult) -> dict:
    """The trial's headline metrics plus the per-rank timeline breakdown (HTA definitions)."""
    spans = [s for r in result.ranks for s in r.spans]
    metrics = {"step_time_s": result.step_time_s,
               "throughput_tokens_per_s": result.throughput_tokens_per_s,
               "peak_memory_bytes": result.peak_memory_bytes, "mfu": result.mfu,
               "wall_s": result.wall_s, "steps_s": result.steps_s,
               "overhead_s": result.overhead_s, "cold_start": result.cold_start,
               "losses": result.losses}
    if spans:
        metrics["ranks"] = [
            {"rank": b.rank, "window_ns": b.window_ns, "compute_ns": b.compute_ns,
             "comm_ns": b.comm_ns, "overlap": b.overlap, "exposed_comm_ns": b.exposed_comm_ns,
             "idle_ns": b.idle_ns, "num_steps": b.num_steps} for b in breakdown(spans)]
    return metrics


def to_record(result: TrialResult, *, study_id: int | None = None, number: int | None = None,
              status: str = "complete") -> tuple[TrialRecord, list[SpanRecord]]:
    config = TrialConfig.from_dict(result.config)
    phases = step_phases(config)
    memory = tuple(RankMemoryRecord(r.rank, category, None, getattr(r.memory, category))
                   for r in result.ranks for category in MEMORY_CATEGORIES)
    steps = tuple(StepMetricRecord(r.rank, i, phases[i], t, result.losses[i])
                  for r in result.ranks for i, t in enumerate(r.step_times))
    record = TrialRecord(id=None, study_id=study_id, number=number, status=status,
                         config=result.config, metrics=trial_metrics(result),
                         env={**result.env, "memory_source": result.ranks[0].memory.source},
                         error=None, created_at=datetime.now(UTC), memory=memory, steps=steps)
    spans = [SpanRecord(s.rank, s.step, s.kind, s.name, s.category, s.start_ns, s.dur_ns,
                        s.bytes, s.group) for r in result.ranks for s in r.spans]
    return record, spans


def store_result(db: Database, result: TrialResult, **kwargs) -> int:
    record, spans = to_record(result, **kwargs)
    return db.add_trial(record, spans)


def load_spans(db: Database, trial_id: int, rank: int | None = None) -> list[Span]:
    return [Span(s.rank, s.step, s.kind, s.name, s.category, s.start_ns, s.dur_ns, s.bytes,
                 s.group) for s in db.trial_spans(trial_id, rank)]
