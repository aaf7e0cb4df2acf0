"""Strict collectives: NCCL's rules enforced on any backend, so that gloo on CPU fails where NCCL
on GPUs would hang or exchange wrong bytes.

Gloo tolerates what NCCL does not: it copies a strided tensor's elements where NCCL reads the
buffer linearly (a non-contiguous ``reduce_scatter_tensor`` input is summed wrong with no error),
and it delivers a send's bytes whatever dtype the peer's recv expects. Where both hang (two
ranks that each block in ``send`` first), the checker turns the hang into an error naming the
order. :func:`install` wraps the Python entry points the
training stack calls (torch 2.13) and raises :class:`StrictCollectiveError` on:

- a non-contiguous tensor handed to any collective or point-to-point op;
- a collective whose op, dtype, shape, reduce op or root differs across the group's ranks
  (``all_to_all``: rank i's output splits must be rank j's input splits), found by a small
  all-gather of each call's signature on a gloo *mirror* of the group (same ranks);
- a send and the peer's matching (k-th) recv of different dtype or element count, a recv with
  no source (NCCL has no any-source receive), and a blocking ``send`` whose peer does not reach
  the matching recv within the p2p timeout (ordered blocking sends both ways deadlock NCCL);
- an object collective (``all_gather_object``, ``broadcast_object_list``, …) on a trial group
  rather than a gloo side group (``profiler.clock.cpu_group``), unless it names its device;
- ``new_group`` called with other ranks, or in another order, on some ranks, or about to name
  the group differently on some ranks (names come from a per-process counter: a group made on
  some ranks only shifts every later name, and the rendezvous under two names hangs). A name
  already live on the rank is refused by torch itself.

Entry points wrapped: ``torch.distributed`` (and ``distributed_c10d``) all_reduce, reduce,
broadcast, all_gather, all_gather_into_tensor, reduce_scatter, reduce_scatter_tensor, all_to_all,
all_to_all_single, send, recv, isend, irecv, batch_isend_irecv, the object collectives,
new_group (also ``device_mesh``'s import of it) and destroy_process_group: FSDP2's all-gather
and reduce-scatter, pipelining's p2p and ZeroRedundancyOptimizer call these. DTensor (tensor and
sequence parallelism) calls ``torch.distributed._functional_collectives``
(all_gather_single, reduce_scatter_single, all_reduce, …), wrapped there. Not seen: DDP's
reducer (C++ calls into the process group), and collectives inside a compiled graph (dynamo
traces the functional ops; the wrappers step aside while compiling).

The cross-rank checks pause while the profiler records (profiled steps, the CPU memory step):
the spans and memory a trial reports stay its own.

The test lane switches it on: ``tests/conftest.py`` sets ``AUTOTUNE_STRICT_COLLECTIVES=1``, and
the rank's runner calls :func:`install_from_env` at trial start. Installing is collective on the
default group (it creates the world's mirror); every rank of a trial calls it.
"""

from __future__ import annotations

import functools
import inspect
import math
import os
import threading
import zlib
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.distributed.device_mesh as device_mesh
from torch.distributed import distributed_c10d as c10d
from torch.utils._python_dispatch import _disable_current_modes

ENV_VAR = "AUTOTUNE_STRICT_COLLECTIVES"
P2P_TIMEOUT_ENV_VAR = "AUTOTUNE_STRICT_P2P_TIMEOUT_S"
DEFAULT_P2P_TIMEOUT_S = 120.0
"""How long a blocking send waits for its peer to reach the matching recv (and a recv for the
peer's send) before the pair counts as deadlocked."""


class StrictCollectiveError(RuntimeError):
    """A collective that NCCL would run wrong or hang on."""


COLLECTIVES = (
    "all_reduce",
    "reduce",
    "broadcast",
    "all_gather",
    "all_gather_single",
    "all_gather_into_tensor",
    "_all_gather_base",
    "reduce_scatter",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
    "_reduce_scatter_base",
    "all_to_all",
    "all_to_all_single",
)
P2P = ("send", "recv", "isend", "irecv")
OBJECT_COLLECTIVES = (
    "all_gather_object",
    "gather_object",
    "broadcast_object_list",
    "scatter_object_list",
    "send_object_list",
    "recv_object_list",
)
FUNCTIONAL = (
    "broadcast",
    "all_reduce",
    "all_gather_single",
    "all_gather_single_autograd",
    "reduce_scatter_single",
    "reduce_scatter_single_autograd",
    "all_gather_tensor",
    "all_gather_tensor_autograd",
    "reduce_scatter_tensor",
    "reduce_scatter_tensor_autograd",
    "all_to_all_single",
    "all_to_all_single_autograd",
)
_OP_CODES = {name: i for i, name in enumerate(dict.fromkeys(COLLECTIVES + FUNCTIONAL))}
_HEADER = 12
"""Signature row: op, dtype, ndim, 6 dims, reduce op, root, list length."""
_TAG_DESCRIPTOR, _TAG_ACK = 71, 72
EAGER_CALLS = 16
"""A group's first calls in a trial, each compared across ranks before it runs."""
BATCH_CALLS = 32
"""Later calls' signatures compared this many at a time (the test lane's time: a side
all-gather per call doubled a tiny trial's collectives)."""


class _State:
    def __init__(self) -> None:
        self.originals: dict[tuple[object, str], object] = {}
        self.mirrors: dict[dist.ProcessGroup, dist.ProcessGroup] = {}
        self.calls: dict[dist.ProcessGroup, list] = {}
        """Per group: calls compared this trial, and the signatures not compared yet."""
        self.cpu_role: set[dist.ProcessGroup] = set()
        self.world: dist.ProcessGroup | None = None
        self.creations = 0
        self.pending: list[tuple[object, torch.Tensor]] = []
        self.local = threading.local()

    def original(self, name: str):
        return self.originals.get((c10d, name), getattr(c10d, name))

    def nested(self) -> bool:
        return getattr(self.local, "depth", 0) > 0


_STATE = _State()


def p2p_timeout_s() -> float:
    return float(os.environ.get(P2P_TIMEOUT_ENV_VAR, DEFAULT_P2P_TIMEOUT_S))


def install_from_env() -> bool:
    """:func:`install` when ``AUTOTUNE_STRICT_COLLECTIVES=1``; whether it is on."""
    if os.environ.get(ENV_VAR, "") != "1":
        return False
    install()
    return True


def installed() -> bool:
    return bool(_STATE.originals)


def install() -> None:
    """Wrap the entry points (once per process) and mirror the current default group
    (collective: every rank calls it, when the default group is new to the checker)."""
    if not installed():
        _patch_all()
    _STATE.calls.clear()  # every rank starts the trial here: the call counts restart alike
    world = dist.group.WORLD
    if world is not None and _STATE.world is not world:
        live = c10d._world.pg_map
        for group in [g for g in _STATE.mirrors if g not in live]:
            del _STATE.mirrors[group]
        _STATE.world = world
        _STATE.mirrors[world] = _mirror(None)
        _STATE.creations = 0


def uninstall() -> None:
    """Put the original entry points back (tests)."""
    for (module, name), fn in _STATE.originals.items():
        setattr(module, name, fn)
    _STATE.originals.clear()
    _STATE.mirrors.clear()
    _STATE.cpu_role.clear()
    _STATE.world = None


def _patch(module, name: str, wrapper_of) -> None:
    if not hasattr(module, name):
        return
    original = _STATE.originals.setdefault((module, name), getattr(module, name))
    setattr(module, name, wrapper_of(original))


def _patch_all() -> None:
    """One wrapper per c10d function, set on both namespaces (``dist.isend is c10d.isend``
    stays true: ``batch_isend_irecv`` and pipelining compare ops by identity)."""
    makers = {
        **{n: functools.partial(_collective_wrapper, n) for n in COLLECTIVES},
        **{n: functools.partial(_p2p_wrapper, n) for n in P2P},
        **{n: functools.partial(_object_wrapper, n) for n in OBJECT_COLLECTIVES},
        "batch_isend_irecv": _batch_wrapper,
        "new_group": _new_group_wrapper,
        "destroy_process_group": _destroy_wrapper,
    }
    for name, make in makers.items():
        _patch(c10d, name, make)
        wrapped = getattr(c10d, name)
        _STATE.originals.setdefault((dist, name), getattr(dist, name))
        setattr(dist, name, wrapped)
    _STATE.originals.setdefault((device_mesh, "new_group"), device_mesh.new_group)
    device_mesh.new_group = c10d.new_group
    for name in FUNCTIONAL:
        _patch(funcol, name, functools.partial(_functional_wrapper, name))


class _Depth:
    """Marks the thread as inside a checked call: the calls it makes (an object collective's
    tensor collectives, ``batch_isend_irecv``'s isends) are not checked again."""

    def __enter__(self):
        _STATE.local.depth = getattr(_STATE.local, "depth", 0) + 1

    def __exit__(self, *exc):
        _STATE.local.depth -= 1


def _arguments(original, args, kwargs) -> dict:
    bound = _signature(original).bind(*args, **kwargs)
    bound.apply_defaults()
    return bound.arguments


@functools.cache
def _signature(fn) -> inspect.Signature:
    return inspect.signature(fn)


def _unseen(fn):
    """Run a side check outside any dispatch mode (selective activation checkpointing records
    and replays the ops of a checkpointed forward: the checks' tensors must not be among them)
    and outside autograd."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        with _disable_current_modes(), torch.no_grad():
            return fn(*args, **kwargs)

    return run


def _skip() -> bool:
    return _STATE.nested() or torch.compiler.is_compiling()


def _side_mirror(group) -> dist.ProcessGroup | None:
    """The mirror the cross-rank checks of ``group`` talk on; None while the profiler records
    (the profiled steps and the CPU memory step, alike on every rank), so that the trial's
    spans and allocations are its own."""
    if torch._C._autograd._profiler_enabled():
        return None
    return _STATE.mirrors.get(group)


# --- tensor collectives -------------------------------------------------------------------


def _checked(original, check):
    """``original`` with ``check`` run on its bound arguments first, except within a checked
    call or under the profiler (``_skip``)."""

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if _skip():
            return original(*args, **kwargs)
        check(_arguments(original, args, kwargs))
        with _Depth():
            return original(*args, **kwargs)

    return wrapper


def _collective_wrapper(name: str, original):
    def check(a: dict) -> None:
        group = a.get("group") or dist.group.WORLD
        _check_collective(name, group, a)

    return _checked(original, check)


def _tensors_of(a: dict) -> list[torch.Tensor]:
    found = []
    for value in a.values():
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found += [t for t in value if isinstance(t, torch.Tensor)]
    return found


def _check_contiguous(name: str, tensors: list[torch.Tensor], group) -> None:
    for t in tensors:
        if not t.is_contiguous():
            raise StrictCollectiveError(
                f"{name} on group {_group_name(group)} got a non-contiguous tensor (shape "
                f"{tuple(t.shape)}, strides {t.stride()}): NCCL reads its buffer linearly and "
                "moves the wrong elements with no error; pass .contiguous()"
            )


def _subject(name: str, a: dict) -> tuple[torch.Tensor, list[int], list[int], int]:
    """The tensor whose dtype and shape every rank must agree on, the all-to-all splits (in,
    out: element counts per peer), and the list length of a list collective."""
    if name == "all_to_all":
        ins, outs = a["input_tensor_list"], a["output_tensor_list"]
        return ins[0], [t.numel() for t in ins], [t.numel() for t in outs], len(ins)
    if name == "all_to_all_single":
        subject = a["input"]
        row = math.prod(subject.shape[1:])
        n = dist.get_world_size(a.get("group") or dist.group.WORLD)
        ins = a.get("input_split_sizes") or [subject.shape[0] // n] * n
        outs = a.get("output_split_sizes") or [a["output"].shape[0] // n] * n
        return subject, [s * row for s in ins], [s * row for s in outs], 0
    if name == "reduce_scatter":  # the input list's tensors are each shaped as the output
        return a["output"], [], [], len(a["input_list"])
    subject = next(a[k] for k in ("tensor", "input_tensor", "input") if k in a)
    lists = [v for v in a.values() if isinstance(v, (list, tuple))]
    return subject, [], [], len(lists[0]) if lists else 0


def _check_collective(name: str, group, a: dict) -> None:
    if group is c10d.GroupMember.NON_GROUP_MEMBER:
        return
    _check_contiguous(name, _tensors_of(a), group)
    subject, ins, outs, length = _subject(name, a)
    roots = [a.get(k) for k in ("src", "dst", "group_src", "group_dst")]
    root = next((r for r in roots if r is not None), None)
    shape = list(subject.shape[1:] if name.startswith("all_to_all") else subject.shape)
    header = _header(name, subject.dtype, shape, a.get("op"), root, length)
    _cross_check(name, group, header, ins, outs)


def _header(name: str, dtype, shape: list[int], op, root, length: int) -> list[int]:
    dims = (list(shape) + [-1] * 6)[:6] if len(shape) <= 6 else [_crc(shape)] * 6
    return [
        _OP_CODES[name],
        _crc(dtype),
        len(shape),
        *dims,
        _crc(op) if op is not None else 0,
        int(root) if root is not None else -1,
        length,
    ]


def _crc(value) -> int:
    return zlib.crc32(str(value).encode())


def _cross_check(name: str, group, header: list[int], ins: list[int], outs: list[int]) -> None:
    """Compare every rank's signature of this call over the group's gloo mirror (no mirror: a
    group made before the checker was installed, or by ``split_group``; only the local checks
    apply): the group's first ``EAGER_CALLS`` calls of a trial each before it runs, later ones
    ``BATCH_CALLS`` at a time, after they ran (one side all-gather per batch). Which calls are
    compared when depends only on the group's call count, the same on every rank."""
    mirror = _side_mirror(group)
    if mirror is None:
        return
    n = dist.get_world_size(group)
    calls = _STATE.calls.setdefault(group, [0, []])
    calls[0] += 1
    calls[1].append((name, header + (ins or [0] * n) + (outs or [0] * n)))
    if calls[0] <= EAGER_CALLS or len(calls[1]) == BATCH_CALLS:
        batch, calls[1] = calls[1], []
        _compare(group, mirror, n, batch)


@_unseen
def _compare(group, mirror, n: int, batch: list[tuple[str, list[int]]]) -> None:
    rows = torch.tensor([row for _, row in batch], dtype=torch.int64)
    tables = _gather_rows(rows.flatten(), mirror, n)  # per rank: its batch, row after row
    width = rows.shape[1]
    ranks = dist.get_process_group_ranks(group)
    for b, (name, _) in enumerate(batch):
        table = [t[b * width : (b + 1) * width] for t in tables]
        for r, other in enumerate(table):
            if other[:_HEADER] != table[0][:_HEADER]:
                raise StrictCollectiveError(
                    f"{name} on group {_group_name(group)} differs across ranks: global rank "
                    f"{ranks[0]} calls {_describe(table[0])}, rank {ranks[r]} "
                    f"{_describe(other)}; NCCL would hang or exchange the wrong bytes (every "
                    "rank must make the same call, with the same dtype and shape)"
                )
        if any(table[0][_HEADER:]):
            ins = [t[_HEADER : _HEADER + n] for t in table]
            _check_splits(name, group, ranks, ins, table, n)


def _gather_rows(row: torch.Tensor, mirror, n: int) -> list[list[int]]:
    rows = torch.empty(n * row.numel(), dtype=torch.int64)
    with _Depth():
        _STATE.original("all_gather_single")(rows, row, group=mirror)
    return rows.view(n, -1).tolist()


def _check_splits(name, group, ranks, ins, table, n) -> None:
    outs = [t[_HEADER + n : _HEADER + 2 * n] for t in table]
    for i in range(n):
        for j in range(n):
            if outs[i][j] != ins[j][i]:
                raise StrictCollectiveError(
                    f"{name} on group {_group_name(group)}: global rank {ranks[i]} expects "
                    f"{outs[i][j]} elements from rank {ranks[j]}, which sends it {ins[j][i]}; "
                    "NCCL would read past or short of the buffers"
                )


def _describe(row: list[int]) -> str:
    op = next(k for k, v in _OP_CODES.items() if v == row[0])
    shape = [d for d in row[3 : 3 + min(row[2], 6)]]
    return f"{op}(dtype #{row[1]:x}, shape {shape}, reduce #{row[9]:x}, root {row[10]})"


def _group_name(group) -> str:
    try:
        return f"{group.group_name!r} (ranks {dist.get_process_group_ranks(group)})"
    except (RuntimeError, ValueError, AttributeError):
        return repr(group)


# --- functional collectives (DTensor) -----------------------------------------------------


def _functional_wrapper(name: str, original):
    def check(a: dict) -> None:
        group = c10d._resolve_process_group(funcol._resolve_group_name(a["group"], a.get("tag")))
        tensor = a["self"]
        _check_contiguous(f"functional {name}", [tensor], group)
        ins = outs = []
        shape = list(tensor.shape)
        if name.startswith("all_to_all"):
            n = dist.get_world_size(group)
            row = math.prod(tensor.shape[1:])
            ins = [s * row for s in (a["input_split_sizes"] or [tensor.shape[0] // n] * n)]
            outs = [s * row for s in (a["output_split_sizes"] or [tensor.shape[0] // n] * n)]
            shape = shape[1:]
        root = a.get("src")
        dim = a.get("gather_dim", a.get("scatter_dim", 0))
        header = _header(name, tensor.dtype, shape, a.get("reduceOp"), root, dim)
        _cross_check(f"functional {name}", group, header, ins, outs)

    return _checked(original, check)


# --- object collectives -------------------------------------------------------------------


def _object_wrapper(name: str, original):
    def check(a: dict) -> None:
        group = a.get("group") or dist.group.WORLD
        if group not in _STATE.cpu_role and a.get("device") is None:
            raise StrictCollectiveError(
                f"{name} on group {_group_name(group)}, a trial group (NCCL on GPUs): object "
                "collectives pickle to a device tensor and sync on it there; send objects over "
                "the gloo side group (profiler.clock.cpu_group()) or name the device"
            )

    return _checked(original, check)


# --- point-to-point -----------------------------------------------------------------------


def _p2p_wrapper(name: str, original):
    sends = name in ("send", "isend")

    def check(a: dict) -> None:
        op = _P2P(a, sends, blocking=not name.startswith("i"))
        op.check_local(name)
        if sends:
            op.announce()
            if op.blocking:
                op.await_ack(name)
        else:
            op.match(name)

    return _checked(original, check)


class _P2P:
    """One point-to-point op, checked over its group's mirror against the peer's.

    Per directed pair, the k-th send's descriptor (dtype, element count, blocking) goes to the
    peer on the mirror (tag ``_TAG_DESCRIPTOR``), where the k-th recv compares it with its own
    and, for a blocking send, acknowledges (``_TAG_ACK``). A blocking send waits for that, as
    NCCL's send kernel waits for the peer's recv: two ranks that both send first raise after
    the p2p timeout instead of hanging."""

    def __init__(self, a: dict, sends: bool, blocking: bool) -> None:
        self.tensor = a["tensor"]
        self.group = a.get("group") or dist.group.WORLD
        self.sends, self.blocking = sends, blocking
        key, group_key = ("dst", "group_dst") if sends else ("src", "group_src")
        peer = a.get(key)
        if peer is None and a.get(group_key) is not None:
            peer = dist.get_global_rank(self.group, a[group_key])
        self.peer = peer
        self.mirror = _side_mirror(self.group)

    def check_local(self, name: str) -> None:
        _check_contiguous(name, [self.tensor], self.group)
        if self.peer is None:
            raise StrictCollectiveError(
                f"{name} without a source on group {_group_name(self.group)}: NCCL has no "
                "any-source receive; name src"
            )

    def _descriptor(self) -> torch.Tensor:
        mine = [_crc(self.tensor.dtype), self.tensor.numel(), int(self.blocking)]
        return torch.tensor(mine, dtype=torch.int64)

    @_unseen
    def announce(self) -> None:
        if self.mirror is None:
            return
        desc = self._descriptor()
        work = _STATE.original("isend")(desc, self.peer, group=self.mirror, tag=_TAG_DESCRIPTOR)
        _keep((work, desc))
        if self.blocking:  # only a blocking send waits for the peer's acknowledgement
            ack = torch.zeros(1, dtype=torch.int64)
            self.ack = _STATE.original("irecv")(ack, self.peer, group=self.mirror, tag=_TAG_ACK)
            _keep((self.ack, ack))

    def await_ack(self, name: str) -> None:
        if self.mirror is not None:
            self._wait(self.ack, name, "reach the matching recv")

    @_unseen
    def match(self, name: str) -> None:
        if self.mirror is None:
            return
        theirs = torch.zeros(3, dtype=torch.int64)
        work = _STATE.original("irecv")(theirs, self.peer, group=self.mirror, tag=_TAG_DESCRIPTOR)
        self._wait(work, name, "send")
        mine = self._descriptor()
        if theirs[:2].tolist() != mine[:2].tolist():
            raise StrictCollectiveError(
                f"{name} from global rank {self.peer} on group {_group_name(self.group)} "
                f"expects {self.tensor.numel()} elements of {self.tensor.dtype}, but the "
                f"matching send has {int(theirs[1])} elements of another dtype or size "
                "(descriptor mismatch); NCCL would move the wrong bytes"
                if theirs[0] != mine[0]
                else f"{name} from global rank {self.peer} on group "
                f"{_group_name(self.group)} expects {self.tensor.numel()} elements, the "
                f"matching send has {int(theirs[1])}; NCCL would move the wrong bytes"
            )
        if theirs[2]:  # the matching send blocks until this recv is reached
            ack = torch.ones(1, dtype=torch.int64)
            work = _STATE.original("isend")(ack, self.peer, group=self.mirror, tag=_TAG_ACK)
            _keep((work, ack))

    def _wait(self, work, name: str, what: str) -> None:
        timeout = p2p_timeout_s()
        try:
            work.wait(timedelta(seconds=timeout))
        except RuntimeError as e:
            raise StrictCollectiveError(
                f"{name} with global rank {self.peer} on group {_group_name(self.group)}: the "
                f"peer did not {what} within {timeout:g} s; NCCL deadlocks here (a blocking "
                "send waits for the peer's recv: order the pair's sends and recvs, or batch "
                f"them with batch_isend_irecv) ({e})"
            ) from None


def _keep(*pairs) -> None:
    """Hold side ops' tensors until their works complete."""
    _STATE.pending = [p for p in _STATE.pending if not p[0].is_completed()] + list(pairs)


def _batch_wrapper(original):
    @functools.wraps(original)
    def wrapper(p2p_op_list):
        if _skip() or not p2p_op_list:
            return original(p2p_op_list)
        ops = []
        for p in p2p_op_list:
            sends = p.op is c10d.isend
            key = "group_dst" if sends else "group_src"
            ops.append(
                _P2P({"tensor": p.tensor, "group": p.group, key: p.group_peer}, sends, False)
            )
        for op in ops:
            op.check_local("batch_isend_irecv")
        for op in [o for o in ops if o.sends]:  # NCCL groups the batch: sends never wait
            op.announce()
        for op in [o for o in ops if not o.sends]:
            op.match("batch_isend_irecv")
        with _Depth():
            return original(p2p_op_list)

    return wrapper


# --- groups -------------------------------------------------------------------------------


def _mirror(ranks: list[int] | None) -> dist.ProcessGroup:
    """A gloo group over ``ranks`` (None: every rank); collective over the default group."""
    with _Depth():
        mirror = _STATE.original("new_group")(ranks, backend="gloo", group_desc="strict_mirror")
    if mirror is not None and mirror is not c10d.GroupMember.NON_GROUP_MEMBER:
        _STATE.cpu_role.add(mirror)
    return mirror


def _new_group_wrapper(original):
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if _STATE.nested() or _STATE.world is None:
            return original(*args, **kwargs)
        a = _arguments(original, args, kwargs)
        if a.get("use_local_synchronization"):
            return original(*args, **kwargs)
        ranks = sorted(a["ranks"]) if a.get("ranks") is not None else None
        _check_creation(ranks, a.get("backend"))
        group = original(*args, **kwargs)
        if str(a.get("backend") or "").lower() == "gloo" and group is not None:
            _STATE.cpu_role.add(group)
        mirror = _mirror(ranks)
        if group is not None and group is not c10d.GroupMember.NON_GROUP_MEMBER:
            _STATE.mirrors[group] = mirror
        return group

    return wrapper


@_unseen
def _check_creation(ranks, backend) -> None:
    """Every rank of the default group makes every group, with the same ranks, in the same
    order, and names it alike: compare the k-th creation's ranks, backend and the name it will
    take (``new_group`` names a group by the process's group counter) over the world's
    mirror, before the group's rendezvous would hang on the difference."""
    _STATE.creations += 1
    name = str(c10d._world.group_count)
    world = _STATE.world
    header = [_crc(ranks), _crc(str(backend or "")), _STATE.creations, _crc(name)]
    rows = _gather_rows(
        torch.tensor(header, dtype=torch.int64),
        _STATE.mirrors[world],
        len(dist.get_process_group_ranks(world)),
    )
    differ = [r for r, other in enumerate(rows) if other != header]
    if not differ:
        return
    if any(other[:3] != header[:3] for other in rows):
        raise StrictCollectiveError(
            f"new_group #{_STATE.creations} (ranks {ranks}) on rank {dist.get_rank()} is not "
            f"the same call on rank(s) {differ}: every rank must call new_group for every "
            "group, with the same ranks, in the same order (NCCL names groups by a counter, "
            "so a group made on some ranks only shifts every later group's name)"
        )
    raise StrictCollectiveError(
        f"new_group #{_STATE.creations} (ranks {ranks}) would be named {name!r} on rank "
        f"{dist.get_rank()} but not on rank(s) {differ}: a group was made on some ranks only "
        "(outside new_group's order), and NCCL's rendezvous under two names hangs"
    )


def _destroy_wrapper(original):
    @functools.wraps(original)
    def wrapper(group=None):
        if group is None or group is dist.group.WORLD:
            _STATE.mirrors.clear()  # destroying the world destroys every group
            _STATE.world = None
            _STATE.cpu_role.clear()
            return original(group)
        mirror = _STATE.mirrors.pop(group, None)
        _STATE.cpu_role.discard(group)
        result = original(group)
        if mirror is not None and mirror in c10d._world.pg_map:
            original(mirror)
            _STATE.cpu_role.discard(mirror)
        return result

    return wrapper
