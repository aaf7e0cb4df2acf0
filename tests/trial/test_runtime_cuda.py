"""The trial runtime on a real GPU: NCCL, its memory, and real out-of-memory errors.

Skipped without CUDA (the CPU suite proves the same logic under gloo and "cuda:gloo":
tests/trial/test_clock_channel.py, test_mesh_cache.py, test_oom_classify.py). One GPU is enough: a
world of one NCCL rank, and two ranks sharing the GPU where no NCCL communicator is made.
"""

from __future__ import annotations

import threading

import pytest
import torch
from spawn import run_ranks
from test_clock_channel import SKEW_NS, _exchange

# GPU-only: these exercise NCCL and the CUDA allocator, which a CPU machine does not have.
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

MIB = 2**20


def _profiled_trial(rank: int) -> dict:
    """A default trial (two profiled steps) on a one-rank NCCL group made as the executor
    makes it."""
    from datetime import timedelta

    import torch.distributed as dist

    from autotune.config import TrialConfig
    from autotune.trial.executor import init_rank_group
    from autotune.trial.runner import non_allocator_bytes, run_rank

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    torch.empty(1, device=device)  # the CUDA context, before NCCL
    before = non_allocator_bytes(device)
    init_rank_group("nccl", dist.HashStore(), 0, 1, timedelta(seconds=120), 0)
    after_init = non_allocator_bytes(device)
    result = run_rank(TrialConfig(world_size=1, micro_batch_size=2, device="cuda"))
    return {
        "before": before,
        "after_init": after_init,
        "backend": result.backend,
        "spans": len(result.spans),
        "offset": result.clock_offset_ns,
        "reported": result.extra["non_allocator_bytes"],
        "total": torch.cuda.mem_get_info(device)[1],
        "bound": dist.group.WORLD.bound_device_id,
    }


def test_a_profiled_trial_runs_on_nccl():
    (r,) = run_ranks(1, _profiled_trial, backend=None, timeout=300.0)
    print(
        f"non-allocator bytes: context {r['before'] / MIB:.0f} MiB, after NCCL init "
        f"{r['after_init'] / MIB:.0f} MiB, after the trial {r['reported'] / MIB:.0f} MiB"
    )
    assert r["backend"] == "nccl" and r["bound"] == torch.device("cuda", 0)
    assert r["spans"] > 0 and r["offset"] == 0
    assert 0 < r["before"] <= r["after_init"] < r["total"]
    assert 0 < r["reported"] < r["total"]


def test_clock_offsets_over_nccl():
    """Two ranks of a real NCCL group (sharing the GPU: no NCCL communicator is made, since
    nothing here talks on NCCL) measure their offsets on the gloo side group."""
    r0, r1 = run_ranks(2, _exchange, True, backend="nccl")
    assert not r0["world_carries_cpu"] and not r0["world_takes_cpu"]
    assert r0["offset"] == 0 and abs(r1["offset"] - SKEW_NS) < 60 * 10**9


def _fill_device() -> list:
    """Take every block of device memory the caching allocator can get."""
    hog, chunk = [], torch.cuda.mem_get_info()[0]
    while chunk >= MIB:
        try:
            hog.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
        except torch.OutOfMemoryError:
            chunk //= 2
    return hog


def _real_oom(rank: int, where: str) -> dict:
    import torch.distributed as dist

    from autotune.trial.oom import is_out_of_memory

    torch.cuda.set_device(0)
    x = torch.ones(64, 64, device="cuda")  # allocated before the device is full
    hog = _fill_device()
    try:
        if where == "nccl":  # the first collective creates the communicator: its buffers
            dist.all_reduce(x)
        elif where == "cublas":  # the first matmul creates the cuBLAS handle
            x @ x
        else:
            torch.empty(hog[0].numel(), dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - its text is what is checked
        del hog
        return {"type": type(e).__name__, "message": str(e)[:2000], "oom": is_out_of_memory(e)}
    return {"type": None, "message": "nothing failed", "oom": False}


@pytest.mark.parametrize("where", ["allocator", "cublas", "nccl"])
def test_real_out_of_memory_is_recognised(where):
    (r,) = run_ranks(1, _real_oom, where, backend="nccl", timeout=300.0)
    print(f"{where}: {r['type']}: {r['message']}")
    assert r["oom"], f"{where}: {r['type']}: {r['message']}"


def test_dtensor_caches_are_cleared_on_the_autograd_device_thread(monkeypatch):
    """CUDA backward runs on the autograd engine's device thread, whose DTensor caches are its
    own: destroying a mesh clears them there too."""
    from autotune.trial.parallel import mesh

    threads: list[int] = []
    monkeypatch.setattr(
        mesh, "_clear_sharding_caches", lambda: threads.append(threading.get_ident())
    )
    mesh._destroy(mesh._CachedMesh(mesh=None, world=None, owned=()), "cuda")
    assert len(threads) == 2 and threads[0] == threading.get_ident() != threads[1]
