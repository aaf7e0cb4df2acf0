"""Ctrl-C that always ends the command within a few seconds, whatever the load.

The first SIGINT raises ``KeyboardInterrupt`` in the main thread, as Python does by default: a
search unwinds, its executor kills the rank actors (``ray.kill``), Ray is shut down and the
command exits 130 (``args.run_command``). Nothing of the study is lost: every trial is stored in
one transaction, and the trial the interrupt cut short is failed when the study is resumed.

That unwinding has steps nobody bounds: Ray's shutdown joins its threads and waits for its
processes; the interpreter's exit joins the trial threads of a ``--parallel`` search; and a
``KeyboardInterrupt`` raised inside a finaliser or a weakref callback is printed and dropped,
after which the search simply goes on. Python runs a signal's handler only in the main thread
and only between bytecodes, so while the main thread waits in C (a SQLite busy wait, a thread
join) even a second Ctrl-C would not be seen. So ``interrupt_guard`` also asks the C-level
handler to write every signal to a socket (``signal.set_wakeup_fd``) that a thread of its own
reads: from the first SIGINT that thread gives the command ``FORCE_EXIT_AFTER_S`` to end, and a
second SIGINT, or that time running out, ends it at once: ``autotune: interrupted`` on stderr
(once), SIGKILL to every process it started (a local Ray cluster: GCS, raylet, agents, rank
workers), exit 130.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator

EXIT_INTERRUPTED = 130
"""128 + SIGINT, the status a shell gives a process Ctrl-C ended."""
FORCE_EXIT_AFTER_S = 10.0
"""How long after the first SIGINT the command may take to unwind before it is ended: a search
on a 2-core machine shared with other work unwound in 2.7 s, with three CPU burners besides in
4.5 s (``tests/faults/test_fault_driver.py``'s figure, docs/reliability.md)."""

_said = threading.Lock()


def say_interrupted() -> None:
    """Print ``autotune: interrupted`` on stderr, once per process whoever calls it first (the
    main thread unwinding, or the guard ending the process)."""
    if _said.acquire(blocking=False):
        print("autotune: interrupted", file=sys.stderr, flush=True)


def kill_descendants() -> None:
    """SIGKILL every process below this one (Ray's services and workers of a local cluster),
    deepest first so none is restarted by a parent still alive."""
    import psutil

    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return
    for child in reversed(children):
        with contextlib.suppress(psutil.Error):
            child.kill()


def force_exit() -> None:
    """End the process now, as interrupted."""
    say_interrupted()
    kill_descendants()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    os._exit(EXIT_INTERRUPTED)


class _Watcher:
    """Reads the signal numbers the C-level handler writes; SIGINT arms, then fires."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.reader, self.writer = socket.socketpair()
        self.writer.setblocking(False)  # set_wakeup_fd requires it
        self.interrupted = threading.Event()
        self._timer: threading.Timer | None = None
        self._thread = threading.Thread(target=self._run, name="autotune-interrupt", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                data = self.reader.recv(64)
            except OSError:
                return
            if not data:
                return  # closed: the guarded block ended without an interrupt
            for signum in data:
                if signum == signal.SIGINT:
                    self._on_sigint()

    def _on_sigint(self) -> None:
        if self.interrupted.is_set():
            force_exit()  # the second Ctrl-C
        self.interrupted.set()
        self._timer = threading.Timer(self.grace_s, force_exit)
        self._timer.daemon = True
        self._timer.start()

    def close(self) -> None:
        for sock in (self.writer, self.reader):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


@contextlib.contextmanager
def interrupt_guard(grace_s: float = FORCE_EXIT_AFTER_S) -> Iterator[None]:
    """While the block runs (and, once interrupted, until the process exits), Ctrl-C ends the
    process within ``grace_s`` seconds, a second Ctrl-C at once. Outside the main thread, or
    where SIGINT is not Python's default handler (an embedding program's own), it does nothing.
    """
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    watcher = _Watcher(grace_s)
    previous = signal.set_wakeup_fd(watcher.writer.fileno(), warn_on_full_buffer=False)
    watcher.start()
    try:
        yield
    finally:
        if not watcher.interrupted.is_set():
            signal.set_wakeup_fd(previous)
            watcher.close()
        # Interrupted: the watcher stays, so its timer and a second Ctrl-C keep bounding the
        # rest of the exit (Ray's atexit shutdown, the joins of leftover threads).
