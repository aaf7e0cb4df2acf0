"""SQLAlchemy 2.0 typed models: the schema at its latest version.

Every table is prefixed ``autotune_`` because Optuna's RDB storage lives in the same database
(``studies``, ``trials``, ``alembic_version``, ...). These classes never leave ``db``: reads are
copied into the frozen records of ``db.records`` by each row's ``to_record``.

Lookups that raise live on the model (as Optuna's ``StudyModel.find_or_raise_by_id``):
``StudyRow.find_or_raise_by_id`` and ``TrialRow.find_or_raise_by_id``, so each "no … with id"
message is written once. A trial's child rows (memory, steps, nodes) come with it through
read-only relationships, each with its order; readers load them with ``selectinload``.

Spans are the bulk of the data, so their table is built for size and timeline reads:
- the strings of a span (kind, name, category, group) are interned together in
  ``autotune_span_names``; a span row holds one small integer for all four;
- ``start_ns`` is stored relative to the trial's ``span_origin_ns`` (the first span's start),
  which keeps it at 6 bytes instead of 8 for epoch-based clocks;
- the primary key (trial_id, rank, start_ns, seq) is the timeline order; on SQLite the table is
  ``WITHOUT ROWID``, so the rows are stored in that order and there is no separate index to
  maintain (``seq``, the span's position in its ``add_trial`` call, breaks ties);
- on SQLite the table is ``STRICT``: a non-integer in an integer column fails the insert (and so
  the whole ``add_trial``) instead of being stored as text.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    Double,
    ForeignKey,
    Index,
    Integer,
    PrimaryKeyConstraint,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

from .errors import StorageError
from .json_values import JSONDocument
from .records import (
    CalibrationRecord,
    RankMemoryRecord,
    RankNodeRecord,
    StepMetricRecord,
    StudyRecord,
    TrialRecord,
)

# 64-bit integers everywhere; SQLite's INTEGER is already 64-bit, and STRICT tables accept only
# the type name INTEGER (not BIGINT).
BigInt = BigInteger().with_variant(Integer(), "sqlite")


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC datetime on every backend (SQLite stores no offset).

    Written as naive UTC; read back with ``tzinfo=timezone.utc``. Naive input is refused by the
    storage layer before it gets here.
    """

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect) -> datetime | None:
        if value is None:
            return None
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC)


class Base(DeclarativeBase):
    """The declarative base of every ``autotune_*`` table."""


class SchemaVersionRow(Base):
    """One row: the schema version of the ``autotune_*`` tables (see ``db.schema``)."""

    __tablename__ = "autotune_schema_version"

    version: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)


class StudyRow(Base):
    """A named search and its spec."""

    __tablename__ = "autotune_studies"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    spec: Mapped[dict] = mapped_column(JSONDocument)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)

    @classmethod
    def find_or_raise_by_id(cls, study_id: int, session: Session, display: str) -> StudyRow:
        """The study with ``study_id``, or a StorageError naming the database ``display``."""
        row = session.get(cls, study_id)
        if row is None:
            raise StorageError(f"no study with id {study_id} in {display}; create the study first")
        return row

    def to_record(self) -> StudyRecord:
        return StudyRecord(id=self.id, name=self.name, spec=self.spec, created_at=self.created_at)


class TrialRow(Base):
    """One trial's outcome; its memory, step and node rows hang off it."""

    __tablename__ = "autotune_trials"
    # The unique constraint's index also serves list_trials(study_id).
    __table_args__ = (UniqueConstraint("study_id", "number", name="uq_autotune_trials_number"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_id: Mapped[int | None] = mapped_column(
        ForeignKey("autotune_studies.id", ondelete="CASCADE")
    )
    number: Mapped[int | None] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(32))
    config: Mapped[dict] = mapped_column(JSONDocument)
    metrics: Mapped[dict] = mapped_column(JSONDocument)
    env: Mapped[dict] = mapped_column(JSONDocument)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    span_origin_ns: Mapped[int | None] = mapped_column(BigInt)
    """The stored ``start_ns`` of a span is relative to this (None when the trial has no spans)."""

    # Read-only: add_trial bulk-inserts the children with Core, and deletes cascade in the
    # database (ON DELETE CASCADE). The order is the one TrialRecord documents.
    memory: Mapped[list[RankMemoryRow]] = relationship(order_by="RankMemoryRow.id", viewonly=True)
    steps: Mapped[list[StepMetricRow]] = relationship(order_by="StepMetricRow.id", viewonly=True)
    nodes: Mapped[list[RankNodeRow]] = relationship(order_by="RankNodeRow.rank", viewonly=True)

    @classmethod
    def find_or_raise_by_id(
        cls, trial_id: int, session: Session, display: str, *options
    ) -> TrialRow:
        """The trial with ``trial_id`` (loaded with ``options``, e.g. ``selectinload``s), or a
        StorageError naming the database ``display``."""
        row = session.get(cls, trial_id, options=options)
        if row is None:
            raise StorageError(
                f"no trial with id {trial_id} in {display}; check the id (each "
                "stored trial's id is printed)"
            )
        return row

    def to_record(self) -> TrialRecord:
        """The trial with the child rows its relationships hold (load them first)."""
        return TrialRecord(
            id=self.id,
            study_id=self.study_id,
            number=self.number,
            status=self.status,
            config=self.config,
            metrics=self.metrics,
            env=self.env,
            error=self.error,
            created_at=self.created_at,
            memory=tuple(m.to_record() for m in self.memory),
            steps=tuple(s.to_record() for s in self.steps),
            nodes=tuple(n.to_record() for n in self.nodes),
        )


class RankMemoryRow(Base):
    """Predicted and measured bytes of one memory category on one rank of a trial."""

    __tablename__ = "autotune_rank_memory"
    __table_args__ = (
        UniqueConstraint("trial_id", "rank", "category", name="uq_autotune_rank_memory"),
    )

    # The surrogate key keeps the order the records were given in.
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("autotune_trials.id", ondelete="CASCADE"))
    rank: Mapped[int] = mapped_column(Integer)
    category: Mapped[str] = mapped_column(String(64))
    predicted_bytes: Mapped[int | None] = mapped_column(BigInt)
    measured_bytes: Mapped[int | None] = mapped_column(BigInt)

    def to_record(self) -> RankMemoryRecord:
        return RankMemoryRecord(
            rank=self.rank,
            category=self.category,
            predicted_bytes=self.predicted_bytes,
            measured_bytes=self.measured_bytes,
        )


class RankNodeRow(Base):
    """Where each rank of a trial ran: its Ray node and that node's host name."""

    __tablename__ = "autotune_rank_nodes"
    __table_args__ = (UniqueConstraint("trial_id", "rank", name="uq_autotune_rank_nodes"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("autotune_trials.id", ondelete="CASCADE"))
    rank: Mapped[int] = mapped_column(Integer)
    node_id: Mapped[str] = mapped_column(String(128))
    hostname: Mapped[str] = mapped_column(String(255))

    def to_record(self) -> RankNodeRecord:
        return RankNodeRecord(rank=self.rank, node_id=self.node_id, hostname=self.hostname)


class StepMetricRow(Base):
    """The wall time (and loss) of one step on one rank of a trial."""

    __tablename__ = "autotune_step_metrics"
    __table_args__ = (
        UniqueConstraint("trial_id", "rank", "phase", "step", name="uq_autotune_step_metrics"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("autotune_trials.id", ondelete="CASCADE"))
    rank: Mapped[int] = mapped_column(Integer)
    step: Mapped[int] = mapped_column(Integer)
    phase: Mapped[str] = mapped_column(String(16))
    time_s: Mapped[float] = mapped_column(Double)
    loss: Mapped[float | None] = mapped_column(Double)

    def to_record(self) -> StepMetricRecord:
        return StepMetricRecord(
            rank=self.rank, step=self.step, phase=self.phase, time_s=self.time_s, loss=self.loss
        )


class SpanNameRow(Base):
    """The interned (kind, name, category, group) of spans: a few hundred rows per database."""

    __tablename__ = "autotune_span_names"
    __table_args__ = (
        UniqueConstraint("kind", "name", "category", "group_name", name="uq_autotune_span_names"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(Text)  # kernel names can run to hundreds of characters
    category: Mapped[str] = mapped_column(String(64))
    group_name: Mapped[str] = mapped_column(String(64))  # 'group' is an SQL keyword


class SpanRow(Base):
    """One span of one rank of a trial (strings interned in ``SpanNameRow``)."""

    __tablename__ = "autotune_spans"
    __table_args__ = (
        PrimaryKeyConstraint("trial_id", "rank", "start_ns", "seq", name="pk_autotune_spans"),
        CheckConstraint("dur_ns >= 0 AND bytes >= 0", name="ck_autotune_spans_nonnegative"),
        {"sqlite_with_rowid": False, "sqlite_strict": True},
    )

    trial_id: Mapped[int] = mapped_column(ForeignKey("autotune_trials.id", ondelete="CASCADE"))
    rank: Mapped[int] = mapped_column(Integer)
    start_ns: Mapped[int] = mapped_column(BigInt)
    """Relative to ``TrialRow.span_origin_ns``."""
    seq: Mapped[int] = mapped_column(Integer)
    """Position of the span in its add_trial call; breaks ties between equal starts."""
    step: Mapped[int] = mapped_column(Integer)
    name_id: Mapped[int] = mapped_column(ForeignKey("autotune_span_names.id"))
    dur_ns: Mapped[int] = mapped_column(BigInt)
    bytes: Mapped[int] = mapped_column(BigInt)


SPAN_COLUMNS = ("trial_id", "rank", "start_ns", "seq", "step", "name_id", "dur_ns", "bytes")
"""Column order of the tuples ``Database.add_trial`` bulk-inserts."""


class CalibrationRow(Base):
    """A study's cluster description and a performance-model calibration fitted on its trials.

    One row per fit: the search stores the cluster it runs on before the first trial
    (``num_trials`` 0) and a new fit after every complete trial; the latest row is the study's
    calibration."""

    __tablename__ = "autotune_calibrations"
    __table_args__ = (Index("ix_autotune_calibrations_study", "study_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("autotune_studies.id", ondelete="CASCADE"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    num_trials: Mapped[int] = mapped_column(Integer)
    """Complete trials the calibration was fitted on (0: the cluster's own figures)."""
    cluster: Mapped[dict] = mapped_column(JSONDocument)
    calibration: Mapped[dict] = mapped_column(JSONDocument)
    residuals: Mapped[dict] = mapped_column(JSONDocument)

    def to_record(self) -> CalibrationRecord:
        return CalibrationRecord(
            id=self.id,
            study_id=self.study_id,
            created_at=self.created_at,
            num_trials=self.num_trials,
            cluster=self.cluster,
            calibration=self.calibration,
            residuals=self.residuals,
        )
