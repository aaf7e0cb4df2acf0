import itertools
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # tests/reference.py and in-test workloads

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(scope="session")
def executor():
    """One local Ray cluster and executor for the whole session; worker groups stay warm."""
    from autotune.trial.executor import ExecutorSettings, RayExecutor

    ex = RayExecutor(ExecutorSettings(trial_timeout_s=120.0))
    yield ex
    ex.close()


@pytest.fixture(scope="session")
def postgres():
    """One PostgreSQL server for the session (``tests/postgres_server.py``): loopback only,
    password authentication. Skipped where the server or the driver is missing; under CI
    (``CI`` set, as ``.ci/run`` runs) that is a failure instead, since CI installs both."""
    from postgres_server import PostgresServer

    try:
        import psycopg  # noqa: F401
    except ImportError:
        _postgres_unavailable("the psycopg driver is not installed; "
                              "pip install -e '.[postgres]'")
    try:
        server = PostgresServer.start()
    except RuntimeError as e:
        _postgres_unavailable(str(e))
    yield server
    server.stop()


def _postgres_unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"the PostgreSQL tests must run under CI: {reason}")
    pytest.skip(f"no PostgreSQL server: {reason}")


_NAMESPACE_NUMBERS = itertools.count()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    """The URL of a new, empty database on each backend: a SQLite file in ``tmp_path``, or on
    the session's PostgreSQL server a schema of its own in a shared test database (the URL
    carries the password, and the schema as its search_path)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'autotune.db'}"
    server = request.getfixturevalue("postgres")
    return server.create_schema("autotune_tests", f"test_{next(_NAMESPACE_NUMBERS)}")
