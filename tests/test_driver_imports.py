"""The driver side loads no torch: the search, its loop and leaderboard, the store, the CLI, the
executor and the trial pool import without it (torch loads in the Ray workers that train), and
those that do not run trials import without Ray too.

Each import runs in a fresh interpreter, so modules this test session already loaded cannot
hide an import."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

NO_TORCH_NO_RAY = ["autotune.search.search", "autotune.search.loop", "autotune.study.leaderboard",
                   "autotune.search.screen", "autotune.study.store", "autotune.trial.result", "autotune.status",
                   "autotune.cli.main", "dashboards.data", "profiler"]
NO_TORCH = ["autotune.trial.executor", "autotune.trial.pool"]
"""These start trials on Ray, so they import it; torch stays in the workers."""


def loaded_after_import(module: str) -> set[str]:
    """Which of torch and ray are in ``sys.modules`` after importing ``module`` alone."""
    code = (f"import sys, {module}; "
            "print(' '.join(m for m in ('torch', 'ray') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return set(proc.stdout.split())


@pytest.mark.parametrize("module", NO_TORCH_NO_RAY + NO_TORCH)
def test_driver_module_imports_no_torch(module):
    loaded = loaded_after_import(module)
    assert "torch" not in loaded
    if module in NO_TORCH_NO_RAY:
        assert "ray" not in loaded


def test_the_training_stack_does_import_torch():
    """The check itself sees torch when a module does load it."""
    assert "torch" in loaded_after_import("autotune.trial.runner")
