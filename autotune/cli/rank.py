"""``autotune rank``: every valid layout of a model on a cluster, ranked by predicted throughput.

For a built-in model (``--model``) or an explicit architecture (``estimate``'s flags), a
cluster (``--cluster NAME|FILE --nodes N``: world size = nodes × devices per node), a global
batch and a sequence length, it ranks every layout the trial engine accepts and prints the
fastest K. The ranking itself is ``autotune.ranking`` (``score.rank_screened``: the layouts of
``space.screen_layouts``, screened by memory bounds, each one's peak memory, and for those
predicted to fit the limit with the search's margin its step time with the cluster's stored
calibration, folded by ``collapse.collapse_equivalent``, a ``--compare`` layout placed by
``compare.compare_to_top``); this module parses the flags into it and prints what it returns.
Nothing runs and nothing imports torch: SC21's 145.6B GPT on 1,536 GPUs (213,288 layouts)
scores in about 8 s (``bench/rank_speed.py``).

Precision (``--precision``, or the older ``--dtype``) defaults as the search's does
(``config.DEFAULT_PRECISION``: bf16-mixed on GPU clusters, with fp32 master weights). Layouts
that differ only in bucket size and whose predicted step and peak agree within 0.1% share one
row, whose bucket column lists their sizes; the output says how many were folded.

What is enumerated (``ENUMERATED``): every knob of the search (``layouts.KNOB_ORDER``, in the
words of ``layouts.KNOB_WORDS``), tp × pp × cp × dp, with the knobs' flags narrowing them. With
dp 1 there is nothing to shard, overlap or bucket, so only ZeRO-0 with overlap on and the
default bucket is listed (``enumerate_configs`` lists only ZeRO-0 there for the same reason).
The attention kernel stays at TrialConfig's default (SDPA): eager attention is slower and
larger in both models, so it would not reorder the ranking while it doubles the count.

``add_rank_parser(sub)`` adds the command to the CLI's subparsers; ``cmd_rank(args)`` runs it.
Bad input raises :class:`ConfigError` (one line, exit 2); nothing predicted to fit is a runtime
error (exit 1) naming the smallest predicted peak.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import get_args

from autotune.cli.args import (
    add_architecture_args,
    add_cluster_args,
    add_debug_arg,
    add_engine_arg,
    add_precision_args,
    builtin_workload,
    describe_cluster,
    explicit_shape,
    mark_explicit,
    precision_arg,
)
from autotune.cli.config_flags import add_flags, add_knob_args
from autotune.config import (
    GIB,
    ActivationCheckpointing,
    PipelineSchedule,
    TrialConfig,
    WorkloadSpec,
    ZeroStage,
)
from autotune.errors import AutotuneError, ConfigError
from autotune.knobs import short_marks
from autotune.layouts import KNOB_ORDER, knobs_in_words
from autotune.model.cluster import ClusterSpec, load_cluster
from autotune.model.engines import EngineProfile
from autotune.model.memory import MemoryTraits
from autotune.model.perf_model import engine_traits
from autotune.ranking.collapse import COLLAPSE_TOLERANCE
from autotune.ranking.compare import LAYOUT_KEYS, Comparison, compare_to_top, parse_layout
from autotune.ranking.score import rank_screened
from autotune.ranking.scored import Ranking, ScoredLayout
from autotune.ranking.space import Screened, knob_choices
from autotune.search.screen import MemoryAllowance, allowance
from autotune.search.space import DEFAULT_BUCKETS_MB
from autotune.shapes import ModelShape, model_names

ZERO_STAGES = get_args(ZeroStage)
CHECKPOINTING = get_args(ActivationCheckpointing)
SCHEDULES = get_args(PipelineSchedule)
ENUMERATED = (
    f"all {len(KNOB_ORDER)} knobs of the search: {knobs_in_words()}; ZeRO stage "
    f"{ZERO_STAGES[0]}-{ZERO_STAGES[-1]}, activation checkpointing {'/'.join(CHECKPOINTING)}, "
    f"pipeline schedule {'/'.join(SCHEDULES)} (pp > 1), overlap on/off and bucket size "
    f"{'/'.join(f'{b:g}' for b in DEFAULT_BUCKETS_MB)} MB (dp > 1)"
)
"""The knobs ``autotune rank`` enumerates (the search's grid, ``space.SearchSpace``), as its
--help says."""


# ---- the command line ----------------------------------------------------------------------
def add_rank_parser(sub) -> None:
    p = sub.add_parser(
        "rank",
        help="rank every valid layout on a cluster by predicted throughput, nothing run",
        description="Enumerate every valid layout of a model on a cluster — "
        f"{ENUMERATED} — predict each one's peak memory (autotune/model/memory.py) and step time "
        "(autotune/model/perf_model.py, with the cluster's stored calibration), drop those "
        "predicted not to fit the memory limit with the search's 15% margin, and print the "
        "fastest by predicted tokens/s; layouts that differ only in bucket size and are "
        "predicted alike share a row. Attention (sdpa) stays at TrialConfig's default. With "
        "dp 1, only ZeRO-0 with overlap on is listed (nothing to shard or overlap).",
        epilog="example: autotune rank --model llama-70b --cluster a100-sxm4-80gb --nodes 64 "
        "--global-batch 1024 --seq-len 4096",
    )
    p.add_argument(
        "--model",
        metavar="NAME",
        help=f"built-in model: {', '.join(model_names())}, or hf:PATH_OR_ID (a "
        "Hugging Face causal LM's config.json)",
    )
    add_cluster_args(
        p,
        required=True,
        nodes_help="nodes of the cluster (default: the "
        "cluster's own, 1 for the built-in ones); world size = nodes × devices "
        "per node",
    )
    add_flags(p, "--global-batch", "--seq-len", required=True)
    add_precision_args(p)
    add_knob_args(
        p.add_argument_group(
            "layout knobs (default: SP wherever tp > 1, each cp leaving ≥ 4,096 tokens a rank, "
            "HSDP shard groups of 8 and 64, virtual stages 2/4; compile and fp8 "
            "off)"
        ),
        rank=True,
    )
    p.add_argument(
        "--memory-limit",
        type=float,
        metavar="GIB",
        help="per-device memory limit in GiB (default: the cluster device's memory)",
    )
    p.add_argument("--top", type=int, default=10, metavar="K", help="layouts to print (default 10)")
    p.add_argument("--json", action="store_true", help="print the ranking as JSON")
    p.add_argument(
        "--plot",
        metavar="FILE.html",
        help="also write one self-contained HTML page (Plotly, opens offline) of every layout "
        "predicted to fit, one point per row: predicted tokens/s against predicted peak memory, "
        "the memory limit, the Pareto front, colour by tp × pp, symbol by ZeRO stage, the --top "
        "rows ringed; hover a point for its layout and largest time term",
    )
    p.add_argument(
        "--compare",
        metavar="LAYOUT",
        help="a reference layout, KEY=VALUE pairs separated by commas or spaces, e.g. "
        "'tp=8,pp=2,mb=4,zero=1,ac=full,schedule=interleaved_1f1b,v=3' (keys: "
        + ", ".join(LAYOUT_KEYS)
        + "): print its place in the ranking and, when "
        "the top pick is faster, the term (compute, tp_comm, pp_bubble, dp_comm...) "
        "that makes it so",
    )
    add_engine_arg(p)
    add_architecture_args(p)
    add_debug_arg(p)
    p.set_defaults(run=cmd_rank)


def cmd_rank(args: argparse.Namespace) -> int:
    if args.top < 1:
        raise ConfigError(f"--top must be ≥ 1, not {args.top}")
    _check_plot_name(args.plot)
    if args.memory_limit is not None and not args.memory_limit > 0:
        raise ConfigError(
            f"--memory-limit must be a positive number of GiB, not {args.memory_limit:g}"
        )
    cluster = load_cluster(args.cluster, nodes=args.nodes)
    device_type = cluster.device_type
    base, shape = _base_config(args, cluster)
    # A dtype the device gives no peak for: refuse now.
    cluster.device.flops(base.compute_dtype(device_type))
    limit_gib = args.memory_limit or cluster.device.memory_gib
    engine = engine_traits(args.engine)
    memory_traits = engine.memory
    # A reference layout that does not parse is refused before the ranking's seconds.
    reference = parse_layout(args.compare, base) if args.compare else None
    screened, ranking = rank_screened(
        base,
        shape,
        cluster,
        knob_choices(
            base,
            cp_degree=args.cp_degree,
            dp_replicate=args.dp_replicate,
            virtual_stages=args.virtual_stages,
            compile=args.compile,
            float8=args.float8,
            ep_degree=args.ep_degree,
            shape=shape,
        ),
        limit_bytes=int(limit_gib * GIB),
        engine=engine,
        memory_traits=memory_traits,
        ac_layers=args.ac_layers,
    )
    if not ranking.fitting:
        raise _nothing_fits(ranking, screened, limit_gib, allowance(device_type, memory_traits))
    top = ranking.rows[: args.top]
    if args.plot is not None:
        _write_plot(args, ranking, screened, base, shape, cluster, engine, limit_gib)
    if args.json:
        print(
            json.dumps(
                {
                    "cluster": cluster.name,
                    "nodes": cluster.num_nodes,
                    "world_size": base.world_size,
                    "memory_limit_bytes": int(limit_gib * GIB),
                    "shape": dataclasses.asdict(shape) if shape else None,
                    "scored": ranking.scored,
                    "fit": len(ranking.fitting),
                    "screened_groups": screened.groups_dropped,
                    "screened_branches": screened.branches_dropped,
                    "collapsed": ranking.collapsed,
                    "layouts": [s.as_dict() for s in top],
                },
                indent=2,
            )
        )
        return 0
    _print_ranking(
        ranking, screened, top, base, shape, cluster, engine.name, limit_gib, memory_traits
    )
    if reference is not None:
        print(describe_comparison(compare_to_top(ranking, reference, cluster, shape, engine)))
    return 0


def _check_plot_name(path: str | None) -> None:
    if path is not None and not path.lower().endswith((".html", ".htm")):
        raise ConfigError(f"--plot writes an HTML page: give a name ending in .html, not '{path}'")


def _write_plot(
    args: argparse.Namespace,
    ranking: Ranking,
    screened: Screened,
    base: TrialConfig,
    shape: ModelShape | None,
    cluster: ClusterSpec,
    engine: EngineProfile,
    limit_gib: float,
) -> None:
    """``--plot``: every row of the ranking as a plain record, drawn by ``dashboards.rank_plot``
    on one page; where it was written goes to stderr."""
    from dashboards.rank_plot import RankSummary, write_rank_page

    limit = int(limit_gib * GIB)
    rule = allowance(cluster.device_type, engine.memory)
    wl = base.workload
    name = wl.name if shape is None else f"{shape.family} architecture ({shape.num_layers} layers)"
    summary = RankSummary(
        title=f"{name}, global batch {wl.global_batch_size} × seq {wl.seq_len}, "
        f"{base.resolved_precision(cluster.device_type)}, on "
        f"{describe_cluster(cluster, engine.name)}",
        limit_bytes=limit,
        # The largest peak whose required bytes (rule.required_bytes) are within the limit.
        fit_below_bytes=int(
            (limit - rule.outside_allocator) / ((1 + rule.model_margin) * rule.fragmentation)
        ),
        allowances=rule.describe(),
        scored=ranking.scored,
        fit=len(ranking.fitting),
        screened_groups=screened.groups_dropped,
        screened_branches=screened.branches_dropped,
        top=min(args.top, len(ranking.rows)),
    )
    records = [_plot_record(i, s) for i, s in enumerate(ranking.rows, 1)]
    written = write_rank_page(args.plot, records, summary)
    print(
        f"plot: {len(records):,} rows ({len(ranking.fitting):,} layouts predicted to fit) "
        f"written to {written}",
        file=sys.stderr,
    )


def _plot_record(rank: int, s: ScoredLayout) -> dict:
    """One row as ``rank_plot.RankPoint``'s plain fields."""
    c, t = s.config, s.time
    term = max(t.breakdown, key=t.breakdown.get)
    parts = [
        f"tp {c.tp_degree} · pp {c.pp_degree} · dp {c.dp_degree} · ZeRO-{c.zero_stage}",
        f"micro {c.micro_batch_size}×{c.grad_accum_steps}",
        f"AC {c.activation_checkpointing}",
        *([c.pp_schedule] if c.pp_degree > 1 else []),
        f"overlap {'on' if c.overlap_enabled else 'off'}",
        *([f"bucket {_buckets(s)} MB"] if c.dp_degree > 1 else []),
        *([knobs] if (knobs := _knobs(c)) != "-" else []),
    ]
    return {
        "rank": rank,
        "tp": c.tp_degree,
        "pp": c.pp_degree,
        "dp": c.dp_degree,
        "zero": c.zero_stage,
        "layout": " · ".join(parts),
        "peak_bytes": s.peak_memory_bytes,
        "tokens_per_s": t.tokens_per_s,
        "step_time_s": t.step_time_s,
        "term": term,
        "term_s": t.breakdown[term],
        "folded": len(s.collapsed_buckets_mb),
    }


def _nothing_fits(
    ranking: Ranking, screened: Screened, limit_gib: float, rule: MemoryAllowance
) -> AutotuneError:
    """The error when no layout is predicted to fit: the smallest peak seen, scored or
    screened, and what it would take with the screen's allowances ``rule``."""
    config, peak = min(
        filter(None, (ranking.smallest_peak, screened.smallest)), key=lambda cp: cp[1]
    )
    least = "" if ranking.smallest_peak and peak == ranking.smallest_peak[1] else "at least "
    return AutotuneError(
        f"none of the {ranking.scored:,} layouts is predicted to fit in {limit_gib:g} GiB "
        f"({_screened_text(screened)}): the smallest predicted peak is {least}"
        f"{peak / GIB:.1f} GiB ({_layout_name(config)}), "
        f"{rule.required_bytes(peak) / GIB:.1f} GiB with {rule.describe()}; "
        "add nodes (--nodes) or raise --memory-limit"
    )


def _print_ranking(
    ranking: Ranking,
    screened: Screened,
    top: list,
    base: TrialConfig,
    shape: ModelShape | None,
    cluster: ClusterSpec,
    engine: str,
    limit_gib: float,
    memory_traits: MemoryTraits,
) -> None:
    """The ranking as text: what was ranked, the table, and what was scored, screened, folded."""
    device_type = cluster.device_type
    wl = base.workload
    name = (
        wl.name
        if shape is None
        else (
            f"{shape.family} architecture ({shape.num_layers} layers, hidden {shape.hidden_size}, "
            f"{shape.num_heads} heads, vocab {shape.vocab_size})"
        )
    )
    print(
        f"{name} on {describe_cluster(cluster, engine)}: world {base.world_size}, "
        f"global batch "
        f"{wl.global_batch_size} × seq {wl.seq_len}, "
        f"{base.resolved_precision(device_type)}"
    )
    print(format_table(top))
    print(
        f"scored {ranking.scored:,} layouts; {len(ranking.fitting):,} predicted to fit in "
        f"{limit_gib:g} GiB ({_peak_words(memory_traits)}, "
        f"{allowance(device_type, memory_traits).describe()}); the top {len(top)} by "
        "predicted tokens/s"
    )
    if screened.groups_dropped or screened.branches_dropped:
        print(f"screened by memory before scoring: {_screened_text(screened)}")
    if ranking.collapsed:
        print(
            f"folded: {ranking.collapsed:,} layouts that differ from a listed one only in "
            f"bucket size, with the same prediction (step and peak within "
            f"{COLLAPSE_TOLERANCE:.1%}), share its row; its bucket column lists their sizes"
        )


def _peak_words(traits: MemoryTraits) -> str:
    """What the table's peak counts: autotune's runtime's allocated peak, or as far as the
    engine's traits count the allocator (``MemoryTraits.peak_kind``)."""
    return "peak" if traits.own_runtime else f"peak, {traits.peak_kind}"


def describe_comparison(c: Comparison) -> str:
    line = (
        f"reference {_layout_name(c.reference)}: predicted {_seconds(c.time.step_time_s)}, "
        f"place {c.position:,} ({c.percentile:.1%} of those that fit)"
    )
    if c.position > 1:
        faster = c.time.step_time_s - c.top.time.step_time_s
        line += (
            f"; the top pick ({_layout_name(c.top.config)}) is faster by "
            f"{_seconds(faster)}, most in {c.term} ({_seconds(c.gain_s)} less)"
        )
    return line


def _base_config(
    args: argparse.Namespace, cluster: ClusterSpec
) -> tuple[TrialConfig, ModelShape | None]:
    """The layout-free part: workload, world size, device; and the explicit shape, if any."""
    workload = WorkloadSpec(
        seq_len=args.seq_len,
        global_batch_size=args.global_batch_size,
        dtype=args.dtype,
        vocab_size=args.vocab_size,
    )
    if args.model is not None:
        workload = builtin_workload(workload, args.model, trials=False)
    base = TrialConfig(
        workload=workload,
        world_size=cluster.world_size,
        device=cluster.device_type,
        precision=precision_arg(args.precision),
    )
    base.validate_precision()
    # Spelled out once (the search's default: bf16-mixed on GPUs), so every layout carries it.
    base = base.with_precision(cluster.device_type)
    shape = explicit_shape(args, base)
    if shape is None and args.model is None:
        raise ConfigError(
            "give --model NAME or an explicit architecture (--num-layers "
            "--hidden-size --num-heads --vocab-size) to rank"
        )
    if shape is not None:
        base = mark_explicit(base, shape)
    base.workload.validate()
    return base, shape


def _screened_text(s: Screened) -> str:
    return (
        f"{s.groups_dropped:,} (tp, pp, cp, ZeRO, HSDP, schedule) groups whose model states "
        f"alone, and {s.branches_dropped:,} (micro-batch, checkpointing, SP) branches whose "
        "states and held activations, cannot fit, dropped before their layouts were built"
    )


# ---- output --------------------------------------------------------------------------------
def format_table(layouts: tuple[ScoredLayout, ...] | list[ScoredLayout]) -> str:
    lines = [
        f"{'rank':>4} {'tp':>3} {'pp':>3} {'dp':>4} {'zero':>4} {'micro×acc':>10}  "
        f"{'AC':<9} {'schedule':<16} {'overlap':<7} {'bucket':>8} {'step':>9} "
        f"{'tokens/s':>11} {'MFU':>6} {'peak GiB':>8}  {'knobs':<14} largest term"
    ]
    for i, s in enumerate(layouts, 1):
        c, t = s.config, s.time
        term = max(t.breakdown, key=t.breakdown.get)
        mfu = f"{t.mfu:.1%}" if t.mfu is not None else "-"
        lines.append(
            f"{i:>4} {c.tp_degree:>3} {c.pp_degree:>3} {c.dp_degree:>4} {c.zero_stage:>4} "
            f"{f'{c.micro_batch_size}×{c.grad_accum_steps}':>10}  "
            f"{c.activation_checkpointing:<9} {c.pp_schedule if c.pp_degree > 1 else '-':<16} "
            f"{'on' if c.overlap_enabled else 'off':<7} "
            f"{_buckets(s) if c.dp_degree > 1 else '-':>8} {_seconds(t.step_time_s):>9} "
            f"{t.tokens_per_s:>11,.0f} {mfu:>6} {s.peak_memory_bytes / GIB:>8.1f}  "
            f"{_knobs(c):<14} {term} {t.breakdown[term] / t.step_time_s:.0%}"
        )
    return "\n".join(lines)


def _knobs(c: TrialConfig) -> str:
    """The newer knobs a layout sets, as their short-name marks (``knobs.Knob.mark``): sp,
    cp2, hsdp2, v4, l2, compile, fp8 ('-' for none)."""
    return ",".join(m[1:] for m in short_marks(c, newer_only=True)) or "-"


def _buckets(s: ScoredLayout) -> str:
    """The row's bucket size, and those of the layouts folded into it: '5/25/100'."""
    return "/".join(f"{b:g}" for b in sorted((s.config.bucket_mb, *s.collapsed_buckets_mb)))


def _seconds(t: float) -> str:
    return f"{t:.2f} s" if t >= 1 else f"{t * 1e3:.2f} ms"


def _layout_name(c: TrialConfig) -> str:
    schedule = f" {c.pp_schedule}" if c.pp_degree > 1 else ""
    return (
        f"tp {c.tp_degree} × pp {c.pp_degree} × dp {c.dp_degree}, ZeRO-{c.zero_stage}, "
        f"micro-batch {c.micro_batch_size} × {c.grad_accum_steps}, checkpointing "
        f"{c.activation_checkpointing}{schedule}"
    )
