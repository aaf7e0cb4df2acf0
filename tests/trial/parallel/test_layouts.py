"""Every valid parallel layout trains the same model as a single process.

For world sizes 2 and 4 (four ranks share two cores) each valid combination of ZeRO stage ×
tp × pp (× schedule) × accumulation × activation checkpointing (recomputation at 2
accumulation steps; see ALL) runs 2 AdamW steps of the tiny workload through the Ray executor;
every step's loss must equal the single-process reference.

Tolerance: |Δloss| ≤ 2e-5 absolute at losses ≈ 6.2, i.e. ≈ 3e-6 relative — fp32 summation-order
noise (observed ≤ 1e-6). A layout that skips a gradient sync or mis-scales accumulation moves the
loss by > 1e-3 within 2 steps at lr 1e-3 (see test_wrong_layout_is_detected). Mixed precision
runs 4 steps against the mixed reference within ``reference.BF16_LOSS_ATOL``, with its own
negative control (test_wrong_mixed_precision_layout_is_detected).
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
from reference import reference_losses

from autotune.config import TrialConfig, WorkloadSpec
from autotune.layouts import enumerate_configs, short_name

LOSS_ATOL = 2e-5
NUM_STEPS = 2  # 1 timed step + 1 memory step

BASE = TrialConfig(num_warmup_steps=0, num_timed_steps=1, num_profiled_steps=0, device="cpu")


# HSDP layouts (dp_replicate 2, in the default space) run in
# tests/trial/parallel/test_hsdp_vpp.py: the grid here keeps one replica group, as before them
# (they would add 66 layouts).
WITHOUT_HSDP = {"dp_replicate": (1,)}
ONLY_CP1 = {"cp_degree": (1,)}
"""The grids here are the layouts without context parallelism
(tests/trial/parallel/test_context_parallel.py checks those)."""


def _configs(world: int, **kwargs) -> list[TrialConfig]:
    return list(
        enumerate_configs(
            dataclasses.replace(BASE, world_size=world), extra=WITHOUT_HSDP | ONLY_CP1, **kwargs
        )
    )


def _zero1_of_dtensors(c: TrialConfig) -> bool:
    """ZeRO-1 by the distributed optimizer (TP's DTensors, or replicate's under a pipeline)."""
    return (
        c.zero_stage == 1
        and c.dp_degree > 1
        and (c.tp_degree > 1 or (c.pp_degree > 1 and c.overlap_enabled))
    )


# Trimmed for the suite's time (the multi-node tests joined it; 274 configurations before):
# - recomputation runs with 2 accumulation steps (micro-batches of a pipeline): it wraps each
#   block alike on every micro-batch, so 2 cover recomputing under accumulation and under
#   every schedule's interleaving of forwards and backwards (each layout still runs each
#   recomputation mode); all depths (1-8) run without it, except that without a pipeline
#   (where accumulation is the same no-sync loop at any depth) only 1 and 2 run;
# - under a pipeline, recomputation runs as "full": "selective" differs from it only inside
#   a block, which every ZeRO stage and TP degree cover without a pipeline;
# - the distributed optimizer acts only after the last backward, so its layouts run without
#   recomputation and with at most 2 accumulation steps (checkpointing and longer
#   accumulation under the same wrappers are covered at ZeRO-0; LLAMA adds it with full
#   recomputation). 7 of its 33 configurations are kept.
# - sequence parallelism and op-level recomputation (and ac_layers) run in NEWER_KNOBS below,
#   on the layouts they change (TP regions, ZeRO-3 and pipeline stages around them), not
#   across the whole grid (which they would double).
ALL = [
    c
    for c in _configs(2) + _configs(4)
    if not c.sequence_parallel
    and c.activation_checkpointing != "op"
    and (
        c.grad_accum_steps == 2
        if c.activation_checkpointing != "none"
        else c.grad_accum_steps <= 2 or c.pp_degree > 1
    )
    and not (c.pp_degree > 1 and c.activation_checkpointing == "selective")
    # 8 micro-batches of a pipeline run at world 2; at world 4 depths 1, 2 and 4 cover the
    # schedules' warm-up, steady state and drain on 2 stages
    and not (c.world_size == 4 and c.pp_degree > 1 and c.grad_accum_steps == 8)
    and (
        not _zero1_of_dtensors(c)
        or (c.activation_checkpointing == "none" and c.grad_accum_steps <= 2)
    )
]
# The non-overlapped sync path on every data-parallel layout, with 2 accumulation steps: the
# bucketed all-reduce runs once per optimizer step, after the last, so 2 steps cover a step
# that skips it and the one that runs it, and more add nothing new.
NO_OVERLAP = [
    c
    for c in _configs(2, overlap=(False,), activation_checkpointing=("none",))
    + _configs(4, overlap=(False,), activation_checkpointing=("none",))
    if c.dp_degree > 1
    and c.grad_accum_steps == 2
    and not c.sequence_parallel
    # the bucketed all-reduce runs after the last backward whatever the schedule: one
    # schedule (1F1B) stands for the three under a pipeline
    and (c.pp_degree == 1 or c.pp_schedule == "1f1b")
]
LLAMA_BASE = dataclasses.replace(
    BASE, world_size=4, attention="eager", workload=WorkloadSpec(family="llama", size="tiny")
)
# Llama's blocks under every layout with one micro-batch per step (accumulation itself is
# model-independent and covered by ALL), with full recomputation: each block's forward runs as
# without it (the same code, its activations dropped) and again in the backward.
LLAMA = [
    c
    for c in enumerate_configs(
        LLAMA_BASE, activation_checkpointing=("full",), extra=WITHOUT_HSDP | ONLY_CP1
    )
    if c.grad_accum_steps == 1 and not c.sequence_parallel
]
# Sequence parallelism (tp 2: norms on sequence shards, reduce-scatter and all-gather instead of
# all-reduce), alone, under ZeRO 0, 1 and 3 at dp 2 and under a pipeline (whose stages gather
# the sequence at their ends), with each recomputation that replays its collectives; op-level
# recomputation and full recomputation of the first ac_layers blocks with and without TP; on
# GPT (LayerNorm, GELU) and Llama (RMSNorm, SwiGLU, grouped KV heads, eager attention).
NEWER_KNOBS = [
    dataclasses.replace(BASE, **layout)
    for layout in (
        dict(world_size=2, tp_degree=2, sequence_parallel=True, micro_batch_size=4),
        dict(
            world_size=2,
            tp_degree=2,
            sequence_parallel=True,
            micro_batch_size=4,
            activation_checkpointing="op",
        ),
        dict(
            world_size=2,
            tp_degree=2,
            sequence_parallel=True,
            micro_batch_size=4,
            activation_checkpointing="full",
            ac_layers=1,
        ),
        dict(world_size=2, micro_batch_size=2, activation_checkpointing="op", zero_stage=3),
        dict(world_size=2, micro_batch_size=2, activation_checkpointing="full", ac_layers=1),
        dict(world_size=4, tp_degree=2, sequence_parallel=True, micro_batch_size=2, zero_stage=3),
        dict(world_size=4, tp_degree=2, sequence_parallel=True, micro_batch_size=2, zero_stage=1),
        dict(
            world_size=4,
            tp_degree=2,
            sequence_parallel=True,
            micro_batch_size=2,
            zero_stage=0,
            activation_checkpointing="selective",
        ),
        dict(world_size=4, tp_degree=2, pp_degree=2, sequence_parallel=True, micro_batch_size=4),
        dict(
            world_size=4,
            tp_degree=2,
            pp_degree=2,
            sequence_parallel=True,
            micro_batch_size=4,
            activation_checkpointing="full",
            ac_layers=1,
            pp_schedule="gpipe",
        ),
    )
] + [
    dataclasses.replace(LLAMA_BASE, **layout)
    for layout in (
        dict(world_size=2, tp_degree=2, sequence_parallel=True, micro_batch_size=4),
        dict(
            world_size=4,
            tp_degree=2,
            sequence_parallel=True,
            micro_batch_size=4,
            zero_stage=3,
            activation_checkpointing="op",
        ),
    )
]


@functools.cache
def _reference(
    workload: WorkloadSpec, attention: str, num_steps: int = NUM_STEPS
) -> tuple[float, ...]:
    config = dataclasses.replace(BASE, workload=workload, attention=attention)
    return tuple(reference_losses(config, num_steps))


def _check(executor, config: TrialConfig) -> None:
    result = executor.run(config)
    expected = _reference(config.workload, config.attention)
    assert len(result.losses) == NUM_STEPS
    diffs = [abs(a - b) for a, b in zip(result.losses, expected)]
    assert max(diffs) <= LOSS_ATOL, (short_name(config), result.losses, expected)
    # The model must actually train: the loss moves between steps.
    assert abs(result.losses[-1] - result.losses[0]) > 1e-3


def test_grid_covers_every_layout():
    layouts = {(c.world_size, c.tp_degree, c.pp_degree) for c in ALL}
    assert layouts == {
        (2, 1, 1),
        (2, 2, 1),
        (2, 1, 2),
        (4, 1, 1),
        (4, 2, 1),
        (4, 4, 1),
        (4, 1, 2),
        (4, 2, 2),
        (4, 1, 4),
    }
    assert {c.zero_stage for c in ALL if c.dp_degree > 1} == {0, 1, 2, 3}
    # ZeRO-1 of DTensor parameters: with TP, and under a pipeline with overlap on.
    assert any(c.zero_stage == 1 and c.tp_degree == 2 and c.dp_degree == 2 for c in ALL)
    assert any(
        c.zero_stage == 1 and c.pp_degree == 2 and c.dp_degree == 2 and c.overlap_enabled
        for c in ALL
    )
    assert {c.grad_accum_steps for c in ALL} >= {1, 2, 4, 8}
    assert {c.pp_schedule for c in ALL if c.pp_degree > 1} == {"gpipe", "1f1b", "interleaved_1f1b"}


@pytest.mark.slow
@pytest.mark.parametrize("config", ALL, ids=short_name)
def test_layout_matches_single_process(executor, config):
    _check(executor, config)


@pytest.mark.parametrize("config", NO_OVERLAP, ids=short_name)
def test_non_overlapped_sync_matches_single_process(executor, config):
    _check(executor, config)


@pytest.mark.parametrize("config", LLAMA, ids=short_name)
def test_llama_layout_matches_single_process(executor, config):
    """RoPE, RMSNorm, SwiGLU and grouped-query attention (2 KV heads: tp ≤ 2) under TP/PP/ZeRO."""
    _check(executor, config)


@pytest.mark.slow
@pytest.mark.parametrize(
    "config", NEWER_KNOBS, ids=lambda c: f"{c.workload.family}-{short_name(c)}"
)
def test_newer_knob_layout_matches_single_process(executor, config):
    _check(executor, config)


def _train_without_reduce_scatter(rank: int, config: TrialConfig) -> list[float]:
    from torch.distributed.tensor import DTensor, Replicate
    from torch.distributed.tensor.parallel import RowwiseParallel

    from autotune.trial.runner import run_rank

    def partial_kept(output_layouts, use_local_output, mod, outputs, device_mesh):
        # the bug this control plants: each rank keeps its sequence slice of its own partial
        # sum, as if the rowwise output were already reduced
        local = DTensor.from_local(outputs.to_local(), device_mesh, [Replicate()], run_check=False)
        return local.redistribute(placements=output_layouts).to_local()

    RowwiseParallel._prepare_output_fn = staticmethod(partial_kept)
    return run_rank(config).losses


@pytest.mark.slow
def test_sequence_parallel_without_reduce_scatter_is_detected():
    """Negative control: sequence parallelism whose rowwise outputs skip the reduce-scatter
    fails the tolerance."""
    from spawn import run_ranks

    config = NEWER_KNOBS[0]
    losses = run_ranks(2, _train_without_reduce_scatter, config)[0]
    expected = _reference(config.workload, config.attention)
    assert max(abs(a - b) for a, b in zip(losses, expected)) > 50 * LOSS_ATOL


def _train_without_grad_sync(rank: int, config: TrialConfig) -> list[float]:
    from autotune.trial.parallel import zero
    from autotune.trial.runner import run_rank

    zero.BucketedAllReduce.__call__ = lambda self: None  # the bug this control plants
    return run_rank(config).losses


def test_wrong_layout_is_detected():
    """Negative control: data parallelism without gradient averaging fails the tolerance."""
    from spawn import run_ranks

    config = dataclasses.replace(BASE, world_size=2, micro_batch_size=4, overlap_enabled=False)
    losses = run_ranks(2, _train_without_grad_sync, config)[0]
    expected = _reference(config.workload, config.attention)
    assert losses[0] == pytest.approx(expected[0], abs=LOSS_ATOL)  # same start
    assert max(abs(a - b) for a, b in zip(losses, expected)) > 50 * LOSS_ATOL


# Mixed precision, trimmed: the precision code changes the parameters' dtype at rest, the
# optimizer (master-weight AdamW, or FSDP2's MixedPrecisionPolicy) and, for 16-mixed, the loss
# scale; so each mechanism that holds parameters or drives backward runs once per mixed
# precision rather than the whole grid: DDP with accumulation and the bucketed all-reduce, ZeRO-1
# (master copy inside ZeroRedundancyOptimizer), ZeRO-2/3 (FSDP2), TP's DTensors, a pipeline
# schedule (the scaled loss inside the schedule), and FSDP2 under TP and PP. ZeRO 0-3 at dp 4
# are also checked by tests/trial/parallel/test_zero_sharding.py.
PRECISION_LAYOUTS = [  # run grouped by world size (tests/world_order.py), as every layout here
    dict(precision="bf16-mixed", world_size=4, tp_degree=2, zero_stage=3),
    # sequence parallelism's replicated norm parameters under FSDP2's mixed-precision policy
    dict(precision="bf16-mixed", world_size=4, tp_degree=2, zero_stage=3, sequence_parallel=True),
    dict(precision="bf16-mixed", world_size=4, pp_degree=2, zero_stage=2, micro_batch_size=2),
    # ZeRO-1 of TP's DTensors: the distributed optimizer keeps the master copy of its slices
    dict(precision="bf16-mixed", world_size=4, tp_degree=2, zero_stage=1),
    dict(precision="bf16-mixed", micro_batch_size=2, overlap_enabled=False),
    dict(precision="bf16-mixed", micro_batch_size=2, zero_stage=1),
    dict(precision="bf16-mixed", tp_degree=2),
    dict(precision="bf16-mixed", pp_degree=2, micro_batch_size=2),
    dict(precision="16-mixed", micro_batch_size=2, zero_stage=0),
    dict(precision="16-mixed", micro_batch_size=2, zero_stage=3),
    dict(precision="16-mixed", pp_degree=2, micro_batch_size=2, pp_schedule="gpipe"),
]


PRECISION_STEPS = 4  # 3 timed steps + the memory step
"""More than NUM_STEPS: under a pipeline a skipped gradient sync moves the bf16-mixed loss by
only 4.0e-4 in 2 steps, inside BF16_LOSS_ATOL, and by 5.7e-3 in 3 (tests/reference.py)."""


@functools.cache
def _precision_reference(
    workload: WorkloadSpec, attention: str, precision: str
) -> tuple[float, ...]:
    config = dataclasses.replace(BASE, workload=workload, attention=attention)
    return tuple(reference_losses(config, PRECISION_STEPS, precision))


def _precision_config(layout: dict) -> TrialConfig:
    return dataclasses.replace(
        BASE, **{"world_size": 2, "num_timed_steps": PRECISION_STEPS - 1, **layout}
    )


@pytest.mark.parametrize(
    "config",
    [_precision_config(layout) for layout in PRECISION_LAYOUTS],
    ids=lambda c: f"{c.precision}-{short_name(c)}",
)
def test_mixed_precision_matches_the_mixed_reference(executor, config):
    """Per-step losses within BF16_LOSS_ATOL of the single-process reference in the same mixed
    precision, and within MIXED_VS_FP32_LOSS_ATOL of fp32 (tests/reference.py states both)."""
    from reference import BF16_LOSS_ATOL, MIXED_VS_FP32_LOSS_ATOL

    result = executor.run(config)
    assert result.config["precision"] == config.precision  # stored as run
    mixed = _precision_reference(config.workload, config.attention, config.precision)
    assert result.losses == pytest.approx(mixed, abs=BF16_LOSS_ATOL), result.losses
    fp32 = _reference(config.workload, config.attention, PRECISION_STEPS)
    assert result.losses == pytest.approx(fp32, abs=MIXED_VS_FP32_LOSS_ATOL)
    assert result.losses != pytest.approx(fp32, abs=1e-7)  # half precision really ran


def test_wrong_mixed_precision_layout_is_detected():
    """Negative control of BF16_LOSS_ATOL: the same planted bug as test_wrong_layout_is_detected
    (data parallelism without gradient averaging), trained in bf16-mixed for PRECISION_STEPS,
    fails the comparison test_mixed_precision_matches_the_mixed_reference makes."""
    from reference import BF16_LOSS_ATOL
    from spawn import run_ranks

    config = _precision_config(
        dict(precision="bf16-mixed", micro_batch_size=4, overlap_enabled=False)
    )
    losses = run_ranks(2, _train_without_grad_sync, config)[0]
    expected = _precision_reference(config.workload, config.attention, config.precision)
    assert losses[0] == pytest.approx(expected[0], abs=BF16_LOSS_ATOL)  # same start
    assert losses != pytest.approx(expected, abs=BF16_LOSS_ATOL)
    # measured 1.1e-2 (step 3), against ≤ 2.2e-4 for every right layout
    assert max(abs(a - b) for a, b in zip(losses, expected)) > 10 * BF16_LOSS_ATOL
