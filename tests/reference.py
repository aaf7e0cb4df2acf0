"""The single-process reference: the same workload trained on one process, no parallelism."""

from __future__ import annotations

import torch

from autotune.config import TrialConfig
from autotune.models.workload import build_workload
from autotune.parallel.zero import LEARNING_RATE


def reference_losses(config: TrialConfig, num_steps: int) -> list[float]:
    """Losses of ``num_steps`` AdamW steps on the whole global batch in one process (fp32)."""
    workload = build_workload(config.workload, attention=config.attention, seed=config.seed)
    model = workload.model
    opt = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.0)
    losses = []
    for step in range(num_steps):
        inputs, targets = workload.batch(step)
        loss = workload.loss_fn(model(inputs), targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses
