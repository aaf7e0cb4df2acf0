"""The mixture-of-experts MLP of the built-in decoder (``autotune/moe.py``'s ``MoESpec``).

As torchtitan's ``torchtitan/models/common/moe.py`` (main at b5bcd76) routes: the router scores
every expert with a sigmoid in fp32 (DeepSeek-V3's score function, torchtitan's default), adds
the balancing bias to the scores for the *choice* of the top-k only, and gates each chosen
expert's output by its unbiased score, normalised over the k chosen. The bias is updated before
each optimizer step from the tokens each expert received in the step, by
``load_balance_coeff · sign(mean − count)`` centred to mean 0
(``torchtitan/components/optimizer/optimizer.py``, ``_update_expert_bias``); here
:func:`update_expert_bias`. An optional auxiliary loss (Switch Transformer's
``E · Σ_e f_e · P_e``) adds its gradient in backward without changing the loss reported.

The routed experts are one stacked weight each (``w1``, ``w3``: ``[E, f, h]``; ``w2``:
``[E, h, f]``) run over the tokens sorted by expert. ``torch._grouped_mm`` (torch 2.13) runs
forward on CPU only for 16-byte aligned strides and has no CPU backward ("Invalid
strides/sizes"), so the experts are a loop over the stacked weights, the same arithmetic.
Routing is dropless: every expert takes every token routed to it.

Under expert parallelism (``trial/parallel/expert.py``) a rank holds ``E / ep`` of the experts
(``GroupedExperts.first``: the global index of its first) and ``MoE.ep`` carries the tokens to
their experts' ranks and back.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from autotune.moe import MoESpec


class Router(nn.Module):
    """Top-k of the experts by sigmoid score plus the balancing bias."""

    def __init__(self, hidden: int, spec: MoESpec) -> None:
        super().__init__()
        self.top_k = spec.top_k
        self.gate = nn.Linear(hidden, spec.num_experts, bias=False)

    def forward(
        self, x: torch.Tensor, bias: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(gate weights [T, k], chosen experts [T, k], scores [T, E]) of tokens ``x`` [T, h]."""
        scores = torch.sigmoid(self.gate(x).float())
        choice = scores if bias is None else scores + bias
        _, experts = torch.topk(choice, self.top_k, dim=-1)
        weights = scores.gather(-1, experts)
        weights = weights / weights.sum(-1, keepdim=True)
        return weights.to(x.dtype), experts, scores


class GroupedExperts(nn.Module):
    """``num`` SwiGLU experts as stacked weights; this rank's are ``first`` … ``first + num``."""

    def __init__(self, hidden: int, ffn: int, num: int) -> None:
        super().__init__()
        self.first = 0
        self.w1 = nn.Parameter(torch.empty(num, ffn, hidden))
        self.w2 = nn.Parameter(torch.empty(num, hidden, ffn))
        self.w3 = nn.Parameter(torch.empty(num, ffn, hidden))

    @property
    def num_local(self) -> int:
        return self.w1.shape[0]

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """Tokens ``x`` sorted by local expert, ``counts[e]`` of them for local expert ``e``."""
        outs = []
        for e, chunk in enumerate(torch.split(x, counts)):
            h = F.silu(chunk @ self.w1[e].t()) * (chunk @ self.w3[e].t())
            outs.append(h @ self.w2[e].t())
        return torch.cat(outs) if outs else x[:0]


class SharedExperts(nn.Module):
    """The experts every token passes through, as one SwiGLU of their total width."""

    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(hidden, ffn, bias=False)
        self.w2 = nn.Linear(ffn, hidden, bias=False)
        self.w3 = nn.Linear(hidden, ffn, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class _AddAuxLoss(torch.autograd.Function):
    """Identity on ``out`` whose backward also backpropagates ``aux`` (gradient 1): the
    auxiliary loss trains the router without entering the loss the trial reports."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, aux: torch.Tensor) -> torch.Tensor:
        ctx.aux_shape = aux.shape
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, torch.ones(ctx.aux_shape, dtype=grad.dtype, device=grad.device)


class MoE(nn.Module):
    """Router, routed experts, shared experts; ``forward`` maps [b, s, h] to [b, s, h]."""

    def __init__(self, hidden: int, spec: MoESpec) -> None:
        super().__init__()
        self.spec = spec
        self.router = Router(hidden, spec)
        self.experts = GroupedExperts(hidden, spec.expert_ffn_size, spec.num_experts)
        self.shared_experts = (
            SharedExperts(hidden, spec.num_shared_experts * spec.expert_ffn_size)
            if spec.num_shared_experts
            else None
        )
        bias = torch.zeros(spec.num_experts) if spec.load_balance_coeff is not None else None
        self.register_buffer("expert_bias", bias, persistent=True)
        self.register_buffer("tokens_per_expert", torch.zeros(spec.num_experts), persistent=False)
        self.ep = None  # set by trial/parallel/expert.apply_ep

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        weights, experts, scores = self.router(tokens, self.expert_bias)
        flat = experts.reshape(-1)
        counts = torch.bincount(flat, minlength=self.spec.num_experts)
        with torch.no_grad():
            self.tokens_per_expert.add_(counts.to(self.tokens_per_expert.dtype))
        order = torch.argsort(flat, stable=True)  # (token, slot) pairs sorted by expert
        source = order // self.spec.top_k
        routed = tokens[source]
        if self.ep is None:
            out = self.experts(routed, counts.tolist())
        else:
            out = self.ep(routed, counts, self.experts)
        out = out * weights.reshape(-1, 1)[order]
        combined = torch.zeros_like(tokens).index_add(0, source, out)
        if self.shared_experts is not None:
            combined = combined + self.shared_experts(tokens)
        if self.spec.aux_loss_coeff > 0 and self.training:
            combined = _AddAuxLoss.apply(combined, self._aux_loss(scores, counts))
        return combined.view_as(x)

    def _aux_loss(self, scores: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Switch Transformer's balancing loss: coeff · E · Σ_e f_e · P_e, f_e the share of
        routed (token, slot) pairs expert e took, P_e its mean normalised score."""
        num = self.spec.num_experts
        share = counts.float() / counts.sum()
        probs = (scores / scores.sum(-1, keepdim=True)).mean(0)
        return self.spec.aux_loss_coeff * num * (share * probs).sum()


def moe_layers(model: nn.Module) -> list[MoE]:
    """The model's MoE modules, in module order."""
    return [m for m in model.modules() if isinstance(m, MoE)]


@torch.no_grad()
def update_expert_bias(moes: list[MoE], reduce=None) -> None:
    """Step each balancing bias towards the experts that took fewer tokens than the mean
    (torchtitan's ``_update_expert_bias``), then clear the counts. ``reduce(counts)`` sums the
    counts [layers, E] over the ranks that saw other tokens, in place."""
    moes = [m for m in moes if m.expert_bias is not None]
    if not moes:
        return
    counts = torch.stack([m.tokens_per_expert for m in moes])
    if reduce is not None:
        reduce(counts)
    for moe, count in zip(moes, counts, strict=True):
        delta = moe.spec.load_balance_coeff * torch.sign(count.mean() - count)
        moe.expert_bias.add_(delta - delta.mean())
        moe.tokens_per_expert.zero_()
