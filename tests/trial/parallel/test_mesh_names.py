"""Mesh groups keep unique names and the trial's timeout, on 8 gloo ranks.

On a device-bound NCCL world, torch's ``DeviceMesh`` makes its groups with ``split_group``,
named by a hash of the group's ranks and the number of live groups
(``distributed_c10d._hash_ranks_to_str``): once a mesh's groups are destroyed, a new group of
the same ranks can hash to the name of a live one, and registering it fails ("A process group
is already registered"). Gloo takes no ``split_group``, so here torch's mesh code is made to name
its groups the same way (``new_group(use_local_synchronization=True)``: each rank makes only its
own group, named by that hash), and the sequence of shapes that collided on 8 ranks is built
through ``build_mesh``, as a warm worker group would run it.
"""

from __future__ import annotations

from datetime import timedelta

from mesh_layouts import layout
from ports import free_port
from spawn import run_ranks

WORLD = 8
TIMEOUT = timedelta(seconds=77)
# (pp, dp_replicate, dp_shard, cp, tp): with 3 shapes cached, the fourth destroys the first's.
SEQUENCE = [(1, 1, 2, 2, 2), (1, 1, 1, 4, 2), (1, 2, 2, 2, 1), (2, 1, 2, 2, 1)]


def _split_group_names():
    """Make torch's mesh code name its groups as ``split_group`` does."""
    import torch.distributed.device_mesh as device_mesh

    real = device_mesh.new_group

    def hashed(*args, **kwargs):
        return real(*args, **{**kwargs, "use_local_synchronization": True})

    device_mesh.new_group = hashed


def _sequence(rank: int, port: int) -> dict:
    import torch
    import torch.distributed as dist

    from autotune.trial.parallel.mesh import build_mesh

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD, timeout=TIMEOUT
    )
    _split_group_names()
    out: dict = {"error": None, "grad_sums": [], "timeouts": set()}
    try:
        for shape in SEQUENCE:
            mesh = build_mesh(layout(shape, WORLD), "cpu")
            t = torch.ones(1)
            dist.all_reduce(t, group=mesh.grads.get_group() if mesh.grads.ndim == 1 else None)
            out["grad_sums"].append(int(t))
    except Exception as e:  # noqa: BLE001 - reported to the test
        out["error"] = f"{type(e).__name__}: {e}"
    cpu = torch.device("cpu")
    for group in dist.distributed_c10d._world.pg_map:
        out["timeouts"].add(group._get_backend(cpu).options._timeout.total_seconds())
    return out


def test_the_mesh_sequence_keeps_unique_names_and_the_trial_timeout():
    results = run_ranks(WORLD, _sequence, free_port(), backend=None, timeout=300.0)
    for r in results:
        assert r["error"] is None, r["error"]
        # The gradient group of each shape (dp_shard × cp, or the whole world under HSDP's 2-D
        # mesh) works: a sum of ones is its size.
        assert r["grad_sums"] == [4, 4, WORLD, 4]
        # Every group of this rank, the world's and the meshes', has the trial's timeout.
        assert r["timeouts"] == {TIMEOUT.total_seconds()}
