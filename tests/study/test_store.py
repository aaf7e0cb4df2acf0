"""A real trial stored in SQLite and read back is what was stored; its trace is valid Chrome
trace JSON holding every span; the CLI's profile and trace commands work end to end."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.config import TrialConfig
from autotune.study.store import MEMORY_CATEGORIES, load_spans, store_result, to_record
from db import Database
from profiler.trace import TRACKS, chrome_trace, write_chrome_trace

ROOT = Path(__file__).resolve().parents[2]
CONFIG = TrialConfig(
    world_size=2,
    pp_degree=2,
    micro_batch_size=2,
    num_warmup_steps=1,
    num_timed_steps=2,
    num_profiled_steps=2,
    device="cpu",
)


@pytest.fixture(scope="module")
def result(executor):
    return executor.run(CONFIG)


def test_stored_trial_reads_back_equal(result, tmp_path):
    db = Database.open(f"sqlite:///{tmp_path / 'a.db'}")
    record, spans = to_record(result)
    trial_id = db.add_trial(record, spans)
    stored = db.get_trial(trial_id)
    assert stored == dataclasses.replace(record, id=trial_id)
    assert db.trial_spans(trial_id) == sorted(spans, key=lambda s: (s.rank, s.start_ns))
    # What was stored is what the trial measured.
    # ... with the precision it trained in spelled out (the CPU default).
    assert TrialConfig.from_dict(stored.config) == CONFIG.with_precision("cpu")
    assert stored.metrics["step_time_s"] == result.step_time_s
    assert stored.metrics["losses"] == result.losses
    # Every category per rank but the memory outside the allocator, which a CPU rank does not
    # report (a figure not measured gets no row).
    assert len(stored.memory) == 2 * (len(MEMORY_CATEGORIES) - 1)
    assert "outside_allocator" not in {m.category for m in stored.memory}
    measured = {(m.rank, m.category): m.measured_bytes for m in stored.memory}
    assert measured[(1, "parameters")] == result.ranks[1].memory.parameters
    # On CPU no caching allocator holds more than the tensors: reserved = allocated.
    assert measured[(1, "peak_reserved")] == measured[(1, "peak")] == result.ranks[1].memory.peak
    phases = [s.phase for s in stored.steps if s.rank == 0]
    assert phases == ["warmup", "timed", "timed", "profiled", "profiled", "memory"]
    assert [s.time_s for s in stored.steps if s.rank == 1] == result.ranks[1].step_times
    loaded = load_spans(db, trial_id)
    assert sorted(loaded, key=lambda s: (s.rank, s.start_ns)) == sorted(
        (s for r in result.ranks for s in r.spans), key=lambda s: (s.rank, s.start_ns)
    )
    db.close()


def test_trace_is_valid_chrome_json_with_every_span(result, tmp_path):
    spans = [s for r in result.ranks for s in r.spans]
    path = tmp_path / "trace.json"
    assert write_chrome_trace(spans, path) == len(spans)
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == len(spans)
    for e in complete:  # the fields chrome://tracing and Perfetto require of complete events
        assert {"name", "ph", "ts", "dur", "pid", "tid"} <= e.keys()
        assert e["dur"] >= 0 and e["ts"] >= 0
    assert {e["pid"] for e in complete} == {0, 1}  # one process per rank
    comm_tid, compute_tid = TRACKS["p2p"][0], TRACKS["compute"][0]
    assert {e["tid"] for e in complete if e["cat"] == "p2p"} == {comm_tid}
    assert compute_tid in {e["tid"] for e in complete}
    names = {(e["pid"], e["args"]["name"]) for e in events if e.get("name") == "process_name"}
    assert names == {(0, "rank 0"), (1, "rank 1")}
    sends = [e for e in complete if e["name"] == "send"]
    assert sends and all(e["args"]["bytes"] > 0 and e["args"]["group"] == "pp" for e in sends)
    assert chrome_trace([])["traceEvents"] == []


def test_store_result_keeps_one_trial_per_call(result, tmp_path):
    db = Database.open(f"sqlite:///{tmp_path / 'b.db'}")
    first = store_result(db, result)
    second = store_result(db, result)
    assert second != first
    assert (
        db.count_spans(first) == db.count_spans(second) == sum(len(r.spans) for r in result.ranks)
    )
    db.close()


def _cli(*args, cwd):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )


def test_profile_then_trace_from_the_cli(tmp_path, session_cluster):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(
        json.dumps({"world_size": 2, "zero_stage": 0, "micro_batch_size": 4, "num_timed_steps": 2})
    )
    proc = _cli("profile", "--config", str(cfg), "--ray-address", session_cluster, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "autotune.db").exists()  # the default database, in the working dir
    assert "stored as trial 1" in proc.stderr
    table = proc.stdout.split("rank   window ms")[1]
    rows = [ln.split() for ln in table.splitlines()[1:3]]
    assert [r[0] for r in rows] == ["0", "1"]
    assert "all_reduce" in proc.stdout and "dp" in proc.stdout
    out = tmp_path / "t.json"
    proc = _cli("trace", "--trial", "1", "-o", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    events = json.loads(out.read_text())["traceEvents"]
    db = Database.open(f"sqlite:///{tmp_path / 'autotune.db'}", create=False)
    assert sum(1 for e in events if e["ph"] == "X") == db.count_spans(1)
    db.close()


def test_trace_of_a_missing_trial_is_one_line(tmp_path):
    Database.open(f"sqlite:///{tmp_path / 'c.db'}").close()
    proc = _cli(
        "trace",
        "--db",
        f"sqlite:///{tmp_path / 'c.db'}",
        "--trial",
        "9",
        "-o",
        str(tmp_path / "x.json"),
        cwd=tmp_path,
    )
    assert proc.returncode == 1 and "no trial with id 9" in proc.stderr
    assert "Traceback" not in proc.stderr
