"""Schema versions and migrations of the ``autotune_*`` tables.

The version lives in ``autotune_schema_version`` (one row), apart from Optuna's
``alembic_version`` and ``version_info`` in the same database. Migrations are numbered Python
functions that receive Alembic's :class:`~alembic.operations.Operations` (so SQLite's limited
``ALTER TABLE`` is handled by ``op.batch_alter_table``, which rebuilds a table and copies its rows).

How versions move:
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

from dataclasses import dataclass
from typing import Callable

from sqlalchemy import Connection, inspect, select, update

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
        sa.Column("study_id", sa.Integer(),
                  sa.ForeignKey("autotune_studies.id", ondelete="CASCADE"), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("num_trials", sa.Integer(), nullable=False),
        sa.Column("cluster", sa.JSON(), nullable=False),
        sa.Column("calibration", sa.JSON(), nullable=False),
        sa.Column("residuals", sa.JSON(), nullable=False),
    )
    op.create_index("ix_autotune_calibrations_study", "autotune_calibrations",
                    ["study_id", "id"])


def _v3_add_rank_nodes(op) -> None:
    """Version 3: ``autotune_rank_nodes``, the Ray node and host each rank ran on."""
    import sqlalchemy as sa

    op.create_table(
        "autotune_rank_nodes",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("trial_id", sa.Integer(),
                  sa.ForeignKey("autotune_trials.id", ondelete="CASCADE"), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.String(128), nullable=False),
        sa.Column("hostname", sa.String(255), nullable=False),
        sa.UniqueConstraint("trial_id", "rank", name="uq_autotune_rank_nodes"),
    )


MIGRATIONS: tuple[Migration, ...] = (
    Migration(2, "autotune_calibrations: the study's cluster and calibration",
              _v2_add_calibrations),
    Migration(3, "autotune_rank_nodes: the node and host of every rank", _v3_add_rank_nodes),
)
"""Shipped migrations, above the baseline (version 1)."""


def latest_version(migrations: tuple[Migration, ...]) -> int:
    """The version that ``migrations`` lead to; they must be numbered 2, 3, ... without gaps."""
    expected = list(range(BASELINE_VERSION + 1, BASELINE_VERSION + 1 + len(migrations)))
    if [m.version for m in migrations] != expected:
        raise ValueError(f"migrations must be numbered {expected}, got "
                         f"{[m.version for m in migrations]}")
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
