"""Fixtures of the fault suite, and its figures: each scenario notes what it measured (durations,
counts) and the figures are printed at the end of the run, for docs/reliability.md."""

from __future__ import annotations

import pytest

_FIGURES: dict[str, str] = {}


@pytest.fixture(scope="session")
def figures() -> dict[str, str]:
    """``figures[scenario] = "what was measured"``; printed in the terminal summary."""
    return _FIGURES


def pytest_terminal_summary(terminalreporter) -> None:
    if _FIGURES:
        terminalreporter.section("fault suite figures (docs/reliability.md)")
        for name, text in _FIGURES.items():
            terminalreporter.write_line(f"{name}: {text}")
