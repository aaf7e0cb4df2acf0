"""Timeline metrics on hand-built spans, with answers worked out by hand in the comments."""

from __future__ import annotations

import pytest

from profiler import COMM, COMPUTE, P2P, STEP, Span, breakdown, bytes_per_step, rank_breakdown
from profiler.analysis import intersect, length, merge


def span(kind, start, end, rank=0, step=0, name="x", nbytes=0, group=""):
    return Span(rank, step, kind, name, "", start, end - start, nbytes, group)


def test_merge_nested_overlapping_disjoint():
    # [0,10) ⊃ [2,4); [8,12) overlaps → [0,12); [15,20) disjoint; [20,22) touches → [15,22)
    assert merge([(0, 10), (2, 4), (8, 12), (15, 20), (20, 22), (30, 30)]) == [(0, 12), (15, 22)]
    assert length(merge([(0, 10), (2, 4), (8, 12)])) == 12


def test_intersect():
    a = merge([(0, 10), (20, 30)])
    b = merge([(5, 25)])
    assert intersect(a, b) == [(5, 10), (20, 25)]


def test_single_rank_breakdown_by_hand():
    # step window [0, 100)
    # compute: [0,30) with nested [5,10) and overlapping [25,50) → [0,50) = 50
    # comm: [40,60) and [55,70) → [40,70) = 30; overlap with compute [40,50) = 10
    # exposed comm = 30 - 10 = 20; busy = 50 + 30 - 10 = 70; idle = 100 - 70 = 30
    spans = [
        span(STEP, 0, 100),
        span(COMPUTE, 0, 30),
        span(COMPUTE, 5, 10),
        span(COMPUTE, 25, 50),
        span(COMM, 40, 60),
        span(COMM, 55, 70),
    ]
    b = rank_breakdown(spans, 0)
    assert (b.window_ns, b.compute_ns, b.comm_ns) == (100, 50, 30)
    assert (b.overlap_ns, b.exposed_comm_ns, b.idle_ns) == (10, 20, 30)
    assert b.overlap == pytest.approx(10 / 30)


def test_two_windows_clip_compute_comm_and_their_overlap():
    # windows [10,50) and [70,100) → 70
    # compute [0,30) → [10,30) = 20; [45,80) → [45,50) + [70,80) = 15; compute = 35
    # comm [25,75) → [25,50) + [70,75) = 30; [95,120) → [95,100) = 5; comm = 35
    # overlap: [25,30) + [45,50) + [70,75) = 15 → exposed 20
    # busy: [10,50) = 40 in the first window, [70,80) + [95,100) = 15 in the second → idle 15
    spans = [
        span(STEP, 10, 50, step=0),
        span(STEP, 70, 100, step=1),
        span(COMPUTE, 0, 30),
        span(COMPUTE, 45, 80),
        span(COMM, 25, 75),
        span(COMM, 95, 120, step=1),
    ]
    b = rank_breakdown(spans, 0)
    assert (b.window_ns, b.compute_ns, b.comm_ns, b.num_steps) == (70, 35, 35, 2)
    assert (b.overlap_ns, b.exposed_comm_ns, b.idle_ns) == (15, 20, 15)


def test_spans_outside_step_windows_are_clipped():
    # window [10, 20); compute [0, 15) counts 5; comm [18, 40) counts 2 (no overlap)
    spans = [span(STEP, 10, 20), span(COMPUTE, 0, 15), span(COMM, 18, 40)]
    b = rank_breakdown(spans, 0)
    assert (b.compute_ns, b.comm_ns, b.overlap_ns, b.idle_ns) == (5, 2, 0, 3)


def test_several_ranks_and_pipeline_bubble():
    # rank 0: windows [0,50) and [60,100) → 90; compute [0,40) and [60,70) → 50;
    #         p2p send [40,45) → 5, no overlap; idle = 90 - 55 = 35
    # rank 1 (bubble): window [0,100); compute [45,90) → 45; recv [40,45) → 5; idle 50
    spans = [
        span(STEP, 0, 50, step=0),
        span(STEP, 60, 100, step=1),
        span(COMPUTE, 0, 40),
        span(COMPUTE, 60, 70, step=1),
        span(P2P, 40, 45, name="send", nbytes=1000, group="pp"),
        span(STEP, 0, 100, rank=1),
        span(COMPUTE, 45, 90, rank=1),
        span(P2P, 40, 45, rank=1, name="recv", nbytes=1000, group="pp"),
    ]
    r0, r1 = breakdown(spans)
    assert (r0.rank, r0.window_ns, r0.compute_ns, r0.comm_ns, r0.idle_ns) == (0, 90, 50, 5, 35)
    assert (r1.rank, r1.window_ns, r1.compute_ns, r1.comm_ns, r1.idle_ns) == (1, 100, 45, 5, 50)
    assert r0.num_steps == 2 and r1.num_steps == 1
    per_step = bytes_per_step(spans)
    assert per_step[0] == {("p2p", "send", "pp"): 500.0}  # 1000 bytes over 2 steps
    assert per_step[1] == {("p2p", "recv", "pp"): 1000.0}


def test_comm_fully_hidden_under_compute():
    spans = [span(STEP, 0, 10), span(COMPUTE, 0, 10), span(COMM, 2, 8)]
    b = rank_breakdown(spans, 0)
    assert b.overlap == 1.0 and b.exposed_comm_ns == 0 and b.idle_ns == 0


def test_no_communication_has_zero_overlap():
    b = rank_breakdown([span(STEP, 0, 10), span(COMPUTE, 0, 4)], 0)
    assert b.overlap == 0.0 and b.comm_ns == 0 and b.idle_ns == 6


def test_without_step_spans_the_window_is_the_extent():
    b = rank_breakdown([span(COMPUTE, 10, 20), span(COMM, 30, 40)], 0)
    assert (b.window_ns, b.idle_ns) == (30, 10)
