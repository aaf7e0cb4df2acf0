"""DDP's gradient buckets, counted by the runner's CPU memory measurement
(``runner._ddp_bucket_bytes``) against the bytes of the parameters they cover."""

from __future__ import annotations

import torch
from spawn import run_ranks
from torch import nn

from autotune.trial.runner import _ddp_bucket_bytes


def _bucket_bytes(rank: int) -> list[tuple[int, int]]:
    counted = []
    for dtype in (torch.float32, torch.bfloat16):
        model = nn.Sequential(nn.Linear(64, 64, bias=False), nn.Linear(64, 8)).to(dtype)
        model[0].weight.requires_grad_(False)  # frozen: DDP gives it no bucket
        ddp = nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True)
        counted.append((_ddp_bucket_bytes([ddp]), _ddp_bucket_bytes([model])))
    return counted


def test_buckets_hold_every_trainable_parameter_once():
    # Trainable: Linear(64, 8) = 64 × 8 weights + 8 biases = 520 elements, 4 bytes in fp32 and
    # 2 in bf16; the frozen 64 × 64 weight has no bucket, and an unwrapped module none at all.
    ((fp32, bf16),) = run_ranks(1, _bucket_bytes)
    assert fp32 == (520 * 4, 0)
    assert bf16 == (520 * 2, 0)
