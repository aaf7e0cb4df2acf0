"""Apply every parallelism to a workload in the one order that composes.

0. **Precision** (``parallel/precision.py``) before everything: TP, replicate and FSDP build
   their DTensors and buckets from the parameters' dtype at rest.
1. **Pipeline split** first: each stage is the full model minus the other stages' layers, so
   the TP plan's module paths still resolve and each stage is parallelised on its own (as in
   torchtitan, which splits before ``parallelize``). Splitting after TP would deep-copy DTensors.
2. **Tensor parallelism** next: it rewrites Linear weights into DTensors on the tp dim, and the
   plan names the *unwrapped* module paths that checkpoint wrappers would hide. With
   sequence parallelism the workload's ``sp_plan`` replaces its ``tp_plan``.
   **Context parallelism** then hands each attention its cp group (``apply_cp``); gradients
   are averaged over dp × cp (``mesh.data_parallel_mesh``).
3. **Activation checkpointing** wraps whole blocks (or their attention core), around the TP
   modules, so recomputation replays the TP collectives too.
   **Compile** (``parallel/compile.py``) then compiles each block (the checkpoint wrapper) in
   place, before ZeRO wraps it, as torchtitan orders them. **Float8** (``parallel/float8.py``)
   converts the linears between the precision and TP steps, as torchtitan converts its model
   before parallelising.
4. **ZeRO / data parallelism** last: FSDP2 must see the final module tree (checkpoint wrappers
   included) to shard per block, and DDP must see the final parameters.
5. Pipeline stages and the schedule are built from the wrapped modules; the pipelining runtime
   recognises DDP/FSDP modules and delays gradient sync to the last microbatch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from autotune.config import TrialConfig
from autotune.errors import ConfigError
from autotune.trial.models.context_parallel import ContextParallel, apply_cp, supports_cp
from autotune.trial.models.workload import Workload
from autotune.trial.parallel.activation_checkpoint import apply_ac
from autotune.trial.parallel.compile import apply_compile, check_compile
from autotune.trial.parallel.expert import apply_ep, check_ep, moe_step
from autotune.trial.parallel.float8 import apply_float8
from autotune.trial.parallel.mesh import MeshCoords, TrialMesh, coords_of, data_parallel_mesh
from autotune.trial.parallel.pipeline_parallel import build_schedule, split_stages
from autotune.trial.parallel.precision import LossScaler, apply_precision
from autotune.trial.parallel.tensor_parallel import apply_tp
from autotune.trial.parallel.zero import DataParallelParts, apply_zero


@dataclass
class ParallelModel:
    """Everything a rank needs to run training steps of one trial."""

    config: TrialConfig
    mesh: TrialMesh
    coords: MeshCoords
    dp: DataParallelParts
    schedule: Any | None
    """A pipelining schedule when pp_degree > 1."""
    loss_scaler: LossScaler | None = None
    """The dynamic loss scale of 16-mixed, else None."""
    cp: ContextParallel | None = None
    """This rank's cp group when cp_degree > 1: the runner feeds it its tokens (``cp.shard``)."""
    moe_step: Callable[[], None] | None = None
    """A mixture of experts' work before each optimizer step (``expert.moe_step``), else None."""

    @property
    def parts(self) -> list[nn.Module]:
        return self.dp.parts

    @property
    def is_first_stage(self) -> bool:
        return self.coords.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.coords.pp_rank == self.config.pp_degree - 1


def check_workload_supports(config: TrialConfig, workload: Workload) -> None:
    """Refuse layouts the workload cannot run, before any collective is issued."""
    config.validate(num_heads=workload.num_heads, num_layers=workload.num_layers)
    check_compile(config)
    check_ep(config)
    if config.tp_degree > 1 and not workload.tp_plan:
        raise ConfigError(
            f"workload {config.workload.name} provides no tp_plan; "
            "use tp_degree 1 or add a tp_plan to its Workload"
        )
    if config.sequence_parallel and not workload.sp_plan:
        raise ConfigError(
            f"workload {config.workload.name} provides no sp_plan (sequence-"
            "parallel TP plan); turn sequence_parallel off or add an sp_plan "
            "to its Workload"
        )
    if config.cp_degree > 1 and not supports_cp(workload.model):
        raise ConfigError(
            f"workload {config.workload.name} has no context-parallel attention "
            "(no module with a cp attribute, models/context_parallel.py); use "
            "cp_degree 1"
        )
    if config.pp_degree > 1 and workload.pipeline_split is None:
        raise ConfigError(
            f"workload {config.workload.name} provides no pipeline_split; "
            "use pp_degree 1 or add a pipeline_split to its Workload"
        )


def parallelize(
    workload: Workload, config: TrialConfig, mesh: TrialMesh, device: torch.device
) -> ParallelModel:
    """``config.precision`` must be resolved (``TrialConfig.with_precision``)."""
    coords = coords_of(mesh)
    model = workload.model
    if config.pp_degree > 1:
        parts = split_stages(model, config, coords.pp_rank, workload.pipeline_split)
    else:
        parts = [model]
    parts = [apply_precision(p.to(device), config) for p in parts]
    if config.float8:  # checked at trial start (float8.check_float8)
        parts = [apply_float8(p) for p in parts]
    if config.tp_degree > 1 and config.sequence_parallel:
        parts = [apply_tp(p, mesh["tp"], workload.sp_plan, workload.blocks) for p in parts]
    elif config.tp_degree > 1:
        parts = [apply_tp(p, mesh["tp"], workload.tp_plan) for p in parts]
    cp = None
    if config.cp_degree > 1:
        cp = ContextParallel(
            mesh["cp"].get_group(), config.cp_degree, coords.cp_rank, config.workload.seq_len
        )
        for p in parts:
            apply_cp(p, cp)
    parts = [
        apply_ac(p, config.activation_checkpointing, workload.blocks, config.ac_layers)
        for p in parts
    ]
    if config.compile:
        parts = [apply_compile(p, workload.blocks) for p in parts]
    for p in parts:  # experts split over ep, left alone by data parallelism
        apply_ep(p, config)
    # dp × cp; under HSDP 2-D (dp_replicate, dp_shard × cp)
    dp = apply_zero(parts, config, data_parallel_mesh(mesh), workload.blocks, device)
    scaler = LossScaler() if config.precision == "16-mixed" else None
    schedule = None
    if config.pp_degree > 1:
        loss_fn = workload.loss_fn
        if scaler is not None:

            def loss_fn(output, target, _loss=workload.loss_fn):  # the scaled loss backpropagates
                return _loss(output, target) * scaler.scale

        schedule = build_schedule(dp.parts, config, coords.pp_rank, mesh["pp"], device, loss_fn)
    step = moe_step(dp.parts, config, mesh)
    return ParallelModel(config, mesh, coords, dp, schedule, scaler, cp, step)
