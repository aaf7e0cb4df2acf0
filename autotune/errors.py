"""One base exception for the project; each boundary translates into it.

The CLI prints ``str(error)`` on one line and exits with ``error.exit_code``; a traceback is
shown only with ``--debug``. Messages name the broken rule and the fix.
"""

from __future__ import annotations

from autotune.status import FailureKind

# Exit codes, documented in docs/trials.md: usage errors are distinct from runtime failures.
EXIT_USAGE = 2
EXIT_RUNTIME = 1


class AutotuneError(Exception):
    """Base class of every error a user can act on."""

    exit_code = EXIT_RUNTIME


class ConfigError(AutotuneError, ValueError):
    """A configuration or workload specification breaks a rule; the message names the fix."""

    exit_code = EXIT_USAGE


class WorkloadError(AutotuneError):
    """A user workload could not be imported or built."""

    exit_code = EXIT_USAGE


class ClusterError(AutotuneError):
    """The Ray cluster cannot place or run the requested worker group."""


class TrialFailed(AutotuneError):
    """A trial raised on a rank; ``rank`` says where."""

    def __init__(
        self,
        message: str,
        *,
        rank: int | None = None,
        kind: FailureKind | str = FailureKind.ERROR,
        traceback: str = "",
    ) -> None:
        super().__init__(message)
        self.rank = rank
        self.kind = FailureKind(kind)
        """Why it failed: an error, out of memory, a crash (a worker died), a timeout, …"""
        self.traceback = traceback
        """The failing rank's traceback, shown with --debug."""


class PlacementError(TrialFailed):
    """A layout the Ray cluster's nodes cannot hold with every TP group inside one node; it
    is refused before anything runs (a search records it as not run and goes on)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, kind=FailureKind.INVALID)


class TrialTimeout(TrialFailed):
    """A trial did not finish within its timeout (a hung collective, usually)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, kind=FailureKind.TIMEOUT)
