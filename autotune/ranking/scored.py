"""What a ranking returns: each layout predicted to fit with its predicted step and peak, and
the ranking of all of them."""

from __future__ import annotations

from dataclasses import dataclass

from autotune.config import TrialConfig
from autotune.model.perf_model import StepTimeEstimate


@dataclass(frozen=True, slots=True)
class ScoredLayout:
    """One layout predicted to fit, with its predicted step."""

    config: TrialConfig
    time: StepTimeEstimate
    peak_memory_bytes: int
    collapsed_buckets_mb: tuple[float, ...] = ()
    """Bucket sizes of the layouts folded into this row: the same layout but for the bucket,
    predicted the same (``collapse.collapse_equivalent``)."""

    def as_dict(self) -> dict:
        return {
            "config": self.config.resolved(),
            "step_time_s": self.time.step_time_s,
            "tokens_per_s": self.time.tokens_per_s,
            "mfu": self.time.mfu,
            "peak_memory_bytes": self.peak_memory_bytes,
            "breakdown": dict(self.time.breakdown),
            "collapsed_bucket_mb": list(self.collapsed_buckets_mb),
        }


@dataclass(frozen=True, slots=True)
class Ranking:
    """Every layout scored: how many, and those predicted to fit, fastest first."""

    scored: int
    fitting: tuple[ScoredLayout, ...]
    smallest_peak: tuple[TrialConfig, int] | None
    """The layout with the smallest predicted peak of those that do not fit (config, bytes)."""
    rows: tuple[ScoredLayout, ...] = ()
    """``fitting`` with the layouts the models cannot tell apart folded together, as listed."""

    @property
    def collapsed(self) -> int:
        """Layouts folded into another's row."""
        return len(self.fitting) - len(self.rows)
