"""The compile and float8 knobs in trials.

compile: a compiled trial (each block ``torch.compile``d, ``parallel/compile.py``) trains the
same model as one process, within test_layouts' LOSS_ATOL, and its compile time is kept apart
from the step time. One small layout (dp 2, ZeRO-3, full recomputation: the compiled block is
the checkpoint wrapper inside an FSDP2 unit), since inductor compiles for ~30-90 s on a loaded
2-core machine.

float8: refused at trial start, in one line naming why, wherever it cannot run (CPU, a GPU under
compute capability 8.9, torchao missing, tensor parallelism); the CUDA path runs on a GPU of
capability ≥ 8.9 with torchao (skipped elsewhere).
"""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import torch

from autotune.config import TrialConfig
from autotune.errors import ConfigError
from autotune.trial.parallel.compile import check_compile, compile_seconds
from autotune.trial.parallel.float8 import check_float8

LOSS_ATOL = 2e-5  # test_layouts.LOSS_ATOL: fp32 summation-order noise at losses ≈ 6.2
COMPILED = TrialConfig(
    world_size=2,
    zero_stage=3,
    activation_checkpointing="full",
    compile=True,
    device="cpu",
    micro_batch_size=2,
    num_warmup_steps=1,
    num_timed_steps=1,
    num_profiled_steps=0,
)


def _compiled_trial(rank: int, config: TrialConfig) -> dict:
    from torch._dynamo.utils import counters

    from autotune.trial.runner import run_rank

    result = run_rank(config)
    return {
        "losses": result.losses,
        "compile_s": result.extra.get("compile_s"),
        "graphs": counters["stats"]["unique_graphs"],
        "step_times": result.step_times,
    }


@pytest.mark.slow
def test_compiled_trial_matches_single_process():
    from reference import reference_losses
    from spawn import run_ranks

    ranks = run_ranks(2, _compiled_trial, COMPILED, timeout=900.0)
    expected = reference_losses(COMPILED, 3)  # warm-up, timed, memory step
    for r in ranks:
        assert len(r["losses"]) == 3
        assert max(abs(a - b) for a, b in zip(r["losses"], expected)) <= LOSS_ATOL, (
            r["losses"],
            expected,
        )
        # The blocks were compiled (dynamo captured graphs), once for all 4 blocks: the same
        # code with its parameters as inputs, not one graph per block.
        assert 1 <= r["graphs"] < 4
        # The compile time is the first step's excess, outside the timed step's time.
        assert r["compile_s"] == compile_seconds(r["step_times"], 1, 1)
        assert r["compile_s"] > 0
    assert abs(ranks[0]["losses"][-1] - ranks[0]["losses"][0]) > 1e-3  # it trains


def test_compile_seconds_is_the_first_steps_excess():
    # warm-up 30.5 s and 0.5 s, timed 0.4, 0.6, 0.5 s (median 0.5), then other steps
    assert compile_seconds([30.5, 0.5, 0.4, 0.6, 0.5, 9.0], 2, 3) == pytest.approx(30.0)
    assert compile_seconds([0.3, 0.5], 1, 1) == 0.0  # never negative


def test_compile_needs_a_warmup_step():
    check_compile(COMPILED)
    with pytest.raises(ConfigError, match="num_warmup_steps ≥ 1") as e:
        check_compile(dataclasses.replace(COMPILED, num_warmup_steps=0))
    assert "\n" not in str(e.value)


FLOAT8 = TrialConfig(world_size=1, float8=True, device="auto", precision="bf16-mixed")


@pytest.mark.skipif(torch.cuda.is_available(), reason="device auto resolves to a GPU here")
def test_float8_refused_when_auto_resolves_to_cpu():
    from autotune.trial.runner import run_rank

    with pytest.raises(ConfigError, match="runs on cpu") as e:
        run_rank(FLOAT8)  # refused before any collective: no process group needed
    assert "\n" not in str(e.value) and "8.9" in str(e.value)


def test_float8_refused_on_device_cpu_by_the_config():
    with pytest.raises(ConfigError, match="8.9"):
        dataclasses.replace(FLOAT8, device="cpu").validate()


def _fake_gpu(monkeypatch, capability, name, torchao: bool) -> torch.device:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda n, *a: (object() if torchao else None) if n == "torchao" else real(n, *a),
    )
    return torch.device("cuda", 0)


def test_float8_refused_below_capability_8_9(monkeypatch):
    device = _fake_gpu(monkeypatch, (8, 0), "NVIDIA A100-SXM4-80GB", torchao=True)
    with pytest.raises(ConfigError, match="A100-SXM4-80GB is 8.0") as e:
        check_float8(FLOAT8, device)
    assert "\n" not in str(e.value)


def test_float8_refused_without_torchao(monkeypatch):
    device = _fake_gpu(monkeypatch, (9, 0), "NVIDIA H100 80GB HBM3", torchao=False)
    with pytest.raises(ConfigError, match=r"autotune\[float8\]") as e:
        check_float8(FLOAT8, device)
    assert "\n" not in str(e.value)


def test_float8_refused_with_tensor_parallelism(monkeypatch):
    device = _fake_gpu(monkeypatch, (9, 0), "NVIDIA H100 80GB HBM3", torchao=True)
    check_float8(FLOAT8, device)  # accepted: capability 9.0, torchao present, no TP
    with pytest.raises(ConfigError, match="tp_degree 2"):
        check_float8(dataclasses.replace(FLOAT8, world_size=2, tp_degree=2), device)
    check_float8(dataclasses.replace(FLOAT8, float8=False, tp_degree=2), torch.device("cpu"))


def _float8_capable() -> bool:
    return (
        torch.cuda.is_available()
        and torch.cuda.get_device_capability(0) >= (8, 9)
        and importlib.util.find_spec("torchao") is not None
    )


def _float8_trial(rank: int, config: TrialConfig) -> dict:
    from datetime import timedelta

    import torch.distributed as dist

    from autotune.trial.executor import init_rank_group
    from autotune.trial.runner import run_rank

    torch.cuda.set_device(0)
    init_rank_group("nccl", dist.HashStore(), 0, 1, timedelta(seconds=120), 0)
    return {"losses": run_rank(config).losses}


@pytest.mark.skipif(not _float8_capable(), reason="needs a GPU of capability ≥ 8.9 and torchao")
def test_float8_trial_trains_beside_bf16_on_a_gpu():
    """The float8 trial runs and trains the bf16-mixed model: its losses stay near the bf16 run's
    (float8's e4m3 inputs carry ~2^-4 relative rounding, which moves the mean loss of the
    first steps of a 4-layer model by far less than 0.05)."""
    from spawn import run_ranks

    base = TrialConfig(
        world_size=1,
        device="cuda",
        precision="bf16-mixed",
        micro_batch_size=2,
        num_profiled_steps=0,
    )
    (f8,) = run_ranks(
        1, _float8_trial, dataclasses.replace(base, float8=True), backend=None, timeout=300.0
    )
    (bf16,) = run_ranks(1, _float8_trial, base, backend=None, timeout=300.0)
    assert all(abs(a - b) < 0.05 for a, b in zip(f8["losses"], bf16["losses"]))
    assert f8["losses"] != bf16["losses"]  # the linears did change precision
    assert f8["losses"][-1] < f8["losses"][0]
