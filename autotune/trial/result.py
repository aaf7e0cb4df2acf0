"""The outcome of one trial, as the executor returns it and the CLI prints it.

Each rank's measurements (``RankResult``, ``MemoryBreakdown``) cross the Ray boundary as
dicts and are rebuilt here on the driver, so this module imports neither torch nor Ray: the
driver side (executor, pool, store, search, CLI) can hold results without the training stack.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

from profiler.spans import Span


@dataclass(frozen=True)
class MemoryBreakdown:
    """Measured bytes on one rank during the memory step."""

    parameters: int
    gradients: int
    optimizer_state: int
    activations: int
    """Everything above the model states at the peak: activations, comm buffers, temporaries."""
    other: int
    """Allocator bytes at rest that are not model states (CUDA only; 0 on CPU)."""
    peak: int
    """The allocated peak: bytes held by live tensors at the step's highest point (CUDA:
    ``torch.cuda.max_memory_allocated``)."""
    source: str
    """'cuda_allocator' or 'cpu_profiler'."""
    reserved_peak: int | None = None
    """The bytes the allocator held from the device at its highest point, free blocks in its
    cache included (CUDA: ``torch.cuda.max_memory_reserved``). On CPU there is no caching
    allocator to read (torch's CPU allocator hands a freed block straight back to ``free``), so
    the runner stores the allocated peak here: reserved = allocated. None: not measured (a
    result from before reserved peaks were kept)."""


@dataclass(frozen=True)
class RankResult:
    rank: int
    pp_rank: int
    dp_rank: int
    tp_rank: int
    device: str
    backend: str
    num_threads: int
    step_times: list[float]
    """Seconds per step: warm-up, timed, profiled, then the memory step."""
    losses: list[float]
    """Loss of every step (the global-batch mean, identical on all ranks)."""
    memory: MemoryBreakdown
    setup_s: float
    """Seconds to build and parallelise the workload on this rank."""
    spans: list[Span] = field(default_factory=list)
    """Timeline of the profiled steps, on rank 0's clock."""
    clock_offset_ns: int = 0
    """This rank's clock minus rank 0's (0 for ranks on one host)."""
    extra: dict = field(default_factory=dict)
    node_id: str = ""
    """The Ray node the rank ran on ('' when it ran outside Ray)."""
    hostname: str = ""
    """The host name of that node."""
    cp_rank: int = 0
    """The rank's place in its context-parallel group (0 without context parallelism)."""

    @property
    def outside_allocator_bytes(self) -> int | None:
        """Device memory in use outside the allocator (CUDA context, NCCL's buffers), as the
        rank reported it in ``extra["non_allocator_bytes"]`` (CUDA: total − free − reserved,
        from ``torch.cuda.mem_get_info``); None where nothing was reported (CPU)."""
        value = self.extra.get("non_allocator_bytes")
        return None if value is None else int(value)

    @property
    def device_peak_bytes(self) -> int:
        """What this rank needed of the device at its peak, the figure judged against the memory
        limit: the allocator's reserved peak (the allocated one where no reserved peak was
        measured) plus what lies outside the allocator (0 where none was reported)."""
        reserved = self.memory.reserved_peak
        held = self.memory.peak if reserved is None else reserved
        return held + (self.outside_allocator_bytes or 0)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class TrialResult:
    """Metrics of a completed trial plus every rank's raw measurements."""

    config: dict
    """The fully resolved TrialConfig (with derived quantities)."""
    step_time_s: float
    """Median over timed steps of the slowest rank's step time."""
    throughput_tokens_per_s: float
    losses: list[float]
    """Loss of every step: warm-up, timed, profiled, then the memory step."""
    ranks: list[RankResult]
    wall_s: float
    """Wall time of the executor's run, from submission to the last rank's result."""
    steps_s: float
    """Time the slowest rank spent in warm-up, timed and memory steps."""
    cold_start: bool
    """True when this run had to create the worker group."""
    env: dict = field(default_factory=dict)
    mfu: float | None = None
    """Model FLOPs utilisation, where the device's peak is known (PaLM, Appendix B)."""

    @property
    def overhead_s(self) -> float:
        """Per-trial overhead: wall time not spent in training steps."""
        return self.wall_s - self.steps_s

    @property
    def compile_s(self) -> float | None:
        """Seconds the slowest rank spent compiling its blocks (``extra["compile_s"]``, the first
        warm-up step's excess over a timed step): setup cost, outside the step time. None for a
        trial that does not compile."""
        seconds = [r.extra["compile_s"] for r in self.ranks if "compile_s" in r.extra]
        return max(seconds) if seconds else None

    @property
    def peak_memory_bytes(self) -> int:
        """The highest allocated peak of any rank (what the memory model predicts)."""
        return max(r.memory.peak for r in self.ranks)

    @property
    def peak_reserved_bytes(self) -> int | None:
        """The highest reserved peak of any rank; None when a rank measured none."""
        reserved = [r.memory.reserved_peak for r in self.ranks]
        return None if None in reserved else max(reserved)

    @property
    def device_peak_bytes(self) -> int:
        """The highest ``RankResult.device_peak_bytes``: reserved + outside the allocator, the
        figure the search holds against the memory limit."""
        return max(r.device_peak_bytes for r in self.ranks)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["overhead_s"] = self.overhead_s
        d["compile_s"] = self.compile_s
        d["peak_memory_bytes"] = self.peak_memory_bytes
        d["peak_reserved_bytes"] = self.peak_reserved_bytes
        d["device_peak_bytes"] = self.device_peak_bytes
        return d


def rank_from_dict(d: dict) -> RankResult:
    return RankResult(
        **{
            **d,
            "memory": MemoryBreakdown(**d["memory"]),
            "spans": [Span(**s) for s in d.get("spans", [])],
        }
    )


def summarize_steps(ranks: list[RankResult], timed: range) -> tuple[float, float]:
    """(step time, seconds in steps): the median of the slowest rank per timed step
    (``TrialConfig.timed_steps``), and the slowest rank's total time in all steps."""
    slowest = [max(r.step_times[i] for r in ranks) for i in timed]
    return statistics.median(slowest), max(sum(r.step_times) for r in ranks)
