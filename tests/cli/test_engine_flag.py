"""``--engine``: one name judges a layout's time and memory as that framework runs it."""

from __future__ import annotations

import json

import pytest

from autotune.cli.main import main
from autotune.config import TrialConfig, WorkloadSpec
from autotune.model.cluster import load_cluster
from autotune.model.engine_memory import MEGATRON, TORCHTITAN, estimate_engine_memory
from autotune.model.memory import estimate_memory
from autotune.model.perf_model import MEGATRON_ENGINE, Calibration, predict_step_time

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
    "1",
    "--micro-batch",
    "1",
    "--global-batch",
    "1024",
    "--seq-len",
    "4096",
    "--ac",
    "selective",
    "--cluster",
    "a100-sxm4-80gb",
    "--json",
)


def _as_json(value):
    return json.loads(json.dumps(value))


def test_estimate_engine_megatron_predicts_megatrons_time_and_memory(capsys):
    assert main(["estimate", *LLAMA_70B, "--engine", "megatron"]) == 0
    data = json.loads(capsys.readouterr().out)
    config = TrialConfig.from_dict(data["config"])
    cluster = load_cluster("a100-sxm4-80gb", nodes=64)
    calibration = Calibration.for_cluster(cluster)
    expected = predict_step_time(config, cluster, calibration, engine=MEGATRON_ENGINE)
    megatron = estimate_engine_memory(config, None, MEGATRON, device_type="cuda")
    assert data["engine"] == "megatron"
    # Megatron's figures lead: its worst pipeline rank's memory and its step time.
    assert data["per_rank"] == megatron.as_dict()
    assert (data["stage"], data["phase"]) == (megatron.stage, megatron.phase)
    assert data["time"] == _as_json(expected.as_dict())
    assert data["engine_peak_bytes"] == megatron.total
    # Megatron's allocator is unmeasured: its figure is the allocated bytes, to which the
    # memory screen adds the device's reserve and context.
    assert data["engine_peak_kind"] == "allocated"
    # autotune's own runtime follows under its own key: its memory, stages and time.
    own = estimate_memory(config, device_type="cuda")
    runtime = data["autotune_runtime"]
    assert runtime["per_rank"] == own.as_dict() != data["per_rank"]
    assert (runtime["stage"], len(runtime["stages"])) == (own.stage, 8)
    assert runtime["time"] == _as_json(predict_step_time(config, cluster, calibration).as_dict())
    assert runtime["time"]["step_time_s"] != data["time"]["step_time_s"]
    # The default engine is autotune's own: its figures at the top, no engine memory.
    assert main(["estimate", *LLAMA_70B]) == 0
    default = json.loads(capsys.readouterr().out)
    assert default["engine"] == "autotune" and default["engine_peak_bytes"] is None
    assert default["engine_peak_kind"] is None and "autotune_runtime" not in default
    assert default["per_rank"] == own.as_dict() and default["time"] == runtime["time"]


# Llama 3.1 70B on 256 GPUs as torchtitan's FSDP × TP recipe: FSDP 32 × TP 8, ZeRO-3 (FSDP2),
# a local batch of 16 sequences, every block recomputed.
TORCHTITAN_70B = (
    "--model",
    "llama-70b",
    "--world-size",
    "256",
    "--tp",
    "8",
    "--zero",
    "3",
    "--micro-batch",
    "16",
    "--global-batch",
    "512",
    "--seq-len",
    "4096",
    "--ac",
    "full",
)


def _torchtitan_70b() -> TrialConfig:
    return TrialConfig(
        workload=WorkloadSpec(family="llama", size="70b", seq_len=4096, global_batch_size=512),
        world_size=256,
        tp_degree=8,
        zero_stage=3,
        micro_batch_size=16,
        activation_checkpointing="full",
        precision="bf16-mixed",  # the GPU default, which estimate resolves
    )


def test_estimate_engine_torchtitan_leads_with_torchtitans_memory(capsys):
    assert main(["estimate", *TORCHTITAN_70B, "--engine", "torchtitan", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    config = _torchtitan_70b()
    assert TrialConfig.from_dict(data["config"]) == config
    titan = estimate_engine_memory(config, None, TORCHTITAN, device_type="cuda")
    own = estimate_memory(config, device_type="cuda")
    assert data["per_rank"] == titan.as_dict() and data["per_rank"]["total"] == titan.total
    assert data["engine_peak_bytes"] == titan.total and data["engine_peak_kind"] == "reserved"
    assert data["autotune_runtime"]["per_rank"] == own.as_dict()
    assert own.total != titan.total  # two different predictions, each under its own name
    # The text prints torchtitan's table first, named, and autotune's after, named too.
    assert main(["estimate", *TORCHTITAN_70B, "--engine", "torchtitan"]) == 0
    lines = capsys.readouterr().out.splitlines()
    titles = [i for i, ln in enumerate(lines) if "per rank, peak" in ln]
    assert [lines[i].split(":")[0] for i in titles] == [
        "as torchtitan runs it (reserved bytes)",
        "autotune's own runtime",
    ]
    totals = [ln.split()[1] for ln in lines if ln.split()[:1] == ["total"]]
    assert totals == [f"{titan.total:,}", f"{own.total:,}"]


def test_engine_autotune_prints_what_no_engine_prints(capsys):
    for extra in ((), ("--json",)):
        outputs = []
        for engine in ((), ("--engine", "autotune")):
            assert main(["estimate", *TORCHTITAN_70B, *extra, *engine]) == 0
            outputs.append(capsys.readouterr().out)
        assert outputs[0] == outputs[1]
        assert "autotune's own runtime" not in outputs[0] and "autotune_runtime" not in outputs[0]


def test_an_unknown_engine_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        main(["estimate", *LLAMA_70B, "--engine", "nemo"])
    assert e.value.code == 2
    assert "invalid choice: 'nemo'" in capsys.readouterr().err
