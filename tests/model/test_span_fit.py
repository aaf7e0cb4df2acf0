"""Fits from spans: collectives generated from a known latency and bandwidth give them back;
compute spans give the rate the model's FLOPs imply; a real trial's spans give finite figures."""

from __future__ import annotations

import dataclasses
import math

import pytest

from autotune.config import TrialConfig
from autotune.model.cluster import GB, local_cpu_cluster
from autotune.model.perf_model import Calibration, layer_forward_flops, predict_step_time
from autotune.model.span_fit import INTER, INTRA, fit_link, fit_spans, summarize
from profiler import Span

LATENCY_S = 80e-6
BANDWIDTH_GBS = 1.5
WAITS_S = (0.0, 3e-4, 1.1e-3, 2e-5)
"""How long each rank waits for the last one to arrive (rotated per collective)."""


def _noise(i: int) -> float:
    """Deterministic ±2% measurement noise."""
    return 1 + 0.02 * math.sin(1.7 * i + 0.3)


def _collective_spans(config: TrialConfig, backend: str, sizes, *, group: str = "dp"):
    """Every rank's span of each collective: the true time (latency + r·S / busbw) with noise,
    plus that rank's wait for the others."""
    n = config.dp_degree
    spans, clock = [], 0
    for i, (name, size) in enumerate(
        (name, size) for size in sizes for name in ("all_reduce", "all_gather", "reduce_scatter")
    ):
        ring = (
            2 * (n - 1) / n
            if name == "all_reduce" or (name == "reduce_scatter" and backend == "gloo")
            else (n - 1) / n
        )
        true_s = (LATENCY_S + ring * size / (BANDWIDTH_GBS * GB)) * _noise(i)
        for rank in range(config.world_size):
            wait = WAITS_S[(rank + i) % len(WAITS_S)]
            spans.append(
                Span(rank, i % 2, "comm", name, "", clock, int((true_s + wait) * 1e9), size, group)
            )
        clock += 10**8
    return spans


SIZES = [2**k for k in range(12, 27, 2)]  # 4 KiB … 64 MiB


@pytest.mark.parametrize(
    "backend, nodes, link",
    [
        ("gloo", 1, INTRA),  # reduce-scatter runs as an all-reduce
        ("nccl", 1, INTRA),  # reduce-scatter moves (n−1)/n of its input
        ("gloo", 2, INTER),  # a dp group of 4 over 2 nodes of 2 crosses the network
    ],
)
def test_known_latency_and_bandwidth_are_recovered(backend, nodes, link):
    config = TrialConfig(world_size=4, micro_batch_size=1, device="cpu")
    assert config.dp_degree == 4
    cluster = dataclasses.replace(
        local_cpu_cluster(4), backend=backend, num_nodes=nodes, devices_per_node=4 // nodes
    )
    trial = summarize(_collective_spans(config, backend, SIZES), config, cluster)
    assert len(trial.collectives) == 3 * len(SIZES)
    # The shortest rank's span is the instance's time: no point carries a wait.
    assert {p.link for p in trial.collectives} == {link}
    fit = fit_spans([trial], cluster).links[link]
    assert fit.latency_fitted
    assert fit.latency_s == pytest.approx(LATENCY_S, rel=0.03)
    assert fit.bandwidth_gbs == pytest.approx(BANDWIDTH_GBS, rel=0.03)
    assert 0 < fit.residual < 0.03  # the ±2% noise, not the waits
    assert fit.num_points == 3 * len(SIZES)


def test_one_size_holds_the_latency_and_fits_the_bandwidth():
    config = TrialConfig(world_size=2, micro_batch_size=1, device="cpu")
    cluster = dataclasses.replace(
        local_cpu_cluster(2),
        intra_node=dataclasses.replace(local_cpu_cluster(2).intra_node, latency_us=LATENCY_S * 1e6),
    )
    spans = [s for s in _collective_spans(config, "gloo", [2**22] * 4) if s.name == "all_reduce"]
    fit = fit_spans([summarize(spans, config, cluster)], cluster).links[INTRA]
    assert not fit.latency_fitted and fit.latency_s == pytest.approx(LATENCY_S)
    assert fit.bandwidth_gbs == pytest.approx(BANDWIDTH_GBS, rel=0.03)


def test_a_fit_refuses_no_points_and_clamps_a_negative_latency():
    with pytest.raises(ValueError, match="no collective points"):
        fit_link([])
    config = TrialConfig(world_size=2, micro_batch_size=1, device="cpu")
    cluster = local_cpu_cluster(2)
    # Pure bandwidth, no latency, and the small messages measured a little fast: the
    # unconstrained fit's latency would be negative.
    spans = []
    for i, size in enumerate(SIZES):
        t = size / (BANDWIDTH_GBS * GB) * (0.9 if size < 2**16 else 1.0)
        spans += [
            Span(r, 0, "comm", "all_reduce", "", i * 10**8, int(t * 1e9), size, "dp")
            for r in range(2)
        ]
    fit = fit_spans([summarize(spans, config, cluster)], cluster).links[INTRA]
    assert fit.latency_s >= 0 and fit.bandwidth_gbs > 0


def _compute_spans(rank: int, step: int, start: int, extra_ns: int) -> list[Span]:
    ms = 1_000_000
    return [
        Span(rank, step, "step", "step", "", start, 100 * ms),
        Span(rank, step, "compute", "aten::linear", "forward", start, 10 * ms),
        Span(rank, step, "compute", "aten::addmm", "forward", start + 2 * ms, 4 * ms),  # nested
        Span(rank, step, "compute", "aten::mm", "backward", start + 20 * ms, 20 * ms + extra_ns),
        Span(rank, step, "compute", "aten::add_", "optimizer", start + 50 * ms, 5 * ms),
        Span(rank, step, "compute", "aten::randint", "op", start + 60 * ms, 1 * ms),
        Span(rank, step, "compute", "aten::mm", "backward", start + 99 * ms, 5 * ms),  # clipped
    ]


def test_compute_rate_is_the_model_flops_over_the_measured_time():
    config = TrialConfig(world_size=2, micro_batch_size=2, device="cpu")
    cluster = local_cpu_cluster(2, cores=2)
    spans = [
        s
        for step in (0, 1)
        for rank in (0, 1)
        for s in _compute_spans(rank, step, step * 200_000_000, 3_000_000 * rank)
    ]
    trial = summarize(spans, config, cluster)
    # Slowest rank (1): forward 10 ms (the nested op adds nothing) + backward 23 ms + the 1 ms
    # of the clipped op inside the window; optimizer and out-of-phase ops are not modelled.
    assert trial.compute.seconds == pytest.approx(0.034)
    assert trial.collectives == ()

    shape, wl = config.workload.shape, config.workload
    b, m = config.micro_batch_size, config.grad_accum_steps
    matmul, scores = layer_forward_flops(shape, seq_len=wl.seq_len, micro_batch=b)
    # Forward + backward (2× forward) per layer and of the output head (2·b·s·h·V forward),
    # per micro-batch (Narayanan et al. 2021).
    flops = (
        m
        * 3
        * (
            shape.num_layers * (matmul + scores)
            + 2 * b * wl.seq_len * shape.hidden_size * shape.vocab_size
        )
    )
    fit = fit_spans([trial], cluster).compute
    assert fit.flops_per_s == pytest.approx(flops / 0.034, rel=1e-9)
    assert fit.fraction_of_peak == pytest.approx(
        flops / 0.034 / cluster.device.flops("float32"), rel=1e-9
    )
    assert 0 < fit.compute_efficiency <= 1 and fit.residual < 1e-6
    # The prior it gives makes the model's compute term what the spans measured.
    start = fit_spans([trial], cluster).start_calibration(Calibration.for_cluster(cluster))
    assert predict_step_time(config, cluster, start).breakdown["compute"] == pytest.approx(
        0.034, rel=1e-6
    )


def test_spans_of_a_real_trial_give_finite_positive_figures(executor):
    config = dataclasses.replace(
        TrialConfig.from_file("examples/tiny_ddp_dp2.json"),
        device="cpu",
        num_warmup_steps=1,
        num_timed_steps=1,
        num_profiled_steps=2,
    )
    result = executor.run(config)
    spans = [s for r in result.ranks for s in r.spans]
    cluster = local_cpu_cluster(config.world_size)
    trial = summarize(spans, config, cluster)
    # ZeRO-0 with one 25 MB bucket: one all-reduce of every gradient per profiled step.
    assert len(trial.collectives) == 2
    assert {(p.name, p.bytes) for p in trial.collectives} == {
        ("all_reduce", 4 * config.workload.shape.num_params())
    }
    fit = fit_spans([trial], cluster)
    link = fit.links[INTRA]
    assert math.isfinite(link.bandwidth_gbs) and link.bandwidth_gbs > 0
    assert math.isfinite(link.latency_s) and link.latency_s > 0
    assert link.latency_s < min(p.seconds for p in trial.collectives)
    assert fit.compute is not None and fit.compute.flops_per_s > 0
    assert 0 < trial.compute.seconds < max(s.dur_ns for s in spans if s.kind == "step") * 1e-9
    assert 0 < fit.comm_efficiency and math.isfinite(fit.comm_efficiency)


def test_hsdp_groups_have_their_own_size_and_link():
    """HSDP's spans name dp_shard and dp_replicate (``runner.mesh_group_of``). World 8, dp 8 =
    4 replica groups of 2 shards, 2 devices per node: a shard group is 2 consecutive ranks (one
    node), a replica group 4 ranks 2 apart (four nodes)."""
    from autotune.model.span_fit import group_size, link_class

    config = TrialConfig(world_size=8, zero_stage=3, dp_replicate=4)
    assert (group_size(config, "dp_shard"), group_size(config, "dp_replicate")) == (2, 4)
    assert link_class(config, "dp_shard", 2) == INTRA
    assert link_class(config, "dp_replicate", 2) == INTER


def test_context_parallel_groups_have_their_own_size_and_link():
    """FSDP2 under context parallelism shards over dp_shard_cp (dp_shard × cp) and the K/V
    all-gathers talk on cp: each span is sized and placed by its own group, not the world's.
    World 16 = pp 2 × dp 2 × cp 2 × tp 2 on two nodes of 8 GPUs; the groups are read off the
    mesh's rank grid (pp, dp_replicate, dp_shard, cp, tp) here, by hand."""
    import torch

    from autotune.model.cluster import load_cluster
    from autotune.model.span_fit import collective_points

    config = TrialConfig(
        world_size=16, pp_degree=2, tp_degree=2, cp_degree=2, zero_stage=3, micro_batch_size=1
    )
    assert (config.dp_shard, config.dp_replicate) == (2, 1)
    grid = torch.arange(16).reshape(2, 1, 2, 2, 2)  # (pp, dp_replicate, dp_shard, cp, tp)
    shard_cp = grid[0, 0, :, :, 0].flatten().tolist()  # rank 0's: dp_shard × cp, tp 0
    cp = grid[0, 0, 0, :, 0].tolist()
    assert (shard_cp, cp) == ([0, 2, 4, 6], [0, 2])  # both inside node 0 (ranks 0-7)
    spans = [
        Span(0, 0, "comm", "all_gather", "", 0, 1000, 2**20, "dp_shard_cp"),
        Span(0, 0, "comm", "reduce_scatter", "", 2000, 1000, 2**20, "dp_shard_cp"),
        Span(0, 0, "comm", "all_gather", "", 4000, 1000, 2**20, "cp"),
    ]
    points = collective_points(spans, config, load_cluster("h100-sxm", nodes=2))
    # Ring factors (n − 1) / n: 3/4 for the 4 ranks of dp_shard_cp, 1/2 for cp's 2 (the world
    # of 16 would be 15/16, between nodes).
    assert [(p.name, p.link, p.group_size, p.ring_factor) for p in points] == [
        ("all_gather", INTRA, 2, 0.5),
        ("all_gather", INTRA, 4, 0.75),
        ("reduce_scatter", INTRA, 4, 0.75),
    ]
