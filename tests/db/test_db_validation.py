"""``db.validation.span_problem``, the one statement of what a span must be: each kind of bad
span, refused with its own words; and the good ones let through."""

from __future__ import annotations

import dataclasses

import pytest

from db import SpanRecord
from db.validation import span_problem

GOOD = SpanRecord(
    rank=1,
    step=0,
    kind="comm",
    name="all_reduce",
    category="backward",
    start_ns=1_764_000_000_000_000_000,
    dur_ns=5_000,
    bytes=1 << 20,
    group="dp",
)


@pytest.mark.parametrize(
    "change, problem",
    [
        ({"rank": True}, "has rank=True (bool); it must be an int"),
        ({"step": None}, "has step=None (NoneType); it must be an int"),
        ({"start_ns": 1.764e18}, "has start_ns=1.764e+18 (float); it must be an int"),
        ({"dur_ns": "5000"}, "has dur_ns='5000' (str); it must be an int"),
        ({"bytes": 2**63}, "has bytes outside the 64-bit integer range"),
        ({"start_ns": -(2**63) - 1}, "has start_ns outside the 64-bit integer range"),
        ({"dur_ns": -1}, "has dur_ns=-1; it must be >= 0"),
        ({"bytes": -4096}, "has bytes=-4096; it must be >= 0"),
        ({"kind": b"comm"}, "has kind=b'comm' (bytes); it must be a str"),
        ({"name": None}, "has name=None (NoneType); it must be a str"),
        ({"category": 3}, "has category=3 (int); it must be a str"),
        ({"group": ("dp",)}, "has group=('dp',) (tuple); it must be a str"),
        ({"kind": "kernel"}, "has kind 'kernel', not one of compute, comm, p2p, step"),
    ],
    ids=[
        "bool-rank",
        "none-step",
        "whole-float-start",
        "str-dur",
        "huge-bytes",
        "tiny-start",
        "negative-dur",
        "negative-bytes",
        "bytes-kind",
        "none-name",
        "int-category",
        "tuple-group",
        "unknown-kind",
    ],
)
def test_each_bad_span_is_refused_in_its_own_words(change, problem):
    assert span_problem(dataclasses.replace(GOOD, **change)) == problem


def test_a_span_that_is_not_a_span_record():
    fields = tuple(getattr(GOOD, f.name) for f in dataclasses.fields(SpanRecord))
    assert span_problem(fields) == "is a tuple, not a SpanRecord"


def test_the_start_must_fit_once_made_relative_to_the_first_span():
    # Both starts fit 64 bits; their difference, which the span table stores, does not.
    late = dataclasses.replace(GOOD, start_ns=2**63 - 1)
    assert span_problem(late) is None
    assert span_problem(late, origin=-(2**62)) == (
        "has start_ns outside the 64-bit integer range once made relative to the trial's first span"
    )
    assert span_problem(late, origin=0) is None


@pytest.mark.parametrize(
    "span",
    [
        GOOD,
        dataclasses.replace(GOOD, kind="step", bytes=0, dur_ns=0, group="", category=""),
        dataclasses.replace(GOOD, start_ns=2**63 - 1, bytes=2**63 - 1, rank=-1),
    ],
    ids=["comm", "empty-strings-zero-duration", "64-bit-limits"],
)
def test_good_spans_pass(span):
    assert span_problem(span) is None
