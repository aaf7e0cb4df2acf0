"""``python -m autotune`` whose Ray shutdown never returns.

    python stalled_driver.py search ...

It stands in for any step of the unwinding after Ctrl-C that does not come back on a loaded
machine: ``ray.shutdown`` joins Ray's threads and waits for its processes with no overall bound,
the interpreter's exit joins leftover threads, and a ``KeyboardInterrupt`` raised inside a
finaliser is dropped while the search goes on. Whatever the step, the command must still end
(``autotune.cli.interrupt``)."""

from __future__ import annotations

import sys
import threading

import ray


def _never_returns(*args, **kwargs) -> None:
    threading.Event().wait()


ray.shutdown = _never_returns  # the executor calls ray.shutdown() through the module

from autotune.cli.main import main  # noqa: E402 - after the stand-in

sys.exit(main())
