"""The runner's map of process-group names to mesh dimensions, on a real mesh of two gloo ranks
(NCCL's records carry ``ProcessGroup.group_name`` as "Process Group Name"; gloo writes no such
record, so only the map is checked here, against the groups DeviceMesh holds)."""

from __future__ import annotations

from spawn import run_ranks


def _names(rank: int, dp_replicate: int) -> tuple[dict, dict]:
    import torch.distributed as dist

    from autotune.config import TrialConfig
    from autotune.trial.parallel.mesh import build_mesh
    from autotune.trial.runner import mesh_group_names

    config = TrialConfig(world_size=2, zero_stage=2, dp_replicate=dp_replicate, device="cpu")
    mesh = build_mesh(config, "cpu")
    # dp 2 spans the world, so it is the default group; the dims of size 1 get their own.
    one = "dp_shard" if dp_replicate == 2 else "dp_replicate"
    expected = {dist.group.WORLD.group_name: "dp"}
    expected |= {mesh.mesh.get_group(dim).group_name: dim for dim in ("pp", one, "cp", "tp")}
    # The last size-1 groups are made by one rank alone, through rank 0's store: rank 0 must not
    # leave (and close the store) before the other rank has made them.
    dist.barrier()
    return mesh_group_names(mesh), expected


def test_each_mesh_dimension_is_named_by_its_process_group():
    for dp_replicate in (1, 2):  # dp is dp_shard's group, then dp_replicate's (HSDP 2 × 1)
        for names, expected in run_ranks(2, _names, dp_replicate):
            assert len(expected) == 5  # five distinct process groups
            assert names == expected
