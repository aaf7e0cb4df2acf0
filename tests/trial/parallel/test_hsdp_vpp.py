"""HSDP and virtual pipeline stages train the same model as one process, and move the bytes
their layout implies.

HSDP 2 × 2 (world 4, dp 4 = 2 replica groups of 2 shards; FSDP2 on the 2-D (dp_replicate,
dp_shard) mesh) under ZeRO-3 and ZeRO-2 (with 2 accumulation steps: the no-sync path) on the
built-in GPT and under ZeRO-3 on an HF Llama config; interleaved 1F1B on pp 2 with 4 virtual
stages, and with 3 (6 stages over 8 layers: an uneven split, 2, 2, 1, 1, 1, 1), on an 8-layer
HF Llama. Every step's loss must equal the single-process reference (``reference.py``) within
``test_layouts.LOSS_ATOL`` (fp32 summation noise).

Negative control: HSDP whose shards skip the all-reduce across replica groups (each replica
group averages its gradients within itself only) fails that tolerance.

Bytes (profiled steps, gloo; the payload convention of ``tests/profiler/test_truth.py``: an
all-gather counts its gathered output, a reduce-scatter its full input, an all-reduce its
tensor), per rank per step, with Φ the model's parameters in fp32 (4 bytes each; every tensor's
first dim is even, so FSDP2's padding to a multiple of dp_shard = 2 adds nothing):
reduce-scatter 4Φ within dp_shard, all-reduce of the shard 4Φ / dp_shard across dp_replicate,
all-gather 4Φ within dp_shard once per micro-batch (ZeRO-2: parameters stay gathered from
forward through backward; FSDP2 reshards them after each backward) or twice (ZeRO-3: again in
backward), and nothing on the flattened dp. The reduce-scatter and all-reduce run once per step,
on the last micro-batch (``set_requires_gradient_sync``).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
from reference import reference_losses
from spawn import run_ranks
from test_layouts import LOSS_ATOL

from autotune.config import TrialConfig, WorkloadSpec
from autotune.trial.models.build import build_workload

transformers = pytest.importorskip("transformers")  # the hf extra; CI installs it

BASE = TrialConfig(
    world_size=4,
    dp_replicate=2,
    num_warmup_steps=0,
    num_timed_steps=1,
    num_profiled_steps=1,
    device="cpu",
)
NUM_STEPS = 3  # 1 timed + 1 profiled + the memory step
HSDP_GPT = [
    dataclasses.replace(BASE, zero_stage=3, micro_batch_size=2),
    dataclasses.replace(BASE, zero_stage=2, micro_batch_size=1),
]
HF_TINY = dict(
    hidden_size=32,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=64,
    vocab_size=128,
    max_position_embeddings=64,
    bos_token_id=0,
    eos_token_id=0,
)


def _llama_dir(root, layers: int) -> str:
    path = root / f"llama{layers}"
    transformers.LlamaConfig(num_hidden_layers=layers, **HF_TINY).save_pretrained(path)
    return str(path)


def _hf(path: str, **kw) -> TrialConfig:
    spec = WorkloadSpec(hf_model=path, seq_len=16, global_batch_size=4)
    return dataclasses.replace(BASE, workload=spec, **kw)


def _run_all(rank: int, configs: list[TrialConfig], control: TrialConfig | None) -> dict:
    """Each config through the runner on one process group; then, if given, ``control`` with
    FSDP2's all-reduce across replica groups planted away (the bug the control plants)."""
    from autotune.trial.runner import run_rank

    out = {"results": [run_rank(c) for c in configs]}
    if control is not None:
        from torch.distributed.fsdp._fully_shard import _fsdp_collectives

        class _NoAllReduce:
            def __getattr__(self, name):
                import torch.distributed as dist

                return (lambda *a, **k: None) if name == "all_reduce" else getattr(dist, name)

        _fsdp_collectives.dist = _NoAllReduce()
        out["control"] = run_rank(control).losses
    return out


def _check_losses(config: TrialConfig, losses: list[float]) -> None:
    expected = reference_losses(config, NUM_STEPS)
    assert len(losses) == NUM_STEPS
    assert max(abs(a - b) for a, b in zip(losses, expected)) <= LOSS_ATOL, (losses, expected)
    assert abs(losses[-1] - losses[0]) > 1e-3  # it trains


@pytest.fixture(scope="module")
def hsdp(tmp_path_factory):
    llama = _hf(
        _llama_dir(tmp_path_factory.mktemp("hf"), 4),
        zero_stage=3,
        micro_batch_size=1,
        num_profiled_steps=0,
        num_timed_steps=2,
    )
    configs = HSDP_GPT + [llama]
    control = dataclasses.replace(HSDP_GPT[0], num_profiled_steps=0, num_timed_steps=2)
    ranks = run_ranks(4, _run_all, configs, control, timeout=600.0)
    return configs, ranks, control


@pytest.mark.slow
def test_hsdp_matches_single_process(hsdp):
    configs, ranks, _ = hsdp
    for i, config in enumerate(configs):
        results = [r["results"][i] for r in ranks]
        assert sorted(r.dp_rank for r in results) == [0, 1, 2, 3]
        _check_losses(config, results[0].losses)


@pytest.mark.slow
def test_hsdp_shards_within_the_replica_group(hsdp):
    """Parameters are 1/dp_shard per rank (not 1/dp: replicas hold the same shards)."""
    configs, ranks, _ = hsdp
    params = 4 * _num_params(configs[0])
    for i in (0, 1):
        for r in ranks:
            assert r["results"][i].memory.parameters == params // configs[i].dp_shard


@pytest.mark.slow
@pytest.mark.parametrize("which", [0, 1], ids=["zero3", "zero2"])
def test_hsdp_moves_reduce_scatter_in_shard_and_all_reduce_across_replicas(hsdp, which):
    from profiler import bytes_per_step

    configs, ranks, _ = hsdp
    config = configs[which]
    full = 4 * _num_params(config)
    gathers = config.grad_accum_steps * (2 if config.zero_stage == 3 else 1)
    spans = [s for r in ranks for s in r["results"][which].spans]
    for rank, moved in bytes_per_step(spans).items():
        assert moved == {
            ("comm", "reduce_scatter", "dp_shard"): full,
            ("comm", "all_reduce", "dp_replicate"): full / config.dp_shard,
            ("comm", "all_gather", "dp_shard"): gathers * full,
        }, rank


@pytest.mark.slow
def test_hsdp_without_the_replica_all_reduce_is_detected(hsdp):
    """Negative control: each replica group trains on its half of the batch alone."""
    _, ranks, control = hsdp
    expected = reference_losses(control, NUM_STEPS)
    losses = ranks[0]["control"]
    assert losses[0] == pytest.approx(expected[0], abs=LOSS_ATOL)  # same start
    assert max(abs(a - b) for a, b in zip(losses, expected)) > 10 * LOSS_ATOL


def _num_params(config: TrialConfig) -> int:
    shapes = [p.shape for p in build_workload(config.workload).model.parameters()]
    assert all(s[0] % config.dp_shard == 0 for s in shapes)  # no FSDP2 padding
    return sum(math.prod(s) for s in shapes)


@pytest.mark.slow
def test_interleaved_virtual_stages_match_single_process(tmp_path):
    """pp 2 × 4 virtual stages (8 stages, a layer each) and × 3 (6 stages over 8 layers)."""
    path = _llama_dir(tmp_path, 8)
    configs = [
        _hf(
            path,
            world_size=2,
            dp_replicate=1,
            pp_degree=2,
            micro_batch_size=1,
            pp_schedule="interleaved_1f1b",
            virtual_stages=v,
            num_profiled_steps=0,
            num_timed_steps=2,
        )
        for v in (4, 3)
    ]
    ranks = run_ranks(2, _run_all, configs, None, timeout=600.0)
    for i, config in enumerate(configs):
        assert config.num_pp_stages == 2 * config.virtual_stages
        _check_losses(config, ranks[-1]["results"][i].losses)
