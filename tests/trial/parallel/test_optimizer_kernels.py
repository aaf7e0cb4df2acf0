"""Mixed precision's master-weight AdamW steps with multi-tensor ops (issue 23, defect 6).

ZeRO-0/1 (and dp = 1) train a half-precision model whose fp32 master copy lives in
``MasterWeightAdamW``; FSDP2 (ZeRO-2/3) steps torch's AdamW, foreach on CUDA. The master-weight
step used to be a Python loop of ~10 ops per parameter (on CUDA, that many kernel launches);
it now issues a fixed number of ``torch._foreach_*`` ops per chunk of parameters.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from autotune.trial.parallel import precision
from autotune.trial.parallel.precision import MasterWeightAdamW, step_chunks

METADATA_OPS = {
    "aten::view",
    "aten::split",
    "aten::split_with_sizes",
    "aten::as_strided",
    "aten::empty",
    "aten::detach",
    "aten::alias",
    "aten::unsqueeze",
    "aten::_local_scalar_dense",
    "aten::item",
    "aten::view_as",
}
"""Ops that launch no kernel (views, allocations, reading a CPU scalar)."""


def reference_step(params, state, lr, betas, eps, weight_decay):
    """The previous per-parameter loop (torch's single-tensor AdamW on the fp32 copy)."""
    beta1, beta2 = betas
    for p in params:
        s = state[p]
        master, m, v = s["master"], s["exp_avg"], s["exp_avg_sq"]
        grad = p.grad.float()
        s["step"] += 1
        step = s["step"].item()
        master.mul_(1 - lr * weight_decay)
        m.lerp_(grad, 1 - beta1)
        v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        denom = (v.sqrt() / math.sqrt(1 - beta2**step)).add_(eps)
        master.addcdiv_(m, denom, value=-lr / (1 - beta1**step))
        p.detach().copy_(master)


def _params(n: int, seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(16, 8), (8,), (3, 5, 7), (1,)]
    return [
        torch.nn.Parameter((torch.randn(shapes[i % 4], generator=g) * 0.02).to(torch.bfloat16))
        for i in range(n)
    ]


@pytest.mark.parametrize("chunk_limit", [2**24, 100])  # one pass; several passes
def test_foreach_step_equals_the_per_parameter_loop(monkeypatch, chunk_limit):
    monkeypatch.setattr(precision, "MASTER_STEP_CHUNK_NUMEL", chunk_limit)
    ours_params, ref_params = _params(9), _params(9)
    hyper = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    ours = MasterWeightAdamW(ours_params, **hyper)
    ref_state = {
        p: {
            "master": p.detach().float().clone(),
            "exp_avg": torch.zeros(p.shape),
            "exp_avg_sq": torch.zeros(p.shape),
            "step": torch.zeros(()),
        }
        for p in ref_params
    }
    g = torch.Generator().manual_seed(1)
    for step in range(4):
        for i, (a, b) in enumerate(zip(ours_params, ref_params)):
            grad = torch.randn(a.shape, generator=g).to(torch.bfloat16)
            # A parameter without a gradient is skipped, and its step count stays behind.
            a.grad = b.grad = None if (step == 1 and i % 3 == 0) else grad
        ours.step()
        reference_step([p for p in ref_params if p.grad is not None], ref_state, **hyper)
    for a, b in zip(ours_params, ref_params):
        for key in ("master", "exp_avg", "exp_avg_sq", "step"):
            torch.testing.assert_close(ours.state[a][key], ref_state[b][key], rtol=1.2e-7, atol=0)
        assert torch.equal(a.detach(), b.detach())


def _compute_ops(step, params) -> dict[str, int]:
    """aten ops (kernel launches on a GPU) one optimizer step issues, by name."""
    for p in params:
        p.grad = torch.ones_like(p)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    counts: dict[str, int] = {}
    for e in prof.events():
        # Only the outermost aten ops: on CPU a foreach op runs per-tensor ops inside itself
        # (torch's slow path); on CUDA it is one multi-tensor kernel per ~100 tensors.
        outer = e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")
        if outer and e.name.startswith("aten::") and e.name not in METADATA_OPS:
            counts[e.name] = counts.get(e.name, 0) + 1
    return counts


def test_step_issues_a_fixed_number_of_ops_whatever_the_parameter_count():
    counts = []
    for n in (4, 40):
        params = _params(n)
        optimizer = MasterWeightAdamW(params)
        counts.append(_compute_ops(optimizer.step, params))
    small, large = counts
    assert sum(small.values()) == sum(large.values()), (small, large)
    assert any(name.startswith("aten::_foreach_") for name in large)


def test_reference_loop_is_per_parameter():
    """The counter above tells the two apart: the old loop grows with the parameters."""
    totals = []
    for n in (4, 40):
        params = _params(n)
        state = {
            p: {
                "master": p.detach().float().clone(),
                "exp_avg": torch.zeros(p.shape),
                "exp_avg_sq": torch.zeros(p.shape),
                "step": torch.zeros(()),
            }
            for p in params
        }
        totals.append(
            sum(
                _compute_ops(
                    lambda p=params, s=state: reference_step(p, s, 1e-3, (0.9, 0.999), 1e-8, 0.0),
                    params,
                ).values()
            )
        )
    assert totals[1] >= 10 * totals[0] - 1


def test_chunks_cover_every_tensor_in_order_within_the_cap():
    numels = [5, 30, 7, 7, 100, 1, 2]
    for limit in (1, 10, 40, 1000):
        chunks = step_chunks(numels, limit)
        assert [i for c in chunks for i in c] == list(range(len(numels)))
        cap = max(limit, max(numels))
        assert all(sum(numels[i] for i in c) <= cap for c in chunks)
        # Greedy: no chunk could have taken the next tensor.
        for c, nxt in zip(chunks, chunks[1:]):
            assert sum(numels[i] for i in c) + numels[nxt[0]] > cap
    assert len(step_chunks(numels, 1000)) == 1
