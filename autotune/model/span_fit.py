"""Link and compute figures fitted from the profiler's spans of measured trials.

Two fits, each reported with its residual:

- **Links.** Each collective span gives a point (S, t): its payload S (nccl-tests' "size": an
  all-reduce's tensor, an all-gather's gathered output, a reduce-scatter's full input) and its
  duration t. A ring moves ``r·S`` bytes per rank, r = 2(n−1)/n for all-reduce and (n−1)/n for
  all-gather and reduce-scatter (nccl-tests ``doc/PERFORMANCE.md``; gloo runs reduce-scatter as
  an all-reduce, so it takes the all-reduce factor there), and the time follows
  ``t = latency + r·S / busbw`` (the α–β model of Hockney 1994; Thakur et al. 2005 for the
  ring). Per link class (the intra-node link, or the network between nodes, as the layout
  places each group) latency and bus bandwidth are the least-squares fit over its points, in
  relative error so a 4 KB and a 64 MB message weigh alike. When every point has nearly the same
  size the two cannot be told apart: the latency is then held at the cluster's figure and only
  the bandwidth is fitted (``latency_fitted`` False).
- **Compute.** The compute spans of the profiled steps (forward and backward work; the
  optimizer step is a term of its own in the model) give the seconds a step computes, on its
  slowest rank. Against the FLOPs the performance model assigns that step they give a rate in
  FLOP/s, and the ``compute_efficiency`` at which the model's compute term equals the measured
  time: a prior for the step-time fit (``autotune.model.calibration``).

Which rank's duration: the ranks of a collective start it at different times and each span
includes the wait for the last to arrive; the instance's time is the shortest span among the
ranks (the last rank to arrive waits for no one). Instances are matched across ranks by their
order within (step, group, collective).

No torch here: the spans are ``profiler.Span`` records or anything with their fields (a db
``SpanRecord`` too).
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune.config import TrialConfig
from autotune.model.cluster import GB, ClusterSpec
from autotune.model.perf_model import Calibration, predict_step_time
from profiler.analysis import clip, length, merge
from profiler.spans import COMM, COMPUTE, STEP

INTRA, INTER = "intra_node", "inter_node"
LINKS = (INTRA, INTER)
RING_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
"""Collectives fitted; broadcasts, barriers and point-to-point transfers are not."""
NOT_MODELLED_COMPUTE = ("optimizer", "op")
"""Compute categories outside the model's compute term: the optimizer step (its own term) and
work outside the forward/backward ranges (batch building, loss bookkeeping)."""
MIN_SIZE_SPREAD = 2.0
"""Largest / smallest wire bytes below which latency and bandwidth are not fitted together."""


def ring_factor(name: str, group_size: int, backend: str) -> float:
    """Bytes each rank moves per payload byte in a ring (nccl-tests ``PERFORMANCE.md``)."""
    n = group_size
    if n <= 1:
        return 0.0
    if name == "all_reduce" or (name == "reduce_scatter" and backend == "gloo"):
        return 2 * (n - 1) / n
    return (n - 1) / n


@dataclass(frozen=True, slots=True)
class CollectivePoint:
    """One collective as measured: which link, how big, how long."""

    link: str
    name: str
    group_size: int
    bytes: int
    """Payload (nccl-tests' size)."""
    seconds: float
    ring_factor: float

    @property
    def wire_bytes(self) -> float:
        """Bytes each rank sends: ring factor × payload."""
        return self.ring_factor * self.bytes


@dataclass(frozen=True, slots=True)
class ComputePoint:
    """Seconds one trial's step spends computing (slowest rank, mean over profiled steps)."""

    config: TrialConfig
    seconds: float


@dataclass(frozen=True, slots=True)
class TrialSpans:
    """What one trial's spans contribute to the fits; small, so a search keeps one per trial."""

    collectives: tuple[CollectivePoint, ...] = ()
    compute: ComputePoint | None = None


@dataclass(frozen=True, slots=True)
class LinkFit:
    """``t = latency_s + wire bytes / bandwidth`` fitted over ``num_points`` collectives."""

    link: str
    latency_s: float
    bandwidth_gbs: float
    """Bus bandwidth in GB/s (nccl-tests' busbw)."""
    num_points: int
    residual: float
    """Root mean square of the relative error (fitted / measured − 1) over the points."""
    latency_fitted: bool
    """False when the sizes were too alike to separate latency from bandwidth: the latency is
    the cluster's figure."""

    def seconds(self, wire_bytes: float) -> float:
        return self.latency_s + wire_bytes / (self.bandwidth_gbs * GB)


@dataclass(frozen=True, slots=True)
class ComputeFit:
    """The rate the compute spans achieved against the model's FLOPs."""

    flops_per_s: float
    """Σ model FLOPs / Σ measured compute seconds, over the trials."""
    fraction_of_peak: float
    """flops_per_s over the device's peak for the trials' dtype."""
    compute_efficiency: float
    """The calibration value at which the model's compute term equals the measured seconds
    (geometric mean over the trials), at most 1: a prior for the step-time fit."""
    half_efficiency_rows: float
    """The calibration's half-efficiency matmul size that goes with it (the starting one unless
    the asymptote was held at 1)."""
    num_trials: int
    residual: float
    """RMS relative error of the model's compute term at that efficiency, over the trials."""


@dataclass(frozen=True, slots=True)
class SpanFit:
    """Every fit the spans allow: per link class, and compute."""

    links: Mapping[str, LinkFit] = field(default_factory=dict)
    compute: ComputeFit | None = None
    comm_efficiency: float | None = None
    """The cluster's described collective time over the fitted one, at the sizes measured
    (geometric mean over the points): what the model's ``comm_efficiency`` scales the
    described bandwidth by. None without collectives."""

    @property
    def empty(self) -> bool:
        return not self.links and self.compute is None

    def start_calibration(self, base: Calibration) -> Calibration:
        """``base`` with the compute efficiency (and half-efficiency size) and comm_efficiency
        taken from the span fits."""
        values: dict[str, float] = {}
        if self.compute is not None:
            values["compute_efficiency"] = self.compute.compute_efficiency
            values["half_efficiency_rows"] = self.compute.half_efficiency_rows
        if self.comm_efficiency is not None:
            values["comm_efficiency"] = self.comm_efficiency
        return dataclasses.replace(base, **values)

    def as_dict(self) -> dict[str, Any]:
        return {
            "links": {k: dataclasses.asdict(v) for k, v in self.links.items()},
            "compute": dataclasses.asdict(self.compute) if self.compute else None,
            "comm_efficiency": self.comm_efficiency,
        }


# ---- from spans to points ------------------------------------------------------------------
def group_size(config: TrialConfig, group: str) -> int:
    """Ranks in a collective's group: the mesh dimension it talks on ('' → the whole world).
    FSDP2 under context parallelism shards over ``dp_shard_cp`` (dp_shard × cp, the flattened
    dim ``trial/parallel/mesh.py`` names ``SHARD_CP``); the K/V all-gathers talk on ``cp``."""
    return {
        "tp": config.tp_degree,
        "cp": config.cp_degree,
        "dp": config.dp_degree,
        "dp_shard": config.dp_shard,
        "dp_shard_cp": config.dp_shard * config.cp_degree,
        "dp_replicate": config.dp_replicate,
        "pp": config.pp_degree,
    }.get(group, config.world_size)


def link_class(config: TrialConfig, group: str, devices_per_node: int) -> str:
    """The link a group's collectives cross. Ranks are numbered (pp, dp_replicate, dp_shard,
    cp, tp) with tp fastest (``trial/parallel/mesh.py``) and nodes filled in order (the
    executor's PACK placement), so a group spans the consecutive ranks of its own dim and every
    faster one: a TP group ⌈tp / n⌉ nodes, a CP group ⌈tp·cp / n⌉, a DP group ⌈tp·cp·dp / n⌉
    for n devices per node."""
    tp, cp = config.tp_degree, config.cp_degree
    span = {
        "tp": tp,
        "cp": tp * cp,
        "dp": tp * cp * config.dp_degree,
        "dp_shard": tp * cp * config.dp_shard,  # HSDP: consecutive within dp
        "dp_shard_cp": tp * cp * config.dp_shard,
        "dp_replicate": tp * cp * config.dp_degree,
    }.get(group, config.world_size)
    return INTER if span > devices_per_node else INTRA


def summarize(spans: Iterable, config: TrialConfig, cluster: ClusterSpec) -> TrialSpans:
    """A trial's collective points and compute time, from its spans (all ranks)."""
    spans = list(spans)
    return TrialSpans(
        tuple(collective_points(spans, config, cluster)), compute_point(spans, config)
    )


def collective_points(
    spans: Iterable, config: TrialConfig, cluster: ClusterSpec
) -> list[CollectivePoint]:
    """One point per collective instance of the profiled steps (see the module docstring)."""
    by_rank: dict[tuple, dict[int, list]] = defaultdict(lambda: defaultdict(list))
    for s in spans:
        if s.kind == COMM and s.name in RING_COLLECTIVES and s.bytes > 0 and s.step >= 0:
            by_rank[(s.step, s.group, s.name)][s.rank].append(s)
    points = []
    for (_, group, name), ranks in sorted(by_rank.items()):
        n = group_size(config, group)
        factor = ring_factor(name, n, cluster.backend)
        if factor == 0:
            continue
        link = link_class(config, group, cluster.devices_per_node)
        ordered = [sorted(r, key=lambda s: s.start_ns) for r in ranks.values()]
        for k in range(min(len(r) for r in ordered)):
            instance = [r[k] for r in ordered]
            fastest = min(instance, key=lambda s: s.dur_ns)
            if fastest.dur_ns > 0:
                points.append(
                    CollectivePoint(link, name, n, fastest.bytes, fastest.dur_ns * 1e-9, factor)
                )
    return points


def compute_point(spans: Iterable, config: TrialConfig) -> ComputePoint | None:
    """Compute seconds per profiled step of the slowest rank: the union of its modelled compute
    spans inside its step windows, over the number of steps."""
    windows: dict[int, list] = defaultdict(list)
    work: dict[int, list] = defaultdict(list)
    for s in spans:
        if s.kind == STEP:
            windows[s.rank].append((s.start_ns, s.start_ns + s.dur_ns))
        elif s.kind == COMPUTE and s.category not in NOT_MODELLED_COMPUTE:
            work[s.rank].append((s.start_ns, s.start_ns + s.dur_ns))
    per_rank = []
    for rank, rank_windows in windows.items():
        busy = length(clip(merge(work.get(rank, ())), merge(rank_windows)))
        if busy > 0:
            per_rank.append(busy * 1e-9 / len(rank_windows))
    return ComputePoint(config, max(per_rank)) if per_rank else None


# ---- fits ------------------------------------------------------------------------------------
def fit_link(points: Sequence[CollectivePoint], *, prior_latency_s: float = 0.0) -> LinkFit:
    """Least squares of ``t = latency + wire / bandwidth`` in relative error.

    Minimises Σ ((latency + c·x_i) / t_i − 1)² over latency ≥ 0 and c = 1 / bandwidth > 0:
    linear in (latency, c), solved by its 2 × 2 normal equations; a negative latency is
    clamped to 0 and c refitted."""
    if not points:
        raise ValueError("no collective points to fit a link from")
    link = points[0].link
    x = [p.wire_bytes for p in points]
    t = [p.seconds for p in points]
    spread = max(x) / min(x)
    latency, slope = None, None
    if spread >= MIN_SIZE_SPREAD:
        latency, slope = _two_parameter(x, t)
        if latency < 0 or slope <= 0:
            latency, slope = None, None
    fitted = latency is not None
    if not fitted:
        # Sizes too alike, or a fit without meaning (time falling with size): hold the latency
        # at the cluster's figure, below every measured time, and fit the bandwidth alone.
        latency = min(max(prior_latency_s, 0.0), 0.5 * min(t))
        slope = _slope_given(latency, x, t)
        if slope <= 0:
            latency, slope = 0.0, _slope_given(0.0, x, t)
    errors = [(latency + slope * xi) / ti - 1 for xi, ti in zip(x, t)]
    residual = math.sqrt(sum(e * e for e in errors) / len(errors))
    return LinkFit(link, latency, 1.0 / slope / GB, len(points), residual, fitted)


def _two_parameter(x: Sequence[float], t: Sequence[float]) -> tuple[float, float]:
    # Rows (1/t, x/t), target 1: normal equations of the weighted regression.
    a11 = sum(1 / ti**2 for ti in t)
    a12 = sum(xi / ti**2 for xi, ti in zip(x, t))
    a22 = sum((xi / ti) ** 2 for xi, ti in zip(x, t))
    b1 = sum(1 / ti for ti in t)
    b2 = sum(xi / ti for xi, ti in zip(x, t))
    det = a11 * a22 - a12 * a12
    if det <= 0:
        return -1.0, -1.0
    return (b1 * a22 - b2 * a12) / det, (a11 * b2 - a12 * b1) / det


def _slope_given(latency: float, x: Sequence[float], t: Sequence[float]) -> float:
    # argmin_c Σ ((latency + c·x) / t − 1)²
    num = sum(xi * (ti - latency) / ti**2 for xi, ti in zip(x, t))
    den = sum((xi / ti) ** 2 for xi, ti in zip(x, t))
    return num / den


def fit_compute(
    points: Sequence[ComputePoint], cluster: ClusterSpec, start: Calibration
) -> ComputeFit | None:
    """Rate and compute-efficiency prior from trials of built-in workloads (None without any).

    The model's compute term is A / compute_efficiency + E (matmuls at the calibrated rate plus
    memory-bound element-wise work), so two predictions give A and E, and the efficiency at
    which it equals a measured time T is A / (T − E); over several trials, their geometric mean.
    That asymptote is a fraction of peak: when the measured matmuls are small enough (far below
    ``half_efficiency_rows``) that it would come out above 1, it is held at 1 and the
    half-efficiency size is the one that makes the model's compute term equal T instead
    (geometric mean over the trials). The FLOPs are the compute term with every efficiency 1
    and no element-wise work, times the peak."""
    usable = [p for p in points if p.config.workload.shape is not None and p.seconds > 0]
    if not usable:
        return None
    total_flops, total_s, total_peak_s, terms = _compute_terms(usable, cluster, start)
    solutions = [a / (t - e) for a, e, t in terms if t > e and a > 0]
    efficiency = _geomean(solutions) if solutions else start.compute_efficiency
    half_work = start.half_efficiency_rows
    if efficiency > 1.0:
        sizes = [w for w in (_half_work_matching(p, cluster, start) for p in usable) if w]
        if sizes:
            efficiency, half_work = 1.0, _geomean(sizes)
    fitted = dataclasses.replace(
        start, compute_efficiency=efficiency, half_efficiency_rows=half_work
    )
    errors = [_compute_term(p.config, cluster, fitted) / p.seconds - 1 for p in usable]
    return ComputeFit(
        flops_per_s=total_flops / total_s,
        fraction_of_peak=total_flops / total_peak_s,
        compute_efficiency=efficiency,
        half_efficiency_rows=half_work,
        num_trials=len(usable),
        residual=math.sqrt(sum(x * x for x in errors) / len(errors)),
    )


def _compute_terms(
    usable: Sequence[ComputePoint], cluster: ClusterSpec, start: Calibration
) -> tuple[float, float, float, list[tuple[float, float, float]]]:
    """(FLOPs, measured seconds, seconds × peak, summed over the trials) and each trial's
    (A, E, T): its compute term's matmul part at efficiency 1, its element-wise part, and its
    measured time (``fit_compute``)."""
    flops_cal = dataclasses.replace(
        start,
        compute_efficiency=1.0,
        half_efficiency_rows=0.0,
        half_efficiency_cols=0.0,
        elementwise_bytes=0.0,
        elementwise_sharded_bytes=0.0,
        score_bytes=0.0,
    )
    total_flops = total_s = total_peak_s = 0.0
    terms = []
    for p in usable:
        peak = cluster.device.flops(p.config.compute_dtype())
        flops = _compute_term(p.config, cluster, flops_cal) * peak
        total_flops += flops
        total_s += p.seconds
        total_peak_s += p.seconds * peak
        at_one = _compute_term(
            p.config, cluster, dataclasses.replace(start, compute_efficiency=1.0)
        )
        at_half = _compute_term(
            p.config, cluster, dataclasses.replace(start, compute_efficiency=0.5)
        )
        terms.append((at_half - at_one, 2 * at_one - at_half, p.seconds))  # (A, E, T)
    return total_flops, total_s, total_peak_s, terms


def _half_work_matching(
    point: ComputePoint, cluster: ClusterSpec, start: Calibration
) -> float | None:
    """The half_efficiency_rows at which the compute term (asymptote 1) equals the measured
    time; None if none does. With efficiency ``r / (r + r½)`` in the rows r the term is linear in
    r½, so the
    secant from w½ = 0 lands on it at once; a few more steps cover a curve that is not."""

    def term(half_work: float) -> float:
        cal = dataclasses.replace(start, compute_efficiency=1.0, half_efficiency_rows=half_work)
        return _compute_term(point.config, cluster, cal)

    x0, x1 = 0.0, max(start.half_efficiency_rows, 1.0)
    f0, f1 = term(x0) - point.seconds, term(x1) - point.seconds
    if f0 >= 0:
        return None  # faster than the peak allows even with no size penalty
    for _ in range(8):
        if f1 == f0:
            return None
        x0, x1, f0 = x1, x1 - f1 * (x1 - x0) / (f1 - f0), f1
        if x1 <= 0:
            return None
        f1 = term(x1) - point.seconds
        if abs(f1) <= 1e-9 * point.seconds:
            return x1
    return None


def _geomean(values: Sequence[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def _compute_term(config: TrialConfig, cluster: ClusterSpec, cal: Calibration) -> float:
    return predict_step_time(config, cluster, cal).breakdown["compute"]


def fit_spans(
    trials: Iterable[TrialSpans], cluster: ClusterSpec, start: Calibration | None = None
) -> SpanFit:
    """Fit every link class that has points, and compute, over the trials' span summaries."""
    start = start or Calibration.for_cluster(cluster)
    trials = list(trials)
    by_link: dict[str, list[CollectivePoint]] = defaultdict(list)
    for trial in trials:
        for point in trial.collectives:
            by_link[point.link].append(point)
    links, ratios = {}, []
    for name in LINKS:
        if by_link.get(name):
            prior = getattr(cluster, name).latency_us * 1e-6
            fit = links[name] = fit_link(by_link[name], prior_latency_s=prior)
            ratios += [
                described_seconds(p, cluster) / fit.seconds(p.wire_bytes) for p in by_link[name]
            ]
    comm = _geomean(ratios) if ratios else None
    compute = fit_compute([t.compute for t in trials if t.compute is not None], cluster, start)
    return SpanFit(links, compute, comm)


def described_seconds(point: CollectivePoint, cluster: ClusterSpec) -> float:
    """The collective's time from the cluster's own figures (comm_efficiency 1): inside a node
    the intra-node bus bandwidth at its size, ``r·S / busbw(S)``; between nodes the network's
    latency + ``r·S`` / bandwidth (``perf_model.collective_time``, without its sharing of a
    node's network between concurrent groups)."""
    if point.link == INTRA:
        ranks = min(point.group_size, cluster.devices_per_node)
        return point.wire_bytes / cluster.intra_node.busbw(point.bytes, ranks)
    link = cluster.inter_node
    return link.latency_us * 1e-6 + point.wire_bytes / (link.bandwidth_gbs * GB)
