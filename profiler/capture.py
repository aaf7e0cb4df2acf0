"""Capture per-rank timelines from torch.profiler around any training loop.

    with profiler.record(rank=dist.get_rank()) as rec:
        for i in range(3):
            with rec.step(i):
                train_step()
    spans = rec.spans                       # list[Span]
    profiler.breakdown(spans)               # compute / comm / overlap / exposed / idle

What becomes a span:
- **step**: each ``rec.step(i)`` block (a ``record_function`` range), from CPU events only;
- **compute**: on CPU, ``aten::*`` ops, with the category of the innermost ``rec.phase(...)``
  range around them (forward / backward / optimizer / pipeline). On CUDA (the events hold CUDA
  kernels), the kernels other than NCCL's, and no CPU op at all: an aten op's CPU time there is
  dispatch and launch, and counting it as compute would hide communication that nothing on the
  GPU overlaps. A kernel takes the category of the CPU op that launched it (so the optimizer
  step's kernels are ``optimizer``, as its ops are on CPU), or ``kernel`` when no launching op
  is known;
- **comm / p2p**: on CPU the ``gloo:*`` events of gloo's worker threads (the communication
  itself, not its launch), paired in order with their ``c10d::*`` / ``_c10d_functional::*``
  launch on the calling thread for the collective's name and its full payload; on CUDA the NCCL
  kernels, with payload from the profiler's ``record_param_comms`` record of that collective.

CUDA rules, as torch 2.13 reports the events (``prof.profiler.kineto_results.events()``):
- ``record_function`` ranges come twice: a CPU ``user_annotation`` and a ``gpu_user_annotation``
  (``device_type`` CUDA) of the same name. Steps, phases and every CPU-side rule read CPU events
  only; of the device events only ``activity_type() == "kernel"`` becomes a span (memcpy,
  memset, syncs and GPU annotations do not).
- An NCCL kernel's ``linked_correlation_id()`` is the ``correlation_id()`` of the CPU op that
  launched it: the ``record_param_comms`` record that ProcessGroupNCCL opens around the launch
  (``RECORD_PARAM_COMMS_DATA``), or an op that holds it. Its ``extra_meta()`` carries the
  collective (``"Collective name"``, ``"Seq"``, ``"In msg nelems"``, ``"Out msg nelems"``,
  ``"dtype"``, as ``torch/csrc/profiler/util.cpp`` ``saveNcclMeta`` writes them); the payload is
  max(in, out) elements of that dtype (all-gather's output, reduce-scatter's input). The work's
  ``wait()`` opens a record of its own, collective ``"wait"``, no tensors, the same ``Seq``: a
  kernel only takes a record of its own collective, so waits are skipped. A kernel with no
  linked record takes the first unclaimed record of its collective in launch order (within a
  process group, ``Seq`` order).
- NCCL runs every send and receive as one ``SendRecv`` kernel: its direction is its record's
  collective ("send" / "recv"), and a grouped launch (``batch_isend_irecv``) gives one span per
  transfer of the group, each with its own payload (``_CommRecords``).

A kernel's launching op is the CPU op its ``linked_correlation_id()`` names (an ``aten::*`` op,
or ``record_param_comms``); its phase is the innermost phase range open on the op's thread when
it started, or, failing one there, on any thread: autograd runs a CUDA backward on a device
thread of its own (``torch/csrc/autograd/engine.cpp``, one worker thread per device), inside the
``backward`` range that the training thread opened and waits in.

Groups: a span's ``group`` is the mesh dimension its collective talks on. On CUDA the record
names its process group (``"Process Group Name"``: ``ProcessGroup.group_name``; ``"Process Group
Description"``: ``DeviceMesh`` describes its dimensions' groups as ``mesh_<dim>``); a caller
passes ``group_names`` (process-group name → mesh dimension), and a group it does not name is
taken from its description, else '' (the whole world). Gloo events carry no process-group name,
so a caller may pass ``group_of(launch_name)`` that names the group from the launching API (see
``autotune.trial.runner`` for both mappings it uses). Where two mechanisms launch the same c10d
ops on different groups, the one that is not the caller's default opens ``group_range(dim)``
around its collectives (context parallelism's K/V all-gather, beside FSDP's on dp), and a gloo
collective launched inside such a range on the same thread talks on its ``dim``.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from profiler.spans import COMM, COMPUTE, P2P, STEP, Span

STEP_PREFIX = "profiler::step#"
PHASE_PREFIX = "profiler::"
PHASES = ("forward", "backward", "optimizer", "pipeline")
GROUP_PREFIX = "profiler::group::"
"""The prefix of a ``group_range``: the collectives launched in it talk on the named mesh dim."""
KERNEL = "kernel"
"""The category of a CUDA kernel whose launching CPU op is not among the events."""

# Launch op → collective family, as run by gloo. Gloo runs reduce-scatter as an all-reduce.
_LAUNCH_FAMILY = {
    "allreduce": "all_reduce",
    "all_reduce": "all_reduce",
    "reduce_scatter": "all_reduce",
    "_reduce_scatter_base": "all_reduce",
    "allgather": "all_gather",
    "all_gather": "all_gather",
    "_allgather_base": "all_gather",
    "broadcast": "broadcast",
    "send": "send",
    "recv": "recv",
    "recv_any_source": "recv",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all",  # all_to_all_single (expert parallelism's dispatch)
    "barrier": "barrier",
    "reduce": "reduce",
    "gather": "gather",
    "scatter": "scatter",
}
_GLOO_NAMES = {
    "all_reduce": "all_reduce",
    "all_gather": "all_gather",
    "broadcast": "broadcast",
    "send": "send",
    "recv": "recv",
    "alltoall": "all_to_all",
    "barrier": "barrier",
    "reduce": "reduce",
    "gather": "gather",
    "scatter": "scatter",
    "allreduce_coalesced": "all_reduce",
    "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter": "all_reduce",
}
_ELEMENT_SIZE = {
    "float": 4,
    "c10::Half": 2,
    "c10::BFloat16": 2,
    "double": 8,
    "long int": 8,
    "int": 4,
    "bool": 1,
    "unsigned char": 1,
    "signed char": 1,
    "short int": 2,
    "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1,
}


def _launch_collective(name: str) -> str | None:
    """'c10d::_allgather_base_' → '_allgather_base'; None for non-collective ops."""
    if not name.startswith(("c10d::", "_c10d_functional::")):
        return None
    op = name.split("::", 1)[1].rstrip("_")
    for _ in range(2):  # allgather_into_tensor_coalesced → allgather
        op = re.sub(r"(_coalesced|_into_tensor|_tensor)$", "", op)
    return op if op in _LAUNCH_FAMILY else None


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _payload(event) -> int:
    """Bytes of the first tensor input of an event, from its recorded shape and dtype."""
    shapes, dtypes = event.shapes(), event.dtypes()
    for shape, dtype in zip(shapes, dtypes):
        if shape:
            return _numel(shape) * _ELEMENT_SIZE.get(dtype, 4)
    return 0


@dataclass
class Recorder:
    """Handle returned by :func:`record`; ``spans`` is filled when the block exits."""

    rank: int
    clock_offset_ns: int = 0
    group_of: Callable[[str], str] | None = None
    """Gloo: the mesh dimension of a collective from its launching op's name."""
    group_names: Mapping[str, str] = field(default_factory=dict)
    """CUDA: the mesh dimension of each process group, by its name (``group_name``)."""
    spans: list[Span] = field(default_factory=list)

    @contextlib.contextmanager
    def step(self, index: int) -> Iterator[None]:
        with record_function(f"{STEP_PREFIX}{index}"):
            yield

    def phase(self, name: str):
        """A range whose compute spans get category ``name`` (forward, backward, …)."""
        return record_function(PHASE_PREFIX + name)


def group_range(dim: str):
    """A range whose gloo collectives are labelled with mesh dimension ``dim`` (module docstring,
    "Groups"); a plain ``record_function``, so nothing when no profiler runs."""
    return record_function(GROUP_PREFIX + dim)


@contextlib.contextmanager
def record(
    *,
    rank: int = 0,
    clock_offset_ns: int = 0,
    group_of: Callable[[str], str] | None = None,
    group_names: Mapping[str, str] | None = None,
    cuda: bool | None = None,
) -> Iterator[Recorder]:
    """Profile the block and turn its events into :class:`Span` s on ``rank``.

    ``clock_offset_ns`` is subtracted from every timestamp (this rank's clock minus the
    reference rank's, see :func:`profiler.clock.measure_offset`). ``group_of`` (gloo) and
    ``group_names`` (CUDA) name the mesh dimension of each collective (module docstring)."""
    rec = Recorder(rank, clock_offset_ns, group_of, dict(group_names or {}))
    if cuda is None:
        cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with _cupti_teardown(cuda), profile(activities=activities, record_shapes=True) as prof:
        yield rec
    rec.spans = spans_from_events(prof.profiler.kineto_results.events(), rec)


TEARDOWN_CUPTI = "TEARDOWN_CUPTI"
"""Kineto's switch: when it reads "1" as the profiler stops, it finalises CUPTI (detaches it
from the process); otherwise CUPTI's callbacks stay subscribed and every later kernel launch
pays for them, 10–20% of a training step after the profiling is over."""


@contextlib.contextmanager
def _cupti_teardown(cuda: bool) -> Iterator[None]:
    """On CUDA, profile with ``TEARDOWN_CUPTI=1`` so that CUPTI is detached when the profiler
    stops, and the steps timed after it (the next trial's, in a warm worker) run as unprofiled
    ones. A value already set is left alone: torch sets "0" itself where teardown is unsafe (CUDA
    graphs before CUDA 12.6), and a user may choose. The variable is restored afterwards, unless
    something inside changed it."""
    if not cuda or TEARDOWN_CUPTI in os.environ:
        yield
        return
    os.environ[TEARDOWN_CUPTI] = "1"
    try:
        yield
    finally:
        if os.environ.get(TEARDOWN_CUPTI) == "1":
            del os.environ[TEARDOWN_CUPTI]


def spans_from_events(events, rec: Recorder) -> list[Span]:
    events = sorted(events, key=lambda e: e.start_ns())
    offset = rec.clock_offset_ns
    kernels = [e for e in events if _is_kernel(e)]
    cpu = [e for e in events if e.device_type() == DeviceType.CPU]
    steps: list[tuple[int, int, int]] = []  # (start, end, index)
    phases = _Phases()
    groups: dict[int, list[tuple[int, int, str]]] = {}  # group_range's, by thread
    launches: list = []
    gloo: list = []
    compute: list = []
    param_comms: list = []
    for e in cpu:
        name = e.name()
        start, end = e.start_ns(), e.start_ns() + e.duration_ns()
        if name.startswith(STEP_PREFIX):
            steps.append((start, end, int(name[len(STEP_PREFIX) :])))
        elif name.startswith(PHASE_PREFIX) and name[len(PHASE_PREFIX) :] in PHASES:
            phases.ranges.setdefault(e.start_thread_id(), []).append(
                (start, end, name[len(PHASE_PREFIX) :])
            )
        elif name.startswith(GROUP_PREFIX):
            groups.setdefault(e.start_thread_id(), []).append(
                (start, end, name[len(GROUP_PREFIX) :])
            )
        elif name.startswith("autograd::engine::evaluate_function"):
            phases.autograd.setdefault(e.start_thread_id(), []).append((start, end))
        elif name.startswith("gloo:"):
            gloo.append(e)
        elif _launch_collective(name):
            launches.append(e)
        elif name == "record_param_comms":
            param_comms.append(e)
        elif name.startswith("aten::") and not kernels:  # on CUDA, compute is kernels only
            compute.append(e)

    def step_of(t: int) -> int:
        for s, en, idx in steps:
            if s <= t < en:
                return idx
        return -1

    spans = [Span(rec.rank, idx, STEP, "step", "", s - offset, en - s) for s, en, idx in steps]
    for e in compute:
        spans.append(
            Span(
                rec.rank,
                step_of(e.start_ns()),
                COMPUTE,
                e.name(),
                phases.category(e),
                e.start_ns() - offset,
                e.duration_ns(),
            )
        )
    spans += _gloo_spans(gloo, launches, rec, step_of, groups)
    if kernels:
        # Torch ops by correlation id; a CUDA runtime call's id is CUPTI's, another numbering.
        ops = {
            e.correlation_id(): e
            for e in cpu
            if e.correlation_id() and not _activity(e).endswith(("_runtime", "_driver"))
        }
        calls = {
            e.correlation_id(): e
            for e in cpu
            if e.correlation_id() and _activity(e).endswith(("_runtime", "_driver"))
        }
        records = _CommRecords(param_comms, ops, calls)
        for e in kernels:
            spans += _kernel_spans(e, records, ops, phases, rec, step_of)
    spans.sort(key=lambda s: s.start_ns)
    return spans


@dataclass
class _Phases:
    """The ``rec.phase`` ranges and autograd's backward-node ranges, by CPU thread."""

    ranges: dict[int, list[tuple[int, int, str]]] = field(default_factory=dict)
    autograd: dict[int, list[tuple[int, int]]] = field(default_factory=dict)

    def category(self, e, *, any_thread: bool = False) -> str:
        """The innermost phase open on ``e``'s thread when it started ('op': none).
        ``any_thread``: failing one there, the innermost open on any thread (a CUDA backward's
        ops run on autograd's device thread, inside the training thread's backward range)."""
        thread, t = e.start_thread_id(), e.start_ns()
        phase = _innermost(self.ranges.get(thread, ()), t)
        if phase is None and any_thread:
            phase = _innermost((r for rs in self.ranges.values() for r in rs), t)
        if phase is None:
            return "op"
        if phase in ("pipeline", "forward"):
            # Inside a schedule, autograd's node ranges tell backward work from forward work.
            in_backward = any(s <= t < en for s, en in self.autograd.get(thread, ()))
            return "backward" if in_backward else "forward"
        return phase


def _innermost(ranges: Iterable[tuple[int, int, str]], t: int) -> str | None:
    """The phase of the latest-starting range that holds time ``t``."""
    best = None
    for s, en, phase in ranges:
        if s <= t < en and (best is None or s >= best[0]):
            best = (s, phase)
    return best[1] if best is not None else None


def _is_kernel(e) -> bool:
    """A CUDA kernel; not a GPU-side annotation, memcpy, memset or sync (also device CUDA)."""
    return e.device_type() == DeviceType.CUDA and _activity(e) == "kernel"


_CUPTI_API = re.compile(r"^cu(da)?[A-Z]")
"""CUPTI's runtime and driver records are named after the call: cudaLaunchKernel,
cuLaunchKernelEx, cudaStreamSynchronize."""


def _activity(e) -> str:
    """Kineto's activity type of an event ('kernel', 'cpu_op', 'cuda_runtime', …).

    torch 2.13's ``_KinetoEvent`` says (``activity_type()``); earlier ones, 2.11 among them
    (the first GPU this ran on), do not, and the type is derived as Kineto assigns it
    (``libkineto/src/ActivityType.cpp``, ``CuptiActivity.cpp``): a user annotation by its
    flag (``is_user_annotation()``, or this profiler's own range prefix where the flag is
    missing too), a runtime or driver call by its name, and on the device a memcpy, memset or
    synchronisation by the name CUPTI gives it ('Memcpy HtoD …', 'Memset (Device)',
    'Stream Sync'); every other device activity is a kernel."""
    activity = getattr(e, "activity_type", None)
    if activity is not None:
        return activity()
    flag = getattr(e, "is_user_annotation", None)
    name = e.name()
    annotation = bool(flag()) if flag is not None else name.startswith(PHASE_PREFIX)
    if e.device_type() == DeviceType.CPU:
        if annotation:
            return "user_annotation"
        return "cuda_runtime" if _CUPTI_API.match(name) else "cpu_op"
    if annotation:
        return "gpu_user_annotation"
    if name.startswith("Memcpy"):
        return "gpu_memcpy"
    if name.startswith("Memset"):
        return "gpu_memset"
    if name.endswith(" Sync"):
        return "cuda_sync"
    return "kernel"


def _gloo_spans(
    gloo: list,
    launches: list,
    rec: Recorder,
    step_of,
    groups: dict[int, list[tuple[int, int, str]]],
) -> list[Span]:
    """Pair each gloo event with the earliest unmatched launch of the same family before it;
    its group is that of the innermost ``group_range`` around the launch, else ``group_of``'s."""
    pending: dict[str, list] = {}
    for launch in _outermost(launches):
        op = _launch_collective(launch.name())
        pending.setdefault(_LAUNCH_FAMILY[op], []).append(launch)
    spans = []
    for e in gloo:
        family = _GLOO_NAMES.get(e.name()[len("gloo:") :], e.name()[len("gloo:") :])
        queue = pending.get(family, [])
        launch = next((x for x in queue if x.start_ns() <= e.start_ns()), None)
        if launch is not None:
            queue.remove(launch)
        op = _launch_collective(launch.name()) if launch is not None else family
        name = _canonical(op)
        payload = _payload(e)
        if family == "all_gather" and launch is not None:
            payload = _payload(launch)  # the launch's first tensor is the gathered output
        group = ""
        if launch is not None:
            ranged = _innermost(groups.get(launch.start_thread_id(), ()), launch.start_ns())
            group = ranged or (rec.group_of(launch.name()) if rec.group_of else "")
        kind = P2P if family in ("send", "recv") else COMM
        spans.append(
            Span(
                rec.rank,
                step_of(e.start_ns()),
                kind,
                name,
                "",
                e.start_ns() - rec.clock_offset_ns,
                e.duration_ns(),
                payload,
                group,
            )
        )
    return spans


def _outermost(launches: list) -> list:
    """Drop launches nested in another on the same thread (a functional collective launches a
    c10d one inside itself; only one collective runs)."""
    out, open_until = [], {}
    for e in launches:  # sorted by start
        thread = e.start_thread_id()
        if e.start_ns() < open_until.get(thread, -1):
            continue
        out.append(e)
        open_until[thread] = e.start_ns() + e.duration_ns()
    return out


def _canonical(op: str) -> str:
    op = op.lstrip("_")
    return {
        "allreduce": "all_reduce",
        "allgather": "all_gather",
        "allgather_base": "all_gather",
        "reduce_scatter_base": "reduce_scatter",
        "recv_any_source": "recv",
        "alltoall_base": "all_to_all",
    }.get(op, op)


_NCCL_KERNEL = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+)", re.IGNORECASE)
_NCCL_NAMES = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "reducescatter": "reduce_scatter",
    "broadcast": "broadcast",
    "sendrecv": "send_recv",
    "send": "send",
    "recv": "recv",
    "alltoall": "all_to_all",
    "reduce": "reduce",
}
# Bytes per element by c10::toString(ScalarType), the "dtype" of a record's extra_meta
# (c10/core/ScalarType.h).
_SCALAR_TYPE_SIZE = {
    "Float": 4,
    "Half": 2,
    "BFloat16": 2,
    "Double": 8,
    "Long": 8,
    "Int": 4,
    "Short": 2,
    "Char": 1,
    "Byte": 1,
    "Bool": 1,
    "Float8_e4m3fn": 1,
    "Float8_e5m2": 1,
    "ComplexFloat": 8,
    "ComplexDouble": 16,
}


def _meta(record, key: str) -> str | None:
    """One value of a record's NCCL metadata; saveNcclMeta writes strings JSON-quoted."""
    value = record.extra_meta().get(key)
    return value.strip('"') if value is not None else None


def _record_collective(record) -> str:
    """'allreduce', '_allgather_base', 'wait', …; '' when the record has no metadata."""
    return _meta(record, "Collective name") or ""


def _record_payload(record) -> int:
    """Bytes of the collective: max(in, out) elements (an all-gather's output, a
    reduce-scatter's input) of the record's dtype; else its first tensor input's bytes."""
    nelems = [_meta(record, k) for k in ("In msg nelems", "Out msg nelems")]
    dtype = _meta(record, "dtype")
    if dtype in _SCALAR_TYPE_SIZE and any(n is not None for n in nelems):
        return max(int(n) for n in nelems if n is not None) * _SCALAR_TYPE_SIZE[dtype]
    return _payload(record)


def _family(name: str) -> str:
    """A collective's name as a record ('_allgather_base') or a kernel ('AllGather') spells it:
    'allgather'."""
    name = name.lower().replace("_", "")
    for suffix in ("base", "coalesced", "intotensor", "tensor"):
        name = name.removesuffix(suffix)
    return name


# NCCL kernel → the record collectives it runs ('SendRecv' runs send, recv and all-to-all).
_KERNEL_FAMILIES = {"sendrecv": {"send", "recv", "alltoall"}}
_P2P_FAMILIES = ("send", "recv")
"""Record collectives of point-to-point transfers: a grouped launch runs several in one
SendRecv kernel."""


class _CommRecords:
    """The collectives' ``record_param_comms`` records, claimed by NCCL kernels.

    A kernel's candidates are the unclaimed records of its own collective, so a ``wait`` record
    (collective "wait", no tensors) is never one. Of those it takes the record it is linked to
    (``linked_correlation_id``) or one inside the CPU op it is linked to; failing both, the first
    in launch order.

    A SendRecv kernel may run a whole group of transfers: ``batch_isend_irecv`` (pipelining's
    sends and receives) opens one record per ``isend`` / ``irecv`` while NCCL only queues them,
    and ``ncclGroupEnd`` launches one kernel for the group (NCCL ≥ 2.19 names it
    ``ncclDevKernel_SendRecv`` whatever the direction). Such a kernel claims, beside its record,
    the unclaimed send / recv records of the same process group on the same thread that started
    after it and before the kernel's launch: the CUDA runtime or driver call whose (CUPTI)
    correlation id is the kernel's, else the kernel's own start. A kernel linked to a record
    itself was launched inside it, alone."""

    def __init__(
        self, records: list, ops: Mapping[int, object], calls: Mapping[int, object] | None = None
    ):
        self.unclaimed = list(records)
        self.by_id = ops
        self.calls = calls or {}

    def claim(self, kernel, family: str):
        families = _KERNEL_FAMILIES.get(family, {family})
        candidates = [r for r in self.unclaimed if _family(_record_collective(r)) in families]
        link = kernel.linked_correlation_id()  # 0: none
        linked = self.by_id.get(link) if link else None
        record = None
        if linked is not None:
            end = linked.start_ns() + linked.duration_ns()
            record = next(
                (
                    r
                    for r in candidates
                    if r.correlation_id() == link
                    or (
                        r.start_thread_id() == linked.start_thread_id()
                        and linked.start_ns() <= r.start_ns() < end
                    )
                ),
                None,
            )
        if record is None and candidates:
            record = candidates[0]
        if record is not None:
            self.unclaimed.remove(record)
        return record

    def claim_launch(self, kernel, family: str) -> list:
        """The records one kernel runs: its own (``claim``) and, for a SendRecv kernel of a
        grouped launch, the rest of the group's transfers (the class docstring)."""
        record = self.claim(kernel, family)
        if record is None:
            return []
        if family != "sendrecv" or _family(_record_collective(record)) not in _P2P_FAMILIES:
            return [record]
        link = kernel.linked_correlation_id()
        if link and record.correlation_id() == link:
            return [record]
        call = self.calls.get(kernel.correlation_id()) if kernel.correlation_id() else None
        until = call.start_ns() if call is not None else kernel.start_ns()
        linked = self.by_id.get(link) if link else None
        if linked is not None:
            until = min(until, linked.start_ns() + linked.duration_ns())
        pg = _meta(record, "Process Group Name")
        group = [record] + [
            r
            for r in self.unclaimed
            if _family(_record_collective(r)) in _P2P_FAMILIES
            and r.start_thread_id() == record.start_thread_id()
            and _meta(r, "Process Group Name") == pg
            and record.start_ns() <= r.start_ns() < until
        ]
        for r in group[1:]:
            self.unclaimed.remove(r)
        return group


def _kernel_spans(
    e, records: _CommRecords, ops: Mapping[int, object], phases: _Phases, rec: Recorder, step_of
) -> list[Span]:
    """A CUDA kernel: NCCL's are communication (payload and group from record_param_comms),
    others compute, in the phase of the op that launched them (``KERNEL`` if none is known).
    A SendRecv kernel gives one span per transfer it runs, each named by its record (send,
    recv, or all_to_all), over the kernel's interval; with no record it is 'send_recv'.

    Not exercised on CPU-only machines (tests/profiler/test_capture_cuda.py runs the rules on
    events shaped as torch 2.13 emits them); the NCCL kernel names follow NCCL ≥ 2.19
    (``ncclDevKernel_AllReduce_Sum_f32_RING_LL``)."""
    m = _NCCL_KERNEL.search(e.name())
    start = e.start_ns() - rec.clock_offset_ns
    step = step_of(e.start_ns())
    if not m:
        launcher = ops.get(e.linked_correlation_id() or -1)
        category = phases.category(launcher, any_thread=True) if launcher is not None else KERNEL
        return [Span(rec.rank, step, COMPUTE, e.name(), category, start, e.duration_ns())]
    family = m.group(1).lower()
    claimed = records.claim_launch(e, family)
    if not claimed:
        name = _NCCL_NAMES.get(family, family)
        kind = P2P if name in ("send", "recv", "send_recv") else COMM
        return [Span(rec.rank, step, kind, name, "", start, e.duration_ns())]
    spans = []
    for record in claimed:
        name = _NCCL_NAMES.get(family, family)
        if family == "sendrecv":
            name = _P2P_NAMES.get(_family(_record_collective(record)), name)
        kind = P2P if name in ("send", "recv") else COMM
        payload = _record_payload(record)
        group = _record_group(record, rec.group_names)
        spans.append(Span(rec.rank, step, kind, name, "", start, e.duration_ns(), payload, group))
    return spans


_P2P_NAMES = {"send": "send", "recv": "recv", "alltoall": "all_to_all"}
"""A SendRecv kernel's span name by the record collective it runs."""


def _record_group(record, group_names: Mapping[str, str]) -> str:
    """The mesh dimension of a record's process group: its name in ``group_names``, else the
    dimension of a ``DeviceMesh`` description ``mesh_<dim>`` ('mesh_default' is a whole-world
    group), else '' (the whole world)."""
    name = _meta(record, "Process Group Name")
    if name in group_names:
        return group_names[name]
    description = _meta(record, "Process Group Description") or ""
    dim = description.removeprefix("mesh_")
    return dim if description.startswith("mesh_") and dim != "default" else ""
