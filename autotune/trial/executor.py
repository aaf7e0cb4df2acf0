"""Runs trials on a Ray worker group: one actor per rank, one process group per group.

The group (placement group + actors + an initialised ``torch.distributed`` process group) is
created on the first trial of a world size and reused by later trials of the same world size and
device, so a warm trial costs one remote call per rank. It is torn down and rebuilt after a trial
that failed mid-run or timed out, since its collectives may be left half-done.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from autotune.config import TrialConfig
from autotune.errors import ClusterError, ConfigError, TrialFailed, TrialTimeout, WorkloadError
from autotune.status import FailureKind
from autotune.trial.oom import is_out_of_memory
from autotune.trial.placement import (
    assign_groups,
    best_cost,
    check_tp_fits,
    device_map,
    placement_cost,
    ranks_of,
    read_nodes,
    visible_index,
)
from autotune.trial.result import RankResult, TrialResult, rank_from_dict, summarize_steps

# Errors raised before a trial's first collective: all ranks raise them alike and the process
# group stays healthy.
_SETUP_ERRORS = (ConfigError, WorkloadError)
SETUP_FAILURE_GRACE_S = 3.0
"""After one rank fails, how long the others get to finish before they are taken as stuck."""
NODE_DEATH_WAIT_S = 2.0
"""After a rank on another node than the driver's dies, how long to wait for Ray to declare
that node dead, so the failure names the lost node (Ray's health checks take a few seconds;
the ranks on the driver's own node are not waited for: if that node died, so did the driver)."""
COLLECT_POLL_S = 1.0
"""The longest single wait for a rank's result: between waits the driver sees a ``close()``
made from another thread (a ``--parallel`` search's pool closed after Ctrl-C), so a trial thread
never sits out the whole trial timeout on ranks that are being killed."""
NOSET_CUDA_VISIBLE_DEVICES = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"
"""Set in a GPU rank's environment, Ray 2.60 leaves ``CUDA_VISIBLE_DEVICES`` as the node has it
instead of masking the actor to its one GPU (``ray/_private/accelerators/nvidia_gpu.py``,
``set_current_process_visible_accelerator_ids``); ``ray.get_gpu_ids()`` still names the GPU Ray
assigned. A masked rank sees no peer GPU, which keeps NCCL off P2P/NVLink within a node."""


@dataclass(frozen=True, kw_only=True)
class ExecutorSettings:
    """Where and how trials run."""

    ray_address: str | None = None
    """Address of an existing Ray cluster; None starts a local one (loopback only)."""
    trial_timeout_s: float = 300.0
    """A trial not finished after this many seconds is killed and recorded as timed out."""
    cpus_per_rank: float = 0.5
    """Ray CPU resource each CPU rank reserves (ranks may share cores)."""
    placement_timeout_s: float = 60.0
    """How long to wait for the cluster to place a worker group."""
    concurrent_groups: int = 1
    """Worker groups running side by side (``TrialPool``); CPU ranks on one node split its
    cores among all of them."""


@ray.remote
class RankWorker:
    """One rank of a trial's process group; lives as long as its worker group."""

    def __init__(self, sys_path: list[str], num_threads: int) -> None:
        for p in sys_path:  # the driver's imports (user workloads, tests) resolve here too
            if p not in sys.path:
                sys.path.append(p)
        import torch

        # The training stack loads with the worker, so a trial's time (and its timeout) does
        # not include importing it; the driver never imports it.
        import autotune.trial.runner  # noqa: F401

        torch.set_num_threads(num_threads)
        self.rank = -1

    def listen(self) -> tuple[str, int]:
        """Open rank 0's rendezvous socket on this node's address (loopback on a local
        cluster) and keep it open until the store takes it: no other process can take the
        port in between, and nothing listens on other interfaces."""
        ip = ray.util.get_node_ip_address()
        self._listener = socket.create_server((ip, 0), family=_family(ip), backlog=128)
        return ip, self._listener.getsockname()[1]

    def node_and_pid(self) -> tuple[str, int]:
        return ray.get_runtime_context().get_node_id(), os.getpid()

    def gpu_indices(self) -> list[int]:
        """The CUDA device indices, among all of the node's GPUs, that Ray assigned here."""
        return [visible_index(i, os.environ.get("CUDA_VISIBLE_DEVICES")) for i in ray.get_gpu_ids()]

    def init_process_group(
        self,
        backend: str,
        host: str,
        port: int,
        rank: int,
        world_size: int,
        timeout_s: float,
        device_index: int | None = None,
    ) -> None:
        from datetime import timedelta

        import torch.distributed as dist

        timeout = timedelta(seconds=timeout_s)
        listener = getattr(self, "_listener", None)
        store = dist.TCPStore(
            host,
            port,
            world_size,
            is_master=listener is not None,
            timeout=timeout,
            wait_for_workers=False,
            master_listen_fd=listener.fileno() if listener else None,
        )
        init_rank_group(
            backend,
            store,
            rank,
            world_size,
            timeout,
            device_index,
            node_ip=ray.util.get_node_ip_address(),
        )
        self.rank = rank

    def run_trial(self, config: dict) -> dict:
        from autotune.trial.runner import run_rank

        try:
            result = run_rank(TrialConfig.from_dict(config))
            # Where the rank ran: the Ray node (several may share a host) and its host name.
            return {
                "ok": True,
                "result": {
                    **result.to_dict(),
                    "node_id": ray.get_runtime_context().get_node_id(),
                    "hostname": socket.gethostname(),
                },
            }
        except BaseException as e:  # noqa: BLE001 - every failure must reach the driver
            return {
                "ok": False,
                "type": type(e).__name__,
                "message": str(e),
                "setup": isinstance(e, _SETUP_ERRORS),
                "kind": _failure_kind(e),
                "traceback": traceback.format_exc(),
            }


def init_rank_group(
    backend: str,
    store,
    rank: int,
    world_size: int,
    timeout,
    device_index: int | None = None,
    *,
    node_ip: str | None = None,
) -> None:
    """Initialise this rank's default process group as a trial needs it (run on the rank), and
    run its first collective.

    On NCCL the rank's GPU (the one ``device_map`` gave it; every GPU of the node is visible)
    becomes its current device, on which the runner reads its allocator figures, and the group
    is bound to it (``device_id``, which torch 2.11 has): the world communicator is created now
    and the meshes' sub-groups split from it (ncclCommSplit shares its resources) instead of
    each making a full communicator of its own. The harness's own CPU exchanges (the profiler's
    clock) need a group that carries CPU tensors, which NCCL does not: its gloo side group is
    made here, where every rank is (creating a group is collective); under gloo it is the group
    itself. Every group gets ``timeout`` (the trial's).

    ``node_ip`` is the node's address as Ray knows it: gloo binds the interface that holds it
    (``GLOO_SOCKET_IFNAME``, unless already set), not the address the host name resolves to,
    which is 127.0.1.1 on Debian-style hosts and unreachable from other nodes. On NCCL a
    collective the watchdog times out raises on the rank (``TORCH_NCCL_ASYNC_ERROR_HANDLING``
    2, unless already set: abort the communicators, keep the process) instead of killing the
    process, so that the driver hears a timeout, not a worker that died."""
    import torch
    import torch.distributed as dist

    from profiler.clock import cpu_group

    interface = interface_of(node_ip) if node_ip else None
    if interface is not None:
        os.environ.setdefault(GLOO_SOCKET_IFNAME, interface)
    device_id = None
    if backend == "nccl":
        os.environ.setdefault(NCCL_ERROR_HANDLING, NCCL_ABORT_ONLY)
        torch.cuda.set_device(device_index)
        device_id = torch.device("cuda", device_index)
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=world_size, timeout=timeout, device_id=device_id
    )
    cpu_group()
    probe = torch.ones(1, device=device_id or "cpu")
    dist.all_reduce(probe)  # the first collective, inside the group's start (and its bound)
    if int(probe.item()) != world_size:
        raise RuntimeError(f"the first all-reduce summed to {probe.item():g}, not {world_size}")


GLOO_SOCKET_IFNAME = "GLOO_SOCKET_IFNAME"
NCCL_ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
NCCL_ABORT_ONLY = "2"
"""``CleanUpOnly`` (torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp ``ErrorHandlingMode``):
the watchdog aborts the communicators and the failed work raises; the default (3,
``SkipCleanUp``) takes the process down."""
_SIOCGIFADDR = 0x8915


def interface_of(ip: str) -> str | None:
    """The name of this host's network interface whose (IPv4) address is ``ip``, or None (an
    IPv6 address, or none holds it)."""
    import fcntl
    import struct

    if ":" in ip:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                answer = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, request)
            except OSError:  # an interface without an IPv4 address
                continue
            if socket.inet_ntoa(answer[20:24]) == ip:
                return name
    return None


def check_capacity(
    subject: str, num_ranks: int, use_gpu: bool, settings: ExecutorSettings, fix: str
) -> None:
    """Refuse, in one line, more ranks than the Ray cluster's alive nodes have GPUs (or CPUs)
    for: a node that has just died may still count in ``ray.cluster_resources()``."""
    resources: dict[str, float] = {}
    for node in ray.nodes():
        if node.get("Alive"):
            for key in ("CPU", "GPU"):
                resources[key] = resources.get(key, 0) + node["Resources"].get(key, 0)
    if use_gpu:
        have, need, what = resources.get("GPU", 0), num_ranks, "GPUs"
    else:
        have, need = resources.get("CPU", 0), num_ranks * settings.cpus_per_rank
        what = f"CPUs ({settings.cpus_per_rank:g} per rank)"
    if need > have + 1e-9:
        raise ClusterError(f"{subject} {need:g} {what} but the Ray cluster has {have:g}; {fix}")


def rank_cpus(use_gpu: bool, settings: ExecutorSettings) -> float:
    """The Ray CPUs one rank reserves: one beside its GPU, ``cpus_per_rank`` for a CPU rank."""
    return 1.0 if use_gpu else settings.cpus_per_rank


def rank_actor_options(
    rank_nodes: list[str], nodes: list[dict], use_gpu: bool, settings: ExecutorSettings
) -> list[tuple[dict, int]]:
    """The Ray actor options (less the placement) and the torch thread count of every rank,
    given the node of each rank and the cluster's nodes as ``ray.nodes()`` describes them.

    A GPU rank reserves one GPU and one CPU and keeps all of its node's GPUs visible
    (``NOSET_CUDA_VISIBLE_DEVICES``; ``device_map`` picks its device). CPU ranks on one node
    share its cores: cores // local ranks threads each, and concurrent groups split the node
    between them. On GPUs too: the ranks of every group running beside this one on the node
    (``--parallel``) use its cores for their host work (data, launches, the optimizer on the
    host), as many as the node's GPUs hold."""
    local_ranks = Counter(rank_nodes)
    node_cpus = {n["NodeID"]: n["Resources"].get("CPU", 1) for n in nodes}
    node_gpus = {n["NodeID"]: n["Resources"].get("GPU", 0) for n in nodes}
    plan = []
    for node in rank_nodes:
        share = local_ranks[node] * settings.concurrent_groups
        if use_gpu:  # concurrent groups reach this node only as far as its GPUs hold them
            share = min(share, max(local_ranks[node], int(node_gpus.get(node, 0))))
        threads = max(1, int(node_cpus.get(node, 1)) // share)
        options = {"num_cpus": rank_cpus(use_gpu, settings), "num_gpus": 1 if use_gpu else 0}
        if use_gpu:
            options["runtime_env"] = {"env_vars": {NOSET_CUDA_VISIBLE_DEVICES: "1"}}
        plan.append((options, threads))
    return plan


def _family(ip: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in ip else socket.AF_INET


def _failure_kind(e: BaseException) -> FailureKind:
    if isinstance(e, (ConfigError, WorkloadError)):
        return FailureKind.INVALID
    if is_out_of_memory(e):  # by type name or by message: an OOM inside NCCL or cuBLAS too
        return FailureKind.OOM
    if is_timeout(e):  # a collective the watchdog (or gloo, or the store) timed out
        return FailureKind.TIMEOUT
    return FailureKind.ERROR


TIMEOUT_PATTERNS = tuple(
    re.compile(p)
    for p in (
        # torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, WorkNCCL::checkTimeout: "[Rank N]
        # Watchdog caught collective operation timeout: WorkNCCL(SeqNum=…, OpType=…, …,
        # Timeout(ms)=…) ran for … milliseconds before timing out."; the watchdog thread
        # re-raises it as DistBackendError "Process group watchdog thread terminated with
        # exception: …", and WorkNCCL::handleException logs "Some NCCL operations have failed
        # or timed out."
        r"Watchdog caught collective operation timeout",
        r"Some NCCL operations have failed or timed out",
        # ProcessGroupNCCL's heartbeat monitor, when the watchdog itself is stuck: "…'s watchdog
        # got stuck for … seconds without making progress in monitoring enqueued collectives."
        r"watchdog got stuck for \d+ seconds",
        # gloo (third_party/gloo/gloo/transport/tcp/pair.cc, unbound_buffer.cc): "Timed out
        # waiting 1800000ms for recv operation to complete"; the c10d store: "Timed out after
        # 121 seconds waiting for clients. 1/2 clients joined." / "wait timeout after 30000ms"
        r"Timed out waiting \d+ms for \w+ operation",
        r"Timed out after \d+ seconds waiting for clients",
        r"[Ss]ocket [Tt]imeout|client socket has timed out",
        r"wait timeout after \d+ms",
    )
)
"""Texts of an exception (or of one it was raised from) that mean a collective or a rendezvous
timed out: a hung peer, not a broken configuration."""


def is_timeout(e: BaseException) -> bool:
    """Whether ``e`` (or an exception it was raised from) is a timed-out collective or
    rendezvous, by its text (``TIMEOUT_PATTERNS``)."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if any(p.search(str(e)) for p in TIMEOUT_PATTERNS):
            return True
        e = e.__cause__ or e.__context__
    return False


_CAUSE_ORDER = (FailureKind.CRASH, FailureKind.OOM)
"""Which rank's failure a trial reports, first to last (then the other kinds): a dead worker,
then a rank out of memory, whose peers' errors (a collective aborted or timed out waiting for
it, a remote peer gone) are its consequences."""


def first_failure(outcomes: list[dict]) -> tuple[int, dict] | None:
    """(rank, outcome) of the failure that caused the others, or None if every rank succeeded:
    never a rank aborted after another failed, a crash before an OOM before any other error,
    the lowest rank among equals."""
    failures = [(rank, o) for rank, o in enumerate(outcomes) if not o["ok"]]
    if not failures:
        return None

    def order(failure: tuple[int, dict]) -> tuple:
        rank, o = failure
        kind = _CAUSE_ORDER.index(o["kind"]) if o["kind"] in _CAUSE_ORDER else len(_CAUSE_ORDER)
        return o["type"] == "Aborted", kind, rank

    return min(failures, key=order)


def keeps_group(outcomes: list[dict]) -> bool:
    """Whether the worker group may run the next trial after these outcomes: only when every
    rank failed before its first collective (a setup error, alike on all ranks). After an OOM
    (a collective may be half done, an NCCL communicator left in error) or any other failure,
    it is rebuilt."""
    failures = [o for o in outcomes if not o["ok"]]
    return (
        len(failures) == len(outcomes)
        and all(o["setup"] for o in failures)
        and not any(o["kind"] == FailureKind.OOM for o in failures)
    )


class WorkerGroup:
    """A placement group of ``world_size`` rank actors with an initialised process group,
    placed so that every TP group of ``config``'s layout sits inside one node and each
    pipeline stage on as few nodes as the cluster allows (``autotune.trial.placement``)."""

    def __init__(self, config: TrialConfig, use_gpu: bool, settings: ExecutorSettings) -> None:
        world_size, tp = config.world_size, config.tp_degree
        self.world_size, self.use_gpu = world_size, use_gpu
        self.backend = "nccl" if use_gpu else "gloo"
        cpus = rank_cpus(use_gpu, settings)
        # One bundle per TP group: Ray puts a bundle on one node, so no TP group is ever split;
        # PACK fills one node before the next.
        bundle = {"CPU": cpus * tp, **({"GPU": float(tp)} if use_gpu else {})}
        self.pg = placement_group([bundle] * (world_size // tp), strategy="PACK")
        try:
            ray.get(self.pg.ready(), timeout=settings.placement_timeout_s)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(self.pg)
            raise ClusterError(
                f"the Ray cluster could not place {world_size // tp} TP groups of {bundle} "
                f"within {settings.placement_timeout_s:.0f}s; lower world_size or add nodes"
            ) from None
        table = ray.util.placement_group_table(self.pg)
        bundle_nodes = [table["bundles_to_node_id"][i] for i in range(world_size // tp)]
        # A pipeline stage holds dp × cp TP groups (mesh (pp, dp, cp, tp)).
        groups = assign_groups(bundle_nodes, config.pp_degree, config.dp_degree * config.cp_degree)
        self.rank_nodes = ranks_of(groups, bundle_nodes, tp)
        """The Ray node id of every rank."""
        nodes = ray.nodes()
        self.hostnames = {n["NodeID"]: n.get("NodeManagerHostname", "") for n in nodes}
        # A rank on another node than the driver's can lose its node while the driver lives on.
        driver_node = ray.get_runtime_context().get_node_id()
        self.off_driver_node = any(node != driver_node for node in self.rank_nodes)
        self.workers = []
        self.pids: list[int] = []
        try:
            for rank, (options, threads) in enumerate(
                rank_actor_options(self.rank_nodes, nodes, use_gpu, settings)
            ):
                self.workers.append(
                    RankWorker.options(
                        **options,
                        scheduling_strategy=PlacementGroupSchedulingStrategy(
                            self.pg, placement_group_bundle_index=groups[rank // tp]
                        ),
                    ).remote(sys.path, threads)
                )
            self.pids = started_pids(self.workers, settings.placement_timeout_s)
            devices: list[int | None] = [None] * world_size
            if use_gpu:
                node_devices: dict[str, list[int]] = {}
                for node, held in zip(
                    self.rank_nodes, ray.get([w.gpu_indices.remote() for w in self.workers])
                ):
                    node_devices.setdefault(node, []).extend(held)
                devices = [d.device_index for d in device_map(self.rank_nodes, node_devices)]
            start_process_group(self.workers, self.backend, devices, settings.trial_timeout_s)
        except ray.exceptions.RayActorError:
            # A node lost while the group starts: nothing of the group may stay behind.
            self.shutdown()
            lost = self.lost_nodes()
            raise TrialFailed(
                "the worker group could not start: "
                + (describe_lost(lost) if lost else "a rank's worker died"),
                kind=FailureKind.CRASH,
            ) from None
        except BaseException:
            self.shutdown()
            raise

    def suits(self, config: TrialConfig, use_gpu: bool) -> bool:
        """Whether this group can run ``config`` as well placed as a new group would be."""
        if (config.world_size, use_gpu) != (self.world_size, self.use_gpu):
            return False
        if len(set(self.rank_nodes)) == 1:
            return True  # one node: every layout is as well placed as it can be
        per_stage = config.dp_degree * config.cp_degree  # TP groups in a pipeline stage
        best = best_cost(self.rank_nodes, config.tp_degree, per_stage, config.pp_degree)
        return (
            best is not None
            and placement_cost(self.rank_nodes, config.tp_degree, per_stage) == best
        )

    def lost_nodes(self, wait_s: float = 0.0) -> list[tuple[str, str]]:
        """(node id, host name) of this group's nodes that Ray reports dead, waiting up to
        ``wait_s`` for Ray to notice (its health checks take a few seconds)."""
        deadline = time.monotonic() + wait_s
        while True:
            alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
            lost = [
                (node, self.hostnames.get(node, ""))
                for node in dict.fromkeys(self.rank_nodes)
                if node not in alive
            ]
            if lost or time.monotonic() >= deadline:
                return lost
            time.sleep(0.2)

    def shutdown(self) -> None:
        for w in self.workers:
            ray.kill(w, no_restart=True)
        remove_placement_group(self.pg)


def started_pids(workers: list, timeout_s: float) -> list[int]:
    """Every rank's process id, once its worker has started (imported the training stack),
    within ``timeout_s``: the process group's own start is then timed apart from it."""
    try:
        return [
            pid for _, pid in ray.get([w.node_and_pid.remote() for w in workers], timeout=timeout_s)
        ]
    except ray.exceptions.GetTimeoutError:
        raise TrialFailed(
            f"the worker group's {len(workers)} ranks did not start within {timeout_s:g} s "
            "(a node too busy to start its workers?)",
            kind=FailureKind.TIMEOUT,
        ) from None


def start_process_group(
    workers: list, backend: str, devices: list[int | None], timeout_s: float
) -> None:
    """Start the ranks' process group (with its side group and its first collective) within
    ``timeout_s``, the trial's timeout. A rank that raises, or a start not done in time (a peer
    that never reaches the rendezvous, an address another node cannot reach), is a failed
    trial (``TrialFailed``, the cause in one line); the caller discards the worker group."""
    host, port = ray.get(workers[0].listen.remote())
    refs = [
        w.init_process_group.remote(backend, host, port, rank, len(workers), timeout_s, device)
        for rank, (w, device) in enumerate(zip(workers, devices))
    ]
    deadline = time.monotonic() + timeout_s
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(
            pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic())
        )
        if not ready:
            waiting = ", ".join(str(refs.index(r)) for r in pending)
            raise TrialFailed(
                f"process group did not start within {timeout_s:g} s: rank(s) {waiting} still "
                "waiting (a peer that never reached the rendezvous, or an address it cannot "
                "reach); raise --timeout if the cluster is just slow",
                kind=FailureKind.TIMEOUT,
            )
        try:
            ray.get(ready[0])
        except ray.exceptions.RayTaskError as e:  # a rank raised: NCCL or gloo refused
            cause = e.cause if e.cause is not None else e
            raise TrialFailed(
                f"process group did not start: rank {refs.index(ready[0])}: "
                f"{type(cause).__name__}: {_first_line(cause)}",
                rank=refs.index(ready[0]),
                kind=FailureKind.TIMEOUT if is_timeout(cause) else FailureKind.ERROR,
                traceback=str(e),
            ) from None


def _first_line(e: BaseException, limit: int = 300) -> str:
    """The first non-empty line of ``e``'s message, at most ``limit`` characters."""
    line = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), "(no message)")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def describe_lost(lost: list[tuple[str, str]]) -> str:
    """'Ray node 3f2a… (host) was lost' for the nodes a trial lost."""
    names = [f"{node}" + (f" ({host})" if host else "") for node, host in lost]
    return (
        f"Ray node {names[0]} was lost"
        if len(names) == 1
        else f"Ray nodes {', '.join(names)} were lost"
    )


class RayExecutor:
    """Runs TrialConfigs on Ray, reusing a worker group per (world size, device)."""

    def __init__(self, settings: ExecutorSettings | None = None) -> None:
        self.settings = settings or ExecutorSettings()
        self._group: WorkerGroup | None = None
        self._started_ray = False
        self._closes = 0
        """How many times ``close`` ran: a trial collecting when it changes gives up at its
        next poll (the executor may be used again after a close, which starts afresh)."""

    # ---- cluster --------------------------------------------------------------------------
    def start(self) -> None:
        """Start (or join) Ray now; ``run`` does it on first use otherwise."""
        if ray.is_initialized():
            return
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        if self.settings.ray_address is None:
            # A private local cluster on loopback with no dashboard (nothing listens outside).
            # Ray enables token authentication by default and says so on every start; keep the
            # behaviour, drop the notice.
            logging.getLogger("ray._private.authentication").setLevel(logging.ERROR)
            _keep_ray_on_loopback()
            # Ray starts workers at niceness 15; a trial must run at the priority the real job
            # would, or any other process on the node distorts its step time.
            os.environ.setdefault("RAY_worker_niceness", "0")
            self._start_local_node()
        else:
            address = _joinable(self.settings.ray_address)
            try:
                ray.init(address=address, log_to_driver=False, configure_logging=False)
            except (ConnectionError, ValueError, RuntimeError) as e:
                raise ClusterError(
                    f"cannot join the Ray cluster at '{self.settings.ray_address}': {e}"
                ) from None
        self._started_ray = True

    def _start_local_node(self) -> None:
        """``ray.init`` of a private local node, tried ``NODE_START_ATTEMPTS`` times: a raylet
        that misses Ray's fixed 30 s registration wait on a loaded machine usually registers
        on a second start, once the first start's processes are cleared away."""
        for attempt in range(1, NODE_START_ATTEMPTS + 1):
            try:
                ray.init(
                    address="local",
                    include_dashboard=False,
                    _node_ip_address="127.0.0.1",
                    log_to_driver=False,
                    configure_logging=False,
                )
                return
            except Exception as e:  # Ray raises a bare Exception when its node is late
                if NODE_START_TIMEOUT_MESSAGE not in str(e):
                    raise
                ray.shutdown()  # the processes of the late node
                if attempt == NODE_START_ATTEMPTS:
                    raise ClusterError(
                        f"Ray's local node did not start within its 30 s in {attempt} tries "
                        "(ray/_private/node.py): this machine is too busy to start Ray's "
                        "processes; retry when it is less loaded, or join a running cluster "
                        "with --ray-address"
                    ) from None

    def _use_gpu(self, config: TrialConfig) -> bool:
        gpus = ray.cluster_resources().get("GPU", 0)
        if config.device == "cuda":
            if gpus < 1:
                raise ClusterError(
                    "device 'cuda' was asked for but the Ray cluster has no "
                    "GPU; use device 'cpu' or 'auto'"
                )
            return True
        return config.device == "auto" and gpus >= 1

    def _group_for(self, config: TrialConfig, use_gpu: bool) -> tuple[WorkerGroup, bool]:
        g = self._group
        if g is not None and g.suits(config, use_gpu):
            return g, False
        # Refused layouts leave the warm group in place for the next trial.
        check_capacity(
            f"world_size {config.world_size} needs",
            config.world_size,
            use_gpu,
            self.settings,
            "lower world_size or add nodes (--ray-address)",
        )
        check_tp_fits(
            config.tp_degree,
            config.world_size,
            read_nodes(use_gpu, self.settings.cpus_per_rank),
            "1 GPU" if use_gpu else f"{self.settings.cpus_per_rank:g} CPU",
        )
        self.discard_group()
        self._group = WorkerGroup(config, use_gpu, self.settings)
        return self._group, True

    def discard_group(self) -> None:
        if self._group is not None:
            self._group.shutdown()
            self._group = None

    @property
    def worker_pids(self) -> list[int]:
        return list(self._group.pids) if self._group else []

    # ---- trials ---------------------------------------------------------------------------
    def run(self, config: TrialConfig) -> TrialResult:
        """Run one trial; raises ConfigError, ClusterError, TrialFailed or TrialTimeout."""
        config.validate()
        self.start()
        start = time.perf_counter()  # Ray's own start-up is not a trial's overhead
        use_gpu = self._use_gpu(config)
        # A config that names no precision trains in the device's default: record which.
        config = config.with_precision("cuda" if use_gpu else "cpu")
        group, cold = self._group_for(config, use_gpu)
        payload = config.to_dict()
        closes = self._closes
        refs = [w.run_trial.remote(payload) for w in group.workers]
        outcomes = self._collect(refs, closes)
        wall = time.perf_counter() - start
        failure = first_failure(outcomes)  # the cause, not the ranks aborted because of it
        if failure is not None:
            rank, first = failure
            if not keeps_group(outcomes):
                self.discard_group()  # collectives may be half-done: rebuild next time
            if first["type"] in ("ConfigError",):
                raise ConfigError(first["message"])
            if first["type"] in ("WorkloadError",):
                raise WorkloadError(first["message"])
            raise TrialFailed(
                f"rank {rank}: {first['type']}: {first['message']}",
                rank=rank,
                kind=first["kind"],
                traceback=first["traceback"],
            )
        ranks = [rank_from_dict(o["result"]) for o in outcomes]
        step_time, steps_s = summarize_steps(ranks, config.timed_steps)
        return TrialResult(
            config=config.resolved(),
            step_time_s=step_time,
            throughput_tokens_per_s=config.tokens_per_step / step_time,
            losses=ranks[0].losses,
            ranks=ranks,
            wall_s=wall,
            steps_s=steps_s,
            cold_start=cold,
            env=_environment(group, ranks[0]),
            mfu=_mfu(config, step_time, ranks[0]),
        )

    def _collect(self, refs: list, closes: int) -> list[dict]:
        """Wait for every rank, up to the trial timeout; a dead actor becomes a failure, and a
        ``close`` since the trial began (``closes``, then ``_closes``) a ClusterError."""
        deadline = time.monotonic() + self.settings.trial_timeout_s
        index = {ref: i for i, ref in enumerate(refs)}
        outcomes: list[dict | None] = [None] * len(refs)
        pending = list(refs)
        grace_deadline = None
        while pending:
            limit = deadline if grace_deadline is None else min(deadline, grace_deadline)
            # In slices: Ctrl-C (in the main thread) and close() (from another) are seen
            # within COLLECT_POLL_S whatever Ray's wait does with signals.
            ready, pending = ray.wait(
                pending,
                num_returns=1,
                timeout=max(0.0, min(limit - time.monotonic(), COLLECT_POLL_S)),
            )
            if self._closes != closes:
                raise ClusterError("the executor was closed while a trial ran")
            if not ready and time.monotonic() < limit:
                continue
            if not ready:
                self.discard_group()
                if grace_deadline is not None and time.monotonic() < deadline:
                    # Another rank failed and these ones are stuck in a collective with it.
                    for ref in pending:
                        outcomes[index[ref]] = {
                            "ok": False,
                            "type": "Aborted",
                            "setup": False,
                            "kind": FailureKind.ERROR,
                            "message": "aborted after another rank failed",
                            "traceback": "",
                        }
                    break
                raise TrialTimeout(
                    f"trial did not finish within "
                    f"{self.settings.trial_timeout_s:g}s (a hung collective?); "
                    "raise --timeout if the trial is just slow"
                )
            ref = ready[0]
            try:
                outcome = ray.get(ref)
            except ray.exceptions.RayActorError as e:
                group = self._group
                lost = (
                    group.lost_nodes(wait_s=NODE_DEATH_WAIT_S if group.off_driver_node else 0.0)
                    if group
                    else []
                )
                message = (
                    f"{describe_lost(lost)} mid-trial; its ranks died with it"
                    if lost
                    else "worker process died (killed by a signal, e.g. the kernel's "
                    "OOM killer: see dmesg; or a crash in native code) "
                    f"[{e.__class__.__name__}]"
                )
                outcome = {
                    "ok": False,
                    "type": "NodeLost" if lost else "WorkerDied",
                    "setup": False,
                    "kind": FailureKind.CRASH,
                    "message": message,
                    "traceback": "",
                }
            outcomes[index[ref]] = outcome
            if not outcome["ok"] and grace_deadline is None:
                # Ranks that failed before any collective all fail the same way, at once.
                grace_deadline = time.monotonic() + SETUP_FAILURE_GRACE_S
        return [o for o in outcomes if o is not None]

    def close(self) -> None:
        """Kill the worker group's actors (``ray.kill``: no graceful end, which a rank stuck
        in a collective would never reach) and shut Ray down if this executor started it. A
        trial another thread is collecting stops at its next poll (``COLLECT_POLL_S``)."""
        self._closes += 1
        self.discard_group()
        if self._started_ray and ray.is_initialized():
            ray.shutdown()
        self._started_ray = False

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _keep_ray_on_loopback() -> None:
    """Make a local cluster's services bind 127.0.0.1. Ray resolves a loopback node address to
    the host's routable one unless its "cluster mode" is off (``RAY_ENABLE_WINDOWS_OR_OSX_
    CLUSTER=0``, read when ``ray`` is imported): the environment variable reaches every process
    Ray starts, and the already imported constant is set for this driver."""
    from ray._private import ray_constants

    os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False


def _joinable(address: str) -> str:
    """Make the address ``ray start`` prints (``HOST:PORT``) join the way ``auto`` does, and
    join a cluster that has no token authentication too.

    Ray 2.60 turns on token authentication for ``address="auto"`` when a token exists
    (``~/.ray/auth_token``, which ``ray start`` and ``ray get-auth-token --generate`` write)
    but not for an explicit address, which a cluster with authentication then refuses. Ray
    turns it on whatever the cluster does, though, and a cluster without authentication (Ray's
    default, e.g. ``ray.cluster_utils.Cluster``) calls back into the driver without a token:
    the driver's server drops those calls ("Missing authorization header"), the cluster takes
    the driver for dead and kills every actor it started. That happens even with
    ``RAY_AUTH_MODE=disabled``, once the token is loaded. So the cluster's GCS is asked first,
    with no token (``_cluster_wants_token``), and the driver turns authentication on only when
    the cluster answers that it wants one. A loopback host also keeps Ray's cluster mode off in
    this driver, as for a local cluster: otherwise Ray rewrites 127.0.0.1 to the host's
    routable address, where a loopback-only cluster does not listen."""
    from ray._private.authentication.authentication_token_setup import (
        maybe_enable_token_auth_if_token_available,
    )
    from ray._private.services import is_localhost, parse_address
    from ray._raylet import AuthenticationTokenLoader

    if address in ("auto", "local"):
        return address
    logging.getLogger("ray._private.authentication").setLevel(logging.ERROR)
    host_port = parse_address(address.removeprefix("ray://"))
    # Only a GCS address can be asked (a ray:// address is a Ray Client server); ask only when
    # the answer decides something: a token to turn on, or an explicit token mode to check.
    mode = os.environ.get("RAY_AUTH_MODE")
    gcs = f"{host_port[0]}:{host_port[1]}" if host_port and "://" not in address else None
    has_token = AuthenticationTokenLoader.instance().has_token(ignore_auth_mode=True)
    # Looking for the token loads it into Ray's process-wide loader, and a driver whose loader
    # holds a token checks the cluster's calls against it whatever the mode: forget it again.
    AuthenticationTokenLoader.instance().reset_cache()
    wants = (
        _cluster_wants_token(gcs)
        if gcs and (mode == "token" or (mode is None and has_token))
        else None
    )
    if wants is False and mode == "token":
        raise ClusterError(
            f"the Ray cluster at '{address}' has no token authentication but "
            "RAY_AUTH_MODE=token is set; unset RAY_AUTH_MODE (or start the "
            "cluster with RAY_AUTH_MODE=token)"
        )
    if wants is not False:  # it wants one, or it could not be asked: ray.init will say
        maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
    if host_port is not None and is_localhost(host_port[0]):
        _keep_ray_on_loopback()
    return address


NODE_START_TIMEOUT_MESSAGE = "timed out during startup"
"""What Ray 2's ``Node`` raises (a bare ``Exception``) when its raylet has not registered with
the GCS within 30 s (``ray/_private/node.py``, a fixed wait)."""
NODE_START_ATTEMPTS = 2
"""Starts of a local Ray node before a late raylet is a ClusterError."""
AUTH_PROBE_TIMEOUT_S = 3.0
"""How long the GCS gets to answer whether it wants a token (a live one answers in ms)."""


def _cluster_wants_token(gcs_address: str) -> bool | None:
    """Whether the Ray cluster whose GCS listens at ``gcs_address`` requires token
    authentication: one cheap call that carries no token (``GetClusterId``, the first call a
    Ray 2.60 client makes). A cluster with authentication answers UNAUTHENTICATED, one without
    answers; None when nothing answered (ray.init then reports the address)."""
    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    with grpc.insecure_channel(gcs_address) as channel:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        try:
            stub.GetClusterId(gcs_service_pb2.GetClusterIdRequest(), timeout=AUTH_PROBE_TIMEOUT_S)
        except grpc.RpcError as e:
            return True if e.code() == grpc.StatusCode.UNAUTHENTICATED else None
    return False


def _environment(group: WorkerGroup, rank0: RankResult) -> dict:
    import platform
    from importlib.metadata import version

    # torch's version from its installed metadata (what torch.__version__ reads at build time):
    # importing torch here would load it into the driver after every trial.
    return {
        "torch": version("torch"),
        "ray": ray.__version__,
        "python": platform.python_version(),
        "device": rank0.device,
        "backend": group.backend,
        "world_size": group.world_size,
        "num_nodes": len(set(group.rank_nodes)),
        "threads_per_rank": rank0.num_threads,
    }


def _mfu(config: TrialConfig, step_time: float, rank0: RankResult) -> float | None:
    from autotune.hardware import flops_per_token, peak_flops

    shape = config.workload.shape
    device_name = rank0.extra.get("device_name", "")
    peak = peak_flops(device_name, config.compute_dtype()) if device_name else None
    if shape is None or peak is None:
        return None
    n = shape.num_params(config.workload.resolved_vocab_size)
    achieved = (
        flops_per_token(n, shape.num_layers, shape.hidden_size, config.workload.seq_len)
        * config.tokens_per_step
        / step_time
    )
    return achieved / (peak * config.world_size)
