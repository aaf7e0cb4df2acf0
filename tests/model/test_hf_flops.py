"""Per block, the description's forward FLOPs (``perf_model.layer_forward_flops``) against
``torch.utils.flop_counter.FlopCounterMode`` on the tiny model of each named family.

The counter runs the model with eager attention, so it sees every matmul: the GEMMs (q, k, v, o
and the MLP's, fused or not, plus the output head) must match the description exactly, and the
attention's two batched matmuls (Q·Kᵀ, softmax·V) as eager runs them, the whole s × s square on
every layer. What the counter cannot see: a sliding window only masks that square, it computes
no fewer pairs under eager; the description counts the pairs a windowed kernel computes. That
part is checked against the mask itself: the pairs ``j ≤ i, i − j < w`` counted with torch."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from testkit.hf_families import NAMED, tiny_config, write_tiny  # noqa: E402

from autotune.hf_config import hf_shape  # noqa: E402
from autotune.model.description import attention_keys, attention_width  # noqa: E402
from autotune.model.perf_model import layer_forward_flops  # noqa: E402

B, S = 2, 16


def _counted(model_type: str) -> tuple[int, int]:
    """(GEMM FLOPs, attention-matmul FLOPs) the counter sees in one forward of the tiny model."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoModelForCausalLM

    config = tiny_config(model_type, attn_implementation="eager")
    model = AutoModelForCausalLM.from_config(config).eval()
    ids = torch.randint(0, config.vocab_size, (B, S))
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(input_ids=ids)
    ops = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    gemm = sum(n for op, n in ops.items() if op.split(".")[1] in ("mm", "addmm"))
    return gemm, ops.get("aten.bmm", 0)


@pytest.mark.parametrize("model_type", (*NAMED, "gpt2", "qwen2"))
def test_block_flops_against_torch(model_type, tmp_path):
    shape = hf_shape(str(write_tiny(model_type, tmp_path)))
    gemm, bmm = _counted(model_type)
    matmul, _ = layer_forward_flops(shape, seq_len=S, micro_batch=B)
    head = 2 * B * S * shape.hidden_size * shape.vocab_size
    assert gemm == shape.num_layers * matmul + head
    # Eager computes the whole square on every layer, windowed or not.
    assert bmm == shape.num_layers * 4 * B * S * S * attention_width(shape)


def _mask_pairs(window: int) -> int:
    import torch

    i = torch.arange(S)[:, None]
    j = torch.arange(S)[None, :]
    keep = (j <= i) & ((i - j) < window if window else True)
    return int(keep.sum())


@pytest.mark.parametrize("model_type", ("gemma2", "gemma3_text"))
def test_sliding_windows_score_the_masks_pairs(model_type, tmp_path):
    shape = hf_shape(str(write_tiny(model_type, tmp_path)))
    assert any(shape.layer_windows)
    _, scores = layer_forward_flops(shape, seq_len=S, micro_batch=B)
    # Full layers count the whole square (the time model halves it for a causal kernel);
    # windowed layers twice their mask's pairs, so that the halving leaves those pairs.
    per_layer = [2 * _mask_pairs(w) if w else S * S for w in shape.layer_windows]
    assert attention_keys(shape, S) == sum(per_layer) / len(per_layer)
    assert scores == 4 * B * attention_width(shape) * sum(per_layer) / len(per_layer)
