"""Run a function on N spawned processes joined by a gloo process group (no Ray).

For tests that must change a rank's code (negative controls) or need a bare process group.

The ranks are forked from a fork server that has imported torch and the trial runtime once
(``PRELOAD``), not spawned: each spawned rank spent 3-6 CPU-seconds importing them again
(``AUTOTUNE_TEST_START_METHOD=spawn`` measures it: 40 against 11 CPU-seconds for
test_overlap_off.py and test_ddp_buckets.py). Each rank is still a fresh process that shares no
state with the test or with other calls; the test's environment at the call is passed to it.
"""

from __future__ import annotations

import os
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from ports import free_port

PRELOAD = ["torch", "torch.distributed", "autotune.trial.runner", "spawn"]
"""What the fork server imports before it forks a rank (``set_forkserver_preload``)."""
START_METHOD = os.environ.get("AUTOTUNE_TEST_START_METHOD", "forkserver")


def _entry(rank, world, port, fn, args, queue, backend, environ):
    try:
        os.environ.clear()
        os.environ.update(environ)  # the fork server's is that of the first call's parent
        torch.set_num_threads(1)
        if backend is not None:
            dist.init_process_group(
                backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
            )
        queue.put((rank, True, fn(rank, *args)))
    except BaseException:  # noqa: BLE001 - reported to the parent
        queue.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(world: int, fn, *args, timeout: float = 120.0, backend: str | None = "gloo") -> list:
    """fn(rank, *args) on every rank; returns the results by rank or raises the first error.

    ``backend`` is ``init_process_group``'s: ``"cuda:gloo"`` gives a group with no CPU backend,
    as NCCL's is on a GPU (its CPU tensors raise "No backend type associated with device type
    cpu"), on a machine without one; None leaves ``fn`` to initialise its own."""
    ctx = mp.get_context(START_METHOD)
    if START_METHOD == "forkserver":
        ctx.set_forkserver_preload(PRELOAD)
    queue = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(
            target=_entry, args=(r, world, port, fn, args, queue, backend, dict(os.environ))
        )
        for r in range(world)
    ]
    for p in procs:
        p.start()
    try:
        results = dict()
        for _ in procs:
            rank, ok, value = queue.get(timeout=timeout)
            if not ok:
                raise RuntimeError(f"rank {rank} failed:\n{value}")
            results[rank] = value
        return [results[r] for r in range(world)]
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
