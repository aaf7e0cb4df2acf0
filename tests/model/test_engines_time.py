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
CAL = Calibration(
    compute_efficiency=0.5,
    gemm_half_dim=0.0,
    elementwise_bytes=20.0,
    elementwise_sharded_bytes=0.0,
    score_bytes=0.0,
    layer_overhead_s=0.0,
    collective_overhead_s=0.0,
    overlap_efficiency=0.5,
    optimizer_bytes_per_param=0.0,
)


def cluster(per_node: int = 8) -> ClusterSpec:
    return ClusterSpec(
        name="flat",
        devices_per_node=per_node,
        device=DeviceSpec(
            name="dev",
            peak_flops=dict.fromkeys(("float32", "float16", "bfloat16"), 100e12),
            memory_bandwidth_gbs=1000.0,
            memory_gib=80.0,
        ),
        intra_node=LinkSpec(bandwidth_gbs=100.0, latency_us=0.0),
        inter_node=LinkSpec(bandwidth_gbs=25.0, latency_us=0.0),
    )


def config(**kw) -> TrialConfig:
    workload = WorkloadSpec(
        seq_len=512,
        global_batch_size=kw.pop("global_batch", 8),
        workload="test:shape",
        vocab_size=8,
    )
    return TrialConfig(
        workload=workload,
        **{
            "world_size": 8,
            "overlap_enabled": False,
            "device": "cuda",
            "precision": "bf16-mixed",
            **kw,
        },
    )


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
    on = predict_step_time(
        dataclasses.replace(c, sequence_parallel=True), cluster(), CAL, shape=SHAPE, engine=plain
    )
    m = c.grad_accum_steps
    saved = 8 * 3 * m * 20 * (1 - 1 / 4) * 512 * 1024 * 2 / (1000 * GB)
    assert off.breakdown["compute"] - on.breakdown["compute"] == pytest.approx(saved, rel=1e-9)
    assert on.breakdown["tp_comm"] == off.breakdown["tp_comm"]


def test_tp_comm_overlap_hides_its_share_times_the_overlap_efficiency():
    c = config(tp_degree=4, micro_batch_size=1, global_batch=4)
    exposed = predict_step_time(
        c,
        cluster(),
        CAL,
        shape=SHAPE,
        engine=dataclasses.replace(MEGATRON_ENGINE, tp_comm_overlap=0.0),
    ).breakdown["tp_comm"]
    hidden = predict_step_time(c, cluster(), CAL, shape=SHAPE, engine=MEGATRON_ENGINE).breakdown[
        "tp_comm"
    ]
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
    t = {
        ac: predict_step_time(
            dataclasses.replace(base, activation_checkpointing=ac, ac_layers=layers),
            cluster(),
            CAL,
            shape=SHAPE,
            engine=MEGATRON_ENGINE,
        ).breakdown["compute"]
        for ac, layers in (("none", None), ("full", None))
    }
    half = predict_step_time(
        dataclasses.replace(base, activation_checkpointing="full", ac_layers=4),
        cluster(),
        CAL,
        shape=SHAPE,
        engine=MEGATRON_ENGINE,
    ).breakdown["compute"]
    assert half - t["none"] == pytest.approx((t["full"] - t["none"]) / 2, rel=1e-9)


# ---- the newer knobs' time terms -------------------------------------------------------------
TITAN = engine_traits("torchtitan")


def test_context_parallelism_all_gathers_k_and_v_and_reduce_scatters_their_gradients():
    # cp 2 inside a node (100 GB/s): per layer per micro-batch an all-gather of b·s·2·kv bf16
    # (1/2 · S / bw) forward and a reduce-scatter of their gradients backward (no recompute).
    c = config(cp_degree=2, micro_batch_size=1, global_batch=4)
    est = predict_step_time(c, cluster(), CAL, shape=SHAPE, engine=MEGATRON_ENGINE)
    one = 1 / 2 * 512 * 2 * 1024 * 2 / (100 * GB)
    assert est.breakdown["tp_comm"] == pytest.approx(c.grad_accum_steps * 8 * 2 * one, rel=1e-9)


def test_hsdp_reduce_scatters_in_its_shard_group_and_all_reduces_across_replicas():
    # dp 8 as 2 replicas × 4 shards, ZeRO-2, torchtitan (fp32 reduction, bf16 gathers), one
    # micro-batch, overlap off: reduce-scatter of 4Φ over 4 (3/4 · 4Φ / bw), all-reduce of the
    # shard 4Φ/4 over 2 (2 · 1/2 · Φ / bw), all-gather of 2Φ over 4 (3/4 · 2Φ / bw); Φ: 8
    # layers (12h² + 4h), embeddings and head V·h each (vocabulary-parallel, tp 1), positions
    # 1024·h, final norm 2h.
    h, vocab = 1024, 8
    params = 8 * (12 * h * h + 4 * h) + 2 * vocab * h + 1024 * h + 2 * h
    c = config(zero_stage=2, dp_replicate=2, micro_batch_size=1, global_batch=8)
    est = predict_step_time(c, cluster(), CAL, shape=SHAPE, engine=TITAN)
    expected = (3 / 4 * 4 * params + params + 3 / 4 * 2 * params) / (100 * GB)
    assert est.breakdown["dp_comm"] == pytest.approx(expected, rel=1e-9)


def test_float8_runs_the_linears_at_the_float8_peak_and_pays_its_casts():
    from autotune.model.perf_model import FLOAT8_CAST_BYTES

    fp8 = dataclasses.replace(
        cluster(),
        device=dataclasses.replace(
            cluster().device, peak_flops={**cluster().device.peak_flops, "float8": 200e12}
        ),
    )
    c = config(micro_batch_size=1, global_batch=8)
    bf16 = predict_step_time(c, fp8, CAL, shape=SHAPE, engine=MEGATRON_ENGINE)
    f8 = predict_step_time(
        dataclasses.replace(c, float8=True), fp8, CAL, shape=SHAPE, engine=MEGATRON_ENGINE
    )
    # One layer's GEMMs: 2 · 512 · 12h² FLOPs forward, ×3 with backward, at 0.5 of the peak;
    # casts: per GEMM m·k + 2·k·n + m·n elements at 5 B over 1000 GB/s.
    h, m_ = 1024, 512
    flops = 3 * 2 * m_ * 12 * h * h
    gemms = [(m_, 3 * h, h), (m_, h, h), (m_, 4 * h, h), (m_, h, 4 * h)]
    casts = FLOAT8_CAST_BYTES * sum(m * k + 2 * k * n + m * n for m, n, k in gemms) / 1e12
    per_layer = flops / (0.5 * 100e12) - flops / (0.5 * 200e12) - casts
    assert bf16.breakdown["compute"] - f8.breakdown["compute"] == pytest.approx(
        8 * per_layer, rel=1e-9
    )
    # Without a float8 peak (an A100-like device) the flag changes nothing.
    same = predict_step_time(
        dataclasses.replace(c, float8=True), cluster(), CAL, shape=SHAPE, engine=MEGATRON_ENGINE
    )
    assert same.breakdown["compute"] == bf16.breakdown["compute"]


def test_compile_fuses_torchtitans_eager_elementwise_bytes_down_to_the_fused_count():
    c = config(micro_batch_size=1, global_batch=8)
    eager = predict_step_time(c, cluster(), CAL, shape=SHAPE, engine=TITAN)
    compiled = predict_step_time(
        dataclasses.replace(c, compile=True), cluster(), CAL, shape=SHAPE, engine=TITAN
    )
    # 8 layers × 3 passes × (factor 4 − 1) × 20 B × b·s·h × 2 B ÷ 1000 GB/s.
    saved = 8 * 3 * (TITAN.elementwise_factor - 1) * 20 * 512 * 1024 * 2 / (1000 * GB)
    assert eager.breakdown["compute"] - compiled.breakdown["compute"] == pytest.approx(
        saved, rel=1e-9
    )
