"""What the benchmarks share: the repository on the import path, a tagged log, Spearman's rank
correlation, and the measured tables (``replay_table``: read, grouped, answered).

A bench is run as ``python bench/NAME.py``, so this directory is first on the path and
``import common`` finds this module; importing it puts the repository root there too, so
``autotune`` and ``db`` import from this checkout rather than an installed copy.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
"""The repository's root."""
BENCH = ROOT / "bench"
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

for _path in (str(ROOT), str(BENCH)):
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
