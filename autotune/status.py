"""Names for the states a trial ends in, the ways one fails, and the leaderboard's order.

``TrialStatus`` values are the strings the database stores (``db.TRIAL_STATUSES``, which ``db``
keeps for its own validation since it never imports ``autotune``): a ``StrEnum`` member equals
its string, so records read back compare equal to the members. ``FailureKind`` is what
``errors.TrialFailed.kind`` says; ``RowStatus`` is the coarser outcome a measured table's row (and a
strategy's view of a trial) carries. No imports beyond the standard library.
"""

from __future__ import annotations

from enum import StrEnum


class TrialStatus(StrEnum):
    """How a trial ended, as stored. Members are listed in leaderboard order (``rank``)."""

    COMPLETE = "complete"
    """Ran to the end within the memory limit."""
    INFEASIBLE_MEASURED = "infeasible_measured"
    """Ran, but measured over the memory limit or out of memory."""
    INFEASIBLE_PREDICTED = "infeasible_predicted"
    """Not run: the memory model predicted it over the limit."""
    SKIPPED_PREDICTED = "skipped_predicted"
    """Not run: the performance model predicted it no faster than the best measured."""
    FAILED = "failed"
    """Raised, crashed or timed out."""
    RUNNING = "running"
    """Stored before it finished (the database allows it; the search stores finished trials)."""

    @property
    def infeasible(self) -> bool:
        """Over the memory limit, predicted or measured."""
        return self in (TrialStatus.INFEASIBLE_MEASURED, TrialStatus.INFEASIBLE_PREDICTED)

    @property
    def ran(self) -> bool:
        """The trial ran to its end (so it may have a timeline and a per-rank breakdown)."""
        return self in (TrialStatus.COMPLETE, TrialStatus.INFEASIBLE_MEASURED)


STATUS_ORDER: tuple[TrialStatus, ...] = tuple(TrialStatus)
"""The leaderboard's order: complete, infeasible (measured, then predicted), skipped, failed,
running."""


def status_rank(status: str) -> int:
    """A status's place in ``STATUS_ORDER``; an unknown one sorts last."""
    try:
        return STATUS_ORDER.index(TrialStatus(status))
    except ValueError:
        return len(STATUS_ORDER)


class FailureKind(StrEnum):
    """Why a trial failed (``errors.TrialFailed.kind``)."""

    ERROR = "error"
    """A rank raised."""
    OOM = "oom"
    """A rank ran out of device memory: the trial is infeasible, not broken."""
    CRASH = "crash"
    """A worker process died."""
    TIMEOUT = "timeout"
    """The trial did not finish within its timeout (a hung collective, usually)."""
    INVALID = "invalid"
    """A rank refused the configuration or the workload (a ``ConfigError`` or
    ``WorkloadError`` of a kind the executor does not raise as itself)."""


class RowStatus(StrEnum):
    """The outcome of a measured table's row, and of a trial as a strategy sees it."""

    COMPLETE = "complete"
    INFEASIBLE = "infeasible"
    """Over the memory limit or out of memory."""
    FAILED = "failed"
