"""The driver side loads no torch: the search, its loop and leaderboard, the store, the CLI, the
executor and the trial pool import without it (torch loads in the Ray workers that train), and
those that do not run trials import without Ray too. Nor does it load torch later, at run time:
a whole search on a stub executor, the search's device questions (world size, memory limit,
device, the GPU's name for the cluster description) and the environment the executor records
after every trial.

Each check runs in a fresh interpreter, so modules this test session already loaded cannot
hide an import."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

NO_TORCH_NO_RAY = [
    "autotune.search.search",
    "autotune.search.loop",
    "autotune.study.leaderboard",
    "autotune.search.screen",
    "autotune.study.store",
    "autotune.trial.result",
    "autotune.status",
    "autotune.cli.main",
    "dashboards.data",
    "profiler",
]
NO_TORCH = ["autotune.trial.executor", "autotune.trial.pool"]
"""These start trials on Ray, so they import it; torch stays in the workers."""


def loaded_after(code: str, env: dict[str, str] | None = None) -> set[str]:
    """Which of torch and ray are in ``sys.modules`` after running ``code`` alone."""
    code += "\nimport sys; print(' '.join(m for m in ('torch', 'ray') if m in sys.modules))"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return set(proc.stdout.splitlines()[-1].split())


def loaded_after_import(module: str) -> set[str]:
    """Which of torch and ray are in ``sys.modules`` after importing ``module`` alone."""
    return loaded_after(f"import {module}")


@pytest.mark.parametrize("module", NO_TORCH_NO_RAY + NO_TORCH)
def test_driver_module_imports_no_torch(module):
    loaded = loaded_after_import(module)
    assert "torch" not in loaded
    if module in NO_TORCH_NO_RAY:
        assert "ray" not in loaded


def test_the_training_stack_does_import_torch():
    """The check itself sees torch when a module does load it."""
    assert "torch" in loaded_after_import("autotune.trial.runner")


SEARCH_ON_A_STUB = """
import io
import sys
from autotune.config import WorkloadSpec
from testkit.replay_table import MeasuredTable, ReplayTrialExecutor
from autotune.search.search import Search, SearchSpec, default_world_size
from autotune.search.study_calibration import describe_cluster
from db import Database

# Sweep B's world-2 group answers the trials (a TrialExecutor that runs no torch).
(group,) = [g for g in MeasuredTable.load("bench/data/cpu_sweep_b.json").groups(8)
            if g.world_size == 2]
executor = ReplayTrialExecutor(group.rows)
# device "auto" and no memory limit: the search asks what devices there are, as the CLI's does.
spec = SearchSpec(workload=WorkloadSpec(family="gpt", size="tiny", seq_len=64,
                                        global_batch_size=16),
                  world_size=2, study_name="driver", n_trials=4, patience=None, top_k=1,
                  remeasure_repeats=1, remeasure_max_repeats=1)
db = Database.open("sqlite:///" + DB)
outcome = Search.open(spec, db, executor, out=io.StringIO(), include=executor.contains).run()
assert outcome.num_run >= 4 and outcome.best is not None, outcome
assert default_world_size() == 2  # no GPU visible
assert describe_cluster(2, "cuda").name == "unknown GPU"  # the GPU name, asked on a GPU host
"""


def test_a_search_on_a_stub_executor_loads_no_torch(tmp_path):
    """The search's run, its device questions and its cluster description, on a host without
    a visible GPU (``CUDA_VISIBLE_DEVICES=""``, so that a GPU host runs the same search)."""
    code = f"DB = {str(tmp_path / 'driver.db')!r}\n" + SEARCH_ON_A_STUB
    # the measured tables' reader is the testing kit's (tests/testkit)
    path = os.pathsep.join((str(ROOT), str(ROOT / "tests")))
    assert "torch" not in loaded_after(code, env={"CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": path})


def test_the_environment_recorded_after_a_trial_loads_no_torch():
    """``executor._environment`` runs on the driver after every trial; its torch version is the
    installed one (``torch.__version__`` in the workers)."""
    code = """
from types import SimpleNamespace
from importlib.metadata import version
from autotune.trial.executor import _environment
group = SimpleNamespace(backend="gloo", world_size=2, rank_nodes=["n", "n"])
env = _environment(group, SimpleNamespace(device="cpu", num_threads=1))
assert env["torch"] == version("torch") and env["num_nodes"] == 1, env
"""
    assert "torch" not in loaded_after(code)
