"""``autotune estimate`` and ``rank`` price a mixture of experts: the MoE rows of the step's
breakdown (the routed experts' compute, the dispatch and combine all-to-alls) for a tiny
DeepSeek-V3 config (MLA, a shared expert, leading dense layers), expert-parallel layouts
ranked for the built-in moe-tiny, and one line for a mixture of experts the cost model does
not describe. Nothing here runs a trial."""

from __future__ import annotations

import json

import pytest

from autotune.cli.main import main
from autotune.model.perf_model import ALL_TERMS

pytest.importorskip("transformers")  # the hf extra; CI installs it

from testkit.hf_families import write_tiny  # noqa: E402

ESTIMATE = [
    "estimate",
    "--engine",
    "megatron",
    "--cluster",
    "h100-sxm",
    "--world-size",
    "16",
    "--tp",
    "2",
    "--sp",
    "--pp",
    "2",
    "--schedule",
    "interleaved_1f1b",
    "--virtual-stages",
    "2",
    "--ep",
    "4",
    "--micro-batch",
    "1",
    "--global-batch",
    "8",
    "--seq-len",
    "64",
]


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory) -> str:
    # 8 experts, top-2, MLA, a shared expert and one leading dense layer
    overrides = dict(n_routed_experts=8, num_experts_per_tok=2, first_k_dense_replace=1)
    return str(write_tiny("deepseek_v3", tmp_path_factory.mktemp("deepseek_v3"), **overrides))


def test_estimate_prints_the_moe_terms(capsys, deepseek):
    assert main([*ESTIMATE, "--model", f"hf:{deepseek}"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[-3] for line in out.splitlines() if line.strip().endswith("%")}
    assert {"experts", "ep_alltoall", "compute"} <= rows, out
    assert "predicted step" in out

    assert main([*ESTIMATE, "--model", f"hf:{deepseek}", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    time = report["time"]
    assert list(time["breakdown"]) == list(ALL_TERMS)
    assert sum(time["breakdown"].values()) == pytest.approx(time["step_time_s"])
    assert time["breakdown"]["experts"] > 0 and time["breakdown"]["ep_alltoall"] > 0


def test_an_undescribed_mixture_of_experts_is_one_line(capsys, tmp_path):
    write_tiny("granitemoe", tmp_path, num_local_experts=4)
    assert main(["estimate", "--model", f"hf:{tmp_path}", "--world-size", "2"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert "mixture of experts (granitemoe, num_local_experts 4)" in captured.err
    assert "deepseek_v3" in captured.err  # the ones it describes


def test_rank_scores_expert_parallel_layouts_of_moe_tiny(capsys):
    argv = ["rank", "--model", "moe-tiny", "--cluster", "h100-sxm", "--nodes", "1"]
    argv += ["--global-batch", "8", "--seq-len", "64", "--top", "100000", "--json"]
    assert main(argv) == 0
    layouts = json.loads(capsys.readouterr().out)["layouts"]
    by_ep = {}
    for row in layouts:
        by_ep.setdefault(row["config"]["ep_degree"], []).append(row["breakdown"])
    # ep divides moe-tiny's 8 experts and the ranks it is carved from (dp_shard × cp × tp).
    assert set(by_ep) == {1, 2, 4, 8}, sorted(by_ep)
    assert all(b["ep_alltoall"] == 0 for b in by_ep[1])
    assert all(b["ep_alltoall"] > 0 and b["experts"] > 0 for b in by_ep[8])
