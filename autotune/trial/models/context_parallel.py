"""Context parallelism: each rank of a cp group holds a part of every sequence.

Causal load balancing (Megatron-LM ``get_batch_on_this_cp_rank``; torch's
``_context_parallel/_load_balancer.py`` ``_HeadTailLoadBalancer``): the sequence is cut into
2·cp chunks and cp rank r holds chunks r and 2·cp − 1 − r, so every rank has as many
causal-attention pairs as the others. Attention all-gathers K and V over the cp group and masks
by the *global* positions of the local queries and the gathered keys (Llama 3, Dubey et al.
2024 §3.3.2: all-gather K/V, then attention on the local Q chunks); its backward
reduce-scatters dK and dV back to their owners. Positional embeddings (GPT's learned ones,
RoPE) take the same global positions.

torch's ``torch.distributed.tensor.experimental.context_parallel`` does not run here: its
dispatch (torch 2.13, ``_context_parallel/_attention.py``) handles only the CUDA SDPA kernels
(flash, efficient, cuDNN), not the CPU ``_scaled_dot_product_flash_attention_for_cpu`` nor an
eager attention. So trials run this all-gather attention on every device.

Gradients: cp ranks hold the same parameters, so gradients are averaged over dp × cp
(torchtitan's ``dp_shard_cp`` mesh; ``mesh.data_parallel_mesh``). Every rank's loss is the mean
over its tokens, the same count on every cp rank, so the average of the ranks' losses is the
global mean.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from profiler.capture import group_range

CP_ATTRIBUTE = "cp"
"""Modules that run context-parallel attention or positions declare this attribute (None
when off); :func:`apply_cp` sets it."""


def chunk_positions(seq_len: int, degree: int, rank: int) -> torch.Tensor:
    """Global positions of the tokens cp rank ``rank`` holds: chunks rank and 2·degree−1−rank
    of the 2·degree equal chunks (``TrialConfig.validate`` requires seq_len % 2·degree == 0)."""
    size = seq_len // (2 * degree)
    head = torch.arange(rank * size, (rank + 1) * size)
    tail_start = (2 * degree - 1 - rank) * size
    return torch.cat([head, torch.arange(tail_start, tail_start + size)])


@dataclass(frozen=True)
class ContextParallel:
    """One rank's view of its cp group for a trial's sequence length."""

    group: dist.ProcessGroup
    degree: int
    rank: int
    seq_len: int
    """The global sequence length."""

    def positions(self, device: torch.device) -> torch.Tensor:
        """Global positions of this rank's tokens (length seq_len / degree)."""
        return chunk_positions(self.seq_len, self.degree, self.rank).to(device)

    def gathered_positions(self, device: torch.device) -> torch.Tensor:
        """Global positions of the keys after :func:`gather_sequence`: rank 0's, rank 1's, …"""
        return torch.cat(
            [chunk_positions(self.seq_len, self.degree, r) for r in range(self.degree)]
        ).to(device)

    def shard(self, t: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This rank's tokens of a full-sequence tensor (inputs, targets)."""
        return t.index_select(dim, self.positions(t.device))


def causal_mask(
    cp: ContextParallel, device: torch.device, window: int | None = None
) -> torch.Tensor:
    """(local queries × gathered keys) boolean mask, True where attention is allowed: a query
    sees the keys at or before its global position, and with a sliding ``window`` only those
    less than ``window`` positions behind it (transformers' ``sliding_window_overlay``)."""
    keys, queries = cp.gathered_positions(device)[None, :], cp.positions(device)[:, None]
    allowed = keys <= queries
    if window is not None:
        allowed &= queries - keys < window
    return allowed


class _GatherSequence(torch.autograd.Function):
    """All-gather dim 2 (the sequence of a (batch, heads, seq, head_dim) tensor) over the cp
    group, in rank order; the backward reduce-scatters (sums) the gradient to its owners."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup, degree: int) -> torch.Tensor:
        ctx.group, ctx.degree = group, degree
        b, h, s, d = x.shape
        out = x.new_empty((degree * b, h, s, d))  # gloo wants the ranks' parts along dim 0
        with group_range("cp"):  # gloo's spans name no group, and FSDP launches the same op
            dist.all_gather_into_tensor(out, x.contiguous(), group=group)
        return out.view(degree, b, h, s, d).permute(1, 2, 0, 3, 4).reshape(b, h, degree * s, d)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        b, h, s_all, d = grad.shape
        s = s_all // ctx.degree
        # Each cp rank's part laid out contiguously, as reduce_scatter_tensor reads its input:
        # NCCL reads the buffer linearly whatever the strides. The reshape alone copies only
        # when it must: at micro-batch 1 it merges (cp, 1) into a strided view, which gloo
        # copes with and NCCL sums wrong, with no error (dK and dV of ≥ 2 heads mixed up).
        parts = (
            grad.reshape(b, h, ctx.degree, s, d)
            .permute(2, 0, 1, 3, 4)
            .reshape(ctx.degree * b, h, s, d)
            .contiguous()
        )
        out = grad.new_empty((b, h, s, d))
        with group_range("cp"):
            dist.reduce_scatter_tensor(out, parts, group=ctx.group)
        return out, None, None


def gather_sequence(x: torch.Tensor, cp: ContextParallel) -> torch.Tensor:
    """K or V of every cp rank, concatenated along the sequence in rank order."""
    return _GatherSequence.apply(x, cp.group, cp.degree)


def apply_cp(model: nn.Module, cp: ContextParallel) -> int:
    """Hand ``cp`` to every module that declares :data:`CP_ATTRIBUTE`; returns how many."""
    holders = [m for m in model.modules() if hasattr(m, CP_ATTRIBUTE)]
    for m in holders:
        setattr(m, CP_ATTRIBUTE, cp)
    return len(holders)


def supports_cp(model: nn.Module) -> bool:
    return any(hasattr(m, CP_ATTRIBUTE) for m in model.modules())
