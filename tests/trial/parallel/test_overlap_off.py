"""Overlap off under FSDP2 is off for real (issue 23, defect 11).

FSDP2 issues each unit's all-gather on its own stream as soon as the host reaches it (implicit
prefetch, in forward and in backward) and reduce-scatters on another stream while the next
unit's backward computes; dropping the explicit prefetch alone left both. With overlap off,
``parallel/zero.py`` puts every FSDP2 collective on the compute stream of the root's shared
communication context, so the GPU runs them in program order. On a CPU streams are placeholders
(gloo blocks the caller), so what can be checked here is that the context's streams are the one
compute stream after real training steps — and that with overlap on they stay FSDP2's own.
"""

from __future__ import annotations

import torch
from spawn import run_ranks
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from autotune.config import TrialConfig
from autotune.trial.parallel.zero import FSDP_COMM_STREAMS, apply_zero


def _streams_after_steps(rank: int, overlap: bool) -> tuple[int, int]:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(3)])
    config = TrialConfig(
        world_size=2,
        zero_stage=3,
        precision="32-true",
        device="cpu",
        overlap_enabled=overlap,
        bucket_mb=1e-6,
    )  # one block per unit
    mesh = init_device_mesh("cpu", (2,))
    dp = apply_zero([model], config, mesh, lambda m: list(m.named_children()), torch.device("cpu"))
    for _ in range(2):
        dp.parts[0](torch.randn(4, 8)).sum().backward()
        dp.optimizer.step()
        dp.optimizer.zero_grad()
    ctx = fully_shard.state(dp.parts[0])._comm_ctx
    # Every unit shares the root's context (FSDPState._init_shared_state).
    units = [fully_shard.state(block)._comm_ctx for block in dp.parts[0]]
    assert all(c is ctx for c in units)
    return len({id(getattr(ctx, name)) for name in FSDP_COMM_STREAMS}), len(FSDP_COMM_STREAMS)


def test_overlap_off_puts_every_fsdp_collective_on_one_stream():
    (distinct, total), _ = run_ranks(2, _streams_after_steps, False)
    assert distinct == 1 < total


def test_overlap_on_keeps_fsdps_own_streams():
    (distinct, total), _ = run_ranks(2, _streams_after_steps, True)
    assert distinct == total
