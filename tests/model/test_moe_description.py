"""A mixture of experts in the cost description (``ModelShape.layer_tensors`` and
``moe_tensors``): the routed experts' stacked weights, the shared experts, the router, and the
dense first layers, counted as the built model holds them."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from autotune.config import MOE_SHAPES, WorkloadSpec
from autotune.moe import MoESpec
from autotune.shapes import TP_COLUMN, TP_EXPERT, TP_REPLICATED, TP_ROW
from autotune.trial.models.transformer import Transformer

TINY = MOE_SHAPES[("moe", "tiny")]


def _torch_count(shape) -> int:
    with torch.device("meta"):
        model = Transformer(shape, vocab_size=shape.vocab_size)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    "change",
    [
        {},
        {"num_shared_experts": 0},
        {"num_shared_experts": 2, "first_dense_layers": 0},
        {"first_dense_layers": 3, "top_k": 1},
    ],
)
def test_moe_counts_agree_with_torch(change):
    shape = dataclasses.replace(TINY, moe=dataclasses.replace(TINY.moe, **change))
    assert shape.num_params() == _torch_count(shape)


def test_builtin_moe_tiny_builds_as_counted():
    spec = WorkloadSpec(family="moe", size="tiny", seq_len=64, global_batch_size=1)
    assert spec.shape.num_params() == _torch_count(spec.shape)


def test_moe_layer_by_hand():
    # hidden 32, 4 heads of 8 (2 KV heads), 8 experts of width 32, one shared expert, layer 0
    # dense (SwiGLU of 64).
    h, e, f = 32, 8, 32
    attention = 2 * h * h + 2 * h * 16 + 2 * h  # wq, wo; wk, wv of 2 heads; two norms
    dense = attention + 3 * h * 64
    moe = attention + e * h + 3 * e * f * h + 3 * f * h
    assert sum(t.numel for t in TINY.layer_tensors(0)) == dense
    assert sum(t.numel for t in TINY.layer_tensors(1)) == moe
    kinds = {t.name: t.tp for t in TINY.moe_tensors()}
    assert kinds == {
        "router.gate.weight": TP_REPLICATED,
        "experts.w1": TP_EXPERT,
        "experts.w2": TP_EXPERT,
        "experts.w3": TP_EXPERT,
        "shared_experts.w1.weight": TP_COLUMN,
        "shared_experts.w2.weight": TP_ROW,
        "shared_experts.w3.weight": TP_COLUMN,
    }
    roots = 2 * 512 * h + h  # embedding, head, final norm
    assert TINY.num_params() == dense + 3 * moe + roots


def test_dense_shape_has_no_expert_tensors():
    dense = dataclasses.replace(TINY, moe=None)
    assert dense.moe_tensors() == ()
    assert all(dense.layer_tensors(i) == dense.block_tensors() for i in range(4))
    assert isinstance(TINY.moe, MoESpec)
