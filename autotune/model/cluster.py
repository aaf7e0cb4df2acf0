"""The cluster a layout runs on: nodes, devices, and the links between them.

A :class:`ClusterSpec` is what the performance model (``autotune/model/perf_model.py``) needs to
turn
FLOPs and bytes into seconds: how many nodes of how many devices, each device's dense peak
FLOP/s per dtype and memory bandwidth, the intra-node link as an all-reduce bus-bandwidth curve
over message size (what nccl-tests' ``all_reduce_perf`` prints) or latency + bandwidth, and the
inter-node link's bandwidth per node and latency. It is typed like ``TrialConfig``: frozen,
validated with :class:`ConfigError` naming the fix, and read from JSON or TOML
(``ClusterSpec.from_file``) or by a built-in name (``load_cluster``).

Bus bandwidth follows nccl-tests' definition (``doc/PERFORMANCE.md`` of NVIDIA/nccl-tests):
algbw = bytes / time, and busbw = algbw · 2(n−1)/n for all-reduce, algbw · (n−1)/n for
all-gather and reduce-scatter, so a ring all-reduce of S bytes over n ranks takes
``2(n−1)/n · S / busbw``.

Built-in nodes are made from ``autotune.hardware.GPUS``, one per GPU, whose entries cite their
vendors' datasheets. A search on this machine's CPU
describes it with :func:`local_cpu_cluster`; its throughput figures are nominal and the
calibration (``Calibration`` in ``perf_model.py``) scales them to what trials measure.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import math
import os
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

from autotune.config import DType
from autotune.errors import ConfigError
from autotune.gpu_properties import gpu_from_properties
from autotune.hardware import GPUS, Gpu, gpu_by_key, gpu_by_name

GB = 1e9


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceSpec:
    """One accelerator (or one CPU rank)."""

    name: str
    """Device name, e.g. 'A100-SXM4-80GB'."""
    peak_flops: dict[str, float]
    """Dense peak FLOP/s per compute dtype: float32, bfloat16, float16."""
    memory_bandwidth_gbs: float
    """Device memory bandwidth in GB/s (optimizer step and element-wise kernels are bound by it)."""
    memory_gib: float
    """Device memory in GiB (the default memory limit of a search on this cluster)."""
    asynchronous: bool = True
    """Kernels queue behind the host (CUDA streams): a layer takes the longer of the host's
    launch time and the device's work. False for CPU ranks, which do both themselves."""

    def flops(self, dtype: str) -> float:
        if dtype not in self.peak_flops:
            raise ConfigError(
                f"device {self.name} gives no peak FLOP/s for {dtype}; add "
                f"'{dtype}' to its peak_flops"
            )
        return self.peak_flops[dtype]


@dataclass(frozen=True, kw_only=True, slots=True)
class LinkSpec:
    """One class of link: all-reduce bus bandwidth as a curve over size, or latency + bandwidth.

    ``busbw_curve`` maps a group size (as a string, JSON keys being strings) to points
    ``[bytes, GB/s]`` of nccl-tests' all-reduce bus bandwidth; a group size not measured takes
    the nearest measured one, and sizes between points interpolate linearly in log(size).
    Below the smallest point the time follows ``latency_us + bytes / bandwidth``; with no curve
    it always does.
    """

    bandwidth_gbs: float
    """Bus bandwidth for large messages in GB/s (for the inter-node link: per node)."""
    latency_us: float
    """Per-collective latency in microseconds."""
    busbw_curve: dict[str, list[list[float]]] = field(default_factory=dict)
    """Measured all-reduce bus bandwidth: {group size: [[bytes, GB/s], ...]} (nccl-tests)."""

    def busbw(self, nbytes: float, group: int) -> float:
        """Bus bandwidth in bytes/s for an all-reduce of ``nbytes`` over ``group`` ranks."""
        if not self.busbw_curve:
            return self._latency_bw(nbytes)
        key = min(self.busbw_curve, key=lambda k: (abs(int(k) - group), -int(k)))
        points = self.busbw_curve[key]
        sizes = [p[0] for p in points]
        if nbytes <= sizes[0]:
            # Below the curve: time falls linearly from the first point's to the latency.
            ring = _ring_factor(group) or 1.0
            t0 = ring * sizes[0] / (points[0][1] * GB)
            lat = min(self.latency_us * 1e-6, t0)
            t = lat + (t0 - lat) * max(nbytes, 0.0) / sizes[0]
            return ring * nbytes / t if nbytes > 0 else points[0][1] * GB
        if nbytes >= sizes[-1]:
            return points[-1][1] * GB
        i = bisect.bisect_right(sizes, nbytes)
        x0, x1 = math.log(sizes[i - 1]), math.log(sizes[i])
        w = (math.log(nbytes) - x0) / (x1 - x0)
        return ((1 - w) * points[i - 1][1] + w * points[i][1]) * GB

    def _latency_bw(self, nbytes: float) -> float:
        # Bus bandwidth of the latency + bandwidth model, so that time = latency + bytes/bw.
        if nbytes <= 0:
            return self.bandwidth_gbs * GB
        return nbytes / (self.latency_us * 1e-6 + nbytes / (self.bandwidth_gbs * GB))


@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterSpec:
    """Nodes of identical devices, an intra-node link and an inter-node link."""

    name: str
    """A name for tables and the database."""
    num_nodes: int = 1
    """Number of nodes."""
    devices_per_node: int = 8
    """Devices (ranks) per node."""
    device: DeviceSpec
    """The device every rank has."""
    intra_node: LinkSpec
    """The link inside a node (NVLink / NVSwitch; shared memory or loopback on CPUs)."""
    inter_node: LinkSpec
    """The network between nodes; bandwidth_gbs is per node (all its NICs together)."""
    backend: str = "nccl"
    """Collective library: nccl, or gloo (which runs reduce-scatter as a full all-reduce)."""
    cores_per_node: int | None = None
    """CPU ranks only: the cores a node's ranks share. A rank that waits (a pipeline bubble)
    leaves its core to the others, so with more ranks than cores a bubble costs less; a
    collective over more ranks than cores waits for its members' turns on them
    (``perf_model.core_sharing``, ``perf_model.uncoscheduled``)."""
    source: str = ""
    """Where the figures come from."""
    calibration: dict[str, Any] | None = None
    """Fitted performance-model parameters (``perf_model.Calibration``), when calibrated."""

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.devices_per_node

    @property
    def device_type(self) -> str:
        """Where its ranks train: 'cpu' under gloo, 'cuda' under NCCL (what decides a config's
        default precision, so its compute dtype and its layer-shape key)."""
        return "cpu" if self.backend == "gloo" else "cuda"

    def with_nodes(self, num_nodes: int) -> ClusterSpec:
        if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
            raise ConfigError(f"--nodes must be a positive integer, not {num_nodes!r}")
        return dataclasses.replace(self, num_nodes=num_nodes)

    def validate(self) -> None:
        for name in ("num_nodes", "devices_per_node"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(
                    f"cluster '{self.name}': {name} must be a positive integer, not {value!r}"
                )
        if self.backend not in ("nccl", "gloo"):
            raise ConfigError(
                f"cluster '{self.name}': backend must be nccl or gloo, not {self.backend!r}"
            )
        d = self.device
        if not d.peak_flops or any(not _positive_number(v) for v in d.peak_flops.values()):
            raise ConfigError(
                f"cluster '{self.name}': device.peak_flops needs a positive FLOP/s "
                'per dtype, e.g. {"bfloat16": 312e12}'
            )
        for name in ("memory_bandwidth_gbs", "memory_gib"):
            if not _positive_number(getattr(d, name)):
                raise ConfigError(f"cluster '{self.name}': device.{name} must be a positive number")
        for link_name in ("intra_node", "inter_node"):
            link: LinkSpec = getattr(self, link_name)
            if not _positive_number(link.bandwidth_gbs) or not (
                _positive_number(link.latency_us) or link.latency_us == 0
            ):
                raise ConfigError(
                    f"cluster '{self.name}': {link_name} needs a positive "
                    "bandwidth_gbs and a latency_us ≥ 0"
                )
            for group, points in link.busbw_curve.items():
                if (
                    not str(group).isdigit()
                    or not points
                    or any(len(p) != 2 or not all(_positive_number(x) for x in p) for p in points)
                ):
                    raise ConfigError(
                        f"cluster '{self.name}': {link_name}.busbw_curve must map "
                        "a group size to [[bytes, GB/s], ...] pairs"
                    )
                if [p[0] for p in points] != sorted(p[0] for p in points):
                    raise ConfigError(
                        f"cluster '{self.name}': {link_name}.busbw_curve[{group}] "
                        "must be sorted by size"
                    )

    def check_world(self, world_size: int) -> None:
        """Refuse a layout whose world size is not the cluster's nodes × devices."""
        if world_size != self.world_size:
            raise ConfigError(
                f"world size {world_size} ≠ {self.num_nodes} nodes × {self.devices_per_node} "
                f"devices of cluster '{self.name}'; pass --nodes "
                f"{max(1, world_size // self.devices_per_node)} or a matching --world-size"
            )

    # ---- serialisation -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any, *, where: str = "cluster") -> ClusterSpec:
        if not isinstance(data, dict):
            raise ConfigError(f"{where} must be an object with the ClusterSpec fields")
        unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}")
        try:
            device = _build(DeviceSpec, data.get("device"), f"{where}: device")
            intra = _build(LinkSpec, data.get("intra_node"), f"{where}: intra_node")
            inter = _build(LinkSpec, data.get("inter_node"), f"{where}: inter_node")
            rest = {
                k: v for k, v in data.items() if k not in ("device", "intra_node", "inter_node")
            }
            spec = _build(
                cls, {**rest, "device": device, "intra_node": intra, "inter_node": inter}, where
            )
        except TypeError as e:  # a field of the wrong kind that dataclass construction met
            raise ConfigError(f"{where}: {e}") from None
        spec.validate()
        return spec

    @classmethod
    def from_file(cls, path: str | Path) -> ClusterSpec:
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as e:
            raise ConfigError(f"cannot read cluster file '{path}': {e.strerror}") from None
        try:
            data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
        except (json.JSONDecodeError, tomllib.TOMLDecodeError) as e:
            raise ConfigError(
                f"cluster file '{path}' is not valid "
                f"{'TOML' if path.suffix == '.toml' else 'JSON'}: {e}"
            ) from None
        return cls.from_dict(data, where=f"cluster file '{path}'")


def _positive_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def read_nccl_tests(path: str | Path, *, every: int = 1) -> list[list[float]]:
    """[[bytes, busbw GB/s], ...] from nccl-tests ``all_reduce_perf`` output: its text table or
    a CSV of it (size first, out-of-place busbw in the fifth column); every ``every``-th row."""
    points = []
    for line in Path(path).read_text(encoding="utf-8-sig").splitlines():
        cells = [c for c in re.split(r"[,\s]+", line.strip()) if c]
        if len(cells) < 5 or not cells[0].isdigit():
            continue
        try:
            points.append([float(cells[0]), float(cells[4])])
        except ValueError:
            continue
    if not points:
        raise ConfigError(f"'{path}' holds no nccl-tests rows (size, count, type, time, busbw)")
    return points[::every] if points[-1] in points[::every] else [*points[::every], points[-1]]


def _ring_factor(n: int) -> float:
    """Bytes each rank sends per byte of an all-reduce over n ranks (ring): 2(n−1)/n."""
    return 2 * (n - 1) / n if n > 1 else 0.0


def _build(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{where} is missing or not an object")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(fields))}"
        )
    required = [
        n
        for n, f in fields.items()
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    missing = [n for n in required if n not in data]
    if missing:
        raise ConfigError(f"{where}: missing {', '.join(missing)}")
    return cls(**data)


# ---- built-in clusters -------------------------------------------------------------------
INTRA_NODE_LATENCY_US = 10.0
"""Nominal per-collective latency inside a node; a study's calibration fits the real cost
(``collective_overhead_s``)."""
INTER_NODE_LATENCY_US = 15.0
"""Nominal per-collective latency between nodes."""


SHIPPED_CALIBRATION = Path(__file__).resolve().parent / "data" / "a100_published.json"
"""The calibration fitted on published A100 runs (``bench/published_runs.py --fit``): GEMM
efficiency curve, attention and element-wise bytes, overlap, ZeRO-3's ring latency. Its
parameters are dimensionless or per ring step, so every built-in GPU but the H100s
(``H100_CALIBRATION``) takes them: another generation differs by its datasheet's peak, HBM,
NVLink and network (``hardware.GPUS``)."""


H100_CALIBRATION = SHIPPED_CALIBRATION.with_name("h100_published.json")
"""The calibration of the H100 nodes (``H100_KEYS``), fitted on NeMo 24.07's DGX-H100 FP8
pre-training table alone (``bench/published_runs.py --fit``), the same parameters as the A100
fit: the H100 generation's GEMM efficiency, FlashAttention's share of peak (FlashAttention-2
reaches about 35% of an H100's peak against up to 73% of an A100's: Shah et al. 2024,
"FlashAttention-3", §1, and Dao 2023 §4.1) and overlap differ from Ampere's, which a fit to
A100 runs cannot know. Megatron-Bridge's and NeMo's long-sequence H100 tables are predicted."""
H100_KEYS = ("h100-sxm", "h100-nvl", "h100-pcie")
"""The built-in GPUs of the H100 generation (Hopper GH100) that take ``H100_CALIBRATION``."""


def shipped_calibration(gpu_key: str = "") -> dict[str, Any] | None:
    """The shipped published-runs calibration's parameters for a built-in GPU: the H100 fit
    for ``H100_KEYS``, the A100 fit otherwise (None when the file is absent)."""
    path = H100_CALIBRATION if gpu_key in H100_KEYS else SHIPPED_CALIBRATION
    if not path.is_file():
        return None
    return dict(json.loads(path.read_text())["calibration"])


def gpu_cluster(gpu: Gpu) -> ClusterSpec:
    """One node of ``gpu`` (``hardware.GPUS``): its peaks per compute dtype, memory, the
    intra-node link as its all-reduce bus bandwidth, the node's NICs as the inter-node link,
    and the calibration fitted on published runs of its generation (``shipped_calibration``)."""
    device = DeviceSpec(
        name=gpu.name,
        memory_bandwidth_gbs=gpu.memory_bandwidth_gbs,
        memory_gib=gpu.memory_gib,
        peak_flops={
            dtype: gpu.dense_flops[dtype]
            for dtype in (*get_args(DType), "float8")
            if dtype in gpu.dense_flops
        },
    )
    return ClusterSpec(
        name=gpu.key,
        num_nodes=1,
        devices_per_node=gpu.devices_per_node,
        device=device,
        intra_node=LinkSpec(
            bandwidth_gbs=gpu.allreduce_busbw_gbs, latency_us=INTRA_NODE_LATENCY_US
        ),
        inter_node=LinkSpec(bandwidth_gbs=gpu.nic_gbits / 8, latency_us=INTER_NODE_LATENCY_US),
        source=gpu.source,
        calibration=shipped_calibration(gpu.key),
    )


EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples" / "clusters"


def builtin_clusters() -> dict[str, ClusterSpec]:
    """Named clusters of one node each (``--nodes N`` scales them): every GPU of
    ``hardware.GPUS`` by its key, and this machine's CPUs."""
    return {**{gpu.key: gpu_cluster(gpu) for gpu in GPUS}, "cpu-local": local_cpu_cluster(2)}


def builtin_gpu_cluster(device_name: str) -> ClusterSpec | None:
    """The built-in node of a GPU by the name torch reports ('NVIDIA H200' → ``h200-sxm``,
    'NVIDIA L40S' → ``l40s``); None for a GPU not in ``hardware.GPUS``."""
    gpu = gpu_by_name(device_name)
    return gpu_cluster(gpu) if gpu is not None else None


def gpu_node(
    device_name: str, properties: Any = None, *, warn: Callable[[str], None]
) -> ClusterSpec:
    """A node of the GPU torch names ``device_name``: its built-in node, or, for a GPU not in
    ``hardware.GPUS``, one described from its CUDA properties (``gpu_properties``), saying
    in one line through ``warn`` what was assumed. Never a CPU's figures."""
    builtin = builtin_gpu_cluster(device_name)
    if builtin is not None:
        return builtin
    described = gpu_from_properties(properties, name=device_name)
    warn(described.assumed)
    return gpu_cluster(described.gpu)


def builtin_names() -> list[str]:
    return [*builtin_clusters(), *sorted(p.stem for p in EXAMPLES_DIR.glob("*.json"))]


def load_cluster(name_or_path: str, *, nodes: int | None = None) -> ClusterSpec:
    """A built-in cluster by name or alias (any case: 'b200', 'H100'), a shipped example by
    name, a JSON/TOML file, or a GPU by the name torch reports ('NVIDIA L40S')."""
    named = builtin_clusters()
    gpu = gpu_by_key(name_or_path)
    if name_or_path in named:
        spec = named[name_or_path]
    elif gpu is not None:
        spec = gpu_cluster(gpu)
    elif (EXAMPLES_DIR / f"{name_or_path}.json").is_file():
        spec = ClusterSpec.from_file(EXAMPLES_DIR / f"{name_or_path}.json")
    elif Path(name_or_path).suffix in (".json", ".toml") or os.sep in name_or_path:
        spec = ClusterSpec.from_file(name_or_path)
    elif (gpu := gpu_by_name(name_or_path)) is not None:
        spec = gpu_cluster(gpu)
    else:
        raise ConfigError(
            f"unknown cluster '{name_or_path}': choose one of "
            f"{', '.join(builtin_names())}, or give a cluster file (.json/.toml)"
        )
    return spec.with_nodes(nodes) if nodes is not None else spec


def local_cpu_cluster(world_size: int, *, cores: int | None = None) -> ClusterSpec:
    """This machine's CPU ranks as one node: nominal figures that calibration scales.

    Peak: cores × 2.5 GHz × 32 fp32 FLOP/cycle (two 8-wide AVX2 FMA units) shared by the ranks
    (four ranks on two cores get half a core each); memory bandwidth nominal 20 GB/s per rank;
    gloo over loopback. Trials fit the real ones.
    """
    cores = cores or os.cpu_count() or 1
    per_rank = cores / world_size
    flops = per_rank * 2.5e9 * 32
    return ClusterSpec(
        name="cpu-local",
        num_nodes=1,
        devices_per_node=world_size,
        device=DeviceSpec(
            name="cpu",
            peak_flops=dict.fromkeys(get_args(DType), flops),
            memory_bandwidth_gbs=20.0,
            memory_gib=16.0,
            asynchronous=False,
        ),
        intra_node=LinkSpec(bandwidth_gbs=5.0, latency_us=100.0),
        inter_node=LinkSpec(bandwidth_gbs=1.0, latency_us=200.0),
        backend="gloo",
        cores_per_node=cores,
        source=f"nominal figures for {cores} CPU cores; calibrated by trials",
        # Where a fit starts on CPU ranks, whose small layers cost the interpreter and the
        # operator dispatch far more than their FLOPs: the fits of all the rows of sweeps A-C
        # (docs/benchmarks.md; a loaded machine) put a layer pass at 1.8-4.7 ms, a gloo
        # collective's host cost at 4.0-5.6 ms, a micro-batch at 0.6-0.8 ms, a step at
        # 0.9-1.2 ms, tensor parallelism's own dispatch at 0-0.15 ms a layer pass and an FSDP2
        # unit's hooks at 1.4-2.4 ms a micro-batch (perf_model.hooked_units); the start takes
        # the low end (a quieter machine is faster). A nonzero start is also a
        # prior: a few trials cannot then trade one fixed cost for another without bound.
        # A pipeline boundary's host cost (perf_model.stage_boundaries) came out of those
        # fits at 0 (A), 0.79 (B) and 0.66 ms (C): the start takes the lowest nonzero one,
        # since a zero start would leave it no prior.
        calibration={
            "layer_overhead_s": 2e-3,
            "collective_overhead_s": 4e-3,
            "microbatch_overhead_s": 7e-4,
            "step_overhead_s": 1e-3,
            "tp_layer_overhead_s": 1e-4,
            "unit_overhead_s": 1.4e-3,
            "p2p_overhead_s": 6.6e-4,
            # A CPU core's matmul reaches its rate at far smaller sizes than a GPU's.
            "half_efficiency_rows": 16.0,
            "half_efficiency_cols": 8.0,
        },
    )
