"""``Database``: studies, trials, per-rank memory, per-step metrics, spans and calibrations in one
SQL database.

Contract
--------
- **One writer per study.** A study's search driver is the only process that writes it; workers
  send results to it. Readers (dashboards, the CLI) may open the same database at the same time:
  SQLite runs in WAL mode, so reads never wait for the writer and see only committed trials.
- **Drivers side by side (PostgreSQL).** Several drivers may write their own studies into one
  PostgreSQL database at once, from any machines. What they share is serialised by advisory
  locks (``pg_advisory_xact_lock``), held only to the end of the transaction that needs them:
  creating or migrating the schema (``LOCK_SCHEMA``; two drivers starting on a new database
  would otherwise both create the tables, and one would fail), and interning new span names
  (``LOCK_SPAN_NAMES``; two trials adding the same names in different orders would otherwise
  wait on each other's unique-index entries until PostgreSQL aborts one; after taking the lock
  a transaction reads the names again, and under READ COMMITTED, PostgreSQL's default, it sees
  what the lock's previous holder committed). Another program's tables in the same database
  (Optuna's) are created under :meth:`Database.setup_lock`. On SQLite every write transaction
  takes the file's write lock up front, so writers are serialised anyway.
- **Threads.** A ``Database`` may be shared by threads: every method opens its own session on the
  engine's connection pool and closes it before returning.
- **Immutability.** Reads return the frozen dataclasses of ``db.records``, copied out of the
  session; nothing returned is tied to a session or changes when the database does.
- **All or nothing.** Every write runs in one transaction through ``_session``: it commits, or
  rolls back and raises :class:`~db.errors.StorageError`. ``add_trial`` stores the trial, its
  memory and step rows and all its spans in that one transaction.
- **Errors.** Everything that goes wrong with the database surfaces as ``StorageError``, one line
  that names the fix; URLs appear with the password hidden.

The other jobs live beside this module: the engine, SQLite's pragmas and PostgreSQL's locks
(``db.engine``), the schema and its migrations (``db.schema``), input checks
(``db.validation``), spans in and out (``db.spans``), the rows and the lookups that raise
(``db.models``), the records handed out (``db.records``), error translation (``db.errors``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import ClassVar

from sqlalchemy import Engine, func, insert, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, selectinload

from . import schema
from .engine import (
    LOCK_NAMESPACE,
    LOCK_SCHEMA,
    WRITE_OPTION,
    check_sqlite_path,
    open_engine,
    parse_url,
    sqlite_file,
)
from .errors import StorageError, hide_password, translate
from .models import (
    CalibrationRow,
    RankMemoryRow,
    RankNodeRow,
    SpanRow,
    StepMetricRow,
    StudyRow,
    TrialRow,
)
from .records import CalibrationRecord, SpanRecord, StudyRecord, TrialRecord
from .spans import SPAN_CHUNK, SpanWriter, read_spans
from .validation import (
    check_calibration,
    check_error,
    check_json,
    check_status,
    check_study_name,
    check_trial,
)

__all__ = ["SPAN_CHUNK", "Database"]

_WITH_CHILDREN = (
    selectinload(TrialRow.memory),
    selectinload(TrialRow.steps),
    selectinload(TrialRow.nodes),
)
"""A trial's memory, step and node rows, loaded with it: one query per relationship for every
500 trials (SQLAlchemy's IN batch), however many rows each trial has."""


class Database:
    """One open autotune database; see the module docstring for the contract."""

    migrations: ClassVar[tuple[schema.Migration, ...]] = schema.MIGRATIONS
    """The migrations this code knows; the schema version it writes is the last one's."""

    url_for_display: str
    """The URL with the password hidden."""
    schema_version: int
    """The schema version of the open database (the latest this code knows)."""

    def __init__(
        self,
        engine: Engine,
        url_for_display: str,
        schema_version: int,
        *,
        password: str | None = None,
    ) -> None:
        """Use :meth:`open`."""
        self._engine = engine
        # Writes begin with BEGIN IMMEDIATE on SQLite (see db.engine): the write lock is taken
        # up front, so a write transaction that reads first never fails to upgrade its lock.
        self._write_engine = engine.execution_options(**{WRITE_OPTION: True})
        self._password = password
        self._dbapi_error: type[BaseException] = engine.dialect.loaded_dbapi.Error
        self.url_for_display = url_for_display
        self.schema_version = schema_version
        self._spans = SpanWriter(engine.dialect, self._dbapi_error, self._translate)

    # ---- opening -----------------------------------------------------------------------------
    @classmethod
    def open(cls, url: str, *, create: bool = True) -> Database:
        """Opens the database at SQLAlchemy ``url`` (``sqlite:///path.db``, ``postgresql://...``).

        A new or empty database (Optuna's tables may be there) gets the autotune schema when
        ``create`` is true; an older autotune schema is migrated; a newer one is refused. With
        ``create=False`` a missing SQLite file or a database without the autotune schema is an
        error, and nothing is created.
        """
        parsed = parse_url(url)
        # The URL as given (render_as_string would percent-encode 'file:' URIs), password hidden.
        display = hide_password(
            url.strip() if isinstance(url, str) else parsed.render_as_string(hide_password=True),
            parsed.password,
        )
        sqlite_path = sqlite_file(parsed)
        if sqlite_path is not None:
            check_sqlite_path(sqlite_path, display, create, parsed.query.get("mode"))
        engine = open_engine(parsed, display)
        try:
            version = schema.prepare_schema(
                engine, cls.migrations, create=create, display=display, password=parsed.password
            )
        except BaseException:
            engine.dispose()
            raise
        return cls(engine, display, version, password=parsed.password)

    @property
    def connect_url(self) -> str:
        """The full URL, password included, for another client of the same database (Optuna's
        storage). Never print it; ``url_for_display`` is the printable form."""
        return self._engine.url.render_as_string(hide_password=False)

    @contextmanager
    def setup_lock(self) -> Iterator[None]:
        """Holds autotune's schema lock across processes while the block runs (PostgreSQL; a
        no-op elsewhere).

        For another client creating its tables in this database: Optuna's ``RDBStorage`` checks
        for its tables and then creates them, which fails for one of two drivers that start
        together on a new PostgreSQL database. The lock is a session-level advisory lock on a
        connection of its own, released when the block ends.
        """
        if self._engine.dialect.name != "postgresql":
            yield
            return
        key = (LOCK_NAMESPACE, LOCK_SCHEMA)
        with self._engine.connect() as connection:
            try:
                connection.execute(select(func.pg_advisory_lock(*key)))
                connection.commit()
            except (SQLAlchemyError, self._dbapi_error) as exc:
                raise self._translate(exc, "taking the schema lock") from exc
            try:
                yield
            finally:
                try:
                    connection.execute(select(func.pg_advisory_unlock(*key)))
                    connection.commit()
                except (SQLAlchemyError, self._dbapi_error):
                    # Never back to the pool holding the lock: the server drops it with the
                    # connection.
                    connection.invalidate()

    def close(self) -> None:
        """Closes every pooled connection (SQLite then checkpoints and removes its WAL file)."""
        self._engine.dispose()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Database({self.url_for_display!r}, schema_version={self.schema_version})"

    # ---- the session helper ------------------------------------------------------------------
    @contextmanager
    def _session(self, action: str, *, write: bool = False) -> Iterator[Session]:
        """A session that commits on success, rolls back on any error, and always closes.

        Database errors become a one-line ``StorageError`` naming ``action`` and the fix.
        """
        session = Session(self._write_engine if write else self._engine)
        try:
            yield session
            session.commit()
        except StorageError:
            _rollback_quietly(session)
            raise
        except (SQLAlchemyError, self._dbapi_error) as exc:
            _rollback_quietly(session)
            raise self._translate(exc, action) from exc
        except BaseException:
            _rollback_quietly(session)
            raise
        finally:
            session.close()

    def _translate(self, exc: BaseException, action: str) -> StorageError:
        """``exc`` as a one-line StorageError about ``action`` on this database."""
        return translate(exc, action, self.url_for_display, self._password)

    # ---- studies -----------------------------------------------------------------------------
    def create_study(self, name: str, spec: dict) -> StudyRecord:
        """A new study; its name must be unique in the database."""
        check_study_name(name)
        check_json("the study spec", spec)
        with self._session(f"creating study {name!r}", write=True) as session:
            if session.scalar(select(StudyRow.id).where(StudyRow.name == name)) is not None:
                raise StorageError(
                    f"a study named {name!r} already exists in "
                    f"{self.url_for_display}; choose another name or load it"
                )
            row = StudyRow(name=name, spec=spec, created_at=datetime.now(UTC))
            session.add(row)
            session.flush()
            return row.to_record()

    def get_study(self, name: str) -> StudyRecord:
        """The study called ``name``; a missing one is an error that lists the existing names."""
        with self._session(f"reading study {name!r}") as session:
            row = session.scalars(select(StudyRow).where(StudyRow.name == name)).one_or_none()
            if row is None:
                names = list(session.scalars(select(StudyRow.name).order_by(StudyRow.id)))
                shown = ", ".join(names[:20]) + (
                    f", ... ({len(names) - 20} more)" if len(names) > 20 else ""
                )
                raise StorageError(
                    f"no study named {name!r} in {self.url_for_display}; "
                    f"existing: {shown or 'none'}"
                )
            return row.to_record()

    def list_studies(self) -> list[StudyRecord]:
        """Every study, oldest first."""
        with self._session("listing studies") as session:
            rows = session.scalars(select(StudyRow).order_by(StudyRow.id))
            return [row.to_record() for row in rows]

    # ---- trials ------------------------------------------------------------------------------
    def add_trial(self, trial: TrialRecord, spans: Iterable[SpanRecord] = ()) -> int:
        """Stores a new trial (``trial.id`` None) with its memory, steps and spans; returns its id.

        One transaction: if anything is wrong (a span with a non-integer field, an unknown study,
        a duplicate memory category) nothing at all is stored. ``spans`` may be any iterable,
        a generator included; it is consumed once, in chunks.
        """
        check_trial(trial)
        with self._session("storing a trial", write=True) as session:
            if trial.study_id is not None:
                StudyRow.find_or_raise_by_id(trial.study_id, session, self.url_for_display)
            row = TrialRow(
                study_id=trial.study_id,
                number=trial.number,
                status=trial.status,
                config=trial.config,
                metrics=trial.metrics,
                env=trial.env,
                error=trial.error,
                created_at=trial.created_at,
            )
            session.add(row)
            session.flush()
            if trial.memory:
                session.execute(
                    insert(RankMemoryRow),
                    [
                        {
                            "trial_id": row.id,
                            "rank": m.rank,
                            "category": m.category,
                            "predicted_bytes": m.predicted_bytes,
                            "measured_bytes": m.measured_bytes,
                        }
                        for m in trial.memory
                    ],
                )
            if trial.nodes:
                session.execute(
                    insert(RankNodeRow),
                    [
                        {
                            "trial_id": row.id,
                            "rank": n.rank,
                            "node_id": n.node_id,
                            "hostname": n.hostname,
                        }
                        for n in trial.nodes
                    ],
                )
            if trial.steps:
                session.execute(
                    insert(StepMetricRow),
                    [
                        {
                            "trial_id": row.id,
                            "rank": s.rank,
                            "step": s.step,
                            "phase": s.phase,
                            "time_s": s.time_s,
                            "loss": s.loss,
                        }
                        for s in trial.steps
                    ],
                )
            row.span_origin_ns = self._spans.insert(session, row.id, spans)
            return row.id

    def update_trial(
        self, trial_id: int, *, status: str, metrics: dict | None = None, error: str | None = None
    ) -> None:
        """Sets a stored trial's status, and its metrics and error where given (None: unchanged)."""
        check_status(status)
        if metrics is not None:
            check_json("trial metrics", metrics)
        check_error(error)
        with self._session(f"updating trial {trial_id}", write=True) as session:
            row = TrialRow.find_or_raise_by_id(trial_id, session, self.url_for_display)
            row.status = status
            if metrics is not None:
                row.metrics = metrics
            if error is not None:
                row.error = error

    def get_trial(self, trial_id: int) -> TrialRecord:
        """One trial with its memory and step records, in the order they were stored."""
        with self._session(f"reading trial {trial_id}") as session:
            return TrialRow.find_or_raise_by_id(
                trial_id, session, self.url_for_display, *_WITH_CHILDREN
            ).to_record()

    def list_trials(self, study_id: int | None = None) -> list[TrialRecord]:
        """The trials of one study (``study_id``) or all trials (None), oldest first.

        Memory, step and rank-node records are included (four queries for every 500 trials);
        spans are not: read them per trial with :meth:`trial_spans`.
        """
        with self._session("listing trials") as session:
            query = select(TrialRow).options(*_WITH_CHILDREN).order_by(TrialRow.id)
            if study_id is not None:
                query = query.where(TrialRow.study_id == study_id)
            return [row.to_record() for row in session.scalars(query)]

    # ---- calibrations ------------------------------------------------------------------------
    def add_calibration(
        self,
        study_id: int,
        *,
        num_trials: int,
        cluster: dict,
        calibration: dict,
        residuals: dict | None = None,
    ) -> CalibrationRecord:
        """Stores a study's cluster and a calibration fitted on ``num_trials`` complete trials
        (0: the cluster's own figures); the newest row is the study's calibration."""
        residuals = {} if residuals is None else residuals
        check_calibration(
            study_id,
            num_trials,
            {
                "the calibration's cluster": cluster,
                "the calibration": calibration,
                "the calibration's residuals": residuals,
            },
        )
        with self._session(f"storing a calibration of study {study_id}", write=True) as session:
            StudyRow.find_or_raise_by_id(study_id, session, self.url_for_display)
            row = CalibrationRow(
                study_id=study_id,
                created_at=datetime.now(UTC),
                num_trials=num_trials,
                cluster=cluster,
                calibration=calibration,
                residuals=residuals,
            )
            session.add(row)
            session.flush()
            return row.to_record()

    def latest_calibration(self, study_id: int) -> CalibrationRecord | None:
        """The study's newest calibration, or None when none is stored."""
        with self._session(f"reading the calibration of study {study_id}") as session:
            row = session.scalars(
                select(CalibrationRow)
                .where(CalibrationRow.study_id == study_id)
                .order_by(CalibrationRow.id.desc())
                .limit(1)
            ).first()
            return None if row is None else row.to_record()

    def list_calibrations(self, study_id: int) -> list[CalibrationRecord]:
        """Every calibration of the study, oldest first."""
        with self._session(f"listing the calibrations of study {study_id}") as session:
            rows = session.scalars(
                select(CalibrationRow)
                .where(CalibrationRow.study_id == study_id)
                .order_by(CalibrationRow.id)
            )
            return [row.to_record() for row in rows]

    # ---- spans -------------------------------------------------------------------------------
    def trial_spans(self, trial_id: int, rank: int | None = None) -> list[SpanRecord]:
        """A trial's spans (one rank's when ``rank`` is given), ordered by (rank, start_ns).

        Spans with equal starts on one rank keep the order they were stored in.
        """
        with self._session(f"reading the spans of trial {trial_id}") as session:
            origin = TrialRow.find_or_raise_by_id(
                trial_id, session, self.url_for_display
            ).span_origin_ns
            if origin is None:
                return []
            return read_spans(session, trial_id, origin, rank)

    def count_spans(self, trial_id: int | None = None) -> int:
        """Spans stored for one trial, or in the whole database (None)."""
        with self._session("counting spans") as session:
            query = select(func.count()).select_from(SpanRow)
            if trial_id is not None:
                query = query.where(SpanRow.trial_id == trial_id)
            return int(session.scalar(query) or 0)


def _rollback_quietly(session: Session) -> None:
    try:
        session.rollback()
    except Exception:  # the original error is the one worth reporting
        pass
