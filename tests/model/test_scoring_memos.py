"""``rank`` scores hundreds of thousands of layouts by sharing work between those that differ only
in how data parallelism shards and synchronises (ZeRO stage, HSDP, bucket, overlap). Each
shortcut must give what the model gives without it: a memoised estimate equals a fresh one on
every layout of a grid that varies every knob, the distributed optimizer's partition equals its
rank-by-rank definition, and ``with_fields`` equals ``dataclasses.replace``."""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import random

import pytest

from autotune.config import TrialConfig, WorkloadSpec, with_fields
from autotune.model import engine_memory, memory
from autotune.model.cluster import load_cluster
from autotune.model.engine_memory import MEMORY_TRAITS
from autotune.model.engines import engine_traits
from autotune.model.perf_model import StepTimeModel
from autotune.search.space import SearchSpace


@pytest.fixture(scope="module")
def grid() -> list[TrialConfig]:
    """Every layout of the tiny GPT on 16 GPUs with SP, cp 2, HSDP 2/4 and 2/4 virtual stages:
    27,464 layouts, among them every ZeRO stage, overlap and bucket of each pipeline layout."""
    base = TrialConfig(
        workload=WorkloadSpec(family="gpt", size="tiny", seq_len=256, global_batch_size=32),
        world_size=16,
        device="cuda",
        precision="bf16-mixed",
    )
    choices = {
        "sequence_parallel": [False, True],
        "cp_degree": [1, 2],
        "dp_replicate": [1, 2, 4],
        "virtual_stages": [2, 4],
    }
    return SearchSpace(base, narrowed=choices).configs


@pytest.fixture(scope="module")
def medium_grid() -> list[TrialConfig]:
    """The GPT-medium on 8 GPUs: a block of 50 MB in fp32 shards, so the buckets (5, 25 and
    100 MB) group one to four blocks into an FSDP unit."""
    base = TrialConfig(
        workload=WorkloadSpec(family="gpt", size="medium", seq_len=512, global_batch_size=16),
        world_size=8,
        device="cuda",
        precision="bf16-mixed",
    )
    return SearchSpace(base).configs


@pytest.mark.parametrize("which", ["grid", "medium_grid"])
def test_shared_memory_estimates_equal_fresh_ones(which, request):
    grid = request.getfixturevalue(which)
    memory._STAGES.clear()
    memory._ACTIVATIONS.clear()
    shared = [memory.estimate_memory(c, device_type="cuda", checked=True) for c in grid]
    assert memory._STAGES._values, "the memo was not used"
    for config, got in zip(grid, shared):
        memory._STAGES.clear()
        memory._ACTIVATIONS.clear()
        fresh = memory.estimate_memory(config, device_type="cuda", checked=True)
        assert got == fresh, config


@pytest.mark.parametrize("engine", ["megatron", "torchtitan", "deepspeed"])
def test_shared_engine_estimates_equal_fresh_ones(grid, engine):
    traits = MEMORY_TRAITS[engine]
    engine_memory._ENGINE_ESTIMATES.clear()
    shared = [engine_memory.estimate_engine_memory(c, None, traits) for c in grid[::2]]
    assert len(engine_memory._ENGINE_ESTIMATES._values) < len(shared) / 2
    for config, got in zip(grid[::2], shared):
        engine_memory._ENGINE_ESTIMATES.clear()
        assert got == engine_memory.estimate_engine_memory(config, None, traits), config


@pytest.mark.parametrize("engine", ["megatron", "torchtitan", "deepspeed"])
def test_a_screens_refusal_stands_for_no_layouts_worst_rank(grid, engine):
    # rank's screen estimates pipeline rank 0 first and drops a layout whose rank 0 cannot fit;
    # that estimate is not the worst rank's, so no later estimate may take it for one.
    traits = MEMORY_TRAITS[engine]
    piped = [c for c in grid[::2] if c.pp_degree > 1]
    engine_memory._ENGINE_ESTIMATES.clear()
    refused = [
        engine_memory.estimate_engine_memory(c, None, traits, screen=lambda b: False) for c in piped
    ]
    worst = [engine_memory.estimate_engine_memory(c, None, traits) for c in piped]
    assert any(w.stage != 0 and w.total > r.total for r, w in zip(refused, worst))
    for config, r, w in zip(piped, refused, worst):
        engine_memory._ENGINE_ESTIMATES.clear()
        fresh = engine_memory.estimate_engine_memory(config, None, traits)
        assert w == fresh, config
        assert r.stage == 0 and r.total <= fresh.total, config
    # A screen that lets rank 0 pass gets the worst rank, rank 0's estimate reused.
    engine_memory._ENGINE_ESTIMATES.clear()
    passed = [
        engine_memory.estimate_engine_memory(c, None, traits, screen=lambda b: True) for c in piped
    ]
    assert passed == worst


def test_shared_activation_bounds_equal_fresh_ones(grid):
    memory._ACTIVATION_BOUNDS.clear()
    shared = [memory.activation_lower_bound(c, c.workload.shape, device_type="cuda") for c in grid]
    for config, got in zip(grid, shared):
        memory._ACTIVATION_BOUNDS.clear()
        assert got == memory.activation_lower_bound(
            config, config.workload.shape, device_type="cuda"
        )


@pytest.mark.parametrize("engine", ["autotune", "megatron"])
def test_shared_step_times_equal_fresh_ones(grid, engine):
    cluster = load_cluster("a100-sxm4-80gb", nodes=2)
    traits = engine_traits(engine)
    model = StepTimeModel(cluster, engine=traits)
    for config in grid[::3]:
        fresh = StepTimeModel(cluster, engine=traits).predict(config)
        assert model.predict(config) == fresh, config
    assert len(model._shared._values) < len(grid[::3]) / 4  # shared, not one per layout


def _partition_by_rank(sizes, n, bucket_numel, state_bytes_per_element):
    """The distributed optimizer's partition as its docstring defines it, rank by rank."""
    elements, tensors = [0] * n, [0] * n
    largest = 0
    for start, stop, total in memory.flat_buckets(sizes, bucket_numel):
        share = -(-total // n)
        largest = max(largest, share * n)
        ends = list(itertools.accumulate(sizes[start:stop]))
        for r in range(n):
            lo, hi = r * share, min((r + 1) * share, total)
            if lo < hi:
                elements[r] += hi - lo
                tensors[r] += bisect.bisect_left(ends, hi) - bisect.bisect_right(ends, lo) + 1
    worst = max(range(n), key=lambda r: state_bytes_per_element * elements[r] + 4 * tensors[r])
    return elements[worst], tensors[worst], largest


def test_flat_partition_equals_its_rank_by_rank_definition():
    rng = random.Random(0)
    for _ in range(400):
        sizes = tuple(rng.choice((1, 7, 64, 1000, 4096, 65_536)) for _ in range(rng.randint(1, 60)))
        n = rng.choice((1, 2, 3, 8, 13, 64))
        bucket = rng.choice((1, 100, 5000, 200_000))
        per_element = rng.choice((8, 12, 16))
        assert memory._flat_partition.__wrapped__(
            sizes, n, bucket, per_element
        ) == _partition_by_rank(sizes, n, bucket, per_element), (sizes, n, bucket)


def test_with_fields_equals_dataclasses_replace(grid):
    changes = {"bucket_mb": 5.0, "overlap_enabled": False, "zero_stage": 3, "compile": True}
    for config in grid[::500]:
        assert with_fields(config, **changes) == dataclasses.replace(config, **changes)
    with pytest.raises(AttributeError):
        with_fields(grid[0], bucket=5.0)
