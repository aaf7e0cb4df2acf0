"""The study the dashboard tests look at, built once per test session.

A real search on the tiny GPT (2 ranks, CPU/gloo, one profiled step per trial) under a memory
limit that two of its four configurations are predicted to break: so it holds complete trials
with real timelines, a re-measured best, and ``infeasible_predicted`` trials as the search
records them. Added beside them through ``Database.add_trial``, as the search stores them: a
trial that ran and measured a peak over the limit (``infeasible_measured``), a complete trial
stored before the performance model (no prediction, no timeline; last of the complete ones)
and a trial that failed with an error text full of HTML. The complete trials that ran and the
one over the limit carry the performance model's prediction in their metrics
(``predicted_step_time_s``, ``predicted_breakdown``: ``predict_step_time`` on the local CPU
cluster), as the search stores it. The study's name is a script tag. A second study in the
same database holds one trial of a user workload whose name is HTML too.

``statuses_study`` builds, without Ray, a study holding the trials a search stores in each
``TrialStatus`` (``every_status``, or only some statuses), each stored as the search stores it:
a measured trial with a timeline, one measured over the limit, the unmeasured ones through
``autotune.study.store.unmeasured_record``, a failed one with no metrics and no memory, a
running one with no result, and a configuration passed over without a trial number.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path

from autotune.config import TrialConfig, WorkloadSpec
from autotune.layouts import short_name
from autotune.model.cluster import local_cpu_cluster
from autotune.model.memory import estimate_memory
from autotune.model.perf_model import predict_step_time
from autotune.search.search import GIB, MEMORY_MARGIN, Search, SearchSpec, base_config
from autotune.search.space import SearchSpace
from autotune.status import TrialStatus
from autotune.study.store import unmeasured_record
from db import Database, RankMemoryRecord, SpanRecord, TrialRecord

NAME = "<script>alert(1)</script>"
FAILED_ERROR = '<img src=x onerror="alert(2)"> rank 1: RuntimeError: boom & <b>worse</b>'
USER_STUDY = "user-workload"
USER_WORKLOAD = "evil<b>pkg</b>.mod:build"
PASSWORD = "s3cret-pw"

# dp 2, ZeRO-0, no TP/PP: micro-batch {1, 4} × checkpointing {none, full}
# (tests/search/test_search.py).
SPACE = dict(
    fixed={
        "tp_degree": 1,
        "cp_degree": 1,
        "dp_replicate": 1,
        "pp_degree": 1,
        "zero_stage": 0,
        "overlap_enabled": True,
        "bucket_mb": 25.0,
    },
    narrowed={"activation_checkpointing": ["none", "full"], "micro_batch_size": [1, 4]},
)

_built: dict[str, str] = {}


def predicted_metrics(config: TrialConfig) -> dict:
    """The performance model's prediction as the search stores it in a trial's metrics."""
    estimate = predict_step_time(config, local_cpu_cluster(config.world_size))
    return {
        "predicted_step_time_s": estimate.step_time_s,
        "predicted_breakdown": dict(estimate.breakdown),
    }


def rank_memory(config: TrialConfig, peak: int) -> tuple[RankMemoryRecord, ...]:
    """Two ranks' measured categories under a measured ``peak`` (rank 1's a byte lower), the
    memory model's peak beside the measured one."""
    return tuple(
        RankMemoryRecord(r, c, estimate_memory(config).total if c == "peak" else None, b)
        for r in range(2)
        for c, b in (
            ("parameters", 1 << 20),
            ("gradients", 1 << 20),
            ("optimizer_state", 2 << 20),
            ("activations", peak - (4 << 20)),
            ("other", 0),
            ("peak", peak - r),
        )
    )


def build(executor, directory: Path) -> str:
    """The database URL of the study (built on the first call of the session)."""
    if "url" in _built:
        return _built["url"]
    # The password is a query parameter SQLite ignores: the report must hide it all the same.
    url = f"sqlite:///{directory / 'dashboard.db'}?password={PASSWORD}"
    database = Database.open(url)
    try:
        spec = SearchSpec(
            world_size=2,
            n_trials=4,
            patience=None,
            device="cpu",
            num_warmup_steps=1,
            num_timed_steps=2,
            num_profiled_steps=1,
            top_k=1,
            remeasure_repeats=1,
            remeasure_max_repeats=1,
            study_name=NAME,
            sampler="tpe",
            **SPACE,
        )  # TPE proposes what cannot fit: screened
        space = SearchSpace(base_config(spec), **SPACE)
        peaks = sorted(estimate_memory(c).total * (1 + MEMORY_MARGIN) for c in space.configs)
        limit = (peaks[1] + peaks[2]) / 2  # two configurations fit (with the margin), two not
        spec = dataclasses.replace(spec, memory_limit_gib=limit / GIB)
        search = Search.open(spec, database, executor, out=None)
        search.run()
        study_id = search.study_record.id
        complete = [t for t in database.list_trials(study_id) if t.status == "complete"]
        for t in complete:
            database.update_trial(
                t.id,
                status=t.status,
                metrics={**t.metrics, **predicted_metrics(TrialConfig.from_dict(t.config))},
            )
        after = 1 + max(t.number for t in database.list_trials(study_id))
        over = TrialConfig(world_size=2, zero_stage=2, micro_batch_size=2, device="cpu")
        measured = int(limit * 1.2)
        database.add_trial(
            TrialRecord(
                id=None,
                study_id=study_id,
                number=after,
                status="infeasible_measured",
                config=over.resolved(),
                metrics={
                    "step_time_s": 0.05,
                    "throughput_tokens_per_s": 10_240.0,
                    "peak_memory_bytes": measured,
                    **predicted_metrics(over),
                },
                env={"device": "cpu"},
                error=f"measured peak {measured / GIB:.3g} GiB > limit {limit / GIB:.3g} GiB",
                created_at=datetime.now(UTC),
                memory=rank_memory(over, measured),
            )
        )
        older = TrialConfig(world_size=2, micro_batch_size=2, device="cpu")
        throughput = min(t.metrics["throughput_tokens_per_s"] for t in complete) / 2
        peak = int(limit / 2)
        database.add_trial(
            TrialRecord(
                id=None,
                study_id=study_id,
                number=after + 1,
                status="complete",
                config=older.resolved(),
                metrics={
                    "step_time_s": older.tokens_per_step / throughput,
                    "throughput_tokens_per_s": throughput,
                    "peak_memory_bytes": peak,
                },
                env={"device": "cpu"},
                error=None,
                created_at=datetime.now(UTC),
                memory=rank_memory(older, peak),
            )
        )
        broken = TrialConfig(world_size=2, zero_stage=3, micro_batch_size=1, device="cpu")
        database.add_trial(
            TrialRecord(
                id=None,
                study_id=study_id,
                number=after + 2,
                status="failed",
                config=broken.resolved(),
                metrics={},
                env={},
                error=FAILED_ERROR,
                created_at=datetime.now(UTC),
                memory=(RankMemoryRecord(0, "peak", estimate_memory(broken).total, None),),
            )
        )
        user = database.create_study(
            USER_STUDY, {"workload": {"workload": USER_WORKLOAD}, "world_size": 2}
        )
        database.add_trial(
            TrialRecord(
                id=None,
                study_id=user.id,
                number=0,
                status="failed",
                config=TrialConfig(
                    world_size=2, device="cpu", workload=WorkloadSpec(workload=USER_WORKLOAD)
                ).resolved(),
                metrics={},
                env={},
                error="WorkloadError: no module named 'evil'",
                created_at=datetime.now(UTC),
            )
        )
    finally:
        database.close()
    _built["url"] = url
    return url


# ---- a study of every status, without Ray ----------------------------------------------------
EVERY_STATUS = "every-status"
STATUS_CONFIGS = [
    TrialConfig(world_size=2, device="cpu", zero_stage=z, micro_batch_size=m)
    for z in (0, 1, 2, 3)
    for m in (1, 2, 4)
]
"""Distinct layouts, one per stored trial (a study stores each configuration once)."""
STATUS_LIMIT = 4 * GIB
RANKS = [
    {
        "rank": r,
        "window_ns": 4_000_000,
        "compute_ns": 3_000_000,
        "comm_ns": 500_000,
        "overlap": 0.5,
        "exposed_comm_ns": 250_000,
        "idle_ns": 750_000,
        "num_steps": 1,
    }
    for r in range(2)
]


def every_status() -> list[tuple[TrialStatus, int | None]]:
    """One trial of each status, numbered in the order the search would run them, and one
    configuration passed over (skipped) without a trial number."""
    return [*((s, n) for n, s in enumerate(TrialStatus)), (TrialStatus.SKIPPED_PREDICTED, None)]


def statuses_study(
    url: str, name: str, trials: list[tuple[TrialStatus, int | None]], *, spans: bool = True
) -> dict:
    """Stores study ``name`` holding ``trials`` ((status, number): None for one passed over) in
    the database at ``url``, the trials that ran with their spans unless not ``spans`` (their
    per-rank breakdown is stored either way); {trial id: the layout's short name}."""
    names = {}
    with Database.open(url) as database:
        study = database.create_study(
            name, {"world_size": 2, "memory_limit_gib": STATUS_LIMIT / GIB, "device": "cpu"}
        )
        for (status, number), config in zip(trials, STATUS_CONFIGS):
            record, timeline = status_record(status, config, study.id, number)
            names[database.add_trial(record, timeline if spans else ())] = short_name(config)
    return names


def status_record(
    status: TrialStatus, config: TrialConfig, study_id: int, number: int | None
) -> tuple[TrialRecord, list[SpanRecord]]:
    """A trial in ``status`` as the search stores it, with the spans of its timeline."""
    peak = estimate_memory(config).total
    if status in (TrialStatus.INFEASIBLE_PREDICTED, TrialStatus.SKIPPED_PREDICTED):
        error = (
            f"predicted peak {peak / GIB:.3g} GiB > limit"
            if status.infeasible
            else "skipped: predicted no faster than the best measured"
        )
        record = unmeasured_record(
            config,
            study_id=study_id,
            number=number,
            status=status,
            predicted_peak=peak,
            predictions=predicted_metrics(config),
            error=error,
        )
        return record, []
    measured = int(STATUS_LIMIT * (1.5 if status.infeasible else 0.5))
    step_time = 0.004
    ran = {
        "metrics": {
            "step_time_s": step_time,
            "throughput_tokens_per_s": config.tokens_per_step / step_time,
            "peak_memory_bytes": measured,
            "ranks": RANKS,
            **predicted_metrics(config),
        },
        "env": {"device": "cpu"},
        "error": f"measured peak {measured / GIB:.3g} GiB > limit" if status.infeasible else None,
        "memory": rank_memory(config, measured),
    }
    # failed: nothing measured, no memory; running: no result yet
    not_ran = {"metrics": {}, "env": {}, "error": None}
    if status == TrialStatus.FAILED:
        not_ran["error"] = "rank 1: RuntimeError: boom"
    record = TrialRecord(
        id=None,
        study_id=study_id,
        number=number,
        status=status,
        config=config.resolved(),
        created_at=datetime.now(UTC),
        **(ran if status.ran else not_ran),
    )
    if not status.ran:
        return record, []
    spans = [
        span
        for r in range(2)
        for span in (
            SpanRecord(r, 0, "step", "step", "", 0, 4_000_000),
            SpanRecord(r, 0, "compute", "aten::mm", "forward", 100_000, 3_000_000),
            SpanRecord(r, 0, "comm", "all_reduce", "", 3_000_000, 500_000, 1 << 20, "dp"),
        )
    ]
    return record, spans
