"""One clock for all ranks: each rank's offset from rank 0, measured at the start of a run.

The exchanges here move CPU tensors (host ids, wall-clock readings), so they run on a group that
carries CPU data (``cpu_group``). A trial's process group on GPUs is NCCL, which has no CPU
backend: a CPU tensor there raises "No backend type associated with device type cpu".
"""

from __future__ import annotations

import socket
import statistics
import time
import zlib
from datetime import timedelta

import torch
import torch.distributed as dist

_CPU_GROUPS: dict[dist.ProcessGroup, dist.ProcessGroup] = {}
"""The gloo side group of each process group that has no CPU backend (one per group)."""


def carries_cpu(group: dist.ProcessGroup) -> bool:
    """Whether collectives on CPU tensors run on ``group``: its backend config (public
    ``get_backend_config``: "cpu:gloo,cuda:gloo" for gloo, "cuda:nccl" for NCCL) maps the
    cpu device to a backend."""
    config = dist.get_backend_config(group)
    return any(entry.strip().startswith("cpu:") for entry in config.split(","))


def cpu_group(group: dist.ProcessGroup | None = None) -> dist.ProcessGroup:
    """A process group over ``group``'s ranks (default: the world) that carries CPU tensors:
    ``group`` itself if it can, else a gloo side group with ``group``'s timeout, created on the
    first call and reused while ``group`` lives. (Gloo binds the address the host name resolves
    to, unless ``GLOO_SOCKET_IFNAME`` names an interface: whoever starts the ranks sets it.)

    The first call for a group with no CPU backend is collective (``new_group``): every rank of
    the default group calls it, in the same order as its other group creations."""
    group = group or dist.group.WORLD
    if carries_cpu(group):
        return group
    live = dist.distributed_c10d._world.pg_map  # a destroyed group's side group went with it
    for stale in [g for g in _CPU_GROUPS if g not in live]:
        del _CPU_GROUPS[stale]
    if group not in _CPU_GROUPS:
        _CPU_GROUPS[group] = dist.new_group(
            dist.get_process_group_ranks(group),
            timeout=_timeout_of(group),
            backend="gloo",
            group_desc="autotune_cpu",
        )
    return _CPU_GROUPS[group]


def _timeout_of(group: dist.ProcessGroup) -> timedelta | None:
    """``group``'s own timeout (the one it was made with), which its side group gets too, not
    ``new_group``'s gloo default of 30 minutes; None (that default) for a backend that keeps no
    options."""
    device = group.bound_device_id or torch.device("cuda")
    return getattr(group._get_backend(device).options, "_timeout", None)


def host_ids(group: dist.ProcessGroup | None = None) -> list[int]:
    """Every rank's host id (CRC-32 of its host name), in ``group``'s rank order."""
    channel = cpu_group(group)
    host = torch.tensor([zlib.crc32(socket.gethostname().encode())], dtype=torch.int64)
    hosts = [torch.zeros_like(host) for _ in range(dist.get_world_size(channel))]
    dist.all_gather(hosts, host, group=channel)
    return [int(h) for h in hosts]


def measure_offset(group: dist.ProcessGroup | None = None, rounds: int = 5) -> int:
    """This rank's wall clock minus rank 0's, in ns (median over ``rounds`` barrier samples).

    Ranks on one host read the same clock, so their offset is 0 by construction (a barrier's
    exit jitter would otherwise be mistaken for skew); across hosts the barrier-synchronised
    samples estimate the skew to within the barrier's exit jitter. Collective on ``group``;
    runs on ``cpu_group(group)``.
    """
    if len(set(host_ids(group))) == 1:
        return 0
    channel = cpu_group(group)
    world = dist.get_world_size(channel)
    samples = []
    for _ in range(rounds):
        dist.barrier(group=channel)
        now = torch.tensor([time.time_ns()], dtype=torch.int64)
        times = [torch.zeros_like(now) for _ in range(world)]
        dist.all_gather(times, now, group=channel)
        samples.append(int(now) - int(times[0]))
    return int(statistics.median(samples))
