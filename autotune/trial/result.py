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
    source: str
    """'cuda_allocator' or 'cpu_profiler'."""


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
    def peak_memory_bytes(self) -> int:
        return max(r.memory.peak for r in self.ranks)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["overhead_s"] = self.overhead_s
        d["peak_memory_bytes"] = self.peak_memory_bytes
        return d


def rank_from_dict(d: dict) -> RankResult:
    return RankResult(**{**d, "memory": MemoryBreakdown(**d["memory"]),
                         "spans": [Span(**s) for s in d.get("spans", [])]})


def summarize_steps(ranks: list[RankResult], num_warmup: int, num_timed: int
                    ) -> tuple[float, float]:
    """(step time, seconds in steps): the median of the slowest rank per timed step, and the
    slowest rank's total time in all steps."""
    timed = range(num_warmup, num_warmup + num_timed)
    slowest = [max(r.step_times[i] for r in ranks) for i in timed]
    return statistics.median(slowest), max(sum(r.step_times) for r in ranks)
