"""The engines' time traits: one name selects time and memory; sequence parallelism, TP-comm
overlap, the distributed optimizer and partial recomputation, each against its arithmetic."""

from __future__ import annotations

import dataclasses

import pytest

from autotune.config import TrialConfig, WorkloadSpec
from autotune.errors import ConfigError
from autotune.model.cluster import ClusterSpec, DeviceSpec, LinkSpec
from autotune.model.engine_memory import MEMORY_TRAITS
from autotune.model.engines import ENGINE_NAMES, MEGATRON_ENGINE, engine_traits
from autotune.model.perf_model import Calibration, predict_step_time
from autotune.shapes import ModelShape

GB = 1e9
SHAPE = ModelShape("gpt", 8, 1024, 16, 16, 4096, 8, 1024)
CAL = Calibration(compute_efficiency=0.5, gemm_half_dim=0.0, elementwise_bytes=20.0,
                  elementwise_sharded_bytes=0.0, score_bytes=0.0, layer_overhead_s=0.0,
                  collective_overhead_s=0.0, overlap_efficiency=0.5,
                  optimizer_bytes_per_param=0.0)


def cluster(per_node: int = 8) -> ClusterSpec:
    return ClusterSpec(
        name="flat", devices_per_node=per_node,
        device=DeviceSpec(name="dev", peak_flops=dict.fromkeys(
            ("float32", "float16", "bfloat16"), 100e12), memory_bandwidth_gbs=1000.0,
            memory_gib=80.0),
        intra_node=LinkSpec(bandwidth_gbs=100.0, latency_us=0.0),
        inter_node=LinkSpec(bandwidth_gbs=25.0, latency_us=0.0))


def config(**kw) -> TrialConfig:
    workload = WorkloadSpec(seq_len=512, global_batch_size=kw.pop("global_batch", 8),
                            workload="test:shape", vocab_size=8)
    return TrialConfig(workload=workload, **{"world_size": 8, "overlap_enabled": False,
                                             "device": "cuda", "precision": "bf16-mixed",
                                             **kw})


def test_one_name_selects_time_and_memory_traits():
    for name in ENGINE_NAMES:
        assert engine_traits(name).name == name and name in MEMORY_TRAITS
        assert engine_traits(name).source
    with pytest.raises(ConfigError, match="choose one of autotune, megatron"):
        engine_traits("nemo")


def test_sequence_parallelism_moves_the_norms_to_s_over_t_tokens_and_keeps_tp_bytes():
    # Without SP each layer pass moves 20 B per b·s·h element on every TP rank; with SP 20/t.
    # Per step: 8 layers × (forward + 2 × backward) × m micro-batches × 20 · (1 − 1/4) · b·s·h
    # · 2 B ÷ 1000 GB/s.
    plain = dataclasses.replace(MEGATRON_ENGINE, sequence_parallel=False)
    c = config(tp_degree=4, micro_batch_size=1, global_batch=4)
    off = predict_step_time(c, cluster(), CAL, shape=SHAPE, engine=plain)
    on = predict_step_time(dataclasses.replace(c, sequence_parallel=True), cluster(), CAL,
                           shape=SHAPE, engine=plain)
    m = c.grad_accum_steps
    saved = 8 * 3 * m * 20 * (1 - 1 / 4) * 512 * 1024 * 2 / (1000 * GB)
    assert off.breakdown["compute"] - on.breakdown["compute"] == pytest.approx(saved, rel=1e-9)
    assert on.breakdown["tp_comm"] == off.breakdown["tp_comm"]


def test_tp_comm_overlap_hides_its_share_times_the_overlap_efficiency():
    c = config(tp_degree=4, micro_batch_size=1, global_batch=4)
    exposed = predict_step_time(c, cluster(), CAL, shape=SHAPE, engine=dataclasses.replace(
        MEGATRON_ENGINE, tp_comm_overlap=0.0)).breakdown["tp_comm"]
    hidden = predict_step_time(c, cluster(), CAL, shape=SHAPE,
                               engine=MEGATRON_ENGINE).breakdown["tp_comm"]
    # The embedding's all-reduce (first stage) is not overlapped: compare per layer.
    assert exposed > 0
    layer_share = (hidden - _embed(c)) / (exposed - _embed(c))
    assert layer_share == pytest.approx(1 - 0.8 * 0.5, rel=1e-9)


def _embed(c: TrialConfig) -> float:
    # One all-reduce of b·s·h bf16 over 4 ranks per micro-batch: 2·3/4·S / 100 GB/s.
    return c.grad_accum_steps * 2 * 3 / 4 * 512 * 1024 * 2 / (100 * GB)


def test_the_distributed_optimizer_reduce_scatters_fp32_grads_and_gathers_bf16_params():
    # dp 8, no TP: ZeRO-1 as Megatron's distributed optimizer without overlap: a reduce-scatter
    # of Φ fp32 gradients (7/8 · 4Φ / 100 GB/s) and an all-gather of Φ bf16 parameters
    # (7/8 · 2Φ / 100 GB/s); Φ = 8 layers · (12h² + 4h) + embeddings V·h + positions 1024·h
    # + head V·h + final norm 2h (vocabulary-parallel over tp 1).
    h, vocab = 1024, 8
    params = 8 * (12 * h * h + 4 * h) + vocab * h + 1024 * h + vocab * h + 2 * h
    c = config(zero_stage=1, micro_batch_size=1, global_batch=8)
    est = predict_step_time(c, cluster(), CAL, shape=SHAPE, engine=MEGATRON_ENGINE)
    expected = 7 / 8 * (4 + 2) * params / (100 * GB)
    assert est.breakdown["dp_comm"] == pytest.approx(expected, rel=1e-9)


def test_recompute_num_layers_recomputes_that_share_of_the_stage():
    base = config(tp_degree=2, micro_batch_size=1, global_batch=4)
    t = {ac: predict_step_time(dataclasses.replace(base, activation_checkpointing=ac,
                                                   ac_layers=layers),
                               cluster(), CAL, shape=SHAPE, engine=MEGATRON_ENGINE)
         .breakdown["compute"] for ac, layers in (("none", None), ("full", None))}
    half = predict_step_time(dataclasses.replace(base, activation_checkpointing="full",
                                                 ac_layers=4), cluster(), CAL, shape=SHAPE,
                             engine=MEGATRON_ENGINE).breakdown["compute"]
    assert half - t["none"] == pytest.approx((t["full"] - t["none"]) / 2, rel=1e-9)
