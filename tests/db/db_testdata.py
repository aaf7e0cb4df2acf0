"""Records for the db tests: a realistic small trial and its spans."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import sqlalchemy as sa

from db import RankMemoryRecord, SpanRecord, StepMetricRecord, TrialRecord

OPS = ("aten::mm", "aten::addmm", "aten::gelu", "aten::_softmax", "aten::bmm", "aten::add_")
ORIGIN_NS = 1_764_000_000_000_000_000  # an epoch-based clock, as time.time_ns() gives


def make_trial(
    study_id: int | None = None,
    number: int | None = None,
    *,
    ranks: int = 2,
    status: str = "complete",
) -> TrialRecord:
    created = datetime(2025, 3, 1, 12, 30, 5, 123456, tzinfo=timezone(timedelta(hours=2)))
    memory = tuple(
        RankMemoryRecord(rank, category, predicted, measured)
        for rank in range(ranks)
        for category, predicted, measured in (
            ("parameters", 4_000_000, 4_000_000),
            ("gradients", 4_000_000, 4_194_304),
            ("optimizer_state", 8_000_000, None),
            ("peak", None, 31_457_280_000),
        )
    )
    steps = tuple(
        StepMetricRecord(
            rank,
            step,
            phase,
            0.05 + 0.001 * step + 0.0001 * rank,
            None if phase == "memory" else 10.0 - step * 0.25,
        )
        for rank in range(ranks)
        for phase, step_range in (
            ("warmup", range(0, 2)),
            ("timed", range(2, 7)),
            ("memory", range(7, 8)),
        )
        for step in step_range
    )
    return TrialRecord(
        id=None,
        study_id=study_id,
        number=number,
        status=status,
        config={
            "zero_stage": 2,
            "tp_degree": 1,
            "micro_batch_size": 4,
            "bucket_mb": 25.0,
            "schedule": None,
            "nested": {"ac": "full", "layers": [0, 1, 2]},
        },
        metrics={"step_time_s": 0.0512, "throughput_tokens_per_s": 80000.5, "mfu": None},
        env={"torch": "2.13.0", "device": "cpu", "backend": "gloo", "world_size": ranks},
        error=None,
        created_at=created,
        memory=memory,
        steps=steps,
    )


def make_spans(num_spans: int, *, ranks: int = 2, seed: int = 0) -> list[SpanRecord]:
    """Spans as a profiler would record them: per-rank increasing starts, some exact ties."""
    rng = random.Random(seed)
    clock = [ORIGIN_NS + rank * 7 for rank in range(ranks)]
    spans = []
    for i in range(num_spans):
        rank = i % ranks
        step = i // (ranks * 50)
        roll = rng.random()
        if roll < 0.1:
            span = SpanRecord(
                rank,
                step,
                "comm",
                "all_reduce",
                "backward",
                clock[rank],
                rng.randint(1_000, 500_000),
                bytes=rng.choice((1 << 20, 25 << 20)),
                group="dp",
            )
        elif roll < 0.15:
            span = SpanRecord(
                rank,
                step,
                "p2p",
                "send",
                "forward",
                clock[rank],
                rng.randint(1_000, 50_000),
                bytes=4096,
                group="pp",
            )
        elif roll < 0.2:
            # A step span and the op inside it start at the same nanosecond: ties are kept in
            # the order given.
            span = SpanRecord(rank, step, "step", "forward", "forward", clock[rank], 400_000)
            spans.append(span)
            span = SpanRecord(rank, step, "compute", "aten::embedding", "op", clock[rank], 2_000)
        else:
            span = SpanRecord(
                rank,
                step,
                "compute",
                rng.choice(OPS),
                "op",
                clock[rank],
                rng.randint(1_000, 500_000),
            )
        spans.append(span)
        clock[rank] += rng.randint(1_000, 600_000)
    return spans


def timeline_order(spans: list[SpanRecord]) -> list[SpanRecord]:
    """The order trial_spans promises: (rank, start_ns), ties as given (sorted is stable)."""
    return sorted(spans, key=lambda s: (s.rank, s.start_ns))


def count_rows(url_or_path, table: str) -> int:
    """Rows of ``table``, counted on a connection of its own (a SQLite file may be given by its
    path)."""
    url = url_or_path if isinstance(url_or_path, str) else f"sqlite:///{url_or_path}"
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as connection:
            return connection.scalar(sa.text(f"SELECT count(*) FROM {table}"))
    finally:
        engine.dispose()
