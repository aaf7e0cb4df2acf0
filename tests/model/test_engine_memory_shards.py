"""Model states per rank under HSDP, CP and CP × HSDP, for every engine, against bytes computed by
hand: each engine shards them over the group its code shards them over (``MemoryTraits.
state_shards``): torchtitan's FSDP over dp_shard × cp, Megatron's distributed optimizer over
dp × cp within one of its dp_replicate instances, DeepSpeed's ZeRO over dp × cp."""

from __future__ import annotations

import pytest

from autotune.config import TrialConfig, WorkloadSpec
from autotune.model.engine_memory import DEEPSPEED, MEGATRON, TORCHTITAN, estimate_engine_memory
from autotune.model.memory import estimate_memory

PHI = 6_738_415_616
"""Llama-7B's parameters: 32 × (4·4096² + 3·4096·11008 + 2·4096) + 2·32000·4096 + 4096."""
TENSORS = 32 * 9 + 3
"""Its parameter tensors (AdamW's 4-byte step counter each): 2 norms and 7 Linears per block;
the embedding, the final norm and the head."""
WORLD = 64
LAYOUTS = {  # (dp_replicate, cp): dp = 64 / cp
    "fsdp": (1, 1),
    "hsdp 8": (8, 1),
    "cp 2": (1, 2),
    "cp 2 × hsdp 4": (4, 2),
}


def _config(dp_replicate: int, cp: int, zero: int = 3) -> TrialConfig:
    spec = WorkloadSpec(family="llama", size="7b", seq_len=4096, global_batch_size=64)
    return TrialConfig(
        workload=spec,
        world_size=WORLD,
        zero_stage=zero,
        micro_batch_size=1,
        activation_checkpointing="full",
        precision="bf16-mixed",
        dp_replicate=dp_replicate,
        cp_degree=cp,
    )


def _states(est) -> tuple[int, int, int]:
    return est.parameters, est.gradients, est.optimizer_state


def _fsdp_by_hand(n: int) -> tuple[int, int, int]:
    # FSDP2 under bf16-mixed: fp32 shards of parameters and gradients, two fp32 moments, over n
    # ranks (every Llama-7B dimension divides by 8, 16 and 64: no padding), one step counter
    # per tensor.
    return 4 * PHI // n, 4 * PHI // n, 8 * PHI // n + 4 * TENSORS


@pytest.mark.parametrize("name", LAYOUTS)
def test_fsdp_shards_over_dp_shard_times_cp_in_autotune_and_torchtitan(name):
    dp_replicate, cp = LAYOUTS[name]
    config = _config(dp_replicate, cp)
    n = (WORLD // cp // dp_replicate) * cp  # dp_shard × cp
    expected = _fsdp_by_hand(n)
    assert _states(estimate_memory(config, device_type="cuda")) == expected
    assert _states(estimate_engine_memory(config, None, TORCHTITAN)) == expected


@pytest.mark.parametrize("name", LAYOUTS)
def test_megatron_shards_its_optimizer_over_dp_times_cp_per_instance(name):
    dp_replicate, cp = LAYOUTS[name]
    n = (WORLD // cp // dp_replicate) * cp
    # bf16 parameters and fp32 main gradients whole; fp32 master and two moments (12 bytes)
    # sharded over the instance's dp × cp ranks.
    expected = (2 * PHI, 4 * PHI, -(-12 * PHI // n))
    assert _states(estimate_engine_memory(_config(dp_replicate, cp), None, MEGATRON)) == (expected)


@pytest.mark.parametrize("name", LAYOUTS)
def test_deepspeed_zero3_shards_over_all_of_dp_times_cp(name):
    dp_replicate, cp = LAYOUTS[name]
    n = WORLD  # dp × cp: the replica groups do not reach DeepSpeed
    # ZeRO-3: 16-bit parameters and gradients, the fp32 master and moments, all over n.
    expected = (2 * PHI // n, 2 * PHI // n, -(-12 * PHI // n))
    assert _states(estimate_engine_memory(_config(dp_replicate, cp), None, DEEPSPEED)) == expected


def test_hsdp_grows_torchtitans_states_eightfold_and_cp_lowers_its_peak():
    fsdp, hsdp = (estimate_engine_memory(_config(r, 1), None, TORCHTITAN) for r in (1, 8))
    steps = 4 * TENSORS  # the step counters are per tensor, not sharded
    assert sum(_states(hsdp)) - steps == 8 * (sum(_states(fsdp)) - steps)
    cp2 = estimate_engine_memory(_config(1, 2), None, TORCHTITAN)
    assert cp2.total < fsdp.total


@pytest.mark.parametrize("traits", [TORCHTITAN, MEGATRON, DEEPSPEED], ids=lambda t: t.name)
def test_each_rank_keeps_the_activations_of_s_over_cp_tokens(traits):
    # Full recomputation: every kept tensor (block inputs, the loss's logits) scales with the
    # rank's b·s/cp tokens, so cp 2 halves them.
    one, two = (estimate_engine_memory(_config(1, cp), None, traits) for cp in (1, 2))
    assert two.activations * 2 == one.activations
