"""The single-process reference: the same workload trained on one process, no parallelism.

Written independently of ``autotune/trial/parallel/precision.py``: mixed precision here is the
textbook recipe (Micikevicius et al. 2018) with torch's own AdamW on an fp32 master copy.
"""

from __future__ import annotations

import torch

from autotune.config import TrialConfig
from autotune.trial.models.build import build_workload
from autotune.trial.parallel.zero import LEARNING_RATE

HALF = {"bf16": torch.bfloat16, "16": torch.float16}
BF16_LOSS_ATOL = 5e-4
"""|Δloss| of a parallel mixed-precision run against the single-process reference in the same
precision, over 4 steps at losses ≈ 6.2 (8e-5 relative). Summation order and where bf16 rounds
differ between layouts: the right bf16-mixed layouts measured 2.2e-4 at the most (tp 2, and
tp 2 × dp 2 ZeRO-1, at step 2), the others ≤ 1.5e-4 (pp 2 × dp 2 ZeRO-1 7.7e-5, dp 4 ZeRO 0-3
≤ 9.1e-5); 16-mixed ≤ FP16_MEASURED. A skipped gradient sync in bf16-mixed (the
negative control, test_layouts.test_wrong_mixed_precision_layout_is_detected) measured
1.1e-2 over 4 steps at dp 2 and 5.7e-3 at pp 2 × dp 2, 11× to 22× the tolerance, which sits 2.3×
above the largest right layout. Within 2 steps the same bug moved the loss by only 1.9e-3 (dp 2)
and 4.0e-4 (pp 2 × dp 2, inside the tolerance): mixed-precision comparisons run 4 steps.

Not caught by a loss comparison: training without the fp32 master copy (AdamW on the bf16
parameters) moved the loss by ≤ 1.3e-4 over 4 steps, as little as a right layout; the byte
check (test_zero_sharding.test_missing_master_copy_is_detected) catches that one.
Measured with tests' layouts through ``spawn.run_ranks`` and ``runner.run_rank`` (the planted
bugs as in test_layouts), 4 steps each."""
MIXED_VS_FP32_LOSS_ATOL = 3e-3
"""|Δloss| of a mixed-precision run against the fp32 reference: bf16 rounds every matmul's
inputs (8 mantissa bits, 2⁻⁸ ≈ 4e-3 relative each), averaged over the batch's tokens
(observed ≤ 2e-4 over 4 steps)."""
LOSS_SCALE = 2.0**16
"""Constant loss scale of the 16-mixed reference (the runner's dynamic scale starts here)."""


def reference_losses(
    config: TrialConfig, num_steps: int, precision: str = "32-true"
) -> list[float]:
    """Losses of ``num_steps`` AdamW steps on the whole global batch in one process.

    32-true: fp32 throughout. *-true: the model and AdamW in half precision, under autocast.
    *-mixed: the model in half precision (from the fp32 initialisation, rounded), autocast,
    gradients copied to fp32 master parameters that torch's AdamW updates, the half model
    refreshed from them; 16-mixed scales the loss by ``LOSS_SCALE``.
    """
    workload = build_workload(config.workload, attention=config.attention, seed=config.seed)
    model = workload.model
    kind, _, mode = precision.partition("-")
    half = HALF.get(kind)
    if half is not None:
        model.to(half)
    params = list(model.parameters())
    masters = (
        [p.detach().float().clone().requires_grad_() for p in params] if mode == "mixed" else params
    )
    opt = torch.optim.AdamW(masters, lr=LEARNING_RATE, weight_decay=0.0)
    scale = LOSS_SCALE if precision == "16-mixed" else 1.0
    losses = []
    for step in range(num_steps):
        inputs, targets = workload.batch(step)
        with torch.autocast("cpu", dtype=half or torch.float32, enabled=half is not None):
            loss = workload.loss_fn(model(inputs), targets)
        (loss * scale).backward()
        if mode == "mixed":
            for master, p in zip(masters, params):
                master.grad = p.grad.float() / scale
            opt.step()
            with torch.no_grad():
                for master, p in zip(masters, params):
                    p.copy_(master)
            for p in params:
                p.grad = None
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses
