"""HSDP and context parallelism together train the same model as one process.

HSDP 2 × cp 2 on 4 gloo ranks (dp 2 = 2 replica groups of one shard rank each; cp 2): FSDP2
shards over dp_shard × cp = the cp pair and replicates across dp_replicate, as torchtitan's
``dp_shard_cp`` rule has it (``mesh.data_parallel_mesh``). Every step's loss must equal the
single-process reference (``reference.py``) within ``test_layouts.LOSS_ATOL``, under ZeRO-3 and
ZeRO-2. The mesh that needs all three dims above 1 (dp_replicate 2 × dp_shard 2 × cp 2, 8 ranks)
is checked without training: its gradient mesh's groups are the ranks the layout implies.
"""

from __future__ import annotations

import dataclasses

import pytest
from reference import reference_losses
from spawn import run_ranks
from test_layouts import LOSS_ATOL

from autotune.config import TrialConfig

BASE = TrialConfig(
    world_size=4,
    dp_replicate=2,
    cp_degree=2,
    num_warmup_steps=0,
    num_timed_steps=2,
    num_profiled_steps=0,
    device="cpu",
)
NUM_STEPS = 3  # 2 timed + the memory step
LAYOUTS = [
    dataclasses.replace(BASE, zero_stage=3, micro_batch_size=2),
    dataclasses.replace(BASE, zero_stage=2, micro_batch_size=1),
]  # 2 accumulation steps


def _run_all(rank: int, configs: list[TrialConfig]) -> list:
    from autotune.trial.runner import run_rank

    return [run_rank(c) for c in configs]


@pytest.mark.slow
def test_hsdp_with_cp_matches_single_process():
    ranks = run_ranks(4, _run_all, LAYOUTS, timeout=600.0)
    for i, config in enumerate(LAYOUTS):
        results = [r[i] for r in ranks]
        # Rank order (pp, dp_replicate, dp_shard, cp, tp): cp inner, dp_replicate outer.
        assert [(r.dp_rank, r.cp_rank) for r in results] == [(0, 0), (0, 1), (1, 0), (1, 1)]
        expected = reference_losses(config, NUM_STEPS)
        losses = results[0].losses
        assert len(losses) == NUM_STEPS
        assert max(abs(a - b) for a, b in zip(losses, expected)) <= LOSS_ATOL, (losses, expected)
        assert abs(losses[-1] - losses[0]) > 1e-3  # it trains


def _gradient_groups(rank: int) -> dict:
    """The gradient mesh of HSDP 2 × dp_shard 2 × cp 2, and each of its dims' group members
    (an all-gather of the ranks over it)."""
    import torch
    import torch.distributed as dist

    from autotune.trial.parallel.mesh import build_mesh, data_parallel_mesh

    config = TrialConfig(world_size=8, dp_replicate=2, cp_degree=2, zero_stage=3, device="cpu")
    grads = data_parallel_mesh(build_mesh(config, "cpu"))
    members = []
    for dim in range(grads.ndim):
        out = [torch.zeros(1) for _ in range(grads.size(dim))]
        dist.all_gather(out, torch.tensor([float(rank)]), group=grads.get_group(dim))
        members.append([int(t) for t in out])
    return {"names": grads.mesh_dim_names, "members": members}


@pytest.mark.slow
def test_hsdp_cp_gradient_mesh_replicates_across_groups_and_shards_over_dp_shard_cp():
    """Ranks r = 4 · replicate + 2 · shard + cp: a replica pair is 4 apart; a dp_shard × cp
    group is the 4 consecutive ranks of one replica group."""
    for rank, got in enumerate(run_ranks(8, _gradient_groups, timeout=300.0)):
        assert got["names"] == ("dp_replicate", "dp_shard_cp")
        replica, shard_cp = got["members"]
        assert replica == [rank % 4, rank % 4 + 4]
        assert shard_cp == list(range(rank // 4 * 4, rank // 4 * 4 + 4))
