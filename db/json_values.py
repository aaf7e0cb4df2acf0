"""JSON columns that hold NaN and infinities on every backend.

A diverged loss or an undefined ratio is a float NaN or ±inf in a trial's metrics. Python's
``json`` writes them as the bare tokens ``NaN`` / ``Infinity``, which are not JSON (RFC 8259
§6): SQLite stores the text as it is, but PostgreSQL's ``json`` type refuses it ("invalid input
syntax for type json"), so the whole trial would be lost. Non-finite floats are therefore stored
as a one-key object, ``{"$float": "NaN"}`` / ``{"$float": "Infinity"}`` /
``{"$float": "-Infinity"}``, on every backend alike, and turned back into floats on reading; no
real document of autotune has a ``$float`` key. Rows written before this encoding (SQLite, bare
tokens) still read back, since ``json.loads`` accepts the tokens.
"""

from __future__ import annotations

import math

from sqlalchemy import JSON
from sqlalchemy.types import TypeDecorator

TAG = "$float"
_NAMES = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def encode_non_finite(value):
    """``value`` with every NaN or infinite float replaced by its tagged object (a copy where
    anything changes; dict keys are left alone)."""
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return {TAG: "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")}
    if isinstance(value, dict):
        return {key: encode_non_finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [encode_non_finite(item) for item in value]
    return value


def decode_non_finite(value):
    """The inverse of :func:`encode_non_finite` on a decoded JSON document."""
    if isinstance(value, dict):
        if len(value) == 1 and value.get(TAG) in _NAMES:
            return _NAMES[value[TAG]]
        return {key: decode_non_finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [decode_non_finite(item) for item in value]
    return value


class JSONDocument(TypeDecorator):
    """SQL ``JSON`` (the same DDL as ``sqlalchemy.JSON``, so no migration) whose non-finite
    floats are stored as tagged objects; see the module docstring."""

    impl = JSON
    cache_ok = True

    def process_bind_param(self, value, dialect):
        return None if value is None else encode_non_finite(value)

    def process_result_value(self, value, dialect):
        return None if value is None else decode_non_finite(value)
