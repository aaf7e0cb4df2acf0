"""Model-guided search: measure what the performance model, refitted after every trial, ranks
fastest — optimistically where it is unsure — and stop when nothing untried can win.

Each proposal:

1. **Refit.** The calibration is fitted to every trial measured so far
   (``calibration.fit_calibration``, starting from the cluster's stored calibration or the
   defaults), so the model learns this cluster and this model from the search's own trials.
2. **Predict** the step time of every untried candidate (``perf_model.predict_step_time``).
3. **Doubt.** Each prediction gets a relative uncertainty σ: the spread of the fit's own
   residuals (at least ``min_sigma``), larger before anything is measured
   (``prior_sigma``), and larger again for a candidate whose layer shape no trial has measured
   (``unmeasured_shape_factor``) — the calibration's per-shape corrections say nothing there.
4. **Choose** the untried candidate with the lowest optimistic time, ``predicted ·
   exp(−κ·σ)`` (a lower confidence bound, as in GP-LCB; Srinivas et al. 2010): where the model
   is sure it picks the predicted best, where it is unsure it explores.
5. **Stop** when no untried candidate's optimistic time beats the best measured step time by
   more than ``tolerance`` (default 3%), once ``min_trials`` (10) have run, or the budget is
   spent.

Configurations whose optimistic time is far slower than the best measured are never run; when
it stops, the best few of them are passed over (``passed_over``): the search stores them as
skipped with that reason (``skip_reason``), and the best few the memory screen kept out as
infeasible (predicted).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from autotune.config import GIB, TrialConfig
from autotune.errors import ConfigError
from autotune.model.calibration import FitReport, Sample, fit_calibration
from autotune.model.cluster import ClusterSpec
from autotune.model.engines import EngineProfile
from autotune.model.perf_model import (
    AUTOTUNE_ENGINE,
    Calibration,
    layer_shape_key,
    predict_step_time,
)
from autotune.search.strategies.base import Measured, PassedOver, Proposal, SearchState, Strategy
from autotune.shapes import ModelShape

PASSED_OVER = 3
"""When the strategy stops, this many of the untried configurations it ranks best are passed
over with its reason (the rest rank lower still), and as many of those the memory screen kept
out."""


@dataclass
class ModelGuided(Strategy):
    """The model-guided strategy (see the module docstring)."""

    cluster: ClusterSpec
    engine: EngineProfile = AUTOTUNE_ENGINE
    calibration: Calibration | None = None
    """Where each refit starts: a calibration carried from earlier studies, else the cluster's."""
    tolerance: float = 0.03
    """Stop when nothing untried is predicted (optimistically) to beat the best by more."""
    kappa: float = 1.0
    """How many σ of optimism: 0 trusts the model blindly, larger explores more."""
    prior_sigma: float = 0.5
    """Relative uncertainty of an uncalibrated prediction."""
    min_sigma: float = 0.05
    """The floor of a calibrated prediction's uncertainty (measurement noise)."""
    unmeasured_shape_factor: float = 3.0
    """σ multiplier for a candidate whose layer shape no trial has measured."""
    max_trials: int | None = None
    """A budget of trials (None: until the stopping rule says)."""
    min_trials: int = 10
    """The stopping rule waits for this many trials: a fit of a few trials can be tight and
    still biased where it has not looked, and a measured best may be a lucky round."""
    fitted: Callable[[], FitReport | None] | None = None
    """Where the refit comes from when someone else already refits after every trial (the
    search's ``StudyCalibration``): its latest fit, or None before any. Without it the
    strategy fits the history itself (a replay)."""
    name: str = "model"
    last_fit: FitReport | None = field(default=None, init=False)
    _fitted_on: int = field(default=-1, init=False)
    _calibration: Calibration | None = field(default=None, init=False)

    # ---- the calibration ---------------------------------------------------------------------
    def current_calibration(
        self, history: Sequence[Measured], shape: ModelShape | None
    ) -> Calibration:
        """The calibration refitted to ``history``'s measured trials (cached per length)."""
        start = self.calibration or Calibration.for_cluster(self.cluster)
        if self.fitted is not None:
            self.last_fit = self.fitted()
            return self.last_fit.calibration if self.last_fit else start
        measured = [m for m in history if m.step_time_s]
        if not measured:
            return start
        if self._fitted_on != len(measured) or self._calibration is None:
            samples = [Sample(m.config, m.step_time_s, shape) for m in measured]
            try:
                self.last_fit = fit_calibration(
                    samples, self.cluster, start=start, engine=self.engine
                )
                self._calibration = self.last_fit.calibration
            except (ConfigError, ValueError, ArithmeticError):
                self._calibration = self._calibration or start  # keep the last good one
            self._fitted_on = len(measured)
        return self._calibration

    def _residual_rms(self) -> float:
        residuals = self.last_fit.residuals if self.last_fit else ()
        return math.sqrt(statistics.fmean(r * r for r in residuals)) if residuals else 0.0

    def sigma(
        self,
        config: TrialConfig,
        calibration: Calibration,
        history: Sequence[Measured],
        shape: ModelShape | None,
    ) -> float:
        """Relative uncertainty of ``config``'s predicted step time."""
        measured = [m for m in history if m.step_time_s]
        if not measured or self.last_fit is None:
            return self.prior_sigma
        spread = self._residual_rms()
        # Few trials fit themselves too well: the doubt falls from the prior as 1/√n.
        n = len(measured)
        sigma = max(self.min_sigma, spread, self.prior_sigma / math.sqrt(n))
        device_type = self.cluster.device_type
        if _shape_key(config, shape, device_type) not in {
            _shape_key(m.config, shape, device_type) for m in measured
        }:
            sigma *= self.unmeasured_shape_factor
        return sigma

    # ---- the strategy --------------------------------------------------------------------------
    def ranked(
        self,
        candidates: Sequence[TrialConfig],
        history: Sequence[Measured],
        shape: ModelShape | None = None,
    ) -> list[tuple[float, float, TrialConfig]]:
        """Untried candidates as (optimistic time, predicted time, config), best first."""
        tried = {m.config for m in history}
        calibration = self.current_calibration(history, shape)
        out = []
        for config in candidates:
            if config in tried:
                continue
            predicted = predict_step_time(
                config, self.cluster, calibration, shape=shape, engine=self.engine
            ).step_time_s
            sigma = self.sigma(config, calibration, history, shape)
            out.append((predicted * math.exp(-self.kappa * sigma), predicted, config))
        out.sort(key=lambda t: (t[0], t[1]))
        return out

    @property
    def label(self) -> str:
        return "model-guided"

    def propose(self, state: SearchState) -> Proposal | None:
        """``choose`` among the state's candidates (untried, predicted to fit)."""
        return self.choose(state.candidates, state.history, state.shape)

    def stop_reason(self) -> str:
        return (
            "the performance model predicts no untried configuration faster than the best "
            f"measured by {self.tolerance:.0%}"
        )

    def passed_over(self, state: SearchState) -> list[PassedOver]:
        """The best few candidates it will not run (those with a ``skip_reason``), then the
        best few the memory screen kept out, with their predicted peaks."""
        history, shape = state.history, state.shape
        out = []
        for _, _, config in self.ranked(state.candidates, history, shape)[:PASSED_OVER]:
            reason = self.skip_reason(config, history, shape)
            if reason is not None:
                out.append(PassedOver(config, reason))
        over = state.ruled_out
        for _, predicted_s, config in self.ranked(list(over), history, shape)[:PASSED_OVER]:
            out.append(
                PassedOver(
                    config,
                    f"predicted {predicted_s * 1e3:.1f} ms, but a peak "
                    f"of {over[config] / GIB:.3g} GiB",
                    over[config],
                )
            )
        return out

    def choose(
        self,
        candidates: Sequence[TrialConfig],
        history: Sequence[Measured],
        shape: ModelShape | None = None,
    ) -> Proposal | None:
        """The untried candidate with the lowest optimistic time, or None when it cannot beat
        the best measured by ``tolerance`` (after ``min_trials``) or the budget is spent."""
        if self.max_trials is not None and len(history) >= self.max_trials:
            return None
        ranked = self.ranked(candidates, history, shape)
        if not ranked:
            return None
        optimistic, predicted, config = ranked[0]
        best = _best_measured(history)
        if (
            best is not None
            and optimistic >= best * (1 - self.tolerance)
            and len(history) >= self.min_trials
        ):
            return None
        why = f"predicted {predicted * 1e3:.1f} ms (optimistic {optimistic * 1e3:.1f} ms)" + (
            f" against the best measured {best * 1e3:.1f} ms" if best else ""
        )
        return Proposal(config, why, predicted)

    def skip_reason(
        self, config: TrialConfig, history: Sequence[Measured], shape: ModelShape | None = None
    ) -> str | None:
        """Why ``config`` need not run: its optimistic time cannot beat the best measured."""
        best = _best_measured(history)
        if best is None:
            return None
        calibration = self.current_calibration(history, shape)
        predicted = predict_step_time(
            config, self.cluster, calibration, shape=shape, engine=self.engine
        ).step_time_s
        optimistic = predicted * math.exp(
            -self.kappa * self.sigma(config, calibration, history, shape)
        )
        if optimistic < best * (1 - self.tolerance):
            return None
        return (
            f"predicted {predicted * 1e3:.1f} ms, at best {optimistic * 1e3:.1f} ms: "
            f"no faster than the best measured {best * 1e3:.1f} ms"
        )


def _best_measured(history: Sequence[Measured]) -> float | None:
    times = [m.step_time_s for m in history if m.step_time_s]
    return min(times) if times else None


def _shape_key(config: TrialConfig, shape: ModelShape | None, device_type: str) -> str | None:
    s = shape or config.workload.shape
    return layer_shape_key(config, s, device_type) if s else None
