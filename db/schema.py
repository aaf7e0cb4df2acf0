"""Schema versions and migrations of the ``autotune_*`` tables.

The version lives in ``autotune_schema_version`` (one row), apart from Optuna's
``alembic_version`` and ``version_info`` in the same database. Migrations are numbered Python
functions that receive Alembic's :class:`~alembic.operations.Operations` (so SQLite's limited
``ALTER TABLE`` is handled by ``op.batch_alter_table``, which rebuilds a table and copies its rows).

:func:`prepare_schema` is what ``Database.open`` calls. How versions move:
- a new (or Optuna-only) database gets the tables of ``db.models`` with ``create_all`` and is
  stamped with the latest version; the models therefore always describe the latest version;
- an older database runs every migration above its version, in order, in ONE transaction, with
  SQLite's foreign-key enforcement off (otherwise rebuilding a parent table would cascade-delete
  its children) and ``PRAGMA foreign_key_check`` before the commit;
- a newer database is refused: this code cannot know what a later version changed.

To change the schema: edit ``db.models``, append ``Migration(n + 1, ...)`` to ``MIGRATIONS`` that
turns a version-n database into the new layout, and test it from a version-n file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, inspect, select, update
from sqlalchemy.exc import SQLAlchemyError

from .engine import LOCK_SCHEMA, WRITE_OPTION, pragma, xact_lock
from .errors import StorageError, translate
from .models import Base, SchemaVersionRow

BASELINE_VERSION = 1
"""Version 1: the first shipped schema, created straight from ``db.models``."""

VERSION_TABLE = SchemaVersionRow.__tablename__
TABLE_PREFIX = "autotune_"


@dataclass(frozen=True, slots=True)
class Migration:
    """Turns a database at ``version - 1`` into ``version``."""

    version: int
    description: str
    upgrade: Callable[..., None]
    """Called with an ``alembic.operations.Operations`` bound to the migrating connection."""


def _v2_add_calibrations(op) -> None:
    """Version 2: ``autotune_calibrations``, a study's cluster and its fitted calibrations.

    Spelled out column by column rather than taken from ``db.models``, so that this step stays
    what version 2 was when later versions change the model."""
    import sqlalchemy as sa

    op.create_table(
        "autotune_calibrations",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "study_id",
            sa.Integer(),
            sa.ForeignKey("autotune_studies.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("num_trials", sa.Integer(), nullable=False),
        sa.Column("cluster", sa.JSON(), nullable=False),
        sa.Column("calibration", sa.JSON(), nullable=False),
        sa.Column("residuals", sa.JSON(), nullable=False),
    )
    op.create_index("ix_autotune_calibrations_study", "autotune_calibrations", ["study_id", "id"])


def _v3_add_rank_nodes(op) -> None:
    """Version 3: ``autotune_rank_nodes``, the Ray node and host each rank ran on."""
    import sqlalchemy as sa

    op.create_table(
        "autotune_rank_nodes",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "trial_id",
            sa.Integer(),
            sa.ForeignKey("autotune_trials.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.String(128), nullable=False),
        sa.Column("hostname", sa.String(255), nullable=False),
        sa.UniqueConstraint("trial_id", "rank", name="uq_autotune_rank_nodes"),
    )


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        2, "autotune_calibrations: the study's cluster and calibration", _v2_add_calibrations
    ),
    Migration(3, "autotune_rank_nodes: the node and host of every rank", _v3_add_rank_nodes),
)
"""Shipped migrations, above the baseline (version 1)."""


def latest_version(migrations: tuple[Migration, ...]) -> int:
    """The version that ``migrations`` lead to; they must be numbered 2, 3, ... without gaps."""
    expected = list(range(BASELINE_VERSION + 1, BASELINE_VERSION + 1 + len(migrations)))
    if [m.version for m in migrations] != expected:
        raise ValueError(
            f"migrations must be numbered {expected}, got {[m.version for m in migrations]}"
        )
    return BASELINE_VERSION + len(migrations)


def read_version(connection: Connection) -> tuple[int | None, bool]:
    """(stored version or None, whether any ``autotune_*`` table exists)."""
    tables = set(inspect(connection).get_table_names())
    has_tables = any(t.startswith(TABLE_PREFIX) for t in tables)
    if VERSION_TABLE not in tables:
        return None, has_tables
    version = connection.scalar(select(SchemaVersionRow.version))
    return version, has_tables


def create_schema(connection: Connection, version: int) -> None:
    """The latest tables and the version row, inside the caller's transaction."""
    Base.metadata.create_all(connection)
    connection.execute(SchemaVersionRow.__table__.insert(), {"version": version})


def upgrade(connection: Connection, migrations: tuple[Migration, ...], from_version: int) -> int:
    """Runs the migrations above ``from_version`` inside the caller's transaction."""
    # Imported here: only needed when a migration runs.
    from alembic.operations import Operations
    from alembic.runtime.migration import MigrationContext

    operations = Operations(MigrationContext.configure(connection))
    version = from_version
    for migration in migrations:
        if migration.version <= from_version:
            continue
        migration.upgrade(operations)
        version = migration.version
    connection.execute(update(SchemaVersionRow).values(version=version))
    return version


def prepare_schema(
    engine: Engine,
    migrations: tuple[Migration, ...],
    *,
    create: bool,
    display: str,
    password: str | None,
) -> int:
    """Creates, migrates or checks the schema; returns the version now in the database."""
    latest = latest_version(migrations)
    dbapi_error = engine.dialect.loaded_dbapi.Error
    try:
        with engine.connect() as connection:
            version, has_tables = read_version(connection)
    except (SQLAlchemyError, dbapi_error) as exc:
        raise translate(exc, "opening the database", display, password) from exc
    if version == latest:
        return latest
    if version is not None and version > latest:
        raise StorageError(
            f"database schema version {version} is newer than this autotune "
            f"understands ({latest}); upgrade autotune ({display})"
        )
    if version is None and has_tables:
        raise StorageError(
            f"{display} has autotune_* tables but no schema version in "
            f"{VERSION_TABLE}; it was not written by autotune: use a new "
            "database"
        )
    if version is None and not create:
        raise StorageError(
            f"{display} holds no autotune data (no {VERSION_TABLE} "
            "table); check the URL, or open it with create=True"
        )
    action = (
        "creating the autotune tables"
        if version is None
        else f"migrating the autotune schema from version {version} to {latest}"
    )
    try:
        with engine.connect() as connection:
            if version is None:
                with connection.execution_options(**{WRITE_OPTION: True}).begin():
                    xact_lock(connection, LOCK_SCHEMA)
                    version_now, _ = read_version(connection)  # another process may
                    if version_now is None:  # have just created it
                        create_schema(connection, latest)
            else:
                _migrate(connection, migrations, latest, display)
    except StorageError:
        raise
    except (SQLAlchemyError, dbapi_error) as exc:
        raise translate(exc, action, display, password) from exc
    return latest


def _migrate(
    connection: Connection, migrations: tuple[Migration, ...], latest: int, display: str
) -> None:
    """Runs the pending migrations in one transaction (SQLite: with foreign keys off)."""
    sqlite = connection.dialect.name == "sqlite"
    if sqlite:
        # Rebuilding a parent table (batch_alter_table) drops it; with enforcement on, that
        # would cascade-delete its children. The pragma is a no-op inside a transaction, so it
        # is set before BEGIN, and foreign_key_check runs before COMMIT instead
        # (https://www.sqlite.org/lang_altertable.html, "Making Other Kinds Of Table Schema
        # Changes").
        pragma(connection, "PRAGMA foreign_keys = OFF")
    try:
        with connection.execution_options(**{WRITE_OPTION: True}).begin():
            xact_lock(connection, LOCK_SCHEMA)
            version, _ = read_version(connection)
            if version is None or version > latest:
                raise StorageError(f"the schema of {display} changed while opening it; retry")
            if version < latest:
                upgrade(connection, migrations, version)
            if sqlite:
                broken = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
                if broken:
                    raise StorageError(
                        f"migrating {display} to version {latest} would break "
                        f"{len(broken)} foreign keys (first: {tuple(broken[0])}); "
                        "the database was left unchanged"
                    )
    finally:
        if sqlite:
            pragma(connection, "PRAGMA foreign_keys = ON")
