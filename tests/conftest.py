import itertools
import os
import signal
import sys

import pytest

# tests/reference.py, in-test workloads and the testing kit (tests/testkit), as pytest's
# rootdir conftest puts this folder on the path anyway
sys.path.insert(0, os.path.dirname(__file__))

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Every trial's ranks check NCCL's rules on gloo (autotune/trial/strict_collectives.py): the
# spawned ranks and Ray's workers (started from this process) inherit the variable.
os.environ.setdefault("AUTOTUNE_STRICT_COLLECTIVES", "1")

pytest_plugins = ("world_order",)  # tests/world_order.py: layouts grouped by world size

# A shell without job control starts background commands with SIGINT ignored, and an ignored
# signal stays ignored across exec: the drivers that the Ctrl-C tests start would never see the
# signal they are sent. A handled signal is reset to the default on exec, so handle it here.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def executor():
    """One local Ray cluster and executor for the whole session; worker groups stay warm.

    A group's ranks get 3 minutes to start, not the default minute: each imports the training
    stack (about 8 CPU-seconds), and under other load on two cores 4 ranks took over a minute."""
    from autotune.trial.executor import ExecutorSettings, RayExecutor

    ex = RayExecutor(ExecutorSettings(trial_timeout_s=120.0, placement_timeout_s=180.0))
    yield ex
    ex.close()


@pytest.fixture
def session_cluster(executor) -> str:
    """The address of the session's Ray cluster, for an ``autotune`` command in a subprocess to
    join (``--ray-address``) instead of starting a node and its workers of its own (10-20 s each
    on two cores). The session's warm group is given back first, so that the command's ranks
    fit on the cluster's CPUs; the next in-process trial builds a new one. Tests of node start,
    node loss, cluster sizes or a driver's Ctrl-C keep a cluster of their own."""
    import ray

    executor.start()
    executor.discard_group()
    return ray.get_runtime_context().gcs_address


@pytest.fixture(scope="session")
def postgres():
    """One PostgreSQL server for the session (``tests/postgres_server.py``): loopback only,
    password authentication. Skipped where the server or the driver is missing; under CI
    (``CI`` set, as ``.ci/run`` runs) that is a failure instead, since CI installs both."""
    from postgres_server import PostgresServer

    try:
        import psycopg  # noqa: F401
    except ImportError:
        _postgres_unavailable("the psycopg driver is not installed; pip install -e '.[postgres]'")
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


MULTI_PROCESS_FIXTURES = {"executor", "postgres", "db_url"}
"""Fixtures that start processes: the Ray executor (trials), the PostgreSQL server."""
MULTI_PROCESS_CALLS = (
    "run_ranks(",
    "subprocess.",
    "RayExecutor(",
    "ray.init(",
    "Popen(",
    "cpu_burners",
    "run_driver(",
)
"""Calls in a test module that start processes (spawned ranks, drivers, Ray)."""


def pytest_collection_modifyitems(config, items):
    """Mark every multi-process test ``slow`` (``pytest -m "not slow"`` is the fast lane; CI runs
    everything): tests that use a process-starting fixture (a PostgreSQL parameter of
    ``db_url`` too), the fault suite, and tests whose module starts processes."""
    sources: dict[str, str] = {}
    for item in items:
        path = str(item.path)
        if path not in sources:
            sources[path] = item.path.read_text()
        params = getattr(item, "callspec", None)
        uses = set(item.fixturenames) & MULTI_PROCESS_FIXTURES
        if uses == {"db_url"} and params is not None and params.params.get("db_url") == "sqlite":
            uses = set()
        starts = any(call in sources[path] for call in MULTI_PROCESS_CALLS)
        if uses or "faults" in item.path.parts or starts:
            item.add_marker(pytest.mark.slow)
