"""``--engine``: one name judges a layout's time and memory as that framework runs it."""

from __future__ import annotations

import json

import pytest

from autotune.cli.main import main
from autotune.config import TrialConfig
from autotune.model.cluster import load_cluster
from autotune.model.engine_memory import MEGATRON, estimate_engine_memory
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


def test_estimate_engine_megatron_predicts_megatrons_time_and_memory(capsys):
    assert main(["estimate", *LLAMA_70B, "--engine", "megatron"]) == 0
    data = json.loads(capsys.readouterr().out)
    config = TrialConfig.from_dict(data["config"])
    cluster = load_cluster("a100-sxm4-80gb", nodes=64)
    expected = predict_step_time(
        config, cluster, Calibration.for_cluster(cluster), engine=MEGATRON_ENGINE
    )
    assert data["engine"] == "megatron"
    assert data["time"] == json.loads(json.dumps(expected.as_dict()))
    assert (
        data["engine_peak_bytes"]
        == estimate_engine_memory(config, None, MEGATRON, device_type="cuda").total
    )
    # Megatron's allocator is unmeasured: its figure is the allocated bytes, to which the
    # memory screen adds the device's reserve and context.
    assert data["engine_peak_kind"] == "allocated"
    # The default engine is autotune's own: another prediction, no engine memory.
    assert main(["estimate", *LLAMA_70B]) == 0
    own = json.loads(capsys.readouterr().out)
    assert own["engine"] == "autotune" and own["engine_peak_bytes"] is None
    assert own["engine_peak_kind"] is None
    assert own["time"]["step_time_s"] != data["time"]["step_time_s"]


def test_an_unknown_engine_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        main(["estimate", *LLAMA_70B, "--engine", "nemo"])
    assert e.value.code == 2
    assert "invalid choice: 'nemo'" in capsys.readouterr().err
