"""Enumerate every valid configuration of a workload on a world size (the exhaustive grid).

Parallel degrees range over the divisors of the world size, micro-batch sizes over the divisors
of the per-data-parallel-rank batch; a combination is kept only if ``validate`` accepts it. With
dp_degree 1 the ZeRO stage has no effect (nothing to shard) and only stage 0 is listed unless
``dedupe_zero_at_dp1`` is False.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator, Mapping, Sequence

from autotune.config import (
    CHECKPOINTING_MODES,
    PP_SCHEDULES,
    ZERO_STAGES,
    TrialConfig,
    ep_trial_refusal,
)
from autotune.errors import ConfigError
from autotune.knobs import (
    DEFAULT_BUCKET_MB,
    KNOB_BY_FIELD,
    KNOB_ORDER,
    KNOB_WORDS,
    SEARCHED_BY_DEFAULT,
    short_marks,
)
from autotune.parallel_dims import ParallelDims

# The knobs' tables are derived from their one declaration (``knobs.KNOBS``).
__all__ = [
    "DEFAULT_BUCKET_MB",
    "KNOB_ORDER",
    "KNOB_WORDS",
    "SEARCHED_BY_DEFAULT",
    "DEGREE_KNOBS",
    "degree_fields",
    "divisors",
    "enumerate_configs",
    "layout_degrees",
    "knobs_in_words",
    "short_name",
]


def knobs_in_words() -> str:
    """Every knob in ``KNOB_ORDER``'s order, in words: "tensor-parallel degree, …, and float8"."""
    words = [KNOB_WORDS[k] for k in KNOB_ORDER]
    return ", ".join(words[:-1]) + " and " + words[-1]


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


DEGREE_KNOBS = ("tp_degree", "pp_degree", "cp_degree", "ep_degree")
"""The degrees a layout enumerator walks, outermost first: knobs of the registry
(``knobs.KNOBS``), each a ``ParallelDims`` degree (its field less ``_degree``). Data
parallelism takes the rest of the world; HSDP's replicas are chosen per layout after. The
expert-parallel degree (``CARVED_DEGREES``) adds no ranks: it is carved from dp_shard × cp × tp."""

CARVED_DEGREES = ("ep_degree",)
"""Degrees carved from the others' ranks (torchtitan's rule: ep divides dp_shard × cp × tp),
not multiplied into the world. A bound that omits one takes 1: only a mixture of experts'
caller names ep's values, so a dense model's layouts are those it had before."""


def _dim(field: str) -> str:
    """A degree knob's ``ParallelDims`` name: its field less ``_degree``."""
    return field.removesuffix("_degree")


def degree_fields(dims: ParallelDims) -> dict[str, int]:
    """``dims``' ``DEGREE_KNOBS`` as the config's fields, to build a layout under them."""
    return {field: getattr(dims, _dim(field)) for field in DEGREE_KNOBS}


def layout_degrees(
    world: int, global_batch: int | None, bounds: Mapping[str, Sequence[int] | None]
) -> Iterator[ParallelDims]:
    """The one layout enumerator's degrees: each combination of ``bounds``' values (one list
    per ``DEGREE_KNOBS`` field, in that order; a field it omits or gives as None or empty
    takes its knob's search default where the registry declares one, else every divisor of
    the world) whose product divides the world and whose data-parallel degree divides the
    global batch (any, where it is None), as ``ParallelDims`` (dp_replicate 1). The search space
    (``enumerate_configs``) and ``rank`` (``ranking.space.screened_layouts``) pass their
    bounds; each builds its layouts under these degrees."""
    values = [_bound(field, bounds, world) for field in DEGREE_KNOBS]
    for degrees in itertools.product(*values):
        given = dict(zip(DEGREE_KNOBS, degrees))
        ranks = [d for f, d in given.items() if f not in CARVED_DEGREES]
        if world % math.prod(ranks):
            continue
        dims = ParallelDims.of(world, **{_dim(f): d for f, d in given.items()})
        if dims.dp_shard * dims.cp * dims.tp % dims.ep:
            continue
        if global_batch is None or global_batch % dims.dp == 0:
            yield dims


def _bound(field: str, bounds: Mapping[str, Sequence[int] | None], world: int) -> Sequence[int]:
    """``field``'s values for ``layout_degrees``: ``bounds``' where given, else 1 for a carved
    degree, else its knob's search default, else every divisor of the world."""
    if bounds.get(field):
        return bounds[field]
    if field in CARVED_DEGREES:
        return (1,)
    return KNOB_BY_FIELD[field].search_default or divisors(world)


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
    extra: dict[str, Sequence] | None = None,
) -> Iterator[TrialConfig]:
    """Yield every valid config that differs from ``base`` in the given knobs. ``extra`` maps
    the newer knobs (``SEARCHED_BY_DEFAULT``'s) to their values; those it omits take their
    default values."""
    global_batch = base.workload.global_batch_size
    newer = {**SEARCHED_BY_DEFAULT, **(extra or {})}
    bounds = {
        "tp_degree": tp_degrees or divisors(base.world_size),
        "pp_degree": pp_degrees or divisors(base.world_size),
        "cp_degree": newer["cp_degree"],
        "ep_degree": newer["ep_degree"] if _has_experts(base) else (1,),
    }
    for dims in layout_degrees(base.world_size, global_batch, bounds):
        pp, dp = dims.pp, dims.dp
        schedules = pp_schedules if pp > 1 else (base.pp_schedule,)
        stages = (0,) if dp == 1 and dedupe_zero_at_dp1 else zero_stages
        for micro, zero, ac, schedule, ov in itertools.product(
            divisors(global_batch // dp), stages, activation_checkpointing, schedules, overlap
        ):
            config = dataclasses.replace(
                base,
                **degree_fields(dims),
                micro_batch_size=micro,
                zero_stage=zero,
                activation_checkpointing=ac,
                pp_schedule=schedule,
                overlap_enabled=ov,
            )
            yield from _newer_knobs(config, newer)


def _has_experts(config: TrialConfig) -> bool:
    """Whether ``config``'s model is a mixture of experts (a user workload's: not known)."""
    shape = config.workload.shape
    return shape is not None and shape.moe is not None


def _newer_knobs(config: TrialConfig, newer: dict[str, Sequence]) -> Iterator[TrialConfig]:
    """``config`` under each combination of the newer knobs that changes what it runs: SP only
    with TP (and not for a mixture of experts, whose trial model has no sequence-parallel
    plan), HSDP only with data parallelism, virtual stages only under interleaving; with ep > 1
    only what the trials' expert parallelism runs (``config.ep_trial_refusal``)."""
    if ep_trial_refusal(config) is not None:
        return
    sp = (
        newer["sequence_parallel"]
        if config.tp_degree > 1 and not _has_experts(config)
        else (False,)
    )
    replicate = newer["dp_replicate"] if config.dp_degree > 1 else (1,)
    interleaved = config.pp_degree > 1 and config.pp_schedule == "interleaved_1f1b"
    virtual = newer["virtual_stages"] if interleaved else (config.virtual_stages,)
    for seq_par, rep, v, comp, f8 in itertools.product(
        sp, replicate, virtual, newer["compile"], newer["float8"]
    ):
        candidate = dataclasses.replace(
            config,
            sequence_parallel=seq_par,
            dp_replicate=rep,
            virtual_stages=v,
            compile=comp,
            float8=f8,
        )
        try:
            candidate.validate()
        except ConfigError:
            continue
        yield candidate


def short_name(c: TrialConfig) -> str:
    """A compact id: w4-tp2-pp1-dp2-z3-mb2x2-ac_full[-1f1b][-noov][-b5] (the bucket where
    there is a gradient sync and it is not the default), then the newer knobs where they are
    not their defaults: [-v4] virtual stages, [-sp], [-cp2], [-hsdp2] replica groups, [-l2]
    checkpointed blocks, [-compile], [-fp8]. Each knob's mark is declared with it
    (``knobs.Knob.mark``)."""
    name = (
        f"w{c.world_size}-tp{c.tp_degree}-pp{c.pp_degree}-dp{c.dp_degree}-z{c.zero_stage}"
        f"-mb{c.micro_batch_size}x{c.grad_accum_steps}-ac_{c.activation_checkpointing}"
    )
    return name + "".join(short_marks(c))
