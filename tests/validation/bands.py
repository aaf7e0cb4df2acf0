"""The error bands the validation suite holds the models to: each figure as
``docs/benchmarks.md`` states it, read as the largest value that prints so (a figure printed to
0.1% may be up to 0.05 points above it), plus ``MARGIN``."""

from __future__ import annotations

MARGIN = 0.005
"""Half a percentage point. The stated figures are today's exact output, so a band without a
margin would fail on any change at all; the margin lets a small, deliberate change of the model
pass (a parameter counted once instead of twice moves a table's MAPE by a few hundredths of a
point) while one row of a 4- to 6-row table moving by 3 points or more, or the calibration
drifting, fails. A change that passes by eating the margin should restate the figure in
docs/benchmarks.md."""


def band(stated_percent: float) -> float:
    """The largest MAPE (a fraction) allowed for a figure stated as ``stated_percent`` to 0.1%."""
    return (stated_percent + 0.05) / 100 + MARGIN


def floor(stated_percent: float) -> float:
    """The smallest share (a fraction) allowed for a figure stated as ``stated_percent`` to
    0.1% where more is better (a hit rate): the stated figure less its rounding and ``MARGIN``."""
    return (stated_percent - 0.05) / 100 - MARGIN
