"""TrialConfig / WorkloadSpec: derived quantities, every validation rule, lossless JSON."""

from __future__ import annotations

import dataclasses
import json

import pytest

from autotune.config import TrialConfig, WorkloadSpec
from autotune.errors import ConfigError
from autotune.shapes import MODEL_SHAPES
from autotune.trial.models.transformer import Transformer


def test_derived_quantities():
    c = TrialConfig(
        world_size=8,
        tp_degree=2,
        pp_degree=2,
        micro_batch_size=2,
        workload=WorkloadSpec(global_batch_size=16, seq_len=32),
    )
    assert c.dp_degree == 2
    assert c.grad_accum_steps == 4  # 16 = 2 micro × 4 accumulation × 2 dp
    assert c.micro_batch_size * c.grad_accum_steps * c.dp_degree == 16
    assert c.tokens_per_step == 16 * 32


def test_json_round_trip_is_lossless():
    c = TrialConfig(
        world_size=4,
        tp_degree=2,
        zero_stage=3,
        micro_batch_size=1,
        bucket_mb=12.5,
        overlap_enabled=False,
        activation_checkpointing="selective",
        pp_schedule="gpipe",
        attention="eager",
        device="cpu",
        seed=7,
        workload=WorkloadSpec(
            family="llama",
            size="tiny",
            seq_len=32,
            global_batch_size=4,
            vocab_size=100,
            dtype="bfloat16",
        ),
    )
    assert TrialConfig.from_json(c.to_json()) == c
    assert TrialConfig.from_dict(json.loads(json.dumps(c.resolved()))) == c
    default = TrialConfig()
    assert TrialConfig.from_json(default.to_json()) == default


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"world_size": 2', "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"wrold_size": 2}', "unknown key 'wrold_size'"),
        ('{"workload": {"sise": "tiny"}}', "unknown key 'workload.sise'"),
        ('{"zero_stage": 4}', "'zero_stage' must be one of 0, 1, 2, 3"),
        ('{"world_size": "2"}', "'world_size' must be an integer"),
        ('{"overlap_enabled": 1}', "'overlap_enabled' must be true or false"),
        ('{"bucket_mb": null}', "'bucket_mb' must be a number"),
        ('{"activation_checkpointing": "some"}', "one of 'none', 'selective', 'op', 'full'"),
        ('{"workload": 3}', "'workload' must be a JSON object"),
    ],
)
def test_malformed_json_is_refused_with_the_key(text, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        TrialConfig.from_json(text)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(workload=WorkloadSpec(size="huge")), "unknown model 'gpt-huge'"),
        (dict(world_size=0), "world_size must be a positive integer"),
        (dict(world_size=4, tp_degree=3), "must divide world_size 4"),
        (
            dict(world_size=3, tp_degree=3, workload=WorkloadSpec(global_batch_size=3)),
            "tp_degree 3 must divide the 4 attention heads of gpt-tiny",
        ),
        (
            dict(world_size=4, tp_degree=4, workload=WorkloadSpec(family="llama", size="tiny")),
            "must divide the 2 key/value heads",
        ),
        (
            dict(world_size=8, pp_degree=8, workload=WorkloadSpec(global_batch_size=16)),
            "8 pipeline stages .* exceed the 4 layers",
        ),
        (
            dict(world_size=4, pp_degree=4, pp_schedule="interleaved_1f1b"),
            "8 pipeline stages .* exceed the 4 layers",
        ),
        (
            dict(world_size=2, micro_batch_size=3),
            "global_batch_size 8 is not divisible by micro_batch_size × dp_degree = 3 × 2",
        ),
        (
            dict(world_size=2, pp_degree=2, micro_batch_size=8, pp_schedule="1f1b"),
            "1f1b needs at least pp_degree = 2 microbatches, got 1",
        ),
        (
            dict(optimizer_offload_enabled=True, zero_stage=3, device="cpu"),
            "optimizer_offload_enabled needs device cuda",
        ),
        (dict(optimizer_offload_enabled=True, zero_stage=1), "needs zero_stage 2 or 3"),
        (dict(bucket_mb=0.0), "bucket_mb must be > 0"),
        (dict(num_timed_steps=0), "num_timed_steps must be a positive integer"),
        (dict(workload=WorkloadSpec(seq_len=1024)), "exceeds the context of gpt-tiny"),
        (dict(workload=WorkloadSpec(workload="no_colon")), "must have the form"),
    ],
)
def test_validation_names_the_rule(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        TrialConfig(**kwargs).validate()


def test_zero1_composes_with_tensor_and_pipeline_parallelism():
    """TP inside the node and ZeRO-1 across nodes (Megatron's distributed optimizer), and
    ZeRO-1 under a pipeline with overlap, are valid layouts."""
    TrialConfig(world_size=4, tp_degree=2, zero_stage=1, micro_batch_size=1).validate()
    TrialConfig(world_size=4, pp_degree=2, zero_stage=1, micro_batch_size=1).validate()


def test_config_error_is_a_value_error():
    with pytest.raises(ValueError):
        TrialConfig(world_size=-1).validate()


@pytest.mark.parametrize("key", sorted(MODEL_SHAPES))
def test_param_count_formula_matches_the_model(key):
    """num_params (used by MFU and later the memory model) equals the built model's count.
    Large shapes are built on the meta device (no memory)."""
    import torch

    shape = MODEL_SHAPES[key]
    with torch.device("meta"):
        model = Transformer(shape, vocab_size=shape.vocab_size)
    assert shape.num_params() == sum(p.numel() for p in model.parameters())


def test_named_shapes_are_the_published_ones():
    # GPT-2 small ≈ 124M with tied embeddings; untied head adds vocab × hidden.
    gpt2_small = MODEL_SHAPES[("gpt", "small")]
    assert gpt2_small.num_params() - 50257 * 768 == pytest.approx(124.4e6, rel=0.01)
    llama7b = MODEL_SHAPES[("llama", "7b")]
    assert llama7b.num_params() == pytest.approx(6.74e9, rel=0.01)
    llama70b = MODEL_SHAPES[("llama", "70b")]
    assert llama70b.num_params() == pytest.approx(68.98e9, rel=0.01)


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        TrialConfig().world_size = 3  # type: ignore[misc]
