"""Data parallelism by ZeRO stage (Rajbhandari et al. 2020), with torch-native mechanisms.

| stage | mechanism                                      | sharded over dp              |
|-------|------------------------------------------------|------------------------------|
| 0     | DDP (``bucket_cap_mb``)                        | nothing                      |
| 1     | DDP + ``ZeroRedundancyOptimizer`` (DTensors:   | optimizer state              |
|       | ``DistributedOptimizer``)                      |                              |
| 2     | FSDP2 ``fully_shard(reshard_after_forward=     | + gradients (params gathered |
|       | False)``                                       | once per step)               |
| 3     | FSDP2 ``fully_shard(reshard_after_forward=     | + parameters (gathered per   |
|       | True)``                                        | use)                         |

``overlap_enabled=False`` for stages 0/1 replaces DDP's backward hooks with one bucketed
all-reduce after the last backward (:class:`BucketedAllReduce`); for stages 2/3 it drops the
explicit prefetch of the next block's all-gather and runs every FSDP2 collective on the compute
stream (:func:`serialize_collectives`). ``optimizer_offload_enabled`` (CUDA, stages 2/3, dp > 1:
``TrialConfig.validate``) is FSDP2's ``CPUOffloadPolicy``: sharded parameters, gradients and
AdamW's state in pinned host memory, the step on the CPU (:func:`resident` tells them apart).
``bucket_mb`` sets DDP's buckets, the all-reduce buckets, and for FSDP how many consecutive
blocks share one all-gather.
Gradients are averaged over dp × cp (cp ranks hold the same parameters); with dp × cp 1 there
is nothing to shard or synchronise and no wrapper is applied. A rank's own experts under expert
parallelism (``expert.local_params``) are left to ``expert.moe_step``, except under FSDP2, which
shards them over their expert-data ranks (``expert.shard_experts``).

HSDP (``dp_replicate`` > 1, stages 2/3 only: ``TrialConfig.validate``): ``fully_shard`` on the
2-D (dp_replicate, dp_shard × cp) mesh shards over the dp_shard × cp ranks of a replica group and
replicates across the groups. Each unit's gradients are reduce-scattered within its shard group,
then the shard all-reduced across replica groups (torch ``_fsdp_collectives.foreach_reduce``);
parameters, gradients and optimizer state are 1/(dp_shard × cp) per rank.

ZeRO-1 of DTensor parameters (TP's, or replicate's under a pipeline with overlap on) cannot use
``ZeroRedundancyOptimizer``; it is Megatron's distributed optimizer
(``distributed_optimizer.py``), behind the same gradient sync as stage 0.
Mixed precision (``parallel/precision.py``): FSDP2 gets a ``MixedPrecisionPolicy``; the other
paths train a half-precision model with fp32 master weights in the optimizer (under the
distributed optimizer, a master copy of the owned slices only).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._composable.replicate_with_fsdp import replicate
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, OffloadPolicy, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

from autotune.config import TrialConfig
from autotune.trial.parallel.distributed_optimizer import DistributedOptimizer, local_tensor
from autotune.trial.parallel.expert import local_params, shard_experts
from autotune.trial.parallel.precision import mp_policy, optimizer_class

LEARNING_RATE = 1e-3
"""Adam's learning rate in trials: large enough that losses move within a few steps."""


class BucketedAllReduce:
    """Average gradients over the dp group after backward, in buckets of ``bucket_mb``.

    The non-overlapped baseline for stages 0/1: all communication happens after the last
    backward, in flat buffers of at most ``bucket_mb`` MB (one all-reduce each).
    """

    def __init__(
        self, params: list[nn.Parameter], group: dist.ProcessGroup, bucket_mb: float
    ) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.group = group
        self.world = dist.get_world_size(group)
        self.bucket_bytes = int(bucket_mb * 2**20)

    def __call__(self) -> None:
        bucket: list[torch.Tensor] = []
        size = 0
        for p in self.params:
            if p.grad is None:
                continue
            g = local_tensor(p.grad)
            bucket.append(g)
            size += g.numel() * g.element_size()
            if size >= self.bucket_bytes:
                self._reduce(bucket)
                bucket, size = [], 0
        if bucket:
            self._reduce(bucket)

    def _reduce(self, grads: list[torch.Tensor]) -> None:
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.group)
        flat /= self.world
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()


@dataclass
class DataParallelParts:
    """Model parts after ZeRO wrapping, their optimizer and how to synchronise gradients."""

    parts: list[nn.Module]
    optimizer: torch.optim.Optimizer | DistributedOptimizer
    grad_sync: Callable[[], None] | None = None
    """Called after the last micro-batch's backward (non-overlapped stages 0/1), else None."""


def group_blocks(blocks: list[tuple[str, nn.Module]], bucket_mb: float) -> list[list[nn.Module]]:
    """Consecutive blocks grouped until their parameters reach ``bucket_mb`` (FSDP wrap units)."""
    groups: list[list[nn.Module]] = []
    current: list[nn.Module] = []
    size = 0
    limit = bucket_mb * 2**20
    for _, block in blocks:
        current.append(block)
        size += sum(local_tensor(p).numel() * p.element_size() for p in block.parameters())
        if size >= limit:
            groups.append(current)
            current, size = [], 0
    if current:
        groups.append(current)
    return groups


def apply_zero(
    parts: list[nn.Module],
    config: TrialConfig,
    dp_mesh: DeviceMesh,
    blocks: Callable[[nn.Module], list[tuple[str, nn.Module]]] | None,
    device: torch.device,
) -> DataParallelParts:
    """``dp_mesh``: the ranks that average gradients, dp × cp (``mesh.data_parallel_mesh``):
    1-D, or under HSDP the 2-D (dp_replicate, dp_shard[_cp]) one."""
    if dp_mesh.size() == 1:  # cp ranks average gradients too
        return DataParallelParts(parts, _adam([p for m in parts for p in m.parameters()], config))
    if config.zero_stage <= 1:
        return _apply_ddp(parts, config, dp_mesh, blocks, device)
    return _apply_fsdp(parts, config, dp_mesh, blocks)


def _adam(params: list[nn.Parameter], config: TrialConfig) -> torch.optim.Optimizer:
    return optimizer_class(config)(params, lr=LEARNING_RATE, weight_decay=0.0)


def _apply_ddp(
    parts: list[nn.Module],
    config: TrialConfig,
    dp_mesh: DeviceMesh,
    blocks: Callable[[nn.Module], list[tuple[str, nn.Module]]] | None,
    device: torch.device,
) -> DataParallelParts:
    dp_group = dp_mesh.get_group()
    grad_sync = None
    if not config.overlap_enabled:
        grad_sync = BucketedAllReduce(
            [p for m in parts for p in m.parameters() if p not in local_params(m)],
            dp_group,
            config.bucket_mb,
        )
    elif config.tp_degree == 1 and config.pp_degree == 1:
        # gradient_as_bucket_view: gradients live in DDP's buckets, so no second copy exists.
        parts = [
            DDP(
                m,
                process_group=dp_group,
                bucket_cap_mb=config.bucket_mb,
                gradient_as_bucket_view=True,
                device_ids=[device.index] if device.type == "cuda" else None,
            )
            for m in parts
        ]
    else:
        # DDP cannot hold TP's DTensor parameters, and its per-forward bookkeeping breaks
        # under pipeline schedules that run several forwards before their backwards (GPipe).
        # FSDP2's replicate is DDP built on FSDP's machinery: it composes with TP and the
        # pipelining runtime drives it like FSDP. Blocks grouped by bucket_mb are its buckets.
        for part in parts:
            for group in group_blocks(blocks(part) if blocks else [], config.bucket_mb):
                replicate(
                    group if len(group) > 1 else group[0],
                    mesh=dp_mesh,
                    ignored_params=local_params(part) or None,
                )
            replicate(part, mesh=dp_mesh, ignored_params=local_params(part) or None)
    # Parameters are collected only now: replicate swaps them for new objects.
    params = [p for m in parts for p in m.parameters()]
    optimizer: torch.optim.Optimizer | DistributedOptimizer
    if config.zero_stage == 1 and any(isinstance(p, DTensor) for p in params):
        # TP's DTensors, or replicate's: ZeroRedundancyOptimizer cannot hold them. The inner
        # optimizer (with its fp32 master copy under mixed precision) steps on the owned slices.
        optimizer = DistributedOptimizer(
            params, dp_group, config.bucket_mb, lambda owned: _adam(owned, config)
        )
    elif config.zero_stage == 1:
        optimizer = ZeroRedundancyOptimizer(
            params,
            optimizer_class=optimizer_class(config),
            process_group=dp_group,
            lr=LEARNING_RATE,
            weight_decay=0.0,
        )
    else:
        optimizer = _adam(params, config)
    return DataParallelParts(parts, optimizer, grad_sync)


def _apply_fsdp(
    parts: list[nn.Module],
    config: TrialConfig,
    dp_mesh: DeviceMesh,
    blocks: Callable[[nn.Module], list[tuple[str, nn.Module]]] | None,
) -> DataParallelParts:
    reshard = config.zero_stage == 3
    offload: OffloadPolicy = (
        CPUOffloadPolicy(pin_memory=True) if config.optimizer_offload_enabled else OffloadPolicy()
    )
    policy = mp_policy(config.precision)
    for part in parts:
        # experts first: their own units on the expert-data mesh, which the blocks' then skip
        shard_experts(
            part, config, reshard_after_forward=reshard, offload_policy=offload, mp_policy=policy
        )
        units: list[FSDPModule] = []
        for group in group_blocks(blocks(part) if blocks else [], config.bucket_mb):
            # Several blocks in one unit share one all-gather / reduce-scatter (the bucket).
            fully_shard(
                group if len(group) > 1 else group[0],
                mesh=dp_mesh,
                reshard_after_forward=reshard,
                offload_policy=offload,
                mp_policy=policy,
                ignored_params=local_params(part) or None,
            )
            units.append(group[0])  # type: ignore[arg-type]
        # The root holds what no block holds (embeddings, final norm, head).
        fully_shard(
            part,
            mesh=dp_mesh,
            reshard_after_forward=reshard,
            offload_policy=offload,
            mp_policy=policy,
            ignored_params=local_params(part) or None,
        )
        if not config.overlap_enabled:
            serialize_collectives(part)  # type: ignore[arg-type]
        elif len(units) > 1:
            for prev, nxt in zip(units, units[1:]):
                prev.set_modules_to_forward_prefetch([nxt])
                nxt.set_modules_to_backward_prefetch([prev])
    params = [p for m in parts for p in m.parameters()]
    return DataParallelParts(parts, _adam(params, config))


FSDP_COMM_STREAMS = (
    "all_gather_copy_in_stream",
    "all_gather_stream",
    "reduce_scatter_stream",
    "all_reduce_stream",
)
"""The side streams of FSDP2's communication context (torch
``distributed/fsdp/_fully_shard/_fsdp_param_group.py``, ``FSDPCommContext.lazy_init``; the
same four in torch 2.11 and 2.13)."""


def serialize_collectives(root: FSDPModule) -> None:
    """Overlap off for real under FSDP2: every all-gather, reduce-scatter and their copies run
    on the compute stream, in program order, so none overlaps compute.

    Dropping explicit prefetch is not enough: FSDP2 still issues each unit's all-gather on its
    own stream as soon as the host reaches it (implicit prefetch, forward and backward) and
    reduce-scatters on another while the next unit's backward computes, and torch has no
    public switch for either (2.11-2.13). The root's communication context, shared by all its
    units, is initialised now (as its first forward would) and its streams replaced by the
    current one. On CPU the streams are placeholders and gloo's collectives block the caller
    (``async_op=False``), so nothing overlapped there to begin with."""
    state = fully_shard.state(root)  # type: ignore[attr-defined]
    state._lazy_init()
    ctx = state._comm_ctx
    missing = [name for name in FSDP_COMM_STREAMS if not hasattr(ctx, name)]
    if missing:
        raise RuntimeError(
            f"this torch's FSDP2 has no {', '.join(missing)}: overlap off cannot "
            "serialise its collectives; use overlap_enabled true"
        )
    current = ctx.device_handle.current_stream()
    for name in FSDP_COMM_STREAMS:
        setattr(ctx, name, current)


def resident(tensors, device: torch.device):
    """The tensors (DTensors by their local shard) that live on ``device``'s type: under
    optimizer offload (``CPUOffloadPolicy``) FSDP2's sharded parameters, their gradients and
    AdamW's state are in host memory and are not device memory. For the runner's measurement."""
    for t in tensors:
        if isinstance(t, torch.Tensor) and local_tensor(t).device.type == device.type:
            yield t
