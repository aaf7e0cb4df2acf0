"""``autotune trial`` end to end: a real run, and one clear line for each bad input."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from cli_in_process import run_in_process
from reference import reference_losses

from autotune.config import TrialConfig

ROOT = Path(__file__).resolve().parents[2]


def autotune(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )


def _one_line_error(proc: subprocess.CompletedProcess, code: int, text: str) -> None:
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("autotune:")]
    assert proc.returncode == code, proc.stderr
    assert len(lines) == 1 and text in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_trial_json_and_table_output_train_the_reference_model(tmp_path, session_cluster):
    """One ``autotune trial --json`` (a CLI subprocess, on the session's Ray cluster; one run
    serves both outputs): its losses are the single-process reference's, and the table
    that ``autotune trial`` prints without ``--json`` (``format_result``) names every rank."""
    from autotune.cli.trial import format_result
    from autotune.trial.result import TrialResult, rank_from_dict

    cfg = tmp_path / "cfg.json"
    cfg.write_text(
        json.dumps(
            {
                "world_size": 2,
                "pp_degree": 2,
                "micro_batch_size": 4,
                "pp_schedule": "gpipe",
                "num_timed_steps": 2,
            }
        )
    )
    proc = autotune(
        "trial", "--config", str(cfg), "--json", "--db", "none", "--ray-address", session_cluster
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    config = TrialConfig.from_dict(result["config"])
    expected = reference_losses(
        config, config.num_warmup_steps + config.num_timed_steps + config.num_profiled_steps + 1
    )
    assert result["losses"] == pytest.approx(expected, abs=2e-5)
    assert result["throughput_tokens_per_s"] == pytest.approx(
        config.tokens_per_step / result["step_time_s"]
    )
    assert [r["rank"] for r in result["ranks"]] == [0, 1]
    assert all(r["memory"]["parameters"] > 0 for r in result["ranks"])
    # Where each rank ran: the local cluster's one Ray node, on this host.
    assert len({r["node_id"] for r in result["ranks"]}) == 1 and result["ranks"][0]["node_id"]
    assert {r["hostname"] for r in result["ranks"]} == {socket.gethostname()}

    names = {f.name for f in dataclasses.fields(TrialResult)} - {"ranks"}
    table = format_result(
        TrialResult(
            **{k: v for k, v in result.items() if k in names},
            ranks=[rank_from_dict(r) for r in result["ranks"]],
        )
    )
    assert "world 2 = tp 1 × pp 2 × cp 1 × dp 1" in table
    assert "schedule gpipe" in table
    rank_rows = [ln.split() for ln in table.splitlines() if ln[:4].strip().isdigit()]
    assert [(row[0], row[1]) for row in rank_rows] == [("0", "0"), ("1", "1")]  # rank, pp rank


def test_examples_are_valid_configs():
    for path in sorted((ROOT / "examples").glob("*.json")):
        TrialConfig.from_file(path).validate()


BAD_CONFIGS = {
    "malformed": ('{"world_size": 2,', "not valid JSON"),
    "truncated": ('{"workload": {"family": "gpt", ', "not valid JSON"),
    "unknown-size": ('{"workload": {"size": "huge"}}', "unknown model 'gpt-huge'"),
    "tp-heads": (
        '{"world_size": 3, "tp_degree": 3, "workload": {"global_batch_size": 3}}',
        "must divide the 4 attention heads",
    ),
    "pp-layers": (
        '{"world_size": 8, "pp_degree": 8, "micro_batch_size": 1}',
        "exceed the 4 layers",
    ),
    "batch": ('{"world_size": 2, "micro_batch_size": 3}', "is not divisible by"),
    "workload-import": ('{"workload": {"workload": "no_such_pkg.mod:build"}}', "does not import"),
    "unknown-key": ('{"tp": 2}', "unknown key 'tp'"),
}


@pytest.mark.parametrize("name", sorted(BAD_CONFIGS))
def test_bad_config_is_one_line_and_exit_2(capsys, monkeypatch, tmp_path, name):
    text, message = BAD_CONFIGS[name]
    cfg = tmp_path / "cfg.json"
    cfg.write_text(text)
    _one_line_error(
        run_in_process(capsys, monkeypatch, tmp_path, "trial", "--config", str(cfg)), 2, message
    )


def test_missing_config_file(capsys, monkeypatch, tmp_path):
    _one_line_error(
        run_in_process(capsys, monkeypatch, tmp_path, "trial", "--config", "no/such.json"),
        2,
        "cannot read config file",
    )


def test_world_larger_than_cluster_is_a_runtime_error(tmp_path):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(
        '{"world_size": 64, "micro_batch_size": 1, "workload": {"global_batch_size": 64}}'
    )
    _one_line_error(
        autotune("trial", "--config", str(cfg), "--db", "none"),
        1,
        "world_size 64 needs 32 CPUs (0.5 per rank)",
    )


def test_debug_shows_the_traceback(tmp_path):
    # In a process of its own: the traceback as the interpreter prints it.
    cfg = tmp_path / "cfg.json"
    cfg.write_text('{"workload": {"size": "huge"}}')
    proc = autotune("--debug", "trial", "--config", str(cfg))
    assert proc.returncode == 2 and "Traceback" in proc.stderr


def test_bad_option_value_is_a_usage_error(capsys, monkeypatch, tmp_path):
    proc = run_in_process(capsys, monkeypatch, tmp_path, "trial", "--timeout", "-3")
    assert proc.returncode == 2 and "must be > 0" in proc.stderr


@pytest.mark.parametrize("kind", ["malformed", "not-a-database", "missing-directory", "password"])
def test_bad_database_fails_before_any_trial(capsys, monkeypatch, tmp_path, kind):
    bogus = tmp_path / "bogus.db"
    bogus.write_text("this is not a database" * 100)
    url = {
        "malformed": "not a url",
        "not-a-database": f"sqlite:///{bogus}",
        "missing-directory": f"sqlite:///{tmp_path}/no/such/dir/x.db",
        "password": "postgresql://user:s3cr3t@127.0.0.1:1/autotune",
    }[kind]
    proc = run_in_process(capsys, monkeypatch, tmp_path, "trial", "--db", url)
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("autotune:")]
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "s3cr3t" not in proc.stderr + proc.stdout
    assert "running gpt-tiny" not in proc.stderr  # refused before Ray or any trial started
    assert bogus.read_text() == "this is not a database" * 100  # nothing written
