"""The device mesh of a trial: dims (pp, dp_replicate, dp_shard, cp, tp), as torchtitan's
``ParallelDims.build_mesh`` orders them (size-1 dims kept). tp is innermost so a TP group is
consecutive ranks (one node, the fastest links), cp next to it (its K/V all-gathers are the next
heaviest traffic), pp outermost (point-to-point traffic tolerates slow links). Data parallelism
is dp_replicate × dp_shard (HSDP, ``config.dp_shard`` ranks per shard group; dp_replicate is 1
without it): a shard group is consecutive data-parallel ranks, so FSDP2's reduce-scatter and
all-gather stay near and only the all-reduce of the shards crosses replica groups.

Two flattenings, as torchtitan's: ``mesh["dp"]`` (dp_replicate × dp_shard, replicate-major) is
what slices the batch (``dp_rank``); the ranks that hold the same parameters and average their
gradients are dp × cp, since cp ranks see other tokens of the same sequences
(:func:`data_parallel_mesh`): sharded over "dp_shard_cp" (dp_shard × cp, torchtitan's
``dp_shard_cp``), and under HSDP replicated across dp_replicate.

A warm worker group runs many layouts. Each mesh shape needs its own sub-groups, and on GPUs
each sub-group holds NCCL communicators (device buffers outside the caching allocator). So the
meshes of the last ``MESH_CACHE_SIZE`` shapes are kept for reuse and an older one's sub-groups are
destroyed, on every rank alike (each rank builds the same meshes in the same order).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed._mesh_layout import _MeshLayout
from torch.distributed.device_mesh import DeviceMesh

from autotune.config import TrialConfig
from profiler.clock import carries_cpu

MESH_DIM_NAMES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
DP_DIMS = ("dp_replicate", "dp_shard")
"""The dims whose flattening is ``dp``; FSDP2 given a 2-D (replicate, shard) mesh shards across
the inner dim and replicates across the outer (``fully_shard``'s docstring, torch 2.13)."""
SHARD_CP = "dp_shard_cp"
"""The flattened dp_shard × cp dim FSDP2 shards over (torchtitan's name)."""
COORD_DIMS = ("pp", "dp", "tp", "cp")
"""The dims ``MeshCoords`` names a rank by."""
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
class TrialMesh:
    """A trial's ``DeviceMesh``, its flattened ``dp`` dim and the mesh its gradients are
    averaged over: ``mesh[name]`` and ``mesh.get_group(name)`` answer for every dim of
    ``MESH_DIM_NAMES``, a tuple of them, and ``"dp"``.

    ``dp`` is one of the mesh's own dims when the other DP dim is 1 (a sub-mesh of the same root
    as tp's: FSDP2 and replicate need that to hold TP's DTensors); under HSDP it is a mesh of a
    group of its own (only the batch slice and DDP-less counts use it then: HSDP syncs on
    ``grads``). ``grads`` is dp × cp (:func:`data_parallel_mesh`)."""

    mesh: DeviceMesh
    dp: DeviceMesh
    grads: DeviceMesh
    """1-D: dp (cp 1) or dp_shard_cp; under HSDP 2-D (dp_replicate, dp_shard or dp_shard_cp)."""

    def __getitem__(self, names: str | tuple[str, ...]) -> DeviceMesh:
        return self.dp if names == "dp" else self.mesh[names]

    def get_group(self, name: str) -> dist.ProcessGroup:
        return self[name].get_group()


@dataclass(frozen=True)
class _CachedMesh:
    mesh: TrialMesh
    world: dist.ProcessGroup
    """The default group the mesh was built on."""
    owned: tuple[dist.ProcessGroup, ...]
    """The sub-groups this module created for the mesh (not the world group a dim spanning
    every rank reuses): the ones to destroy with it."""


MeshKey = tuple[str, tuple[int, ...], tuple[str, ...]]
_MESHES: OrderedDict[MeshKey, _CachedMesh] = OrderedDict()
_OWN_GROUPS: dict[dist.ProcessGroup, dist.ProcessGroup] = {}
"""The default group → this rank's group of one (``_own_group``)."""


def build_mesh(config: TrialConfig, device_type: str) -> TrialMesh:
    """The mesh of this layout: the cached one of its shape, or a new one (which may destroy the
    least recently used shape's sub-groups). Collective: every rank calls it."""
    shape = (
        config.pp_degree,
        config.dp_replicate,
        config.dp_shard,
        config.cp_degree,
        config.tp_degree,
    )
    key = (device_type, shape, MESH_DIM_NAMES)
    _forget_dead_meshes()
    if key in _MESHES:
        _MESHES.move_to_end(key)
        return _MESHES[key].mesh
    while len(_MESHES) >= MESH_CACHE_SIZE:
        _destroy(_MESHES.popitem(last=False)[1], device_type)
    _MESHES[key] = _create(device_type, key[1], key[2])
    return _MESHES[key].mesh


def coords_of(mesh: TrialMesh) -> MeshCoords:
    return MeshCoords(*(mesh[name].get_local_rank() for name in COORD_DIMS))


def data_parallel_mesh(mesh: TrialMesh) -> DeviceMesh:
    """The ranks that hold the same parameters and average gradients: dp × cp. What DDP, ZeRO-1
    and FSDP2 sync over; FSDP2 shards over its inner dim and, under HSDP, replicates across
    dp_replicate."""
    return mesh.grads


def cached_mesh_shapes() -> list[tuple[int, ...]]:
    """The shapes whose meshes this process holds, least recently used first."""
    return [shape for _, shape, _ in _MESHES]


def _create(device_type: str, shape: tuple[int, ...], names: tuple[str, ...]) -> _CachedMesh:
    """A mesh over the world's ranks in row-major order (as ``init_device_mesh`` lays them out),
    from one process group per dim, and its flattened dp dim.

    The groups are made with ``new_group``, whose names come from a counter that only grows, so
    a new group never takes the name of a live one. (``init_device_mesh`` on a device-bound NCCL
    group uses ``split_group``, which names a group by a hash of its ranks and the number of live
    groups: once groups are destroyed, a new one can hash to the name of a live one, and
    ``register_process_group`` refuses it: "A process group is already registered". Torch's
    ``_flatten`` makes its groups that way too, so none is flattened by it: dp_shard × cp, which
    FSDP2 needs beside TP, is a group made here attached as the flattened dim, ``_flat_mesh``.)
    Every group gets the world group's timeout (the trial's), not ``new_group``'s default (10
    minutes on NCCL, 30 on gloo)."""
    ranks = torch.arange(dist.get_world_size(), dtype=torch.int).reshape(shape)
    groups: list[dist.ProcessGroup] = []
    owned: list[dist.ProcessGroup] = []
    for dim in range(len(shape)):
        group, new = group_of_dim(ranks, dim, names[dim])
        groups.append(group)
        owned += [group] if new else []
    mesh = DeviceMesh.from_group(groups, device_type, mesh=ranks, mesh_dim_names=names)
    replicate, shard, cp = (shape[names.index(d)] for d in (*DP_DIMS, "cp"))
    if replicate == 1 or shard == 1:
        dp = mesh[DP_DIMS[1] if replicate == 1 else DP_DIMS[0]]
    else:
        first = names.index(DP_DIMS[0])
        flat = ranks.flatten(first, first + 1)  # replicate-major: dp_rank = r · shard + s
        group, new = group_of_dim(flat, first, "dp")
        owned += [group] if new else []
        dp = DeviceMesh.from_group(group, device_type, mesh_dim_names=("dp",))
    grads, flat = _gradient_mesh(mesh, ranks, dp, replicate, shard, cp)
    if flat is not None and flat.get_group() is not dist.group.WORLD:
        owned.append(flat.get_group())
    return _CachedMesh(TrialMesh(mesh, dp, grads), dist.group.WORLD, tuple(owned))


def _gradient_mesh(
    mesh: DeviceMesh, ranks: torch.Tensor, dp: DeviceMesh, replicate: int, shard: int, cp: int
) -> tuple[DeviceMesh, DeviceMesh | None]:
    """dp × cp as FSDP2 takes it (torchtitan's rule): the shard dim is dp_shard × cp
    (``SHARD_CP``, a flattened dim of the root, as ``_flatten`` makes one, so that it shares the
    root with tp's mesh, which FSDP2 needs to hold TP's DTensors), and under HSDP (replicate > 1)
    the replicate dim is outer. Without cp it is dp, or (dp_replicate, dp_shard) under HSDP.
    Also the flattened mesh when one was made (its group is the trial's to destroy), else
    None."""
    if cp == 1:
        return (mesh[DP_DIMS] if replicate > 1 else dp), None
    if shard == 1:  # dp_shard_cp is cp itself
        return (mesh["dp_replicate", "cp"] if replicate > 1 else mesh["cp"]), None
    first = MESH_DIM_NAMES.index("dp_shard")
    group, _ = group_of_dim(ranks.flatten(first, first + 1), first, SHARD_CP)
    flat = _flat_mesh(mesh["dp_shard", "cp"], SHARD_CP, group)
    if replicate == 1:
        return flat, flat
    return DeviceMesh._concatenate([mesh["dp_replicate"], flat]), flat


def _flat_mesh(sub: DeviceMesh, name: str, group: dist.ProcessGroup) -> DeviceMesh:
    """``sub._flatten(name)`` over ``group`` (this rank's group of the flattened ranks, made by
    ``group_of_dim``): the 1-D mesh torch's ``_create_flatten_mesh`` makes (the collapsed
    layout of ``sub`` over its root's rank map, known to the root by ``name``), with the group
    attached the way ``DeviceMesh.from_group`` attaches one instead of made by ``split_group``."""
    root = sub._get_root_mesh()
    flat = DeviceMesh(
        root.device_type,
        _layout=_MeshLayout([sub._layout.collapse()]),
        _rank_map=root._rank_map,
        mesh_dim_names=(name,),
        _root_mesh=root,
        _init_backend=False,
    )
    flat._dim_group_names = [group.group_name]
    root._pg_registry[group.group_name] = group
    root._flatten_mapping[name] = flat
    return flat


def group_timeout() -> timedelta | None:
    """The default group's timeout: the trial's (``init_process_group`` was given it), which
    every group made for a mesh gets too; None (``new_group``'s default) for a backend that
    keeps no options (torch's fake one)."""
    world = dist.group.WORLD
    device = world.bound_device_id or torch.device("cpu" if carries_cpu(world) else "cuda")
    return getattr(world._get_backend(device).options, "_timeout", None)


def group_of_dim(ranks: torch.Tensor, dim: int, name: str) -> tuple[dist.ProcessGroup, bool]:
    """This rank's group along ``dim`` of ``ranks``, and whether it was made for it (a dim that
    spans every rank is the world group; one of size 1 on NCCL the rank's own group, shared by
    every such dim and mesh: ``_own_group``). Collective: every rank takes part in creating
    every group of the dim, and keeps its own."""
    size = ranks.shape[dim]
    if size == ranks.numel():
        return dist.group.WORLD, False
    if size == 1 and shares_own_group():
        return _own_group(), False
    rank = dist.get_rank()
    mine = None
    for members in ranks.movedim(dim, -1).reshape(-1, size).tolist():
        group = dist.new_group(members, timeout=group_timeout(), group_desc=f"mesh_{name}")
        if rank in members:
            mine = group
    return mine, True


def shares_own_group() -> bool:
    """Whether dims of size 1 share the rank's own group instead of a group each: on NCCL,
    where every ``new_group`` of a device-bound world is an ``ncclCommSplit`` of the whole world
    (size-1 groups included, whose collectives are no-ops), so a layout at world 8 would make
    some 28 of them and one at world 64 hundreds, all inside the trial's timeout. A gloo group
    of one rank costs no connection, so gloo keeps one per dim."""
    return not carries_cpu(dist.group.WORLD)


def _own_group() -> dist.ProcessGroup:
    """This rank's group of one, made once per default group (one ``new_group`` per rank, every
    rank taking part) and never destroyed with a mesh."""
    world = dist.group.WORLD
    for stale in [w for w in _OWN_GROUPS if w is not world]:
        del _OWN_GROUPS[stale]
    if world not in _OWN_GROUPS:
        rank = dist.get_rank()
        for member in range(dist.get_world_size()):
            group = dist.new_group([member], timeout=group_timeout(), group_desc="mesh_own")
            if member == rank:
                _OWN_GROUPS[world] = group
    return _OWN_GROUPS[world]


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
        x = torch.zeros(
            (), device=torch.device("cuda", torch.cuda.current_device()), requires_grad=True
        )
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

    separate = [
        getattr(debug, name, None)
        for name in ("_clear_python_sharding_prop_cache", "_clear_fast_path_sharding_prop_cache")
    ]
    for clear in [c for c in separate if c is not None] or [
        getattr(debug, "_clear_sharding_prop_cache", None)
    ]:
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
