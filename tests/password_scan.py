"""Where a secret (a database password) shows: files under a directory, rows of a database."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa


def files_holding(secret: str, directory: Path) -> list[str]:
    """The files under ``directory`` whose bytes contain ``secret``."""
    needle = secret.encode()
    return sorted(
        str(p) for p in Path(directory).rglob("*") if p.is_file() and needle in p.read_bytes()
    )


def rows_holding(url: str, secret: str) -> list[str]:
    """'table: row' for every row of every table at ``url`` (its default schema) whose text
    contains ``secret``: autotune's tables and Optuna's, study metadata included."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    found = []
    try:
        with engine.connect() as connection:
            for table in sa.inspect(connection).get_table_names():
                for row in connection.execute(sa.text(f'SELECT * FROM "{table}"')):
                    if secret in repr(tuple(row)):
                        found.append(f"{table}: {tuple(row)!r}"[:300])
    finally:
        engine.dispose()
    return found
