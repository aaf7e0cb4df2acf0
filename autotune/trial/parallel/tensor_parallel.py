"""Tensor parallelism: torch's ``parallelize_module`` with the workload's plan on the tp dim."""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import parallelize_module


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh, plan: dict) -> nn.Module:
    """Shard the plan's submodules that exist in ``model`` (a pipeline stage holds only some)."""
    present = {}
    for path, style in plan.items():
        try:
            model.get_submodule(path)
        except AttributeError:
            continue
        present[path] = style
    return parallelize_module(model, tp_mesh, present)
