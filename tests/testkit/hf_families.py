"""Tiny configs of the Hugging Face causal-LM families autotune names, for tests (never
downloaded): each family's own defaults (``AutoConfig.for_model``) with its sizes cut down, so
what makes the family what it is stays: tied embeddings where it ties, QK norms, ``head_dim``
other than hidden / heads, sliding-window layers, soft-capping, ``query_pre_attn_scalar``,
Granite's multipliers, SmolLM3's layers without rotary embeddings.

``tiny_config(model_type)`` gives the config; ``write_tiny(model_type, folder)`` saves its
``config.json`` for ``--model hf:FOLDER``. Dropout is off so that ranks and a one-process
reference draw no random masks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

NAMED = ("qwen3", "gemma2", "gemma3_text", "phi3", "olmo2", "granite", "smollm3")
"""The families autotune names beside gpt2, llama, mistral and qwen2."""

SIZES = dict(
    vocab_size=128,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    bos_token_id=0,
    eos_token_id=0,
    pad_token_id=0,
    attention_dropout=0.0,
)
"""Cut-down sizes every family takes (4 query heads over 2 key/value heads)."""

FAMILY = {
    # Qwen3: QK norms, head_dim 16 ≠ 32 / 4.
    "qwen3": dict(head_dim=16),
    # Gemma 2: alternating sliding (window 8 < the tests' seq 16) and full layers, attention and
    # final logit soft-capping, query_pre_attn_scalar ≠ head_dim, tied embeddings.
    "gemma2": dict(
        head_dim=16,
        query_pre_attn_scalar=24,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"] * 2,
    ),
    # Gemma 3: QK norms, sliding layers with their own rotary base, one full layer in four.
    "gemma3_text": dict(
        head_dim=16,
        query_pre_attn_scalar=24,
        sliding_window=8,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
    ),
    "phi3": dict(),  # fused qkv_proj and gate_up_proj
    "olmo2": dict(),  # QK norms over all heads, norms after attention and MLP
    # Granite: embedding, residual, attention and logit multipliers other than 1.
    "granite": dict(
        embedding_multiplier=2.0,
        residual_multiplier=0.5,
        attention_multiplier=0.25,
        logits_scaling=4.0,
    ),
    # SmolLM3: every fourth layer without rotary embeddings, tied embeddings.
    "smollm3": dict(no_rope_layers=[1, 1, 1, 0], layer_types=["full_attention"] * 4),
}


def tiny_config(model_type: str, **overrides: Any):
    """The family's default config with the tiny sizes and the family's features kept."""
    from transformers import AutoConfig

    kwargs = {**SIZES, **FAMILY.get(model_type, {}), **overrides}
    return AutoConfig.for_model(model_type, **kwargs)


def write_tiny(model_type: str, folder: Path, **overrides: Any) -> Path:
    """Save the tiny config's ``config.json`` in ``folder``; returns the folder."""
    tiny_config(model_type, **overrides).save_pretrained(folder)
    return folder
