"""The CUDA rules of ``profiler.capture.spans_from_events``, on event lists shaped as torch 2.13
emits them on a GPU (no GPU here), with answers worked out by hand in the comments.

Where the shape comes from:
- the methods: those of ``torch._C._autograd._KinetoEvent`` (``kineto_results.events()``), as
  listed on real CPU events of torch 2.13 here; ``test_fake_event_methods_are_kineto_event_methods``
  checks each one the fake has against the real class;
- ``activity_type()`` strings: kineto's ``ActivityType.cpp`` ("cpu_op", "user_annotation",
  "gpu_user_annotation", "kernel"); ``device_type()``: ``deviceTypeFromActivity`` in
  ``torch/csrc/profiler/kineto_shim.cpp`` (kernels and GPU annotations are CUDA, CPU ops and
  annotations CPU). A ``record_function`` range on a CUDA run comes out twice: a CPU
  ``user_annotation`` and a ``gpu_user_annotation`` of the same name;
- ``linked_correlation_id()`` of a kernel: the ``correlation_id()`` of the CPU op that launched
  it (``profiler_kineto.cpp``: ``linked_activity_`` → ``correlationID()``); torch 2.13's own
  chrome-trace writer (``torch/profiler/_chrome_trace_export.py``) copies a kernel's
  ``record_param_comms`` metadata through that link;
- ``record_param_comms``: ``RECORD_PARAM_COMMS_DATA`` in torch 2.13's
  ``torch/csrc/distributed/c10d/ParamCommsUtils.hpp`` (inputs: the tensors, then seq, pg name,
  rank, collective name, splits, rank start/stride, world size, async); ProcessGroupNCCL passes an
  all-reduce's tensors as a TensorList, so ``shapes()`` holds no sizes for it. ``extra_meta()``:
  ``saveNcclMeta`` in ``torch/csrc/profiler/util.cpp`` (keys of ``util.h``, strings JSON-quoted,
  dtype as ``c10::toString``: "Float", "BFloat16"). ``WorkNCCL::wait`` opens
  ``RECORD_PARAM_COMMS`` with collective "wait", 0 elements, ``kByte`` and the collective's seq.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch
from torch.autograd import DeviceType

from autotune.config import TrialConfig, WorkloadSpec
from autotune.model.cluster import load_cluster
from autotune.model.span_fit import INTER, INTRA, collective_points, compute_point
from profiler import COMM, COMPUTE, STEP, bytes_per_step, rank_breakdown
from profiler.capture import KERNEL, Recorder, spans_from_events

MAIN, STREAM, NCCL_STREAM = 1, 7, 13  # CPU thread id; compute and NCCL stream ids
AUTOGRAD = 2  # autograd's CUDA device thread, which runs the backward's ops


@dataclass
class FakeEvent:
    """One ``_KinetoEvent``: only the methods ``spans_from_events`` calls."""

    _name: str
    _start: int
    _end: int
    _device: DeviceType = DeviceType.CPU
    _activity: str = "cpu_op"
    _thread: int = MAIN
    _correlation: int = 0
    _linked: int = 0
    _shapes: list = field(default_factory=list)
    _dtypes: list = field(default_factory=list)
    _meta: dict = field(default_factory=dict)

    def name(self):
        return self._name

    def start_ns(self):
        return self._start

    def duration_ns(self):
        return self._end - self._start

    def device_type(self):
        return self._device

    def activity_type(self):
        return self._activity

    def start_thread_id(self):
        return self._thread

    def correlation_id(self):
        return self._correlation

    def linked_correlation_id(self):
        return self._linked

    def shapes(self):
        return self._shapes

    def dtypes(self):
        return self._dtypes

    def extra_meta(self):
        return self._meta


def cpu_op(name, start, end, correlation=0, thread=MAIN):
    return FakeEvent(name, start, end, _thread=thread, _correlation=correlation)


def cpu_range(name, start, end, correlation=0):
    """A ``record_function`` range, CPU side."""
    return FakeEvent(name, start, end, _activity="user_annotation", _correlation=correlation)


def gpu_range(name, start, end):
    """The same range, GPU side."""
    return FakeEvent(name, start, end, DeviceType.CUDA, "gpu_user_annotation", STREAM)


def kernel(name, start, end, linked=0, stream=STREAM):
    return FakeEvent(name, start, end, DeviceType.CUDA, "kernel", stream, _linked=linked)


GEMM = "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute"
ELEMENTWISE = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>"
)
ALL_REDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
ALL_GATHER = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


WORLD_PG = ("0", "default_pg", [0, 1])
"""(name, description, ranks) of the default process group of two ranks."""


def _nccl_meta(collective, seq, in_nelems, out_nelems, dtype, pg=WORLD_PG):
    name, description, ranks = pg
    return {
        "Collective name": f'"{collective}"',
        "dtype": f'"{dtype}"',
        "In msg nelems": str(in_nelems),
        "Out msg nelems": str(out_nelems),
        "In split size": '"[]"',
        "Out split size": '"[]"',
        "Global rank start": "0",
        "Global rank stride": "1",
        "Group size": str(len(ranks)),
        "Process Group Name": f'"{name}"',
        "Process Group Description": f'"{description}"',
        "Process Group Ranks": f'"{list(ranks)}"',
        "Rank": "0",
        "Seq": str(seq),
        "Is asynchronized op": "1",
    }


def record(
    start,
    end,
    correlation,
    collective,
    seq,
    nelems,
    dtype,
    out_nelems=None,
    tensor_shape=None,
    pg=WORLD_PG,
):
    """A collective's record: a TensorList first input (no sizes), unless ``tensor_shape`` (a
    single-tensor input, as ``_allgather_base`` passes); on process group ``pg``."""
    first = ([tensor_shape], [dtype.lower()]) if tensor_shape else ([[]], ["TensorList"])
    rest_dtypes = [
        "",
        "",
        "Scalar",
        "",
        "ScalarList",
        "ScalarList",
        "Scalar",
        "Scalar",
        "Scalar",
        "Scalar",
    ]
    return FakeEvent(
        "record_param_comms",
        start,
        end,
        _correlation=correlation,
        _shapes=first[0] + [[]] * len(rest_dtypes),
        _dtypes=first[1] + rest_dtypes,
        _meta=_nccl_meta(
            collective, seq, nelems, nelems if out_nelems is None else out_nelems, dtype, pg
        ),
    )


def wait(start, end, correlation, seq):
    """``work.wait()``'s own record: collective 'wait', no tensors, the collective's seq."""
    dtypes = ["", "", "Scalar", "", "ScalarList", "ScalarList", "Scalar", "Scalar", "Scalar"]
    return FakeEvent(
        "record_param_comms",
        start,
        end,
        _correlation=correlation,
        _shapes=[[]] * len(dtypes),
        _dtypes=dtypes,
        _meta=_nccl_meta("wait", seq, 0, 0, "Byte"),
    )


def _spans(events, group_names=None):
    return spans_from_events(events, Recorder(rank=0, group_names=group_names or {}))


def test_fake_event_methods_are_kineto_event_methods():
    """Every method the fake offers exists on torch 2.13's real event class."""
    methods = [m for m in vars(FakeEvent) if not m.startswith("_") and callable(vars(FakeEvent)[m])]
    assert len(methods) == 11
    missing = [m for m in methods if not hasattr(torch._C._autograd._KinetoEvent, m)]
    assert missing == []


def test_gpu_annotations_do_not_double_steps():
    # Two steps, each a CPU range and its GPU twin (plus a phase range and its twin).
    events = []
    for index, (start, end) in enumerate([(0, 1000), (1000, 2000)]):
        events += [
            cpu_range(f"profiler::step#{index}", start, end),
            gpu_range(f"profiler::step#{index}", start + 100, end - 50),
            cpu_range("profiler::forward", start + 10, start + 400),
            gpu_range("profiler::forward", start + 150, start + 500),
            cpu_op("aten::mm", start + 20, start + 120, correlation=10 + index),
            kernel(GEMM, start + 150, start + 450, linked=10 + index),
        ]
    spans = _spans(events)
    steps = [(s.step, s.start_ns, s.end_ns) for s in spans if s.kind == STEP]
    assert steps == [(0, 0, 1000), (1, 1000, 2000)]
    b = rank_breakdown(spans, 0)
    assert (b.num_steps, b.window_ns, b.compute_ns) == (2, 2000, 600)  # kernels 2 × 300


def _overlap_timeline():
    """One step [0, 1000). The CPU dispatches mm [100, 300), add [450, 780) and mul
    [460, 560); their kernels run at [300, 500), [800, 900) and, on a second stream,
    [600, 700). The all-reduce's kernel runs [500, 800) on NCCL's stream."""
    return [
        cpu_range("profiler::step#0", 0, 1000, correlation=1),
        gpu_range("profiler::step#0", 300, 900),
        cpu_op("aten::mm", 100, 300, correlation=11),
        cpu_op("aten::add", 450, 780, correlation=12),
        cpu_op("aten::mul", 460, 560, correlation=13),
        cpu_op("c10d::allreduce_", 465, 495, correlation=20),
        record(470, 490, 21, "allreduce", seq=1, nelems=1000, dtype="Float"),
        kernel(GEMM, 300, 500, linked=11),
        kernel(ELEMENTWISE, 800, 900, linked=12),
        kernel(ELEMENTWISE, 600, 700, linked=13, stream=STREAM + 1),
        kernel(ALL_REDUCE, 500, 800, linked=21, stream=NCCL_STREAM),
    ]


def test_on_cuda_compute_is_kernels_and_exposed_comm_is_against_them():
    # compute = [300,500) ∪ [600,700) ∪ [800,900) = 400; comm = [500,800) = 300
    # overlap = comm ∩ compute = [600,700) = 100 → exposed 200; idle = 1000 - (400+300-100) = 400
    # (Counting the aten ops too: compute [100,780) ∪ [800,900) = 780, overlap [500,780) = 280,
    # exposed only 20: the all-reduce would look hidden behind CPU dispatch.)
    spans = _spans(_overlap_timeline())
    compute = [s for s in spans if s.kind == COMPUTE]
    assert sorted(s.name for s in compute) == sorted([GEMM, ELEMENTWISE, ELEMENTWISE])
    assert not any(s.name.startswith("aten::") for s in spans)
    b = rank_breakdown(spans, 0)
    assert (b.window_ns, b.compute_ns, b.comm_ns) == (1000, 400, 300)
    assert (b.overlap_ns, b.exposed_comm_ns, b.idle_ns) == (100, 200, 400)
    (comm,) = [s for s in spans if s.kind == COMM]
    assert (comm.name, comm.bytes) == ("all_reduce", 4000)  # 1000 float elements


def test_without_kernels_aten_ops_stay_compute():
    # The CPU path (gloo) as before: the same CPU events, no device events.
    # compute = [100,300) ∪ [450,780) ∪ [460,560) = 200 + 330 = 530
    events = [e for e in _overlap_timeline() if e.device_type() == DeviceType.CPU]
    spans = _spans(events)
    assert sorted(s.name for s in spans if s.kind == COMPUTE) == [
        "aten::add",
        "aten::mm",
        "aten::mul",
    ]
    assert rank_breakdown(spans, 0).compute_ns == 530


def _two_all_reduces(first_kernel_later: bool, link_to_launch: bool):
    """Two all-reduces (1000 Float = 4000 B, then 256 BFloat16 = 512 B), each waited on:
    records R1, W1, R2, W2 in that order on the CPU. A kernel links to its record, or (with
    ``link_to_launch``) to the c10d op around it."""
    events = [
        cpu_range("profiler::step#0", 0, 1000),
        cpu_op("c10d::allreduce_", 100, 150, correlation=30),
        record(110, 120, 31, "allreduce", seq=1, nelems=1000, dtype="Float"),
        wait(160, 170, 32, seq=1),
        cpu_op("c10d::allreduce_", 190, 230, correlation=34),
        record(200, 210, 33, "allreduce", seq=2, nelems=256, dtype="BFloat16"),
        wait(240, 250, 35, seq=2),
    ]
    first, second = (30, 34) if link_to_launch else (31, 33)
    times = [(600, 700), (300, 400)] if first_kernel_later else [(300, 400), (600, 700)]
    events += [
        kernel(ALL_REDUCE, *times[0], linked=first, stream=NCCL_STREAM),
        kernel(ALL_REDUCE, *times[1], linked=second, stream=NCCL_STREAM + 1),
    ]
    return events


@pytest.mark.parametrize(
    "first_kernel_later", [False, True], ids=["kernels-in-order", "kernels-reversed"]
)
@pytest.mark.parametrize(
    "link_to_launch", [False, True], ids=["linked-to-record", "linked-to-launch-op"]
)
def test_payload_comes_from_the_linked_record_not_the_next_one(first_kernel_later, link_to_launch):
    spans = _spans(_two_all_reduces(first_kernel_later, link_to_launch))
    comm = {(s.start_ns, s.end_ns): s.bytes for s in spans if s.kind == COMM}
    first, second = ((600, 700), (300, 400)) if first_kernel_later else ((300, 400), (600, 700))
    assert comm == {first: 4000, second: 512}


def test_unlinked_kernels_take_records_in_launch_order_skipping_waits():
    # No links: kernel i takes the i-th collective record, the waits between them skipped.
    # All-gathers with a single-tensor input of 100 / 30 floats into 2 ranks: the payload is
    # the gathered output, 200 × 4 = 800 B and 60 × 4 = 240 B.
    events = [
        cpu_range("profiler::step#0", 0, 1000),
        record(
            110, 120, 31, "_allgather_base", 1, 100, "Float", out_nelems=200, tensor_shape=[100]
        ),
        wait(160, 170, 32, seq=1),
        record(200, 210, 33, "_allgather_base", 2, 30, "Float", out_nelems=60, tensor_shape=[30]),
        wait(240, 250, 34, seq=2),
        kernel(ALL_GATHER, 300, 400, stream=NCCL_STREAM),
        kernel(ALL_GATHER, 500, 600, stream=NCCL_STREAM),
    ]
    spans = _spans(events)
    assert [(s.name, s.bytes) for s in spans if s.kind == COMM] == [
        ("all_gather", 800),
        ("all_gather", 240),
    ]


# ---- the mesh dimension of a collective (issue 23, defect 4) --------------------------------
TP_PG = ("3", "mesh_tp", range(8))
DP_PG = ("5", "mesh_dp", [0, 8])
"""Rank 0's TP and DP groups in a tp 8 × dp 2 mesh (16 ranks numbered with tp fastest), with
the names new_group gives them and the descriptions DeviceMesh writes (``mesh_<dim>``)."""


def _tp_and_dp_collectives(tp_pg=TP_PG, dp_pg=DP_PG):
    """An all-reduce of 1000 BFloat16 on the TP group, then an all-gather of 500 → 1000
    BFloat16 on the DP group, each kernel linked to its record."""
    return [
        cpu_range("profiler::step#0", 0, 1000),
        record(110, 120, 31, "allreduce", 1, 1000, "BFloat16", pg=tp_pg),
        record(
            200,
            210,
            33,
            "_allgather_base",
            1,
            500,
            "BFloat16",
            out_nelems=1000,
            tensor_shape=[500],
            pg=dp_pg,
        ),
        kernel(ALL_REDUCE, 300, 400, linked=31, stream=NCCL_STREAM),
        kernel(ALL_GATHER, 500, 600, linked=33, stream=NCCL_STREAM),
    ]


@pytest.mark.parametrize(
    "names", [{"3": "tp", "5": "dp"}, {}], ids=["by-process-group-name", "by-mesh-description"]
)
def test_nccl_spans_carry_their_mesh_dimension(names):
    spans = _spans(_tp_and_dp_collectives(), names)
    assert [(s.name, s.group, s.bytes) for s in spans if s.kind == COMM] == [
        ("all_reduce", "tp", 2000),
        ("all_gather", "dp", 2000),
    ]


def test_a_mapped_name_wins_and_a_world_group_is_the_whole_world():
    # The caller's map names the group whatever its description; the default group (or
    # DeviceMesh's "mesh_default" copy of it) unnamed is the whole world ('').
    spans = _spans(
        _tp_and_dp_collectives(
            tp_pg=("0", "default_pg", range(16)), dp_pg=("7", "mesh_default", range(16))
        ),
        {"0": "tp"},
    )
    assert [s.group for s in spans if s.kind == COMM] == ["tp", ""]


def test_span_fit_places_a_tp_all_reduce_inside_the_node():
    """tp 8 × dp 2 on two nodes of 8 GPUs: the TP group is one node's 8 GPUs (NVLink), the DP
    group pairs GPU i of each node (the network). Without its group the all-reduce would be a
    16-rank collective between nodes."""
    config = TrialConfig(
        workload=WorkloadSpec(
            seq_len=512, global_batch_size=2, workload="test:shape", vocab_size=8
        ),
        world_size=16,
        tp_degree=8,
        micro_batch_size=1,
    )
    spans = _spans(_tp_and_dp_collectives(), {"3": "tp", "5": "dp"})
    points = collective_points(spans, config, load_cluster("h100-sxm", nodes=2))
    assert [(p.name, p.link, p.group_size) for p in points] == [
        ("all_gather", INTER, 2),
        ("all_reduce", INTRA, 8),
    ]


# ---- kernels take the phase of the op that launched them (issue 23, defect 5) ---------------
def _phased_step():
    """One step [0, 3000) on the training thread: forward [100, 1000), backward [1000, 2000)
    (whose aten op runs on autograd's device thread), optimizer [2000, 2900). Each phase's op
    launches one kernel: 200 ns forward, 400 ns backward, 100 ns optimizer; one more kernel of
    50 ns has no link."""
    foreach = "void at::native::multi_tensor_apply_kernel<at::native::FusedAdamMathFunctor>"
    return [
        cpu_range("profiler::step#0", 0, 3000),
        cpu_range("profiler::forward", 100, 1000),
        cpu_op("aten::mm", 150, 250, correlation=41),
        cpu_range("profiler::backward", 1000, 2000),
        cpu_op(
            "autograd::engine::evaluate_function: MmBackward0",
            1100,
            1300,
            correlation=42,
            thread=AUTOGRAD,
        ),
        cpu_op("aten::mm", 1150, 1250, correlation=43, thread=AUTOGRAD),
        cpu_range("profiler::optimizer", 2000, 2900),
        cpu_op("aten::_fused_adamw_", 2050, 2150, correlation=44),
        kernel(GEMM, 300, 500, linked=41),
        kernel(GEMM, 1300, 1700, linked=43),
        kernel(foreach, 2500, 2600, linked=44),
        kernel(ELEMENTWISE, 2700, 2750),
    ]


def test_kernels_take_the_phase_of_their_launching_op():
    spans = _spans(_phased_step())
    assert [(s.start_ns, s.category) for s in spans if s.kind == COMPUTE] == [
        (300, "forward"),
        (1300, "backward"),
        (2500, "optimizer"),
        (2700, KERNEL),
    ]


def test_optimizer_kernels_are_not_compute_in_the_fit():
    """The fit's compute: the forward, backward and unattributed kernels, 200 + 400 + 50 ns;
    the optimizer's 100 ns are the model's optimizer term."""
    config = TrialConfig(
        workload=WorkloadSpec(
            seq_len=512, global_batch_size=1, workload="test:shape", vocab_size=8
        ),
        world_size=1,
        micro_batch_size=1,
    )
    point = compute_point(_spans(_phased_step()), config)
    assert point.seconds == pytest.approx(650e-9)


class Torch211Event:
    """The same event as torch 2.11's ``_KinetoEvent`` shows it (the H200's torch, the first
    GPU this ran on): no ``activity_type()``; a user annotation says so through
    ``is_user_annotation()`` (``flag``), or not at all (``flag`` False: the method is absent)."""

    def __init__(self, event: FakeEvent, flag: bool = True) -> None:
        self._event = event
        if flag:
            self.is_user_annotation = lambda: event._activity.endswith("user_annotation")

    def __getattr__(self, name):
        if name == "activity_type":
            raise AttributeError(name)
        return getattr(self._event, name)


def _runtime_call(start, end, correlation):
    """CUPTI's record of the launch: a CPU event, its own numbering of correlation ids."""
    return FakeEvent(
        "cudaLaunchKernel", start, end, _activity="cuda_runtime", _correlation=correlation
    )


@pytest.mark.parametrize("flag", [True, False])
def test_events_without_activity_type_give_the_same_spans(flag):
    events = _overlap_timeline() + [
        _runtime_call(120, 130, correlation=11),
        FakeEvent(
            "Memcpy HtoD (Pageable -> Device)", 50, 90, DeviceType.CUDA, "gpu_memcpy", STREAM
        ),
    ]
    legacy = [Torch211Event(e, flag) for e in events]
    assert not hasattr(legacy[0], "activity_type")
    assert _spans(legacy) == _spans(events)
    b = rank_breakdown(_spans(legacy), 0)
    assert (b.compute_ns, b.comm_ns, b.exposed_comm_ns) == (400, 300, 200)


# ---- point-to-point transfers: SendRecv kernels, one or a grouped launch -------------------
SEND_RECV = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
"""NCCL ≥ 2.19 runs every send and receive (one, or a group's) as this one kernel."""
PP_PG = ("9", "mesh_pp", [0, 8])
"""Rank 0's pipeline group with its next stage, rank 8."""


def _launch_call(start, end, correlation):
    """NCCL's kernel launch as CUPTI records it: a driver call on the CPU, whose (CUPTI)
    correlation id is the kernel's own."""
    return FakeEvent(
        "cuLaunchKernelEx", start, end, _activity="cuda_driver", _correlation=correlation
    )


def _p2p(start, correlation, collective, nelems, dtype):
    """ProcessGroupNCCL's record of one send or recv ("send" / "recv", seq of the group)."""
    return record(start, start + 20, correlation, collective, 1, nelems, dtype, pg=PP_PG)


def _send_recv_kernel(start, end, correlation=0, linked=0):
    return FakeEvent(
        SEND_RECV, start, end, DeviceType.CUDA, "kernel", NCCL_STREAM, correlation, linked
    )


def test_a_lone_send_and_recv_are_told_apart_by_their_records():
    # A blocking send of 1000 BFloat16 (2000 B) then a recv of 300 Float (1200 B), each kernel
    # launched inside its own record (linked to it). Both kernels are named SendRecv.
    events = [
        cpu_range("profiler::step#0", 0, 2000),
        _p2p(100, 51, "send", 1000, "BFloat16"),
        _p2p(600, 52, "recv", 300, "Float"),
        _send_recv_kernel(200, 400, linked=51),
        _send_recv_kernel(700, 900, linked=52),
    ]
    spans = _spans(events, {"9": "pp"})
    assert [(s.kind, s.name, s.bytes, s.group) for s in spans if s.kind != STEP] == [
        ("p2p", "send", 2000, "pp"),
        ("p2p", "recv", 1200, "pp"),
    ]


def _two_grouped_launches():
    """Two ``batch_isend_irecv`` groups, one SendRecv kernel each (launched at ``ncclGroupEnd``,
    linked to no record). Group 1: isend 512 Float (2048 B), irecv 256 Float (1024 B), isend
    128 BFloat16 (256 B), launched by the call at 400 and run on the GPU at [900, 1200). The
    CPU runs ahead: group 2 (isend 64 Float = 256 B, irecv 1000 BFloat16 = 2000 B) is recorded
    at 500 and 550, before group 1's kernel starts, and launched at 600; its kernel runs at
    [1300, 1500)."""
    return [
        cpu_range("profiler::step#0", 0, 2000),
        _p2p(100, 61, "send", 512, "Float"),
        _p2p(200, 62, "recv", 256, "Float"),
        _p2p(300, 63, "send", 128, "BFloat16"),
        _launch_call(400, 420, correlation=901),
        _p2p(500, 64, "send", 64, "Float"),
        _p2p(550, 65, "recv", 1000, "BFloat16"),
        _launch_call(600, 620, correlation=902),
        _send_recv_kernel(900, 1200, correlation=901),
        _send_recv_kernel(1300, 1500, correlation=902),
    ]


def test_a_grouped_launch_counts_every_transfer_it_runs():
    spans = _spans(_two_grouped_launches(), {"9": "pp"})
    p2p = [(s.start_ns, s.end_ns, s.name, s.bytes) for s in spans if s.kind == "p2p"]
    assert sorted(p2p) == sorted(
        [
            (900, 1200, "send", 2048),
            (900, 1200, "recv", 1024),
            (900, 1200, "send", 256),
            (1300, 1500, "send", 256),
            (1300, 1500, "recv", 2000),
        ]
    )
    # Per step: sent 2048 + 256 + 256 = 2560 B, received 1024 + 2000 = 3024 B; the p2p time is
    # the two kernels' 300 + 200 ns, counted once.
    assert bytes_per_step(spans)[0] == {("p2p", "send", "pp"): 2560, ("p2p", "recv", "pp"): 3024}
    assert rank_breakdown(spans, 0).comm_ns == 500
