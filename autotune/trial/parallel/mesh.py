"""The device mesh of a trial: dims (pp, dp, tp), tp innermost so a TP group is consecutive ranks
(one node, the fastest links), pp outermost (point-to-point traffic tolerates slow links)."""

from __future__ import annotations

from dataclasses import dataclass

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from autotune.config import TrialConfig

MESH_DIM_NAMES = ("pp", "dp", "tp")


@dataclass(frozen=True)
class MeshCoords:
    """This rank's coordinates in the trial's mesh."""

    pp_rank: int
    dp_rank: int
    tp_rank: int


_MESHES: dict[tuple[str, int, int, int], DeviceMesh] = {}


def build_mesh(config: TrialConfig, device_type: str) -> DeviceMesh:
    """The mesh of this layout, created once per process and reused by later trials.

    Creating sub-groups per trial would leak them, and destroying them breaks DTensor's
    group-name lookups, so one mesh per (device, pp, dp, tp) lives as long as the process group.
    """
    key = (device_type, config.pp_degree, config.dp_degree, config.tp_degree)
    if key not in _MESHES:
        _MESHES[key] = init_device_mesh(device_type, key[1:], mesh_dim_names=MESH_DIM_NAMES)
    return _MESHES[key]


def coords_of(mesh: DeviceMesh) -> MeshCoords:
    return MeshCoords(*(mesh[name].get_local_rank() for name in MESH_DIM_NAMES))
