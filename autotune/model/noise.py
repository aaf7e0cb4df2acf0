"""Confidence intervals of measured throughput: Student's t on the log scale, no scipy.

Throughput noise on a shared machine is multiplicative (a busy neighbour slows every step by a
fraction), so intervals are computed on log(tokens/s) and mapped back: the interval of a ratio
is then the ratio of the endpoints, and it never reaches below zero.

- ``throughput_interval``: one configuration. With two or more runs (its first trial and its
  re-measurements) the units are the runs: a t-interval of the mean log throughput with n − 1
  degrees of freedom. Each run's figure is already the median of its timed steps, so the
  between-run variance includes the within-run one (the nested-design identity: the variance
  of run means is σ²_between + σ²_within / k). With one run only its timed steps are there: a
  t-interval over the steps (k − 1 degrees of freedom), which sees no drift between trials and
  says so (``source == "steps"``).
- ``paired_ratio_interval``: two configurations measured in the same interleaved rounds. Drift
  that moves the whole machine moves both members of a round alike, so the per-round log ratio
  cancels it (a paired t-interval: Student 1908; any textbook's "paired t-test").

The t quantile inverts Student's distribution function, computed exactly for integer degrees of
freedom by the finite series of Abramowitz & Stegun, Handbook of Mathematical Functions, 26.7.3
(odd ν) and 26.7.4 (even ν).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

CONFIDENCE = 0.95
"""Two-sided confidence of every interval shown."""


# ---- Student's t ------------------------------------------------------------------------------
def t_cdf(t: float, df: int) -> float:
    """P(T ≤ t) for Student's t with ``df`` ≥ 1 degrees of freedom (A&S 26.7.3 / 26.7.4)."""
    if df < 1 or int(df) != df:
        raise ValueError(f"degrees of freedom must be a positive integer, not {df}")
    theta = math.atan(abs(t) / math.sqrt(df))
    s, c = math.sin(theta), math.cos(theta)
    # 26.7.3 (odd ν):
    #   A = 2/π [θ + sin θ (cos θ + 2/3 cos³θ + … + 2·4⋯(ν−3)/(1·3⋯(ν−2)) cos^(ν−2)θ)]
    # 26.7.4 (even ν):
    #   A = sin θ [1 + 1/2 cos²θ + 1·3/(2·4) cos⁴θ + … + 1·3⋯(ν−3)/(2·4⋯(ν−2)) cos^(ν−2)θ]
    if df % 2:
        term, total = c, 0.0
        for k in range(1, (df - 1) // 2 + 1):
            if k > 1:
                term *= c * c * (2 * k - 2) / (2 * k - 1)
            total += term
        a = 2 / math.pi * (theta + s * total)
    else:
        term, total = 1.0, 1.0
        for k in range(1, df // 2):
            term *= c * c * (2 * k - 1) / (2 * k)
            total += term
        a = s * total
    a = min(1.0, max(0.0, a))  # A(t|ν) = P(|T| ≤ t)
    return 0.5 + a / 2 if t >= 0 else 0.5 - a / 2


@lru_cache(maxsize=256)
def t_quantile(p: float, df: int) -> float:
    """The t with P(T ≤ t) = p, by bisection on ``t_cdf`` (to 1e-12 relative)."""
    if not 0 < p < 1:
        raise ValueError(f"a quantile needs 0 < p < 1, not {p}")
    if p < 0.5:
        return -t_quantile(1 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return (lo + hi) / 2


def _t_interval(values: Sequence[float], confidence: float) -> tuple[float, float, float]:
    """(mean, low, high) of the mean of ``values`` (n ≥ 2): mean ± t(1 − α/2, n − 1)·s/√n."""
    n = len(values)
    mean = statistics.fmean(values)
    half = t_quantile(0.5 + confidence / 2, n - 1) * statistics.stdev(values) / math.sqrt(n)
    return mean, mean - half, mean + half


# ---- intervals ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Interval:
    """A two-sided confidence interval of tokens/s (or of a ratio of them)."""

    estimate: float
    """The geometric mean of the units (runs, steps or round ratios)."""
    low: float
    high: float
    n: int
    """Units behind it: runs, or timed steps when ``source`` is steps."""
    source: Literal["runs", "steps", "rounds"]
    """runs: between trials; steps: within one trial only; rounds: paired interleaved rounds."""
    confidence: float = CONFIDENCE

    @property
    def relative_half_width(self) -> float:
        """(high − low) / 2 / estimate: the ± an interval amounts to."""
        return (self.high - self.low) / 2 / self.estimate if self.estimate else math.inf

    def overlaps(self, other: Interval) -> bool:
        return self.low <= other.high and other.low <= self.high

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def to_dict(self) -> dict:
        return {
            "estimate": self.estimate,
            "low": self.low,
            "high": self.high,
            "n": self.n,
            "source": self.source,
            "confidence": self.confidence,
        }


def throughput_interval(
    run_throughputs: Sequence[float],
    step_times: Sequence[float] = (),
    tokens_per_step: float | None = None,
    *,
    confidence: float = CONFIDENCE,
) -> Interval | None:
    """The interval of a configuration's tokens/s: over its runs when it has two or more, else
    over the timed steps (seconds, the slowest rank's) of its one run; None when neither gives
    two positive figures."""
    runs = [x for x in run_throughputs if x > 0]
    if len(runs) >= 2:
        logs = [math.log(x) for x in runs]
        source = "runs"
    elif tokens_per_step and len([t for t in step_times if t > 0]) >= 2:
        logs = [math.log(tokens_per_step / t) for t in step_times if t > 0]
        source = "steps"
    else:
        return None
    mean, low, high = _t_interval(logs, confidence)
    return Interval(math.exp(mean), math.exp(low), math.exp(high), len(logs), source, confidence)


def paired_ratio_interval(
    numerator: Sequence[float], denominator: Sequence[float], *, confidence: float = CONFIDENCE
) -> Interval | None:
    """The interval of numerator / denominator from figures measured in the same rounds
    (element i of each in round i); None with fewer than two rounds."""
    pairs = [(a, b) for a, b in zip(numerator, denominator, strict=True) if a > 0 and b > 0]
    if len(pairs) < 2:
        return None
    mean, low, high = _t_interval([math.log(a / b) for a, b in pairs], confidence)
    return Interval(math.exp(mean), math.exp(low), math.exp(high), len(pairs), "rounds", confidence)
