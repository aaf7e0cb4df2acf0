"""The layouts ``autotune rank`` scores: the search's grid with the newer knobs enumerated, and
screened by memory before each layout is built (``screen_layouts``); the unscreened grid
(``enumerate_layouts``) and why no layout splits a batch (``no_layout_message``).

With every knob (sequence parallelism, context parallelism, HSDP, virtual stages) Llama 3.1
405B on 1,024 GPUs has about 1.5 million valid layouts; building and validating each one alone
takes minutes. ``screened_layouts`` walks the grid as a tree instead and drops a branch once a
lower bound of its memory cannot fit (``search.screen.predicted_to_fit``):

1. per (tp, pp, cp, ZeRO stage, HSDP replicas, schedule, virtual stages): rank 0's model
   states (``memory.states_lower_bound``, the smallest over the bucket sizes and overlap);
2. per (micro-batch, checkpointing, sequence parallelism) under it: those states plus the
   blocks' activations rank 0 holds (``memory.activation_lower_bound``, compiled where
   compile is listed: it keeps less);
3. the layouts of a branch that passes (overlap, bucket, compile, float8) are built and
   validated (``TrialConfig.validate``, the rules the search's grid applies), then estimated
   exactly by ``ranking.score.rank_layouts``.

Every layout the screen drops is predicted not to fit (its estimate is at least the bound), so
the layouts predicted to fit, and their order, are those of the unscreened grid.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field

from autotune.config import (
    CHECKPOINTING_MODES,
    OVERLAP_CHOICES,
    PP_SCHEDULES,
    ZERO_STAGES,
    TrialConfig,
    with_fields,
)
from autotune.errors import ConfigError
from autotune.knobs import KNOB_BY_FIELD
from autotune.layouts import SEARCHED_BY_DEFAULT, degree_fields, divisors, layout_degrees
from autotune.model.engine_memory import engine_states_lower_bound, estimate_engine_memory
from autotune.model.engines import AUTOTUNE_MEMORY
from autotune.model.memory import MemoryTraits, activation_lower_bound, states_lower_bound
from autotune.parallel_dims import ParallelDims
from autotune.search.screen import allowance
from autotune.search.space import DEFAULT_BUCKETS_MB, SearchSpace
from autotune.shapes import ModelShape

VIRTUAL_STAGES = KNOB_BY_FIELD["virtual_stages"].rank_default
"""Virtual stages per rank ``rank`` lists under interleaved_1f1b (2 and 4, as the knob
declares); ``--virtual-stages N`` asks for another."""
CP_MIN_TOKENS = 4096
"""``rank`` lists a context-parallel degree only where each rank keeps at least this many
tokens of a sequence (Llama 3 trained 131k tokens at cp 16: 8,192 a rank, Dubey et al. 2024
§3.3.2); ``--cp N`` asks for any."""
HSDP_SHARDS = (8, 64)
"""``rank`` lists HSDP with shard groups of 8 and 64 ranks (one node or eight nodes of eight
GPUs when tp = 1; torchtitan's and Llama 3's recipes shard within a node or a few), i.e. the
replica counts dp / 8 and dp / 64 of each layout's dp; ``--dp-replicate N`` asks for any
count."""


def knob_choices(
    base: TrialConfig,
    *,
    cp_degree: int | None = None,
    dp_replicate: int | None = None,
    virtual_stages: int | None = None,
    compile: bool = False,
    float8: bool = False,
    ep_degree: int | None = None,
    shape: ModelShape | None = None,
) -> dict[str, tuple]:
    """The newer knobs' values ``rank`` lists: the value given (its flag's) where one is,
    otherwise every value (sequence parallelism on wherever tp > 1, every context-parallel
    degree the sequence allows, every HSDP replica count, ``VIRTUAL_STAGES``, every
    expert-parallel degree of a mixture of experts, ``expert_degrees``); compile and float8
    only when asked for. Sequence parallelism is listed on wherever tp > 1, as
    Megatron-LM's and torchtitan's recipes run it: the same bytes move as TP's all-reduce
    (Korthikanti et al. 2022 §4.2.2) and every block keeps less (``memory._norm_bytes``), so
    the off twin is never the better layout."""
    world, seq = base.world_size, base.workload.seq_len
    return {
        "sequence_parallel": KNOB_BY_FIELD["sequence_parallel"].rank_default,
        "cp_degree": (cp_degree,)
        if cp_degree is not None
        else tuple(
            d
            for d in divisors(world)
            if d == 1 or (seq % (2 * d) == 0 and seq // d >= CP_MIN_TOKENS)
        ),
        "dp_replicate": (dp_replicate,) if dp_replicate is not None else None,
        "virtual_stages": (virtual_stages,) if virtual_stages is not None else VIRTUAL_STAGES,
        "compile": (True,) if compile else SEARCHED_BY_DEFAULT["compile"],
        "float8": (True,) if float8 else SEARCHED_BY_DEFAULT["float8"],
        "ep_degree": (ep_degree,)
        if ep_degree is not None
        else expert_degrees(world, shape or base.workload.shape),
    }


def expert_degrees(world: int, shape: ModelShape | None) -> tuple[int, ...]:
    """The expert-parallel degrees ``rank`` lists: 1 for a dense model; for a mixture of
    experts each divisor of the world that divides its routed experts (each rank holding
    E / ep of them; ``layouts.layout_degrees`` keeps those ep that divide dp_shard × cp × tp)."""
    if shape is None or shape.moe is None:
        return (1,)
    return tuple(d for d in divisors(world) if shape.moe.num_experts % d == 0)


def shape_rules(shape: ModelShape | None) -> dict[str, int] | None:
    """What ``TrialConfig.validate`` needs of an explicit architecture (None for a built-in
    one, whose workload brings its shape)."""
    if shape is None:
        return None
    return {
        "num_heads": shape.num_heads,
        "num_kv_heads": shape.num_kv_heads,
        "num_layers": shape.num_layers,
    }


def tp_degrees(world: int, heads: ModelShape | None) -> list[int]:
    """The tensor-parallel degrees of ``world`` that divide the attention and key/value heads
    (every divisor when the shape is unknown)."""
    return [
        tp
        for tp in divisors(world)
        if not heads or not (heads.num_heads % tp or heads.num_kv_heads % tp)
    ]


def enumerate_layouts(base: TrialConfig, shape: ModelShape | None = None) -> list[TrialConfig]:
    """Every layout of ``base``'s workload on its world size that ``validate`` accepts: the
    search's own grid, ``space.SearchSpace(base).configs`` (``layouts.enumerate_configs`` with
    overlap on and off, less the overlap-off twin of each dp-1 layout, each layout once per
    bucket size of ``space.DEFAULT_BUCKETS_MB``, the first alone with dp 1), validated against
    ``shape`` when the architecture is explicit. Tensor-parallel degrees that cannot divide the
    heads are left out of the grid before their micro-batches are tried, which ``validate``
    would refuse one by one. Unscreened: ``screen_layouts`` is what ``rank`` scores.
    """
    narrowed = {"tp_degree": tp_degrees(base.world_size, shape or base.workload.shape)}
    try:
        grid = SearchSpace(base, narrowed=narrowed).configs
    except ConfigError:  # no valid layout: the caller says why (no_layout_message)
        return []
    rules = shape_rules(shape)
    if rules is None:
        return grid
    # The heads' rule was applied to tp above; the layers' rule (pipeline stages) is the only
    # other one the shape decides, so only pipelined layouts are validated again.
    return [c for c in grid if c.pp_degree == 1 or _valid(c, rules)]


def screen_layouts(
    base: TrialConfig,
    shape: ModelShape | None,
    choices: dict[str, tuple],
    *,
    limit_bytes: int,
    device_type: str,
    traits: MemoryTraits = AUTOTUNE_MEMORY,
    ac_layers: int | None = None,
) -> Screened:
    """The layouts ``rank`` scores (``screened_layouts``): the newer knobs' ``choices``
    (``knob_choices``), screened on memory bounds against ``limit_bytes`` with the search's
    allowances: autotune's runtime's, or those of the engine whose memory ``traits``
    describe. ``ac_layers``: only full checkpointing of that many blocks per stage."""
    if ac_layers is not None:
        base = dataclasses.replace(base, activation_checkpointing="full", ac_layers=ac_layers)
    of = shape or base.workload.shape
    rule = allowance(device_type, traits)  # the search's rule, for the engine's memory
    return screened_layouts(
        base,
        of,
        choices,
        tp_degrees=tp_degrees(base.world_size, of),
        fits=lambda b: rule.required_bytes(b) <= limit_bytes,
        rules=shape_rules(shape),
        traits=traits,
    )


def _valid(config: TrialConfig, rules: dict[str, int]) -> bool:
    try:
        config.validate(**rules)
    except ConfigError:
        return False
    return True


def no_layout_message(base: TrialConfig, shape: ModelShape | None) -> str:
    """Why no layout splits the global batch, and the batches that would split."""
    world, batch = base.world_size, base.workload.global_batch_size
    rules = shape_rules(shape) or {}
    structural = []  # dp of each (tp, pp, cp) the model allows, one micro-batch each
    bounds = {"tp_degree": divisors(world), "pp_degree": divisors(world)}  # cp: its default
    for dims in layout_degrees(world, None, bounds):
        dp = dims.dp
        config = dataclasses.replace(
            base,
            **degree_fields(dims),
            micro_batch_size=1,
            pp_schedule="gpipe",
            workload=dataclasses.replace(base.workload, global_batch_size=dp),
        )
        if _valid(config, rules):
            structural.append(dp)
    name = base.workload.name if shape is None else "the architecture"
    return (
        f"no valid layout of {name} on {world} devices splits global batch {batch}: the "
        "data-parallel degree dp = world / (tp × pp × cp) must divide it, and tp must divide "
        "the heads and pp must not exceed the layers, so dp is at least "
        f"{min(structural)}; choose a global batch that is a multiple of {min(structural)}"
    )


@dataclass
class Screened:
    """What the screen kept, and what it dropped before building it."""

    layouts: list[TrialConfig] = field(default_factory=list)
    """Valid layouts whose lower bound fits, to be estimated exactly."""
    groups_dropped: int = 0
    """(tp, pp, cp, ZeRO, HSDP, schedule, virtual stages) branches whose model states alone
    cannot fit."""
    branches_dropped: int = 0
    """(micro-batch, checkpointing, SP) branches whose states and held activations cannot."""
    smallest: tuple[TrialConfig, int] | None = None
    """The smallest lower bound among what was dropped, and a layout of its branch."""

    def drop(self, config: TrialConfig, bound: int) -> None:
        if self.smallest is None or bound < self.smallest[1]:
            self.smallest = (config, bound)


def screened_layouts(
    base: TrialConfig,
    shape: ModelShape,
    choices: dict[str, tuple],
    *,
    tp_degrees: list[int],
    fits,
    rules: dict[str, int] | None = None,
    traits: MemoryTraits = AUTOTUNE_MEMORY,
) -> Screened:
    """The grid of ``base`` with the newer knobs' ``choices`` (``knob_choices``), walked as
    the module docstring says; ``fits(bytes)`` is the screen's verdict on a lower bound.
    ``traits``: judge memory as that engine stores it (``engine_memory``): a group on its
    rank 0's states (``engine_states_lower_bound``), a branch on its exact estimate, which its
    overlap and bucket leaves share (``engine_memory.ENGINE_MEMORY_IGNORE``); pipeline rank 0's
    is estimated first, and a branch it does not fit is dropped on it alone (the worst rank
    holds at least as much)."""
    out = Screened()
    world, batch = base.world_size, base.workload.global_batch_size
    bounds = {
        "tp_degree": tp_degrees,
        "pp_degree": divisors(world),
        "cp_degree": choices["cp_degree"],
        "ep_degree": choices.get("ep_degree"),
    }
    for dims in layout_degrees(world, batch, bounds):
        over = set()  # (zero, schedule, v) whose states failed at fewer HSDP replicas
        for group in _groups(base, dims, choices):
            key = (group.zero_stage, group.pp_schedule, group.virtual_stages)
            # More replicas, smaller shard groups, larger shards: once the states cannot fit,
            # they cannot with more replicas either (the groups come in ascending replicas).
            states = None if key in over else _states_bound(group, shape, traits)
            if states is None or not fits(states):
                out.groups_dropped += 1
                if states is not None:
                    over.add(key)
                    out.drop(group, states)
                continue
            _branches(group, shape, choices, states, fits, out, rules, traits)
    return out


def _groups(base: TrialConfig, dims: ParallelDims, choices: dict[str, tuple]):
    """One config per (ZeRO stage, HSDP replicas, schedule, virtual stages) of a layout's
    degrees (``layouts.layout_degrees``)."""
    pp, dp = dims.pp, dims.dp
    zeros = (0,) if dp == 1 else ZERO_STAGES
    for zero, schedule in itertools.product(zeros, PP_SCHEDULES if pp > 1 else (base.pp_schedule,)):
        replicas = [
            r
            for r in _replica_counts(dp, choices["dp_replicate"])
            if r == 1 or (zero >= 2 and dp % r == 0 and dp > 1)
        ]
        interleaved = pp > 1 and schedule == "interleaved_1f1b"
        stages = choices["virtual_stages"] if interleaved else (base.virtual_stages,)
        for rep, v in itertools.product(replicas, stages):
            yield with_fields(
                base,
                **degree_fields(dims),
                zero_stage=zero,
                dp_replicate=rep,
                pp_schedule=schedule,
                virtual_stages=v,
                micro_batch_size=base.workload.global_batch_size // dp,
            )


def _replica_counts(dp: int, given: tuple[int, ...] | None) -> list[int]:
    """HSDP replica counts to list for a layout of ``dp`` data-parallel ranks, ascending: the
    one ``--dp-replicate`` gave, else 1 (plain FSDP / ZeRO) and dp / shard for each of
    ``HSDP_SHARDS`` that leaves more than one replica."""
    if given is not None:
        return list(given)
    return [1] + sorted(dp // shard for shard in HSDP_SHARDS if dp % shard == 0 and dp > shard)


def _states_bound(group: TrialConfig, shape: ModelShape, traits: MemoryTraits) -> int:
    """Rank 0's model states, the least over the grid's overlap and bucket choices: they
    matter only to the distributed optimizer's bucketed partition (ZeRO-1 with TP, or with a
    pipeline and overlap; ``memory._uses_distributed_optimizer``). Another engine's
    (``traits``) read neither."""
    if not traits.own_runtime:
        return engine_states_lower_bound(group, shape, traits, device_type=group.device)
    varies = (
        group.zero_stage == 1
        and group.dp_degree > 1
        and (group.tp_degree > 1 or group.pp_degree > 1)
    )
    configs = _overlap_bucket(group) if varies else [group]
    return min(states_lower_bound(c, shape, device_type=c.device) for c in configs)


def _overlap_bucket(config: TrialConfig) -> list[TrialConfig]:
    """``config`` with each overlap and bucket size the grid lists (one when dp is 1)."""
    if config.dp_degree == 1:
        return [with_fields(config, overlap_enabled=True, bucket_mb=DEFAULT_BUCKETS_MB[0])]
    return [
        with_fields(config, overlap_enabled=ov, bucket_mb=b)
        for ov, b in itertools.product(OVERLAP_CHOICES, DEFAULT_BUCKETS_MB)
    ]


def _branches(
    group: TrialConfig,
    shape: ModelShape,
    choices: dict[str, tuple],
    states: int,
    fits,
    out: Screened,
    rules: dict[str, int] | None,
    traits: MemoryTraits,
) -> None:
    """Each (micro-batch, checkpointing, SP) under ``group``: dropped on its bound, or its
    valid layouts kept."""
    dp = group.dp_degree
    modes = ("full",) if group.ac_layers is not None else CHECKPOINTING_MODES
    sps = choices["sequence_parallel"] if group.tp_degree > 1 else (False,)
    lean = any(choices["compile"])  # compiled blocks keep the least
    # Without a pipeline rank 0 holds one micro-batch of b sequences; under 1F1B p of them
    # (M ≥ p, its rule): its activations grow with b, so once a micro-batch cannot fit, the
    # larger ones (listed after it) cannot either.
    monotone = group.pp_degree == 1 or group.pp_schedule == "1f1b"
    over: set[tuple[str, bool]] = set()
    for micro, ac, sp in itertools.product(
        divisors(group.workload.global_batch_size // dp), modes, sps
    ):
        if (ac, sp) in over:
            out.branches_dropped += 1
            continue
        branch = with_fields(
            group, micro_batch_size=micro, activation_checkpointing=ac, sequence_parallel=sp
        )
        if not traits.own_runtime:
            bound = estimate_engine_memory(
                branch, shape, traits, device_type=branch.device, checked=True, screen=fits
            ).total
        else:
            leanest = branch if branch.compile == lean else with_fields(branch, compile=lean)
            bound = states + activation_lower_bound(leanest, shape, device_type=branch.device)
        if not fits(bound):
            out.branches_dropped += 1
            out.drop(branch, bound)
            if monotone:
                over.add((ac, sp))
            continue
        for comp, f8 in itertools.product(choices["compile"], choices["float8"]):
            config = (
                branch
                if (comp, f8) == (branch.compile, branch.float8)
                else with_fields(branch, compile=comp, float8=f8)
            )
            # Validated once for its overlap and bucket leaves: no rule reads overlap, and the
            # only one on the bucket (> 0) holds for every size the grid lists.
            try:
                config.validate(**(rules or {}))
            except ConfigError:
                continue
            out.layouts.extend(_overlap_bucket(config))
