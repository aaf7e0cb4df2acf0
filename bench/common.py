"""What the benchmarks share: the repository and its testing kit on the import path, a tagged
log, Spearman's rank correlation.

A bench is run as ``python bench/NAME.py``, so this directory is first on the path and
``import common`` finds this module; importing it puts the repository root there too, so
``autotune`` and ``db`` import from this checkout rather than an installed copy, and ``tests/``,
whose ``testkit`` package holds what the benchmarks and the tests share (the measured tables,
``testkit.replay_table``: read, grouped, answered; the baseline strategies; the published rows).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
"""The repository's root."""
BENCH = ROOT / "bench"
TESTS = ROOT / "tests"
DATA = BENCH / "data"
"""The measured tables the benches replay (``cpu_sweep_*.json``)."""
SHARED_A100 = next(
    (
        p / "shared/data/a100-megatron/single_node.csv"
        for p in ROOT.parents
        if (p / "shared/data/a100-megatron/single_node.csv").exists()
    ),
    None,
)
"""The shared A100 table (Megatron-LM runs) in a ``shared/`` above the checkout, or None (CI
has none: tests never read it)."""

for _path in (str(ROOT), str(BENCH), str(TESTS)):
    if _path not in sys.path:
        sys.path.insert(0, _path)


def logger(tag: str) -> Callable[[str], None]:
    """``log(message)`` printing ``[tag] message`` to stderr, flushed (progress, not results)."""

    def log(message: str) -> None:
        print(f"[{tag}] {message}", file=sys.stderr, flush=True)

    return log


def spearman(
    xs: list[float], ys: list[float], *, constant: float | None = None, min_points: int = 0
) -> float | None:
    """Spearman's rank correlation (``scipy.stats.spearmanr``); ``constant`` when either input
    is constant (no order to compare: scipy gives NaN), None with fewer than ``min_points``."""
    from scipy.stats import spearmanr

    if len(xs) < min_points:
        return None
    rho = spearmanr(xs, ys).statistic
    return float(rho) if rho == rho else constant


def memory_error_summary(
    pairs: list[tuple[int, int]], limit: int, device_type: str = "cpu"
) -> dict[str, float | int]:
    """The memory model against measurement over (predicted, measured) peak bytes: the signed
    relative error (predicted − measured) / measured, its median and median absolute value,
    the worst under- and over-prediction, and the false fits — measurements the search's screen
    (``screen.predicted_to_fit``: prediction × (1 + margin) within the limit) would run under
    ``limit`` that measured over it — and ``over_own_margin``: measurements over the tightest
    limit their prediction fits (``screen.required_bytes``)."""
    import statistics

    from autotune.search.screen import predicted_to_fit, required_bytes

    errors = [(p - m) / m for p, m in pairs]
    return {
        "median_rel_error": statistics.median(errors),
        "median_abs_rel_error": statistics.median(abs(e) for e in errors),
        "worst_under": min(errors),
        "worst_over": max(errors),
        "limit_bytes": limit,
        "fit_but_measured_over": sum(
            predicted_to_fit(p, limit, device_type) and m > limit for p, m in pairs
        ),
        "over_own_margin": sum(m > required_bytes(p, device_type) for p, m in pairs),
        "measurements": len(pairs),
    }
