"""Pipeline parallelism with ``torch.distributed.pipelining``.

Each rank holds one stage (GPipe, 1F1B) or ``config.virtual_stages`` virtual stages
(interleaved 1F1B, Narayanan et al. 2021 §2.2; ``ScheduleInterleaved1F1B`` given the rank's
stages): rank r holds stages r, r + pp, r + 2·pp, … of ``config.num_pp_stages``. Stages hold
the layer counts of ``shapes.stage_layer_counts``, uneven where the stages do not divide the
layers (each workload's ``pipeline_split`` applies it).
The number of pipeline microbatches is the gradient-accumulation count, so the global batch is
the same as without a pipeline. Schedules scale gradients by 1/microbatches (``scale_grads``),
so each micro-batch's loss is its plain mean.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)

from autotune.config import TrialConfig

SCHEDULES = {
    "gpipe": ScheduleGPipe,
    "1f1b": Schedule1F1B,
    "interleaved_1f1b": ScheduleInterleaved1F1B,
}


def local_stage_indices(config: TrialConfig, pp_rank: int) -> list[int]:
    return list(range(pp_rank, config.num_pp_stages, config.pp_degree))


def split_stages(
    model: nn.Module,
    config: TrialConfig,
    pp_rank: int,
    split: Callable[[nn.Module, int, int], nn.Module],
) -> list[nn.Module]:
    """This rank's stage modules, each a copy of the full model with other stages removed."""
    indices = local_stage_indices(config, pp_rank)
    return [
        split(copy.deepcopy(model) if i != indices[-1] else model, i, config.num_pp_stages)
        for i in indices
    ]


def build_schedule(
    parts: list[nn.Module],
    config: TrialConfig,
    pp_rank: int,
    pp_mesh: DeviceMesh,
    device: torch.device,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
):
    """Wrap the (already TP/AC/ZeRO-parallelised) stage modules into stages and a schedule."""
    group = pp_mesh.get_group()
    stages = [
        PipelineStage(part, index, config.num_pp_stages, device, group=group)
        for part, index in zip(parts, local_stage_indices(config, pp_rank))
    ]
    cls = SCHEDULES[config.pp_schedule]
    if config.pp_schedule == "interleaved_1f1b":
        return cls(stages, n_microbatches=config.grad_accum_steps, loss_fn=loss_fn)
    return cls(stages[0], n_microbatches=config.grad_accum_steps, loss_fn=loss_fn)
