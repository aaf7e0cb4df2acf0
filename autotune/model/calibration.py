"""Fit the performance model's :class:`Calibration` to measured step times.

``fit_calibration(samples, cluster)`` adjusts the calibration's parameters so that
``predict_step_time`` matches measured step times, by least squares on the log of
predicted / measured (relative error, so a 10 ms and a 10 s step weigh alike), with a weak
log-normal prior pulling each parameter toward its starting value. The prior keeps
parameters the measurements cannot pin down (no pipeline in the data: nothing constrains
the point-to-point terms) where they were, so a calibration from 8 trials is as sound as one
from 800; with many measurements the data dominate. Parameters live in log space, so they
stay positive; ``overlap_efficiency`` and ``compute_efficiency`` are bounded to at most 1.

Every fitted parameter is reported with its value and the fit's residuals (``FitReport``).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from autotune.config import TrialConfig
from autotune.errors import ConfigError
from autotune.model.cluster import ClusterSpec
from autotune.model.perf_model import (
    AUTOTUNE_ENGINE,
    Calibration,
    EngineProfile,
    predict_step_time,
)
from autotune.shapes import ModelShape

FITTED = (
    "compute_efficiency",
    "half_efficiency_rows",
    "half_efficiency_cols",
    "elementwise_bytes",
    "elementwise_sharded_bytes",
    "score_bytes",
    "layer_overhead_s",
    "tp_layer_overhead_s",
    "collective_overhead_s",
    "microbatch_overhead_s",
    "unit_overhead_s",
    "p2p_overhead_s",
    "step_overhead_s",
    "comm_efficiency",
    "overlap_efficiency",
    "optimizer_bytes_per_param",
)
"""The parameters a step-time fit may move."""
FEW_SAMPLES = 24
"""Below this many samples only ``FEW_FITTED`` are fitted."""
FEW_FITTED = (
    "compute_efficiency",
    "layer_overhead_s",
    "tp_layer_overhead_s",
    "collective_overhead_s",
    "microbatch_overhead_s",
    "unit_overhead_s",
    "p2p_overhead_s",
    "step_overhead_s",
    "comm_efficiency",
)
START_SAMPLES = 200
"""Samples the multi-start search uses before the best start is refined on all of them."""
PRIOR_SIGMA = 1.5
"""Width of the log-normal prior on each parameter (a factor of e^1.5 ≈ 4.5 is one sigma)."""
FLOOR = {
    "layer_overhead_s": 1e-7,
    "collective_overhead_s": 1e-7,
    "tp_layer_overhead_s": 1e-6,
    "microbatch_overhead_s": 1e-5,
    "unit_overhead_s": 1e-5,
    "p2p_overhead_s": 1e-5,
    "step_overhead_s": 1e-4,
    "score_bytes": 0.1,
    "elementwise_bytes": 0.1,
    "elementwise_sharded_bytes": 0.1,
}
"""Smallest starting value of parameters that may start at zero (log space needs > 0)."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One measured configuration."""

    config: TrialConfig
    step_time_s: float
    shape: ModelShape | None = None
    """The model's shape, for a workload that is not built in."""
    cluster: ClusterSpec | None = None
    """Where it was measured, when not the fit's cluster (CPU ranks sharing cores differ by
    world size)."""


@dataclass(frozen=True, slots=True)
class FitReport:
    calibration: Calibration
    fitted: tuple[str, ...]
    num_samples: int
    residuals: tuple[float, ...]
    """Per sample: predicted / measured − 1."""

    @property
    def mape(self) -> float:
        return sum(abs(r) for r in self.residuals) / max(1, len(self.residuals))

    def table(self) -> str:
        rows = [f"{'parameter':<28} {'value':>14}"]
        for name in self.fitted:
            rows.append(f"{name:<28} {getattr(self.calibration, name):>14.6g}")
        rows.append(
            f"fitted on {self.num_samples} measured step times: mean |error| "
            f"{100 * self.mape:.1f}%, worst {100 * max(map(abs, self.residuals)):.1f}%"
        )
        return "\n".join(rows)


def fit_calibration(
    samples: Sequence[Sample],
    cluster: ClusterSpec,
    *,
    start: Calibration | None = None,
    engine: EngineProfile = AUTOTUNE_ENGINE,
    fitted: Sequence[str] = FITTED,
    fit_shapes: bool = True,
) -> FitReport:
    """Least-squares fit of ``fitted`` parameters to the samples' step times, then (with
    ``fit_shapes``) one correction factor per measured layer shape."""
    import numpy as np

    if not samples:
        raise ConfigError("no measured step times to calibrate from: run some trials first")
    for smp in samples:
        if not (smp.step_time_s > 0 and math.isfinite(smp.step_time_s)):
            raise ConfigError(f"measured step time must be positive, not {smp.step_time_s}")
    start = start or Calibration.for_cluster(cluster)
    objective, lower, upper = _informed_objective(samples, cluster, start, engine, fitted)
    cal = start  # nothing the samples can inform: only the shapes are fitted
    if objective.names:
        cal = objective.calibration_at(_solve(objective, lower, upper))
    if fit_shapes:
        cal = _fit_shape_factors(samples, cluster, cal, engine)
    errors = np.exp(objective.predict(cal) - objective.measured) - 1
    return FitReport(cal, tuple(objective.names), len(samples), tuple(float(r) for r in errors))


def _informed_objective(
    samples: Sequence[Sample],
    cluster: ClusterSpec,
    start: Calibration,
    engine: EngineProfile,
    fitted: Sequence[str],
) -> tuple[_Objective, Any, Any]:
    """The fit's objective over the parameters of ``fitted`` the samples inform, and their
    (lower, upper) bounds in log space."""
    import numpy as np

    names = [n for n in fitted if n in FITTED]
    if len(samples) < FEW_SAMPLES:
        # A handful of trials cannot separate a dozen parameters: fit the few that decide a
        # small run's time (compute rate, fixed costs, link speed), keep the rest where they
        # start.
        names = [n for n in names if n in FEW_FITTED]
    x0 = np.array([math.log(max(getattr(start, n), FLOOR.get(n, 1e-12))) for n in names])
    # A parameter that starts at zero has no prior value to be pulled toward (its floor is
    # only where the search begins); the others keep their log-normal prior.
    prior_weight = np.array([0.0 if getattr(start, n) <= 0 else 1.0 for n in names])
    lower, upper = _bounds(names)
    objective = _Objective(
        samples,
        cluster,
        engine,
        start,
        names,
        np.clip(x0, lower, upper),
        prior_weight,
        np.log([smp.step_time_s for smp in samples]),
    )
    # A parameter no sample's time depends on (the TP overhead when every trial ran tp 1)
    # has a zero column in the Jacobian: the solver may move it anywhere, and it would then
    # predict the layouts it does matter for absurdly. It keeps its starting value.
    informed = _informed(
        names, objective.x0, lambda x: objective.predict(objective.calibration_at(x), subset=None)
    )
    if not all(informed):
        keep = [i for i, ok in enumerate(informed) if ok]
        objective = dataclasses.replace(
            objective,
            names=[names[i] for i in keep],
            x0=objective.x0[keep],
            prior_weight=prior_weight[keep],
        )
        lower, upper = lower[keep], upper[keep]
    return objective, lower, upper


@dataclass(frozen=True, slots=True)
class _Objective:
    """The fit's residuals: the log of predicted / measured step time of each sample, and a
    log-normal prior of width ``PRIOR_SIGMA`` pulling each parameter (in log space) toward
    where it starts."""

    samples: Sequence[Sample]
    cluster: ClusterSpec
    engine: EngineProfile
    start: Calibration
    names: list[str]
    """The parameters fitted, in the order of the vector ``x`` (their logs)."""
    x0: object
    """Where the fit starts (log values, clipped to the bounds)."""
    prior_weight: object
    """Per parameter, 1 with a prior and 0 for one that starts at zero."""
    measured: object
    """Log of each sample's measured step time."""

    def calibration_at(self, x) -> Calibration:
        # Clipped: a step of the solver far out of range must not overflow.
        values = {n: float(math.exp(min(max(v, -60.0), 60.0))) for n, v in zip(self.names, x)}
        for capped in ("overlap_efficiency", "compute_efficiency", "comm_efficiency"):
            if capped in values:
                values[capped] = min(1.0, values[capped])
        return dataclasses.replace(self.start, **values)

    def predict(self, cal: Calibration, subset=None):
        import numpy as np

        chosen = self.samples if subset is None else [self.samples[i] for i in subset]
        return np.log(
            [
                predict_step_time(
                    smp.config,
                    smp.cluster or self.cluster,
                    cal,
                    shape=smp.shape,
                    engine=self.engine,
                ).step_time_s
                for smp in chosen
            ]
        )

    def residuals(self, x, subset=None):
        import numpy as np

        target = self.measured if subset is None else self.measured[subset]
        w = 1.0 / math.sqrt(len(target))
        data = (self.predict(self.calibration_at(x), subset) - target) * w
        prior = (x - self.x0) / PRIOR_SIGMA * (0.3 * w) * self.prior_weight
        return np.concatenate([data, prior])


def _bounds(names: Sequence[str]):
    """(lower, upper) bounds of the log parameters: the efficiencies are fractions of an ideal
    (at most 1), and the links reach at least 5% of what they are described to."""
    import numpy as np

    upper = np.full(len(names), np.inf)
    for capped in ("overlap_efficiency", "compute_efficiency"):  # fractions of an ideal
        if capped in names:
            upper[names.index(capped)] = 0.0  # log(1)
    lower = np.full(len(names), -np.inf)
    if "comm_efficiency" in names:
        # Links reach at most what they are described to; far below it, the time is better
        # explained by per-collective costs (collective_overhead_s) than by a crawling link.
        upper[names.index("comm_efficiency")] = 0.0
        lower[names.index("comm_efficiency")] = math.log(0.05)
    return lower, upper


def _solve(objective: _Objective, lower, upper):
    """The best log parameters: ``scipy.optimize.least_squares`` from several starts.

    The host/device crossover makes the surface non-convex in the host overheads: start from a
    few of their scales (on at most START_SAMPLES samples, for speed), then refine the best
    start on all samples."""
    import numpy as np
    from scipy.optimize import least_squares

    names, x0 = objective.names, objective.x0
    starts = [x0]
    for scale in (10.0, 100.0, 1000.0):
        x = x0.copy()
        for n in ("layer_overhead_s", "tp_layer_overhead_s", "collective_overhead_s"):
            if n in names:
                x[names.index(n)] += math.log(scale)
        starts.append(x)
    num_samples = len(objective.samples)
    subset = None
    if num_samples > START_SAMPLES:
        subset = np.random.default_rng(0).choice(num_samples, START_SAMPLES, replace=False)
    best = None
    for x_start in starts:
        result = least_squares(
            objective.residuals,
            x_start,
            bounds=(lower, upper),
            x_scale=1.0,
            diff_step=1e-3,
            max_nfev=400,
            args=(subset,),
        )
        if best is None or result.cost < best.cost:
            best = result
    if subset is not None:
        best = least_squares(
            objective.residuals,
            best.x,
            bounds=(lower, upper),
            x_scale=1.0,
            diff_step=1e-3,
            max_nfev=200,
        )
    return best.x


def _informed(names: Sequence[str], x0, predict_at) -> list[bool]:
    """Per parameter: does moving it tenfold up or down (from where the fit starts, and from a
    thousandfold above, where the host overheads' starts reach) change any sample's
    prediction?"""
    import numpy as np

    base = [predict_at(x0)]
    high = x0 + math.log(1000.0)
    base.append(predict_at(high))
    informed = []
    for i in range(len(names)):
        moved = False
        for (x, ref), sign in itertools.product(((x0, base[0]), (high, base[1])), (1, -1)):
            step = x.copy()
            step[i] += sign * math.log(10.0)  # down too: the capped efficiencies start at 1
            if np.max(np.abs(predict_at(step) - ref)) > 1e-9:
                moved = True
                break
        informed.append(moved)
    return informed


SHAPE_SHRINK = 0.5
"""A shape measured n times keeps n / (n + SHAPE_SHRINK) of its own correction (log scale):
one measurement alone moves it halfway, so a single noisy trial cannot swing it."""


def _fit_shape_factors(
    samples: Sequence[Sample], cluster: ClusterSpec, cal: Calibration, engine: EngineProfile
) -> Calibration:
    """Per layer shape, the factor on its layers' device time that zeroes the mean log error of
    the samples with that shape (bisection on log factor), shrunk toward 1 by sample count."""
    from autotune.model.perf_model import layer_shape_key

    by_key: dict[str, list[Sample]] = {}
    for smp in samples:
        shape = smp.shape or smp.config.workload.shape
        # Keyed as predict_step_time keys it: a config naming no precision trains in its
        # cluster's default (gloo: float32), not the GPU's bfloat16.
        key = layer_shape_key(smp.config, shape, (smp.cluster or cluster).device_type)
        by_key.setdefault(key, []).append(smp)
    factors: dict[str, dict[str, float]] = {"layer_shape_factors": {}, "host_shape_factors": {}}
    for key, group in by_key.items():
        n = len(group)
        # The device's work or the host's launch time: of the two corrections that zero the
        # group's mean error, keep the one that fits its samples one by one more closely (a
        # launch-bound shape's device time moves nothing, and the reverse).
        best = None
        for table in ("host_shape_factors", "layer_shape_factors"):
            log_f = _zero_mean_log_error(group, cluster, cal, engine, table, key)
            if log_f is None:
                continue
            spread = _squared_log_errors(
                group, cluster, dataclasses.replace(cal, **{table: {key: math.exp(log_f)}}), engine
            )
            if best is None or spread < best[0] - 1e-12:
                best = (spread, table, log_f)
        if best is not None:
            factors[best[1]][key] = math.exp(best[2] * n / (n + SHAPE_SHRINK))
    return dataclasses.replace(cal, **factors)


def _squared_log_errors(
    group: Sequence[Sample], cluster: ClusterSpec, cal: Calibration, engine: EngineProfile
) -> float:
    return sum(
        math.log(
            predict_step_time(
                smp.config, smp.cluster or cluster, cal, shape=smp.shape, engine=engine
            ).step_time_s
            / smp.step_time_s
        )
        ** 2
        for smp in group
    )


def _zero_mean_log_error(
    group: Sequence[Sample],
    cluster: ClusterSpec,
    cal: Calibration,
    engine: EngineProfile,
    table: str,
    key: str,
) -> float | None:
    """The log factor in ``table`` for ``key`` at which the group's mean log error is zero,
    or None when no factor in [e⁻², e²] reaches it."""

    def mean_log_error(log_f: float) -> float:
        trial = dataclasses.replace(cal, **{table: {key: math.exp(log_f)}})
        return sum(
            math.log(
                predict_step_time(
                    smp.config, smp.cluster or cluster, trial, shape=smp.shape, engine=engine
                ).step_time_s
                / smp.step_time_s
            )
            for smp in group
        ) / len(group)

    lo, hi = -2.0, 2.0
    if mean_log_error(lo) > 0 or mean_log_error(hi) < 0:
        return None
    if abs(mean_log_error(lo) - mean_log_error(hi)) < 1e-3:
        return None  # this factor hardly moves the step: not what the error comes from
    for _ in range(30):
        mid = (lo + hi) / 2
        if mean_log_error(mid) > 0:
            hi = mid
        else:
            lo = mid
    return (lo + hi) / 2
