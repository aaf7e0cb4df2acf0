"""Joining a cluster by the address ``ray start`` prints: the driver turns on token
authentication when a token exists (as Ray does only for ``auto``), keeps a loopback address on
loopback, and leaves ``auto`` and an explicit ``RAY_AUTH_MODE`` alone. Checked in fresh
processes: both settings are process-wide. (A joined ``ray start`` cluster was checked by hand:
docs/architecture.md.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROBE = """
import json, os, sys
from autotune.executor import _joinable
from ray._private import ray_constants
address = _joinable(sys.argv[1])
print(json.dumps({"address": address, "auth": os.environ.get("RAY_AUTH_MODE"),
                  "cluster_mode": ray_constants.ENABLE_RAY_CLUSTER}))
"""


def _probe(address: str, home: Path, **env: str) -> dict:
    environ = {k: v for k, v in os.environ.items()
               if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH",
                            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")}
    environ.update(HOME=str(home), PYTHONPATH=str(ROOT), **env)
    proc = subprocess.run([sys.executable, "-c", PROBE, address], capture_output=True,
                          text=True, env=environ, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


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
    assert _probe("192.0.2.2:6379", home_with_token,
                  RAY_AUTH_MODE="disabled")["auth"] == "disabled"
    assert _probe("auto", home_with_token) == {"address": "auto", "auth": None,
                                               "cluster_mode": True}
