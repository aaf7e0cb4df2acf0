"""The device mesh of a trial: dims (pp, dp, cp, tp), tp innermost so a TP group is consecutive
ranks (one node, the fastest links), cp next to it (its K/V all-gathers are the next heaviest
traffic), pp outermost (point-to-point traffic tolerates slow links). With cp > 1 the mesh also
has the flattened dim "dp_cp" (torchtitan's ``dp_shard_cp``): cp ranks hold the same
parameters, so their gradients are averaged over dp × cp (:func:`data_parallel_mesh`).

A warm worker group runs many layouts. Each mesh shape needs its own sub-groups, and on GPUs
each sub-group holds NCCL communicators (device buffers outside the caching allocator). So the
meshes of the last ``MESH_CACHE_SIZE`` shapes are kept for reuse and an older one's sub-groups are
destroyed, on every rank alike (each rank builds the same meshes in the same order).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from autotune.config import TrialConfig

MESH_DIM_NAMES = ("pp", "dp", "cp", "tp")
DP_CP = "dp_cp"
MESH_CACHE_SIZE = 3
"""Mesh shapes whose sub-groups stay alive in a process (the most recently used). A search
alternates among a few shapes; more would each hold communicators that no trial uses."""


@dataclass(frozen=True)
class MeshCoords:
    """This rank's coordinates in the trial's mesh."""

    pp_rank: int
    dp_rank: int
    tp_rank: int
    cp_rank: int = 0


@dataclass(frozen=True)
class _CachedMesh:
    mesh: DeviceMesh
    world: dist.ProcessGroup
    """The default group the mesh was built on."""
    owned: tuple[dist.ProcessGroup, ...]
    """The sub-groups this module created for the mesh (not the world group a dim spanning
    every rank reuses): the ones to destroy with it."""
    dp_cp: DeviceMesh | None = None
    """The flattened dp × cp mesh when cp > 1 (kept: torch deprecates slicing it from the root)."""


MeshKey = tuple[str, tuple[int, ...], tuple[str, ...]]
_MESHES: OrderedDict[MeshKey, _CachedMesh] = OrderedDict()


def build_mesh(config: TrialConfig, device_type: str) -> DeviceMesh:
    """The (pp, dp, cp, tp) mesh of this layout: the cached one of its shape, or a new one (which
    may destroy the least recently used shape's sub-groups). Collective: every rank calls it."""
    key = (device_type, (config.pp_degree, config.dp_degree, config.cp_degree, config.tp_degree),
           MESH_DIM_NAMES)
    if key in _MESHES:
        _MESHES.move_to_end(key)
        return _MESHES[key].mesh
    _forget_dead_meshes()
    while len(_MESHES) >= MESH_CACHE_SIZE:
        _destroy(_MESHES.popitem(last=False)[1], device_type)
    _MESHES[key] = _create(device_type, key[1], key[2])
    return _MESHES[key].mesh


def coords_of(mesh: DeviceMesh) -> MeshCoords:
    return MeshCoords(**{f"{name}_rank": mesh[name].get_local_rank() for name in MESH_DIM_NAMES})


def data_parallel_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The ranks that hold the same parameters and average gradients: dp, or dp × cp."""
    if mesh["cp"].size() == 1:
        return mesh["dp"]
    flat = [c.dp_cp for c in _MESHES.values() if c.mesh is mesh and c.dp_cp is not None]
    return flat[0] if flat else mesh[DP_CP]


def cached_mesh_shapes() -> list[tuple[int, ...]]:
    """The shapes whose meshes this process holds, least recently used first."""
    return [shape for _, shape, _ in _MESHES]


def _create(device_type: str, shape: tuple[int, ...], names: tuple[str, ...]) -> _CachedMesh:
    """A mesh over the world's ranks in row-major order (as ``init_device_mesh`` lays them out),
    from one process group per dim.

    The groups are made with ``new_group``, whose names come from a counter that only grows, so
    a new group never takes the name of a live one. (``init_device_mesh`` on a device-bound NCCL
    group uses ``split_group``, which names a group by a hash of its ranks and the number of live
    groups: once groups are destroyed, a new one can hash to the name of a live one.)"""
    world = dist.get_world_size()
    rank = dist.get_rank()
    ranks = torch.arange(world, dtype=torch.int).reshape(shape)
    groups: list[dist.ProcessGroup] = []
    owned: list[dist.ProcessGroup] = []
    for dim, size in enumerate(shape):
        if size == world:  # the dim spans every rank: the world group is its group
            groups.append(dist.group.WORLD)
            continue
        # Every rank takes part in creating every group of the dim, and keeps its own.
        mine = None
        for members in ranks.movedim(dim, -1).reshape(-1, size).tolist():
            group = dist.new_group(members, group_desc=f"mesh_{names[dim]}")
            if rank in members:
                mine = group
        groups.append(mine)
        owned.append(mine)
    mesh = DeviceMesh.from_group(groups, device_type, mesh=ranks, mesh_dim_names=names)
    flat = None
    if shape[names.index("cp")] > 1:
        flat = mesh["dp", "cp"]._flatten(DP_CP)  # FSDP2 with TP needs the same root mesh
        if flat.get_group() is not dist.group.WORLD:
            owned.append(flat.get_group())
    return _CachedMesh(mesh, dist.group.WORLD, tuple(owned), flat)


def _destroy(cached: _CachedMesh, device_type: str) -> None:
    """Destroy a mesh's own sub-groups (their NCCL communicators with them), and forget DTensor's
    sharding decisions, which hold meshes: an equal mesh built later would otherwise be handed
    the old one, whose groups no longer resolve. (Megatron-LM's ``destroy_model_parallel``
    clears the same caches when it destroys its groups.)"""
    live = dist.distributed_c10d._world.pg_map
    for group in cached.owned:
        if group in live:
            dist.destroy_process_group(group)
    _clear_sharding_caches()
    if device_type == "cuda":
        # The caches are per thread, and the backward of CUDA ops runs on the autograd engine's
        # thread for the device: a backward through _ClearInBackward clears that thread's too.
        x = torch.zeros((), device=torch.device("cuda", torch.cuda.current_device()),
                        requires_grad=True)
        _ClearInBackward.apply(x).backward()


def _forget_dead_meshes() -> None:
    """Drop meshes built on a default group that is gone (the process group was destroyed and
    made again, as tests do), without touching their groups."""
    for key in [k for k, c in _MESHES.items() if c.world is not dist.group.WORLD]:
        del _MESHES[key]


def _clear_sharding_caches() -> None:
    """Clear this thread's DTensor sharding-propagation caches (the Python LRU cache and the C++
    fast path's) with whichever helpers this torch has in ``torch.distributed.tensor.debug``:
    older releases have ``_clear_sharding_prop_cache`` (the Python cache); later ones
    ``_clear_python_sharding_prop_cache`` and ``_clear_fast_path_sharding_prop_cache``."""
    from torch.distributed.tensor import debug

    separate = [getattr(debug, name, None) for name in (
        "_clear_python_sharding_prop_cache", "_clear_fast_path_sharding_prop_cache")]
    for clear in [c for c in separate if c is not None] or [
            getattr(debug, "_clear_sharding_prop_cache", None)]:
        if clear is not None:
            clear()


class _ClearInBackward(torch.autograd.Function):
    """Identity whose backward clears the DTensor caches of the thread that runs it."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        _clear_sharding_caches()
        return grad
