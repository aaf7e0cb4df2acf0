"""Input checks: what ``Database`` refuses before anything is written, each rule stated once.

Every check raises :class:`~db.errors.StorageError` with one line naming the field and the fix,
except :func:`span_problem`, which returns the problem as text so that the caller can add the
span's position (``span 17 has …; nothing was stored``).
"""

from __future__ import annotations

import json
from datetime import datetime

from .errors import StorageError
from .records import (
    SPAN_KINDS,
    STEP_PHASES,
    TRIAL_STATUSES,
    RankMemoryRecord,
    RankNodeRecord,
    SpanRecord,
    StepMetricRecord,
    TrialRecord,
)

SPAN_INT_FIELDS = ("rank", "step", "start_ns", "dur_ns", "bytes")
SPAN_STR_FIELDS = ("kind", "name", "category", "group")
_NON_NEGATIVE = ("dur_ns", "bytes")
_INT64 = range(-(2**63), 2**63)


def is_int(value: object) -> bool:
    """An int and not a bool (``True`` is an ``int`` to Python, never to the database)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """An int or a float, and not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_json(what: str, value: object) -> None:
    """``value`` is a dict that ``json`` can write."""
    if not isinstance(value, dict):
        raise StorageError(f"{what} must be a dict, got {type(value).__name__}")
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise StorageError(
            f"{what} is not JSON-serialisable ({exc}); convert it to dicts, "
            "lists, strings and numbers"
        ) from exc


def check_status(status: object) -> None:
    """``status`` is one of ``TRIAL_STATUSES``."""
    if status not in TRIAL_STATUSES:
        raise StorageError(f"trial status {status!r} is not one of {', '.join(TRIAL_STATUSES)}")


def check_error(error: object) -> None:
    """A trial's error text is a string or None."""
    if error is not None and not isinstance(error, str):
        raise StorageError(f"a trial's error must be a string, got {type(error).__name__}")


def check_study_name(name: object) -> None:
    """A study's name is a non-empty string."""
    if not isinstance(name, str) or not name.strip():
        raise StorageError(f"a study needs a non-empty name, got {name!r}")


def check_calibration(study_id: object, num_trials: object, documents: dict[str, object]) -> None:
    """A calibration's study id and trial count are ints (≥ 0), its ``documents`` JSON dicts."""
    if not is_int(study_id):
        raise StorageError(f"a calibration's study_id must be an int, got {study_id!r}")
    if not is_int(num_trials) or num_trials < 0:
        raise StorageError(f"a calibration's num_trials must be an int ≥ 0, got {num_trials!r}")
    for what, value in documents.items():
        check_json(what, value)


def check_trial(trial: TrialRecord) -> None:
    """Everything about a new trial except its spans, checked before anything is written."""
    if not isinstance(trial, TrialRecord):
        raise StorageError(f"add_trial takes a TrialRecord, got {type(trial).__name__}")
    if trial.id is not None:
        raise StorageError(
            f"add_trial stores a new trial (id None), got id {trial.id}; "
            "use update_trial to change a stored one"
        )
    for field in ("study_id", "number"):
        value = getattr(trial, field)
        if value is not None and not is_int(value):
            raise StorageError(f"trial {field} must be an int or None, got {value!r}")
    check_status(trial.status)
    check_json("trial config", trial.config)
    check_json("trial metrics", trial.metrics)
    check_json("trial env", trial.env)
    check_error(trial.error)
    if not isinstance(trial.created_at, datetime) or trial.created_at.utcoffset() is None:
        raise StorageError(
            f"trial created_at must be a timezone-aware datetime, got "
            f"{trial.created_at!r}; use datetime.now(timezone.utc)"
        )
    _check_memory(trial.memory)
    _check_steps(trial.steps)
    _check_nodes(trial.nodes)


def _check_memory(memory: tuple[RankMemoryRecord, ...]) -> None:
    for i, m in enumerate(memory):
        if not isinstance(m, RankMemoryRecord):
            raise StorageError(f"trial memory[{i}] is a {type(m).__name__}, not a RankMemoryRecord")
        if (
            not is_int(m.rank)
            or not isinstance(m.category, str)
            or not all(v is None or is_int(v) for v in (m.predicted_bytes, m.measured_bytes))
        ):
            raise StorageError(
                f"trial memory[{i}] = {m!r} needs an int rank, a str category "
                "and int-or-None byte counts"
            )


def _check_steps(steps: tuple[StepMetricRecord, ...]) -> None:
    for i, s in enumerate(steps):
        if not isinstance(s, StepMetricRecord):
            raise StorageError(f"trial steps[{i}] is a {type(s).__name__}, not a StepMetricRecord")
        if s.phase not in STEP_PHASES:
            raise StorageError(
                f"trial steps[{i}] has phase {s.phase!r}, not one of {', '.join(STEP_PHASES)}"
            )
        if (
            not is_int(s.rank)
            or not is_int(s.step)
            or not is_number(s.time_s)
            or not (s.loss is None or is_number(s.loss))
        ):
            raise StorageError(
                f"trial steps[{i}] = {s!r} needs int rank and step, a float "
                "time_s and a float-or-None loss"
            )


def _check_nodes(nodes: tuple[RankNodeRecord, ...]) -> None:
    for i, n in enumerate(nodes):
        if (
            not isinstance(n, RankNodeRecord)
            or not is_int(n.rank)
            or not isinstance(n.node_id, str)
            or not isinstance(n.hostname, str)
        ):
            raise StorageError(
                f"trial nodes[{i}] = {n!r} must be a RankNodeRecord with an int "
                "rank and str node_id and hostname"
            )


def span_problem(span: object, origin: int | None = None) -> str | None:
    """What is wrong with one input span, or None: the one statement of what a span must be.

    Integer fields are exact ints (not bools, not whole floats) within 64 bits, durations and
    payloads are not negative, the strings are strings, the kind is one of ``SPAN_KINDS``.
    With ``origin`` (the trial's first start), the start relative to it, as the span table
    stores it, must fit 64 bits too. ``add_trial``'s hot loop checks only the int types itself
    and calls this for the message, for each new span name, and for the chunk the database
    refused.
    """
    if not isinstance(span, SpanRecord):
        return f"is a {type(span).__name__}, not a SpanRecord"
    for field in SPAN_INT_FIELDS:
        value = getattr(span, field)
        if not is_int(value):
            return f"has {field}={value!r} ({type(value).__name__}); it must be an int"
        if value not in _INT64:
            return f"has {field} outside the 64-bit integer range"
    for field in _NON_NEGATIVE:
        if getattr(span, field) < 0:
            return f"has {field}={getattr(span, field)}; it must be >= 0"
    for field in SPAN_STR_FIELDS:
        value = getattr(span, field)
        if not isinstance(value, str):
            return f"has {field}={value!r} ({type(value).__name__}); it must be a str"
    if span.kind not in SPAN_KINDS:
        return f"has kind {span.kind!r}, not one of {', '.join(SPAN_KINDS)}"
    if origin is not None and span.start_ns - origin not in _INT64:
        return (
            "has start_ns outside the 64-bit integer range once made relative to the "
            "trial's first span"
        )
    return None
