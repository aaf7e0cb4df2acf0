"""Persistence of studies, trials, memory and spans (SQLAlchemy 2.0); imports nothing else."""

from .errors import StorageError, hide_password
from .records import (
    MEMORY_CATEGORIES,
    SPAN_KINDS,
    STEP_PHASES,
    TRIAL_STATUSES,
    CalibrationRecord,
    RankMemoryRecord,
    RankNodeRecord,
    SpanRecord,
    StepMetricRecord,
    StudyRecord,
    TrialRecord,
)


def __getattr__(name: str):
    """``Database`` on first use: ``storage`` imports SQLAlchemy (0.2 s), which a command that
    only needs ``StorageError`` (every CLI command's error handling) should not pay for."""
    if name == "Database":
        from .storage import Database

        return Database
    raise AttributeError(f"module 'db' has no attribute {name!r}")


__all__ = [
    "CalibrationRecord",
    "Database",
    "MEMORY_CATEGORIES",
    "RankMemoryRecord",
    "RankNodeRecord",
    "SPAN_KINDS",
    "STEP_PHASES",
    "SpanRecord",
    "StepMetricRecord",
    "StorageError",
    "StudyRecord",
    "TRIAL_STATUSES",
    "TrialRecord",
    "hide_password",
]
