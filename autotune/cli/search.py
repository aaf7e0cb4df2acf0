"""``autotune search``, the main job: find the fastest configuration that fits in memory, by
measuring, and export it. The defaults are ``SearchSpec``'s (and its ``WorkloadSpec``'s): the
flags fill a ``SearchSpec``, which ``autotune.search.search.Search`` runs on a ``TrialPool``."""

from __future__ import annotations

import argparse
import sys

from autotune.cli.args import (
    DEFAULT_DB,
    add_db_arg,
    add_debug_arg,
    add_precision_args,
    add_ray_args,
    builtin_workload,
    executor_settings,
    opened_db,
    positive_float,
    positive_int,
    precision_arg,
)
from autotune.cli.config_flags import add_flags
from autotune.config import TrialConfig, WorkloadSpec
from autotune.errors import AutotuneError, ConfigError
from autotune.layouts import KNOB_ORDER, knobs_in_words
from autotune.search.spec import SAMPLERS, STRATEGIES, SearchSpec

SPEC = SearchSpec()
"""Where every default of the flags comes from."""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "search",
        help="find the fastest configuration that fits in memory (the main job)",
        description=f"Search the {len(KNOB_ORDER)} knobs ({knobs_in_words()}) with real "
        "trials; configurations predicted not to fit "
        "are never run; the top few are measured again; best_config.json, ds_config.json, "
        "accelerate_config.yaml, torchtitan_config.py and megatron_args.txt are written at the "
        "end. With no arguments: the built-in tiny GPT, local Ray, "
        f"{DEFAULT_DB}, world size = visible GPUs or 2 on CPU.",
    )
    _add_workload_args(p)
    _add_budget_args(p)
    _add_measurement_args(p)
    p.add_argument(
        "--cluster",
        metavar="FILE|NAME",
        help="the cluster, for predicted step times: a built-in name or a "
        "JSON/TOML file such as 'autotune calibrate -o' writes (default: "
        "described from Ray and torch)",
    )
    p.add_argument("--out", default=".", metavar="DIR", help="where the exports go (default .)")
    add_db_arg(p)
    add_ray_args(p)
    add_debug_arg(p)
    p.set_defaults(run=run)


def _add_workload_args(p: argparse.ArgumentParser) -> None:
    """What is trained, on how many ranks, within what memory."""
    workload = SPEC.workload
    p.add_argument(
        "--model",
        default=f"{workload.family}-{workload.size}",
        metavar="NAME",
        help="built-in model (e.g. gpt-tiny, gpt-small, llama-7b), or "
        "hf:PATH_OR_ID: a Hugging Face causal LM built from its config.json "
        "(a folder, the file, or an id in the local HF cache)",
    )
    p.add_argument("--workload", metavar="PKG.MODULE:FN", help="a user workload instead")
    add_flags(
        p,
        "--seq-len",
        "--global-batch",
        seq_len=workload.seq_len,
        global_batch_size=workload.global_batch_size,
    )
    add_precision_args(p)
    p.add_argument(
        "--world-size",
        type=positive_int,
        metavar="N",
        help="ranks per trial (default: visible GPUs, or 2 on CPU)",
    )
    p.add_argument(
        "--memory-limit",
        type=positive_float,
        metavar="GIB",
        help="per-device memory limit in GiB (default: the GPU's memory; none on CPU)",
    )


def _add_budget_args(p: argparse.ArgumentParser) -> None:
    """When the search stops, which study it keeps, and which knobs it may choose."""
    p.add_argument(
        "--trials",
        type=positive_int,
        default=SPEC.n_trials,
        metavar="N",
        help=f"trial budget (default {SPEC.n_trials})",
    )
    p.add_argument(
        "--time-budget", type=positive_float, metavar="S", help="stop after this many seconds"
    )
    p.add_argument(
        "--patience",
        type=positive_int,
        default=SPEC.patience,
        metavar="N",
        help=f"stop when the best has not improved for N trials (default {SPEC.patience})",
    )
    p.add_argument(
        "--study",
        default=SPEC.study_name,
        metavar="NAME",
        help=f"study name in the database (default '{SPEC.study_name}')",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the study of that name; finished trials are not rerun",
    )
    p.add_argument(
        "--fix",
        action="append",
        default=[],
        metavar="KNOB=VALUE",
        help="fix a knob, e.g. --fix zero_stage=3 (repeatable)",
    )
    p.add_argument(
        "--space", metavar="FILE", help='JSON narrowing knobs, e.g. {"micro_batch_size": [1, 2]}'
    )
    p.add_argument("--seed", type=int, default=SPEC.seed)


def _add_measurement_args(p: argparse.ArgumentParser) -> None:
    """How the finalists are measured again, how trials run, and what proposes them."""
    p.add_argument(
        "--top-k",
        type=positive_int,
        default=SPEC.top_k,
        metavar="K",
        help="configurations measured again before one is declared best, "
        "besides the baseline (the study's first trial), which always is",
    )
    p.add_argument(
        "--remeasure",
        type=int,
        default=SPEC.remeasure_repeats,
        metavar="N",
        help="interleaved re-measurement rounds over the top K, at least "
        f"(default {SPEC.remeasure_repeats}; 0: none)",
    )
    p.add_argument(
        "--remeasure-max",
        type=int,
        default=SPEC.remeasure_max_repeats,
        metavar="N",
        help="rounds at most: more are run while the runner-up is tied "
        f"with the fastest within noise (default {SPEC.remeasure_max_repeats})",
    )
    p.add_argument("--timed-steps", type=positive_int, default=SPEC.num_timed_steps, metavar="N")
    p.add_argument(
        "--parallel",
        type=positive_int,
        metavar="N",
        help="trials run at once (default: GPUs // world size on a GPU "
        "cluster, 1 on CPUs, whose ranks would time each other)",
    )
    p.add_argument(
        "--strategy",
        choices=STRATEGIES,
        default=SPEC.sampler,
        help="what proposes the next trial: model (the performance model, "
        "refitted after every trial), an Optuna sampler (tpe, gp, random), or "
        "auto (default: model on GPUs, TPE on CPUs, as "
        "bench/search_replay.py and bench/ranking_stability.py measured)",
    )
    p.add_argument(
        "--sampler",
        choices=SAMPLERS,
        dest="strategy",
        help="an Optuna sampler as the strategy (same as --strategy NAME)",
    )


def spec_from_args(args: argparse.Namespace) -> SearchSpec:
    """The flags as a validated ``SearchSpec``; a user workload's builder is loaded to check it
    (before the database and Ray: one line, exit 2)."""
    from autotune.search.search import default_world_size
    from autotune.search.space import load_space_file, parse_fix

    workload = WorkloadSpec(
        seq_len=args.seq_len,
        global_batch_size=args.global_batch_size,
        dtype=args.dtype,
        workload=args.workload,
    )
    if not args.workload:
        workload = builtin_workload(workload, args.model)
    workload.validate()
    TrialConfig(workload=workload, precision=precision_arg(args.precision)).validate_precision()
    if args.workload:
        from autotune.trial.models.build import load_builder

        load_builder(args.workload)
    fixed = parse_fix(args.fix)
    narrowed = load_space_file(args.space) if args.space else {}
    if args.remeasure < 0 or args.remeasure_max < 0:
        raise ConfigError(
            f"--remeasure and --remeasure-max must be ≥ 0, not "
            f"{args.remeasure} and {args.remeasure_max}"
        )
    spec = SearchSpec(
        workload=workload,
        world_size=args.world_size or default_world_size(),
        memory_limit_gib=args.memory_limit,
        n_trials=args.trials,
        timeout_s=args.time_budget,
        patience=args.patience,
        study_name=args.study,
        seed=args.seed,
        fixed=fixed,
        narrowed=narrowed,
        top_k=args.top_k,
        remeasure_repeats=args.remeasure,
        remeasure_max_repeats=args.remeasure_max,
        num_timed_steps=args.timed_steps,
        sampler=args.strategy,
        precision=args.precision,
        cluster=args.cluster,
    )
    spec.validate()
    return spec


def run(args: argparse.Namespace) -> int:
    spec = spec_from_args(args)
    with opened_db(
        args.db, required_by="autotune search keeps its study in a database"
    ) as database:
        from autotune.export.best_config import export_study
        from autotune.search.search import Search
        from autotune.study.leaderboard import format_leaderboard
        from autotune.trial.pool import TrialPool

        # The pool starts Ray when first asked for its slots, after the search is set up: a
        # bad spec or study name is refused before anything starts.
        with TrialPool(
            executor_settings(args), args.parallel, world_size=spec.world_size, device=spec.device
        ) as pool:
            search = Search.open(spec, database, pool, resume=args.resume)
            print(
                f"searching {len(search.space)} valid configurations of {spec.workload.name} "
                f"on {spec.world_size} ranks; study '{spec.study_name}' in "
                f"{database.url_for_display}",
                file=sys.stderr,
                flush=True,
            )
            if pool.slots > 1:
                print(f"running {pool.slots} trials at once", file=sys.stderr, flush=True)
            outcome = search.run()
        print(format_leaderboard(outcome, search.limit))
        print(
            f"stopped: {outcome.stopped_because}; {outcome.num_run} trials run, "
            f"{outcome.num_infeasible_predicted} skipped as predicted not to fit, "
            f"{outcome.elapsed_s:.0f}s"
        )
        if outcome.best is None:
            raise AutotuneError("no configuration completed; see the leaderboard's reasons")
        paths = export_study(database, spec.study_name, args.out)
        print(f"exported trial {outcome.best.number}: wrote {', '.join(map(str, paths))}")
    return 0
