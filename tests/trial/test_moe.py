"""The tiny mixture of experts in one process: routing, the experts, the balancing bias and
the auxiliary loss, each against arithmetic written out here."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from autotune.config import WorkloadSpec
from autotune.errors import ConfigError
from autotune.moe import MOE_TINY, MoESpec
from autotune.trial.models.moe import MoE, update_expert_bias
from autotune.trial.models.workload import build_builtin

H = 32


def _moe(spec: MoESpec = MOE_TINY, seed: int = 0) -> MoE:
    torch.manual_seed(seed)
    moe = MoE(H, spec)
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0, 0.3)
    return moe


def _by_token(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """Each token alone: sigmoid scores, top-k of score + bias, the unbiased scores of those k
    normalised, each chosen expert's SwiGLU, plus the shared SwiGLU."""
    e = moe.experts
    out = []
    for t in x:
        scores = torch.sigmoid(moe.router.gate.weight @ t)
        chosen = torch.topk(scores + moe.expert_bias, moe.spec.top_k).indices
        gates = scores[chosen] / scores[chosen].sum()
        y = sum(
            g * (e.w2[i] @ (F.silu(e.w1[i] @ t) * (e.w3[i] @ t)))
            for g, i in zip(gates, chosen.tolist())
        )
        s = moe.shared_experts
        out.append(y + s.w2.weight @ (F.silu(s.w1.weight @ t) * (s.w3.weight @ t)))
    return torch.stack(out)


def test_the_block_computes_each_tokens_experts_and_the_bias_only_chooses():
    moe = _moe()
    x = torch.randn(2, 5, H)
    with torch.no_grad():
        moe.expert_bias.copy_(torch.linspace(-0.5, 0.5, 8))
        got = moe(x).reshape(-1, H)
    torch.testing.assert_close(got, _by_token(moe, x.reshape(-1, H)), atol=1e-5, rtol=1e-5)
    # every (token, slot) pair is counted once for the bias update
    assert moe.tokens_per_expert.sum().item() == 10 * MOE_TINY.top_k


def test_the_bias_steps_towards_the_less_used_experts_and_clears_the_counts():
    moe = _moe(MoESpec(num_experts=4, top_k=1, expert_ffn_size=8, load_balance_coeff=0.1))
    moe.tokens_per_expert.copy_(torch.tensor([5.0, 1.0, 1.0, 1.0]))  # mean 2
    update_expert_bias([moe])
    # sign(mean - count) = [-1, 1, 1, 1] · 0.1, centred: minus its mean 0.05
    torch.testing.assert_close(moe.expert_bias, torch.tensor([-0.15, 0.05, 0.05, 0.05]))
    assert moe.tokens_per_expert.sum().item() == 0


def test_the_aux_loss_trains_the_router_without_changing_the_output():
    spec = MoESpec(num_experts=4, top_k=2, expert_ffn_size=8)
    aux = MoESpec(num_experts=4, top_k=2, expert_ffn_size=8, aux_loss_coeff=0.5)
    x = torch.randn(6, H)
    plain, balanced = _moe(spec, seed=1), _moe(aux, seed=1)
    y0, y1 = plain(x), balanced(x)
    torch.testing.assert_close(y0, y1)
    y0.sum().backward()
    y1.sum().backward()
    gap = (balanced.router.gate.weight.grad - plain.router.gate.weight.grad).abs().max()
    assert gap > 1e-4
    torch.testing.assert_close(balanced.experts.w1.grad, plain.experts.w1.grad)


def test_moe_tiny_has_the_parameters_its_spec_implies():
    model = build_builtin(
        WorkloadSpec(family="moe", size="tiny", seq_len=8, global_batch_size=1), device="meta"
    ).model
    h, f, e, v, kv = 32, 32, 8, 512, 2 * 8
    attention = 2 * h * h + 2 * h * kv + 2 * h  # wq, wo, wk, wv, two norms
    dense = attention + 3 * h * 64
    moe = attention + h * e + 3 * e * h * f + 3 * h * f  # router, experts, one shared
    assert sum(p.numel() for p in model.parameters()) == dense + 3 * moe + 2 * v * h + h
    assert type(model.layers["0"].feed_forward).__name__ == "FeedForward"
    assert all(isinstance(model.layers[str(i)].feed_forward, MoE) for i in (1, 2, 3))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_experts": 0}, "num_experts must be a positive integer"),
        ({"top_k": 9}, "top_k 9 exceeds num_experts 8"),
        ({"capacity_factor": 0.0}, "capacity_factor must be > 0"),
        ({"first_dense_layers": -1}, "first_dense_layers must be an integer ≥ 0"),
    ],
)
def test_a_broken_spec_is_refused_in_one_line(kwargs, message):
    fields = {"num_experts": 8, "top_k": 2, "expert_ffn_size": 32} | kwargs
    with pytest.raises(ConfigError, match=message):
        MoESpec(**fields)
