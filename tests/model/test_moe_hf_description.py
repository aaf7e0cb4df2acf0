"""Hugging Face mixtures of experts in the cost description (``hf_config.moe_parts``): the
routed experts' stacked tensors, the router, the shared experts and the leading dense layers,
counted as transformers builds the model. transformers' Qwen3MoeConfig and DeepseekV3Config
defaults are the released models' sizes; the count tests shrink them."""

from __future__ import annotations

import pytest
from testkit.hf_moe import DEEPSEEK_V3, QWEN3_MOE

from autotune import hf_config
from autotune.shapes import TP_EXPERT

transformers = pytest.importorskip("transformers")  # the hf extra; CI installs it
torch = pytest.importorskip("torch")


@pytest.fixture
def moe_allowed(monkeypatch):
    """The cost model reads a mixture of experts; the trial path's refusal stays where it is."""
    monkeypatch.setattr(hf_config, "check_supported", lambda config, ref: None)


def _saved(tmp_path, config):
    config.save_pretrained(tmp_path)
    return str(tmp_path)


def _torch_count(config) -> int:
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    ("cls", "kwargs", "dense", "shared"),
    [("Qwen3MoeConfig", QWEN3_MOE, 0, 0), ("DeepseekV3Config", DEEPSEEK_V3, 2, 1)],
)
def test_hf_moe_counts_agree_with_torch(tmp_path, moe_allowed, cls, kwargs, dense, shared):
    config = getattr(transformers, cls)(**kwargs)
    shape = hf_config.hf_shape(_saved(tmp_path, config))
    assert shape.moe.num_experts == 8 and shape.moe.top_k == 2
    assert shape.moe.expert_ffn_size == 32
    assert (shape.moe.first_dense_layers, shape.moe.num_shared_experts) == (dense, shared)
    experts = [t for t in shape.layer_tensors(kwargs["num_hidden_layers"] - 1) if t.tp == TP_EXPERT]
    # gate_up [E, 2f, h] and down [E, h, f]: 3·E·f·h elements, E rows each.
    assert [t.rows for t in experts] == [8, 8]
    assert sum(t.numel for t in experts) == 3 * 8 * 32 * 64
    assert shape.num_params() == _torch_count(config)


def test_deepseek_v3_full_size_is_671b(tmp_path, moe_allowed):
    config = transformers.DeepseekV3Config()
    shape = hf_config.hf_shape(_saved(tmp_path, config))
    total = _torch_count(config)
    assert shape.num_params() == total
    assert 671e9 < total < 672e9, total  # DeepSeek-V3's 671B (its report, Table 1)
    assert (shape.moe.num_experts, shape.moe.top_k, shape.moe.first_dense_layers) == (256, 8, 3)


def test_deepseek_v3_mla_geometry_matches_its_tensors(tmp_path, moe_allowed):
    shape = hf_config.hf_shape(_saved(tmp_path, transformers.DeepseekV3Config(**DEEPSEEK_V3)))
    q_rank, kv_rank, nope, rope, v = shape.mla
    assert (q_rank, kv_rank, nope, rope, v) == (48, 32, 16, 8, 16)
    rows = {t.name: (t.rows, t.cols) for t in shape.layer_tensors(0)}
    heads, h = 4, 64
    assert rows["self_attn.q_a_proj.weight"] == (q_rank, h)
    assert rows["self_attn.q_b_proj.weight"] == (heads * (nope + rope), q_rank)
    assert rows["self_attn.kv_a_proj_with_mqa.weight"] == (kv_rank + rope, h)
    assert rows["self_attn.kv_b_proj.weight"] == (heads * (nope + v), kv_rank)
    assert rows["self_attn.o_proj.weight"] == (h, heads * v)
    assert (
        hf_config.hf_shape(_saved(tmp_path / "q", transformers.Qwen3MoeConfig(**QWEN3_MOE))).mla
        == ()
    )


def test_mla_attention_width_is_what_its_scores_multiply(tmp_path, moe_allowed):
    """Q·Kᵀ over qk_nope + qk_rope and softmax·V over v_head_dim per head: the cost model's
    4 · s² · width equals the batched matmuls torch's FLOP counter sees in the eager attention
    of one DeepSeek-V3 layer (the projections run as mm/addmm, the scores as bmm)."""
    from torch.utils.flop_counter import FlopCounterMode

    from autotune.model.description import attention_width

    kwargs = {**DEEPSEEK_V3, "num_hidden_layers": 1, "first_k_dense_replace": 1}
    config = transformers.DeepseekV3Config(**kwargs)
    shape = hf_config.hf_shape(_saved(tmp_path, config))
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    seq = 16
    with FlopCounterMode(display=False) as counter:
        model(torch.zeros(1, seq, dtype=torch.long))
    scores = counter.get_flop_counts()["Global"][torch.ops.aten.bmm]
    assert 4 * seq * seq * attention_width(shape) == scores
    assert shape.num_heads * shape.head_dim * 4 * seq * seq < 0.7 * scores  # head_dim alone
