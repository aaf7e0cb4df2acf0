"""Joining a cluster by the address ``ray start`` prints: the driver turns on token
authentication when a token exists (as Ray does only for ``auto``), keeps a loopback address on
loopback, and leaves ``auto`` and an explicit ``RAY_AUTH_MODE`` alone. Checked in fresh
processes: both settings are process-wide. Then end to end: a cluster started by ``ray start``
(token authentication on) runs ``autotune trial`` joined at the address ``ray start`` printed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import json, os, sys
from autotune.trial.executor import _joinable
from ray._private import ray_constants
address = _joinable(sys.argv[1])
print(json.dumps({"address": address, "auth": os.environ.get("RAY_AUTH_MODE"),
                  "cluster_mode": ray_constants.ENABLE_RAY_CLUSTER}))
"""


def _probe(address: str, home: Path, **env: str) -> dict:
    environ = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "RAY_AUTH_MODE",
            "RAY_AUTH_TOKEN",
            "RAY_AUTH_TOKEN_PATH",
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER",
        )
    }
    environ.update(HOME=str(home), PYTHONPATH=str(ROOT), **env)
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, address],
        capture_output=True,
        text=True,
        env=environ,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def _trial(address: str, tmp_path: Path, env: dict) -> tuple:
    """``autotune trial --ray-address ADDRESS`` of a two-rank tiny GPT (one CPU per rank), as
    a user runs it: (its config, the finished process)."""
    from autotune.config import TrialConfig, WorkloadSpec

    config = TrialConfig(
        workload=WorkloadSpec(family="gpt", size="tiny", seq_len=32, global_batch_size=4),
        world_size=2,
        device="cpu",
        num_warmup_steps=1,
        num_timed_steps=1,
        num_profiled_steps=0,
    )
    path = tmp_path / "trial.json"
    path.write_text(json.dumps(config.to_dict()))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "autotune",
            "trial",
            "--config",
            str(path),
            "--json",
            "--db",
            f"sqlite:///{tmp_path / 'trial.db'}",
            "--ray-address",
            address,
            "--cpus-per-rank",
            "1",
            "--timeout",
            "240",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=400,
    )
    return config, proc


def _reference(config) -> list[float]:
    from reference import reference_losses

    steps = config.num_warmup_steps + config.num_timed_steps + 1  # and the memory step
    return reference_losses(config, steps)


@pytest.fixture
def home_with_token(tmp_path):
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("0" * 32)  # what `ray start` writes
    return tmp_path


def test_addresses_join_as_auto_does(home_with_token, tmp_path):
    loopback = _probe("127.0.0.1:6379", home_with_token)
    assert loopback == {"address": "127.0.0.1:6379", "auth": "token", "cluster_mode": False}
    routable = _probe("192.0.2.2:6379", home_with_token)
    assert routable == {"address": "192.0.2.2:6379", "auth": "token", "cluster_mode": True}
    # No token anywhere: nothing to turn on. An explicit mode is respected. auto: Ray's own.
    assert _probe("192.0.2.2:6379", tmp_path / "empty")["auth"] is None
    assert _probe("192.0.2.2:6379", home_with_token, RAY_AUTH_MODE="disabled")["auth"] == "disabled"
    assert _probe("auto", home_with_token) == {
        "address": "auto",
        "auth": None,
        "cluster_mode": True,
    }


def test_a_ray_start_cluster_is_joined_at_the_address_it_prints(tmp_path):
    """The way README documents, end to end: a token made by ``ray get-auth-token --generate``
    (under the HOME both commands run with), ``RAY_AUTH_MODE=token ray start --head
    --node-ip-address=127.0.0.1 --port=PORT`` (cluster mode off, so that nothing listens beyond
    loopback: then ``ray start`` prints its node address instead of a join command), then
    ``autotune trial --ray-address 127.0.0.1:PORT`` with neither setting in its environment:
    the driver finds the token and keeps the address on loopback, and a two-rank trial runs
    on that cluster with the single-process reference's losses."""
    import queue
    import re
    import signal
    import tempfile
    import threading
    import time

    from ports import free_port

    home = tmp_path / "home"
    home.mkdir()
    temp_dir = tempfile.mkdtemp(prefix="rs", dir="/tmp")  # Ray's socket paths must stay short
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "RAY_AUTH_MODE",
            "RAY_AUTH_TOKEN",
            "RAY_AUTH_TOKEN_PATH",
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER",
        )
    }
    env.update(HOME=str(home), PYTHONPATH=str(ROOT), RAY_USAGE_STATS_ENABLED="0")
    ray_cli = str(Path(sys.executable).parent / "ray")
    made = subprocess.run(
        [ray_cli, "get-auth-token", "--generate"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert made.returncode == 0, made.stderr
    assert (home / ".ray" / "auth_token").is_file()
    port = free_port()
    head = subprocess.Popen(
        [
            ray_cli,
            "start",
            "--head",
            "--block",
            "--node-ip-address=127.0.0.1",
            f"--port={port}",
            "--num-cpus=2",
            f"--temp-dir={temp_dir}",
            "--include-dashboard=false",
            "--disable-usage-stats",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # No drain on SIGTERM (Ray waits up to 30 s for the node to drain before stopping it,
        # ray/_private/node.py _drain_node_before_shutdown): this node serves no one after the
        # test, and its teardown took 33 s of the test's 40.
        env={
            **env,
            "RAY_AUTH_MODE": "token",
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
        },
        start_new_session=True,
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(ln) for ln in head.stdout], daemon=True).start()
    try:
        printed, node_ip = [], None
        deadline = time.monotonic() + 180
        while "Ray runtime started" not in "".join(printed):
            assert time.monotonic() < deadline and head.poll() is None, "".join(printed)
            try:
                printed.append(lines.get(timeout=1.0))
            except queue.Empty:
                continue
            found = re.search(r"Local node IP: (\S+)", printed[-1])
            node_ip = found.group(1) if found else node_ip
        assert node_ip == "127.0.0.1", "".join(printed)

        config, proc = _trial(f"{node_ip}:{port}", tmp_path, env)
        assert proc.returncode == 0, proc.stderr
        result = json.loads(proc.stdout)
        assert len({r["node_id"] for r in result["ranks"]}) == 1
        assert result["losses"] == pytest.approx(_reference(config), abs=2e-5)
    finally:
        # ray start --block stops its node on SIGTERM; anything of its session left is killed.
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(head.pid, sig)
                head.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass


def test_a_cluster_without_token_authentication_is_joined(home_with_token, tmp_path):
    """A two-raylet cluster with authentication off (``ray.cluster_utils.Cluster``'s default;
    ``tests/ray_cluster.py --no-auth``), joined by a driver whose HOME holds a token, as that
    of anyone who ever ran ``ray start`` does. Ray 2.60 would turn authentication on for the
    token, and the cluster's calls back into the driver, which carry none, were dropped: every
    rank's actor died at once ("the worker group could not start: a rank's worker died").
    The driver asks the cluster first: a two-rank trial runs there with the single-process
    reference's losses; ``RAY_AUTH_MODE=token`` set against that cluster is refused in one
    line that names what to unset."""
    import shutil
    import tempfile

    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "RAY_AUTH_MODE",
            "RAY_AUTH_TOKEN",
            "RAY_AUTH_TOKEN_PATH",
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER",
        )
    }
    env.update(
        PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]), RAY_USAGE_STATS_ENABLED="0"
    )
    temp_dir = tempfile.mkdtemp(prefix="rn", dir="/tmp")  # Ray's socket paths must stay short
    cluster = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "ray_cluster.py"), "1", "2", temp_dir, "--no-auth"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        address = json.loads(cluster.stdout.readline())["address"]
        env = {**env, "HOME": str(home_with_token)}
        config, proc = _trial(address, tmp_path, env)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["losses"] == pytest.approx(_reference(config), abs=2e-5)

        _, refused = _trial(address, tmp_path, {**env, "RAY_AUTH_MODE": "token"})
        assert refused.returncode == 1
        assert refused.stderr.strip().splitlines() == [
            f"autotune: error: the Ray cluster at '{address}' has no token authentication but "
            "RAY_AUTH_MODE=token is set; unset RAY_AUTH_MODE (or start the cluster with "
            "RAY_AUTH_MODE=token)"
        ]
    finally:
        cluster.stdin.close()
        try:
            cluster.wait(timeout=60)
        except subprocess.TimeoutExpired:
            cluster.kill()
        shutil.rmtree(temp_dir, ignore_errors=True)
