"""Per-rank communication/compute timelines: capture, analysis, Chrome/Perfetto trace export.

Usable on its own around any training loop (``with profiler.record() as rec``); never imports
``autotune``.
"""

from profiler.analysis import RankBreakdown, breakdown, bytes_per_step, rank_breakdown
from profiler.capture import Recorder, record
from profiler.spans import COMM, COMPUTE, P2P, STEP, Span

__all__ = ["COMM", "COMPUTE", "P2P", "STEP", "RankBreakdown", "Recorder", "Span", "breakdown",
           "bytes_per_step", "rank_breakdown", "record"]
