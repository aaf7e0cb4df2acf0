"""Command line: ``autotune trial`` / ``profile`` run one configuration on Ray, print its metrics
and store it; ``autotune trace`` exports a stored timeline; ``autotune dashboard`` writes or
serves a study's HTML report; ``autotune calibrate`` fits the step-time model to a study.

Every error a user can cause is one line on stderr and a non-zero exit (2: usage, 1: runtime);
``--debug`` adds the traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import traceback
from collections.abc import Sequence

from autotune.config import TrialConfig
from autotune.errors import EXIT_RUNTIME, AutotuneError, ConfigError
from autotune.search.search import DEFAULT_STRATEGY, SAMPLERS, STRATEGIES

EXAMPLES = "examples/ holds ready configuration files, e.g. examples/tiny_zero2_dp2.json"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autotune", description="Find the fastest distributed-training configuration "
        "that fits in memory, by measuring.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    trial = sub.add_parser("trial", help="run one configuration as a real multi-process trial",
                           description="Run one TrialConfig on a Ray worker group and print "
                           "step time, throughput, losses and per-rank memory. " + EXAMPLES)
    trial.add_argument("--config", metavar="FILE",
                       help="TrialConfig JSON (default: the built-in tiny GPT on 2 ranks)")
    trial.add_argument("--json", action="store_true",
                       help="print the full result as JSON on stdout")
    _add_db_arg(trial)
    _add_cluster_args(trial)

    profile = sub.add_parser(
        "profile", help="run one configuration and print its per-rank timeline breakdown",
        description="Run a TrialConfig with profiled steps after the timed ones, store it, and "
        "print compute / communication / overlap / exposed communication / idle per rank and "
        "the bytes each collective moves per step. " + EXAMPLES)
    profile.add_argument("--config", metavar="FILE", help="TrialConfig JSON (default: built-in)")
    _add_db_arg(profile)
    _add_cluster_args(profile)

    trace = sub.add_parser("trace", help="export a stored trial's timeline as a Chrome trace",
                           description="Write a Chrome/Perfetto trace (one process per rank, "
                           "compute and communication on separate tracks) that "
                           "chrome://tracing and ui.perfetto.dev open.")
    trace.add_argument("--db", default=DEFAULT_DB, metavar="URL",
                       help=f"database URL (default {DEFAULT_DB})")
    trace.add_argument("--trial", type=int, required=True, metavar="ID", help="trial id")
    trace.add_argument("-o", "--output", required=True, metavar="FILE", help="trace file")
    search = sub.add_parser(
        "search", help="find the fastest configuration that fits in memory (the main job)",
        description="Search ZeRO stage, tp/pp degrees and schedule, micro-batch, bucket size, "
        "overlap and activation checkpointing with Optuna; configurations predicted not to fit "
        "are never run; the top few are measured again; best_config.json, ds_config.json, "
        "accelerate_config.yaml and torchtitan_config.py are written at the end. With no arguments: the built-in tiny GPT, local Ray, "
        f"{DEFAULT_DB}, world size = visible GPUs or 2 on CPU.")
    search.add_argument("--model", default="gpt-tiny", metavar="NAME",
                        help="built-in model (e.g. gpt-tiny, gpt-small, llama-7b), or "
                        "hf:PATH_OR_ID: a Hugging Face causal LM built from its config.json "
                        "(a folder, the file, or an id in the local HF cache)")
    search.add_argument("--workload", metavar="PKG.MODULE:FN", help="a user workload instead")
    search.add_argument("--seq-len", type=_positive_int, default=64, metavar="N")
    search.add_argument("--global-batch", type=_positive_int, default=8, metavar="N",
                        help="sequences per optimizer step (fixed across configurations)")
    from autotune.cli.estimate import add_precision_args

    add_precision_args(search)
    search.add_argument("--world-size", type=_positive_int, metavar="N",
                        help="ranks per trial (default: visible GPUs, or 2 on CPU)")
    search.add_argument("--memory-limit", type=_positive_float, metavar="GIB",
                        help="per-device memory limit in GiB (default: the GPU's memory; none "
                        "on CPU)")
    search.add_argument("--trials", type=_positive_int, default=20, metavar="N",
                        help="trial budget (default 20)")
    search.add_argument("--time-budget", type=_positive_float, metavar="S",
                        help="stop after this many seconds")
    search.add_argument("--patience", type=_positive_int, default=10, metavar="N",
                        help="stop when the best has not improved for N trials (default 10)")
    search.add_argument("--study", default="autotune", metavar="NAME",
                        help="study name in the database (default 'autotune')")
    search.add_argument("--resume", action="store_true",
                        help="continue the study of that name; finished trials are not rerun")
    search.add_argument("--fix", action="append", default=[], metavar="KNOB=VALUE",
                        help="fix a knob, e.g. --fix zero_stage=3 (repeatable)")
    search.add_argument("--space", metavar="FILE",
                        help='JSON narrowing knobs, e.g. {"micro_batch_size": [1, 2]}')
    search.add_argument("--seed", type=int, default=0)
    search.add_argument("--top-k", type=_positive_int, default=3, metavar="K",
                        help="configurations measured again before one is declared best, "
                             "besides the baseline (the study's first trial), which always is")
    search.add_argument("--remeasure", type=int, default=2, metavar="N",
                        help="interleaved re-measurement rounds over the top K, at least "
                        "(default 2; 0: none)")
    search.add_argument("--remeasure-max", type=int, default=6, metavar="N",
                        help="rounds at most: more are run while the runner-up is tied with "
                        "the fastest within noise (default 6)")
    search.add_argument("--timed-steps", type=_positive_int, default=5, metavar="N")
    search.add_argument("--parallel", type=_positive_int, metavar="N",
                        help="trials run at once (default: GPUs // world size on a GPU "
                        "cluster, 1 on CPUs, whose ranks would time each other)")
    search.add_argument("--strategy", choices=STRATEGIES, default=DEFAULT_STRATEGY,
                        help="what proposes the next trial: model (the performance model, "
                        "refitted after every trial), an Optuna sampler (tpe, gp, random), or "
                        "auto (default: model on GPUs, TPE on CPUs, as "
                        "bench/search_replay.py and bench/ranking_stability.py measured)")
    search.add_argument("--sampler", choices=SAMPLERS, dest="strategy",
                        help="an Optuna sampler as the strategy (same as --strategy NAME)")
    search.add_argument("--cluster", metavar="FILE|NAME",
                        help="the cluster, for predicted step times: a built-in name or a "
                        "JSON/TOML file such as 'autotune calibrate -o' writes (default: "
                        "described from Ray and torch)")
    search.add_argument("--out", default=".", metavar="DIR",
                        help="where the exports go (default .)")
    search.add_argument("--db", default=DEFAULT_DB, metavar="URL",
                        help=f"database URL (default {DEFAULT_DB})")
    _add_cluster_args(search)

    export = sub.add_parser("export", help="write best_config.json, ds_config.json and the "
                            "Accelerate / torchtitan configs again",
                            description="Export a stored study's best configuration.")
    export.add_argument("--db", default=DEFAULT_DB, metavar="URL")
    export.add_argument("--study", default="autotune", metavar="NAME")
    export.add_argument("--out", default=".", metavar="DIR")

    dashboard = sub.add_parser(
        "dashboard", help="a study's leaderboard, history and timelines as one HTML file",
        description="Write a self-contained HTML report of a stored study (plotly.js inside, "
        "opens offline): leaderboard, search history, knobs against throughput, throughput "
        "against memory, per-rank timelines, time and memory breakdowns. --serve serves it on "
        "localhost instead, refreshing while a search runs.")
    dashboard.add_argument("--db", default=DEFAULT_DB, metavar="URL",
                           help=f"database URL (default {DEFAULT_DB})")
    dashboard.add_argument("--study", metavar="NAME",
                           help="study name (default: the latest study in the database)")
    dashboard.add_argument("-o", "--output", default="dashboard.html", metavar="FILE",
                           help="HTML file to write (default dashboard.html)")
    dashboard.add_argument("--serve", action="store_true",
                           help="serve the report on http://127.0.0.1:PORT/ instead of writing "
                           "it; the page reloads when the study changes")
    dashboard.add_argument("--port", type=_port, default=8050, metavar="N",
                           help="port for --serve (default 8050; 0: any free port)")

    from autotune.cli.calibrate import add_calibrate_parser
    from autotune.cli.estimate import add_estimate_parser
    from autotune.cli.rank import add_rank_parser

    add_estimate_parser(sub)
    add_rank_parser(sub)
    add_calibrate_parser(sub, DEFAULT_DB)  # estimate, rank, calibrate: their own --debug
    for p in (trial, profile, trace, search, export, dashboard):
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show tracebacks on errors")
    return parser


DEFAULT_DB = "sqlite:///autotune.db"


def _add_db_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", default=DEFAULT_DB, metavar="URL",
                   help=f"SQLAlchemy URL to store the result in (default {DEFAULT_DB}); "
                   "'none' stores nothing")


def _add_cluster_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ray-address", metavar="ADDR",
                   help="join this Ray cluster instead of starting a local one")
    p.add_argument("--timeout", type=_positive_float, default=300.0, metavar="S",
                   help="per-trial timeout in seconds (default 300)")
    p.add_argument("--cpus-per-rank", type=_positive_float, default=0.5, metavar="N",
                   help="Ray CPUs each CPU rank reserves (default 0.5)")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, not {text}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number 0-65535, not {text}")
    return value


def _open_db(url: str, *, create: bool = True, required_by: str | None = None):
    """The database at URL, or None for 'none' (trial and profile then store nothing). A
    command that keeps or reads a study cannot work without one: it says why in required_by,
    and 'none' is then a usage error naming the fix."""
    if url.lower() == "none":
        if required_by:
            raise ConfigError(f"{required_by}: give --db URL or leave the default "
                              f"({DEFAULT_DB}); --db none is only for trial and profile")
        return None
    from db import Database

    return Database.open(url, create=create)


def _run_one(args: argparse.Namespace, *, quiet: bool, profiled: bool = False):
    """Validate, open the database, run the trial on Ray, store it: (result, trial id)."""
    config = TrialConfig.from_file(args.config) if args.config else TrialConfig()
    if profiled and config.num_profiled_steps == 0:
        config = dataclasses.replace(config, num_profiled_steps=2)
    config.validate()  # before importing torch and Ray: bad input fails in a fraction of a second
    database = _open_db(args.db)  # a bad URL fails before any trial runs
    try:
        if config.workload.workload:
            from autotune.trial.models.build import load_builder

            load_builder(config.workload.workload)  # fail here, not on every rank
        from autotune.trial.executor import ExecutorSettings, RayExecutor

        settings = ExecutorSettings(ray_address=args.ray_address, trial_timeout_s=args.timeout,
                                    cpus_per_rank=args.cpus_per_rank)
        if not quiet:
            print(f"running {config.workload.name}: world {config.world_size} = tp "
                  f"{config.tp_degree} × pp {config.pp_degree} × dp {config.dp_degree}, ZeRO-"
                  f"{config.zero_stage}, micro-batch {config.micro_batch_size} × "
                  f"{config.grad_accum_steps} accumulation …", file=sys.stderr, flush=True)
        with RayExecutor(settings) as executor:
            result = executor.run(config)
        trial_id = None
        if database is not None:
            from autotune.study.store import store_result

            trial_id = store_result(database, result)
            if not quiet:
                print(f"stored as trial {trial_id} in {database.url_for_display}",
                      file=sys.stderr)
        return result, trial_id
    finally:
        if database is not None:
            database.close()


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be ≥ 1, not {text}")
    return value


def cmd_search(args: argparse.Namespace) -> int:
    from autotune.config import WorkloadSpec
    from autotune.cli.estimate import precision_arg
    from autotune.search.search import SearchSpec, default_world_size
    from autotune.search.space import load_space_file, parse_fix

    from autotune.cli.estimate import builtin_workload

    workload = WorkloadSpec(seq_len=args.seq_len, global_batch_size=args.global_batch,
                            dtype=args.dtype, workload=args.workload)
    if not args.workload:
        workload = builtin_workload(workload, args.model)
    workload.validate()
    TrialConfig(workload=workload, precision=precision_arg(args.precision)).validate_precision()
    if args.workload:
        from autotune.trial.models.build import load_builder

        load_builder(args.workload)  # before the database and Ray: one line, exit 2
    fixed = parse_fix(args.fix)
    narrowed = load_space_file(args.space) if args.space else {}
    if args.remeasure < 0 or args.remeasure_max < 0:
        raise ConfigError(f"--remeasure and --remeasure-max must be ≥ 0, not "
                          f"{args.remeasure} and {args.remeasure_max}")
    spec = SearchSpec(workload=workload, world_size=args.world_size or default_world_size(),
                      memory_limit_gib=args.memory_limit, n_trials=args.trials,
                      timeout_s=args.time_budget, patience=args.patience,
                      study_name=args.study, seed=args.seed, fixed=fixed, narrowed=narrowed,
                      top_k=args.top_k, remeasure_repeats=args.remeasure,
                      remeasure_max_repeats=args.remeasure_max,
                      num_timed_steps=args.timed_steps, sampler=args.strategy,
                      precision=args.precision,
                      cluster=args.cluster)
    spec.validate()
    database = _open_db(args.db, required_by="autotune search keeps its study in a database")
    try:
        from autotune.trial.executor import ExecutorSettings
        from autotune.export.best_config import export_study
        from autotune.trial.pool import TrialPool
        from autotune.study.leaderboard import format_leaderboard
        from autotune.search.search import Search

        settings = ExecutorSettings(ray_address=args.ray_address, trial_timeout_s=args.timeout,
                                    cpus_per_rank=args.cpus_per_rank)
        # The pool starts Ray when first asked for its slots, after the search is set up: a
        # bad spec or study name is refused before anything starts.
        with TrialPool(settings, args.parallel, world_size=spec.world_size,
                       device=spec.device) as pool:
            search = Search(spec, database, pool, resume=args.resume)
            print(f"searching {len(search.space)} valid configurations of {workload.name} on "
                  f"{spec.world_size} ranks; study '{spec.study_name}' in "
                  f"{database.url_for_display}", file=sys.stderr, flush=True)
            if pool.slots > 1:
                print(f"running {pool.slots} trials at once", file=sys.stderr, flush=True)
            outcome = search.run()
        print(format_leaderboard(outcome, search.limit))
        print(f"stopped: {outcome.stopped_because}; {outcome.num_run} trials run, "
              f"{outcome.num_infeasible_predicted} skipped as predicted not to fit, "
              f"{outcome.elapsed_s:.0f}s")
        if outcome.best is None:
            raise AutotuneError("no configuration completed; see the leaderboard's reasons")
        paths = export_study(database, spec.study_name, args.out)
        print(f"exported trial {outcome.best.number}: wrote {', '.join(map(str, paths))}")
    finally:
        database.close()
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from autotune.export.best_config import export_study

    database = _open_db(args.db, create=False,
                        required_by="autotune export reads the study from a database")
    try:
        paths = export_study(database, args.study, args.out)
    finally:
        database.close()
    print(f"wrote {', '.join(map(str, paths))}")
    return 0


def cmd_dashboard(args: argparse.Namespace) -> int:
    database = _open_db(args.db, create=False, required_by="the dashboard reads a database")
    try:
        if args.serve:
            from dashboards.serve import serve

            return serve(database, args.study, port=args.port)
        from dashboards.report import write_report

        path, study = write_report(database, args.study, args.output)
    finally:
        database.close()
    print(f"wrote the dashboard of study '{study.name}' ({len(study.trials)} trials, "
          f"{len(study.timelines)} timelines) to {path}")
    return 0


def cmd_trial(args: argparse.Namespace) -> int:
    result, trial_id = _run_one(args, quiet=args.json)
    if args.json:
        json.dump({**result.to_dict(), "trial_id": trial_id}, sys.stdout, indent=2)
        print()
    else:
        print(format_result(result))
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    result, _ = _run_one(args, quiet=False, profiled=True)
    print(format_result(result))
    print()
    print(format_breakdown([s for r in result.ranks for s in r.spans]))
    return 0


def cmd_trace(args: argparse.Namespace) -> int:
    from autotune.study.store import load_spans
    from profiler.trace import write_chrome_trace

    database = _open_db(args.db, create=False,
                        required_by="autotune trace reads the trial's timeline from a database")
    try:
        spans = load_spans(database, args.trial)  # names the trial if it does not exist
    finally:
        database.close()
    if not spans:
        raise AutotuneError(f"trial {args.trial} has no timeline; run it with "
                            "num_profiled_steps > 0 (autotune profile)")
    try:
        count = write_chrome_trace(spans, args.output, title=f"autotune trial {args.trial}")
    except OSError as e:
        raise AutotuneError(f"cannot write '{args.output}': {e.strerror}") from None
    print(f"wrote {count} spans of {len({s.rank for s in spans})} ranks to {args.output} "
          "(open in ui.perfetto.dev or chrome://tracing)")
    return 0


def format_breakdown(spans) -> str:
    """Per-rank compute / comm / overlap / exposed / idle, and bytes per collective per step."""
    from profiler import breakdown, bytes_per_step

    if not spans:
        return "no profiled steps (num_profiled_steps = 0)"
    lines = ["rank   window ms  compute ms  comm ms  overlap  exposed ms  idle ms  steps"]
    for b in breakdown(spans):
        per = max(1, b.num_steps)
        lines.append(
            f"{b.rank:>4} {b.window_ns / per / 1e6:>11.2f} {b.compute_ns / per / 1e6:>11.2f} "
            f"{b.comm_ns / per / 1e6:>8.2f} {b.overlap:>8.1%} "
            f"{b.exposed_comm_ns / per / 1e6:>11.2f} {b.idle_ns / per / 1e6:>8.2f} "
            f"{b.num_steps:>6}")
    lines.append("(per step, averaged over the profiled steps; overlap = |comm ∩ compute| / "
                 "|comm|)")
    lines += ["", "rank  kind  collective        group        MB/step"]
    for rank, by_key in sorted(bytes_per_step(spans).items()):
        for (kind, name, group), nbytes in sorted(by_key.items()):
            lines.append(f"{rank:>4}  {kind:<5} {name:<17} {group or '-':<8} "
                         f"{nbytes / 2**20:>11.3f}")
    return "\n".join(lines)


def format_result(result) -> str:
    from autotune.trial.result import TrialResult

    assert isinstance(result, TrialResult)
    c, derived = result.config, result.config["derived"]
    lines = [
        f"workload     {c['workload']['workload'] or c['workload']['family'] + '-' + c['workload']['size']}"
        f"  seq {c['workload']['seq_len']}  global batch {c['workload']['global_batch_size']}",
        f"layout       world {c['world_size']} = tp {c['tp_degree']} × pp {c['pp_degree']} × "
        f"dp {derived['dp_degree']}   ZeRO-{c['zero_stage']}   micro-batch "
        f"{c['micro_batch_size']} × accumulation {derived['grad_accum_steps']}",
        f"knobs        bucket {c['bucket_mb']:g} MB   overlap {'on' if c['overlap_enabled'] else 'off'}"
        f"   activation ckpt {c['activation_checkpointing']}   attention {c['attention']}"
        + (f"   schedule {c['pp_schedule']}" if c["pp_degree"] > 1 else ""),
        f"device       {result.env['device']} ({result.env['backend']}), "
        f"{result.env['threads_per_rank']} thread(s) per rank",
        "",
        f"step time    {result.step_time_s * 1e3:.2f} ms (median of the slowest rank over "
        f"{c['num_timed_steps']} timed steps)",
        f"throughput   {result.throughput_tokens_per_s:,.0f} tokens/s"
        + (f"   MFU {result.mfu:.1%}" if result.mfu is not None else ""),
        f"losses       {' '.join(f'{x:.4f}' for x in result.losses)}",
        f"overhead     {result.overhead_s:.3f} s ({'cold' if result.cold_start else 'warm'} "
        f"worker group; wall {result.wall_s:.2f} s)",
        "",
        "rank  pp dp tp   params MB   grads MB   optim MB   activ. MB   other MB    peak MB",
    ]
    mb = 2**20
    for r in result.ranks:
        m = r.memory
        lines.append(
            f"{r.rank:>4}  {r.pp_rank:>2} {r.dp_rank:>2} {r.tp_rank:>2}  {m.parameters / mb:>10.2f} "
            f"{m.gradients / mb:>10.2f} {m.optimizer_state / mb:>10.2f} "
            f"{m.activations / mb:>11.2f} {m.other / mb:>10.2f} {m.peak / mb:>10.2f}")
    lines.append(f"memory measured by {result.ranks[0].memory.source}")
    return "\n".join(lines)


def _cmd_estimate(args: argparse.Namespace) -> int:
    from autotune.cli.estimate import cmd_estimate

    return cmd_estimate(args)


def _cmd_rank(args: argparse.Namespace) -> int:
    from autotune.cli.rank import cmd_rank

    return cmd_rank(args)


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from autotune.cli.calibrate import cmd_calibrate

    return cmd_calibrate(args)


COMMANDS = {"trial": cmd_trial, "profile": cmd_profile, "trace": cmd_trace,
            "search": cmd_search, "export": cmd_export, "estimate": _cmd_estimate,
            "rank": _cmd_rank, "calibrate": _cmd_calibrate, "dashboard": cmd_dashboard}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    debug = getattr(args, "debug", False)
    from db.errors import StorageError

    try:
        return COMMANDS[args.command](args)
    except (AutotuneError, StorageError) as e:
        if debug:
            traceback.print_exc()
            tb = getattr(e, "traceback", "")
            if tb:
                print(tb, file=sys.stderr)
        print(f"autotune: error: {e}", file=sys.stderr)
        return getattr(e, "exit_code", EXIT_RUNTIME)
    except KeyboardInterrupt:
        print("autotune: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # an internal bug: still one line unless --debug
        if debug:
            traceback.print_exc()
        print(f"autotune: internal error: {type(e).__name__}: {e} (rerun with --debug for the "
              "traceback)", file=sys.stderr)
        return EXIT_RUNTIME


if __name__ == "__main__":
    sys.exit(main())
