"""A real multi-node Ray cluster on loopback, run in its own process for the tests.

``python tests/ray_cluster.py NODES CPUS TEMP_DIR [--no-auth]`` starts a head node that holds
no CPU (the drivers attach to it, so no trial rank ever runs there and killing a worker node
never kills a driver) and NODES worker raylets of CPUS CPUs each, all on 127.0.0.1 with Ray's
cluster mode off, token authentication on (``RAY_AUTH_TOKEN`` from the environment; with
``--no-auth`` off, as ``ray.cluster_utils.Cluster`` has it by default) and health checks every
half second, so a killed node is declared dead within about two seconds. It prints one JSON
line ``{"address": ..., "nodes": [worker node ids]}`` and then answers commands on stdin, one
JSON line each:

- ``workers``: the alive rank actors, ``[{"node_id": ..., "pid": ...}, ...]``;
- ``kill NODE_ID``: kill every process of that worker node at once (SIGKILL), ``"killed"``;
- end of input: shut the cluster down.

In its own process because a driver process can join one Ray cluster only: the tests' drivers
are ``autotune`` CLI subprocesses, and the pytest process keeps its own local cluster.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    num_nodes, cpus, temp_dir = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ["RAY_AUTH_MODE"] = "disabled" if sys.argv[4:] == ["--no-auth"] else "token"
    from autotune.trial.executor import _keep_ray_on_loopback

    # Cluster mode off: nodes keep 127.0.0.1 instead of the host's routable address.
    _keep_ray_on_loopback()
    from ray.cluster_utils import Cluster

    common = {"node_ip_address": "127.0.0.1", "include_dashboard": False}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            **common,
            "num_cpus": 0,
            "temp_dir": temp_dir,
            "_system_config": {
                "health_check_period_ms": 500,
                "health_check_timeout_ms": 500,
                "health_check_failure_threshold": 3,
                "health_check_initial_delay_ms": 0,
            },
        },
    )
    nodes = {}
    for _ in range(num_nodes):
        node = cluster.add_node(num_cpus=cpus, **common)
        nodes[node.node_id] = node
    cluster.wait_for_nodes()
    _say({"address": cluster.address, "nodes": list(nodes)})
    try:
        for line in sys.stdin:
            command, _, arg = line.strip().partition(" ")
            if command == "workers":
                actors = cluster.global_state.actor_table(None).values()
                _say(
                    [
                        {"node_id": a["Address"]["NodeID"], "pid": a["Pid"]}
                        for a in actors
                        if a["ActorClassName"].endswith("RankWorker") and a["State"] == "ALIVE"
                    ]
                )
            elif command == "kill":
                cluster.remove_node(nodes.pop(arg), allow_graceful=False)
                _say("killed")
            else:
                _say(f"unknown command {command!r}")
    finally:
        cluster.shutdown()


def _say(value) -> None:
    print(json.dumps(value), flush=True)


if __name__ == "__main__":
    main()
