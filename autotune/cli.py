"""Command line: ``autotune trial`` runs one configuration on Ray and prints its metrics.

Every error a user can cause is one line on stderr and a non-zero exit (2: usage, 1: runtime);
``--debug`` adds the traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Sequence

from autotune.config import TrialConfig
from autotune.errors import EXIT_RUNTIME, EXIT_USAGE, AutotuneError

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
    _add_cluster_args(trial)
    trial.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show tracebacks on errors")
    return parser


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


def cmd_trial(args: argparse.Namespace) -> int:
    config = TrialConfig.from_file(args.config) if args.config else TrialConfig()
    config.validate()  # before importing torch and Ray: bad input fails in a fraction of a second
    if config.workload.workload:
        from autotune.models.workload import load_builder

        load_builder(config.workload.workload)  # fail here, not on every rank, if it won't import
    from autotune.executor import ExecutorSettings, RayExecutor

    settings = ExecutorSettings(ray_address=args.ray_address, trial_timeout_s=args.timeout,
                                cpus_per_rank=args.cpus_per_rank)
    if not args.json:
        print(f"running {config.workload.name}: world {config.world_size} = tp "
              f"{config.tp_degree} × pp {config.pp_degree} × dp {config.dp_degree}, ZeRO-"
              f"{config.zero_stage}, micro-batch {config.micro_batch_size} × "
              f"{config.grad_accum_steps} accumulation …", file=sys.stderr, flush=True)
    with RayExecutor(settings) as executor:
        result = executor.run(config)
    if args.json:
        json.dump(result.to_dict(), sys.stdout, indent=2)
        print()
    else:
        print(format_result(result))
    return 0


def format_result(result) -> str:
    from autotune.result import TrialResult

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


COMMANDS = {"trial": cmd_trial}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    debug = getattr(args, "debug", False)
    try:
        return COMMANDS[args.command](args)
    except AutotuneError as e:
        if debug:
            traceback.print_exc()
            tb = getattr(e, "traceback", "")
            if tb:
                print(tb, file=sys.stderr)
        print(f"autotune: error: {e}", file=sys.stderr)
        return e.exit_code
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
