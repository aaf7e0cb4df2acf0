"""Progress of long work on standard error: a line rewritten in place on a terminal, one line.

``Progress(total, doing)`` reports ``update(done)`` as ``\\r<doing>: 42% (420/1,000)`` every 2% of
``total`` when the stream is a terminal, and nothing otherwise; ``close(summary)`` ends with one
line, ``summary`` followed by the elapsed time, on a terminal and off it alike (a log gets the
summary only). ``rank`` scores layouts with it, the search's re-measurement rounds and the
dashboard's build of a study report through it. No imports beyond the standard library.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """A carriage-return progress line every 2% on a terminal; otherwise one line at the end."""

    def __init__(self, total: int, doing: str, stream: TextIO | None = None) -> None:
        self.total = max(total, 0)
        self.doing = doing
        self.every = max(1, self.total // 50)
        self.start = time.perf_counter()
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()

    def update(self, done: int) -> None:
        """Say that ``done`` of ``total`` are done (written on a terminal only, every 2%)."""
        if self.tty and self.total and (done % self.every == 0 or done == self.total):
            self.stream.write(f"\r{self.doing}: {done / self.total:4.0%} ({done:,}/{self.total:,})")
            self.stream.flush()

    def elapsed(self) -> float:
        """Seconds since this progress began."""
        return time.perf_counter() - self.start

    def close(self, summary: str) -> None:
        """End with one line: ``summary`` (which may hold ``{elapsed}``, the seconds taken)."""
        line = summary.format(elapsed=f"{self.elapsed():.1f} s")
        self.stream.write(f"{chr(13) if self.tty else ''}{line}\n")
        self.stream.flush()
