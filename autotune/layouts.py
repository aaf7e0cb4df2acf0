"""Enumerate every valid configuration of a workload on a world size (the exhaustive grid).

Parallel degrees range over the divisors of the world size, micro-batch sizes over the divisors
of the per-data-parallel-rank batch; a combination is kept only if ``validate`` accepts it. With
dp_degree 1 the ZeRO stage has no effect (nothing to shard) and only stage 0 is listed unless
``dedupe_zero_at_dp1`` is False.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Sequence

from autotune.config import CHECKPOINTING_MODES, PP_SCHEDULES, ZERO_STAGES, TrialConfig
from autotune.errors import ConfigError


DEFAULT_BUCKET_MB = TrialConfig().bucket_mb
"""``TrialConfig``'s default gradient bucket (a name omits it; the baselines prefer it)."""
KNOB_ORDER = ("tp_degree", "pp_degree", "pp_schedule", "zero_stage", "overlap_enabled",
              "micro_batch_size", "activation_checkpointing", "bucket_mb")
"""The knobs a search chooses, in the order it asks them and a report lists them."""


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def enumerate_configs(
    base: TrialConfig,
    *,
    zero_stages: Sequence[int] = ZERO_STAGES,
    activation_checkpointing: Sequence[str] = CHECKPOINTING_MODES,
    pp_schedules: Sequence[str] = PP_SCHEDULES,
    overlap: Sequence[bool] = (True,),
    tp_degrees: Sequence[int] | None = None,
    pp_degrees: Sequence[int] | None = None,
    dedupe_zero_at_dp1: bool = True,
) -> Iterator[TrialConfig]:
    """Yield every valid config that differs from ``base`` in the given knobs."""
    world = base.world_size
    global_batch = base.workload.global_batch_size
    for tp, pp in itertools.product(tp_degrees or divisors(world), pp_degrees or divisors(world)):
        if world % (tp * pp):
            continue
        dp = world // (tp * pp)
        if global_batch % dp:
            continue
        schedules = pp_schedules if pp > 1 else (base.pp_schedule,)
        stages = (0,) if dp == 1 and dedupe_zero_at_dp1 else zero_stages
        for micro, zero, ac, schedule, ov in itertools.product(
                divisors(global_batch // dp), stages, activation_checkpointing, schedules,
                overlap):
            config = dataclasses.replace(
                base, tp_degree=tp, pp_degree=pp, micro_batch_size=micro, zero_stage=zero,
                activation_checkpointing=ac, pp_schedule=schedule, overlap_enabled=ov)
            try:
                config.validate()
            except ConfigError:
                continue
            yield config


def short_name(c: TrialConfig) -> str:
    """A compact id: w4-tp2-pp1-dp2-z3-mb2x2-ac_full[-1f1b][-noov][-b5] (the bucket where
    there is a gradient sync and it is not the default)."""
    name = (f"w{c.world_size}-tp{c.tp_degree}-pp{c.pp_degree}-dp{c.dp_degree}-z{c.zero_stage}"
            f"-mb{c.micro_batch_size}x{c.grad_accum_steps}-ac_{c.activation_checkpointing}")
    if c.pp_degree > 1:
        name += f"-{c.pp_schedule}"
    if not c.overlap_enabled:
        name += "-noov"
    if c.dp_degree > 1 and c.bucket_mb != DEFAULT_BUCKET_MB:
        name += f"-b{c.bucket_mb:g}"
    return name
