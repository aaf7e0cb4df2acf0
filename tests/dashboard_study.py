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
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path

from autotune.config import TrialConfig, WorkloadSpec
from autotune.model.cluster import local_cpu_cluster
from autotune.model.memory import estimate_memory
from autotune.model.perf_model import predict_step_time
from autotune.search.search import GIB, MEMORY_MARGIN, Search, SearchSpec, base_config
from autotune.search.space import SearchSpace
from db import Database, RankMemoryRecord, TrialRecord

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
