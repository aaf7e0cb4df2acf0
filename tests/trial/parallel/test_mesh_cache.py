"""The per-process mesh cache: meshes reused by shape, old shapes' sub-groups destroyed.

On GPUs every sub-group holds NCCL communicators (device memory outside the caching allocator),
so a warm worker group that runs many layouts must not keep one mesh per shape for its whole
life. Four gloo ranks have six (pp, dp, tp) shapes, and HSDP's dp_replicate × dp_shard and cp add
more (HSDP 2 × 2, HSDP 2 × cp 2 and cp 2 × tp 2 run here), more than the cache keeps.
"""

from __future__ import annotations

import itertools

from spawn import run_ranks

WORLD = 4
# (pp, dp_replicate, dp_shard, cp, tp): every (pp, dp, tp) shape without HSDP or CP, HSDP 2 × 2,
# HSDP 2 × cp 2 (one rank per shard group: FSDP2 shards over cp) and cp 2 × tp 2.
SHAPES = [
    (pp, 1, dp, 1, tp)
    for pp, dp, tp in itertools.product([1, 2, 4], repeat=3)
    if pp * dp * tp == WORLD
] + [(1, 2, 2, 1, 1), (1, 2, 1, 2, 1), (1, 1, 1, 2, 2)]
DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp", "dp")
CYCLES = 3


def _config(shape, **kw):
    from autotune.config import TrialConfig

    pp, replicate, _, cp, tp = shape  # dp_shard is what the world leaves
    if replicate > 1:
        kw = {"zero_stage": 2, **kw}  # HSDP shards with FSDP2
    return TrialConfig(
        world_size=WORLD,
        pp_degree=pp,
        tp_degree=tp,
        cp_degree=cp,
        dp_replicate=replicate,
        device="cpu",
        **kw,
    )


def _groups_of(mesh) -> list:
    return [mesh.get_group(name) for name in DIMS]


def _doubled_on_tp(mesh):
    """A DTensor op on the tp dim, then a collective on the mesh its result carries."""
    import torch
    from torch.distributed.tensor import Shard, distribute_tensor

    x = torch.arange(8.0).reshape(4, 2)
    return (distribute_tensor(x, mesh["tp"], [Shard(0)]) * 2).full_tensor()


def _cycle(rank: int) -> dict:
    import torch
    import torch.distributed as dist

    from autotune.trial.parallel.mesh import MESH_CACHE_SIZE, build_mesh, cached_mesh_shapes

    registry = dist.distributed_c10d._world.pg_map  # every live group of this process
    out: dict = {
        "bound": MESH_CACHE_SIZE,
        "counts": [],
        "cached": [],
        "dim_sums": [],
        "doubled": [],
    }
    recent: list[tuple[int, ...]] = []
    for shape in SHAPES * CYCLES:
        mesh = build_mesh(_config(shape), "cpu")
        recent = ([s for s in recent if s != shape] + [shape])[-MESH_CACHE_SIZE:]
        out["counts"].append((len(registry), recent))
        out["cached"].append(cached_mesh_shapes())
        sums = []
        for group in _groups_of(mesh):  # every dim's group works: a sum of ones is its size
            t = torch.ones(1)
            dist.all_reduce(t, group=group)
            sums.append(int(t))
        out["dim_sums"].append((shape + (shape[1] * shape[2],), sums))
        out["doubled"].append(_doubled_on_tp(mesh).tolist())
    # Same shape, another layout of it: the very same mesh and groups.
    a = build_mesh(_config((1, 1, 2, 1, 2), zero_stage=1), "cpu")
    b = build_mesh(_config((1, 1, 2, 1, 2), zero_stage=2, micro_batch_size=2), "cpu")
    out["same_shape_reused"] = a is b and all(x is y for x, y in zip(_groups_of(a), _groups_of(b)))
    # Another shape: new sub-groups (only the world group is shared).
    c = build_mesh(_config((2, 1, 1, 1, 2)), "cpu")
    out["other_shape_new"] = all(
        (x is y) == (x is dist.group.WORLD) for x, y in zip(_groups_of(a), _groups_of(c))
    )
    return out


def _live_groups(recent: list[tuple[int, ...]]) -> int:
    """The world group, plus one sub-group of this rank per dim of each cached shape that does
    not span every rank (a dim that does is the world group), and the flattened dp's where
    both DP dims exceed 1 and it does not span every rank. (No shape here flattens dp_shard × cp:
    with dp_shard or cp 1 that is the other dim's group.)"""
    return 1 + sum(
        sum(size != WORLD for size in shape)
        + (min(shape[1:3]) > 1 and shape[1] * shape[2] != WORLD)
        for shape in recent
    )


def test_meshes_are_reused_by_shape_and_bounded():
    results = run_ranks(WORLD, _cycle, timeout=300.0)
    expected_doubled = [[2.0 * (2 * i + j) for j in range(2)] for i in range(4)]
    for r in results:
        assert 1 <= r["bound"] < len(SHAPES)  # else nothing would ever be destroyed
        for count, recent in r["counts"]:
            assert count == _live_groups(recent)
        assert r["cached"][-1] == [tuple(s) for s in SHAPES[-r["bound"] :]]
        assert max(count for count, _ in r["counts"]) <= 1 + 6 * r["bound"]
        for shape, sums in r["dim_sums"]:
            assert sums == list(shape)
        # A shape destroyed and built again still runs DTensor ops (no stale cached mesh).
        assert all(d == expected_doubled for d in r["doubled"])
        assert r["same_shape_reused"] and r["other_shape_new"]
