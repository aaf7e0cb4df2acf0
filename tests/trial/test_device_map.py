"""Which GPU each rank takes (``placement.device_map``, ``placement.visible_index``) and the Ray
actor options a GPU rank is started with (``executor.rank_actor_options``).

No GPU here: the map is pure and is checked on node layouts of 1, 2 and 8 GPUs per node against
hand-worked answers; the options are built from a fake cluster description shaped as Ray 2.60's
``ray.nodes()`` entries (``NodeID``, ``Alive``, ``Resources`` with float ``CPU``/``GPU``); and
Ray's own behaviour (no ``CUDA_VISIBLE_DEVICES`` set per actor under the env var, while
``ray.get_gpu_ids()`` still names the assigned GPU) is checked on a real Ray node that declares
two GPUs it does not have (Ray schedules declared GPUs without touching a device)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.errors import PlacementError
from autotune.trial.executor import ExecutorSettings, rank_actor_options
from autotune.trial.placement import (
    RankDevice,
    assign_groups,
    device_map,
    ranks_of,
    visible_index,
)

ROOT = Path(__file__).resolve().parents[2]


def _triples(devices: list[RankDevice]) -> list[tuple[str, int, int]]:
    return [(d.node_id, d.local_rank, d.device_index) for d in devices]


def test_one_gpu_per_node_every_rank_takes_device_0():
    devices = device_map(["n0", "n1", "n2"], {"n0": [0], "n1": [0], "n2": [0]})
    assert [d.rank for d in devices] == [0, 1, 2]
    assert _triples(devices) == [("n0", 0, 0), ("n1", 0, 0), ("n2", 0, 0)]


def test_two_gpus_per_node_in_rank_order_whatever_order_ray_lists_them():
    # Ray returns each actor's GPU in the order the actors report: n1's come back as 1, 0.
    devices = device_map(["n0", "n0", "n1", "n1"], {"n0": [0, 1], "n1": [1, 0]})
    assert _triples(devices) == [("n0", 0, 0), ("n0", 1, 1), ("n1", 0, 0), ("n1", 1, 1)]
    # A node's ranks need not be consecutive (pp stages alternating between nodes).
    devices = device_map(["n0", "n1", "n0", "n1"], {"n0": [1, 0], "n1": [0, 1]})
    assert _triples(devices) == [("n0", 0, 0), ("n1", 0, 0), ("n0", 1, 1), ("n1", 1, 1)]


def test_two_nodes_of_eight_gpus_keep_each_tp_group_on_consecutive_devices_of_one_node():
    """tp 4 × dp 2 × pp 2 = 16 ranks on 2 nodes × 8 GPUs, placed as the executor places them:
    four bundles of 4 GPUs, which Ray listed alternating between the nodes; each stage goes on
    one node (``assign_groups``). Rank r = 8·stage + 4·dp + tp lands on node ``stage``, local
    rank r mod 8, device r mod 8."""
    tp, dp, pp = 4, 2, 2
    bundle_nodes = ["n0", "n1", "n0", "n1"]
    groups = assign_groups(bundle_nodes, pp, dp)
    rank_nodes = ranks_of(groups, bundle_nodes, tp)
    devices = device_map(rank_nodes, {"n0": list(range(8)), "n1": list(range(8))[::-1]})
    assert _triples(devices) == [(f"n{r // 8}", r % 8, r % 8) for r in range(16)]
    for start in range(0, 16, tp):
        group = devices[start : start + tp]
        assert len({d.node_id for d in group}) == 1
        assert [d.device_index for d in group] == list(range(start % 8, start % 8 + tp))


def test_a_group_sharing_a_node_takes_the_gpus_ray_gave_it():
    """Concurrent trials (``TrialPool``) share an 8-GPU node: this group's two ranks were given
    GPUs 5 and 4, so they must not take 0 and 1 (another group's)."""
    devices = device_map(["n0", "n0"], {"n0": [5, 4]})
    assert _triples(devices) == [("n0", 0, 4), ("n0", 1, 5)]


def test_more_ranks_than_gpus_on_a_node_is_refused_naming_the_node():
    with pytest.raises(
        PlacementError,
        match=r"^Ray node n1 holds 3 ranks of this trial but "
        r"2 GPU\(s\) for them; give each rank one GPU",
    ):
        device_map(["n0", "n1", "n1", "n1"], {"n0": [0], "n1": [0, 1]})
    with pytest.raises(PlacementError, match="Ray node n2 holds 1 ranks of this trial but 0"):
        device_map(["n2"], {})


def test_visible_index_is_the_position_in_the_nodes_cuda_visible_devices():
    assert visible_index(3, None) == 3  # no list: Ray's ids are the device indices
    assert visible_index("3", "1,3") == 1  # a node started with CUDA_VISIBLE_DEVICES=1,3
    assert visible_index("GPU-b2", "GPU-a1, GPU-b2") == 1  # UUIDs, as nvidia-smi -L lists
    with pytest.raises(PlacementError, match="Ray assigned GPU 2 but CUDA_VISIBLE_DEVICES"):
        visible_index("2", "0,1")


def _nodes(num_nodes: int, cpus: float, gpus: float) -> list[dict]:
    """Entries shaped as Ray 2.60's ``ray.nodes()`` returns them (the keys the executor reads)."""
    return [
        {
            "NodeID": f"n{i}",
            "Alive": True,
            "NodeManagerHostname": f"host{i}",
            "NodeManagerAddress": f"10.0.0.{i}",
            "Resources": {"CPU": cpus, "GPU": gpus, "memory": 1e11},
        }
        for i in range(num_nodes)
    ]


def test_gpu_ranks_reserve_one_gpu_and_keep_every_gpu_of_the_node_visible():
    from ray._private.accelerators.nvidia_gpu import NOSET_CUDA_VISIBLE_DEVICES_ENV_VAR

    rank_nodes = [f"n{r // 8}" for r in range(16)]
    plan = rank_actor_options(rank_nodes, _nodes(2, 32.0, 8.0), True, ExecutorSettings())
    assert len(plan) == 16
    for options, threads in plan:
        assert options == {
            "num_cpus": 1.0,
            "num_gpus": 1,
            "runtime_env": {"env_vars": {NOSET_CUDA_VISIBLE_DEVICES_ENV_VAR: "1"}},
        }
        assert threads == 32 // 8
    # CPU ranks: nothing about GPUs; 2 groups side by side split a node's 32 cores 8 ways.
    plan = rank_actor_options(
        rank_nodes[:8],
        _nodes(1, 32.0, 0.0),
        False,
        ExecutorSettings(cpus_per_rank=0.5, concurrent_groups=2),
    )
    assert {json.dumps(o, sort_keys=True) for o, _ in plan} == {
        json.dumps({"num_cpus": 0.5, "num_gpus": 0}, sort_keys=True)
    }
    assert {t for _, t in plan} == {32 // (8 * 2)}


def test_concurrent_gpu_groups_split_the_node_cores_between_all_their_ranks():
    """``--parallel 4`` of world 2 on a node of 8 GPUs and 64 cores: 8 ranks share the cores,
    8 threads each, not the 32 a lone group's 2 ranks would take; more groups than the GPUs
    hold (8 × 2 = 16 ranks asked) still put only 8 ranks on the node."""
    nodes = _nodes(1, 64.0, 8.0)
    for groups, threads in ((1, 32), (4, 8), (8, 8)):
        plan = rank_actor_options(
            ["n0", "n0"], nodes, True, ExecutorSettings(concurrent_groups=groups)
        )
        assert [t for _, t in plan] == [threads, threads], groups


PROBE = """
import json, os, sys
import ray
from autotune.trial.executor import ExecutorSettings, RankWorker, rank_actor_options
ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False)
out = []
for noset in (True, False):
    options = [o for o, _ in rank_actor_options(["n", "n"], [], True, ExecutorSettings())]
    if not noset:
        options = [{k: v for k, v in o.items() if k != "runtime_env"} for o in options]
    workers = [RankWorker.options(**o).remote(sys.path, 1) for o in options]
    env = ray.get([w.__ray_call__.remote(lambda self: os.environ.get("CUDA_VISIBLE_DEVICES"))
                   for w in workers])
    out.append({"noset": noset, "cuda_visible_devices": env,
                "gpu_indices": ray.get([w.gpu_indices.remote() for w in workers])})
    for w in workers:
        ray.kill(w)
print(json.dumps(out))
"""


def test_ray_leaves_cuda_visible_devices_alone_and_still_names_the_assigned_gpu():
    """Ray 2.60 for real, on a node declaring 2 GPUs: two rank actors started with the
    executor's options see no ``CUDA_VISIBLE_DEVICES`` from Ray, and ``gpu_indices`` (from
    ``ray.get_gpu_ids()``) gives them GPUs 0 and 1; the same actors without the env var are
    masked to ``"0"`` and ``"1"``, each then seeing only its own GPU, as device 0 (what the
    old ``set_device(0)`` relied on)."""
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env.update(
        PYTHONPATH=str(ROOT), RAY_USAGE_STATS_ENABLED="0", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0"
    )
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    noset, masked = json.loads(proc.stdout.splitlines()[-1])
    assert noset["cuda_visible_devices"] == [None, None]
    assert sorted(i for held in noset["gpu_indices"] for i in held) == [0, 1]
    assert sorted(masked["cuda_visible_devices"]) == ["0", "1"]
