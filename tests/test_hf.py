"""Hugging Face causal LMs (``--model hf:PATH``): tiny GPT-2, Llama with grouped-query attention
and Qwen2 with tied embeddings, created here from their configs (never downloaded), train under
every valid world-2 layout exactly as the plain HF model trains in one process; the memory
model reads their shape; bad input is one line.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os

import pytest
import torch

transformers = pytest.importorskip("transformers")  # the hf extra; CI installs it

from autotune.config import TrialConfig, WorkloadSpec  # noqa: E402
from autotune.errors import ConfigError  # noqa: E402
from autotune.layouts import enumerate_configs, short_name  # noqa: E402
from autotune.models.workload import cross_entropy_loss, synthetic_batch  # noqa: E402
from autotune.parallel.zero import LEARNING_RATE  # noqa: E402
from spawn import run_ranks  # noqa: E402

NUM_STEPS = 2
TINY = dict(vocab_size=128, max_position_embeddings=64, bos_token_id=0, eos_token_id=0)
ARCHS = {
    # GPT-2 has no base_model_tp_plan: no TP layouts. Dropout off, so ranks and the reference
    # draw no random masks.
    "gpt2": lambda: transformers.GPT2Config(
        n_layer=4, n_embd=32, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        tie_word_embeddings=False, **TINY),
    # Grouped-query attention: 4 query heads share 2 key/value heads.
    "llama": lambda: transformers.LlamaConfig(
        num_hidden_layers=4, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, **TINY),
    # QKV biases and tied input/output embeddings (so no pipeline layouts).
    "qwen2": lambda: transformers.Qwen2Config(
        num_hidden_layers=4, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, tie_word_embeddings=True, **TINY),
}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    dirs = {}
    for name, make in ARCHS.items():
        make().save_pretrained(root / name)
        dirs[name] = str(root / name)
    return dirs


def _base(path: str, **kw) -> TrialConfig:
    spec = WorkloadSpec(hf_model=path, seq_len=16, global_batch_size=4)
    return TrialConfig(workload=spec, world_size=2, device="cpu", **kw)


def layouts(path: str) -> list[TrialConfig]:
    return list(enumerate_configs(_base(path)))


def trimmed(path: str, per_group: int) -> list[TrialConfig]:
    """The sweep trimmed to fit the test budget: every (tp, pp, ZeRO stage, schedule)
    combination that is valid, each with ``per_group`` of its (micro-batch, checkpointing)
    variants, chosen round-robin so the checkpointing modes and micro-batch sizes (accumulation
    counts) rotate through the groups. (All 138 valid layouts of the three models pass too; they take ~190 s here.)"""
    groups: dict[tuple, list[TrialConfig]] = {}
    for c in layouts(path):
        groups.setdefault((c.tp_degree, c.pp_degree, c.zero_stage, c.pp_schedule), []).append(c)
    modes = ("none", "selective", "full")
    chosen, turn = [], 0
    for variants in groups.values():
        micros = sorted({c.micro_batch_size for c in variants})
        for _ in range(min(per_group, len(variants))):
            mode, micro = modes[turn % 3], micros[(turn // 3 + turn) % len(micros)]
            fits = ([c for c in variants if (c.activation_checkpointing, c.micro_batch_size)
                     == (mode, micro)] or [c for c in variants
                                           if c.activation_checkpointing == mode] or variants)
            chosen.append(next((c for c in fits if c not in chosen), fits[0]))
            turn += 1
    return chosen


def hf_reference(path: str, spec: WorkloadSpec, num_steps: int) -> list[float]:
    """The plain HF model (its own forward, ``.logits``) trained in one process."""
    config = transformers.AutoConfig.from_pretrained(path)
    config.use_cache = False
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.0)
    losses = []
    for step in range(num_steps):
        x, y = synthetic_batch(step, seed=0, batch_size=spec.global_batch_size,
                               seq_len=spec.seq_len, vocab_size=config.vocab_size)
        loss = cross_entropy_loss(model(input_ids=x).logits, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def _train_layouts(rank: int, configs: list[TrialConfig], num_steps: int) -> dict[str, list]:
    """Every layout on one process group: build, parallelise, train, per-step losses."""
    from autotune.models.workload import build_workload
    from autotune.parallel.mesh import build_mesh
    from autotune.parallel.parallelize import check_workload_supports, parallelize
    from autotune.runner import Trainer

    device = torch.device("cpu")
    out = {}
    for config in configs:
        workload = build_workload(config.workload, attention=config.attention, seed=config.seed)
        check_workload_supports(config, workload)
        pm = parallelize(workload, config, build_mesh(config, "cpu"), device)
        trainer = Trainer(pm, workload, device)
        for step in range(num_steps):
            trainer.step(step)
        out[f"{config.workload.hf_model}|{short_name(config)}"] = trainer.losses()
    return out


def test_every_layout_matches_the_single_process_hf_model(model_dirs):
    # Llama-GQA, the one model with both TP and PP, gets two variants per combination.
    # AUTOTUNE_HF_FULL_SWEEP=1 runs every valid layout (all 138) instead.
    full = os.environ.get("AUTOTUNE_HF_FULL_SWEEP") == "1"
    chosen = {p: layouts(p) if full else trimmed(p, 2 if name == "llama" else 1)
              for name, p in model_dirs.items()}
    configs = [c for cs in chosen.values() for c in cs]
    names = {p: [short_name(c) for c in cs] for p, cs in chosen.items()}
    for cs in chosen.values():  # every checkpointing mode and some accumulation on each model
        assert {c.activation_checkpointing for c in cs} == {"none", "selective", "full"}
        assert max(c.grad_accum_steps for c in cs) > 1
    # The layouts the shapes allow: GPT-2 no TP (no plan), Qwen2 no PP (tied embeddings).
    assert not any("-tp2-" in n for n in names[model_dirs["gpt2"]])
    assert not any("-pp2-" in n for n in names[model_dirs["qwen2"]])
    assert any("-tp2-" in n for n in names[model_dirs["llama"]])
    assert any("interleaved" in n for n in names[model_dirs["llama"]])
    results = run_ranks(2, _train_layouts, configs, NUM_STEPS, timeout=600)
    for path in model_dirs.values():
        expected = hf_reference(path, configs[0].workload, NUM_STEPS)
        assert expected[0] != pytest.approx(expected[-1], abs=1e-3)  # the losses move
        for name in names[path]:
            got = results[0][f"{path}|{name}"]
            assert got == pytest.approx(expected, abs=2e-5), (path, name)
