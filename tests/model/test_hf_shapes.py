"""The shape of any HF causal LM read from its config and the meta-device model: its parameter
count against ``sum(p.numel())`` of the model transformers builds, for the named families and
for families autotune does not name (their default configs, shrunk), and the parts each named
family's description carries."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from testkit.hf_families import NAMED, tiny_config, write_tiny  # noqa: E402

from autotune.hf_config import hf_shape  # noqa: E402

UNNAMED = ("cohere", "starcoder2", "olmo", "phi", "falcon", "stablelm")
"""Families no code here names, built from transformers' defaults with the tiny sizes."""


def _built_params(model_type: str) -> int:
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(tiny_config(model_type))
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("model_type", (*NAMED, "gpt2", "llama", "mistral", "qwen2", *UNNAMED))
def test_num_params_is_the_built_models(model_type, tmp_path):
    shape = hf_shape(str(write_tiny(model_type, tmp_path)))
    assert shape.num_params() == _built_params(model_type)


def _parts(model_type, tmp_path):
    return hf_shape(str(write_tiny(model_type, tmp_path)))


def test_named_families_parts(tmp_path):
    qwen3 = _parts("qwen3", tmp_path / "q")
    assert (qwen3.head_dim, qwen3.qk_norm, qwen3.num_kv_heads) == (16, "head", 2)
    gemma2 = _parts("gemma2", tmp_path / "g2")
    assert gemma2.layer_windows == (8, 0, 8, 0) and gemma2.block_norms == 4
    assert (gemma2.attn_softcap, gemma2.final_softcap, gemma2.query_scale) == (50.0, 30.0, 24.0)
    assert gemma2.tied_embeddings and gemma2.mlp_kind == "swiglu"
    gemma3 = _parts("gemma3_text", tmp_path / "g3")
    assert gemma3.layer_windows == (8, 8, 8, 0) and gemma3.qk_norm == "head"
    olmo2 = _parts("olmo2", tmp_path / "o")
    assert olmo2.qk_norm == "all" and olmo2.block_norms == 2
    # Phi-3's fused qkv_proj and gate_up_proj hold what Llama's separate ones do.
    phi3 = _parts("phi3", tmp_path / "p")
    assert phi3.mlp_kind == "swiglu" and phi3.num_params() == _built_params("phi3")
    gpt2 = _parts("gpt2", tmp_path / "gpt2")
    # GPT-2 reads neither the kit's intermediate_size nor its num_key_value_heads.
    assert (gpt2.family, gpt2.ffn_hidden_size, gpt2.num_kv_heads) == ("gpt", 128, 4)


def test_estimate_json_reports_the_parameter_count_it_used(tmp_path, capsys):
    import json

    from autotune.cli.main import main

    folder = write_tiny("gemma3_text", tmp_path)
    flags = ["--world-size", "2", "--tp", "2", "--micro-batch", "1", "--global-batch", "4"]
    assert main(["estimate", "--model", f"hf:{folder}", *flags, "--seq-len", "32", "--json"]) == 0
    shape = json.loads(capsys.readouterr().out)["shape"]
    assert shape["num_params"] == _built_params("gemma3_text")
    assert (shape["head_dim"], shape["tied_embeddings"]) == (16, True)
