"""Every named Hugging Face family (``testkit.hf_families.NAMED``) and Llama, from tiny configs
with their family's defaults, trains dp 2, ZeRO-3, tp 2 and pp 2 (tied embeddings across the two
stages where the family ties) to the losses of the plain HF model in one process; sliding-window
families train cp 2 as well; two families nobody named (built from transformers' own default
configs, cut down) train dp 2 and tp 2 with no code for them. Negative controls, on the same
ranks: without the tied gradients' sum, without the plan's gradient all-reduce of per-head QK
norms, and without the window in context-parallel attention, the losses leave the reference.
"""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")  # the hf extra; CI installs it

from spawn import run_ranks  # noqa: E402
from test_hf import _base, _train_layouts, hf_reference  # noqa: E402
from testkit.hf_families import NAMED, write_tiny  # noqa: E402

from autotune.layouts import short_name  # noqa: E402

NUM_STEPS = 3
UNNAMED = ("starcoder2", "cohere")
"""Families no code names: plain GELU MLP with biases and LayerNorm, tied (StarCoder2); parallel
attention and MLP from one LayerNorm, logit scale, tied (Cohere)."""
LAYOUTS = {
    "dp2": dict(micro_batch_size=1),
    "zero3": dict(zero_stage=3, micro_batch_size=1),
    "tp2": dict(tp_degree=2, micro_batch_size=2),
    "pp2": dict(pp_degree=2, micro_batch_size=1),
    "cp2": dict(cp_degree=2, micro_batch_size=2),
    "sp2": dict(tp_degree=2, sequence_parallel=True, micro_batch_size=2),
    "pp2v2": dict(
        pp_degree=2, pp_schedule="interleaved_1f1b", virtual_stages=2, micro_batch_size=1
    ),
}
SLIDING = ("gemma2", "gemma3_text")


def _plan(dirs: dict[str, str]) -> dict[tuple[str, str], object]:
    wanted = [(f, lay) for f in ("llama", *NAMED) for lay in ("dp2", "zero3", "tp2", "pp2")]
    wanted += [(f, "cp2") for f in SLIDING]
    # Sequence parallelism over norms after attention and MLP (Gemma 3, OLMo 2), the fused
    # projections' gathered outputs (Phi-3) and a parallel attention + MLP block (Cohere).
    wanted += [(f, "sp2") for f in ("gemma3_text", "olmo2", "phi3", "cohere")]
    # Tied embeddings over four virtual stages: stage 0 on pp rank 0, stage 3 on pp rank 1.
    wanted += [("smollm3", "pp2v2")]
    wanted += [(f, lay) for f in UNNAMED for lay in ("dp2", "tp2")]
    return {(f, lay): _base(dirs[f], **LAYOUTS[lay]) for f, lay in wanted}


BREAKS = {
    # PP with tied embeddings: each stage's copy steps with its own gradient only.
    "tied": ("gemma3_text", "pp2"),
    # Qwen3's per-head q_norm / k_norm: each tp rank's gradient covers its own heads only.
    "qk_norm": ("qwen3", "tp2"),
    # CP over sliding-window layers: the window left out of the mask.
    "window": ("gemma3_text", "cp2"),
}


def _broken(name: str) -> None:
    """Break one mechanism in this rank process (a negative control)."""
    from autotune.trial.models import hf

    if name == "tied":
        hf.sum_tied_gradients = lambda stages: None
    elif name == "qk_norm":
        styles = hf._styles
        hf._styles = lambda sp: {
            k: v for k, v in styles(sp).items() if k != "replicated_with_grad_allreduce"
        }
    elif name == "window":
        mask = hf.causal_mask
        hf.causal_mask = lambda cp, device, window=None: mask(cp, device)


def _q_norm_weight(config, num_steps: int) -> list[float]:
    """This rank's first q_norm weight after training ``config`` (tp 2: its local copy)."""
    import torch

    from autotune.trial.models.build import build_workload
    from autotune.trial.parallel.mesh import build_mesh
    from autotune.trial.parallel.parallelize import parallelize
    from autotune.trial.runner import Trainer

    config = config.with_precision("cpu")
    workload = build_workload(config.workload, attention=config.attention, seed=config.seed)
    pm = parallelize(workload, config, build_mesh(config, "cpu"), torch.device("cpu"))
    trainer = Trainer(pm, workload, torch.device("cpu"))
    for step in range(num_steps):
        trainer.step(step)
    weight = next(p for n, p in pm.parts[0].named_parameters() if "q_norm" in n)
    return (weight.to_local() if hasattr(weight, "to_local") else weight).tolist()


def _train_all(rank: int, configs: list, broken: dict, num_steps: int) -> dict:
    """The layouts, then each negative control with its mechanism broken (the breaks stay in
    this process). QK norms: the trained q_norm weight of each tp rank, with and without."""
    out = _train_layouts(rank, configs, num_steps, [])["losses"]
    out["q_norm"] = _q_norm_weight(broken["qk_norm"], num_steps)
    for name, config in broken.items():
        _broken(name)
        losses = _train_layouts(rank, [config], num_steps, [])["losses"]
        out.update({f"broken {name}|{k}": v for k, v in losses.items()})
    out["broken q_norm"] = _q_norm_weight(broken["qk_norm"], num_steps)
    return out


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {f: str(write_tiny(f, root / f)) for f in ("llama", *NAMED, *UNNAMED)}


@pytest.mark.slow
def test_every_family_trains_each_layout_as_the_single_process_hf_model(dirs):
    plan = _plan(dirs)
    broken = {name: plan[key] for name, key in BREAKS.items()}
    results = run_ranks(2, _train_all, list(plan.values()), broken, NUM_STEPS, timeout=900)
    got = results[0]
    references = {f: hf_reference(dirs[f], plan[f, "dp2"].workload, NUM_STEPS) for f in dirs}
    still = [f for f, losses in references.items() if max(losses) - min(losses) < 1e-3]
    assert not still, f"the losses do not move: {still}"
    keys = {k: f"{c.workload.hf_model}|{short_name(c)}" for k, c in plan.items()}
    wrong = {
        k: (got[key], references[k[0]])
        for k, key in keys.items()
        if got[key] != pytest.approx(references[k[0]], abs=2e-5)
    }
    assert not wrong
    for name in ("tied", "window"):
        family = BREAKS[name][0]
        key = f"broken {name}|{broken[name].workload.hf_model}|{short_name(broken[name])}"
        assert got[key] != pytest.approx(references[family], abs=2e-5), name
    # Per-head QK norms under TP: the summed gradient keeps the two ranks' copies equal; each
    # rank's own heads alone move them apart (the losses barely show it in three steps).
    assert results[0]["q_norm"] == results[1]["q_norm"]
    assert results[0]["broken q_norm"] != pytest.approx(results[1]["broken q_norm"], abs=1e-6)


def test_the_tiny_families_keep_what_makes_them_that_family(dirs):
    """The test above exercises tied embeddings across stages, per-head QK norms under TP and
    sliding windows under CP only if the tiny configs have them."""
    config = {f: transformers.AutoConfig.from_pretrained(p) for f, p in dirs.items()}
    assert config["gemma3_text"].tie_word_embeddings and config["smollm3"].tie_word_embeddings
    assert "sliding_attention" in config["gemma3_text"].layer_types
    plan = config["qwen3"].base_model_tp_plan
    assert plan["layers.*.self_attn.q_norm"] == "replicated_with_grad_allreduce"
    assert "colwise_gather_output" in config["phi3"].base_model_tp_plan.values()
    for f in UNNAMED:
        assert config[f].base_model_tp_plan and config[f].base_model_pp_plan
