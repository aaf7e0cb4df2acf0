"""A trial's process group starts within bounds, on the node's own address, and a collective
that times out is reported as a timeout.

The texts below are the ones torch and gloo write when a collective or a rendezvous times out
(each source is named beside its pattern in ``autotune.trial.executor.TIMEOUT_PATTERNS``):

- torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, ``WorkNCCL::checkTimeout``:
  ``logPrefix() + "Watchdog caught collective operation timeout: " + work + " ran for " + ms +
  " milliseconds before timing out."``; the watchdog thread (``Watchdog::run``) re-raises it as
  ``DistBackendError(logPrefix() + "Process group watchdog thread terminated with exception: "
  + e.what())``; ``WorkNCCL::handleException`` logs "Some NCCL operations have failed or timed
  out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on
  corrupted/incomplete data.";
- the heartbeat monitor of the same file, when the watchdog itself hangs;
- gloo's tcp transport ("Timed out waiting …ms for recv operation to complete") and the c10d
  TCPStore ("Timed out after … seconds waiting for clients", "wait timeout after …ms").
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from test_oom_classify import _outcome

from autotune.status import FailureKind
from autotune.trial.executor import (
    GLOO_SOCKET_IFNAME,
    _failure_kind,
    first_failure,
    init_rank_group,
    interface_of,
)

WATCHDOG = (
    "[PG ID 0 PG GUID 0(default_pg) Rank 1] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=1048576, NumelOut=1048576, "
    "Timeout(ms)=120000) ran for 120013 milliseconds before timing out."
)
TIMEOUTS = {
    "watchdog, as the work raises it": dist.DistBackendError(WATCHDOG),
    "watchdog thread's exit": dist.DistBackendError(
        "[PG ID 0 PG GUID 0(default_pg) Rank 1] Process group watchdog thread terminated with "
        "exception: " + WATCHDOG
    ),
    "handleException": RuntimeError(
        "Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA "
        "kernels, subsequent GPU operations might run on corrupted/incomplete data."
    ),
    "heartbeat monitor": RuntimeError(
        "[PG ID 0 PG GUID 0(default_pg) Rank 0] ProcessGroupNCCL's watchdog got stuck for 480 "
        "seconds without making progress in monitoring enqueued collectives."
    ),
    "gloo recv": RuntimeError(
        "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
        "120000ms for recv operation to complete"
    ),
    "store rendezvous": dist.DistStoreError(
        "Timed out after 121 seconds waiting for clients. 1/2 clients joined."
    ),
    "store wait": dist.DistStoreError("wait timeout after 120000ms, keys: /default_pg/0//cuda//0"),
}
NOT_TIMEOUTS = {
    "remote peer gone": dist.DistBackendError(
        "NCCL error in: ProcessGroupNCCL.cpp:3356, remote process exited or there was a network "
        "error, NCCL version 2.27.5\nncclRemoteError: A call failed possibly due to a network "
        "error or a remote process exiting prematurely."
    ),
    "a rank raised": RuntimeError("injected failure (micro-batch 2)"),
}


@pytest.mark.parametrize("name", sorted(TIMEOUTS))
def test_a_timed_out_collective_is_a_timeout(name):
    assert _failure_kind(TIMEOUTS[name]) == FailureKind.TIMEOUT


@pytest.mark.parametrize("name", sorted(NOT_TIMEOUTS))
def test_other_errors_are_not_timeouts(name):
    assert _failure_kind(NOT_TIMEOUTS[name]) == FailureKind.ERROR


def test_a_timeout_raised_from_another_error_is_a_timeout():
    try:
        try:
            raise TIMEOUTS["watchdog, as the work raises it"]
        except dist.DistBackendError as inner:
            raise RuntimeError("FSDP all-gather failed") from inner
    except RuntimeError as outer:
        assert _failure_kind(outer) == FailureKind.TIMEOUT


def test_a_rank_out_of_memory_outranks_the_peer_that_timed_out_waiting_for_it():
    """Rank 1 ran out of memory; rank 0's watchdog timed out its all-reduce with rank 1. The
    trial reports rank 1's OOM (infeasible), not rank 0's timeout, nor a dead worker."""
    outcomes = [
        _outcome(TIMEOUTS["watchdog thread's exit"]),
        _outcome(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")),
    ]
    rank, first = first_failure(outcomes)
    assert (rank, first["kind"]) == (1, FailureKind.OOM)
    assert outcomes[0]["kind"] == FailureKind.TIMEOUT


def _ipv4_of_default_route() -> str:
    """The address this host sends from toward a public address (no packet leaves: a UDP
    socket's connect only picks the route)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("203.0.113.1", 9))
        return s.getsockname()[0]


def test_the_interface_is_found_by_its_address():
    assert interface_of("127.0.0.1") == "lo"
    routed = _ipv4_of_default_route()
    name = interface_of(routed)
    assert name in {n for _, n in socket.if_nameindex()} and name != "lo"
    assert interface_of("203.0.113.77") is None  # TEST-NET-3: held by no interface here
    assert interface_of("fd00::2") is None


@pytest.fixture
def no_process_group(monkeypatch):
    monkeypatch.delenv(GLOO_SOCKET_IFNAME, raising=False)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def test_a_rank_binds_the_node_address_and_runs_its_first_collective(no_process_group):
    """Gloo is told the interface of the address Ray gave the node (loopback here), not left to
    resolve the host name; the group runs its first collective inside its start; and its side
    groups get the group's timeout."""
    from autotune.trial.parallel.mesh import group_timeout

    calls = []
    real = dist.all_reduce

    def all_reduce(tensor, *args, **kwargs):
        calls.append(tensor.clone())
        return real(tensor, *args, **kwargs)

    dist.all_reduce = all_reduce
    try:
        init_rank_group("gloo", dist.HashStore(), 0, 1, timedelta(seconds=77), node_ip="127.0.0.1")
    finally:
        dist.all_reduce = real
    assert os.environ[GLOO_SOCKET_IFNAME] == "lo"
    assert [t.tolist() for t in calls] == [[1.0]]
    assert group_timeout() == timedelta(seconds=77)


def test_the_clock_side_group_has_the_group_timeout(no_process_group):
    """A world with no CPU backend (as NCCL's; "cuda:gloo" on a CPU machine) gets a gloo side
    group with the world's timeout, not gloo's default of 30 minutes."""
    from profiler.clock import cpu_group

    dist.init_process_group(
        "cuda:gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=77)
    )
    side = cpu_group()
    assert side is not dist.group.WORLD
    assert side._get_backend(torch.device("cpu")).options._timeout == timedelta(seconds=77)
