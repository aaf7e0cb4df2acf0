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
from .storage import Database

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
