"""The step-time model's mixture-of-experts terms (``model/moe_time.py``, called by
``perf_model``): the dispatch and combine all-to-alls of one layout against a hand count over
the cluster's links, the experts' FLOPs and the active parameters against counts made here
(from the spec's sizes, and from the model transformers builds), the MoE layers per pipeline
rank against the stages' layer ranges, and MLA's GEMMs against its built tensors."""

from __future__ import annotations

import dataclasses

import pytest

from autotune.config import TrialConfig, WorkloadSpec
from autotune.model import moe_time, roofline
from autotune.model.cluster import GB, load_cluster
from autotune.model.perf_model import (
    ALL_TERMS,
    MEGATRON_ENGINE,
    TERMS,
    Calibration,
    predict_step_time,
)
from autotune.moe import MoESpec
from autotune.shapes import ModelShape, stage_layer_range

SPEC = MoESpec(64, 4, 512, num_shared_experts=1, first_dense_layers=1)
SHAPE = ModelShape("llama", 8, 1024, 8, 8, 2048, 1000, 4096, moe=SPEC)
H, F, E, K = 1024, 512, 64, 4
WORKLOAD = WorkloadSpec(family="moe", size="tiny", seq_len=4096, global_batch_size=16)
"""moe-tiny's workload; the shape priced is SHAPE (passed to the model)."""


def _config(**kw) -> TrialConfig:
    layout = {"world_size": 32, "tp_degree": 2, "ep_degree": 16, "micro_batch_size": 1, **kw}
    return TrialConfig(workload=WORKLOAD, device="cuda", precision="bf16-mixed", **layout)


def _predict(config: TrialConfig):
    cluster = load_cluster("h100-sxm", nodes=4)
    return cluster, predict_step_time(config, cluster, shape=SHAPE, engine=MEGATRON_ENGINE)


@pytest.mark.parametrize(("ac", "per_layer"), [("none", 4), ("full", 6)])
def test_alltoall_bytes_and_time_match_a_hand_count(ac, per_layer):
    cluster, t = _predict(_config(activation_checkpointing=ac))
    cal = Calibration.for_cluster(cluster)
    tokens = 4096 // 2  # b·s over the TP pair the tokens are split across
    nbytes = tokens * K * H * 2  # top_k copies of each token's h bf16 values
    ml = moe_time.moe_layout(SHAPE, microbatch_tokens=4096, tp=2, ep=16)
    assert moe_time.dispatch_bytes(SHAPE, ml, 2) == nbytes == 16 * 2**20
    # ep 16 over nodes of 8: 7/16 of the bytes to the node's other 7 ranks over NVLink, 8/16
    # to the other node, all 8 ranks of a node at once through its 8 NICs.
    eff = cal.comm_efficiency
    nvlink = 7 / 16 * nbytes / (cluster.intra_node.busbw(nbytes, 8) * eff)
    nic = cluster.inter_node
    network = nic.latency_us * 1e-6 + 8 * 8 / 16 * nbytes / (nic.bandwidth_gbs * GB * eff)
    assert network > nvlink
    one = max(nvlink, network)
    assert moe_time.alltoall_time(cluster, eff, 16, nbytes) == pytest.approx(one)
    # 7 MoE layers (the first is dense), one micro-batch, the busiest rank at 1.25× its share,
    # each all-to-all's launch beside it.
    expected = 7 * per_layer * (one * 1.25 + cal.collective_overhead_s)
    assert t.breakdown["ep_alltoall"] == pytest.approx(expected, rel=1e-12)


def test_alltoall_inside_a_node_takes_nvlink_only():
    cluster, t = _predict(_config(ep_degree=8))
    cal = Calibration.for_cluster(cluster)
    nbytes = 2048 * K * H * 2
    nvlink = 7 / 8 * nbytes / (cluster.intra_node.busbw(nbytes, 8) * cal.comm_efficiency)
    assert moe_time.alltoall_time(cluster, cal.comm_efficiency, 8, nbytes) == pytest.approx(nvlink)
    assert predict_step_time(_config(ep_degree=1), cluster, shape=SHAPE).breakdown[
        "ep_alltoall"
    ] == (0.0)


def test_tokens_per_expert_and_expert_flops_follow_the_spec():
    ml = moe_time.moe_layout(SHAPE, microbatch_tokens=4096, tp=2, ep=16)
    # The ep group's 16 × 2048 tokens, top-4 each, over 64 experts; 4 of them on the rank.
    assert (ml.tokens_per_expert, ml.local_experts, ml.allowance) == (2048, 4, 1.25)
    swiglu = 3 * F * H  # w1, w3: h → f; w2: f → h
    routed = 2 * 2048 * K * swiglu  # the rank's experts see tokens · top_k rows, evenly
    router = 2 * 2048 * E * H
    assert moe_time.expert_flops(SHAPE, ml) == routed + router
    gemms = moe_time.expert_gemms(SHAPE, ml)
    assert sum(2 * g.m * g.n * g.k for g in gemms) == pytest.approx(1.25 * 2 * 2048 * swiglu)


def test_capacity_factor_caps_the_allowance():
    capped = dataclasses.replace(SHAPE, moe=dataclasses.replace(SPEC, capacity_factor=1.1))
    assert moe_time.moe_layout(capped, microbatch_tokens=4096, tp=1, ep=4).allowance == 1.1


def test_breakdown_holds_the_moe_terms_and_sums_to_the_step():
    _, t = _predict(_config(zero_stage=1, pp_degree=2, ep_degree=8))
    assert list(t.breakdown) == list(ALL_TERMS)
    assert sum(t.breakdown.values()) == pytest.approx(t.step_time_s)
    assert t.breakdown["experts"] > 0 and t.breakdown["ep_alltoall"] > 0
    dense = TrialConfig(
        workload=WorkloadSpec(family="llama", size="7b", seq_len=4096, global_batch_size=16),
        world_size=32,
        tp_degree=2,
    )
    assert list(predict_step_time(dense, load_cluster("h100-sxm", nodes=4)).breakdown) == list(
        TERMS
    )


@pytest.mark.parametrize(
    ("layers", "pp", "v", "first"), [(61, 8, 4, 3), (8, 2, 1, 1), (7, 3, 2, 5)]
)
def test_moe_layers_per_rank_follow_the_stages(layers, pp, v, first):
    shape = dataclasses.replace(
        SHAPE, num_layers=layers, moe=dataclasses.replace(SPEC, first_dense_layers=first)
    )
    expected = [0] * pp
    for stage in range(pp * v):
        expected[stage % pp] += sum(i >= first for i in stage_layer_range(layers, stage, pp * v))
    assert list(moe_time.rank_moe_layers(shape, pp, v)) == expected


def test_expert_data_parallel_group():
    # Megatron's EDP = world / (ETP · EP · PP), ETP 1.
    assert moe_time.expert_data_parallel(1024, 8, 64) == 2
    assert moe_time.expert_data_parallel(32, 1, 16) == 2


# ---- against the model transformers builds ---------------------------------------------------
TINY = {
    # 8 experts, top-2; DeepSeek-V3 with MLA, a shared expert and one leading dense layer.
    "deepseek_v3": dict(n_routed_experts=8, num_experts_per_tok=2, first_k_dense_replace=1),
    "qwen3_moe": dict(num_experts=8, num_experts_per_tok=2),
}


@pytest.fixture(scope="module")
def hf_models(tmp_path_factory):
    """(config, saved folder) of a tiny DeepSeek-V3 and a tiny Qwen3-MoE."""
    pytest.importorskip("transformers")  # the hf extra; CI installs it
    from testkit.hf_families import tiny_config

    out = {}
    for name, overrides in TINY.items():
        path = tmp_path_factory.mktemp(name)
        config = tiny_config(name, **overrides)
        config.save_pretrained(path)
        out[name] = (config, str(path))
    return out


@pytest.mark.parametrize("name", ["deepseek_v3", "qwen3_moe"])
def test_active_params_match_the_built_model(hf_models, name):
    torch = pytest.importorskip("torch")
    import transformers

    from autotune.hf_config import hf_shape

    config, path = hf_models[name]
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    # A token passes through every tensor but the routed experts' stacked [E, …] weights, of
    # which it uses top_k of E.
    params = list(model.parameters())
    experts = sum(p.numel() for p in params if p.dim() == 3)
    others = sum(p.numel() for p in params if p.dim() != 3)
    active = others + experts * config.num_experts_per_tok / 8
    assert moe_time.active_params(hf_shape(path), config.vocab_size) == pytest.approx(active)


def test_mla_gemms_match_the_built_attention(hf_models):
    from autotune.hf_config import hf_shape

    shape = hf_shape(hf_models["deepseek_v3"][1])
    # Each of the attention's matrices multiplies each token once: 2 FLOPs per element.
    attention = sum(t.numel for t in shape.layer_tensors(0) if "self_attn" in t.name and t.cols > 1)
    gemms = roofline.mla_gemms(shape, tokens=10, tp=1)
    assert sum(2 * g.m * g.n * g.k for g in gemms) == 2 * 10 * attention
