"""Validates the CUDA path on one machine with a GPU, in under 5 minutes.

Checks, each a row of the table it prints:

1. single-rank trials of GPT-small on CUDA (NCCL backend) under every ZeRO stage the world size
   allows (all four at world size 1: ZeroRedundancyOptimizer and FSDP2 wrap a single rank too),
   and, with two or more GPUs, the same at world size 2 (dp 2); the losses of every stage agree
   (ZeRO changes where states live, not the arithmetic);
2. the CUDA allocator's memory by category (``runner.measure_memory``: parameters, gradients,
   optimizer state, the rest of the peak, the peak) against the memory model's prediction for
   CUDA (``autotune.memory``), within the tolerances of ``TOLERANCES``;
3. the profiled step's CUDA timeline: kernel spans (category 'kernel') inside the step, and,
   with more than one GPU, NCCL communication spans with their payload;
4. a real out-of-memory: a search (``autotune search``, the CLI a user runs) of one
   configuration whose activations the memory model puts at 1.5 × the device's memory, its
   memory limit raised so that the screen lets it run; the trial must be stored
   ``infeasible_measured`` with the CUDA out-of-memory error.

Exit status: 0 when every check passes, 1 when one fails, 2 when no CUDA device is visible (the
only thing it can check on a CPU-only machine).

Usage (from the repo root)::

    python bench/gpu_check.py
    python bench/gpu_check.py --skip-oom        # the trials and their checks only
"""

from __future__ import annotations

import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import math  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402

EXIT_FAILED, EXIT_NO_CUDA = 1, 2
TOLERANCES = {"parameters": 0.05, "gradients": 0.10, "optimizer_state": 0.10,
              "activations": 0.50, "peak": 0.25}
"""Largest |measured / predicted − 1| accepted per category. Model states are counted exactly
by the model (allocator blocks round to 512 bytes); the rest of the peak is the model's
estimate of activations, buffers and temporaries (docs/architecture.md gives its accuracy)."""
LOSS_RTOL = 1e-3
"""Losses of two ZeRO stages agree within this (different reduction orders, same maths)."""
OOM_FACTOR = 1.5
"""The out-of-memory configuration's predicted peak, in device memories."""


@dataclass(frozen=True)
class Check:
    """One row of the table."""

    name: str
    expected: str
    measured: str
    ok: bool


def format_table(checks: list[Check]) -> str:
    """The checks as an aligned text table, with a PASS/FAIL column."""
    header = ("check", "expected", "measured", "")
    rows = [header] + [(c.name, c.expected, c.measured, "PASS" if c.ok else "FAIL")
                       for c in checks]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def memory_checks(label: str, measured: dict, predicted: dict) -> list[Check]:
    """Measured (``MemoryBreakdown`` fields) against predicted bytes per category.

    ``predicted`` holds ``MemoryEstimate`` fields: its comm buffers and 'other' are part of
    what the measurement calls activations (all of the peak above the model states)."""
    wanted = {"parameters": predicted["parameters"], "gradients": predicted["gradients"],
              "optimizer_state": predicted["optimizer_state"],
              "activations": (predicted["activations"] + predicted["comm_buffers"]
                              + predicted["other"]),
              "peak": sum(predicted[k] for k in ("parameters", "gradients", "optimizer_state",
                                                 "activations", "comm_buffers", "other"))}
    checks = []
    for category, tolerance in TOLERANCES.items():
        want, got = wanted[category], measured[category]
        error = (got / want - 1) if want else (0.0 if got == 0 else math.inf)
        checks.append(Check(f"{label} memory {category}",
                            f"{_mib(want)} ±{tolerance:.0%}",
                            f"{_mib(got)} ({error:+.1%})", abs(error) <= tolerance))
    return checks


def timeline_checks(label: str, spans: list, world_size: int) -> list[Check]:
    """Kernel spans inside the profiled steps, and NCCL spans where there are several ranks."""
    steps = [s for s in spans if s.kind == "step"]
    kernels = [s for s in spans if s.category == "kernel"]
    inside = [k for k in kernels if any(
        st.start_ns <= k.start_ns <= st.start_ns + st.dur_ns for st in steps)]
    checks = [Check(f"{label} CUDA kernel spans", "> 0, inside a profiled step",
                    f"{len(kernels)} ({len(inside)} inside)", bool(kernels) and bool(inside))]
    if world_size > 1:
        comm = [s for s in spans if s.kind in ("comm", "p2p") and s.bytes > 0]
        checks.append(Check(f"{label} NCCL spans", "> 0 with payload", str(len(comm)),
                            bool(comm)))
    return checks


def loss_checks(label: str, losses_by_stage: dict[int, list[float]]) -> list[Check]:
    """Every ZeRO stage's losses finite and equal to ZeRO-0's within LOSS_RTOL."""
    stages = sorted(losses_by_stage)
    base = losses_by_stage[stages[0]]
    checks = []
    for stage in stages:
        losses = losses_by_stage[stage]
        finite = all(math.isfinite(x) for x in losses)
        worst = max((abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, base)),
                    default=0.0)
        checks.append(Check(f"{label} ZeRO-{stage} losses", f"finite, = ZeRO-{stages[0]} "
                            f"±{LOSS_RTOL:g}", f"{losses[-1]:.5f} (rel {worst:.1e})",
                            finite and len(losses) == len(base) and worst <= LOSS_RTOL))
    return checks


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


# ---- the runs ----------------------------------------------------------------------------------
def base_config(world_size: int):
    from autotune.config import TrialConfig, WorkloadSpec

    return TrialConfig(workload=WorkloadSpec(family="gpt", size="small", seq_len=512,
                                             global_batch_size=8 * world_size),
                       world_size=world_size, micro_batch_size=8, device="cuda",
                       activation_checkpointing="none", num_warmup_steps=1,
                       num_timed_steps=2, num_profiled_steps=1)


def trial_checks(world_size: int, timeout_s: float) -> list[Check]:
    """Every ZeRO stage at this world size, on one local Ray cluster."""
    from autotune.errors import AutotuneError
    from autotune.executor import ExecutorSettings, RayExecutor
    from autotune.memory import estimate_all_stages

    label = f"w{world_size}"
    checks, losses = [], {}
    with RayExecutor(ExecutorSettings(trial_timeout_s=timeout_s)) as executor:
        for stage in (0, 1, 2, 3):
            config = dataclasses.replace(base_config(world_size), zero_stage=stage)
            name = f"{label} ZeRO-{stage}"
            start = time.monotonic()
            try:
                result = executor.run(config)
            except AutotuneError as e:
                checks.append(Check(f"{name} trial", "completes on CUDA", str(e)[:120], False))
                continue
            rank0 = result.ranks[0]
            on_cuda = (rank0.device.startswith("cuda") and rank0.backend == "nccl"
                       and rank0.memory.source == "cuda_allocator")
            checks.append(Check(f"{name} trial", "cuda, nccl, cuda_allocator",
                                f"{rank0.device}, {rank0.backend}, {rank0.memory.source}, "
                                f"{result.step_time_s * 1e3:.1f} ms/step, "
                                f"{time.monotonic() - start:.0f}s", on_cuda))
            predicted = estimate_all_stages(config, device_type="cuda")[0]
            checks += memory_checks(name, dataclasses.asdict(rank0.memory),
                                    dataclasses.asdict(predicted))
            checks += timeline_checks(name, [s for r in result.ranks for s in r.spans],
                                      world_size)
            losses[stage] = result.losses
    if losses:
        checks += loss_checks(label, losses)
    return checks


def oom_config_args(device_bytes: int) -> tuple[int, list[str]]:
    """(micro-batch, search arguments) of a GPT-small configuration the memory model puts at
    OOM_FACTOR × the device's memory: one micro-batch, doubled until it is that large."""
    from autotune.config import TrialConfig, WorkloadSpec
    from autotune.memory import estimate_memory

    batch = 8
    while True:
        config = TrialConfig(workload=WorkloadSpec(family="gpt", size="small", seq_len=1024,
                                                   global_batch_size=batch),
                             world_size=1, micro_batch_size=batch, device="cuda",
                             activation_checkpointing="none")
        if estimate_memory(config, device_type="cuda").total > OOM_FACTOR * device_bytes:
            break
        batch *= 2
    return batch, ["--model", "gpt-small", "--seq-len", "1024", "--global-batch", str(batch),
                   "--world-size", "1", "--fix", f"micro_batch_size={batch}",
                   "--fix", "zero_stage=0", "--fix", "activation_checkpointing=none",
                   "--fix", "device=cuda", "--fix", "num_warmup_steps=0",
                   "--fix", "num_profiled_steps=0", "--strategy", "random"]


def oom_check(device_bytes: int, timeout_s: float) -> Check:
    """A real CUDA out-of-memory, through the search, stored as infeasible_measured."""
    from db import Database

    batch, args = oom_config_args(device_bytes)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/oom.db"
        # The limit is raised far above the device so the memory screen lets the trial run.
        proc = subprocess.run(
            [sys.executable, "-m", "autotune", "search", *args, "--trials", "1",
             "--remeasure", "0", "--memory-limit", "1000000", "--timeout", str(timeout_s),
             "--db", url, "--out", tmp], capture_output=True, text=True, cwd=REPO_ROOT,
            timeout=timeout_s + 120)
        try:
            with Database.open(url, create=False) as database:
                trials = database.list_trials(database.list_studies()[0].id)
        except Exception as e:  # noqa: BLE001 - reported in the table
            return Check("out of memory", "infeasible_measured", f"no study stored: {e}; "
                         f"{proc.stderr.strip().splitlines()[-1:]}", False)
    trial = trials[0] if trials else None
    status = trial.status if trial else "nothing stored"
    error = (trial.error or "") if trial else ""
    ok = status == "infeasible_measured" and "OutOfMemoryError" in error
    return Check(f"out of memory (micro-batch {batch})", "infeasible_measured, "
                 "OutOfMemoryError", f"{status}: {error[:80]}", ok)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeout", type=float, default=240.0,
                        help="per-trial timeout in seconds (default 240)")
    parser.add_argument("--skip-oom", action="store_true", help="skip the out-of-memory check")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device visible (torch.cuda.is_available() is False); run it "
              "on a machine with a GPU and a CUDA build of torch", file=sys.stderr)
        return EXIT_NO_CUDA
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    num_gpus = torch.cuda.device_count()
    props = torch.cuda.get_device_properties(0)
    print(f"{num_gpus} × {props.name}, {props.total_memory / 2**30:.0f} GiB; torch "
          f"{torch.__version__}, CUDA {torch.version.cuda}", flush=True)
    start = time.monotonic()
    checks = trial_checks(1, args.timeout)
    if num_gpus >= 2:
        checks += trial_checks(2, args.timeout)
    if not args.skip_oom:
        checks.append(oom_check(props.total_memory, args.timeout))
    print(format_table(checks))
    failed = [c for c in checks if not c.ok]
    print(f"{len(checks) - len(failed)} of {len(checks)} checks passed in "
          f"{time.monotonic() - start:.0f}s")
    return EXIT_FAILED if failed else 0


if __name__ == "__main__":
    sys.exit(main())
