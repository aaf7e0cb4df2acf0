"""The performance model's formulas on hand-worked cases, its cluster files, its calibration.

No process group runs here: each expected value is worked out by hand from the cited formula
(Narayanan et al. 2021's bubble, the ring all-reduce's 2(n−1)/n, ZeRO's 3Φ against 2Φ)."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from autotune.config import TrialConfig, WorkloadSpec
from autotune.errors import ConfigError
from autotune.model.calibration import Sample, fit_calibration
from autotune.model.cluster import ClusterSpec, DeviceSpec, LinkSpec, load_cluster, read_nccl_tests
from autotune.model.perf_model import (
    AUTOTUNE_ENGINE,
    MEGATRON_ENGINE,
    MEGATRON_LEGACY_ENGINE,
    TERMS,
    Calibration,
    _Group,
    collective_time,
    hooked_units,
    layer_params,
    pipeline_bubble,
    predict_step_time,
    stage_boundaries,
)
from autotune.shapes import ModelShape

A100_DATA = Path(__file__).resolve().parents[1] / "data" / "a100-megatron"
"""The nccl-tests curve of the shared A100 data set, copied with its licence (data/README.md)."""
GB = 1e9


def flat_cluster(
    *,
    nodes: int = 1,
    per_node: int = 8,
    bw: float = 100.0,
    latency: float = 0.0,
    inter_bw: float = 25.0,
    backend: str = "nccl",
) -> ClusterSpec:
    return ClusterSpec(
        name="test",
        num_nodes=nodes,
        devices_per_node=per_node,
        device=DeviceSpec(
            name="dev",
            peak_flops={"float32": 100e12, "float16": 100e12, "bfloat16": 100e12},
            memory_bandwidth_gbs=1000.0,
            memory_gib=80.0,
        ),
        intra_node=LinkSpec(bandwidth_gbs=bw, latency_us=latency),
        inter_node=LinkSpec(bandwidth_gbs=inter_bw, latency_us=latency),
        backend=backend,
    )


# A calibration with every fixed cost and element-wise term at zero: only FLOPs and bytes.
PURE = Calibration(
    compute_efficiency=0.5,
    half_efficiency_rows=1e-9,
    half_efficiency_cols=1e-9,
    elementwise_bytes=0.0,
    elementwise_sharded_bytes=0.0,
    score_bytes=0.0,
    layer_overhead_s=0.0,
    collective_overhead_s=0.0,
    microbatch_overhead_s=0.0,
    step_overhead_s=0.0,
    comm_efficiency=1.0,
    overlap_efficiency=1.0,
    optimizer_bytes_per_param=0.0,
)
# 8 equal layers and a head too small to unbalance the last stage.
SHAPE = ModelShape("gpt", 8, 1024, 16, 16, 4096, 8, 1024)


def config(**kw) -> TrialConfig:
    workload = WorkloadSpec(
        seq_len=512,
        global_batch_size=kw.pop("global_batch", 8),
        dtype="float16",
        workload="test:shape",
        vocab_size=8,
    )
    return TrialConfig(workload=workload, **{"world_size": 8, "overlap_enabled": False, **kw})


def test_each_term_of_a_tp_dp_layout_is_its_formula():
    """tp 2 × dp 2, two micro-batches of 1 × 512 tokens, Megatron's engine, nothing but FLOPs
    and bytes (PURE, 16 optimizer bytes per parameter), fp16 (2 bytes), links at 100 GB/s:
    - compute: 3 passes × (8 layers × (24bsh² + 4bs²h) / tp + the vocabulary-parallel head's
      2bsh·V / tp) at peak × 0.5 (Narayanan et al. 2021), per micro-batch;
    - tp: per layer 2 all-reduces forward and 2 backward of b·s·h activations (Shoeybi et al.
      2019 §3), + the embedding's, each 2(n−1)/n · S / busbw at n = 2;
    - dp: one all-reduce of the rank's fp16 gradients after the backward: 8 layers ×
      (12h² + 4h) / tp + embedding V·h / tp + 1024 positions × h + head V·h / tp + 2h;
    - optimizer: 16 bytes × those parameters / 1000 GB/s; pipeline and overheads nothing."""
    b, s, h, layers, vocab, tp, m, e = 1, 512, 1024, 8, 8, 2, 2, 2
    cal = dataclasses.replace(PURE, optimizer_bytes_per_param=16.0)
    est = predict_step_time(
        config(
            world_size=4,
            tp_degree=tp,
            micro_batch_size=b,
            global_batch=4,
            activation_checkpointing="none",
        ),
        flat_cluster(per_node=4, bw=100.0),
        cal,
        shape=SHAPE,
        engine=MEGATRON_LEGACY_ENGINE,
    )
    rate = 100e12 * 0.5
    compute = (
        m
        * 3
        * (layers * (24 * b * s * h * h + 4 * b * s * s * h) / tp + 2 * b * s * h * vocab / tp)
        / rate
    )
    all_reduce = 2 * (tp - 1) / tp * (b * s * h * e) / (100 * GB)
    tp_comm = m * (layers * 4 + 1) * all_reduce
    params = (
        layers * (12 * h * h + 4 * h) / tp + (vocab * h / tp + 1024 * h) + (vocab * h / tp + 2 * h)
    )
    dp_comm = 2 * 1 / 2 * params * e / (100 * GB)
    optimizer = 16 * params / (1000 * GB)
    expected = {
        "compute": compute,
        "tp_comm": tp_comm,
        "pp_p2p": 0.0,
        "pp_bubble": 0.0,
        "dp_comm": dp_comm,
        "optimizer": optimizer,
        "overhead": 0.0,
    }
    assert set(est.breakdown) == set(TERMS)
    for term, value in expected.items():
        assert est.breakdown[term] == pytest.approx(value, rel=1e-6, abs=1e-12), term
    assert est.step_time_s == pytest.approx(sum(expected.values()), rel=1e-6)
    assert est.tokens_per_s == pytest.approx(4 * 512 / sum(expected.values()), rel=1e-6)


@pytest.mark.parametrize("pp,m", [(2, 4), (4, 4), (4, 16), (8, 8)])
def test_pipeline_bubble_is_p_minus_1_over_m(pp: int, m: int):
    """Narayanan et al. 2021 §2.2: bubble time / ideal time = (p − 1) / m for equal stages."""
    world = pp
    cfg = config(world_size=world, pp_degree=pp, micro_batch_size=1, global_batch=m)
    cluster = flat_cluster(per_node=world, bw=1e9)  # links so fast transfers are nothing
    est = predict_step_time(cfg, cluster, PURE, shape=SHAPE)
    ideal = est.breakdown["compute"] + est.breakdown["pp_p2p"]
    assert est.breakdown["pp_bubble"] / ideal == pytest.approx((pp - 1) / m, rel=0.02)


def test_interleaved_bubble_is_divided_by_the_virtual_stages():
    """(p − 1) / (v·m) with v = 2 virtual stages per rank."""
    pp, m = 4, 8
    cfg = config(
        world_size=pp,
        pp_degree=pp,
        micro_batch_size=1,
        global_batch=m,
        pp_schedule="interleaved_1f1b",
    )
    est = predict_step_time(cfg, flat_cluster(per_node=pp, bw=1e9), PURE, shape=SHAPE)
    ideal = est.breakdown["compute"] + est.breakdown["pp_p2p"]
    assert est.breakdown["pp_bubble"] / ideal == pytest.approx((pp - 1) / (2 * m), rel=0.02)


def test_interleaving_cannot_hide_the_bubble_with_fewer_micro_batches_than_stages():
    """m < p: a micro-batch's chunks run one after another, so the step is Σ T_i + (m − 1) ·
    max T_i / v. p = 2 stages of 1 s, v = 2, m = 1: the two ranks take turns, 2 s in all
    (bubble 1 s, not (p − 1)/v = 0.5 s); p = 4, m = 2: 4 + 1/2 = 4.5 s, bubble 2.5 s. At m = p
    both forms give m·T + (p − 1)·T/v: 4 + 3/2 with p = m = 4."""
    assert pipeline_bubble([1.0, 1.0], 1, 2) == pytest.approx(1.0)
    assert pipeline_bubble([1.0] * 4, 2, 2) == pytest.approx(2.5)
    assert pipeline_bubble([1.0] * 4, 4, 2) == pytest.approx(1.5)
    assert pipeline_bubble([1.0] * 4, 2, 1) == pytest.approx(3.0)  # v = 1: (p − 1)·T
    # Through the model: pp 2, one micro-batch, interleaved: bubble / ideal = 1 (as GPipe's).
    cfg = config(
        world_size=2,
        pp_degree=2,
        micro_batch_size=1,
        global_batch=1,
        pp_schedule="interleaved_1f1b",
    )
    est = predict_step_time(cfg, flat_cluster(per_node=2, bw=1e9), PURE, shape=SHAPE)
    ideal = est.breakdown["compute"] + est.breakdown["pp_p2p"]
    assert est.breakdown["pp_bubble"] / ideal == pytest.approx(1.0, rel=0.02)


def test_interleaved_ranks_cross_the_wrap_around_boundaries_too():
    """Rank r holds virtual stages r, r + p, …: with pp 2 and v 2, rank 0's chunks are stages 0
    and 2, rank 1's are 1 and 3, and the boundaries 0→1, 1→2 and 2→3 each touch both ranks:
    3 transfers a micro-batch on either rank, where 1F1B's one boundary is 1."""
    assert [stage_boundaries(r, 2, 2) for r in range(2)] == [3, 3]
    assert [stage_boundaries(r, 4, 2) for r in range(4)] == [3, 4, 4, 3]
    assert [stage_boundaries(r, 4, 1) for r in range(4)] == [1, 2, 2, 1]
    assert stage_boundaries(0, 1, 1) == 0
    p2p = {
        schedule: predict_step_time(
            config(
                world_size=2, pp_degree=2, micro_batch_size=1, global_batch=8, pp_schedule=schedule
            ),
            flat_cluster(per_node=2),
            PURE,
            shape=SHAPE,
        ).breakdown["pp_p2p"]
        for schedule in ("1f1b", "interleaved_1f1b")
    }
    assert p2p["interleaved_1f1b"] / p2p["1f1b"] == pytest.approx(3.0)


def cpu_ranks(cluster: ClusterSpec, *, cores: int) -> ClusterSpec:
    """``cluster``'s ranks as CPU processes sharing ``cores`` cores (no asynchronous device)."""
    return dataclasses.replace(
        cluster,
        cores_per_node=cores,
        device=dataclasses.replace(cluster.device, asynchronous=False),
    )


def test_a_cpu_rank_pays_host_time_for_each_boundary_it_crosses():
    """p2p_overhead_s = 1 ms, pp 2 on 2 CPU ranks with 2 cores (a core each), 8 micro-batches:
    1F1B crosses 1 boundary a micro-batch, 8 ms in all; interleaved (v 2) crosses 3, 24 ms.
    8 ranks on 2 cores (pp 2 × dp 4) share a core four ways: 4 × 8 ms for 1F1B. A GPU's
    transfers run on its streams: nothing."""
    cal = dataclasses.replace(PURE, p2p_overhead_s=1e-3)

    def extra(cluster, global_batch=8, **kw) -> float:  # 8 micro-batches a rank
        cfg = config(pp_degree=2, micro_batch_size=1, global_batch=global_batch, **kw)
        return (
            predict_step_time(cfg, cluster, cal, shape=SHAPE).breakdown["pp_p2p"]
            - predict_step_time(cfg, cluster, PURE, shape=SHAPE).breakdown["pp_p2p"]
        )

    two = cpu_ranks(flat_cluster(per_node=2), cores=2)
    assert extra(two, world_size=2) == pytest.approx(8e-3)
    assert extra(two, world_size=2, pp_schedule="interleaved_1f1b") == pytest.approx(24e-3)
    eight = cpu_ranks(flat_cluster(per_node=8), cores=2)
    assert extra(eight, world_size=8, global_batch=32) == pytest.approx(4 * 8e-3)  # dp 4
    assert extra(flat_cluster(per_node=2), world_size=2) == 0.0


def test_cpu_ranks_in_a_bubble_share_the_cores_only_among_the_working_ones():
    """8 CPU ranks on 2 cores, pp 2 × dp 4: the stage times are at 2/8 of a core a rank; in
    the fill and drain only one stage's 4 ranks run, at 2/4 of a core: the bubble takes
    (4/2) / (8/2) = 1/2 of its time at the shared speed."""
    cfg = config(world_size=8, pp_degree=2, micro_batch_size=1, global_batch=16)  # dp 4
    cpu = cpu_ranks(flat_cluster(per_node=8, bw=1e9), cores=2)
    bubble = [
        predict_step_time(cfg, c, PURE, shape=SHAPE).breakdown["pp_bubble"]
        for c in (dataclasses.replace(cpu, cores_per_node=None), cpu)
    ]
    assert bubble[1] / bubble[0] == pytest.approx(0.5)


def test_a_collective_over_more_cpu_ranks_than_cores_waits_for_turns():
    """A gloo all-reduce's host cost over tp 4 ranks on 2 cores: 4/2 = 2 turns, on top of the
    rank's half core (host share 4/2): per layer per micro-batch 6 all-reduces (forward 2,
    backward q, k, v and the MLP input) × 1 ms × 2 × 2; 4 layers, 1 micro-batch. Over tp 2 (with
    dp 2) the group fits the cores: × 2 only."""
    shape = ModelShape("gpt", 4, 64, 4, 4, 256, 8, 64)
    cluster = cpu_ranks(flat_cluster(per_node=4, bw=1e9, backend="gloo"), cores=2)
    cal = dataclasses.replace(PURE, collective_overhead_s=1e-3)
    for tp, dp, turns in ((4, 1, 2), (2, 2, 1)):
        cfg = config(world_size=4, tp_degree=tp, micro_batch_size=1, global_batch=dp)
        with_cost = predict_step_time(cfg, cluster, cal, shape=shape).breakdown["overhead"]
        without = predict_step_time(cfg, cluster, PURE, shape=shape).breakdown["overhead"]
        assert with_cost - without == pytest.approx(4 * 6 * 1e-3 * 2 * turns)


TINY = ModelShape("gpt", 4, 64, 4, 4, 256, 8, 64)
"""A layer of 2·64² + 2·64·64 + 2·64·256 + 4·64 = 49,408 parameters: 98,816 bytes in fp16."""


def test_fsdp2_units_are_counted_as_the_engine_wraps_them():
    """Blocks grouped up to bucket_mb, plus each part's root: 0.1 MB = 104,857.6 bytes holds
    ⌈104,857.6 / 98,816⌉ = 2 layers, so 4 layers make 2 units + the root = 3; a rank with two
    virtual stages of 1 layer has two parts: (1 + 1) + (1 + 1) = 4. torch's DDP (overlap, no
    TP, no pipeline), the non-overlapped all-reduce, a single DP rank and Megatron's engine
    run no FSDP2 hooks."""
    assert layer_params(TINY) * 2 == 98_816
    per_layer = 98_816.0
    z3 = config(world_size=4, zero_stage=3, micro_batch_size=1, bucket_mb=0.1)  # dp 4
    assert hooked_units(z3, [4], per_layer, AUTOTUNE_ENGINE) == 3
    assert hooked_units(z3, [1, 1], per_layer, AUTOTUNE_ENGINE) == 4
    assert hooked_units(z3, [4], per_layer, MEGATRON_ENGINE) == 0
    replicated = config(
        world_size=4,
        pp_degree=2,
        zero_stage=1,
        micro_batch_size=1,
        bucket_mb=0.1,
        overlap_enabled=True,
    )  # dp 2
    assert hooked_units(replicated, [2], per_layer, AUTOTUNE_ENGINE) == 2
    for none in (
        config(world_size=4, zero_stage=0, overlap_enabled=True, micro_batch_size=1),
        config(world_size=4, pp_degree=2, zero_stage=1, micro_batch_size=1),
        config(world_size=1, zero_stage=3, micro_batch_size=1),
    ):
        assert hooked_units(none, [4], per_layer, AUTOTUNE_ENGINE) == 0


def test_fsdp2_hooks_cost_host_time_every_micro_batch():
    """ZeRO-3 over 4 CPU ranks on 2 cores (half a core each: host share 2), 2 micro-batches,
    3 units: 2 × 3 × 1 ms × 2 = 12 ms more overhead; DDP's C++ reducer adds none."""
    cluster = cpu_ranks(flat_cluster(per_node=4, bw=1e9, backend="gloo"), cores=2)
    cal = dataclasses.replace(PURE, unit_overhead_s=1e-3)
    z3 = config(world_size=4, zero_stage=3, micro_batch_size=1, global_batch=8, bucket_mb=0.1)
    ddp = config(
        world_size=4, zero_stage=0, micro_batch_size=1, global_batch=8, overlap_enabled=True
    )
    for cfg, added in ((z3, 2 * 3 * 1e-3 * 2), (ddp, 0.0)):
        with_cost = predict_step_time(cfg, cluster, cal, shape=TINY).breakdown["overhead"]
        without = predict_step_time(cfg, cluster, PURE, shape=TINY).breakdown["overhead"]
        assert with_cost - without == pytest.approx(added)


def test_fsdp2_hooks_hide_behind_a_gpus_queued_work():
    """On a GPU the hooks are host work beside queued kernels: 8 layers of h 1024 at 8 ranks
    (ZeRO-3, 5 units of ≤ 2 layers at 25 MiB, 1 ms each: 5 ms a micro-batch) against ≈ 6 ms
    of device work hide almost wholly; TINY's layers (µs of work) leave all 3 × 1 ms exposed."""
    cal = dataclasses.replace(PURE, unit_overhead_s=1e-3)
    big = config(world_size=8, zero_stage=3, micro_batch_size=1, bucket_mb=25)
    small = config(world_size=4, zero_stage=3, micro_batch_size=1, global_batch=4, bucket_mb=0.1)
    for cfg, shape, per_node, exposed in ((big, SHAPE, 8, 0.0), (small, TINY, 4, 3e-3)):
        cluster = flat_cluster(per_node=per_node)
        with_cost = predict_step_time(cfg, cluster, cal, shape=shape).breakdown["overhead"]
        without = predict_step_time(cfg, cluster, PURE, shape=shape).breakdown["overhead"]
        assert with_cost - without == pytest.approx(exposed, abs=5e-5)


def test_ring_all_reduce_time_at_a_known_bandwidth():
    """2(n−1)/n · S / busbw: 1 GB over 4 ranks at 100 GB/s bus bandwidth takes 15 ms."""
    cluster = flat_cluster(bw=100.0)
    t = collective_time(cluster, PURE, _Group(4, 1, 1), 1e9)
    assert t == pytest.approx(2 * 3 / 4 * 1e9 / (100 * GB))
    # all-gather and reduce-scatter move half: (n − 1)/n · S
    assert collective_time(cluster, PURE, _Group(4, 1, 1), 1e9, kind="all_gather") == (
        pytest.approx(t / 2)
    )
    # gloo runs reduce-scatter as a full all-reduce
    gloo = flat_cluster(bw=100.0, backend="gloo")
    assert collective_time(gloo, PURE, _Group(4, 1, 1), 1e9, kind="reduce_scatter") == (
        pytest.approx(t)
    )


def test_a_group_across_nodes_shares_each_nodes_network():
    """8 DP groups of 2 across 2 nodes: each node's 25 GB/s carries 8 rings' traffic."""
    cluster = flat_cluster(nodes=2, inter_bw=25.0)
    t = collective_time(cluster, PURE, _Group(2, 2, 8), 1e8)
    assert t == pytest.approx(8 * 1.0 * 1e8 / (25 * GB))


def test_zero3_moves_one_and_a_half_times_the_all_reduce():
    """ZeRO paper §7: all-gather (forward) + all-gather (backward) + reduce-scatter = 3Φ against
    the all-reduce's 2Φ, with one micro-batch and no overlap."""
    cluster = flat_cluster()
    times = {
        z: predict_step_time(
            config(zero_stage=z, micro_batch_size=1), cluster, PURE, shape=SHAPE
        ).breakdown["dp_comm"]
        for z in (0, 3)
    }
    assert times[3] / times[0] == pytest.approx(1.5)


def test_gradient_sync_bytes_follow_the_parameter_count():
    """ZeRO-0 at dp 8: one ring all-reduce of the fp16 gradients of every parameter."""
    cluster = flat_cluster(bw=100.0)
    est = predict_step_time(config(micro_batch_size=1), cluster, PURE, shape=SHAPE)
    grad_bytes = 2 * SHAPE.num_params(8)  # vocab 8, so embedding + head are tiny but counted
    assert est.breakdown["dp_comm"] == pytest.approx(2 * 7 / 8 * grad_bytes / (100 * GB), rel=1e-3)


def test_tensor_parallel_all_reduces_per_layer():
    """Megatron: per layer per micro-batch two all-reduces forward, two backward; full
    recomputation repeats the forward's two: 6 of b·s·h fp16 bytes each."""
    cluster = flat_cluster(bw=100.0)
    cfg = config(
        world_size=2,
        tp_degree=2,
        micro_batch_size=1,
        global_batch=1,
        activation_checkpointing="full",
    )
    est = predict_step_time(cfg, cluster, PURE, shape=SHAPE, engine=MEGATRON_LEGACY_ENGINE)
    one = 2 * 1 / 2 * (512 * 1024 * 2) / (100 * GB)
    assert est.breakdown["tp_comm"] == pytest.approx(8 * 6 * one + one)  # + the embedding's


def test_compute_is_flops_over_peak_times_efficiency():
    """Narayanan et al. 2021: forward 24bsh² + 4bs²h per layer, backward twice that."""
    cfg = config(world_size=1, micro_batch_size=1, global_batch=1)
    est = predict_step_time(cfg, flat_cluster(per_node=1), PURE, shape=SHAPE)
    b, s, h = 1, 512, 1024
    layer = 24 * b * s * h * h + 4 * b * s * s * h
    head = 2 * b * s * h * 8
    assert est.breakdown["compute"] == pytest.approx(
        3 * (8 * layer + head) / (100e12 * 0.5), rel=1e-6
    )


def test_host_bound_layers_take_the_host_time():
    """Tiny layers on a GPU: the step is the host's launch time, not the device's work."""
    cal = dataclasses.replace(PURE, layer_overhead_s=1e-3)
    cfg = config(world_size=1, micro_batch_size=1, global_batch=1)
    est = predict_step_time(cfg, flat_cluster(per_node=1), cal, shape=SHAPE)
    assert est.step_time_s == pytest.approx(8 * 2 * 1e-3, rel=0.01)  # 8 layers × 2 passes


def test_calibration_recovers_known_parameters():
    """Step times made by a known calibration are fitted back to it from the defaults."""
    truth = dataclasses.replace(
        Calibration(),
        compute_efficiency=0.42,
        layer_overhead_s=4e-4,
        comm_efficiency=0.7,
        optimizer_bytes_per_param=20.0,
    )
    cluster = load_cluster("a100-sxm4-80gb")
    samples = []
    for tp in (1, 2, 4, 8):
        for mb in (1, 2, 4, 8):
            for hidden in (256, 4096):  # launch-bound and compute-bound layers
                shape = ModelShape("gpt", 12, hidden, 16, 16, 4 * hidden, 50257, 1024)
                cfg = TrialConfig(
                    workload=WorkloadSpec(
                        seq_len=1024, global_batch_size=64, dtype="float16", workload="t:s"
                    ),
                    world_size=8,
                    tp_degree=tp,
                    micro_batch_size=mb,
                    overlap_enabled=False,
                )
                t = predict_step_time(cfg, cluster, truth, shape=shape).step_time_s
                samples.append(Sample(cfg, t, shape))
    fitted = (
        "compute_efficiency",
        "layer_overhead_s",
        "comm_efficiency",
        "optimizer_bytes_per_param",
    )
    report = fit_calibration(samples, cluster, fitted=fitted, fit_shapes=False)
    for name in fitted[:3]:
        assert getattr(report.calibration, name) == pytest.approx(getattr(truth, name), rel=0.1)
    assert report.mape < 0.01


def test_a_parameter_no_sample_depends_on_keeps_its_start():
    """Trials at tp 1 say nothing of the per-layer TP overhead: it is not fitted (the solver
    once moved it to 1e26 s and predicted every tp 2 layout absurdly), and a tp 2 layout is
    predicted from its starting value."""
    cluster = load_cluster("a100-sxm4-80gb")
    truth = dataclasses.replace(Calibration(), compute_efficiency=0.42, layer_overhead_s=4e-4)
    samples = []
    for mb in (1, 2, 4):
        cfg = config(world_size=8, tp_degree=1, micro_batch_size=mb)
        samples.append(
            Sample(cfg, predict_step_time(cfg, cluster, truth, shape=SHAPE).step_time_s, SHAPE)
        )
    start = Calibration()
    report = fit_calibration(
        samples,
        cluster,
        start=start,
        fitted=("compute_efficiency", "layer_overhead_s", "tp_layer_overhead_s"),
        fit_shapes=False,
    )
    assert "tp_layer_overhead_s" not in report.fitted
    assert report.calibration.tp_layer_overhead_s == start.tp_layer_overhead_s
    tp2 = config(world_size=8, tp_degree=2, micro_batch_size=1)
    predicted = predict_step_time(tp2, cluster, report.calibration, shape=SHAPE).step_time_s
    # Three tp 1 trials cannot separate compute from launch time exactly; the tp 2 layout's
    # prediction is only required to be of the truth's order.
    expected = predict_step_time(
        tp2,
        cluster,
        dataclasses.replace(truth, tp_layer_overhead_s=start.tp_layer_overhead_s),
        shape=SHAPE,
    ).step_time_s
    assert expected / 2 < predicted < expected * 2


def test_calibration_refuses_no_samples():
    with pytest.raises(ConfigError, match="no measured step times"):
        fit_calibration([], load_cluster("h100-sxm"))


# ---- cluster files ------------------------------------------------------------------------
def test_a100_megatron_cluster_carries_the_nccl_tests_curves():
    cluster = load_cluster("a100-megatron")
    assert (cluster.num_nodes, cluster.devices_per_node) == (1, 8)
    points = read_nccl_tests(A100_DATA / "allreduce" / "a100_8gpu.csv")
    size, busbw = points[-1]  # 1 GiB
    assert cluster.intra_node.busbw(size, 8) == pytest.approx(busbw * GB)
    size, busbw = points[0]  # 1 MiB
    assert cluster.intra_node.busbw(size, 8) == pytest.approx(busbw * GB)


def test_builtin_clusters_scale_by_nodes():
    cluster = load_cluster("h100-sxm", nodes=64)
    assert cluster.world_size == 512
    cluster.check_world(512)
    with pytest.raises(ConfigError, match="world size 256 ≠ 64 nodes × 8"):
        cluster.check_world(256)


def test_cluster_round_trips_through_json(tmp_path):
    cluster = load_cluster("a100-sxm4-80gb", nodes=2)
    path = tmp_path / "c.json"
    path.write_text(json.dumps(cluster.to_dict()))
    assert ClusterSpec.from_file(path) == cluster


def test_cluster_reads_toml(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(
        'name = "t"\nnum_nodes = 2\ndevices_per_node = 4\n'
        '[device]\nname = "d"\nmemory_bandwidth_gbs = 1000.0\nmemory_gib = 40.0\n'
        "[device.peak_flops]\nbfloat16 = 1e14\n"
        "[intra_node]\nbandwidth_gbs = 100.0\nlatency_us = 5.0\n"
        "[inter_node]\nbandwidth_gbs = 25.0\nlatency_us = 10.0\n"
    )
    cluster = ClusterSpec.from_file(path)
    assert cluster.world_size == 8 and cluster.device.flops("bfloat16") == 1e14


@pytest.mark.parametrize(
    "text,message",
    [
        ("{not json", "is not valid JSON"),
        ('{"name": "x"}', "device is missing"),
        (
            '{"name": "x", "device": {"name": "d", "peak_flops": {}, "memory_bandwidth_gbs": 1, '
            '"memory_gib": 1}, "intra_node": {"bandwidth_gbs": 1, "latency_us": 1}, '
            '"inter_node": {"bandwidth_gbs": 1, "latency_us": 1}}',
            "peak_flops needs",
        ),
        (
            '{"name": "x", "devices_per_node": 0, "device": {"name": "d", "peak_flops": '
            '{"float32": 1}, "memory_bandwidth_gbs": 1, "memory_gib": 1}, "intra_node": '
            '{"bandwidth_gbs": 1, "latency_us": 1}, "inter_node": {"bandwidth_gbs": 1, '
            '"latency_us": 1}}',
            "devices_per_node must be a positive integer",
        ),
        ('{"name": "x", "colour": 1}', "unknown key"),
    ],
)
def test_bad_cluster_files_are_one_clear_error(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        ClusterSpec.from_file(path)


def test_unknown_cluster_name_lists_the_choices():
    with pytest.raises(ConfigError, match="unknown cluster 'dgx-9000'.*a100-sxm4-80gb"):
        load_cluster("dgx-9000")


# ---- bench/perf_model_accuracy.py -----------------------------------------------------------
def _accuracy_bench():
    import importlib.util

    bench = Path(__file__).resolve().parents[2] / "bench"
    if str(bench) not in sys.path:  # the bench imports its ``common`` as ``python bench/…`` does
        sys.path.insert(0, str(bench))
    path = bench / "perf_model_accuracy.py"
    spec = importlib.util.spec_from_file_location("perf_model_accuracy", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_accuracy_bench_can_describe_overlapped_runs():
    """The table's code synced gradients after the backward (the default); --overlap says its
    runs overlapped them, and the rows become configs with overlap on."""
    bench = _accuracy_bench()
    parse = bench.build_parser().parse_args
    assert bench.training_of(parse([])).overlap_enabled is False
    assert bench.training_of(parse(["--overlap"])).overlap_enabled is True
    assert bench.training_of(parse(["--overlap", "--no-overlap"])).overlap_enabled is False


def test_the_held_out_shape_split_predicts_only_shapes_it_never_measured(tmp_path):
    """16 rows in the shared CSV format: h 1024/2048 × micro-batch 1/2 × tp 1/2 × dp 1/2, so 8
    layer shapes (h, tokens per micro-batch, tp). Two folds: each fold's shapes are held out
    whole, no calibrating row has a predicted row's shape, the folds cover every row once, and
    every neighbour of a held-out shape (one step in h, micro-batch or tp) calibrates, as in a
    checkerboard (sorted keys taken alternately would hold out all of tp 1 instead). The
    calibration has as many rows as the plain split (16 / --every 4)."""
    bench = _accuracy_bench()
    table = tmp_path / "table.csv"
    lines = [",".join(bench.COLUMNS)]
    for h in (1024, 2048):
        for mb in (1, 2):
            for tp in (1, 2):
                for dp in (1, 2):
                    lines.append(f"{tp * dp},8,{mb},{h},16,12,1024,{tp},{dp},1,{100 + h / 64}")
    table.write_text("\n".join(lines) + "\n")
    args = bench.build_parser().parse_args([])

    def shapes_of(path):
        return [bench.shape_of(r, args)[0] for r in bench.read_table(str(path))]

    predicted_rows = []
    for fold in (0, 1):
        out = tmp_path / f"fold{fold}"
        assert (
            bench.main(
                [
                    "--split",
                    str(table),
                    "--hold-out-shapes",
                    "2",
                    "--offset",
                    str(fold),
                    "--every",
                    "4",
                    "--out",
                    str(out),
                ]
            )
            == 0
        )
        calibrating, predicted = shapes_of(out / "calibrate.csv"), shapes_of(out / "predict.csv")
        assert len(calibrating) == 4 and len(predicted) == 8
        assert not set(calibrating) & set(predicted)
        held = {(block[0], tokens, tp) for block, tokens, tp in predicted}
        assert len(held) == 4
        for h, tokens, tp in held:
            for neighbour in ((3072 - h, tokens, tp), (h, 3072 - tokens, tp), (h, tokens, 3 - tp)):
                assert neighbour not in held
        predicted_rows += (out / "predict.csv").read_text().splitlines()[1:]
    assert sorted(predicted_rows) == sorted(lines[1:])


@pytest.mark.parametrize("engine", [AUTOTUNE_ENGINE, MEGATRON_ENGINE])
def test_context_parallel_divides_each_ranks_compute(engine):
    """cp 2 at the same micro-batch and dp: each rank computes its s/2 queries against all s
    keys, so the matmuls (24bsh²) and the scores (4bs²h) both halve (ring attention, Liu et
    al. 2023), on the calibrated trial engine's formulas as on the roofline's. FLOPs only
    (PURE): the compute term is exactly half."""
    pure = dataclasses.replace(PURE, gemm_half_dim=1e-9)  # the roofline's GEMMs at e_max
    one = predict_step_time(config(world_size=2), flat_cluster(), pure, shape=SHAPE, engine=engine)
    two = predict_step_time(
        config(world_size=4, cp_degree=2), flat_cluster(), pure, shape=SHAPE, engine=engine
    )
    assert two.breakdown["compute"] == pytest.approx(one.breakdown["compute"] / 2, rel=0.02)


@pytest.mark.parametrize("engine", [AUTOTUNE_ENGINE, MEGATRON_ENGINE])
def test_op_level_checkpointing_recomputes_half_the_forward_less_attention(engine):
    """ac "op" (torchtitan's policy, which the trial runs: SDPA's and every second matmul's
    outputs saved) reruns half of the forward less the attention core in backward: the compute
    term lies between no recomputation and full recomputation, at none + ½ (forward − core)."""
    pure = dataclasses.replace(PURE, gemm_half_dim=1e-9)
    cluster = flat_cluster()

    def compute(ac: str) -> float:
        c = config(world_size=2, activation_checkpointing=ac)
        return predict_step_time(c, cluster, pure, shape=SHAPE, engine=engine).breakdown["compute"]

    none, op, full = compute("none"), compute("op"), compute("full")
    assert none < op < full
    # full recomputes one forward: (full − none) is the forward; op adds half of it less the
    # attention core, which is a small share at seq 512 and h 1024 (4bs²h of 24bsh² + 4bs²h)
    forward = full - none
    core = forward * (4 * 512) / (24 * 1024 + 4 * 512)
    assert op - none == pytest.approx(0.5 * (forward - core), rel=0.1)
