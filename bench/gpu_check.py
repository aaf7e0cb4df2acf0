"""Validates the CUDA path on one machine with GPUs, one to eight of them, in one command of
under 8 minutes (the H200 runs' times: docs/benchmarks.md).

Each row of the table it prints is PASS, FAIL or SKIP (a check this machine cannot make, or
one the time budget left out: never counted as passed). It prints its plan and the plan's
estimated time first. Its stages (``--only`` picks them, in order; by default all, in the
order below):

- ``search`` (``bench/gpu_dashboard.py``, ``bench/gpu_search.py``): ``autotune search`` with
  no argument (on GPUs it takes every visible GPU) completes, stores CUDA figures (both
  allocator peaks) and writes exports that parse; ``autotune dashboard -o`` on its database
  exits 0 and writes the HTML page.
- ``layouts`` (``bench/gpu_layouts.py``): with two GPUs or more, every layout kind — DDP,
  ZeRO-1/2/3, tp, tp × SP, pp under gpipe, 1f1b and interleaved 1f1b, cp, HSDP, compile — at
  world 2, then tp × dp, HSDP 2 × 2, pp × dp, cp × dp at world 4 and tp × pp × dp at world 8
  where the GPUs are there: each trains the single-process reference's losses on NCCL, each
  rank's peak against the memory model, its step time beside the step-time model's (a
  figure), the NCCL gradient payload (data parallelism), the pipeline's send/recv bytes against
  its activations, and the step time of a trial after the profiled ones against its first run
  (CUPTI detached). One GPU: one SKIP row.
- ``zero``, ``master``: the rows below.
- ``rows`` (``bench/gpu_rows.py``): nine configurations of a 1.5B Llama at seq 2048-8192 (AC
  none / selective / full, micro-batch, precision, offload), each judged on its allocated and
  reserved peaks against the memory model and on its step time against the step-time model
  calibrated on two rows; the profile of a compute-bound row; a real CUDA OOM followed by a
  trial in the same executor.
- ``oom``: the row below.

``--max-minutes`` (default 8) is the budget: a stage, or a layout, whose estimate does not fit
in what is left is one SKIP row. ``--dry-run`` runs the search, the world-2 layouts and the
rows on CPU (gloo, GPT-tiny, one timed step), through the same code (the suite runs part of it:
``tests/bench/test_gpu_layouts.py``).

``docs/benchmarks.md`` ("GPU check") says what each row proves and what the first GPU run
measured.

At world size 1 (one GPU is enough):

- ``w1 ZeRO-0 trial``: a GPT-small trial ran on CUDA, with the NCCL backend, and the CUDA
  allocator measured its memory (a trial that fell back to the CPU, gloo or the profiler's
  memory figures fails it). Only ZeRO-0 runs: at dp 1 no stage shards or synchronises
  anything (``autotune/trial/parallel/zero.py``), so every stage is the same plain AdamW.
- ``w1 ZeRO-0 memory <category>``: the allocator's bytes of parameters, gradients, optimizer
  state, the rest of the peak and the peak against the memory model's CUDA prediction under
  bf16-mixed, within ``TOLERANCES`` (fp32 parameters at rest where bf16 was meant read +100%,
  AdamW on the bf16 model without its fp32 master copy −67% of the optimizer state).
- ``w1 ZeRO-0 CUDA kernel spans``: the profiler captured CUDA kernels inside the profiled
  step's window (CUPTI works and its clock lines up with the CPU ranges).
- ``bf16-mixed fp32 master weights``: an in-process GPT-tiny trial on the GPU in bf16-mixed
  makes the progress of the same trial in 32-true: the mean of its loss minus the fp32 loss over
  the last half of ``MASTER_STEPS`` steps at ``MASTER_LR`` is within ``MASTER_ATOL``. At that
  learning rate an AdamW update (≈ lr per step) is below half of bf16's spacing for every
  weight larger than 256 × lr, so it survives only in an fp32 master copy.
- ``negative control: bf16-true fails it``: the same check on the same trial in bf16-true (no
  master copy) must FAIL; the row PASSes when it does. A PASS of the check there means it
  cannot tell master weights from none (e.g. the model was never cast to bf16 on the GPU).
- ``out of memory``: a real CUDA out-of-memory, through ``autotune search``, stored
  ``infeasible_measured`` with ``OutOfMemoryError`` (``--skip-oom`` leaves it out).
- ``w2 ZeRO-0..3 losses`` and ``w2 ZeRO-0..3 NCCL gradient payload``: SKIP with one GPU.

At world size 2 (two or more GPUs visible), besides the rows above, each ZeRO stage 0-3 at
dp 2:

- ``w2 ZeRO-S trial``, ``memory <category>``, ``CUDA kernel spans``: as at world size 1, per stage
  (ZeRO-1 shards the optimizer state, ZeRO-2 the gradients too, ZeRO-3 the parameters too).
- ``w2 ZeRO-S NCCL gradient payload``: the bytes per step of the collective that synchronises
  gradients, as the profiler measured them from the NCCL kernels (``profiler.bytes_per_step``
  on each rank), equal within ``PAYLOAD_RTOL`` to what the layout implies, computed from the
  model's shape (:func:`expected_gradient_sync`): DDP (ZeRO-0/1) all-reduces every gradient
  once per step in the gradient dtype (bf16 under bf16-mixed), in buckets of ``bucket_mb``;
  FSDP2 (ZeRO-2/3) reduce-scatters every gradient once per step in fp32 (its
  ``reduce_dtype``). Payloads that read 0 (a wait's tensor-less record taken for the
  collective's), a gradient in the wrong dtype, a second sync of every gradient, or a rank that
  reported nothing fail it; records shifted by one collective only where that moves the total
  by more than 5%.
- ``w2 ZeRO-S losses``: every stage's losses are finite and equal ZeRO-0's within
  ``LOSS_RTOL`` (ZeRO changes where states live, not the arithmetic): a stage that trains a
  different model fails it where its losses move by more than that.

Exit status: 0 when no check fails (skipped ones included), 1 when one fails, 2 when no CUDA
device is visible (the only thing it can check on a CPU-only machine) or on a usage error.

Usage (from the repo root)::

    python bench/gpu_check.py                   # everything that fits in 8 minutes
    python bench/gpu_check.py --only search,layouts   # the multi-GPU check alone
    python bench/gpu_check.py --skip-oom        # the trials and their checks only
    python bench/gpu_check.py --dry-run         # on CPU, before a GPU run
"""

from __future__ import annotations

import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO_ROOT, "bench")
for _path in (REPO_ROOT, BENCH):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import math  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import gpu_dashboard  # noqa: E402
import gpu_layouts  # noqa: E402
import gpu_rows  # noqa: E402
from gpu_table import (  # noqa: E402
    EXIT_FAILED,  # noqa: F401 - part of the script's interface (its exit status)
    EXIT_NO_CUDA,
    Check,
    Status,
    exit_status,
    format_table,
    mib,
    relative_error,
    summary_line,
)

TOLERANCES = {
    "parameters": 0.05,
    "gradients": 0.10,
    "optimizer_state": 0.10,
    "activations": 0.50,
    "peak": 0.25,
}
"""Largest |measured / predicted − 1| accepted per category. Model states are counted exactly
by the model (allocator blocks round to 512 bytes); the rest of the peak is the model's
estimate of activations, buffers and temporaries (docs/architecture.md gives its accuracy)."""
LOSS_RTOL = 1e-3
"""Losses of two ZeRO stages agree within this (different reduction orders, same maths)."""
PAYLOAD_RTOL = 0.05
"""Largest |measured / expected − 1| of the gradient sync's bytes per step. The expectation is
exact up to FSDP2's padding of each tensor's dim 0 to a multiple of dp (GPT-small at dp 2: one
row of each 50257-row tensor, 1e-5); half the bytes, or the bytes of another dtype, are 50% or
100% off."""
MASTER_LR = 3e-5
"""AdamW's learning rate in the master-weight check. Adam's first updates are ≈ lr per element;
bf16 keeps 8 significant bits, so an update is lost without a master copy once |w| ≥ 2⁸ · lr
≈ 7.7e-3: about 70% of GPT-tiny's N(0, 0.02) weights and all of its LayerNorm weights."""
MASTER_STEPS = 32
"""Steps of the master-weight check: lost updates add up, kept ones do not drift."""
MASTER_ATOL = 1e-3
"""Largest |mean of (loss − 32-true loss)| over the last half of the steps. Measured on CPU
(GPT-tiny, seq 64, batch 4; ``tests/bench/test_gpu_check.py``): bf16-mixed 3e-5 to 1e-4 (its
per-step
differences, bf16-rounded matmul inputs, stay within ±4e-4 and average out), bf16-true 4e-3
to 6e-3 (it falls further behind with every step)."""
OOM_FACTOR = gpu_rows.OOM_FACTOR
"""The out-of-memory configuration's predicted peak, in device memories."""


def memory_checks(label: str, measured: dict, predicted: dict) -> list[Check]:
    """Measured (``MemoryBreakdown`` fields) against predicted bytes per category.

    ``predicted`` holds ``MemoryEstimate`` fields: its comm buffers and 'other' are part of
    what the measurement calls activations (all of the peak above the model states)."""
    wanted = {
        "parameters": predicted["parameters"],
        "gradients": predicted["gradients"],
        "optimizer_state": predicted["optimizer_state"],
        "activations": (predicted["activations"] + predicted["comm_buffers"] + predicted["other"]),
        "peak": sum(
            predicted[k]
            for k in (
                "parameters",
                "gradients",
                "optimizer_state",
                "activations",
                "comm_buffers",
                "other",
            )
        ),
    }
    checks = []
    for category, tolerance in TOLERANCES.items():
        want, got = wanted[category], measured[category]
        error = relative_error(got, want)
        checks.append(
            Check.judged(
                f"{label} memory {category}",
                f"{mib(want)} ±{tolerance:.0%}",
                f"{mib(got)} ({error:+.1%})",
                abs(error) <= tolerance,
            )
        )
    return checks


def kernel_check(label: str, spans: list) -> Check:
    """CUDA kernel spans, some of them inside a profiled step."""
    steps = [s for s in spans if s.kind == "step"]
    kernels = gpu_rows.cuda_kernels(spans)
    inside = [
        k
        for k in kernels
        if any(st.start_ns <= k.start_ns <= st.start_ns + st.dur_ns for st in steps)
    ]
    return Check.judged(
        f"{label} CUDA kernel spans",
        "> 0, inside a profiled step",
        f"{len(kernels)} ({len(inside)} inside)",
        bool(kernels) and bool(inside),
    )


def expected_gradient_sync(config, device_type: str = "cuda") -> tuple[str, int]:
    """(collective, bytes per optimizer step) that synchronise the gradients of a
    data-parallel trial of a built-in model, from its shape, independently of the profiler.

    ``autotune/trial/parallel/zero.py``: ZeRO-0/1 are DDP (or, without overlap, the bucketed
    all-reduce), whose buckets of ``bucket_mb`` are flat views of the gradients in their own
    dtype — every gradient all-reduced once per step (``no_sync`` holds the sync back to the last
    micro-batch), so the buckets' sizes add up to the gradient bytes whatever their count.
    ZeRO-2/3 are FSDP2, which reduce-scatters each unit's gradients once per step, its input the
    unsharded gradients in ``reduce_dtype`` (fp32 under mixed precision, ``mp_policy``). The
    element sizes are the memory model's (``autotune.model.memory.state_bytes``) for the precision
    the trial resolves to on ``device_type``."""
    from autotune.model.memory import state_bytes

    if config.tp_degree > 1 or config.pp_degree > 1 or config.dp_degree < 2:
        raise ValueError(
            "expected_gradient_sync covers pure data parallelism (dp ≥ 2, tp 1, "
            f"pp 1), not dp {config.dp_degree} × tp {config.tp_degree} × "
            f"pp {config.pp_degree}"
        )
    spec = config.workload
    numel = spec.shape.num_params(spec.resolved_vocab_size)
    fsdp = config.zero_stage >= 2
    element = state_bytes(config.resolved_precision(device_type), fsdp=fsdp).gradient
    return ("reduce_scatter" if fsdp else "all_reduce"), numel * element


def payload_check(label: str, config, spans: list, device_type: str = "cuda") -> Check:
    """Every rank's measured bytes per step of the gradient-sync collective
    (``profiler.bytes_per_step`` of its spans, whatever their group) against
    :func:`expected_gradient_sync`, within ``PAYLOAD_RTOL``; every rank of the trial must
    have reported. The row shows the worst rank, and how many calls per step carried it."""
    from profiler import bytes_per_step

    name, want = expected_gradient_sync(config, device_type)
    expected = f"{name} {mib(want)}/step ±{PAYLOAD_RTOL:.0%} on each of {config.world_size}"
    per_step = bytes_per_step(spans)
    measured = {
        r: sum(
            v for (kind, op, _), v in per_step.get(r, {}).items() if kind == "comm" and op == name
        )
        for r in sorted({s.rank for s in spans})
    }
    if not measured:
        return Check.judged(f"{label} NCCL gradient payload", expected, "no spans", False)
    errors = {r: relative_error(got, want) for r, got in measured.items()}
    worst = max(errors, key=lambda r: abs(errors[r]))
    calls = sum(1 for s in spans if s.rank == worst and s.kind == "comm" and s.name == name)
    steps = len({s.step for s in spans if s.rank == worst and s.kind == "step"})
    ok = len(measured) == config.world_size and all(abs(e) <= PAYLOAD_RTOL for e in errors.values())
    return Check.judged(
        f"{label} NCCL gradient payload",
        expected,
        f"rank {worst}: {mib(measured[worst])} in {calls / max(1, steps):g} "
        f"calls ({errors[worst]:+.1%}); {len(measured)} ranks",
        ok,
    )


def loss_checks(label: str, losses_by_stage: dict[int, list[float]]) -> list[Check]:
    """Every ZeRO stage's losses finite and equal to ZeRO-0's within LOSS_RTOL."""
    stages = sorted(losses_by_stage)
    base = losses_by_stage[stages[0]]
    checks = []
    for stage in stages:
        losses = losses_by_stage[stage]
        finite = all(math.isfinite(x) for x in losses)
        worst = max((abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, base)), default=0.0)
        checks.append(
            Check.judged(
                f"{label} ZeRO-{stage} losses",
                f"finite, = ZeRO-{stages[0]} ±{LOSS_RTOL:g}",
                f"{losses[-1]:.5f} (rel {worst:.1e})",
                finite and len(losses) == len(base) and worst <= LOSS_RTOL,
            )
        )
    return checks


def skipped_multi_gpu_checks(num_gpus: int) -> list[Check]:
    """The world-size-2 rows, SKIP: with fewer than two GPUs there is no dp 2 to run."""
    why = f"SKIP: {num_gpus} GPU visible, needs 2"
    rows = []
    for stage in (0, 1, 2, 3):
        rows.append(
            Check(
                f"w2 ZeRO-{stage} NCCL gradient payload",
                "dp 2, bytes the layout implies",
                f"{why} (no collective at world size 1)",
                Status.SKIP,
            )
        )
    for stage in (0, 1, 2, 3):
        rows.append(
            Check(
                f"w2 ZeRO-{stage} losses",
                f"finite, = ZeRO-0 ±{LOSS_RTOL:g} at dp 2",
                f"{why} (at world size 1 every stage is plain AdamW)",
                Status.SKIP,
            )
        )
    return rows


# ---- mixed precision keeps fp32 master weights -------------------------------------------------
def master_weight_gap(losses: list[float], reference: list[float]) -> float:
    """Mean of (loss − reference loss) over the last half of the steps (same batches, so the
    batches' own differences cancel); NaN where the runs differ in length or diverged."""
    if len(losses) != len(reference) or len(losses) < 2:
        return math.nan
    tail = range(len(losses) // 2, len(losses))
    gap = sum(losses[i] - reference[i] for i in tail) / len(tail)
    return gap if all(math.isfinite(x) for x in losses) else math.nan


def master_weight_checks(losses: dict[str, list[float]]) -> list[Check]:
    """The master-weight check on the bf16-mixed run, and its negative control on bf16-true:
    ``losses`` holds each precision's losses ('32-true', 'bf16-mixed', 'bf16-true')."""
    reference = losses["32-true"]
    expected = (
        f"|mean Δloss vs 32-true| ≤ {MASTER_ATOL:g} over the last {MASTER_STEPS // 2} "
        f"of {MASTER_STEPS} steps, lr {MASTER_LR:g}"
    )
    mixed = master_weight_gap(losses["bf16-mixed"], reference)
    control = master_weight_gap(losses["bf16-true"], reference)
    check_passes = abs(control) <= MASTER_ATOL  # NaN compares False: a diverged run fails
    # A masterless run that diverged fails the check for another reason: it proves nothing
    # about the check's power to tell master weights from none, so the control wants a number.
    return [
        Check.judged(
            "bf16-mixed fp32 master weights", expected, f"{mixed:+.1e}", abs(mixed) <= MASTER_ATOL
        ),
        Check.judged(
            "negative control: bf16-true fails it",
            "the same check FAILs, on finite losses",
            f"{control:+.1e} (check {'PASS' if check_passes else 'FAIL'})",
            math.isfinite(control) and not check_passes,
        ),
    ]


def master_weight_config(precision: str, device: str):
    """The in-process trial of the check: GPT-tiny at world size 1 (dp 1: plain AdamW, or
    MasterWeightAdamW under mixed precision, ``parallel/precision.optimizer_class``)."""
    from autotune.config import TrialConfig, WorkloadSpec

    return TrialConfig(
        workload=WorkloadSpec(family="gpt", size="tiny", seq_len=64, global_batch_size=4),
        world_size=1,
        micro_batch_size=4,
        device=device,
        precision=precision,
        activation_checkpointing="none",
    )


def _precision_losses(device: str, precisions: tuple[str, ...]) -> dict[str, list[float]]:
    """In a fresh process: each precision's losses over MASTER_STEPS steps of
    :func:`master_weight_config`, with the trial's own model, precision and optimizer class at
    MASTER_LR (trials use ``zero.LEARNING_RATE``, 1e-3, where bf16's spacing loses only the
    updates of weights ≥ 0.26: the LayerNorms'; the losses then differ by < 1e-4)."""
    import torch
    import torch.distributed as dist

    from autotune.trial.models.build import build_workload
    from autotune.trial.parallel.mesh import build_mesh
    from autotune.trial.parallel.parallelize import parallelize
    from autotune.trial.parallel.precision import optimizer_class
    from autotune.trial.runner import Trainer, resolve_device

    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        torch.cuda.set_device(0)
    else:
        torch.set_num_threads(1)  # GPT-tiny gains nothing from more; shared cores lose a lot
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        out = {}
        for precision in precisions:
            config = master_weight_config(precision, device)
            where = resolve_device(config)
            workload = build_workload(
                config.workload, attention=config.attention, seed=config.seed, device=where
            )
            pm = parallelize(workload, config, build_mesh(config, where.type), where)
            params = [p for m in pm.parts for p in m.parameters()]
            pm.dp.optimizer = optimizer_class(config)(params, lr=MASTER_LR, weight_decay=0.0)
            trainer = Trainer(pm, workload, where)
            for step in range(MASTER_STEPS):
                trainer.step(step)
            out[precision] = trainer.losses()
        return out
    finally:
        dist.destroy_process_group()


def precision_losses(device: str) -> dict[str, list[float]]:
    """:func:`_precision_losses` for 32-true, bf16-mixed and bf16-true, in a spawned process
    (its world-size-1 process group and device mesh end with it)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(
            _precision_losses, device, ("32-true", "bf16-mixed", "bf16-true")
        ).result()


def precision_checks(device: str) -> list[Check]:
    try:
        return master_weight_checks(precision_losses(device))
    except Exception as e:  # noqa: BLE001 - reported in the table
        why = f"{type(e).__name__}: {e}"[:120]
        return [
            Check.judged("bf16-mixed fp32 master weights", "the check runs", why, False),
            Check.judged("negative control: bf16-true fails it", "the check runs", why, False),
        ]


# ---- the runs ----------------------------------------------------------------------------------
def base_config(world_size: int):
    from autotune.config import TrialConfig, WorkloadSpec

    return TrialConfig(
        workload=WorkloadSpec(
            family="gpt", size="small", seq_len=512, global_batch_size=8 * world_size
        ),
        world_size=world_size,
        micro_batch_size=8,
        device="cuda",
        activation_checkpointing="none",
        num_warmup_steps=1,
        num_timed_steps=2,
        num_profiled_steps=1,
    )


def trial_plan(num_gpus: int) -> list[tuple[int, tuple[int, ...]]]:
    """(world size, ZeRO stages) of the Ray trials to run: at world size 1 stage 0 only (at
    dp 1 every stage is the same plain AdamW, ``parallel/zero.apply_zero``); with two GPUs or
    more, all four stages at dp 2, where they shard and synchronise."""
    plan = [(1, (0,))]
    if num_gpus >= 2:
        plan.append((2, (0, 1, 2, 3)))
    return plan


def trial_checks(world_size: int, stages: tuple[int, ...], timeout_s: float) -> list[Check]:
    """These ZeRO stages at this world size, on one local Ray cluster; with more than one rank
    the gradient sync's payload per stage and the stages' losses against each other."""
    from autotune.errors import AutotuneError
    from autotune.model.memory import estimate_all_stages
    from autotune.trial.executor import ExecutorSettings, RayExecutor

    label = f"w{world_size}"
    checks, losses = [], {}
    with RayExecutor(ExecutorSettings(trial_timeout_s=timeout_s)) as executor:
        for stage in stages:
            config = dataclasses.replace(base_config(world_size), zero_stage=stage)
            name = f"{label} ZeRO-{stage}"
            start = time.monotonic()
            try:
                result = executor.run(config)
            except AutotuneError as e:
                checks.append(
                    Check.judged(f"{name} trial", "completes on CUDA", str(e)[:120], False)
                )
                continue
            rank0 = result.ranks[0]
            on_cuda = (
                rank0.device.startswith("cuda")
                and rank0.backend == "nccl"
                and rank0.memory.source == "cuda_allocator"
            )
            checks.append(
                Check.judged(
                    f"{name} trial",
                    "cuda, nccl, cuda_allocator",
                    f"{rank0.device}, {rank0.backend}, "
                    f"{rank0.memory.source}, "
                    f"{result.step_time_s * 1e3:.1f} ms/step, "
                    f"{time.monotonic() - start:.0f}s",
                    on_cuda,
                )
            )
            predicted = estimate_all_stages(config, device_type="cuda")[0]
            checks += memory_checks(
                name, dataclasses.asdict(rank0.memory), dataclasses.asdict(predicted)
            )
            spans = [s for r in result.ranks for s in r.spans]
            checks.append(kernel_check(name, spans))
            if world_size > 1:
                checks.append(payload_check(name, config, spans))
            losses[stage] = result.losses
    if len(stages) > 1 and losses:
        checks += loss_checks(label, losses)
    return checks


def oom_config_args(device_bytes: int) -> tuple[int, list[str]]:
    """(micro-batch, search arguments) of a GPT-small configuration the memory model puts at
    OOM_FACTOR × the device's memory: one micro-batch, doubled until it is that large."""
    from autotune.config import TrialConfig, WorkloadSpec

    def config_at(batch: int) -> TrialConfig:
        return TrialConfig(
            workload=WorkloadSpec(
                family="gpt", size="small", seq_len=1024, global_batch_size=batch
            ),
            world_size=1,
            micro_batch_size=batch,
            device="cuda",
            activation_checkpointing="none",
        )

    batch = gpu_rows.batch_beyond_device(config_at, device_bytes, start=8)
    return batch, [
        "--model",
        "gpt-small",
        "--seq-len",
        "1024",
        "--global-batch",
        str(batch),
        "--world-size",
        "1",
        "--fix",
        f"micro_batch_size={batch}",
        "--fix",
        "zero_stage=0",
        "--fix",
        "activation_checkpointing=none",
        "--fix",
        "device=cuda",
        "--fix",
        "num_warmup_steps=0",
        "--fix",
        "num_profiled_steps=0",
        "--strategy",
        "random",
    ]


def oom_check(device_bytes: int, timeout_s: float) -> Check:
    """A real CUDA out-of-memory, through the search, stored as infeasible_measured."""
    from db import Database

    batch, args = oom_config_args(device_bytes)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/oom.db"
        # The limit is raised far above the device so the memory screen lets the trial run.
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "autotune",
                "search",
                *args,
                "--trials",
                "1",
                "--remeasure",
                "0",
                "--memory-limit",
                "1000000",
                "--timeout",
                str(timeout_s),
                "--db",
                url,
                "--out",
                tmp,
            ],
            capture_output=True,
            text=True,
            cwd=REPO_ROOT,
            timeout=timeout_s + 120,
        )
        try:
            with Database.open(url, create=False) as database:
                trials = database.list_trials(database.list_studies()[0].id)
        except Exception as e:  # noqa: BLE001 - reported in the table
            return Check.judged(
                "out of memory",
                "infeasible_measured",
                f"no study stored: {e}; {proc.stderr.strip().splitlines()[-1:]}",
                False,
            )
    trial = trials[0] if trials else None
    status = trial.status if trial else "nothing stored"
    error = (trial.error or "") if trial else ""
    ok = status == "infeasible_measured" and "OutOfMemoryError" in error
    return Check.judged(
        f"out of memory (micro-batch {batch})",
        "infeasible_measured, OutOfMemoryError",
        f"{status}: {error[:80]}",
        ok,
    )


STAGE_SECONDS = {"search": 150.0, "rows": 130.0, "zero": 90.0, "master": 30.0, "oom": 60.0}
"""Estimated seconds of each stage on a GPU machine (the H200 runs: docs/benchmarks.md); the
layouts stage's is its plan's (``gpu_layouts.plan_seconds``)."""
CPU_STAGE_SECONDS = {"search": 120.0, "rows": 90.0}
"""The dry run's, on a loaded 2-core machine."""
ORDER = ("search", "layouts", "zero", "master", "rows", "oom")
"""The stages by default, in this order: what ``--max-minutes`` leaves out comes last."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--timeout", type=float, default=240.0, help="per-trial timeout in seconds (default 240)"
    )
    parser.add_argument("--skip-oom", action="store_true", help="skip the out-of-memory checks")
    parser.add_argument(
        "--skip-search", action="store_true", help="skip the default search and its exports"
    )
    parser.add_argument(
        "--only",
        metavar="STAGE[,STAGE]",
        help=f"run only these stages, in this order: {', '.join(ORDER)} (default: all)",
    )
    parser.add_argument(
        "--max-minutes",
        type=float,
        default=8.0,
        help="time budget: a stage or layout whose estimate does not fit in what is left is "
        "reported SKIP (default 8)",
    )
    parser.add_argument(
        "--cpu-dry-run",
        "--dry-run",
        dest="cpu_dry_run",
        action="store_true",
        help="run the stages' code paths on CPU (gloo, world 2, tiny models; the figures "
        "judge nothing there; for checking the script before a GPU run)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not args.max_minutes > 0:
        parser.error(f"--max-minutes must be > 0, not {args.max_minutes:g}")
    order = args.only.split(",") if args.only else list(ORDER)
    unknown = [s for s in order if s not in ORDER]
    if unknown:
        parser.error(f"unknown stage {unknown[0]!r}; choose from {', '.join(ORDER)}")
    import torch

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if args.cpu_dry_run:
        return _cpu_dry_run(args)
    if not torch.cuda.is_available():
        print(
            "gpu_check: no CUDA device visible (torch.cuda.is_available() is False); run it "
            "on a machine with a GPU and a CUDA build of torch",
            file=sys.stderr,
        )
        return EXIT_NO_CUDA
    num_gpus = torch.cuda.device_count()
    props = torch.cuda.get_device_properties(0)
    print(
        f"{num_gpus} × {props.name}, {props.total_memory / 2**30:.0f} GiB; torch "
        f"{torch.__version__}, CUDA {torch.version.cuda}",
        flush=True,
    )
    start = time.monotonic()
    deadline = start + 60 * args.max_minutes
    layouts = gpu_layouts.plan(num_gpus)
    stages = {
        "search": (
            "default search",
            lambda: (
                []
                if args.skip_search
                else gpu_dashboard.run_search_and_dashboard(REPO_ROOT, timeout_s=args.timeout)
            ),
        ),
        "layouts": (
            "multi-GPU layouts",
            lambda: layouts_stage(layouts, gpu_layouts.GPU_SCALE, args.timeout, deadline),
        ),
        "rows": (
            "1B rows",
            lambda: gpu_rows.run_rows(
                gpu_rows.Scale(), props.total_memory, args.timeout, oom=not args.skip_oom
            ),
        ),
        "zero": (
            "ZeRO trials",
            lambda: (
                [c for ws, st in trial_plan(num_gpus) for c in trial_checks(ws, st, args.timeout)]
                + (skipped_multi_gpu_checks(num_gpus) if num_gpus < 2 else [])
            ),
        ),
        "master": ("master weights", lambda: precision_checks("cuda")),
        "oom": (
            "search OOM",
            lambda: [] if args.skip_oom else [oom_check(props.total_memory, args.timeout)],
        ),
    }
    estimates = {
        **STAGE_SECONDS,
        "layouts": gpu_layouts.plan_seconds(layouts, gpu_layouts.GPU_SCALE) if layouts else 0.0,
    }
    print(format_plan(order, estimates, args.max_minutes), flush=True)
    if layouts and "layouts" in order:
        print(gpu_layouts.format_plan(layouts, gpu_layouts.GPU_SCALE), flush=True)
    checks: list[Check] = []
    for key in order:
        checks += _run_stage(*stages[key], start, estimate=estimates[key], deadline=deadline)
    print(format_table(checks))
    print(summary_line(checks, time.monotonic() - start))
    return exit_status(checks)


def format_plan(order: list[str], estimates: dict[str, float], max_minutes: float) -> str:
    """The stages to run with their estimated seconds, the total against the budget, and the
    stages past it (SKIP, unless the ones before finish sooner than estimated)."""
    total, beyond = 0.0, []
    for key in order:
        total += estimates[key]
        if total > 60 * max_minutes:
            beyond.append(key)
    parts = ", ".join(f"{k} ~{estimates[k]:.0f}s" for k in order)
    line = f"plan: {parts}; estimated {total:.0f}s of the {max_minutes:g}-minute budget"
    return line + (f"; past it (SKIP if still so): {', '.join(beyond)}" if beyond else "")


def layouts_stage(layouts, scale, timeout_s: float, deadline: float) -> list[Check]:
    """The multi-GPU layouts (``gpu_layouts.run_layouts``) in one executor; with fewer than two
    GPUs one SKIP row."""
    if not layouts:
        return [
            Check(
                "multi-GPU layouts",
                "dp, ZeRO, tp, SP, pp, cp, HSDP, compile at world ≥ 2",
                "SKIP: 1 GPU visible, needs 2",
                Status.SKIP,
            )
        ]
    from autotune.trial.executor import ExecutorSettings, RayExecutor

    with RayExecutor(ExecutorSettings(trial_timeout_s=timeout_s)) as executor:
        return gpu_layouts.run_layouts(
            executor, layouts, scale, deadline=deadline, gradient_check=payload_check
        )


def _run_stage(
    name: str, stage, start: float, *, estimate: float = 0.0, deadline: float = math.inf
) -> list[Check]:
    """One stage's checks, its progress on stderr; a stage that raises is one FAIL row (the
    stages after it still run); a stage whose estimate does not fit before ``deadline`` is one
    SKIP row."""
    now = time.monotonic()
    print(f"[{now - start:5.0f}s] {name} ...", file=sys.stderr, flush=True)
    if now + estimate > deadline:
        left = max(0.0, deadline - now)
        return [
            Check(
                name,
                "runs",
                f"SKIP: estimated {estimate:.0f}s, {left:.0f}s left of --max-minutes",
                Status.SKIP,
            )
        ]
    try:
        checks = stage()
    except Exception as e:  # noqa: BLE001 - reported in the table
        import traceback

        traceback.print_exc()
        checks = [Check.judged(name, "runs", f"{type(e).__name__}: {e}"[:140], False)]
    for c in checks:
        print(f"    {c.status.value} {c.name}: {c.measured}", file=sys.stderr, flush=True)
    return checks


def _cpu_dry_run(args) -> int:
    """The stages on CPU: a default search (gloo) and its dashboard, the world-2 layouts on
    GPT-tiny, and the rows on a tiny Llama, within ``--max-minutes``."""
    start = time.monotonic()
    deadline = start + 60 * args.max_minutes
    layouts = gpu_layouts.world_two()
    scale = gpu_layouts.CPU_SCALE
    estimates = {**CPU_STAGE_SECONDS, "layouts": gpu_layouts.plan_seconds(layouts, scale)}
    order = [k for k in (args.only.split(",") if args.only else ORDER) if k in estimates]
    stages = {
        "search": (
            "default search (cpu)",
            lambda: gpu_dashboard.run_search_and_dashboard(
                REPO_ROOT, args.timeout, ("--trials", "3", "--remeasure", "0"), device="cpu"
            ),
        ),
        "layouts": (
            "layouts (cpu, world 2)",
            lambda: layouts_stage(layouts, scale, args.timeout, deadline),
        ),
        "rows": (
            "rows (cpu, tiny)",
            lambda: gpu_rows.run_rows(gpu_rows.CPU_DRY_RUN, 2**30, args.timeout, oom=False),
        ),
    }
    print(format_plan(order, estimates, args.max_minutes), flush=True)
    print(gpu_layouts.format_plan(layouts, scale), flush=True)
    checks: list[Check] = []
    for key in order:
        checks += _run_stage(*stages[key], start, estimate=estimates[key], deadline=deadline)
    print(format_table(checks))
    print(summary_line(checks, time.monotonic() - start))
    return exit_status(checks)


if __name__ == "__main__":
    sys.exit(main())
