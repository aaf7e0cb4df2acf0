"""A search on a real Ray cluster of two nodes (two raylets on loopback, 2 CPUs each, one CPU per
rank): every TP group inside one node and both nodes used; pipeline stages across nodes; the
losses of the single-process reference; a TP group wider than the nodes refused before it runs,
naming the node sizes; losing a node mid-trial records the loss by node, leaves no process of the
trial behind, and stops the search on one line with what it measured.

One search covers it all: a cold worker group costs ~40-100 s on two loaded cores, a warm trial
a few seconds (every layout the search runs reuses the first group). The cluster is a module
fixture for further tests; a test that kills a node must run last. The drivers are
``autotune`` CLI subprocesses that join with ``--ray-address``,
as a user would, with token authentication on (``RAY_AUTH_TOKEN``), as ``ray start`` has it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from reference import reference_losses
from test_executor import _wait_dead

from autotune.config import TrialConfig, WorkloadSpec
from db import Database, StorageError

ROOT = Path(__file__).resolve().parents[2]
NUM_STEPS_EXTRA = 1
"""The memory step after the timed and profiled ones: its loss is reported too."""
LOSS_ATOL = 2e-5


class LoopbackCluster:
    """``tests/ray_cluster.py`` in its own process, and the commands it answers."""

    def __init__(self, num_nodes: int, cpus: int) -> None:
        # Short: Ray's socket paths live under it and must fit in 107 bytes.
        self.temp_dir = tempfile.mkdtemp(prefix="rt", dir="/tmp")
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_AUTH_TOKEN": secrets.token_hex(16),
        }
        self.env.pop("RAY_AUTH_MODE", None)  # the drivers must find token auth themselves
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "tests" / "ray_cluster.py"),
                str(num_nodes),
                str(cpus),
                self.temp_dir,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=self.env,
        )
        info = self._read()
        self.address, self.nodes = info["address"], info["nodes"]

    def _read(self):
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the test cluster exited with {self.proc.wait()}")
        return json.loads(line)

    def ask(self, command: str):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._read()

    def autotune(self, *args: str, **popen) -> subprocess.Popen:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "autotune",
                *args,
                "--ray-address",
                self.address,
                "--cpus-per-rank",
                "1",
                "--timeout",
                "240",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=self.env,
            **popen,
        )

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster():
    c = LoopbackCluster(num_nodes=2, cpus=2)
    yield c
    c.close()


def _expected_losses(config: TrialConfig) -> list[float]:
    return reference_losses(
        config,
        config.num_warmup_steps
        + config.num_timed_steps
        + config.num_profiled_steps
        + NUM_STEPS_EXTRA,
    )


LAYOUTS = {
    (1, 1): "dp4",
    (1, 2): "pp2 x dp2",
    (2, 1): "tp2 x dp2",
    (2, 2): "tp2 x pp2",
    (4, 1): "tp4",
}
"""(tp, pp) → name, over the search space: micro-batch 1 or 2, every other knob fixed."""
SEED = 22
"""Optuna's RandomSampler with this seed proposes, after the plain baseline (dp4), tp2 × dp2,
tp4, pp2 × dp2, then tp2 × pp2 fifth (a different order fails the test, naming it); the space
has ten configurations, so the search has more to propose after the fifth."""


def test_trial_runs_tp2_dp2_with_each_tp_pair_on_one_node(cluster, tmp_path):
    """``autotune trial --ray-address ADDR`` as a user runs it: tp2 × dp2 on the two nodes of
    2 CPUs, each TP pair on one node, both nodes used, the reference's losses; ``--json``
    carries every rank's node id and hostname, and the database keeps them."""
    config = TrialConfig(
        workload=WorkloadSpec(family="gpt", size="tiny", seq_len=32, global_batch_size=8),
        world_size=4,
        tp_degree=2,
        micro_batch_size=2,
        device="cpu",
        num_warmup_steps=1,
        num_timed_steps=2,
        num_profiled_steps=0,
    )
    path = tmp_path / "trial.json"
    path.write_text(json.dumps(config.to_dict()))
    db_url = f"sqlite:///{tmp_path / 'trial.db'}"
    proc = cluster.autotune("trial", "--config", str(path), "--json", "--db", db_url)
    out, err = proc.communicate(timeout=400)
    assert proc.returncode == 0, err
    result = json.loads(out)
    node = {r["rank"]: r["node_id"] for r in result["ranks"]}
    assert sorted(node) == [0, 1, 2, 3] and all(r["hostname"] for r in result["ranks"])
    assert {r["tp_rank"] for r in result["ranks"]} == {0, 1}
    assert node[0] == node[1] != node[2] == node[3]  # TP pairs (0, 1) and (2, 3)
    assert set(node.values()) == set(cluster.nodes)
    assert result["losses"] == pytest.approx(_expected_losses(config), abs=LOSS_ATOL)
    with Database.open(db_url, create=False) as database:
        (stored,) = database.list_trials()
    assert {n.rank: n.node_id for n in stored.nodes} == node


def test_two_searches_share_the_cluster_and_one_postgres_database(cluster, postgres, tmp_path):
    """Two ``autotune search --ray-address`` drivers at once, each with two ranks on the
    four CPUs of the cluster, both writing a study of their own into one PostgreSQL database:
    both complete, and each study holds its own trials with their timelines and nodes, the
    reference's losses, and an Optuna study of as many finished trials."""
    db_url = postgres.create_schema("autotune_tests", "two_drivers")
    space = tmp_path / "space.json"
    space.write_text(json.dumps({"micro_batch_size": [1, 2, 4]}))
    fixed = [
        "tp_degree=1",
        "pp_degree=1",
        "zero_stage=0",
        "cp_degree=1",
        "dp_replicate=1",
        "num_warmup_steps=1",
        "num_profiled_steps=1",
        "device=cpu",
        "activation_checkpointing=none",
        "overlap_enabled=true",
        "bucket_mb=25",
    ]
    studies = ("alpha", "beta")
    procs = [
        cluster.autotune(
            "search",
            "--world-size",
            "2",
            "--seq-len",
            "32",
            "--global-batch",
            "8",
            "--space",
            str(space),
            *(a for f in fixed for a in ("--fix", f)),
            "--timed-steps",
            "2",
            "--trials",
            "2",
            "--remeasure",
            "0",
            "--top-k",
            "1",
            "--strategy",
            "random",
            "--seed",
            str(i),
            "--study",
            name,
            "--db",
            db_url,
            "--out",
            str(tmp_path / name),
        )
        for i, name in enumerate(studies)
    ]
    results = [p.communicate(timeout=400) for p in procs]
    for proc, (out, err) in zip(procs, results):
        assert proc.returncode == 0, err
        assert "Traceback" not in err and postgres.password not in out + err

    import optuna

    from autotune.search.search import _optuna_storage

    with Database.open(db_url, create=False) as database:
        storage = _optuna_storage(database)
        assert sorted(s.name for s in database.list_studies()) == list(studies)
        for name in studies:
            trials = database.list_trials(database.get_study(name).id)
            assert len(trials) == 2 and [t.status for t in trials] == ["complete"] * 2
            for trial in trials:
                config = TrialConfig.from_dict(trial.config)
                assert trial.metrics["losses"] == pytest.approx(
                    _expected_losses(config), abs=LOSS_ATOL
                )
                assert sorted(n.rank for n in trial.nodes) == [0, 1]
                assert {n.node_id for n in trial.nodes} <= set(cluster.nodes)
                spans = database.trial_spans(trial.id)
                assert {s.rank for s in spans} == {0, 1}
            optuna_study = optuna.load_study(study_name=f"autotune:{name}", storage=storage)
            assert len(optuna_study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))) == 2
            assert (tmp_path / name / "best_config.json").is_file()


def test_search_places_ranks_by_node_and_survives_losing_one(cluster, tmp_path):
    """One search, one worker group (its ranks are placed well for all the layouts it runs):
    dp4, tp2 × dp2 (each TP pair on one node, both nodes used), pp2 × dp2 (a stage per node),
    all with the single-process reference's losses; tp4 is refused before it runs, naming the
    node sizes, and the warm group stays. Once four trials are stored a node is killed while
    the fifth runs: that trial is stored failed, naming the node; every rank process of
    the trial dies; the next proposal finds 2 CPUs for 4 ranks and the search stops on that one
    line, exporting the best it measured."""
    db_url = f"sqlite:///{tmp_path / 'search.db'}"
    space = tmp_path / "space.json"
    space.write_text(
        json.dumps({"tp_degree": [1, 2, 4], "pp_degree": [1, 2], "micro_batch_size": [1, 2]})
    )
    fixed = [
        "zero_stage=0",
        "cp_degree=1",
        "dp_replicate=1",
        "sequence_parallel=false",
        "num_warmup_steps=1",
        "num_profiled_steps=0",
        "device=cpu",
        "activation_checkpointing=none",
        "overlap_enabled=true",
        "bucket_mb=25",
        "pp_schedule=1f1b",
    ]
    proc = cluster.autotune(
        "search",
        "--world-size",
        "4",
        "--seq-len",
        "32",
        "--global-batch",
        "8",
        "--space",
        str(space),
        *(a for f in fixed for a in ("--fix", f)),
        "--timed-steps",
        "2",
        "--trials",
        "6",
        "--remeasure",
        "0",
        "--top-k",
        "1",
        "--strategy",
        "random",
        "--seed",
        str(SEED),
        "--db",
        db_url,
        "--out",
        str(tmp_path),
    )
    try:
        stored = _wait_for_trials(db_url, 4, proc)
        workers = cluster.ask("workers")
        victim = workers[0]["node_id"]
        assert cluster.ask(f"kill {victim}") == "killed"
        failed = _wait_for_trials(db_url, 5, proc)[4]
        # The failed trial is stored after its worker group was torn down.
        assert _wait_dead([w["pid"] for w in workers], timeout=60) == []
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err

    layouts = [LAYOUTS[(t.config["tp_degree"], t.config["pp_degree"])] for t in stored]
    assert layouts == ["dp4", "tp2 x dp2", "tp4", "pp2 x dp2"]
    refused = stored.pop(2)
    assert refused.status == "failed" and refused.nodes == ()
    assert refused.error == (
        "not run: tp_degree 4 cannot sit inside one node: the Ray "
        "cluster's 2 node(s) hold 2 and 2 ranks (1 CPU per rank); use "
        "tp_degree ≤ 2 or nodes with more devices"
    )
    measured = stored
    # One worker group for all: the trials after the first ran on its processes.
    assert not any(t.metrics["cold_start"] for t in measured[1:])
    assert [t.status for t in measured] == ["complete"] * 3, [t.error for t in measured]
    for trial in measured:
        node = {n.rank: n.node_id for n in trial.nodes}
        assert sorted(node) == [0, 1, 2, 3] and all(n.hostname for n in trial.nodes)
        assert set(node.values()) == set(cluster.nodes)  # both nodes used
        config = TrialConfig.from_dict(trial.config)
        assert trial.metrics["losses"] == pytest.approx(_expected_losses(config), abs=LOSS_ATOL)
    tp2, pp2 = ({n.rank: n.node_id for n in t.nodes} for t in measured[1:])
    assert pp2[0] == pp2[1] != pp2[2] == pp2[3]  # stage 0 on one node, stage 1 on the other
    assert tp2[0] == tp2[1] != tp2[2] == tp2[3]  # TP pairs (0, 1) and (2, 3) on one node each

    assert LAYOUTS[(failed.config["tp_degree"], failed.config["pp_degree"])] == "tp2 x pp2"
    assert failed.status == "failed"
    assert f"Ray node {victim}" in failed.error and "lost mid-trial" in failed.error
    stopped = [ln for ln in out.splitlines() if ln.startswith("stopped:")]
    assert len(stopped) == 1 and "the Ray cluster cannot run more trials" in stopped[0]
    assert "needs 4 CPUs" in stopped[0] and "has 2" in stopped[0]
    assert (tmp_path / "best_config.json").is_file()
    assert "Traceback" not in err


def _wait_for_trials(db_url: str, count: int, proc: subprocess.Popen, timeout: float = 400):
    """The study's trials once ``count`` are stored (the driver writes them as they finish)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with Database.open(db_url, create=False) as database:
                studies = database.list_studies()
                trials = database.list_trials(studies[0].id) if studies else []
        except StorageError:  # not created yet
            trials = []
        if len(trials) >= count:
            return trials
        if proc.poll() is not None:
            raise AssertionError(f"the search exited early: {proc.communicate()}")
        time.sleep(0.3)
    raise AssertionError(f"fewer than {count} trials stored within {timeout:.0f}s")
