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

SQLite specifics (applied on every new connection): ``journal_mode=WAL``,
``synchronous=NORMAL`` (WAL's usual pairing: a power cut can lose the last commits, never corrupt
the file), ``foreign_keys=ON``, a 30 s busy timeout, and transactions begun by SQLAlchemy rather
than by the ``sqlite3`` module, so schema changes are transactional too.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import ClassVar

from sqlalchemy import Connection, Engine, create_engine, event, func, insert, select
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError
from sqlalchemy.orm import Session

from . import schema
from .errors import StorageError, hide_password
from .models import (
    SPAN_COLUMNS,
    CalibrationRow,
    RankMemoryRow,
    RankNodeRow,
    SpanNameRow,
    SpanRow,
    StepMetricRow,
    StudyRow,
    TrialRow,
)
from .records import (
    SPAN_KINDS,
    STEP_PHASES,
    TRIAL_STATUSES,
    CalibrationRecord,
    RankMemoryRecord,
    RankNodeRecord,
    SpanRecord,
    StepMetricRecord,
    StudyRecord,
    TrialRecord,
)

SPAN_CHUNK = 20_000
"""Spans per executemany call. Bounds the memory of one batch; the speed is the same from 2,000
to all spans in one call (measured with bench/span_ingest.py's data)."""

# PostgreSQL advisory lock keys, (namespace, key) as pg_advisory_lock(int, int) takes them: the
# namespace keeps autotune's locks apart from any other program's in the same database.
LOCK_NAMESPACE = 0x6175_746F  # 'auto'
LOCK_SCHEMA = 1
"""Creating or migrating the schema, ours (per transaction) or Optuna's (``setup_lock``)."""
LOCK_SPAN_NAMES = 2
"""Adding rows to ``autotune_span_names``."""

SQLITE_BUSY_TIMEOUT_MS = 30_000
CONNECT_TIMEOUT_S = 10
"""Server databases: give up on an unreachable host after this long instead of the OS default."""

# pip package for a missing DBAPI module (ImportError.name).
DRIVER_PACKAGES = {
    "psycopg2": "psycopg2-binary",
    "psycopg": "'psycopg[binary]'",
    "pymysql": "pymysql",
    "MySQLdb": "mysqlclient",
    "mysql": "mysql-connector-python",
    "pyodbc": "pyodbc",
    "oracledb": "oracledb",
    "asyncpg": "asyncpg",
    "aiosqlite": "aiosqlite",
}

_MISSING_PARENT = "it refers to a study or trial that does not exist"
_DUPLICATE_KEY = ("a row with that key is already stored (study name, trial number in its study, "
                  "or a rank's memory category or step)")
# Driver messages (lower-cased substrings) and what the user should do about them.
_HINTS = (
    ("file is not a database", "point the URL at an autotune database or at a new file"),
    ("database disk image is malformed", "the file is damaged: restore it from a backup or use "
                                         "a new database (sqlite3's .recover may save some "
                                         "rows)"),
    ("unable to open database file", "check that the path is right and its directory exists "
                                     "and is writable"),
    ("readonly database", "the database is read-only: use a writable file (and no mode=ro)"),
    ("database is locked", "another process is writing to it (the search driver must be the "
                           "only writer): wait for it to finish or use another database"),
    ("disk is full", "free some disk space"),
    ("disk i/o error", "check the disk and file system holding the database"),
    ("connection refused", "check the host and port, and that the database server is running"),
    ("could not connect", "check the host and port, and that the database server is running"),
    ("could not translate host", "check the host name in the URL"),
    ("timeout expired", "check the host and port, and that the database server is running"),
    ("can't connect", "check the host and port, and that the database server is running"),
    ("authentication failed", "check the user name and password"),
    ("access denied", "check the user name and password"),
    ("does not exist", "create the database on the server first"),
    ("no such table", "the autotune tables are missing or damaged: use a new database"),
    ("no such column", "the autotune tables are damaged: use a new database"),
    # SQLite's words, then PostgreSQL's.
    ("foreign key constraint failed", _MISSING_PARENT),
    ("violates foreign key constraint", _MISSING_PARENT),
    ("unique constraint failed", _DUPLICATE_KEY),
    ("violates unique constraint", _DUPLICATE_KEY),
)


class Database:
    """Persistence of autotune results; see the module docstring for the contract."""

    migrations: ClassVar[tuple[schema.Migration, ...]] = schema.MIGRATIONS
    """The migrations this code knows; the schema version it writes is the last one's."""

    url_for_display: str
    """The URL with the password hidden."""
    schema_version: int
    """The schema version of the open database (the latest this code knows)."""

    def __init__(self, engine: Engine, url_for_display: str, schema_version: int, *,
                 password: str | None = None) -> None:
        """Use :meth:`open`."""
        self._engine = engine
        # Writes begin with BEGIN IMMEDIATE on SQLite (see _configure_sqlite): the write lock is
        # taken up front, so a write transaction that reads first never fails to upgrade its lock.
        self._write_engine = engine.execution_options(autotune_write=True)
        self._password = password
        self._dbapi_error: type[BaseException] = engine.dialect.loaded_dbapi.Error
        self.url_for_display = url_for_display
        self.schema_version = schema_version
        compiled = insert(SpanRow.__table__).compile(dialect=engine.dialect)
        # Driver-level executemany with positional tuples is the fast path (SQLite: ~3x Core's
        # list-of-dicts insert, see bench/span_ingest.py); drivers with named parameters get Core.
        self._span_sql: str | None = (
            compiled.string
            if compiled.positional and tuple(compiled.positiontup or ()) == SPAN_COLUMNS
            else None)
        # psycopg 3 streams rows with COPY: ~2x its multi-row INSERT (40,000 spans of
        # tests/db/db_testdata.make_spans: 2.4 s against 5.2 s on a loaded 2-core machine).
        self._span_copy: str | None = (
            f"COPY {SpanRow.__tablename__} ({', '.join(SPAN_COLUMNS)}) FROM STDIN"
            if engine.dialect.driver == "psycopg" else None)

    # ---- opening -----------------------------------------------------------------------------
    @classmethod
    def open(cls, url: str, *, create: bool = True) -> Database:
        """Opens the database at SQLAlchemy ``url`` (``sqlite:///path.db``, ``postgresql://...``).

        A new or empty database (Optuna's tables may be there) gets the autotune schema when
        ``create`` is true; an older autotune schema is migrated; a newer one is refused. With
        ``create=False`` a missing SQLite file or a database without the autotune schema is an
        error, and nothing is created.
        """
        parsed = _parse_url(url)
        # The URL as given (render_as_string would percent-encode 'file:' URIs), password hidden.
        display = hide_password(url.strip() if isinstance(url, str) else
                                parsed.render_as_string(hide_password=True), parsed.password)
        sqlite_path = _sqlite_file(parsed)
        if sqlite_path is not None:
            _check_sqlite_path(sqlite_path, display, create, parsed.query.get("mode"))
        engine = _create_engine(parsed, display)
        try:
            version = _prepare_schema(engine, cls.migrations, create=create, display=display,
                                      password=parsed.password)
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
                raise _translate(exc, "taking the schema lock", self.url_for_display,
                                 self._password) from exc
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
            raise _translate(exc, action, self.url_for_display, self._password) from exc
        except BaseException:
            _rollback_quietly(session)
            raise
        finally:
            session.close()

    # ---- studies -----------------------------------------------------------------------------
    def create_study(self, name: str, spec: dict) -> StudyRecord:
        """A new study; its name must be unique in the database."""
        if not isinstance(name, str) or not name.strip():
            raise StorageError(f"a study needs a non-empty name, got {name!r}")
        _check_json("the study spec", spec)
        with self._session(f"creating study {name!r}", write=True) as session:
            if session.scalar(select(StudyRow.id).where(StudyRow.name == name)) is not None:
                raise StorageError(f"a study named {name!r} already exists in "
                                   f"{self.url_for_display}; choose another name or load it")
            row = StudyRow(name=name, spec=spec, created_at=datetime.now(timezone.utc))
            session.add(row)
            session.flush()
            return _study_record(row)

    def get_study(self, name: str) -> StudyRecord:
        """The study called ``name``; a missing one is an error that lists the existing names."""
        with self._session(f"reading study {name!r}") as session:
            row = session.scalars(select(StudyRow).where(StudyRow.name == name)).one_or_none()
            if row is None:
                names = list(session.scalars(select(StudyRow.name).order_by(StudyRow.id)))
                shown = ", ".join(names[:20]) + (f", ... ({len(names) - 20} more)"
                                                 if len(names) > 20 else "")
                raise StorageError(f"no study named {name!r} in {self.url_for_display}; "
                                   f"existing: {shown or 'none'}")
            return _study_record(row)

    def list_studies(self) -> list[StudyRecord]:
        """Every study, oldest first."""
        with self._session("listing studies") as session:
            rows = session.scalars(select(StudyRow).order_by(StudyRow.id))
            return [_study_record(row) for row in rows]

    # ---- trials ------------------------------------------------------------------------------
    def add_trial(self, trial: TrialRecord, spans: Iterable[SpanRecord] = ()) -> int:
        """Stores a new trial (``trial.id`` None) with its memory, steps and spans; returns its id.

        One transaction: if anything is wrong (a span with a non-integer field, an unknown study,
        a duplicate memory category) nothing at all is stored. ``spans`` may be any iterable,
        a generator included; it is consumed once, in chunks.
        """
        _check_trial(trial)
        with self._session("storing a trial", write=True) as session:
            if (trial.study_id is not None
                    and session.get(StudyRow, trial.study_id) is None):
                raise StorageError(f"no study with id {trial.study_id} in "
                                   f"{self.url_for_display}; create the study first")
            row = TrialRow(study_id=trial.study_id, number=trial.number, status=trial.status,
                           config=trial.config, metrics=trial.metrics, env=trial.env,
                           error=trial.error, created_at=trial.created_at)
            session.add(row)
            session.flush()
            if trial.memory:
                session.execute(insert(RankMemoryRow), [
                    {"trial_id": row.id, "rank": m.rank, "category": m.category,
                     "predicted_bytes": m.predicted_bytes, "measured_bytes": m.measured_bytes}
                    for m in trial.memory])
            if trial.nodes:
                session.execute(insert(RankNodeRow), [
                    {"trial_id": row.id, "rank": n.rank, "node_id": n.node_id,
                     "hostname": n.hostname} for n in trial.nodes])
            if trial.steps:
                session.execute(insert(StepMetricRow), [
                    {"trial_id": row.id, "rank": s.rank, "step": s.step, "phase": s.phase,
                     "time_s": s.time_s, "loss": s.loss}
                    for s in trial.steps])
            row.span_origin_ns = self._insert_spans(session, row.id, spans)
            return row.id

    def _insert_spans(self, session: Session, trial_id: int,
                      spans: Iterable[SpanRecord]) -> int | None:
        """Bulk-inserts ``spans`` in the session's transaction; returns their time origin."""
        iterator = iter(spans)
        first = next(iterator, None)
        if first is None:
            return None
        problem = _span_problem(first)
        if problem:
            raise StorageError(f"span 0 {problem}; nothing was stored")
        origin = first.start_ns
        names = _span_names(session)
        names_locked = False
        connection = session.connection()
        chunk: list[tuple[int, ...]] = []
        chunk_start = 0
        index = 0
        try:
            # The hot loop, ~0.5 µs a span. The exact int check costs ~15% of it and is kept: a
            # float would otherwise be stored whenever it happens to be whole (SQLite converts
            # it), and refused when it does not, which hides a precision bug in the caller.
            # Ranges and signs are left to the database (64-bit columns, a CHECK constraint).
            for index, span in enumerate(itertools.chain((first,), iterator)):
                rank, step, start_ns, dur_ns, payload = (
                    span.rank, span.step, span.start_ns, span.dur_ns, span.bytes)
                if (type(rank) is not int or type(step) is not int or type(start_ns) is not int
                        or type(dur_ns) is not int or type(payload) is not int):
                    raise StorageError(f"span {index} {_span_problem(span) or 'is malformed'}; "
                                       "nothing was stored")
                key = (span.kind, span.name, span.category, span.group)
                name_id = names.get(key)
                if name_id is None and not names_locked:
                    # Another driver may be interning the same name right now (PostgreSQL).
                    names_locked = True
                    if _lock(connection, LOCK_SPAN_NAMES):
                        names = _span_names(session)
                        name_id = names.get(key)
                if name_id is None:
                    name_id = names[key] = _intern_span_name(session, key, index)
                chunk.append((trial_id, rank, start_ns - origin, index, step, name_id, dur_ns,
                              payload))
                if len(chunk) == SPAN_CHUNK:
                    self._insert_span_chunk(connection, chunk, chunk_start)
                    chunk_start += len(chunk)
                    chunk = []
        except AttributeError as exc:  # not a SpanRecord
            problem = _span_problem(span) or f"is malformed ({exc})"
            raise StorageError(f"span {index} {problem}; nothing was stored") from exc
        if chunk:
            self._insert_span_chunk(connection, chunk, chunk_start)
        return origin

    def _insert_span_chunk(self, connection: Connection, chunk: list[tuple[int, ...]],
                           chunk_start: int) -> None:
        try:
            if self._span_copy is not None:
                cursor = connection.connection.cursor()
                try:
                    with cursor.copy(self._span_copy) as copy:
                        for row in chunk:
                            copy.write_row(row)
                finally:
                    cursor.close()
            elif self._span_sql is not None:
                cursor = connection.connection.cursor()
                try:
                    cursor.executemany(self._span_sql, chunk)
                finally:
                    cursor.close()
            else:
                connection.execute(insert(SpanRow.__table__),
                                   [dict(zip(SPAN_COLUMNS, row)) for row in chunk])
        except (SQLAlchemyError, self._dbapi_error, OverflowError, TypeError, ValueError) as exc:
            # Find the span the database refused (it comes from this chunk) and name it.
            for offset, row in enumerate(chunk):
                problem = _span_row_problem(row)
                if problem:
                    raise StorageError(f"span {chunk_start + offset} {problem}; "
                                       "nothing was stored") from exc
            raise _translate(exc, "storing spans", self.url_for_display, self._password) from exc

    def update_trial(self, trial_id: int, *, status: str, metrics: dict | None = None,
                     error: str | None = None) -> None:
        """Sets a stored trial's status, and its metrics and error where given (None: unchanged)."""
        _check_status(status)
        if metrics is not None:
            _check_json("trial metrics", metrics)
        if error is not None and not isinstance(error, str):
            raise StorageError(f"a trial's error must be a string, got {type(error).__name__}")
        with self._session(f"updating trial {trial_id}", write=True) as session:
            row = session.get(TrialRow, trial_id)
            if row is None:
                raise StorageError(f"no trial with id {trial_id} in {self.url_for_display}")
            row.status = status
            if metrics is not None:
                row.metrics = metrics
            if error is not None:
                row.error = error

    def get_trial(self, trial_id: int) -> TrialRecord:
        """One trial with its memory and step records, in the order they were stored."""
        with self._session(f"reading trial {trial_id}") as session:
            row = session.get(TrialRow, trial_id)
            if row is None:
                raise StorageError(f"no trial with id {trial_id} in {self.url_for_display}; "
                                   "check the id (each stored trial's id is printed)")
            memory = session.scalars(select(RankMemoryRow).where(RankMemoryRow.trial_id == row.id)
                                     .order_by(RankMemoryRow.id))
            steps = session.scalars(select(StepMetricRow).where(StepMetricRow.trial_id == row.id)
                                    .order_by(StepMetricRow.id))
            nodes = session.scalars(select(RankNodeRow).where(RankNodeRow.trial_id == row.id)
                                    .order_by(RankNodeRow.rank))
            return _trial_record(row, [_memory_record(m) for m in memory],
                                 [_step_record(s) for s in steps],
                                 [_node_record(n) for n in nodes])

    def list_trials(self, study_id: int | None = None) -> list[TrialRecord]:
        """The trials of one study (``study_id``) or all trials (None), oldest first.

        Memory, step and rank-node records are included (four queries in all, however many
        trials); spans are not: read them per trial with :meth:`trial_spans`.
        """
        with self._session("listing trials") as session:
            trials = select(TrialRow).order_by(TrialRow.id)
            memory = select(RankMemoryRow).order_by(RankMemoryRow.trial_id, RankMemoryRow.id)
            steps = select(StepMetricRow).order_by(StepMetricRow.trial_id, StepMetricRow.id)
            nodes = select(RankNodeRow).order_by(RankNodeRow.trial_id, RankNodeRow.rank)
            if study_id is not None:
                ids = select(TrialRow.id).where(TrialRow.study_id == study_id)
                trials = trials.where(TrialRow.study_id == study_id)
                memory = memory.where(RankMemoryRow.trial_id.in_(ids))
                steps = steps.where(StepMetricRow.trial_id.in_(ids))
                nodes = nodes.where(RankNodeRow.trial_id.in_(ids))
            memory_by_trial: dict[int, list[RankMemoryRecord]] = {}
            for m in session.scalars(memory):
                memory_by_trial.setdefault(m.trial_id, []).append(_memory_record(m))
            steps_by_trial: dict[int, list[StepMetricRecord]] = {}
            for s in session.scalars(steps):
                steps_by_trial.setdefault(s.trial_id, []).append(_step_record(s))
            nodes_by_trial: dict[int, list[RankNodeRecord]] = {}
            for n in session.scalars(nodes):
                nodes_by_trial.setdefault(n.trial_id, []).append(_node_record(n))
            return [_trial_record(r, memory_by_trial.get(r.id, ()), steps_by_trial.get(r.id, ()),
                                  nodes_by_trial.get(r.id, ()))
                    for r in session.scalars(trials)]

    # ---- calibrations ------------------------------------------------------------------------
    def add_calibration(self, study_id: int, *, num_trials: int, cluster: dict,
                        calibration: dict, residuals: dict | None = None) -> CalibrationRecord:
        """Stores a study's cluster and a calibration fitted on ``num_trials`` complete trials
        (0: the cluster's own figures); the newest row is the study's calibration."""
        if not _is_int(study_id):
            raise StorageError(f"a calibration's study_id must be an int, got {study_id!r}")
        if not _is_int(num_trials) or num_trials < 0:
            raise StorageError(f"a calibration's num_trials must be an int ≥ 0, got "
                               f"{num_trials!r}")
        residuals = {} if residuals is None else residuals
        for what, value in (("the calibration's cluster", cluster),
                            ("the calibration", calibration),
                            ("the calibration's residuals", residuals)):
            _check_json(what, value)
        with self._session(f"storing a calibration of study {study_id}",
                           write=True) as session:
            if session.get(StudyRow, study_id) is None:
                raise StorageError(f"no study with id {study_id} in {self.url_for_display}; "
                                   "create the study first")
            row = CalibrationRow(study_id=study_id, created_at=datetime.now(timezone.utc),
                                 num_trials=num_trials, cluster=cluster,
                                 calibration=calibration, residuals=residuals)
            session.add(row)
            session.flush()
            return _calibration_record(row)

    def latest_calibration(self, study_id: int) -> CalibrationRecord | None:
        """The study's newest calibration, or None when none is stored."""
        with self._session(f"reading the calibration of study {study_id}") as session:
            row = session.scalars(select(CalibrationRow)
                                  .where(CalibrationRow.study_id == study_id)
                                  .order_by(CalibrationRow.id.desc()).limit(1)).first()
            return None if row is None else _calibration_record(row)

    def list_calibrations(self, study_id: int) -> list[CalibrationRecord]:
        """Every calibration of the study, oldest first."""
        with self._session(f"listing the calibrations of study {study_id}") as session:
            rows = session.scalars(select(CalibrationRow)
                                   .where(CalibrationRow.study_id == study_id)
                                   .order_by(CalibrationRow.id))
            return [_calibration_record(row) for row in rows]

    # ---- spans -------------------------------------------------------------------------------
    def trial_spans(self, trial_id: int, rank: int | None = None) -> list[SpanRecord]:
        """A trial's spans (one rank's when ``rank`` is given), ordered by (rank, start_ns).

        Spans with equal starts on one rank keep the order they were stored in.
        """
        with self._session(f"reading the spans of trial {trial_id}") as session:
            found = session.execute(select(TrialRow.span_origin_ns)
                                    .where(TrialRow.id == trial_id)).first()
            if found is None:
                raise StorageError(f"no trial with id {trial_id} in {self.url_for_display}")
            origin = found[0]
            if origin is None:
                return []
            names = {name_id: (kind, name, category, group)
                     for name_id, kind, name, category, group in session.execute(select(
                         SpanNameRow.id, SpanNameRow.kind, SpanNameRow.name,
                         SpanNameRow.category, SpanNameRow.group_name))}
            query = (select(SpanRow.rank, SpanRow.step, SpanRow.name_id, SpanRow.start_ns,
                            SpanRow.dur_ns, SpanRow.bytes)
                     .where(SpanRow.trial_id == trial_id))
            if rank is not None:
                query = query.where(SpanRow.rank == rank)
            query = query.order_by(SpanRow.rank, SpanRow.start_ns, SpanRow.seq)
            spans = []
            append = spans.append
            # Core rows, not ORM entities: 50,000 spans load in ~0.07 s so, ~0.5 s as entities.
            for span_rank, step, name_id, start_ns, dur_ns, payload in (
                    session.connection().execute(query)):
                kind, name, category, group = names[name_id]
                append(SpanRecord(span_rank, step, kind, name, category, start_ns + origin,
                                  dur_ns, payload, group))
            return spans

    def count_spans(self, trial_id: int | None = None) -> int:
        """Spans stored for one trial, or in the whole database (None)."""
        with self._session("counting spans") as session:
            query = select(func.count()).select_from(SpanRow)
            if trial_id is not None:
                query = query.where(SpanRow.trial_id == trial_id)
            return int(session.scalar(query) or 0)


# ---- opening: URL, engine, schema ------------------------------------------------------------
_KNOWN_BACKENDS = ("sqlite", "postgresql", "postgres", "mysql", "mariadb", "oracle", "mssql")
_SQLITE_SUFFIXES = (".db", ".sqlite", ".sqlite3", ".db3")


def _parse_url(url: str) -> URL:
    if isinstance(url, URL):
        return url
    if not isinstance(url, str):
        raise StorageError(f"a database URL must be a string, got {type(url).__name__}")
    text = url.strip()
    shown = hide_password(text)
    if "://" not in text:
        lowered = text.lower()
        for backend in _KNOWN_BACKENDS:
            after = text[len(backend):len(backend) + 1]
            if lowered.startswith(backend) and after in (":", "/", "+"):
                scheme = "postgresql" if backend == "postgres" else backend
                example = ("sqlite:///" + text[len(backend):].lstrip(":/")
                           if backend == "sqlite" else f"{scheme}://user@host/dbname")
                raise StorageError(f"malformed database URL {shown!r}: it needs '://' after the "
                                   f"dialect, e.g. {example}")
        if text.lower().endswith(_SQLITE_SUFFIXES) or os.sep in text:
            raise StorageError(f"{shown!r} is a file path, not a database URL; use "
                               f"sqlite:///{text} (an absolute path gives four slashes)")
    try:
        return make_url(text)
    except (ArgumentError, ValueError) as exc:
        raise StorageError(f"cannot parse database URL {shown!r}; give a SQLAlchemy URL such as "
                           "sqlite:///autotune.db or postgresql://user@host/dbname") from exc


def _sqlite_file(url: URL) -> str | None:
    """The file a SQLite URL points at, or None for memory databases and other dialects."""
    if url.get_backend_name() != "sqlite":
        return None
    database = url.database or ""
    if url.query.get("uri") in ("true", "1") and database.startswith("file:"):
        if url.query.get("mode") == "memory":
            return None
        database = database[len("file://"):] if database.startswith("file://") else database[5:]
    if database in ("", ":memory:"):
        return None
    return database


def _check_sqlite_path(path: str, display: str, create: bool, url_query_mode: str | None) -> None:
    """Clear errors for paths SQLite would only call 'unable to open database file'."""
    directory = os.path.dirname(os.path.abspath(path)) or "."
    if not os.path.isdir(directory):
        raise StorageError(f"cannot open {display}: directory {directory} does not exist; "
                           "create it first or choose another path")
    if os.path.isdir(path):
        raise StorageError(f"cannot open {display}: {path} is a directory; give a file path")
    if url_query_mode == "ro" and not os.path.exists(path):
        raise StorageError(f"no SQLite database at {os.path.abspath(path)} ({display}); a "
                           "read-only URL (mode=ro) cannot create one: check the path")
    if not create and not os.path.exists(path):
        raise StorageError(f"no SQLite database at {os.path.abspath(path)} ({display}); check "
                           "the path (this call creates nothing)")


def _create_engine(url: URL, display: str) -> Engine:
    backend = url.get_backend_name()
    kwargs: dict = {}
    if backend in ("postgresql", "mysql", "mariadb") and "connect_timeout" not in url.query:
        kwargs["connect_args"] = {"connect_timeout": CONNECT_TIMEOUT_S}
    if backend != "sqlite":
        kwargs["pool_pre_ping"] = True
    try:
        engine = create_engine(url, **kwargs)
    except NoSuchModuleError as exc:
        fix = ("use postgresql://" if url.drivername.startswith("postgres:") or
               url.drivername == "postgres" else
               "use a SQLAlchemy URL such as sqlite:///autotune.db or postgresql://user@host/db")
        raise StorageError(f"unknown database dialect or driver {url.drivername!r} in "
                           f"{display}; {fix}") from exc
    except ImportError as exc:
        module = (exc.name or "").split(".")[0] or str(exc)
        package = DRIVER_PACKAGES.get(module, module)
        raise StorageError(f"the database driver {module!r} for {display} is not installed; "
                           f"pip install {package}") from exc
    except (ArgumentError, TypeError, ValueError) as exc:
        raise StorageError(f"invalid database URL {display}: "
                           f"{hide_password(_first_line(exc), url.password)}; check its options"
                           ) from exc
    if backend == "sqlite":
        _configure_sqlite(engine)
    return engine


def _configure_sqlite(engine: Engine) -> None:
    pysqlite = engine.dialect.driver == "pysqlite"
    operational_error = engine.dialect.loaded_dbapi.OperationalError

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record) -> None:
        if pysqlite:
            # The sqlite3 module begins transactions itself, and not before DDL; leave that to
            # SQLAlchemy ("begin" below) so schema creation and migrations are one transaction.
            dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("PRAGMA foreign_keys = ON")
            cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
            mode = cursor.execute("PRAGMA journal_mode").fetchone()[0]
            if mode not in ("wal", "memory"):
                try:
                    cursor.execute("PRAGMA journal_mode = WAL")
                except operational_error:
                    pass  # a read-only file keeps the mode it has; reading still works
            cursor.execute("PRAGMA synchronous = NORMAL")
        finally:
            cursor.close()

    if pysqlite:
        @event.listens_for(engine, "begin")
        def _on_begin(connection: Connection) -> None:
            write = connection.get_execution_options().get("autotune_write", False)
            connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def _prepare_schema(engine: Engine, migrations: tuple[schema.Migration, ...], *, create: bool,
                    display: str, password: str | None) -> int:
    """Creates, migrates or checks the schema; returns the version now in the database."""
    latest = schema.latest_version(migrations)
    dbapi_error = engine.dialect.loaded_dbapi.Error
    try:
        with engine.connect() as connection:
            version, has_tables = schema.read_version(connection)
    except (SQLAlchemyError, dbapi_error) as exc:
        raise _translate(exc, "opening the database", display, password) from exc
    if version == latest:
        return latest
    if version is not None and version > latest:
        raise StorageError(f"database schema version {version} is newer than this autotune "
                           f"understands ({latest}); upgrade autotune ({display})")
    if version is None and has_tables:
        raise StorageError(f"{display} has autotune_* tables but no schema version in "
                           f"{schema.VERSION_TABLE}; it was not written by autotune: use a new "
                           "database")
    if version is None and not create:
        raise StorageError(f"{display} holds no autotune data (no {schema.VERSION_TABLE} "
                           "table); check the URL, or open it with create=True")
    action = ("creating the autotune tables" if version is None else
              f"migrating the autotune schema from version {version} to {latest}")
    try:
        with engine.connect() as connection:
            if version is None:
                with connection.execution_options(autotune_write=True).begin():
                    _lock(connection, LOCK_SCHEMA)
                    version_now, _ = schema.read_version(connection)  # another process may
                    if version_now is None:                            # have just created it
                        schema.create_schema(connection, latest)
            else:
                _migrate(connection, migrations, latest, display)
    except StorageError:
        raise
    except (SQLAlchemyError, dbapi_error) as exc:
        raise _translate(exc, action, display, password) from exc
    return latest


def _migrate(connection: Connection, migrations: tuple[schema.Migration, ...], latest: int,
             display: str) -> None:
    """Runs the pending migrations in one transaction (SQLite: with foreign keys off)."""
    sqlite = connection.dialect.name == "sqlite"
    if sqlite:
        # Rebuilding a parent table (batch_alter_table) drops it; with enforcement on, that
        # would cascade-delete its children. The pragma is a no-op inside a transaction, so it
        # is set before BEGIN, and foreign_key_check runs before COMMIT instead
        # (https://www.sqlite.org/lang_altertable.html, "Making Other Kinds Of Table Schema
        # Changes").
        _pragma(connection, "PRAGMA foreign_keys = OFF")
    try:
        with connection.execution_options(autotune_write=True).begin():
            _lock(connection, LOCK_SCHEMA)
            version, _ = schema.read_version(connection)
            if version is None or version > latest:
                raise StorageError(f"the schema of {display} changed while opening it; retry")
            if version < latest:
                schema.upgrade(connection, migrations, version)
            if sqlite:
                broken = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
                if broken:
                    raise StorageError(f"migrating {display} to version {latest} would break "
                                       f"{len(broken)} foreign keys (first: {tuple(broken[0])}); "
                                       "the database was left unchanged")
    finally:
        if sqlite:
            _pragma(connection, "PRAGMA foreign_keys = ON")


def _lock(connection: Connection, key: int) -> bool:
    """Takes autotune's advisory lock ``key`` until the transaction ends, waiting for another
    holder; True on PostgreSQL, False (nothing done) elsewhere."""
    if connection.dialect.name != "postgresql":
        return False
    connection.execute(select(func.pg_advisory_xact_lock(LOCK_NAMESPACE, key)))
    return True


def _pragma(connection: Connection, statement: str) -> None:
    """Runs a PRAGMA on the DBAPI connection, outside any SQLAlchemy transaction."""
    cursor = connection.connection.cursor()
    try:
        cursor.execute(statement)
    finally:
        cursor.close()


# ---- checking input --------------------------------------------------------------------------
def _check_json(what: str, value: object) -> None:
    if not isinstance(value, dict):
        raise StorageError(f"{what} must be a dict, got {type(value).__name__}")
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise StorageError(f"{what} is not JSON-serialisable ({exc}); convert it to dicts, "
                           "lists, strings and numbers") from exc


def _check_status(status: object) -> None:
    if status not in TRIAL_STATUSES:
        raise StorageError(f"trial status {status!r} is not one of {', '.join(TRIAL_STATUSES)}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_trial(trial: TrialRecord) -> None:
    """Everything about a trial except its spans, checked before anything is written."""
    if not isinstance(trial, TrialRecord):
        raise StorageError(f"add_trial takes a TrialRecord, got {type(trial).__name__}")
    if trial.id is not None:
        raise StorageError(f"add_trial stores a new trial (id None), got id {trial.id}; "
                           "use update_trial to change a stored one")
    for field in ("study_id", "number"):
        value = getattr(trial, field)
        if value is not None and not _is_int(value):
            raise StorageError(f"trial {field} must be an int or None, got {value!r}")
    _check_status(trial.status)
    _check_json("trial config", trial.config)
    _check_json("trial metrics", trial.metrics)
    _check_json("trial env", trial.env)
    if trial.error is not None and not isinstance(trial.error, str):
        raise StorageError(f"a trial's error must be a string, got {type(trial.error).__name__}")
    if not isinstance(trial.created_at, datetime) or trial.created_at.utcoffset() is None:
        raise StorageError(f"trial created_at must be a timezone-aware datetime, got "
                           f"{trial.created_at!r}; use datetime.now(timezone.utc)")
    for i, m in enumerate(trial.memory):
        if not isinstance(m, RankMemoryRecord):
            raise StorageError(f"trial memory[{i}] is a {type(m).__name__}, "
                               "not a RankMemoryRecord")
        if not _is_int(m.rank) or not isinstance(m.category, str) or not all(
                v is None or _is_int(v) for v in (m.predicted_bytes, m.measured_bytes)):
            raise StorageError(f"trial memory[{i}] = {m!r} needs an int rank, a str category "
                               "and int-or-None byte counts")
    for i, s in enumerate(trial.steps):
        if not isinstance(s, StepMetricRecord):
            raise StorageError(f"trial steps[{i}] is a {type(s).__name__}, "
                               "not a StepMetricRecord")
        if s.phase not in STEP_PHASES:
            raise StorageError(f"trial steps[{i}] has phase {s.phase!r}, not one of "
                               f"{', '.join(STEP_PHASES)}")
        if (not _is_int(s.rank) or not _is_int(s.step) or not _is_number(s.time_s)
                or not (s.loss is None or _is_number(s.loss))):
            raise StorageError(f"trial steps[{i}] = {s!r} needs int rank and step, a float "
                               "time_s and a float-or-None loss")
    for i, n in enumerate(trial.nodes):
        if (not isinstance(n, RankNodeRecord) or not _is_int(n.rank)
                or not isinstance(n.node_id, str) or not isinstance(n.hostname, str)):
            raise StorageError(f"trial nodes[{i}] = {n!r} must be a RankNodeRecord with an int "
                               "rank and str node_id and hostname")


_SPAN_INT_FIELDS = ("rank", "step", "start_ns", "dur_ns", "bytes")
_SPAN_STR_FIELDS = ("kind", "name", "category", "group")
_INT64 = range(-2**63, 2**63)


def _span_problem(span: object) -> str | None:
    """What is wrong with one input span, or None (used once something has failed)."""
    if not isinstance(span, SpanRecord):
        return f"is a {type(span).__name__}, not a SpanRecord"
    for field in _SPAN_INT_FIELDS:
        value = getattr(span, field)
        if not _is_int(value):
            return f"has {field}={value!r} ({type(value).__name__}); it must be an int"
        if value not in _INT64:
            return f"has {field}={value}, outside the 64-bit integer range"
    for field in ("dur_ns", "bytes"):
        if getattr(span, field) < 0:
            return f"has {field}={getattr(span, field)}; it must be >= 0"
    for field in _SPAN_STR_FIELDS:
        value = getattr(span, field)
        if not isinstance(value, str):
            return f"has {field}={value!r} ({type(value).__name__}); it must be a str"
    if span.kind not in SPAN_KINDS:
        return f"has kind {span.kind!r}, not one of {', '.join(SPAN_KINDS)}"
    return None


def _span_row_problem(row: tuple) -> str | None:
    """What is wrong with one converted span row (columns as in SPAN_COLUMNS), or None."""
    for column, value in zip(SPAN_COLUMNS, row):
        # start_ns is stored relative to the first span's, so its type is shown, not its value.
        if not _is_int(value):
            shown = "" if column == "start_ns" else f" ({value!r})"
            return f"has {column} of type {type(value).__name__}{shown}; it must be an int"
        if value not in _INT64:
            return f"has {column} outside the 64-bit integer range"
        if column in ("dur_ns", "bytes") and value < 0:
            return f"has {column}={value}; it must be >= 0"
    return None


def _span_names(session: Session) -> dict[tuple[str, str, str, str], int]:
    """Every interned (kind, name, category, group) and its id."""
    return {(kind, name, category, group): name_id
            for name_id, kind, name, category, group in session.execute(select(
                SpanNameRow.id, SpanNameRow.kind, SpanNameRow.name, SpanNameRow.category,
                SpanNameRow.group_name))}


def _intern_span_name(session: Session, key: tuple[str, str, str, str], index: int) -> int:
    kind, name, category, group = key
    for field, value in zip(_SPAN_STR_FIELDS, key):
        if not isinstance(value, str):
            raise StorageError(f"span {index} has {field}={value!r} ({type(value).__name__}); "
                               "it must be a str; nothing was stored")
    if kind not in SPAN_KINDS:
        raise StorageError(f"span {index} has kind {kind!r}, not one of "
                           f"{', '.join(SPAN_KINDS)}; nothing was stored")
    row = SpanNameRow(kind=kind, name=name, category=category, group_name=group)
    session.add(row)
    session.flush()
    return row.id


# ---- records out -----------------------------------------------------------------------------
def _study_record(row: StudyRow) -> StudyRecord:
    return StudyRecord(id=row.id, name=row.name, spec=row.spec, created_at=row.created_at)


def _calibration_record(row: CalibrationRow) -> CalibrationRecord:
    return CalibrationRecord(id=row.id, study_id=row.study_id, created_at=row.created_at,
                             num_trials=row.num_trials, cluster=row.cluster,
                             calibration=row.calibration, residuals=row.residuals)


def _memory_record(row: RankMemoryRow) -> RankMemoryRecord:
    return RankMemoryRecord(rank=row.rank, category=row.category,
                            predicted_bytes=row.predicted_bytes, measured_bytes=row.measured_bytes)


def _step_record(row: StepMetricRow) -> StepMetricRecord:
    return StepMetricRecord(rank=row.rank, step=row.step, phase=row.phase, time_s=row.time_s,
                            loss=row.loss)


def _node_record(row: RankNodeRow) -> RankNodeRecord:
    return RankNodeRecord(rank=row.rank, node_id=row.node_id, hostname=row.hostname)


def _trial_record(row: TrialRow, memory: Iterable[RankMemoryRecord],
                  steps: Iterable[StepMetricRecord],
                  nodes: Iterable[RankNodeRecord] = ()) -> TrialRecord:
    return TrialRecord(id=row.id, study_id=row.study_id, number=row.number, status=row.status,
                       config=row.config, metrics=row.metrics, env=row.env, error=row.error,
                       created_at=row.created_at, memory=tuple(memory), steps=tuple(steps),
                       nodes=tuple(nodes))


# ---- errors ----------------------------------------------------------------------------------
def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0].strip() if text else type(exc).__name__


def _translate(exc: BaseException, action: str, display: str,
               password: str | None) -> StorageError:
    """A one-line StorageError for a database error: what failed, the driver's words, the fix."""
    original = getattr(exc, "orig", None) or exc
    detail = _first_line(original)
    lowered = detail.lower()
    hint = next((fix for pattern, fix in _HINTS if pattern in lowered), None)
    message = f"{action} failed on {display}: {detail}"
    if hint:
        message += f"; {hint}"
    return StorageError(hide_password(message, password))


def _rollback_quietly(session: Session) -> None:
    try:
        session.rollback()
    except Exception:  # the original error is the one worth reporting
        pass
