"""The built-in decoder-only transformer (GPT-2 or Llama style), in one readable file.

Layers live in a ``ModuleDict`` keyed by their global index and the embedding, final norm and
output head may be ``None``: a pipeline stage is the same class with the parts of other stages
deleted (the torchtitan pattern), so every stage keeps the parameter names of the full model.
Attention reshapes with ``-1`` heads, so after column-wise tensor parallelism each rank runs its
local heads unchanged.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from autotune.shapes import ModelShape, stage_layer_range
from autotune.trial.models.context_parallel import ContextParallel, causal_mask, gather_sequence
from autotune.trial.models.moe import MoE


class Attention(nn.Module):
    def __init__(self, shape: ModelShape, attention: str) -> None:
        super().__init__()
        self.head_dim = shape.head_dim
        self.family = shape.family
        self.attention = attention
        self.selective_checkpoint_enabled = False  # set by apply_ac(mode="selective")
        kv_dim = shape.num_kv_heads * shape.head_dim
        self.wq = nn.Linear(shape.hidden_size, shape.hidden_size, bias=False)
        self.wk = nn.Linear(shape.hidden_size, kv_dim, bias=False)
        self.wv = nn.Linear(shape.hidden_size, kv_dim, bias=False)
        self.wo = nn.Linear(shape.hidden_size, shape.hidden_size, bias=False)
        self.num_heads_per_kv = shape.num_heads // shape.num_kv_heads
        self.cp: ContextParallel | None = None  # set by context_parallel.apply_cp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bsz, seq, _ = x.shape
        q = self.wq(x).view(bsz, seq, -1, self.head_dim)
        k = self.wk(x).view(bsz, seq, -1, self.head_dim)
        v = self.wv(x).view(bsz, seq, -1, self.head_dim)
        cp = self.cp
        if self.family == "llama":
            positions = cp.positions(x.device) if cp is not None else None
            q, k = rotary(q, positions), rotary(k, positions)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        mask = None
        if cp is not None:  # K/V of the whole sequence, before GQA repeats them
            k, v = gather_sequence(k, cp), gather_sequence(v, cp)
            mask = causal_mask(cp, x.device)
        if self.num_heads_per_kv > 1:  # grouped-query attention: share each KV head
            k = k.repeat_interleave(self.num_heads_per_kv, dim=1)
            v = v.repeat_interleave(self.num_heads_per_kv, dim=1)
        if self.selective_checkpoint_enabled:
            # Selective recomputation (Korthikanti et al. 2022, §4): only the attention core
            # (QKᵀ, softmax, ·V) is recomputed; its activations are the 5as²b term.
            out = checkpoint(self._core, q, k, v, mask, use_reentrant=False)
        else:
            out = self._core(q, k, v, mask)
        return self.wo(out.transpose(1, 2).reshape(bsz, seq, -1))

    def _core(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Causal attention; ``mask`` (True: attend), where given, replaces the square causal
        mask (context parallelism: local queries against the whole sequence's keys)."""
        if self.attention == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        if mask is None:
            seq = q.shape[-2]
            mask = torch.ones(seq, seq, dtype=torch.bool, device=q.device).tril()
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        scores = scores.masked_fill(~mask, float("-inf"))
        return torch.softmax(scores, dim=-1) @ v


def rotary(
    x: torch.Tensor, positions: torch.Tensor | None = None, base: float = 10000.0
) -> torch.Tensor:
    """Rotary position embedding (Su et al. 2021, "RoFormer", eq. 34), half-split layout, at
    ``positions`` (default 0, 1, …: context parallelism passes each token's global position)."""
    seq, dim = x.shape[1], x.shape[-1]
    inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, device=x.device, dtype=torch.float32) / dim)
    if positions is None:
        positions = torch.arange(seq, device=x.device)
    angles = torch.outer(positions.to(torch.float32), inv_freq)
    cos = angles.cos()[None, :, None, :].to(x.dtype)
    sin = angles.sin()[None, :, None, :].to(x.dtype)
    x1, x2 = x[..., : dim // 2], x[..., dim // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class FeedForward(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.family = shape.family
        self.w1 = nn.Linear(shape.hidden_size, shape.ffn_hidden_size, bias=False)
        self.w2 = nn.Linear(shape.ffn_hidden_size, shape.hidden_size, bias=False)
        # SwiGLU's gate (Shazeer 2020) for llama; GPT-2 uses a plain GELU MLP.
        self.w3 = (
            nn.Linear(shape.hidden_size, shape.ffn_hidden_size, bias=False)
            if shape.family == "llama"
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w3 is None:
            return self.w2(F.gelu(self.w1(x), approximate="tanh"))
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, shape: ModelShape, attention: str, layer: int = 0) -> None:
        super().__init__()
        norm = nn.LayerNorm if shape.family == "gpt" else nn.RMSNorm
        self.attention_norm = norm(shape.hidden_size)
        self.attention = Attention(shape, attention)
        self.ffn_norm = norm(shape.hidden_size)
        # A mixture of experts' MLP from its first MoE layer on (models/moe.py).
        moe = shape.moe is not None and shape.moe.is_moe_layer(layer)
        self.feed_forward = MoE(shape.hidden_size, shape.moe) if moe else FeedForward(shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    def __init__(self, shape: ModelShape, *, vocab_size: int, attention: str = "sdpa") -> None:
        super().__init__()
        self.shape = shape
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(vocab_size, shape.hidden_size)
        self.pos_embeddings: nn.Embedding | None = (
            nn.Embedding(shape.max_seq_len, shape.hidden_size) if shape.family == "gpt" else None
        )
        self.layers = nn.ModuleDict(
            {str(i): TransformerBlock(shape, attention, i) for i in range(shape.num_layers)}
        )
        norm = nn.LayerNorm if shape.family == "gpt" else nn.RMSNorm
        self.norm: nn.Module | None = norm(shape.hidden_size)
        self.output: nn.Linear | None = nn.Linear(shape.hidden_size, vocab_size, bias=False)
        self.cp: ContextParallel | None = None  # set by context_parallel.apply_cp
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        # GPT-2 initialisation (nanoGPT): N(0, 0.02), residual projections scaled by 1/√(2L).
        for name, p in self.named_parameters():
            if p.dim() == 1:
                continue  # norms keep their ones/zeros
            std = 0.02
            if name.endswith(("wo.weight", "w2.weight")):
                std = 0.02 / math.sqrt(2 * self.shape.num_layers)
            nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tok_embeddings is not None:
            h = self.tok_embeddings(x)
            if self.pos_embeddings is not None:
                positions = (
                    self.cp.positions(x.device)
                    if self.cp is not None
                    else torch.arange(x.shape[1], device=x.device)
                )
                h = h + self.pos_embeddings(positions)
        else:
            h = x
        for layer in self.layers.values():
            h = layer(h)
        if self.norm is not None:
            h = self.norm(h)
        if self.output is not None:
            h = self.output(h)
        return h


def split_for_pipeline(model: Transformer, stage_index: int, num_stages: int) -> Transformer:
    """Keep the layers of one pipeline stage (:func:`stage_layer_range`) and the embedding /
    head at the ends, in place."""
    keep = {str(i) for i in stage_layer_range(len(model.layers), stage_index, num_stages)}
    for key in list(model.layers.keys()):
        if key not in keep:
            del model.layers[key]
    if stage_index > 0:
        model.tok_embeddings = None
        model.pos_embeddings = None
    if stage_index < num_stages - 1:
        model.norm = None
        model.output = None
    return model
