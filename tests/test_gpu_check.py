"""bench/gpu_check.py on a machine without a GPU: it says so on one line and exits 2; its table,
its comparisons and its choice of an out-of-memory configuration work on CPU.

The CUDA runs themselves need a GPU (no CUDA device here): they are what the script is for."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import gpu_check  # noqa: E402

from autotune.config import TrialConfig, WorkloadSpec  # noqa: E402
from autotune.memory import estimate_all_stages, estimate_memory  # noqa: E402
from profiler import Span  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a GPU is visible")
def test_without_cuda_it_exits_2_on_one_line():
    proc = subprocess.run([sys.executable, "bench/gpu_check.py"], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "no CUDA device visible" in proc.stderr


def test_memory_within_tolerance_passes_and_outside_fails():
    config = dataclasses.replace(gpu_check.base_config(1), zero_stage=2)
    predicted = dataclasses.asdict(estimate_all_stages(config, device_type="cuda")[0])
    rest = predicted["activations"] + predicted["comm_buffers"] + predicted["other"]
    states = predicted["parameters"] + predicted["gradients"] + predicted["optimizer_state"]
    measured = {"parameters": predicted["parameters"], "gradients": predicted["gradients"],
                "optimizer_state": predicted["optimizer_state"], "activations": rest,
                "other": 0, "peak": states + rest, "source": "cuda_allocator"}
    assert states + rest == estimate_memory(config, device_type="cuda").total
    checks = gpu_check.memory_checks("w1", measured, predicted)
    assert [c.name.split()[-1] for c in checks] == list(gpu_check.TOLERANCES)
    assert all(c.ok for c in checks)
    over = {**measured, "peak": int((states + rest) * 1.3)}  # 30% over: beyond ±25%
    failed = [c for c in gpu_check.memory_checks("w1", over, predicted) if not c.ok]
    assert [c.name for c in failed] == ["w1 memory peak"]
    assert "+30.0%" in failed[0].measured


def test_losses_timeline_and_table():
    good = gpu_check.loss_checks("w1", {0: [6.0, 5.5], 1: [6.0, 5.5001], 3: [6.0, 5.6]})
    assert [c.ok for c in good] == [True, True, False]  # 5.6 is 1.8% off ZeRO-0
    assert not gpu_check.loss_checks("w1", {0: [6.0, float("nan")]})[0].ok
    step = Span(0, 3, "step", "step", "", 1_000, 10_000)
    kernel = Span(0, 3, "compute", "ampere_sgemm", "kernel", 2_000, 500)
    nccl = Span(0, 3, "comm", "all_reduce", "", 3_000, 800, bytes=4096)
    assert all(c.ok for c in gpu_check.timeline_checks("w2", [step, kernel, nccl], 2))
    cpu_only = gpu_check.timeline_checks("w2", [step, Span(0, 3, "compute", "aten::mm", "op",
                                                            2_000, 500)], 2)
    assert [c.ok for c in cpu_only] == [False, False]
    table = gpu_check.format_table(good)
    lines = table.splitlines()
    assert lines[0].split() == ["check", "expected", "measured"]
    assert set(lines[1].replace(" ", "")) == {"-"}
    assert lines[2].endswith("PASS") and lines[4].endswith("FAIL")


def test_the_out_of_memory_configuration_is_predicted_beyond_the_device():
    device = 141 * 2**30  # an H200
    batch, args = gpu_check.oom_config_args(device)

    def predicted(b: int) -> int:
        return estimate_memory(TrialConfig(
            workload=WorkloadSpec(family="gpt", size="small", seq_len=1024, global_batch_size=b),
            world_size=1, micro_batch_size=b, device="cuda", activation_checkpointing="none"),
            device_type="cuda").total

    assert predicted(batch) > gpu_check.OOM_FACTOR * device >= predicted(batch // 2)
    assert args[args.index("--global-batch") + 1] == str(batch)
    assert f"micro_batch_size={batch}" in args
