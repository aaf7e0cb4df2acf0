"""The profiler's clock exchange under a process group with no CPU backend.

On GPUs a trial's process group is NCCL, which has no CPU backend, so the clock's CPU tensors
must travel on a side channel. ``"cuda:gloo"`` gives such a group on a CPU machine: gloo serves
only the cuda device type, and a CPU tensor raises "No backend type associated with device type
cpu", as under NCCL.
"""

from __future__ import annotations

import socket
import time

import pytest
from spawn import run_ranks

SKEW_NS = 3600 * 10**9
"""Rank 1's clock is set an hour ahead of rank 0's."""
JITTER_NS = 60 * 10**9
"""What a barrier's exit may take on a loaded machine: far below the skew, so an offset of 0 or
of the wrong sign cannot pass."""


def _exchange(rank: int, other_host: bool) -> dict:
    import torch
    import torch.distributed as dist

    from profiler.clock import measure_offset

    if other_host and rank == 1:  # rank 1 on a host of its own, its clock an hour ahead
        socket.gethostname = lambda: "autotune-test-other-host"
        real = time.time_ns
        time.time_ns = lambda: real() + SKEW_NS
    offset = measure_offset()
    from profiler.clock import carries_cpu, cpu_group, host_ids

    world_carries_cpu = carries_cpu(dist.group.WORLD)
    hosts = host_ids()
    channel = cpu_group()
    same_channel = cpu_group() is channel  # created once per group, then reused
    # The model's collectives still go over the trial's own group.
    t = torch.ones(1)
    try:
        dist.all_reduce(t)
        world_takes_cpu = True
    except RuntimeError:
        world_takes_cpu = False
    return {
        "hosts": hosts,
        "offset": offset,
        "world_carries_cpu": world_carries_cpu,
        "world_takes_cpu": world_takes_cpu,
        "same_channel": same_channel,
        "channel_is_world": channel is dist.group.WORLD,
    }


@pytest.mark.parametrize("other_host", [False, True], ids=["one-host", "two-hosts"])
def test_clock_offsets_without_a_cpu_backend(other_host):
    r0, r1 = run_ranks(2, _exchange, other_host, backend="cuda:gloo")
    for r in (r0, r1):
        assert not r["world_carries_cpu"] and not r["world_takes_cpu"]  # NCCL-like here
        assert r["same_channel"] and not r["channel_is_world"]
    assert r0["hosts"] == r1["hosts"]  # every rank sees the same list
    assert r0["offset"] == 0  # rank 0 minus itself
    if other_host:
        assert r0["hosts"][0] != r0["hosts"][1]
        assert abs(r1["offset"] - SKEW_NS) < JITTER_NS
    else:
        assert r0["hosts"][0] == r0["hosts"][1] == _crc(socket.gethostname())
        assert r1["offset"] == 0  # one host reads one clock


def test_a_group_that_carries_cpu_is_its_own_channel():
    """Under gloo (the CPU path) nothing changes: the clock talks on the group itself."""
    r0, r1 = run_ranks(2, _exchange, False)
    for r in (r0, r1):
        assert r["world_carries_cpu"] and r["world_takes_cpu"] and r["channel_is_world"]
        assert r["offset"] == 0


def _crc(name: str) -> int:
    import zlib

    return zlib.crc32(name.encode())
