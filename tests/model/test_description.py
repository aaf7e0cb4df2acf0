"""The cost description (autotune/model/description.py, ``ModelShape.block_tensors``): one list
of a model's tensors, which the parameter count, the memory model and torch agree on."""

from __future__ import annotations

import pytest
import torch

from autotune.config import TrialConfig, WorkloadSpec
from autotune.model.description import block_params, stage_params
from autotune.model.memory import estimate_memory
from autotune.shapes import MODEL_SHAPES, model_names
from autotune.trial.models.workload import build_builtin


def _memory_count(spec: WorkloadSpec) -> int:
    """Parameters by the memory model: world 1, ZeRO-0, 32-true, parameter bytes ÷ 4."""
    config = TrialConfig(workload=spec, world_size=1, zero_stage=0, precision="32-true")
    return estimate_memory(config, device_type="cuda").parameters // 4


def _counts(spec: WorkloadSpec, model: torch.nn.Module) -> dict[str, int]:
    """The parameter count four ways: torch's (a tied weight is one parameter), the shape's,
    the description's and the memory model's."""
    shape = spec.shape
    return {
        "torch": sum(p.numel() for p in model.parameters()),
        "num_params": shape.num_params(),
        "description": stage_params(shape, shape.num_layers, first=True, last=True),
        "memory": _memory_count(spec),
    }


@pytest.mark.parametrize("name", model_names())
def test_builtin_counts_agree_with_torch(name):
    family, size = name.split("-")
    spec = WorkloadSpec(family=family, size=size, seq_len=64, global_batch_size=1)
    counts = _counts(spec, build_builtin(spec, device="meta").model)
    assert len(set(counts.values())) == 1, counts


def test_block_params_of_llama_7b_by_hand():
    # 4h² attention (32 heads of 128 = h), SwiGLU 3hf, two RMSNorm weights.
    h, f = 4096, 11008
    assert block_params(MODEL_SHAPES[("llama", "7b")]) == 4 * h * h + 3 * h * f + 2 * h
    # tp 4: q, k, v, o and the MLP ÷ 4, the norms whole.
    assert block_params(MODEL_SHAPES[("llama", "7b")], 4) == h * h + 3 * h * f // 4 + 2 * h


def test_stage_params_shard_the_vocabulary_only_when_asked():
    shape = MODEL_SHAPES[("llama", "7b")]  # vocabulary 32,000, h 4,096
    whole = stage_params(shape, 0, first=True, last=False, tp=8)
    assert whole == 32000 * 4096
    assert stage_params(shape, 0, first=True, last=False, tp=8, vocab_shards=8) == 4000 * 4096
    assert stage_params(shape, 0, first=False, last=True, tp=8, vocab_shards=8) == (
        4096 + 4000 * 4096  # the final RMSNorm, the head's rows
    )


transformers = pytest.importorskip("transformers")  # the hf extra; CI installs it

GQA = dict(num_hidden_layers=4, hidden_size=32, num_attention_heads=4, num_key_value_heads=2)
HF_CONFIGS = {  # tests/trial/test_hf.py's three models, and one with its own head_dim
    "gpt2": ("GPT2Config", dict(n_layer=4, n_embd=32, n_head=4)),
    "llama": ("LlamaConfig", dict(GQA, intermediate_size=64)),
    "qwen2-tied": ("Qwen2Config", dict(GQA, intermediate_size=64, tie_word_embeddings=True)),
    "mistral-head-dim": ("MistralConfig", dict(GQA, head_dim=16, intermediate_size=48)),
}


@pytest.mark.parametrize("name", sorted(HF_CONFIGS))
def test_hf_counts_agree_with_torch(name, tmp_path):
    from autotune.trial.models.hf import build_hf

    kind, fields = HF_CONFIGS[name]
    tiny = dict(vocab_size=128, max_position_embeddings=64, bos_token_id=0, eos_token_id=0)
    getattr(transformers, kind)(**fields, **tiny).save_pretrained(tmp_path)
    spec = WorkloadSpec(hf_model=str(tmp_path), seq_len=16, global_batch_size=1)
    with torch.device("meta"):
        model = build_hf(spec).model
    counts = _counts(spec, model)
    assert len(set(counts.values())) == 1, counts
