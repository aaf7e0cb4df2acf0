"""``autotune estimate --cluster``: the predicted step time beside the memory, and one clear line
for each bad cluster input."""

from __future__ import annotations

import dataclasses
import json

import pytest

from autotune.cli.main import main
from autotune.config import TrialConfig, WorkloadSpec
from autotune.model.cluster import load_cluster
from autotune.model.perf_model import (
    MEGATRON_ENGINE,
    TERMS,
    Calibration,
    predict_step_time,
)
from autotune.shapes import ModelShape

LLAMA_70B = (
    "--model",
    "llama-70b",
    "--world-size",
    "512",
    "--tp",
    "8",
    "--pp",
    "8",
    "--zero",
    "2",
    "--micro-batch",
    "1",
    "--global-batch",
    "1024",
    "--seq-len",
    "4096",
    "--dtype",
    "bfloat16",
)


def _llama_70b_config() -> TrialConfig:
    return TrialConfig(
        workload=WorkloadSpec(
            family="llama", size="70b", seq_len=4096, global_batch_size=1024, dtype="bfloat16"
        ),
        world_size=512,
        tp_degree=8,
        pp_degree=8,
        zero_stage=2,
        micro_batch_size=1,
    )


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["estimate", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_json_time_is_the_models_prediction(capsys):
    code, out, _ = _run(capsys, *LLAMA_70B, "--cluster", "a100-sxm4-80gb", "--json")
    assert code == 0
    data = json.loads(out)
    # 512 ranks on nodes of 8: 64 nodes unless --nodes says otherwise.
    cluster = load_cluster("a100-sxm4-80gb", nodes=64)
    expected = predict_step_time(_llama_70b_config(), cluster, Calibration.for_cluster(cluster))
    assert data["cluster"] == "a100-sxm4-80gb" and data["nodes"] == 64
    assert data["time"] == json.loads(json.dumps(expected.as_dict()))
    assert set(data["time"]["breakdown"]) == set(TERMS)
    # The same --nodes stated explicitly gives the same answer.
    code, out, _ = _run(
        capsys, *LLAMA_70B, "--cluster", "a100-sxm4-80gb", "--nodes", "64", "--json"
    )
    assert code == 0 and json.loads(out)["time"] == data["time"]


def test_cluster_file_brings_its_calibration_and_explicit_shape(capsys, tmp_path):
    calibration = {"compute_efficiency": 0.35, "layer_overhead_s": 5e-5}
    spec = dataclasses.replace(load_cluster("h100-sxm"), calibration=calibration)
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(spec.to_dict()))
    code, out, _ = _run(
        capsys,
        "--num-layers",
        "6",
        "--hidden-size",
        "512",
        "--num-heads",
        "8",
        "--seq-len",
        "256",
        "--vocab-size",
        "1000",
        "--world-size",
        "4",
        "--tp",
        "2",
        "--global-batch",
        "16",
        "--dtype",
        "bfloat16",
        "--cluster",
        str(path),
        "--json",
    )
    assert code == 0
    data = json.loads(out)
    shape = ModelShape("gpt", 6, 512, 8, 8, 2048, 1000, 256)
    config = TrialConfig.from_dict(data["config"])
    assert (config.world_size, config.tp_degree, config.grad_accum_steps) == (4, 2, 8)
    expected = predict_step_time(
        config, spec.with_nodes(1), Calibration(**calibration), shape=shape
    )
    assert data["time"] == json.loads(json.dumps(expected.as_dict()))
    # The defaults would predict something else: the stored calibration was used.
    assert (
        data["time"]["step_time_s"]
        != predict_step_time(config, spec.with_nodes(1), Calibration(), shape=shape).step_time_s
    )


def test_table_shows_each_term_beside_the_memory(capsys):
    code, out, _ = _run(capsys, *LLAMA_70B, "--cluster", "a100-sxm4-80gb")
    assert code == 0
    expected = predict_step_time(_llama_70b_config(), load_cluster("a100-sxm4-80gb", nodes=64))
    lines = out.splitlines()
    for term in TERMS:
        row = next(ln for ln in lines if f" {term} " in ln)
        assert "GiB" in row or "MiB" in row or "----" in row  # beside a memory row
        seconds, share = row.split()[-2:]
        assert float(seconds) == pytest.approx(expected.breakdown[term], abs=1e-4)
        assert float(share.rstrip("%")) == pytest.approx(
            100 * expected.breakdown[term] / expected.step_time_s, abs=0.05
        )
    assert f"{expected.tokens_per_s:,.0f} tokens/s" in out
    assert f"MFU {expected.mfu:.1%}" in out and "64 nodes × 8 A100-SXM4-80GB" in out


def test_engine_time_comes_first_and_autotunes_after(capsys):
    code, out, _ = _run(capsys, *LLAMA_70B, "--cluster", "a100-sxm4-80gb", "--engine", "megatron")
    assert code == 0
    cluster = load_cluster("a100-sxm4-80gb", nodes=64)
    config = dataclasses.replace(_llama_70b_config(), precision="bf16-true")  # --dtype bfloat16
    calibration = Calibration.for_cluster(cluster)
    megatron = predict_step_time(config, cluster, calibration, engine=MEGATRON_ENGINE)
    own = predict_step_time(config, cluster, calibration)
    lines = out.splitlines()
    titles = [ln.split(":")[0] for ln in lines if "predicted step time on a100-sxm4-80gb" in ln]
    assert titles == ["as megatron runs it (allocated bytes)", "autotune's own runtime"]
    steps = [float(ln.split()[-2]) for ln in lines if ln.split()[:1] == ["step"]]
    assert steps == [pytest.approx(t.step_time_s, abs=1e-4) for t in (megatron, own)]
    assert steps[0] != pytest.approx(steps[1], abs=1e-4)
    summaries = [ln for ln in lines if ln.startswith("predicted step ")]
    assert len(summaries) == 2
    assert f"{megatron.tokens_per_s:,.0f} tokens/s" in summaries[0]
    assert summaries[0].endswith("megatron engine)")
    assert f"{own.tokens_per_s:,.0f} tokens/s" in summaries[1]
    assert summaries[1].endswith("autotune engine)")


def test_params_alone_cannot_predict_time(capsys):
    code, out, err = _run(capsys, "--params", "7e9", "--world-size", "64", "--cluster", "h100-sxm")
    notes = [ln for ln in out.splitlines() if "no step time" in ln]
    assert code == 0 and len(notes) == 1 and "architecture" in notes[0] and not err
    code, out, err = _run(
        capsys, "--params", "7e9", "--world-size", "64", "--cluster", "h100-sxm", "--json"
    )
    assert code == 0 and json.loads(out)["time"] is None
    assert len(err.splitlines()) == 1 and "no step time" in err


def _cluster_file(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    "case, message",
    [
        ("unknown", "unknown cluster 'dgx-9000'"),
        ("bad_json", "is not valid JSON"),
        ("no_device", "device is missing"),
        ("nodes_mismatch", "world size 512 ≠ 32 nodes × 8 devices"),
        ("unknown_model", "unknown model 'llama-1t'"),
        ("nodes_alone", "give --cluster too"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, case, message):
    good = json.dumps(load_cluster("a100-sxm4-80gb").to_dict())
    argv = {
        "unknown": [*LLAMA_70B, "--cluster", "dgx-9000"],
        "bad_json": [*LLAMA_70B, "--cluster", _cluster_file(tmp_path, "bad.json", good[:-5])],
        "no_device": [
            *LLAMA_70B,
            "--cluster",
            _cluster_file(
                tmp_path,
                "nodevice.json",
                json.dumps({k: v for k, v in json.loads(good).items() if k != "device"}),
            ),
        ],
        "nodes_mismatch": [*LLAMA_70B, "--cluster", "a100-sxm4-80gb", "--nodes", "32"],
        "unknown_model": ["--model", "llama-1t", "--cluster", "a100-sxm4-80gb"],
        "nodes_alone": [*LLAMA_70B, "--nodes", "64"],
    }[case]
    code, _, err = _run(capsys, *argv)
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith("autotune: error: ")
    assert message in err and "Traceback" not in err
