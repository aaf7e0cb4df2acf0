"""The runner's map of process-group names to mesh dimensions, on a real mesh of two gloo ranks
(NCCL's records carry ``ProcessGroup.group_name`` as "Process Group Name"; gloo writes no such
record, so only the map is checked here, against the groups DeviceMesh made)."""

from __future__ import annotations

from spawn import run_ranks


def _names(rank: int) -> tuple[dict, dict]:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from autotune.trial.parallel.mesh import MESH_DIM_NAMES
    from autotune.trial.runner import mesh_group_names

    # dp 2 spans the world, so DeviceMesh gives it the default group; pp, cp and tp get their
    # own.
    mesh = init_device_mesh("cpu", (1, 2, 1, 1), mesh_dim_names=MESH_DIM_NAMES)
    expected = {dist.group.WORLD.group_name: "dp", mesh.get_group("pp").group_name: "pp",
                mesh.get_group("cp").group_name: "cp", mesh.get_group("tp").group_name: "tp"}
    return mesh_group_names(mesh), expected


def test_each_mesh_dimension_is_named_by_its_process_group():
    for names, expected in run_ranks(2, _names):
        assert len(expected) == 4  # four distinct process groups
        assert names == expected
