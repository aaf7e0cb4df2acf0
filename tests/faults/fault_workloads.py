"""User workloads that misbehave on purpose, for the fault tests.

Each is the built-in tiny GPT (so the memory model's estimate of the built-in model is the right
one for it) whose forward pass misbehaves on one rank for one micro-batch size: the forward sees
the micro-batch, so ``x.shape[0]`` is the configuration's ``micro_batch_size``, and the other
configurations of a search run normally. Named as ``tests.faults.fault_workloads:build_*``; the
Ray workers import it through the driver's ``sys.path``, which the executor forwards.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import signal
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from autotune.config import WorkloadSpec
from autotune.trial.models.workload import Workload, build_builtin

FAULTY_RANK = 1
FAULTY_MICRO_BATCH = 2
"""The configuration that breaks: micro-batch 2 on rank 1 (global batch 8 on dp 2 leaves
micro-batches 1, 2 and 4; the search starts from 4)."""
OVER_LIMIT_MICRO_BATCH = 4
OVER_LIMIT_BYTES = 256 * 2**20
"""build_oom: micro-batch 4 allocates this much more in each forward (a measured peak over a
memory limit that the prediction fits under)."""
KILL_AT_FORWARD = 2
"""build_killed: rank 1 dies at its third forward pass of micro-batch 2 (with two accumulation
steps per optimizer step, that is inside the second step, after collectives have run)."""


def _misbehaving(
    spec: WorkloadSpec,
    misbehave: Callable[[int, int], None],
    *,
    ranks: tuple[int, ...] = (FAULTY_RANK,),
) -> Workload:
    """The built-in model of ``spec``; ``misbehave(micro_batch, call)`` runs before each forward
    on ``ranks``, ``call`` counting that micro-batch size's forward passes."""
    workload = build_builtin(dataclasses.replace(spec, workload=None))
    original = workload.model.forward
    calls: dict[int, itertools.count] = {}

    def forward(x, *args, **kwargs):
        if dist.get_rank() in ranks:
            micro_batch = x.shape[0]
            misbehave(micro_batch, next(calls.setdefault(micro_batch, itertools.count())))
        return original(x, *args, **kwargs)

    workload.model.forward = forward
    return workload


def build_raising(spec: WorkloadSpec) -> Workload:
    """Rank 1 raises in forward for micro-batch 2."""

    def misbehave(micro_batch: int, call: int) -> None:
        if micro_batch == FAULTY_MICRO_BATCH:
            raise RuntimeError(f"injected failure (micro-batch {micro_batch})")

    return _misbehaving(spec, misbehave)


def build_oom(spec: WorkloadSpec) -> Workload:
    """Every rank runs out of memory for micro-batch 2 (data parallelism loads all ranks
    alike); micro-batch 4 measures 256 MiB more than it should."""

    def misbehave(micro_batch: int, call: int) -> None:
        if micro_batch == FAULTY_MICRO_BATCH:
            raise torch.OutOfMemoryError("injected: CPU out of memory. Tried to allocate 8.00 GiB")
        if micro_batch == OVER_LIMIT_MICRO_BATCH:
            # Allocated and freed at once: the CPU reading is the peak of live tensor bytes.
            torch.empty(OVER_LIMIT_BYTES, dtype=torch.uint8).fill_(1)

    return _misbehaving(spec, misbehave, ranks=(0, 1))


HANG_SLEEP_S = 600.0
"""How long the hanging workload's rank 1 sleeps: far past any trial timeout a test sets."""


def build_hanging(spec: WorkloadSpec) -> Workload:
    """Rank 1 sleeps in forward for micro-batch 2, so rank 0 waits in a collective."""

    def misbehave(micro_batch: int, call: int) -> None:
        if micro_batch == FAULTY_MICRO_BATCH:
            time.sleep(HANG_SLEEP_S)

    return _misbehaving(spec, misbehave)


def build_killed(spec: WorkloadSpec) -> Workload:
    """Rank 1's process is SIGKILLed mid-trial for micro-batch 2 (as the OOM killer would)."""

    def misbehave(micro_batch: int, call: int) -> None:
        if micro_batch == FAULTY_MICRO_BATCH and call == KILL_AT_FORWARD:
            os.kill(os.getpid(), signal.SIGKILL)

    return _misbehaving(spec, misbehave)


def build_healthy(spec: WorkloadSpec) -> Workload:
    """The same model without a fault (a search over a user workload)."""
    return _misbehaving(spec, lambda micro_batch, call: None)
