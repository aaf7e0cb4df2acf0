"""ZeRO really shards: measured per-rank bytes of parameters, gradients and optimizer state.

World 4, dp 4, tiny GPT in fp32 with AdamW (two fp32 moments per parameter plus one fp32 step
counter per parameter tensor). What the ZeRO paper partitions over N = dp ranks
(Rajbhandari et al. 2020, §5): stage 1 the optimizer state, stage 2 also gradients, stage 3 also
parameters. FSDP2 (our stages 2 and 3) shards every tensor on dim 0, padded to a multiple of N,
and keeps parameters sharded at rest in both stages; stage 2 differs by keeping them gathered from
forward through backward. Expected figures are computed from the model's shapes, not from a run.

Tolerances: unsharded quantities and FSDP shards are exact (padding included); the step counters
are allowed as 8 bytes per tensor; ZeRO-1 partitions whole tensors greedily, so a rank's optimizer
share may exceed 1/N of the total by at most the state of the largest tensor.

ZeRO-1 where the parameters are DTensors (Megatron's distributed optimizer,
``parallel/distributed_optimizer.py``) runs at world 4 as tp 2 × dp 2 and as pp 2 × dp 2 with
overlap on (FSDP2's replicate). Its expected figures are the rank's own parameters (a TP rank
holds 1/tp of every block matrix — Megatron's column/row split — and all of the rest; a pipeline
rank its stage's layers with the embeddings or the final norm and head); each rank owns 1/N of every
bucket (bucket_mb 0.1 MB: several buckets), padded to a multiple of N, so its share of the moments
may exceed 1/N by the padding (N − 1 elements per bucket), and a tensor cut between two ranks has
a step counter on each. The same two trials record their collectives (two profiled steps), and
their data-parallel payloads are checked against the same expected parameters, under the payload
convention of ``tests/profiler/test_truth.py``.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import pytest
from reference import reference_losses

from autotune.config import TrialConfig
from autotune.model.memory import estimate_all_stages
from autotune.trial.models.build import build_workload

WORLD = 4
# bucket_mb 0.1: each ~0.2 MB block is its own FSDP unit (a larger bucket groups blocks).
CONFIG = TrialConfig(
    world_size=WORLD,
    micro_batch_size=2,
    num_warmup_steps=0,
    num_timed_steps=1,
    num_profiled_steps=0,
    device="cpu",
    bucket_mb=0.1,
)
STEP_BYTES = 8  # AdamW's per-tensor step counter (fp32 scalar, allowed up to 8 bytes)


def _shapes():
    model = build_workload(CONFIG.workload).model
    return [tuple(p.shape) for p in model.parameters()]


def _numel(shape) -> int:
    return math.prod(shape)


def _padded_shard_numel(shape, n: int) -> int:
    rows = math.ceil(shape[0] / n)
    return rows * _numel(shape[1:])


@pytest.fixture(scope="module")
def by_stage(executor):
    return {
        stage: executor.run(dataclasses.replace(CONFIG, zero_stage=stage)) for stage in (0, 1, 2, 3)
    }


def test_stage0_replicates_everything(by_stage):
    shapes = _shapes()
    full = 4 * sum(_numel(s) for s in shapes)
    for r in by_stage[0].ranks:
        assert r.memory.parameters == full
        assert r.memory.gradients == full
        assert 0 <= r.memory.optimizer_state - 2 * full <= STEP_BYTES * len(shapes)


def test_stage1_shards_optimizer_state_only(by_stage):
    shapes = _shapes()
    full = 4 * sum(_numel(s) for s in shapes)
    largest = 4 * max(_numel(s) for s in shapes)
    ranks = by_stage[1].ranks
    for r in ranks:
        assert r.memory.parameters == full
        assert r.memory.gradients == full
        assert r.memory.optimizer_state <= 2 * full / WORLD + 2 * largest + STEP_BYTES * len(shapes)
    total = sum(r.memory.optimizer_state for r in ranks)
    assert 0 <= total - 2 * full <= STEP_BYTES * len(shapes)  # every moment held exactly once


@pytest.mark.parametrize("stage", [2, 3])
def test_fsdp_stages_shard_parameters_gradients_and_state(by_stage, stage):
    shapes = _shapes()
    shard = 4 * sum(_padded_shard_numel(s, WORLD) for s in shapes)
    full = 4 * sum(_numel(s) for s in shapes)
    assert shard <= full / WORLD * 1.01  # padding costs under 1% on this model
    for r in by_stage[stage].ranks:
        assert r.memory.parameters == shard
        assert r.memory.gradients == shard
        assert 0 <= r.memory.optimizer_state - 2 * shard <= STEP_BYTES * len(shapes)


def _gathered_bytes(shapes) -> int:
    """fp32 bytes one FSDP2 all-gather of these parameters allocates: N padded shards each."""
    return 4 * WORLD * sum(_padded_shard_numel(s, WORLD) for s in shapes)


def test_stage3_gathers_less_than_stage2(by_stage):
    """The transient (activation + gathered-parameter) peak of stage 3 is below stage 2's by the
    gathered parameters stage 2 alone holds at the peaks, within bounds taken from FSDP2.

    Both keep the shards at rest (counted as parameters, not here). Each all-gather allocates
    the whole unsharded tensors of its unit (N × the padded shard), which a reshard frees.
    Stage 2 (``reshard_after_forward=False``) keeps every unit gathered from its forward until
    its backward, so its peak, at the start of backward (the loss's log-softmax backward, where
    the profiler's allocation events put it), holds all parameters gathered; stage 3 frees each
    unit after its forward (the root too: reshard_after_forward is given explicitly, so FSDP2
    does not keep the root gathered) and gathers it again in backward, one block ahead (FSDP2's
    backward prefetch, with overlap on or off). Hence
    - peak2 − peak3 ≤ all gathered parameters: at stage 2's peak moment stage 3 holds the
      same less those;
    - peak2 − peak3 ≥ L − 2 blocks' gathered parameters: at stage 3's peak (measured: the
      prefetching all-gather of block L − 2 inside block L − 1's backward) stage 2 holds what
      stage 3 holds plus the L − 2 blocks stage 3 has not gathered again yet.
    Measured at L = 4 blocks, N = 4: 886,272 bytes on every rank, inside [395,264, 1,118,720]. A
    stage 3 that kept its blocks gathered, or a stage 2 that freed them, measures ≈ 0."""
    model = build_workload(CONFIG.workload).model
    blocks = [[tuple(p.shape) for p in block.parameters()] for block in model.layers.values()]
    all_gathered = _gathered_bytes(_shapes())
    held_by_stage2_alone = sum(_gathered_bytes(b) for b in blocks[:-2])
    assert held_by_stage2_alone == 2 * 4 * 49_408  # 4·64² + 2·64·256 + 4·64 per block
    for r2, r3 in zip(by_stage[2].ranks, by_stage[3].ranks):
        difference = r2.memory.activations - r3.memory.activations
        assert held_by_stage2_alone <= difference <= all_gathered, (r2.rank, difference)


def test_all_stages_train_the_same_model(by_stage):
    losses = [by_stage[s].losses for s in (0, 1, 2, 3)]
    for other in losses[1:]:
        assert other == pytest.approx(losses[0], abs=2e-5)


# ---- ZeRO-1 with DTensor parameters: tensor parallelism, pipelines with overlap --------------
ZERO1_LAYOUTS = {"tp2xdp2": dict(tp_degree=2), "pp2xdp2": dict(pp_degree=2)}
TP_SPLIT = ("attention.w", "feed_forward.w")  # the block matrices Megatron splits by tp


def _local_numel(name: str, shape, tp: int) -> int:
    return _numel(shape) // (tp if any(k in name for k in TP_SPLIT) else 1)


def _stage_of(name: str, pp: int, num_layers: int) -> int:
    if name.startswith("layers."):
        return int(name.split(".")[1]) * pp // num_layers
    return 0 if "embeddings" in name else pp - 1


def _expected_local(config: TrialConfig, pp_rank: int) -> tuple[int, int]:
    """(elements, tensors) of one rank's parameters, from the model's shapes."""
    model = build_workload(config.workload).model
    named = [
        (n, tuple(p.shape))
        for n, p in model.named_parameters()
        if _stage_of(n, config.pp_degree, len(model.layers)) == pp_rank
    ]
    return sum(_local_numel(n, s, config.tp_degree) for n, s in named), len(named)


@pytest.fixture(scope="module")
def zero1_dtensor(executor):
    configs = {
        name: dataclasses.replace(CONFIG, zero_stage=1, num_profiled_steps=2, **layout)
        for name, layout in ZERO1_LAYOUTS.items()
    }
    return {name: (c, executor.run(c)) for name, c in configs.items()}


@pytest.mark.parametrize("layout", ZERO1_LAYOUTS)
def test_stage1_shards_optimizer_state_of_dtensor_parameters(zero1_dtensor, layout):
    config, result = zero1_dtensor[layout]
    n = config.dp_degree
    assert n == 2
    buckets = math.ceil(4 * _expected_local(config, 0)[0] / (config.bucket_mb * 2**20)) + 1
    moments_by_replica: dict[tuple[int, int], int] = {}
    for r in result.ranks:
        numel, tensors = _expected_local(config, r.pp_rank)
        local = 4 * numel
        assert r.memory.parameters == local  # whole: not sharded over dp
        assert r.memory.gradients == local
        share = r.memory.optimizer_state
        assert 2 * local / n - 2 * 4 * (n - 1) * buckets <= share
        assert share <= 2 * local / n + 2 * 4 * (n - 1) * buckets + STEP_BYTES * (tensors + buckets)
        key = (r.pp_rank, r.tp_rank)
        moments_by_replica[key] = moments_by_replica.get(key, 0) + share
    # The memory model reproduces the partition: its worst rank of each stage is the measured one.
    for e in estimate_all_stages(config):
        assert e.optimizer_state == max(
            r.memory.optimizer_state for r in result.ranks if r.pp_rank == e.stage
        )
    for (pp_rank, _), total in moments_by_replica.items():
        numel, tensors = _expected_local(config, pp_rank)
        # every moment held exactly once over the dp group
        assert 0 <= total - 2 * 4 * numel <= STEP_BYTES * (tensors + buckets)


@pytest.mark.parametrize("layout", ZERO1_LAYOUTS)
def test_stage1_with_dtensor_parameters_trains_the_reference_model(zero1_dtensor, layout):
    """The layout sweep's criterion (tests/trial/parallel/test_layouts.py): every step's loss
    equals the single-process reference within fp32 summation-order noise (2e-5 at loss ≈ 6.2)."""
    config, result = zero1_dtensor[layout]
    assert result.losses == pytest.approx(_reference(len(result.losses)), abs=2e-5)


@pytest.mark.parametrize("layout", ZERO1_LAYOUTS)
def test_stage1_with_dtensor_parameters_moves_the_local_parameters(zero1_dtensor, layout):
    """Profiler truth: per step, the gradients all-reduced once (on the last micro-batch) and the
    updated shares all-gathered once, each carrying exactly the rank's own parameters (fp32).
    Every tensor of this model has an even number of elements, so no bucket is padded at dp 2."""
    from profiler import bytes_per_step

    config, result = zero1_dtensor[layout]
    assert config.grad_accum_steps == 2
    per_step = bytes_per_step([s for r in result.ranks for s in r.spans])
    for r in result.ranks:
        numel, _ = _expected_local(config, r.pp_rank)
        assert numel % config.dp_degree == 0
        dp_bytes = {k: v for k, v in per_step[r.rank].items() if k[2] == "dp"}
        assert dp_bytes == {
            ("comm", "all_reduce", "dp"): 4 * numel,
            ("comm", "all_gather", "dp"): 4 * numel,
        }


@functools.cache
def _reference(num_steps: int) -> list[float]:
    return reference_losses(CONFIG, num_steps)


@pytest.mark.parametrize("n", [2, 3, 8])
def test_distributed_optimizer_shares_tile_every_parameter_once(n):
    """Without a process group: over n ranks (3 pads every bucket) the owned slices cover every
    element of every parameter exactly once, each bucket's shares are equal and padded by less
    than n, and the memory model's worst rank is the partition's."""
    from autotune.model.memory import _flat_partition
    from autotune.trial.parallel.distributed_optimizer import partition

    params = list(build_workload(CONFIG.workload).model.parameters())
    bucket_mb = 0.1
    covered = {id(p): [] for p in params}
    per_rank = []
    for rank in range(n):
        buckets = partition(params, n, rank, bucket_mb)
        for b in buckets:
            assert b.numel <= n * b.shard_numel < b.numel + n
        owned = [s for b in buckets for s in b.owned]
        for s in owned:
            covered[id(s.param)].append((s.start, s.stop))
            assert s.tensor.data_ptr() == s.param.data_ptr() + 4 * s.start  # a view, not a copy
        per_rank.append((sum(s.stop - s.start for s in owned), len(owned)))
    for p in params:
        spans = sorted(covered[id(p)])
        assert spans[0][0] == 0 and spans[-1][1] == p.numel()
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    worst = max(per_rank, key=lambda r: 8 * r[0] + 4 * r[1])
    sizes = tuple(p.numel() for p in params)
    assert _flat_partition(sizes, n, bucket_mb * 2**20 / 4, 8)[:2] == worst  # fp32 moments


# ---- mixed precision (bf16-mixed): the ZeRO paper's own setting ----------------------------
# Per element (parallel/precision.py): ZeRO-0/1 train a bf16 model (2 bytes of parameters and
# of gradients) whose optimizer holds an fp32 master copy and two fp32 moments (12 bytes, the
# paper's K = 12), ZeRO-1 sharding those 12 bytes greedily by whole tensors; FSDP2 (ZeRO-2/3)
# keeps fp32 shards as the master copy (4 + 4 bytes) and two fp32 moments (8 bytes) per shard
# element, gathering bf16 copies only for compute. Both are the paper's 16Φ at ZeRO-0.
MIXED = dataclasses.replace(CONFIG, precision="bf16-mixed", num_timed_steps=3)
MIXED_STEPS = 4  # 3 timed steps + the memory step
BF16, FP32 = 2, 4


@pytest.fixture(scope="module")
def mixed_by_stage(executor):
    return {
        stage: executor.run(dataclasses.replace(MIXED, zero_stage=stage)) for stage in (0, 1, 2, 3)
    }


def check_mixed_precision_bytes(result, stage: int) -> None:
    """Measured bytes per category of a bf16-mixed run against the formula above: parameters,
    gradients, the fp32 master copy (``master_copy_bytes``, part of the optimizer state) and
    the moments (the rest of it, less AdamW's step counters)."""
    shapes = _shapes()
    numel = sum(_numel(s) for s in shapes)
    shard = sum(_padded_shard_numel(s, WORLD) for s in shapes)
    largest = max(_numel(s) for s in shapes)
    ranks = result.ranks
    masters = [r.extra["master_copy_bytes"] for r in ranks]
    moments = [r.memory.optimizer_state - m for r, m in zip(ranks, masters)]
    steps = STEP_BYTES * len(shapes)
    for r, master, moment in zip(ranks, masters, moments):
        m = r.memory
        if stage <= 1:  # the bf16 model, whole on every rank
            assert m.parameters == BF16 * numel and m.gradients == BF16 * numel, stage
        else:  # fp32 shards (the master copy), fp32 gradient shards
            assert m.parameters == FP32 * shard and m.gradients == FP32 * shard, stage
        if stage == 0:  # master copy and moments of every parameter on every rank
            assert master == FP32 * numel and 0 <= moment - 2 * FP32 * numel <= steps
        elif stage == 1:  # ≈ 1/N of them, by whole tensors, moments beside their masters
            assert master <= FP32 * (numel / WORLD + largest)
            assert 0 <= moment - 2 * master <= steps
        else:  # no separate master; fp32 moments of the shard
            assert master == 0 and 0 <= moment - 2 * FP32 * shard <= steps
    if stage == 1:  # every master element held exactly once
        assert sum(masters) == FP32 * numel


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_mixed_precision_bytes_per_category(mixed_by_stage, stage):
    from autotune.model.memory import estimate_memory

    result = mixed_by_stage[stage]
    check_mixed_precision_bytes(result, stage)
    # The memory model predicts the worst rank's model states exactly (ZeRO-1's greedy split
    # included).
    est = estimate_memory(dataclasses.replace(MIXED, zero_stage=stage), device_type="cpu")
    for category in ("parameters", "gradients", "optimizer_state"):
        assert getattr(est, category) == max(getattr(r.memory, category) for r in result.ranks), (
            stage,
            category,
        )
    if stage == 0:  # the paper's 16Φ: 2 + 2 + 12 bytes per parameter
        numel = sum(_numel(s) for s in _shapes())
        m = result.ranks[0].memory
        states = m.parameters + m.gradients + m.optimizer_state
        assert 0 <= states - 16 * numel <= STEP_BYTES * len(_shapes())


def test_missing_master_copy_is_detected(executor):
    """Negative control: bf16-true (today's bfloat16: no fp32 master copy, bf16 moments) fails
    the mixed-precision byte check."""
    result = executor.run(dataclasses.replace(MIXED, zero_stage=1, precision="bf16-true"))
    with pytest.raises(AssertionError):
        check_mixed_precision_bytes(result, 1)


def test_mixed_precision_stages_match_the_reference(mixed_by_stage):
    """Every stage's bf16-mixed losses against the single-process bf16-mixed reference (bf16
    tolerance) and the fp32 reference (looser): see tests/reference.py for both."""
    from reference import BF16_LOSS_ATOL, MIXED_VS_FP32_LOSS_ATOL, reference_losses

    mixed = reference_losses(MIXED, MIXED_STEPS, "bf16-mixed")
    fp32 = reference_losses(MIXED, MIXED_STEPS)
    for stage, result in mixed_by_stage.items():
        assert result.losses == pytest.approx(mixed, abs=BF16_LOSS_ATOL), stage
        assert result.losses == pytest.approx(fp32, abs=MIXED_VS_FP32_LOSS_ATOL), stage
        assert result.losses != pytest.approx(fp32, abs=1e-7)  # bf16 really ran


# ---- bf16-mixed under a pipeline: pp 2 × dp 2, ZeRO-1 (the distributed optimizer) ------------
PP_MIXED = dataclasses.replace(MIXED, zero_stage=1, pp_degree=2)
"""World 4 as pp 2 × dp 2, overlap on (replicate's DTensors): each stage's bf16 model is whole
on both of its dp ranks, and its inner MasterWeightAdamW holds the fp32 master copy and two
fp32 moments of the half of every bucket the rank owns."""


@pytest.fixture(scope="module")
def pp_mixed(executor):
    return executor.run(PP_MIXED)


def test_bf16_pipeline_zero1_trains_the_mixed_reference_model(pp_mixed):
    """4 steps (a skipped gradient sync in this layout moves the loss by 5.7e-3 by the third:
    tests/reference.py) against the single-process bf16-mixed reference."""
    from reference import BF16_LOSS_ATOL, reference_losses

    assert pp_mixed.config["precision"] == "bf16-mixed"
    assert len(pp_mixed.losses) == MIXED_STEPS
    mixed = reference_losses(PP_MIXED, MIXED_STEPS, "bf16-mixed")
    assert pp_mixed.losses == pytest.approx(mixed, abs=BF16_LOSS_ATOL)
    assert pp_mixed.losses != pytest.approx(_reference(MIXED_STEPS), abs=1e-7)  # bf16 ran


def test_bf16_pipeline_zero1_shards_master_copy_and_moments(pp_mixed):
    """ZeRO-1 of the stage's Φ_s parameters over N = dp 2 (Rajbhandari et al. 2020, §5.1:
    K = 12 bytes of optimizer state per parameter, partitioned): 4Φ_s/N of fp32 master copy and
    8Φ_s/N of fp32 moments, beside 2Φ_s bf16 parameters and 2Φ_s bf16 gradients, whole.
    Every tensor has an even number of elements, so each bucket splits into two equal halves
    with no padding and the master copy is exact; the step counters add 4 bytes per owned slice
    (a tensor cut between the two ranks counts on both)."""
    n = PP_MIXED.dp_degree
    assert n == 2
    for r in pp_mixed.ranks:
        numel, tensors = _expected_local(PP_MIXED, r.pp_rank)
        buckets = math.ceil(BF16 * numel / (PP_MIXED.bucket_mb * 2**20)) + 1
        m, master = r.memory, r.extra["master_copy_bytes"]
        assert (m.parameters, m.gradients) == (BF16 * numel, BF16 * numel), r.rank
        assert master == FP32 * numel // n, r.rank
        assert 0 <= m.optimizer_state - 3 * FP32 * numel // n <= STEP_BYTES * (tensors + buckets)
