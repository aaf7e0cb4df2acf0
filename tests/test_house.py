"""The house rules a reader of the code relies on: no function in the product packages is over
80 lines (the issue that split ``predict_step_time``, ``build_parser``, ``_estimate_stage`` and
``SearchLoop`` set the bound), and no product module imports the benchmarks or the tests' kit."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("autotune", "db", "profiler", "dashboards")
MAX_FUNCTION_LINES = 80
TEST_ONLY = ("bench", "testkit")
"""What no product module imports: the benchmarks and the tests' kit (``tests/testkit``)."""


def _functions(path: Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.lineno, node.end_lineno - node.lineno + 1


def _sources():
    return [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]


def test_no_function_is_over_80_lines():
    long = [
        f"{p.relative_to(ROOT)}:{line} {name} ({n} lines)"
        for p in _sources()
        for name, line, n in _functions(p)
        if n > MAX_FUNCTION_LINES
    ]
    assert not long, "split these: " + "; ".join(long)


MAX_MODEL_FUNCTION_LINES = 50
"""The cost models (``autotune/model/``) keep a tighter bound: each term a function a reader can
hold whole."""


def test_no_function_in_the_models_is_over_50_lines():
    long = [
        f"{p.relative_to(ROOT)}:{line} {name} ({n} lines)"
        for p in sorted((ROOT / "autotune" / "model").rglob("*.py"))
        for name, line, n in _functions(p)
        if n > MAX_MODEL_FUNCTION_LINES
    ]
    assert not long, "split these: " + "; ".join(long)


def test_the_rule_sees_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    path = tmp_path / "long.py"
    path.write_text(f"def long():\n{body}\n")
    assert [n for _, _, n in _functions(path)] == [MAX_FUNCTION_LINES + 1]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_product_module_imports_the_benchmarks_or_the_testkit(package):
    importers = []
    for p in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if any(n.split(".")[0] in TEST_ONLY for n in names):
                importers.append(str(p.relative_to(ROOT)))
    assert not importers
