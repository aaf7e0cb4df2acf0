"""The GPU check's table: one row per check, PASS, FAIL or SKIP (a check this machine cannot
make, never counted as passed), with the summary line and the exit status."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

EXIT_FAILED, EXIT_NO_CUDA = 1, 2


class Status(StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"
    SKIP = "SKIP"
    """Not checked on this machine (e.g. a world-size-2 check with one GPU); never a pass."""


@dataclass(frozen=True)
class Check:
    """One row of the table."""

    name: str
    expected: str
    measured: str
    status: Status

    @classmethod
    def judged(cls, name: str, expected: str, measured: str, ok: bool) -> Check:
        return cls(name, expected, measured, Status.PASS if ok else Status.FAIL)

    @property
    def failed(self) -> bool:
        return self.status is Status.FAIL


def format_table(checks: list[Check]) -> str:
    """The checks as an aligned text table, with a PASS/FAIL/SKIP column."""
    header = ("check", "expected", "measured", "")
    rows = [header] + [(c.name, c.expected, c.measured, c.status.value) for c in checks]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def summary_line(checks: list[Check], seconds: float) -> str:
    """'7 passed, 1 failed, 8 skipped of 16 checks in 212s': skips counted on their own."""
    counts = {s: sum(1 for c in checks if c.status is s) for s in Status}
    return (
        f"{counts[Status.PASS]} passed, {counts[Status.FAIL]} failed, "
        f"{counts[Status.SKIP]} skipped of {len(checks)} checks in {seconds:.0f}s"
    )


def exit_status(checks: list[Check]) -> int:
    return EXIT_FAILED if any(c.failed for c in checks) else 0


def relative_error(got: float, want: float) -> float:
    return (got / want - 1) if want else (0.0 if got == 0 else math.inf)


def mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"
