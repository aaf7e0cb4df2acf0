"""The step-time model's data-parallel groups are the trials' own: the ranks that average
gradients (``mesh.data_parallel_mesh``), the FSDP2 shard group inside them and HSDP's replicas,
read from the trial mesh built on torch's fake backend (one process standing for one rank of
the world; it makes no connection) and compared with the groups ``perf_model`` times."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from autotune.config import TrialConfig
from autotune.model.perf_model import _groups, replica_group, shard_group

WORLD = 16
RANK = 5
PER_NODE = 4
# (pp, dp_replicate, cp, tp): the world leaves dp_shard.
LAYOUTS = [
    (1, 1, 2, 1),  # CP beside plain FSDP: 8 × 2 ranks average gradients
    (1, 1, 2, 2),  # CP × TP
    (1, 2, 2, 1),  # CP × HSDP
    (1, 4, 1, 1),  # HSDP
    (2, 2, 2, 1),  # a pipeline around CP × HSDP
    (1, 1, 16, 1),  # CP alone: dp 1, yet 16 ranks average gradients
]


@pytest.fixture
def fake_world():
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=RANK, world_size=WORLD)
    yield
    dist.destroy_process_group()


def _nodes(ranks: list[int]) -> int:
    return len({r // PER_NODE for r in ranks})


@pytest.mark.parametrize("degrees", LAYOUTS, ids=lambda d: "pp{}-rep{}-cp{}-tp{}".format(*d))
def test_time_model_syncs_over_the_trials_gradient_average_group(fake_world, degrees):
    from autotune.trial.parallel.mesh import build_mesh, data_parallel_mesh

    pp, replicate, cp, tp = degrees
    config = TrialConfig(
        world_size=WORLD,
        pp_degree=pp,
        dp_replicate=replicate,
        cp_degree=cp,
        tp_degree=tp,
        zero_stage=3,
        device="cpu",
    )
    grads = data_parallel_mesh(build_mesh(config, "cpu"))
    sync = _groups(config, PER_NODE)[1]
    members = grads.mesh.flatten().tolist()
    assert (sync.size, sync.nodes) == (len(members), _nodes(members))
    # The shard group: the inner dim of HSDP's 2-D mesh, the whole 1-D mesh otherwise.
    inner = grads.mesh.tolist()[0] if grads.ndim == 2 else members
    shards = shard_group(config, PER_NODE)
    assert (shards.size, shards.nodes) == (len(inner), _nodes(inner))
    if grads.ndim == 2:
        across = [row[0] for row in grads.mesh.tolist()]
        replicas = replica_group(config, PER_NODE)
        assert (replicas.size, replicas.nodes) == (len(across), _nodes(across))
