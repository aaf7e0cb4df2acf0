"""Processes that keep the machine's cores busy at normal priority while a test runs."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def cpu_burners(count: int) -> Iterator[list[subprocess.Popen]]:
    """``count`` busy loops at the test's own niceness (0 by default: the priority the search
    runs at), killed when the block ends, whatever happens in it."""
    burners: list[subprocess.Popen] = []
    try:
        for _ in range(count):
            burners.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        yield burners
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
