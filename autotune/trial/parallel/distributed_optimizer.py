"""ZeRO-1 for tensor-parallel (DTensor) parameters: Megatron-LM's distributed optimizer.

``ZeroRedundancyOptimizer`` assigns whole parameters to ranks and broadcasts them; it cannot hold
DTensors, so it serves neither tensor parallelism nor FSDP2's ``replicate`` (the data-parallel
wrapper of pipelines with overlap). This optimizer shards the optimizer state the way Megatron's
distributed optimizer does (Shoeybi et al. 2019; Megatron-LM ``DistributedOptimizer``, "Megatron
Core: distributed optimizer" docs): each rank works on its parameters' *local* tensors (a TP
rank's shard of a DTensor), groups them in order into buckets of about ``bucket_mb``, flattens
each bucket, pads it to a multiple of the data-parallel size N and owns one contiguous 1/N of
it. After the gradients are averaged over dp (by DDP/replicate hooks or the bucketed all-reduce,
as for ZeRO-0), each rank steps its inner optimizer on the slices it owns only, so it holds 1/N
of the optimizer state; one all-gather per bucket then gives every rank the updated parameters.

Traffic per step: the gradient all-reduce plus an all-gather of the (padded) local parameters,
in ``ceil(parameter bytes / bucket)`` collectives. Parameters and gradients stay whole.

The inner optimizer steps on the tensors in :attr:`DistributedOptimizer.owned`, which are views
into the parameters' storage, so its in-place update is the parameters' update. Under mixed
precision the inner optimizer is ``precision.MasterWeightAdamW``, which keeps the fp32 master
copy of these slices and writes each step back into them, rounded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's shard on this rank (TP's slice, or replicate's whole tensor); a plain tensor."""
    return t.to_local() if isinstance(t, DTensor) else t


@dataclass
class OwnedSlice:
    """The part ``[start, stop)`` of one parameter's flattened local tensor this rank owns."""

    param: nn.Parameter
    start: int
    stop: int
    tensor: torch.Tensor
    """A view of the parameter's storage: what the inner optimizer steps on."""
    offset: int
    """Where the slice starts in this rank's share of its bucket."""


@dataclass
class Bucket:
    """Consecutive parameters flattened together, split into N equal shares (the last padded)."""

    params: list[nn.Parameter]
    shard_numel: int
    owned: list[OwnedSlice]

    @property
    def numel(self) -> int:
        return sum(local_tensor(p).numel() for p in self.params)


@torch.no_grad()
def partition(params: list[nn.Parameter], world: int, rank: int, bucket_mb: float) -> list[Bucket]:
    """Buckets of consecutive parameters (same dtype, device) of at least ``bucket_mb`` (the
    last may be smaller), and the slices of each that ``rank`` of ``world`` owns."""
    groups: list[list[nn.Parameter]] = []
    size = 0
    limit = bucket_mb * 2**20
    for p in params:
        local = local_tensor(p)
        if not groups or size >= limit or _kind(local_tensor(groups[-1][-1])) != _kind(local):
            groups.append([])
            size = 0
        groups[-1].append(p)
        size += local.numel() * local.element_size()
    buckets = []
    for group in groups:
        total = sum(local_tensor(p).numel() for p in group)
        shard = -(-total // world)
        lo, hi = rank * shard, (rank + 1) * shard
        owned, start = [], 0
        for p in group:
            local = local_tensor(p).detach()
            if not local.is_contiguous():
                raise RuntimeError("the distributed optimizer needs contiguous local parameters")
            n = local.numel()
            a, b = max(lo, start), min(hi, start + n)
            if a < b:
                view = local.view(-1)[a - start : b - start]
                owned.append(OwnedSlice(p, a - start, b - start, view, a - lo))
            start += n
        buckets.append(Bucket(group, shard, owned))
    return buckets


def _kind(t: torch.Tensor) -> tuple[torch.dtype, torch.device]:
    return t.dtype, t.device


class DistributedOptimizer:
    """ZeRO-1 over ``group``: each rank steps the optimizer on its 1/N of every bucket, then the
    buckets are all-gathered. ``make_optimizer`` builds the inner optimizer from the tensors it
    steps on (the owned slices)."""

    def __init__(
        self,
        params: list[nn.Parameter],
        group: dist.ProcessGroup,
        bucket_mb: float,
        make_optimizer: Callable[[list[torch.Tensor]], torch.optim.Optimizer],
    ) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.group = group
        self.world = dist.get_world_size(group)
        self.buckets = partition(self.params, self.world, dist.get_rank(group), bucket_mb)
        self.owned = [s for b in self.buckets for s in b.owned]
        # A rank may own no slice (more ranks than elements); the optimizer still needs a tensor.
        first = local_tensor(self.params[0])
        self.optim = make_optimizer([s.tensor for s in self.owned] or [first.new_zeros(0)])

    @property
    def param_groups(self) -> list[dict]:
        return self.optim.param_groups

    @torch.no_grad()
    def step(self) -> None:
        for s in self.owned:
            g = s.param.grad
            s.tensor.grad = None if g is None else local_tensor(g).reshape(-1)[s.start : s.stop]
        self.optim.step()
        for bucket in self.buckets:
            self.gather(bucket)

    def gather(self, bucket: Bucket) -> None:
        """All-gather one bucket: every rank's share, in rank order, is the flat bucket."""
        first = local_tensor(bucket.params[0])
        share = torch.zeros(bucket.shard_numel, dtype=first.dtype, device=first.device)
        for s in bucket.owned:
            share[s.offset : s.offset + s.stop - s.start] = s.tensor
        flat = torch.empty(self.world * bucket.shard_numel, dtype=first.dtype, device=first.device)
        dist.all_gather_into_tensor(flat, share, group=self.group)
        offset = 0
        for p in bucket.params:
            local = local_tensor(p).detach()
            local.view(-1).copy_(flat[offset : offset + local.numel()])
            offset += local.numel()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for s in self.owned:
            s.tensor.grad = None
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()
