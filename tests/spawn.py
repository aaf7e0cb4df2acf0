"""Run a function on N spawned processes joined by a gloo process group (no Ray).

For tests that must change a rank's code (negative controls) or need a bare process group.
"""

from __future__ import annotations

import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from ports import free_port


def _entry(rank, world, port, fn, args, queue, backend):
    try:
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
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_entry, args=(r, world, port, fn, args, queue, backend))
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
