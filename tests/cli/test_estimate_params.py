"""``estimate --params``: model states from the parameter count alone shard over the ranks
ZeRO shards them over, dp_shard × cp (HSDP replicates across dp_replicate groups; CP ranks
shard with the data-parallel ones), as ``estimate --model`` does."""

from __future__ import annotations

import json

import pytest

from autotune.cli.main import main

PHI = 7_000_000_000


@pytest.mark.parametrize(
    ("extra", "shards"),
    [
        ((), 64),  # dp 64
        (("--dp-replicate", "8"), 8),  # 8 replicas of 8 shards
        (("--cp", "2"), 64),  # dp 32 × cp 2
        (("--cp", "2", "--dp-replicate", "4"), 16),  # dp_shard 8 × cp 2
    ],
)
def test_params_states_shard_over_dp_shard_times_cp(capsys, extra, shards):
    argv = ["estimate", "--params", f"{PHI:.0e}", "--world-size", "64", "--zero", "3"]
    assert main([*argv, "--seq-len", "4096", *extra, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)["per_rank"]
    # ZeRO-3 under mixed precision: fp32 parameters, gradients, master and two moments,
    # 16 bytes per parameter, over the shards (Rajbhandari et al. 2020; FSDP2's fp32 shards)
    assert data["model_states"] == 16 * PHI // shards
