"""The step-time model counts the parameters a rank holds as ``ModelShape.num_params`` does: a
tied output head is the embedding itself, counted once."""

from __future__ import annotations

import dataclasses

import pytest

from autotune.config import TrialConfig, WorkloadSpec
from autotune.model.cluster import load_cluster
from autotune.model.perf_model import AUTOTUNE_ENGINE, _params_per_rank, _setup
from autotune.shapes import MODEL_SHAPES

CLUSTER = load_cluster("h100-sxm")


def _time_model_params(shape) -> float:
    """The time model's parameters on the one rank of a pp 1, tp 1 layout."""
    config = TrialConfig(
        workload=WorkloadSpec(
            seq_len=64, global_batch_size=8, workload="test:shape", vocab_size=shape.vocab_size
        ),
        world_size=1,
    )
    step = _setup(config, CLUSTER, None, shape, AUTOTUNE_ENGINE)
    return _params_per_rank(step, [sum(c) for c in step.layout.chunk_layers])


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("key", list(MODEL_SHAPES), ids=lambda k: "-".join(k))
def test_parameters_at_pp_1_are_num_params(key, tied):
    shape = dataclasses.replace(MODEL_SHAPES[key], tied_embeddings=tied)
    assert _time_model_params(shape) == shape.num_params()


def test_a_tied_llama_1b_holds_its_published_count():
    """Llama 3.2 1B (tied): 128,256 × 2,048 embedding + 16 blocks of 2·2048² + 2·2048·512
    attention, 3·2048·8192 SwiGLU and two norms + the final norm = 1,235,814,400 (Meta's
    model card: 1.23B), where counting the head apart gave 1.498B."""
    shape = dataclasses.replace(MODEL_SHAPES[("llama", "1b")], tied_embeddings=True)
    h, f, kv, v = 2048, 8192, 512, 128256
    block = 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h
    assert _time_model_params(shape) == v * h + 16 * block + h == 1_235_814_400
