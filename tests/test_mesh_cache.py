"""The per-process mesh cache: meshes reused by shape, old shapes' sub-groups destroyed.

On GPUs every sub-group holds NCCL communicators (device memory outside the caching allocator),
so a warm worker group that runs many layouts must not keep one mesh per shape for its whole
life. Four gloo ranks have six (pp, dp, tp) shapes, more than the cache keeps.
"""

from __future__ import annotations

import itertools

from spawn import run_ranks

WORLD = 4
SHAPES = [s for s in itertools.product([1, 2, 4], repeat=3) if s[0] * s[1] * s[2] == WORLD]
CYCLES = 3


def _config(shape, **kw):
    from autotune.config import TrialConfig

    pp, _, tp = shape  # dp is what the world leaves
    return TrialConfig(world_size=WORLD, pp_degree=pp, tp_degree=tp, device="cpu", **kw)


def _groups_of(mesh) -> list:
    return [mesh.get_group(name) for name in ("pp", "dp", "tp")]


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
    out: dict = {"bound": MESH_CACHE_SIZE, "counts": [], "cached": [], "dim_sums": [],
                 "doubled": []}
    recent: list[tuple[int, ...]] = []
    for shape in SHAPES * CYCLES:
        mesh = build_mesh(_config(shape), "cpu")
        recent = ([s for s in recent if s != _dims(shape)] + [_dims(shape)])[-MESH_CACHE_SIZE:]
        out["counts"].append((len(registry), recent))
        out["cached"].append(cached_mesh_shapes())
        sums = []
        for group in _groups_of(mesh):  # every dim's group works: a sum of ones is its size
            t = torch.ones(1)
            dist.all_reduce(t, group=group)
            sums.append(int(t))
        out["dim_sums"].append((shape, sums))
        out["doubled"].append(_doubled_on_tp(mesh).tolist())
    # Same shape, another layout of it: the very same mesh and groups.
    a = build_mesh(_config((1, 2, 2), zero_stage=1), "cpu")
    b = build_mesh(_config((1, 2, 2), zero_stage=2, micro_batch_size=2), "cpu")
    out["same_shape_reused"] = a is b and all(
        x is y for x, y in zip(_groups_of(a), _groups_of(b)))
    # Another shape: new sub-groups (only the world group is shared).
    c = build_mesh(_config((2, 1, 2)), "cpu")
    out["other_shape_new"] = all(
        (x is y) == (x is dist.group.WORLD) for x, y in zip(_groups_of(a), _groups_of(c)))
    return out


def _dims(shape: tuple[int, int, int]) -> tuple[int, ...]:
    """The mesh's (pp, dp, cp, tp) shape of a (pp, dp, tp) layout without context parallelism."""
    pp, dp, tp = shape
    return (pp, dp, 1, tp)


def _live_groups(recent: list[tuple[int, ...]]) -> int:
    """The world group, plus one sub-group of this rank per dim of each cached shape that does
    not span every rank (a dim that does is the world group)."""
    return 1 + sum(size != WORLD for shape in recent for size in shape)


def test_meshes_are_reused_by_shape_and_bounded():
    results = run_ranks(WORLD, _cycle, timeout=300.0)
    expected_doubled = [[2.0 * (2 * i + j) for j in range(2)] for i in range(4)]
    for r in results:
        assert 1 <= r["bound"] < len(SHAPES)  # else nothing would ever be destroyed
        for count, recent in r["counts"]:
            assert count == _live_groups(recent)
        assert r["cached"][-1] == [_dims(s) for s in SHAPES[-r["bound"]:]]
        assert max(count for count, _ in r["counts"]) <= 1 + 4 * r["bound"]
        for shape, sums in r["dim_sums"]:
            assert sums == list(shape)
        # A shape destroyed and built again still runs DTensor ops (no stale cached mesh).
        assert all(d == expected_doubled for d in r["doubled"])
        assert r["same_shape_reused"] and r["other_shape_new"]
