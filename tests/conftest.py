import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # tests/reference.py and in-test workloads

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(scope="session")
def executor():
    """One local Ray cluster and executor for the whole session; worker groups stay warm."""
    from autotune.executor import ExecutorSettings, RayExecutor

    ex = RayExecutor(ExecutorSettings(trial_timeout_s=120.0))
    yield ex
    ex.close()
