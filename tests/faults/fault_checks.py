"""What the fault tests look at: processes (through /proc), listening sockets, and the database
rows a search stored before and after a fault."""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import os
import time
from dataclasses import dataclass, field

import pytest

from autotune.config import TrialConfig
from autotune.errors import TrialFailed
from db import TrialRecord


# ---- the memory model ------------------------------------------------------------------------
@contextlib.contextmanager
def estimated_as_builtin():
    """The fault workloads are the built-in tiny GPT with a misbehaving forward. A search runs a
    user workload's configurations unpredicted (the memory model does not know its shape; see
    test_search_over_a_user_workload); while this is active, the driver predicts them as the
    built-in model their spec names, so a fault test can also exercise the memory screen.
    Nothing changes on the workers."""
    from autotune.search import screen

    original = screen.predict_peak

    def predict(config, device_type):
        if config.workload.workload is not None:
            config = dataclasses.replace(
                config, workload=dataclasses.replace(config.workload, workload=None)
            )
        return original(config, device_type)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(screen, "predict_peak", predict)
        yield


# ---- processes -------------------------------------------------------------------------------
def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (state first), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def running(pid: int) -> bool:
    """The process exists and is not a zombie (a zombie runs nothing and holds no socket)."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def wait_gone(pids, timeout: float = 60.0) -> list[int]:
    """The pids still running after ``timeout`` seconds (Ray kills actors asynchronously; on a
    loaded machine that takes a while); returns as soon as none is."""
    deadline = time.monotonic() + timeout
    alive = [p for p in pids if running(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [p for p in alive if running(p)]
    return alive


def descendants(root: int) -> set[int]:
    """Every running process below ``root`` (Ray's GCS, raylet, agents and workers of a driver)."""
    children: dict[int, list[int]] = {}
    for path in glob.glob("/proc/[0-9]*/stat"):
        pid = int(path.split("/")[2])
        fields = _stat_fields(pid)
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(pid)
    found, stack = set(), [root]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


# ---- sockets ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Listener:
    pid: int
    address: str
    port: int

    @property
    def loopback(self) -> bool:
        # 127.0.0.0/8, ::1, and IPv4-mapped ::ffff:127.x
        return (
            self.address.startswith("127.")
            or self.address == "::1"
            or self.address.startswith("::ffff:127.")
        )


def _address(hex_address: str) -> str:
    import ipaddress

    raw = bytes.fromhex(hex_address)
    # /proc/net/tcp{,6} print each 32-bit word in host (little-endian) order.
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    address = ipaddress.ip_address(words)
    mapped = getattr(address, "ipv4_mapped", None)
    return f"::ffff:{mapped}" if mapped else str(address)


def listening_sockets(pids) -> list[Listener]:
    """The TCP sockets in LISTEN state that ``pids`` hold open."""
    owner: dict[int, int] = {}
    for pid in pids:
        for fd in glob.glob(f"/proc/{pid}/fd/*"):
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                owner[int(target[8:-1])] = pid
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if cols[3] != "0A":  # TCP_LISTEN
                continue
            inode = int(cols[9])
            if inode in owner:
                address, port = cols[1].split(":")
                found.append(Listener(owner[inode], _address(address), int(port, 16)))
    return found


# ---- a search's runs and rows ----------------------------------------------------------------
@dataclass
class Run:
    """One ``executor.run`` call made by a search."""

    config: TrialConfig
    pids: list[int]
    """The rank processes that ran it: from the result, or (failed) the warm group it ran on."""
    cold: bool | None
    """Whether it built a new worker group (None: it failed)."""
    error: TrialFailed | None
    stored_before: dict[int, TrialRecord]
    """Every trial in the database when the run started."""
    seconds: float


@dataclass
class RecordingExecutor:
    """The real executor, remembering for each run which processes ran it and what the database
    held before it; a search is handed this instead of the executor itself."""

    inner: object
    database: object
    runs: list[Run] = field(default_factory=list)

    def run(self, config: TrialConfig):
        warm = self.inner.worker_pids
        stored = {t.id: t for t in self.database.list_trials()}
        start = time.monotonic()
        try:
            result = self.inner.run(config)
        except TrialFailed as e:
            self.runs.append(Run(config, warm, None, e, stored, time.monotonic() - start))
            raise
        pids = [r.extra["pid"] for r in result.ranks]
        self.runs.append(
            Run(config, pids, result.cold_start, None, stored, time.monotonic() - start)
        )
        return result

    @property
    def worker_pids(self) -> list[int]:
        return self.inner.worker_pids


def without_remeasurements(trial: TrialRecord) -> TrialRecord:
    """A trial as first stored: the re-measurement of the top configurations at the end of a
    search appends ``remeasured_throughputs`` and their rounds to its metrics, and then each
    trial's ``throughput_interval`` (by design), and changes nothing else."""
    added = ("remeasured_throughputs", "remeasured_rounds", "throughput_interval")
    metrics = {k: v for k, v in trial.metrics.items() if k not in added}
    return dataclasses.replace(trial, metrics=metrics)


def complete_trial(study_id: int, number: int = 0, **fields) -> TrialRecord:
    """A stored-looking complete trial of the default configuration (enough to export)."""
    from datetime import UTC, datetime

    record = TrialRecord(
        id=None,
        study_id=study_id,
        number=number,
        status="complete",
        config=TrialConfig(device="cpu").resolved(),
        metrics={
            "step_time_s": 0.05,
            "throughput_tokens_per_s": 10240.0,
            "peak_memory_bytes": 6_000_000,
        },
        env={"torch": "2.13.0", "device": "cpu", "backend": "gloo", "world_size": 2},
        error=None,
        created_at=datetime.now(UTC),
    )
    return dataclasses.replace(record, **fields)
