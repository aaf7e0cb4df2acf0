"""``autotune search`` / ``export`` / ``estimate`` at the command line: the default run works
end to end, and each bad input is one line naming the fix, before anything runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_in_process import run_in_process as in_process
from password_scan import files_holding, rows_holding
from sqlalchemy.engine import make_url

from autotune.config import TrialConfig
from db import Database

ROOT = Path(__file__).resolve().parents[2]


def autotune(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=600,
    )


def _one_line(proc, code: int, text: str) -> None:
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("autotune")]
    assert proc.returncode == code, proc.stderr
    assert any(text in ln for ln in lines), proc.stderr
    assert "Traceback" not in proc.stderr


def test_small_search_end_to_end_then_export(tmp_path, db_url, session_cluster):
    """Search, export and dashboard on SQLite (the default URL) and on PostgreSQL, whose URL
    carries a password that no output, file or stored row may show. PostgreSQL runs one trial
    (and its re-measurement): the storage path is the same for each, and the suite's time is
    spent once."""
    db = [] if db_url.startswith("sqlite") else ["--db", db_url]
    trials = 3 if not db else 1
    proc = autotune(
        "search",
        "--trials",
        str(trials),
        "--patience",
        "3",
        "--top-k",
        "1",
        "--remeasure",
        "1",
        "--timed-steps",
        "2",
        "--fix",
        "pp_degree=1",
        "--fix",
        "tp_degree=1",
        "--ray-address",
        session_cluster,
        *db,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "autotune.db").exists() == (not db)
    assert f"[{trials}/{trials}]" in proc.stderr  # progress: trial i of N
    assert "best:" in proc.stdout and "tok/s" in proc.stdout
    best = json.loads((tmp_path / "best_config.json").read_text())
    config = TrialConfig.from_file(tmp_path / "best_config.json")
    assert config.tp_degree == 1 and config.pp_degree == 1
    ds = json.loads((tmp_path / "ds_config.json").read_text())
    assert ds["train_batch_size"] == config.workload.global_batch_size
    (tmp_path / "best_config.json").unlink()
    exported = autotune("export", "--out", "again", *db, cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    assert json.loads((tmp_path / "again" / "best_config.json").read_text()) == best
    assert (tmp_path / "again" / "megatron_args.txt").read_text() == (
        tmp_path / "megatron_args.txt"
    ).read_text()  # the search wrote it too, the same
    dashboard = autotune("dashboard", "-o", "dashboard.html", *db, cwd=tmp_path)
    assert dashboard.returncode == 0, dashboard.stderr
    with Database.open(db_url, create=False) as database:
        stored = database.list_trials(database.get_study("autotune").id)
    assert f"({len(stored)} trials" in dashboard.stdout, dashboard.stdout
    assert "<html" in (tmp_path / "dashboard.html").read_text()[:200].lower()

    password = make_url(db_url).password
    if password is None:
        return
    (tmp_path / "control.txt").write_text(db_url)  # the scan's control: it finds the password
    assert files_holding(password, tmp_path) == [str(tmp_path / "control.txt")]
    (tmp_path / "control.txt").unlink()
    outputs = "".join(p.stdout + p.stderr for p in (proc, exported, dashboard))
    assert "autotune:***@127.0.0.1" in proc.stderr  # the URL is shown, its password hidden
    assert password not in outputs
    assert files_holding(password, tmp_path) == []
    assert "autotune:***@" in (tmp_path / "dashboard.html").read_text()
    assert rows_holding(db_url, password) == []


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["--fix", "tp_degree=3"], 2, "no valid configuration"),
        (["--fix", "warp_drive=9"], 2, "unknown knob 'warp_drive'"),
        (["--fix", "zero_stage"], 2, "must be KNOB=VALUE"),
        (["--trials", "many"], 2, "'many' is not a whole number"),
        (["--trials", "-4"], 2, "must be ≥ 1"),
        (["--time-budget", "-1"], 2, "must be > 0"),
        (["--memory-limit", "0.000001"], 2, "no configuration fits in"),
        (["--resume", "--study", "nope"], 2, "no study named 'nope' to resume"),
        (["--model", "gpt-huge"], 2, "unknown model 'gpt-huge'"),
        (["--sampler", "annealing"], 2, "invalid choice: 'annealing'"),
        (["--parallel", "0"], 2, "must be ≥ 1"),
        (["--cluster", "nowhere"], 2, "unknown cluster 'nowhere'"),
        (
            ["--cluster", "cpu-local", "--world-size", "4"],
            2,
            "cluster 'cpu-local' has 1 node(s) × 2 devices = 2, fewer than the world size 4",
        ),
    ],
)
def test_bad_search_input(capsys, monkeypatch, tmp_path, args, code, message):
    _one_line(in_process(capsys, monkeypatch, tmp_path, "search", *args), code, message)
    assert not (tmp_path / "best_config.json").exists()


def test_more_concurrent_trials_than_the_ray_cluster_holds(tmp_path):
    """Found once Ray is up, so in a process of its own (Ray's state is process-wide)."""
    proc = autotune(
        "search", "--parallel", "8", "--fix", "tp_degree=1", "--fix", "pp_degree=1", cwd=tmp_path
    )
    _one_line(
        proc, 1, "8 concurrent trials of 2 ranks need 8 CPUs (0.5 per rank) but the Ray cluster has"
    )
    assert not (tmp_path / "best_config.json").exists()


@pytest.mark.parametrize(
    "command, args, reason",
    [
        ("search", [], "autotune search keeps its study in a database"),
        ("export", [], "autotune export reads the study from a database"),
        (
            "trace",
            ["--trial", "1", "-o", "trace.json"],
            "autotune trace reads the trial's timeline from a database",
        ),
    ],
)
def test_db_none_is_refused_where_a_database_is_needed(
    capsys, monkeypatch, tmp_path, command, args, reason
):
    # --db none (store nothing) suits trial and profile; these three keep or read a study.
    proc = in_process(capsys, monkeypatch, tmp_path, command, "--db", "none", *args)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        f"autotune: error: {reason}: give --db URL or leave the default "
        "(sqlite:///autotune.db); --db none is only for trial and profile"
    ]
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert list(tmp_path.iterdir()) == []  # no database, trace or export written


def test_bad_space_file(capsys, monkeypatch, tmp_path):
    (tmp_path / "space.json").write_text('{"zero_stage": [], "speed": [1]}')
    _one_line(
        in_process(capsys, monkeypatch, tmp_path, "search", "--space", "space.json"),
        2,
        "must be an object of non-empty lists",
    )


def test_export_of_a_missing_study(capsys, monkeypatch, tmp_path):
    in_process(capsys, monkeypatch, tmp_path, "estimate", "--model", "gpt-tiny")  # creates nothing
    proc = in_process(
        capsys, monkeypatch, tmp_path, "export", "--db", f"sqlite:///{tmp_path / 'none.db'}"
    )
    assert proc.returncode == 1 and "no SQLite database" in proc.stderr


@pytest.mark.slow
def test_search_with_cp_fixed_runs_only_cp_layouts(capsys, monkeypatch, tmp_path, executor):
    """``--fix cp_degree=2`` at a long sequence (128 on the tiny GPT): the space holds only CP
    layouts, and every trial that ran trained one (stored with cp_degree 2 and its short name
    marked -cp2). Run in this process on the session's Ray cluster, which the command joins
    as it would any running in its process (the end-to-end test above starts its own); the
    session's warm group is let go first, to leave the command the CPUs."""
    executor.start()
    executor.discard_group()
    proc = in_process(
        capsys,
        monkeypatch,
        tmp_path,
        "search",
        "--world-size",
        "2",
        "--seq-len",
        "128",
        "--trials",
        "2",
        "--patience",
        "2",
        "--top-k",
        "1",
        "--remeasure",
        "0",
        "--timed-steps",
        "1",
        "--fix",
        "cp_degree=2",
        "--fix",
        "zero_stage=0",
        "--fix",
        "micro_batch_size=4",
    )
    assert proc.returncode == 0, proc.stderr
    with Database.open(f"sqlite:///{tmp_path / 'autotune.db'}", create=False) as database:
        stored = database.list_trials(database.get_study("autotune").id)
    ran = [t for t in stored if t.status == "complete"]
    assert ran and all(t.config["cp_degree"] == 2 for t in stored)
    best = TrialConfig.from_file(tmp_path / "best_config.json")
    assert best.cp_degree == 2 and best.workload.seq_len == 128
