"""The GPU check's search rows: ``autotune search`` with its defaults, as a user first runs it,
completes on the GPU, stores CUDA figures, and writes exports its targets can read; and a
configuration made too large is stored as out of memory.

Imported by ``bench/gpu_check.py``. :func:`search_checks` judges a finished search from its
database and output folder alone, so the tests run it on a CPU search.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from gpu_table import Check

EXPORTS = ("best_config.json", "ds_config.json", "accelerate_config.yaml", "torchtitan_config.py")
"""What ``autotune search`` writes beside its study (``autotune/export``)."""


def run_default_search(
    repo_root: str, timeout_s: float, extra: tuple[str, ...] = (), *, device: str = "cuda"
) -> list[Check]:
    """``autotune search`` with no knob given (the README's first command; ``extra``
    arguments after it), into a fresh database and folder, then :func:`search_checks` of
    ``device``."""
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/search.db"
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "autotune", "search", "--db", url, "--out", tmp, *extra],
                capture_output=True,
                text=True,
                cwd=repo_root,
                timeout=timeout_s,
            )
        except subprocess.TimeoutExpired:
            return [
                Check.judged(
                    "default search", "exits 0", f"still running after {timeout_s:.0f}s", False
                )
            ]
        last = proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or [""]
        checks = [
            Check.judged(
                "default search",
                "exits 0",
                f"exit {proc.returncode}: {last[-1][:100]}",
                proc.returncode == 0,
            )
        ]
        return checks + search_checks(url, Path(tmp), device)


def search_checks(url: str, out: Path, device: str = "cuda") -> list[Check]:
    """The stored trials ran on ``device`` (with NCCL and the CUDA allocator on a GPU) and
    store both of the allocator's peaks; every export is there and parses."""
    from db import Database

    try:
        with Database.open(url, create=False) as database:
            trials = database.list_trials(database.list_studies()[-1].id)
    except Exception as e:  # noqa: BLE001 - reported in the table
        return [
            Check.judged(
                "default search: stored", "a study", f"{type(e).__name__}: {e}"[:120], False
            )
        ]
    complete = [t for t in trials if t.status == "complete"]
    backend, source = ("nccl", "cuda_allocator") if device == "cuda" else ("gloo", "cpu_profiler")
    wrong = [
        t.number
        for t in complete
        if not (
            str(t.env.get("device", "")).startswith(device)
            and t.env.get("backend") == backend
            and t.env.get("memory_source") == source
        )
    ]
    categories = {m.category for t in complete for m in t.memory}
    checks = [
        Check.judged(
            "default search: trials",
            f"complete, on {device} / {backend} / {source}",
            f"{len(complete)} of {len(trials)} complete; wrong device: {wrong or 'none'}",
            bool(complete) and not wrong,
        ),
        Check.judged(
            "default search: memory stored",
            "allocated and reserved peaks per rank",
            ", ".join(sorted(c for c in categories if "peak" in c)) or "none",
            {"peak", "peak_reserved"} <= categories,
        ),
    ]
    return checks + [export_check(out / name) for name in EXPORTS]


def export_check(path: Path) -> Check:
    """The file exists and parses as what its name says (JSON, YAML, Python)."""
    name = f"export {path.name}"
    if not path.exists():
        return Check.judged(name, "written and parses", "missing", False)
    text = path.read_text()
    try:
        if path.suffix == ".json":
            json.loads(text)
        elif path.suffix == ".yaml":
            import yaml

            yaml.safe_load(text)
        else:
            compile(text, str(path), "exec")
    except Exception as e:  # noqa: BLE001 - reported in the table
        return Check.judged(name, "written and parses", f"{type(e).__name__}: {e}"[:100], False)
    return Check.judged(name, "written and parses", f"{len(text):,} bytes", True)
