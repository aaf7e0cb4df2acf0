"""The unit of a timeline: one interval on one rank."""

from __future__ import annotations

from dataclasses import dataclass

COMPUTE, COMM, P2P, STEP = "compute", "comm", "p2p", "step"


@dataclass(frozen=True, slots=True)
class Span:
    """An interval on one rank, on a clock shared by all ranks of a run."""

    rank: int
    step: int
    """Index of the training step the span falls in (-1: outside any marked step)."""
    kind: str
    """'compute', 'comm' (collective), 'p2p' (send/recv) or 'step' (a step's boundary)."""
    name: str
    """Op or collective name: 'aten::mm', 'all_reduce', 'send', 'step'."""
    category: str
    """For compute, the phase it ran in: 'forward', 'backward' or 'optimizer', 'op' outside
    every phase, 'kernel' for a CUDA kernel whose launching op is unknown; '' otherwise."""
    start_ns: int
    dur_ns: int
    bytes: int = 0
    """Payload bytes of a collective (the full buffer: all_gather's output, reduce_scatter's
    input, all_reduce's tensor) or of a send/recv."""
    group: str = ""
    """Process group / mesh dimension ('dp', 'tp', 'pp', …) where known, else ''."""

    @property
    def end_ns(self) -> int:
        return self.start_ns + self.dur_ns
