"""``autotune search --model moe-tiny --world-size 2`` searches the expert-parallel degree with
the other knobs and ends with exports that load in their targets' parsers.

The space file fixes every other knob to one value (ZeRO-3, micro-batch 4, no recomputation), so
the two trials the budget allows are ep 1 and ep 2 (dp 2 either way; ep 2 is carved from it),
and the exports are of whichever was faster; they carry its ep."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from export_loaders import load_torchtitan_module
from test_search_cli import autotune

from autotune.config import TrialConfig
from db import Database

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "export"))
from test_moe_exports import _megatron_moe  # noqa: E402 (Megatron-Core's config of the file)

SPACE = {
    "tp_degree": [1],
    "pp_degree": [1],
    "cp_degree": [1],
    "zero_stage": [3],
    "activation_checkpointing": ["none"],
    "micro_batch_size": [4],
    "bucket_mb": [25],
    "overlap_enabled": [True],
    "dp_replicate": [1],
}


@pytest.mark.slow
def test_a_moe_search_runs_ep_1_and_2_and_exports_the_best_with_its_ep(tmp_path, session_cluster):
    (tmp_path / "space.json").write_text(json.dumps(SPACE))
    proc = autotune(
        "search",
        "--model",
        "moe-tiny",
        "--world-size",
        "2",
        "--trials",
        "2",
        "--patience",
        "2",
        "--top-k",
        "1",
        "--remeasure",
        "0",
        "--timed-steps",
        "2",
        "--space",
        "space.json",
        "--ray-address",
        session_cluster,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "searching 2 valid configurations of moe-tiny on 2 ranks" in proc.stderr
    with Database.open(f"sqlite:///{tmp_path / 'autotune.db'}", create=False) as database:
        stored = database.list_trials(database.get_study("autotune").id)
    assert sorted(t.config["ep_degree"] for t in stored) == [1, 2]
    assert {t.status for t in stored} == {"complete"}
    best = TrialConfig.from_file(tmp_path / "best_config.json")
    ep = best.ep_degree
    titan = load_torchtitan_module(tmp_path)
    assert titan.parallelism.expert_parallel_degree == ep
    assert titan.parallelism.data_parallel_shard_degree == 2
    tc, _ = _megatron_moe(best)
    assert (tc.num_moe_experts, tc.expert_model_parallel_size) == (8, ep)
    ds = json.loads((tmp_path / "ds_config.json").read_text())
    assert ds["train_batch_size"] == best.workload.global_batch_size
    assert ("expert_parallel" in ds) == (ep > 1)
    if ep > 1:
        from deepspeed.module_inject.auto_ep_config import parse_autoep_config

        assert parse_autoep_config(ds["expert_parallel"]).autoep_size == ep
