"""The engine and its dialect: URL handling, SQLite's pragmas, PostgreSQL's advisory locks.

SQLite specifics (applied on every new connection): ``journal_mode=WAL``,
``synchronous=NORMAL`` (WAL's usual pairing: a power cut can lose the last commits, never corrupt
the file), ``foreign_keys=ON``, a 30 s busy timeout, and transactions begun by SQLAlchemy rather
than by the ``sqlite3`` module, so schema changes are transactional too. A transaction on a
connection with the execution option ``autotune_write`` begins with ``BEGIN IMMEDIATE``: the
write lock is taken up front, so a write transaction that reads first never fails to upgrade
its lock.

Server databases get a connect timeout and ``pool_pre_ping``. On PostgreSQL, what drivers side
by side share is serialised by transaction-level advisory locks (:func:`xact_lock`).
"""

from __future__ import annotations

import os

from sqlalchemy import Connection, Engine, create_engine, event, func, select
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from .errors import StorageError, first_line, hide_password

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

WRITE_OPTION = "autotune_write"
"""The execution option that makes a SQLite transaction begin with ``BEGIN IMMEDIATE``."""

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

_KNOWN_BACKENDS = ("sqlite", "postgresql", "postgres", "mysql", "mariadb", "oracle", "mssql")
_SQLITE_SUFFIXES = (".db", ".sqlite", ".sqlite3", ".db3")


def parse_url(url: str | URL) -> URL:
    """``url`` parsed; a file path or a dialect without '://' is an error naming the fix."""
    if isinstance(url, URL):
        return url
    if not isinstance(url, str):
        raise StorageError(f"a database URL must be a string, got {type(url).__name__}")
    text = url.strip()
    shown = hide_password(text)
    if "://" not in text:
        lowered = text.lower()
        for backend in _KNOWN_BACKENDS:
            after = text[len(backend) : len(backend) + 1]
            if lowered.startswith(backend) and after in (":", "/", "+"):
                scheme = "postgresql" if backend == "postgres" else backend
                example = (
                    "sqlite:///" + text[len(backend) :].lstrip(":/")
                    if backend == "sqlite"
                    else f"{scheme}://user@host/dbname"
                )
                raise StorageError(
                    f"malformed database URL {shown!r}: it needs '://' after the "
                    f"dialect, e.g. {example}"
                )
        if text.lower().endswith(_SQLITE_SUFFIXES) or os.sep in text:
            raise StorageError(
                f"{shown!r} is a file path, not a database URL; use "
                f"sqlite:///{text} (an absolute path gives four slashes)"
            )
    try:
        return make_url(text)
    except (ArgumentError, ValueError) as exc:
        raise StorageError(
            f"cannot parse database URL {shown!r}; give a SQLAlchemy URL such as "
            "sqlite:///autotune.db or postgresql://user@host/dbname"
        ) from exc


def sqlite_file(url: URL) -> str | None:
    """The file a SQLite URL points at, or None for memory databases and other dialects."""
    if url.get_backend_name() != "sqlite":
        return None
    database = url.database or ""
    if url.query.get("uri") in ("true", "1") and database.startswith("file:"):
        if url.query.get("mode") == "memory":
            return None
        database = database[len("file://") :] if database.startswith("file://") else database[5:]
    if database in ("", ":memory:"):
        return None
    return database


def check_sqlite_path(path: str, display: str, create: bool, url_query_mode: str | None) -> None:
    """Clear errors for paths SQLite would only call 'unable to open database file'."""
    directory = os.path.dirname(os.path.abspath(path)) or "."
    if not os.path.isdir(directory):
        raise StorageError(
            f"cannot open {display}: directory {directory} does not exist; "
            "create it first or choose another path"
        )
    if os.path.isdir(path):
        raise StorageError(f"cannot open {display}: {path} is a directory; give a file path")
    if url_query_mode == "ro" and not os.path.exists(path):
        raise StorageError(
            f"no SQLite database at {os.path.abspath(path)} ({display}); a "
            "read-only URL (mode=ro) cannot create one: check the path"
        )
    if not create and not os.path.exists(path):
        raise StorageError(
            f"no SQLite database at {os.path.abspath(path)} ({display}); check "
            "the path (this call creates nothing)"
        )


def open_engine(url: URL, display: str) -> Engine:
    """An engine for ``url`` with this module's settings; a missing driver or unknown dialect is
    a StorageError naming what to install or write instead."""
    backend = url.get_backend_name()
    kwargs: dict = {}
    if backend in ("postgresql", "mysql", "mariadb") and "connect_timeout" not in url.query:
        kwargs["connect_args"] = {"connect_timeout": CONNECT_TIMEOUT_S}
    if backend != "sqlite":
        kwargs["pool_pre_ping"] = True
    try:
        engine = create_engine(url, **kwargs)
    except NoSuchModuleError as exc:
        fix = (
            "use postgresql://"
            if url.drivername.startswith("postgres:") or url.drivername == "postgres"
            else "use a SQLAlchemy URL such as sqlite:///autotune.db or postgresql://user@host/db"
        )
        raise StorageError(
            f"unknown database dialect or driver {url.drivername!r} in {display}; {fix}"
        ) from exc
    except ImportError as exc:
        module = (exc.name or "").split(".")[0] or str(exc)
        package = DRIVER_PACKAGES.get(module, module)
        raise StorageError(
            f"the database driver {module!r} for {display} is not installed; pip install {package}"
        ) from exc
    except (ArgumentError, TypeError, ValueError) as exc:
        raise StorageError(
            f"invalid database URL {display}: "
            f"{hide_password(first_line(exc), url.password)}; check its options"
        ) from exc
    if backend == "sqlite":
        _configure_sqlite(engine)
    return engine


def _configure_sqlite(engine: Engine) -> None:
    """The pragmas of the module docstring on every new connection, and BEGIN (IMMEDIATE)."""
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
            write = connection.get_execution_options().get(WRITE_OPTION, False)
            connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def xact_lock(connection: Connection, key: int) -> bool:
    """Takes autotune's advisory lock ``key`` until the transaction ends, waiting for another
    holder; True on PostgreSQL, False (nothing done) elsewhere."""
    if connection.dialect.name != "postgresql":
        return False
    connection.execute(select(func.pg_advisory_xact_lock(LOCK_NAMESPACE, key)))
    return True


def pragma(connection: Connection, statement: str) -> None:
    """Runs a PRAGMA on the DBAPI connection, outside any SQLAlchemy transaction."""
    cursor = connection.connection.cursor()
    try:
        cursor.execute(statement)
    finally:
        cursor.close()
