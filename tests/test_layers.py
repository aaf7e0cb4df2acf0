"""The layer rule (``[tool.importlinter]`` in pyproject.toml) holds on the tree, and each of its
contracts can fail: one planted import per contract, in a copy of the four packages, breaks that
contract and no other, and ``lint-imports`` names the planted import with its line.

The copy is analysed, not the installed (editable) packages: ``lint-imports`` runs in the copy's
folder with ``PYTHONPATH`` set to it, and the planted lines exist only there, so a report that
names them can only come from the copy."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["autotune", "profiler", "db", "dashboards"]


def _lint_imports_command() -> list[str]:
    script = Path(sys.executable).with_name("lint-imports")
    found = str(script) if script.exists() else shutil.which("lint-imports")
    assert found, "lint-imports is missing: pip install -e '.[test]' (import-linter)"
    return [found, "--no-cache"]


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` run from ``root``, importing the packages found there. COLUMNS keeps its
    report's lines unwrapped, so a contract's name stands on one line."""
    env = {**os.environ, "PYTHONPATH": str(root), "COLUMNS": "1000"}
    return subprocess.run(
        _lint_imports_command(), cwd=root, env=env, capture_output=True, text=True, timeout=300
    )


def contract_names(pyproject: Path) -> dict[str, str]:
    """Each contract's type (``layers``, ``forbidden``, ``acyclic_siblings``) -> its name."""
    contracts = tomllib.loads(pyproject.read_text())["tool"]["importlinter"]["contracts"]
    names = {}
    for contract in contracts:
        kind = contract["type"]
        if kind == "forbidden" and contract["source_modules"] != ["autotune.model"]:
            kind = "forbidden-" + contract["source_modules"][0].split(".")[-1]
        names[kind] = contract["name"]
    return names


PLANTS = {
    # contract: (file, planted import, how the report names it; {line} is the planted line)
    "layers": (
        "autotune/trial/runner.py",
        "autotune.model.perf_model",
        "autotune.trial.runner -> autotune.model.perf_model (l.{line})",
    ),
    "forbidden": ("autotune/model/noise.py", "torch", "autotune.model.noise -> torch (l.{line})"),
    "forbidden-dashboards": (
        "dashboards/figures.py",
        "autotune.study.store",
        "dashboards.figures -> autotune.study.store (l.{line})",
    ),
    "forbidden-ranking": (
        "autotune/ranking/collapse.py",
        "autotune.trial.runner",
        "autotune.ranking.collapse -> autotune.trial.runner (l.{line})",
    ),
    # autotune.hf_config imports autotune.shapes at the top; this closes the circle. The report
    # names the edge to remove, without a line.
    "acyclic_siblings": (
        "autotune/shapes.py",
        "autotune.hf_config",
        "- .shapes -> .hf_config (1 import)",
    ),
}
"""One violation per contract, each an import inside a function (the rule counts those too) that
breaks that contract alone. trial and model are independent layers, and the dashboard reaches
neither trial.runner nor a circle, so the layers plant breaks no other contract (a plant in
autotune.model would: the dashboard imports autotune.model.memory)."""


def plant(root: Path, path: str, imported: str) -> int:
    """Append to ``root/path`` a function that imports ``imported``; the import's line number."""
    target = root / path
    source = target.read_text()
    if not source.endswith("\n"):
        source += "\n"
    lines = source.count("\n")
    target.write_text(
        source + f"\n\ndef _planted_violation():\n    import {imported}  # noqa: F401\n"
    )
    return lines + 4


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """The four packages and pyproject.toml, copied without caches."""
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package,
            tmp_path / package,
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
        )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_tree_keeps_every_contract():
    proc = lint_imports(ROOT)
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, report
    names = contract_names(ROOT / "pyproject.toml")
    assert len(names) == len(PLANTS) == 5, names
    for name in names.values():
        assert f"{name} KEPT" in report, report
    assert re.search(rf"Contracts: {len(names)} kept, 0 broken\.", report), report


@pytest.mark.parametrize("contract", sorted(PLANTS))
def test_a_planted_import_breaks_its_contract(copy: Path, contract: str):
    path, imported, shown = PLANTS[contract]
    line = plant(copy, path, imported)
    proc = lint_imports(copy)
    report = proc.stdout + proc.stderr
    assert proc.returncode == 1, report
    names = contract_names(copy / "pyproject.toml")
    assert f"{names[contract]} BROKEN" in report, report
    for other, name in names.items():
        if other != contract:
            assert f"{name} KEPT" in report, report
    assert f"Contracts: {len(names) - 1} kept, 1 broken." in report, report
    # Only the copy has the planted import (and at that line), so the copy was analysed.
    assert shown.format(line=line) in report, report
