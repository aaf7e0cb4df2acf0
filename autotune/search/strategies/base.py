"""The interface every search strategy implements.

A strategy sees the valid candidate configurations of one search (the search space, already
screened for memory where a prediction exists) and the trials measured so far, and proposes
the next configuration to measure, or ``None`` to stop. It is called from the search's thread
only, once per trial, after the previous trial's outcome has been added to ``history``; it must
not propose a configuration already in ``history``. Strategies hold no database handle and run
no trial: the search loop (or a replay over a measured table) does both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

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


class Strategy(Protocol):
    """Proposes the next configuration to measure."""

    name: str

    def propose(self, candidates: Sequence[TrialConfig], history: Sequence[Measured],
                shape: ModelShape | None = None) -> Proposal | None:
        """The next untried candidate to measure, or None to stop (the strategy's own rule)."""
        ...
