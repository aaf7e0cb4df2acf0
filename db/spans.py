"""Spans in and out of the span table: bulk inserts with their names interned, timeline reads.

The layout (interned names, starts relative to the trial's first span, the timeline order as the
primary key) is ``db.models``'s. Both directions are the hot path of a study's data, so they go
below the ORM: inserts are driver-level ``executemany`` of positional tuples (SQLite: ~3x Core's
list-of-dicts insert, see bench/span_ingest.py) or ``COPY … FROM STDIN`` on psycopg 3 (~2x its
multi-row INSERT: 40,000 spans of tests/db/db_testdata.make_spans, 2.4 s against 5.2 s on a
loaded 2-core machine); reads are Core rows (50,000 spans load in ~0.07 s so, ~0.5 s as ORM
entities). Everything runs in the caller's session, so a trial's spans commit or roll back with
the trial.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable

from sqlalchemy import Connection, Dialect, insert, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from .engine import LOCK_SPAN_NAMES, xact_lock
from .errors import StorageError
from .models import SPAN_COLUMNS, SpanNameRow, SpanRow
from .records import SpanRecord
from .validation import span_problem

SPAN_CHUNK = 20_000
"""Spans per executemany call. Bounds the memory of one batch; the speed is the same from 2,000
to all spans in one call (measured with bench/span_ingest.py's data)."""

SpanName = tuple[str, str, str, str]
"""(kind, name, category, group) of a span, interned in ``autotune_span_names``."""


def _refused(index: int, problem: str) -> StorageError:
    return StorageError(f"span {index} {problem}; nothing was stored")


class SpanWriter:
    """Bulk-inserts one trial's spans at a time, in the fastest way the engine's driver allows."""

    def __init__(
        self,
        dialect: Dialect,
        dbapi_error: type[BaseException],
        translate: Callable[[BaseException, str], StorageError],
    ) -> None:
        """``translate`` turns a database error and an action into the caller's StorageError."""
        compiled = insert(SpanRow.__table__).compile(dialect=dialect)
        self._executemany_sql: str | None = (
            compiled.string
            if compiled.positional and tuple(compiled.positiontup or ()) == SPAN_COLUMNS
            else None
        )
        self._copy_sql: str | None = (
            f"COPY {SpanRow.__tablename__} ({', '.join(SPAN_COLUMNS)}) FROM STDIN"
            if dialect.driver == "psycopg"
            else None
        )
        self._dbapi_error = dbapi_error
        self._translate = translate

    def insert(self, session: Session, trial_id: int, spans: Iterable[SpanRecord]) -> int | None:
        """Inserts ``spans`` in the session's transaction; returns their time origin (the first
        span's start), None when there are none. A bad span raises, naming its position."""
        iterator = iter(spans)
        first = next(iterator, None)
        if first is None:
            return None
        problem = span_problem(first)
        if problem:
            raise _refused(0, problem)
        origin = first.start_ns
        names = _NameCache(session)
        known = names.ids
        connection = session.connection()
        chunk: list[tuple[int, ...]] = []
        chunk_spans: list[SpanRecord] = []
        index = 0
        try:
            # The hot loop, ~0.5 µs a span. The exact int check costs ~15% of it and is kept: a
            # float would otherwise be stored whenever it happens to be whole (SQLite converts
            # it), and refused when it does not, which hides a precision bug in the caller. It
            # only decides whether to ask span_problem, which words the refusal. Ranges and
            # signs are left to the database (64-bit columns, a CHECK constraint).
            for index, span in enumerate(itertools.chain((first,), iterator)):
                rank, step, start_ns, dur_ns, payload = (
                    span.rank,
                    span.step,
                    span.start_ns,
                    span.dur_ns,
                    span.bytes,
                )
                if (
                    type(rank) is not int
                    or type(step) is not int
                    or type(start_ns) is not int
                    or type(dur_ns) is not int
                    or type(payload) is not int
                ):
                    raise _refused(index, span_problem(span) or "is malformed")
                key = (span.kind, span.name, span.category, span.group)
                name_id = known.get(key)
                if name_id is None:
                    name_id = names.intern(span, key, index)
                chunk.append(
                    (trial_id, rank, start_ns - origin, index, step, name_id, dur_ns, payload)
                )
                chunk_spans.append(span)
                if len(chunk) == SPAN_CHUNK:
                    self._insert_chunk(
                        connection, chunk, chunk_spans, index + 1 - len(chunk), origin
                    )
                    chunk, chunk_spans = [], []
        except AttributeError as exc:  # not a SpanRecord
            raise _refused(index, span_problem(span) or f"is malformed ({exc})") from exc
        if chunk:
            self._insert_chunk(connection, chunk, chunk_spans, index + 1 - len(chunk), origin)
        return origin

    def _insert_chunk(
        self,
        connection: Connection,
        chunk: list[tuple[int, ...]],
        chunk_spans: list[SpanRecord],
        chunk_start: int,
        origin: int,
    ) -> None:
        """One batch of rows; a refusal names the first span of the batch that is wrong."""
        try:
            self._write_rows(connection, chunk)
        except (SQLAlchemyError, self._dbapi_error, OverflowError, TypeError, ValueError) as exc:
            for offset, span in enumerate(chunk_spans):
                problem = span_problem(span, origin)
                if problem:
                    raise _refused(chunk_start + offset, problem) from exc
            raise self._translate(exc, "storing spans") from exc

    def _write_rows(self, connection: Connection, chunk: list[tuple[int, ...]]) -> None:
        if self._copy_sql is not None:
            cursor = connection.connection.cursor()
            try:
                with cursor.copy(self._copy_sql) as copy:
                    for row in chunk:
                        copy.write_row(row)
            finally:
                cursor.close()
        elif self._executemany_sql is not None:
            cursor = connection.connection.cursor()
            try:
                cursor.executemany(self._executemany_sql, chunk)
            finally:
                cursor.close()
        else:
            connection.execute(
                insert(SpanRow.__table__), [dict(zip(SPAN_COLUMNS, row)) for row in chunk]
            )


class _NameCache:
    """Interned span names and their ids (``ids``); interns new ones (locked on PostgreSQL)."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self.ids = span_names(session)
        """Kept as one dict for the whole insert: the hot loop reads it directly."""
        self._locked = False

    def intern(self, span: SpanRecord, key: SpanName, index: int) -> int:
        """The id of a name not in ``ids`` yet, adding its row when no one else has."""
        if not self._locked:
            # Another driver may be interning the same name right now (PostgreSQL): take the
            # lock, then read again what its previous holder committed.
            self._locked = True
            if xact_lock(self._session.connection(), LOCK_SPAN_NAMES):
                self.ids.update(span_names(self._session))
                if key in self.ids:
                    return self.ids[key]
        # A new name: the span's strings and kind have not been checked yet.
        problem = span_problem(span)
        if problem:
            raise _refused(index, problem)
        row = SpanNameRow(
            kind=span.kind, name=span.name, category=span.category, group_name=span.group
        )
        self._session.add(row)
        self._session.flush()
        self.ids[key] = row.id
        return row.id


def span_names(session: Session) -> dict[SpanName, int]:
    """Every interned (kind, name, category, group) and its id."""
    return {
        (kind, name, category, group): name_id
        for name_id, kind, name, category, group in session.execute(
            select(
                SpanNameRow.id,
                SpanNameRow.kind,
                SpanNameRow.name,
                SpanNameRow.category,
                SpanNameRow.group_name,
            )
        )
    }


def read_spans(
    session: Session, trial_id: int, origin: int, rank: int | None = None
) -> list[SpanRecord]:
    """A trial's spans (one rank's when given) ordered by (rank, start, stored order); ``origin``
    is the trial's ``span_origin_ns``."""
    names = {name_id: key for key, name_id in span_names(session).items()}
    query = select(
        SpanRow.rank, SpanRow.step, SpanRow.name_id, SpanRow.start_ns, SpanRow.dur_ns, SpanRow.bytes
    ).where(SpanRow.trial_id == trial_id)
    if rank is not None:
        query = query.where(SpanRow.rank == rank)
    query = query.order_by(SpanRow.rank, SpanRow.start_ns, SpanRow.seq)
    spans = []
    append = spans.append
    for span_rank, step, name_id, start_ns, dur_ns, payload in session.connection().execute(query):
        kind, name, category, group = names[name_id]
        append(
            SpanRecord(
                span_rank, step, kind, name, category, start_ns + origin, dur_ns, payload, group
            )
        )
    return spans
