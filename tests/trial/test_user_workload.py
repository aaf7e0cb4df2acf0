"""A workload defined by the user (tests/user_workload.py) runs under TP, PP and ZeRO and trains
exactly as it does in one process."""

from __future__ import annotations

import pytest
from reference import reference_losses

from autotune.config import TrialConfig, WorkloadSpec

SPEC = WorkloadSpec(workload="user_workload:build", seq_len=16, global_batch_size=8, vocab_size=128)


@pytest.mark.parametrize(
    "layout",
    [
        dict(zero_stage=0, micro_batch_size=2),
        dict(zero_stage=3, micro_batch_size=1, activation_checkpointing="full"),
        dict(tp_degree=2, micro_batch_size=4, activation_checkpointing="selective"),
        dict(pp_degree=2, micro_batch_size=2, pp_schedule="1f1b"),
    ],
    ids=["ddp", "zero3-ac", "tp2-sac", "pp2"],
)
def test_user_workload_matches_single_process(executor, layout):
    config = TrialConfig(
        workload=SPEC,
        world_size=2,
        num_warmup_steps=1,
        num_timed_steps=1,
        num_profiled_steps=0,
        device="cpu",
        **layout,
    )
    result = executor.run(config)
    expected = reference_losses(config, 3)
    assert result.losses == pytest.approx(expected, abs=2e-5)
    assert result.losses[0] != pytest.approx(result.losses[-1], abs=1e-3)
