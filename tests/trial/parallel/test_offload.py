"""Optimizer offload (issue 23, defect 10): what the config allows, what the memory model keeps
on the device, and what the exports say.

Offload is FSDP2's ``CPUOffloadPolicy`` (``trial/parallel/zero.py``): it exists only where FSDP2
wraps the model — ZeRO-2/3 over dp > 1 on CUDA. There, the sharded parameters, their gradients
and AdamW's state live in pinned host memory and the step runs on the CPU; the device holds the
gathered (unsharded) parameters and the unsharded gradients before their reduce-scatter.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from autotune.config import TrialConfig, WorkloadSpec
from autotune.errors import ConfigError
from autotune.export.ds_config import ds_config
from autotune.model.memory import PHASE_FORWARD_BACKWARD, estimate_memory
from autotune.shapes import MODEL_SHAPES
from autotune.trial.parallel.zero import resident

GPT_TINY_PARAMS = 279_680
"""gpt-tiny's Φ, counted by hand in tests/model/test_memory.py (test_zero_stage_scaling...)."""


def _config(**kw) -> TrialConfig:
    kw.setdefault("precision", "32-true")
    kw.setdefault("device", "cuda")
    return TrialConfig(workload=WorkloadSpec(**kw.pop("workload", {})), **kw)


def test_offload_at_dp_1_is_refused_in_one_line():
    # dp 1 trains a plain model with a plain AdamW: nothing would be offloaded, yet the memory
    # model would count the states as host memory. Refused, naming the fix.
    for kw in (dict(world_size=1, zero_stage=3), dict(world_size=2, tp_degree=2, zero_stage=2)):
        with pytest.raises(ConfigError, match="needs dp_degree > 1") as e:
            _config(optimizer_offload_enabled=True, **kw).validate()
        assert "\n" not in str(e.value)
    _config(optimizer_offload_enabled=True, world_size=2, zero_stage=3).validate()


@pytest.mark.parametrize("zero", [2, 3])
def test_offloaded_states_leave_the_device(zero):
    # gpt-tiny, dp 4 (every dim 0 divides 4: shards are exactly Φ/4), 32-true, 16 micro-batches.
    assert MODEL_SHAPES[("gpt", "tiny")].num_params() == GPT_TINY_PARAMS
    base = _config(world_size=4, zero_stage=zero, workload=dict(global_batch_size=64))
    on = estimate_memory(base, device_type="cuda")
    off = estimate_memory(
        dataclasses.replace(base, optimizer_offload_enabled=True), device_type="cuda"
    )
    assert (off.parameters, off.gradients, off.optimizer_state) == (0, 0, 0)
    assert on.gradients == 4 * GPT_TINY_PARAMS // 4  # the fp32 gradient shard, for reference
    assert on.phase == off.phase == PHASE_FORWARD_BACKWARD
    assert off.activations == on.activations
    # While micro-batches accumulate, FSDP2 holds every unsharded fp32 gradient (4Φ) on the
    # device. Without offload part of that was counted as the sharded gradients; with it,
    # nothing is, so the whole 4Φ is a communication buffer: 4Φ/4 more than before.
    assert off.comm_buffers - on.comm_buffers == 4 * GPT_TINY_PARAMS // 4
    assert off.total == on.total - on.parameters - on.optimizer_state


def test_offloaded_step_leaves_no_device_temporaries():
    # The step's temporaries are never the peak under FSDP2 (the gathered parameters outweigh
    # them), so they are read from the term itself: AdamW's single-tensor temporaries are two
    # of the largest tensor (the 512×64 embedding, fp32), and under offload none is on the GPU.
    from autotune.model import memory

    base = _config(world_size=2, zero_stage=2, workload=dict(global_batch_size=2))
    shape = MODEL_SHAPES[("gpt", "tiny")]
    temporaries = [
        memory._optimizer_temporaries(memory._stage(c, shape, 0, "cuda"))
        for c in (base, dataclasses.replace(base, optimizer_offload_enabled=True))
    ]
    assert temporaries == [2 * 4 * 512 * 64, 0]


def test_ds_config_offloads_parameters_where_deepspeed_can():
    three = ds_config(_config(world_size=2, zero_stage=3, optimizer_offload_enabled=True))
    zero = three["zero_optimization"]
    assert zero["offload_optimizer"]["device"] == zero["offload_param"]["device"] == "cpu"
    assert not any("offload" in n for n in three.get("autotune_notes", []))
    two = ds_config(_config(world_size=2, zero_stage=2, optimizer_offload_enabled=True))
    assert "offload_param" not in two["zero_optimization"]  # DeepSpeed: stage 3 only
    assert any("parameters only at ZeRO stage 3" in n for n in two["autotune_notes"])


def test_resident_keeps_only_the_devices_tensors():
    host, elsewhere = torch.zeros(3), torch.zeros(5, device="meta")
    assert [t.numel() for t in resident([host, elsewhere, None], torch.device("meta"))] == [5]
    assert [t.numel() for t in resident([host, elsewhere], torch.device("cpu"))] == [3]
