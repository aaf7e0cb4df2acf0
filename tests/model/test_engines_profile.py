"""One profile per engine (``engines.EngineProfile``): its time traits and its memory part,
autotune's own runtime a preset like the others."""

from __future__ import annotations

import dataclasses

import pytest

from autotune.config import TrialConfig, WorkloadSpec
from autotune.model.engine_memory import MEMORY_TRAITS, estimate_engine_memory
from autotune.model.engines import AUTOTUNE_MEMORY, ENGINE_NAMES, TORCHTITAN, engine_traits
from autotune.model.memory import estimate_memory


def _config(**kw) -> TrialConfig:
    spec = WorkloadSpec(family="llama", size="7b", seq_len=4096, global_batch_size=64)
    kw.setdefault("zero_stage", 3)
    return TrialConfig(
        workload=spec, world_size=64, micro_batch_size=1, precision="bf16-mixed", **kw
    )


@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_every_engine_has_one_profile_with_its_memory_part(name):
    profile = engine_traits(name)
    assert profile.memory.name == name
    assert MEMORY_TRAITS[name] in (None, profile.memory)  # None: the CLI's own-runtime branch
    assert profile.memory.own_runtime == (name == "autotune")


def test_autotunes_memory_preset_is_its_own_runtimes_estimate():
    config = _config(dp_replicate=8)
    assert estimate_engine_memory(config, None, AUTOTUNE_MEMORY) == estimate_memory(
        config, device_type="cuda"
    )


def test_torchtitan_keeps_its_units_gathered_under_a_pipeline():
    # torchtitan's reshard_after_forward 'default' is `not pp_enabled`: under pp 2 every block
    # of the stage stays gathered (bf16) from its forward through its backward.
    config = _config(pp_degree=2, activation_checkpointing="full")
    kept = estimate_engine_memory(config, None, TORCHTITAN).comm_buffers
    resharded = dataclasses.replace(TORCHTITAN, reshard_under_pp=True)
    two = estimate_engine_memory(config, None, resharded).comm_buffers
    block = 4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096  # Llama-7B's block, 16 per stage
    assert kept - two == (16 - 2) * block * 2
