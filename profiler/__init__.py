"""Per-rank communication/compute timelines: capture, analysis, Chrome/Perfetto trace export.

Usable on its own around any training loop (``with profiler.record() as rec``); never imports
``autotune``. Importing the package loads no torch: the spans and their analysis are plain
Python (a driver reads and summarises stored timelines without the training stack), and
``record`` / ``Recorder`` load ``profiler.capture`` (torch.profiler) on first use.
"""

from profiler.analysis import RankBreakdown, breakdown, bytes_per_step, rank_breakdown
from profiler.spans import COMM, COMPUTE, P2P, STEP, Span

__all__ = [
    "COMM",
    "COMPUTE",
    "P2P",
    "STEP",
    "RankBreakdown",
    "Recorder",
    "Span",
    "breakdown",
    "bytes_per_step",
    "rank_breakdown",
    "record",
]

_CAPTURE = ("Recorder", "record")


def __getattr__(name: str):
    """``record`` and ``Recorder``, imported when first asked for (PEP 562)."""
    if name in _CAPTURE:
        from profiler import capture

        return getattr(capture, name)
    raise AttributeError(f"module 'profiler' has no attribute {name!r}")
