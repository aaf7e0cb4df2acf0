"""The GPU check's search stage end to end: ``autotune search`` with no knob given (on GPUs it
takes every visible GPU), its stored trials and exports (``gpu_search.search_checks``), then
``autotune dashboard -o`` on the same database: exit 0 and an HTML file written.

Imported by ``bench/gpu_check.py``; :func:`dashboard_check` judges one finished dashboard
command, so the tests run it on made-up outcomes.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import gpu_search
from gpu_table import Check


def _autotune(args: list[str], repo_root: str, timeout_s: float) -> tuple[int | None, str]:
    """(exit status, last line of its output) of ``python -m autotune ARGS``; None on a timeout."""
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "autotune", *args],
            capture_output=True,
            text=True,
            cwd=repo_root,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return None, f"still running after {timeout_s:.0f}s"
    lines = proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or [""]
    return proc.returncode, lines[-1]


def dashboard_check(returncode: int | None, last_line: str, html: Path) -> Check:
    """``autotune dashboard -o`` exited 0 and wrote a non-empty HTML page."""
    size = html.stat().st_size if html.exists() else 0
    text = html.read_text(errors="replace")[:2000].lower() if size else ""
    return Check.judged(
        "default search: dashboard",
        "autotune dashboard -o exits 0, writes HTML",
        f"exit {returncode}: {size:,} bytes; {last_line[:80]}",
        returncode == 0 and "<html" in text,
    )


def run_search_and_dashboard(
    repo_root: str, timeout_s: float, extra: tuple[str, ...] = (), *, device: str = "cuda"
) -> list[Check]:
    """The search (``extra`` after its defaults), its rows, then its dashboard's row."""
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/search.db"
        code, last = _autotune(["search", "--db", url, "--out", tmp, *extra], repo_root, timeout_s)
        checks = [
            Check.judged("default search", "exits 0", f"exit {code}: {last[:100]}", code == 0)
        ]
        checks += gpu_search.search_checks(url, Path(tmp), device)
        html = Path(tmp) / "dashboard.html"
        code, last = _autotune(["dashboard", "--db", url, "-o", str(html)], repo_root, 300)
        checks.append(dashboard_check(code, last, html))
        return checks
