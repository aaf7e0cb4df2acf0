"""The interface every search strategy implements (as Optuna's samplers implement
``optuna/samplers/_base.py``'s ``BaseSampler``).

A strategy is asked, once per trial, for the next configuration to measure, given the study's
history and the space (a ``SearchState``); it answers with a ``Proposal`` or None when it is
done. The search loop (``autotune.search.loop``) knows only this interface: Optuna's samplers
(``optuna_strategy.OptunaStrategy``), the model-guided strategy (``model_guided.ModelGuided``),
and the benchmarks' grid, random and DeepSpeed-style heuristic (``bench/strategies.py``) are
its implementations.

When and from where each method is called:

- ``propose``: from the loop's thread only, each time a trial slot is free and no enqueued
  trial (the baseline, or one an interrupted search left waiting) is first in line. Every
  trial finished so far has been concluded and is in ``state.history``; trials still running
  are in ``state.tried`` but not in the history. A strategy must not propose a configuration
  of ``state.tried``; if it does (an Optuna sampler re-proposing its favourite), the loop
  answers it from the stored outcome and asks again.
- ``stop_reason``: once, after ``propose`` returned None: why the search stops.
- ``passed_over``: once, after ``propose`` returned None with no trial running: the
  configurations worth storing as not run, with why (the study then shows what the strategy
  chose not to measure). The default stores none.

Strategies hold no database handle and run no trial: the loop does both, and concludes every
outcome in one place (``autotune.search.conclude``).
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.config import TrialConfig
from autotune.shapes import ModelShape
from autotune.status import RowStatus


@dataclass(frozen=True, slots=True)
class Measured:
    """One finished trial as a strategy sees it."""

    config: TrialConfig
    step_time_s: float | None
    """The measured step time; None when the trial failed or did not fit (``status`` says)."""
    status: RowStatus = RowStatus.COMPLETE
    """Complete, infeasible (over the memory limit or out of memory) or failed."""


@dataclass(frozen=True, slots=True)
class Proposal:
    """A strategy's choice: the configuration and, for a model-guided one, why."""

    config: TrialConfig
    reason: str = ""
    predicted_step_time_s: float | None = None
    trial: Any = None
    """The Optuna trial that proposed it (an ``OptunaStrategy``'s); None: the loop opens a
    trial of the study for the configuration (enqueued with its parameters)."""


@dataclass(frozen=True, slots=True)
class PassedOver:
    """A configuration a strategy chose not to run, stored so the study shows it."""

    config: TrialConfig
    reason: str
    """Why, in a line (stored as the trial's error, after ``skipped:`` when not over memory)."""
    over_memory_peak: int | None = None
    """The predicted peak bytes when the memory screen kept it out (stored as infeasible,
    predicted); None when the strategy itself skipped it."""


class SearchState:
    """What a strategy sees: the study's history and the space's untried configurations.

    ``candidates`` and ``ruled_out`` are computed when first read (a memory prediction per
    untried configuration), so a strategy that does not read them does not pay for them."""

    def __init__(
        self,
        *,
        configs: Sequence[TrialConfig],
        tried: frozenset[TrialConfig],
        history: Sequence[Measured],
        fits: Callable[[TrialConfig], tuple[bool, int | None]],
        shape: ModelShape | None = None,
    ) -> None:
        self._configs, self.tried, self.history = configs, tried, tuple(history)
        self._fits, self.shape = fits, shape

    @functools.cached_property
    def _split(self) -> tuple[tuple[TrialConfig, ...], dict[TrialConfig, int]]:
        """(untried configurations predicted to fit, untried ones predicted not to → peak)."""
        fitting, over = [], {}
        for c in self._configs:
            if c in self.tried:
                continue
            fits, peak = self._fits(c)
            if fits:
                fitting.append(c)
            else:
                over[c] = peak
        return tuple(fitting), over

    @property
    def configs(self) -> Sequence[TrialConfig]:
        """Every configuration of the space, tried or not."""
        return self._configs

    @property
    def candidates(self) -> tuple[TrialConfig, ...]:
        """The space's configurations not tried, not running, and predicted to fit (in the
        space's order)."""
        return self._split[0]

    @property
    def ruled_out(self) -> dict[TrialConfig, int]:
        """Untried configurations the memory screen keeps out → their predicted peak bytes."""
        return self._split[1]


class Strategy(ABC):
    """Proposes the next configuration to measure (see the module docstring for when each
    method is called)."""

    name: str = "strategy"
    """The name ``--strategy`` takes."""

    @property
    def label(self) -> str:
        """How the search's messages name it."""
        return self.name

    @abstractmethod
    def propose(self, state: SearchState) -> Proposal | None:
        """The next configuration to measure, or None when the strategy is done."""

    def stop_reason(self) -> str:
        """Why the search stops after ``propose`` returned None."""
        return f"the {self.name} strategy proposed nothing more"

    def passed_over(self, state: SearchState) -> list[PassedOver]:
        """Configurations to store as not run when the strategy stops (default: none)."""
        return []
