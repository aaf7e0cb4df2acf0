"""The exports of a mixture of experts' layout with expert parallelism load in their targets'
parsers: Megatron-Core's ``TransformerConfig`` (its MoE validation runs on construction),
torchtitan's ConfigManager and ``ParallelDims`` (ep carved from dp_shard × cp × tp), DeepSpeed's
``DeepSpeedConfig`` with its AutoEP section validated by AutoEP's own rules, and Accelerate,
which has no expert-parallel key and says so.

``moe-tiny``: 8 routed experts of width 32, top-2, one shared expert, the first of 4 layers
dense, sigmoid routing with the aux-loss-free bias (coefficient 0.001), no auxiliary loss.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from export_loaders import load_torchtitan_module
from test_every_layout import deepspeed_world  # noqa: F401 (a fixture)
from test_exports import TRAINING_SCRIPT_FLAGS, _megatron_namespace

from autotune.config import TrialConfig, WorkloadSpec
from autotune.export.ds_config import ds_config
from autotune.export.megatron import megatron_text
from autotune.export.trainers import accelerate_yaml, torchtitan_module

MOE = WorkloadSpec(family="moe", size="tiny", seq_len=16, global_batch_size=8)
# world 8: tp 2 × dp 4 (ZeRO-3), ep 4 carved from dp_shard × tp = 8, efsdp 2
EP4 = TrialConfig(workload=MOE, world_size=8, tp_degree=2, zero_stage=3, ep_degree=4)
EP2 = TrialConfig(workload=MOE, world_size=2, ep_degree=2)  # DDP, dp 2 = ep 2
# Megatron-LM's training script renames these into the core config (core_transformer_config_
# from_args: num_experts is num_moe_experts; --moe-layer-freq's string is a Python list).
RENAMED = {"num_experts": "num_moe_experts"}


def _megatron_moe(config: TrialConfig):
    pytest.importorskip("megatron.core")
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.transformer.transformer_config import TransformerConfig

    args = _megatron_namespace(megatron_text(config))
    args = {RENAMED.get(k, k): v for k, v in args.items()}
    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    ddp = {f.name for f in dataclasses.fields(DistributedDataParallelConfig)}
    assert not set(args) - fields - ddp - TRAINING_SCRIPT_FLAGS, args
    core = {k: v for k, v in args.items() if k in fields}
    for k, v in core.items():
        if isinstance(v, str) and v.replace(".", "", 1).isdigit():
            core[k] = float(v) if "." in v else int(v)
    core["moe_layer_freq"] = eval(args["moe_layer_freq"], {})  # noqa: S307 (Megatron's own parse)
    core["gated_linear_unit"] = True
    return TransformerConfig(**core), args


@pytest.mark.parametrize("config", [EP4, EP2], ids=["ep4-tp2-z3", "ep2-ddp"])
def test_megatron_moe_flags_build_megatron_cores_config(config):
    tc, args = _megatron_moe(config)
    assert (tc.num_moe_experts, tc.moe_router_topk, tc.moe_ffn_hidden_size) == (8, 2, 32)
    assert tc.moe_shared_expert_intermediate_size == 32
    assert (tc.expert_model_parallel_size, tc.expert_tensor_parallel_size) == (
        config.ep_degree,
        1,
    )
    assert tc.tensor_model_parallel_size == config.tp_degree
    assert tc.moe_token_dispatcher_type == "alltoall" and tc.moe_grouped_gemm
    assert tc.moe_router_score_function == "sigmoid" and tc.moe_router_enable_expert_bias
    assert tc.moe_router_bias_update_rate == 0.001
    assert tc.moe_router_load_balancing_type == "none"
    assert tc.moe_expert_capacity_factor is None  # dropless, as the trial
    assert tc.moe_layer_freq == [0, 1, 1, 1]  # the first layer dense
    sp_note = "Megatron wants --sequence-parallel" in megatron_text(config)
    assert sp_note == (config.tp_degree > 1)


def test_a_dense_layout_writes_no_moe_flag():
    text = megatron_text(TrialConfig(device="cpu"))
    assert "--num-experts" not in text and "--expert-model-parallel-size" not in text


def test_torchtitan_loads_the_expert_parallel_degree(tmp_path):
    pytest.importorskip("torchtitan")
    from torchtitan.distributed.parallel_dims import ParallelDims

    (tmp_path / "torchtitan_config.py").write_text(torchtitan_module(EP4))
    titan = load_torchtitan_module(tmp_path)
    p = titan.parallelism
    assert p.expert_parallel_degree == 4 and p.tensor_parallel_degree == 2
    assert (p.data_parallel_replicate_degree, p.data_parallel_shard_degree) == (1, 4)
    assert titan.training.disable_cuda_graphs  # refused with the all-to-all dispatcher
    dims = ParallelDims(dp_replicate=1, dp_shard=4, cp=1, tp=2, pp=1, ep=4, world_size=8)
    assert dims.ep_enabled


@pytest.mark.parametrize("config", [EP4, EP2], ids=["ep4-tp2-z3", "ep2-ddp"])
def test_ds_config_expert_parallel_parses_and_passes_autoeps_rules(
    tmp_path,
    deepspeed_world,  # noqa: F811
    config,
):
    from deepspeed.module_inject.auto_ep_config import validate_autoep_config

    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(ds_config(config)))
    parsed = deepspeed_world(path, config.world_size, config.pp_degree)
    ep = parsed.expert_parallel_config
    assert ep.enabled and ep.autoep_size == config.ep_degree
    assert (ep.expert_tensor_parallel_size, ep.comm_backend, ep.top_k) == (1, "comm", 2)
    validate_autoep_config(
        ep,
        world_size=config.world_size,
        pp_size=1,
        tp_size=config.tp_degree,
        sp_size=1,
        zero_stage=config.zero_stage,
    )
    notes = " ".join(json.loads(path.read_text())["autotune_notes"])
    assert "moe-tiny is none of them" in notes and "load_balance_coeff 0.001" in notes


def test_accelerate_says_it_has_no_expert_parallel_key():
    text = accelerate_yaml(EP4, "TransformerBlock")
    notes = [line for line in text.splitlines() if line.startswith("#")]
    assert any("expert parallelism ep 4 has no Accelerate key" in n for n in notes)
    assert "ep_size=4" in text
    body = [line for line in text.splitlines() if not line.startswith("#")]
    assert not any("expert" in line for line in body)
