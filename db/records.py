"""Plain frozen records: what ``db`` takes in and hands out, never live ORM rows.

Readers (``profiler``, ``dashboards``, the CLI) get these and nothing else, so nothing they hold
changes under them or keeps a database session alive.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

SPAN_KINDS = ("compute", "comm", "p2p", "step")
"""Allowed ``SpanRecord.kind`` values."""

TRIAL_STATUSES = (
    "complete",
    "infeasible_predicted",
    "infeasible_measured",
    "skipped_predicted",
    "failed",
    "running",
)
"""Allowed ``TrialRecord.status`` values."""

STEP_PHASES = ("warmup", "timed", "memory", "profiled")
"""Allowed ``StepMetricRecord.phase`` values."""

MEMORY_CATEGORIES = (
    "parameters",
    "gradients",
    "optimizer_state",
    "activations",
    "other",
    "peak",
    "peak_reserved",
    "outside_allocator",
)
"""The ``RankMemoryRecord.category`` values autotune writes, one row per rank and category
measured. ``peak`` is the allocated peak (what the memory model predicts), ``peak_reserved`` the
allocator's reserved peak (= allocated on CPU), ``outside_allocator`` the device memory outside
the allocator the rank reported (none on CPU); a figure not measured gets no row. The column is
free text, not checked against this list: a new category needs no schema change, and a database
written before the last two existed opens as it is, its trials read back without them."""


@dataclass(frozen=True, slots=True)
class SpanRecord:
    """One interval on one rank's timeline."""

    rank: int
    step: int
    """Optimizer step index the span belongs to."""
    kind: str
    """'compute' | 'comm' | 'p2p' | 'step'."""
    name: str
    """Op or collective name, e.g. 'aten::mm', 'all_reduce', 'forward'."""
    category: str
    """'forward' | 'backward' | 'optimizer' | 'op' | '' (free text, short)."""
    start_ns: int
    """On one clock shared by all ranks of the trial."""
    dur_ns: int
    bytes: int = 0
    """Payload bytes for comm/p2p spans, 0 otherwise."""
    group: str = ""
    """Process group / mesh dim ('dp', 'tp', 'pp', 'world') or ''."""


@dataclass(frozen=True, slots=True)
class RankMemoryRecord:
    """Predicted and measured bytes of one memory category on one rank."""

    rank: int
    category: str
    """One of ``MEMORY_CATEGORIES`` as autotune writes them (free text: a new category needs no
    schema change)."""
    predicted_bytes: int | None
    measured_bytes: int | None


@dataclass(frozen=True, slots=True)
class RankNodeRecord:
    """Where one rank ran: its Ray node and that node's host name."""

    rank: int
    node_id: str
    hostname: str


@dataclass(frozen=True, slots=True)
class StepMetricRecord:
    """The wall time (and loss) of one step on one rank."""

    rank: int
    step: int
    phase: str
    """'warmup' | 'timed' | 'memory' | 'profiled'."""
    time_s: float
    loss: float | None


@dataclass(frozen=True, slots=True)
class TrialRecord:
    """One trial: its resolved config, its outcome, and the per-rank detail."""

    id: int | None
    """None before insertion."""
    study_id: int | None
    """Trials may exist without a study (a lone ``autotune trial``)."""
    number: int | None
    """Index within its study (None for lone trials)."""
    status: str
    """One of ``TRIAL_STATUSES``."""
    config: dict
    """The fully resolved config (JSON-serialisable)."""
    metrics: dict
    """E.g. {'step_time_s': ..., 'throughput_tokens_per_s': ...} (JSON-serialisable)."""
    env: dict
    """Library versions, device, backend, world size (JSON-serialisable)."""
    error: str | None
    created_at: datetime
    """Timezone-aware; read back in UTC."""
    memory: tuple[RankMemoryRecord, ...] = ()
    """In the order given to ``add_trial``."""
    steps: tuple[StepMetricRecord, ...] = ()
    """In the order given to ``add_trial``."""
    nodes: tuple[RankNodeRecord, ...] = ()
    """Where each rank ran, by rank (empty for a trial that did not run)."""


@dataclass(frozen=True, slots=True)
class StudyRecord:
    """A named search and its spec."""

    id: int
    name: str
    spec: dict
    """The search spec (JSON-serialisable)."""
    created_at: datetime
    """Timezone-aware UTC."""


@dataclass(frozen=True, slots=True)
class CalibrationRecord:
    """A study's cluster and one fit of the performance model's calibration."""

    id: int
    study_id: int
    created_at: datetime
    """Timezone-aware UTC."""
    num_trials: int
    """Complete trials fitted on (0: the cluster's own figures, before any trial)."""
    cluster: dict
    """The cluster description (``autotune.model.cluster.ClusterSpec.to_dict``)."""
    calibration: dict
    """The fitted parameters (``autotune.model.perf_model.Calibration.to_dict``)."""
    residuals: dict
    """How well the fit matches: per-trial errors, MAPE, the span fits (JSON-serialisable)."""
