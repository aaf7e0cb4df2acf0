"""The profiler's communication payloads on real trials equal what the model implies.

One warm-up step first: DDP rebuilds its buckets (a small broadcast) in its second iteration.

Expected bytes are computed from the model's shape (``ModelShape.num_params``, fp32 = 4 bytes)
and the layout, never copied from a run. Payload convention: an all-gather counts its gathered
(full) output, a reduce-scatter its full input, an all-reduce its tensor (NCCL-tests' "size").
Tolerance: exact (the payload is a byte count, not a timing).
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from autotune.config import TrialConfig
from profiler import COMM, COMPUTE, P2P, STEP, breakdown, bytes_per_step

BASE = TrialConfig(
    world_size=2, num_warmup_steps=1, num_timed_steps=1, num_profiled_steps=2, device="cpu"
)
SHAPE = BASE.workload.shape
PARAM_BYTES = 4 * SHAPE.num_params()
SEQ, HIDDEN = BASE.workload.seq_len, SHAPE.hidden_size


def _sweep(spans) -> tuple[int, ...]:
    """(window, compute, comm, overlap, exposed, idle) by a boundary sweep over the raw spans:
    between consecutive span boundaries, count the open step, compute and communication spans,
    and add the gap to the state it is in. No interval merging or clipping, so it checks
    ``rank_breakdown``'s, not a copy of them."""
    track = {STEP: 0, COMPUTE: 1, COMM: 2, P2P: 2}
    edges = sorted(
        (t, delta, track[s.kind]) for s in spans for t, delta in ((s.start_ns, 1), (s.end_ns, -1))
    )
    open_spans, time_in = [0, 0, 0], Counter()
    for (t, delta, kind), (t_next, _, _) in zip(edges, edges[1:] + edges[-1:]):
        open_spans[kind] += delta
        if open_spans[0]:
            time_in[open_spans[1] > 0, open_spans[2] > 0] += t_next - t
    both, compute_only = time_in[True, True], time_in[True, False]
    comm_only, idle = time_in[False, True], time_in[False, False]
    return (
        both + compute_only + comm_only + idle,
        both + compute_only,
        both + comm_only,
        both,
        comm_only,
        idle,
    )


def _checked_breakdown(config, spans):
    """``breakdown(spans)``, each rank's figures checked against ``_sweep`` and its step count
    against the config's profiled steps."""
    ranks = breakdown(spans)
    for b in ranks:
        assert b.num_steps == config.num_profiled_steps
        figures = (b.window_ns, b.compute_ns, b.comm_ns, b.overlap_ns, b.exposed_comm_ns, b.idle_ns)
        assert figures == _sweep([s for s in spans if s.rank == b.rank])
    return ranks


def _run(executor, **layout):
    config = dataclasses.replace(BASE, **layout)
    result = executor.run(config)
    spans = [s for r in result.ranks for s in r.spans]
    return config, spans, bytes_per_step(spans)


def test_zero0_all_reduce_carries_every_gradient_once_per_step(executor):
    config, spans, per_step = _run(executor, zero_stage=0, micro_batch_size=2)
    assert config.grad_accum_steps == 2  # no_sync: one all-reduce per optimizer step, not per mb
    for rank in (0, 1):
        assert per_step[rank] == {("comm", "all_reduce", "dp"): PARAM_BYTES}
    assert {s.step for s in spans if s.kind == STEP} == {2, 3}  # after warm-up 0 and timed 1


def test_zero3_gathers_parameters_in_forward_and_backward(executor):
    config, spans, per_step = _run(executor, zero_stage=3, micro_batch_size=2, bucket_mb=0.1)
    _checked_breakdown(config, spans)  # its prefetched gathers overlap compute: overlap checked
    accum = config.grad_accum_steps
    for rank in (0, 1):
        # every unit gathered before its forward and again before its backward, per micro-batch
        assert per_step[rank][("comm", "all_gather", "dp")] == 2 * accum * PARAM_BYTES
        # gradients reduced once, on the last micro-batch
        assert per_step[rank][("comm", "reduce_scatter", "dp")] == PARAM_BYTES


def test_zero2_gathers_parameters_once_per_micro_batch(executor):
    config, _, per_step = _run(executor, zero_stage=2, micro_batch_size=2, bucket_mb=0.1)
    for rank in (0, 1):
        assert per_step[rank][("comm", "all_gather", "dp")] == config.grad_accum_steps * PARAM_BYTES
        assert per_step[rank][("comm", "reduce_scatter", "dp")] == PARAM_BYTES


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipeline_sends_each_micro_batch_activation_and_its_gradient(executor, schedule):
    config, spans, per_step = _run(executor, pp_degree=2, micro_batch_size=2, pp_schedule=schedule)
    activation = config.micro_batch_size * SEQ * HIDDEN * 4  # (mb, seq, hidden) fp32
    total = config.grad_accum_steps * activation
    assert per_step[0] == {("p2p", "send", "pp"): total, ("p2p", "recv", "pp"): total}
    assert per_step[1] == {("p2p", "recv", "pp"): total, ("p2p", "send", "pp"): total}
    # The last stage waits for its first activation: a bubble shows up as idle time.
    assert all(b.idle_ns > 0 for b in _checked_breakdown(config, spans))


def test_tensor_parallel_all_reduces_per_layer(executor):
    config, _, per_step = _run(executor, tp_degree=2, micro_batch_size=4)
    hidden_bytes = config.micro_batch_size * SEQ * HIDDEN * 4
    # forward: the row-wise wo and w2 all-reduce their outputs (2 per layer); backward: each
    # column-wise module (wq, wk, wv, w1) all-reduces its input gradient (4 per layer).
    expected = config.grad_accum_steps * SHAPE.num_layers * (2 + 4) * hidden_bytes
    for rank in (0, 1):
        assert per_step[rank] == {("comm", "all_reduce", "tp"): expected}


def test_spans_cover_phases_and_share_one_clock(executor):
    config, spans, _ = _run(executor, zero_stage=0, micro_batch_size=4)
    categories = {s.category for s in spans if s.kind == COMPUTE}
    assert {"forward", "backward", "optimizer"} <= categories
    for b in _checked_breakdown(config, spans):
        assert b.compute_ns > 0 and b.comm_ns > 0
    # Both ranks step together: their step windows start within a few ms of each other.
    starts = {}
    for s in spans:
        if s.kind == STEP:
            starts.setdefault(s.step, []).append(s.start_ns)
    for step_starts in starts.values():
        assert max(step_starts) - min(step_starts) < 50e6
    assert all(s.kind in (COMM, P2P, COMPUTE, STEP) for s in spans)
