"""How many groups a mesh makes: on NCCL every ``new_group`` of a device-bound world is one
``ncclCommSplit`` over the whole world, size-1 groups included, so a mesh must not make one per
size-1 dim. Counted on torch's fake backend (one process standing for rank 3 of 8; it makes
no connection), with the mesh code told it runs on NCCL (``shares_own_group``) or on gloo.
"""

from __future__ import annotations

import pytest
import torch.distributed as dist
from mesh_layouts import layout

WORLD = 8
RANK = 3
# (pp, dp_replicate, dp_shard, cp, tp)
FIRST = (1, 1, 2, 2, 2)
SECOND = (1, 1, 1, 4, 2)


def _expected_calls(shape, shared: bool) -> int:
    """``new_group`` calls (each made by every rank) for a mesh of ``shape``, counted from the
    shape: every group of each dim short of the world (a size-1 dim none when ``shared``), the
    flattened dp_shard × cp's when both exceed 1, and HSDP's flattened dp's."""
    _, replicate, shard, cp, _ = shape
    calls = sum(WORLD // size for size in shape if size < WORLD and (size > 1 or not shared))
    if shard > 1 and cp > 1 and shard * cp < WORLD:
        calls += WORLD // (shard * cp)
    if replicate > 1 and shard > 1 and replicate * shard < WORLD:
        calls += WORLD // (replicate * shard)
    return calls


@pytest.fixture
def fake_world(monkeypatch):
    from torch.testing._internal.distributed.fake_pg import FakeStore

    calls: list[list[int]] = []
    real = dist.new_group

    def counting(ranks=None, *args, **kwargs):
        calls.append(list(ranks))
        return real(ranks, *args, **kwargs)

    monkeypatch.setattr(dist, "new_group", counting)
    dist.init_process_group("fake", store=FakeStore(), rank=RANK, world_size=WORLD)
    yield calls
    dist.destroy_process_group()


@pytest.mark.parametrize("nccl", [False, True])
def test_size_one_dims_make_no_groups_of_their_own_on_nccl(fake_world, monkeypatch, nccl):
    from autotune.trial.parallel import mesh as mesh_module

    monkeypatch.setattr(mesh_module, "shares_own_group", lambda: nccl)
    first = mesh_module.build_mesh(layout(FIRST, WORLD), "cpu")
    first_calls = len(fake_world)
    second = mesh_module.build_mesh(layout(SECOND, WORLD), "cpu")
    # Before: one group per size-1 dim and rank, 28 + 2 at world 8 for FIRST, 30 for SECOND.
    assert (first_calls, len(fake_world) - first_calls) == (
        _expected_calls(FIRST, nccl) + (WORLD if nccl else 0),  # the own groups, made once
        _expected_calls(SECOND, nccl),
    )
    own = [g for m, s in ((first, FIRST), (second, SECOND)) for g, n in _size_one(m, s)]
    assert all(dist.get_process_group_ranks(g) == [RANK] for g in own)
    # On NCCL every size-1 dim of every mesh is the one group of this rank alone.
    assert (len({id(g) for g in own}) == 1) == nccl
    # The flattened dp_shard × cp of FIRST: the ranks that share pp, dp_replicate and tp.
    expected = [r for r in range(WORLD) if r % 2 == RANK % 2]
    assert dist.get_process_group_ranks(first.grads.get_group()) == expected
    assert first.mesh["dp_shard_cp"].mesh.tolist() == expected


def _size_one(mesh, shape):
    from autotune.trial.parallel.mesh import MESH_DIM_NAMES

    return [(mesh.get_group(n), n) for n, size in zip(MESH_DIM_NAMES, shape) if size == 1]
