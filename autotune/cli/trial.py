"""``autotune trial`` runs one configuration on Ray, prints its metrics and stores it;
``autotune profile`` is the same trial with profiled steps, and prints its per-rank timeline
breakdown as well."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from autotune.cli.args import (
    EXAMPLES,
    add_debug_arg,
    add_ray_args,
    add_store_db_arg,
    executor_settings,
    opened_db,
)
from autotune.config import TrialConfig

PROFILED_STEPS = TrialConfig().num_profiled_steps
"""What ``profile`` runs when the config asks for no profiled steps."""


def add_parser(sub) -> None:
    """Adds ``trial`` and ``profile``."""
    trial = sub.add_parser(
        "trial",
        help="run one configuration as a real multi-process trial",
        description="Run one TrialConfig on a Ray worker group and print "
        "step time, throughput, losses and per-rank memory. " + EXAMPLES,
    )
    trial.add_argument(
        "--config",
        metavar="FILE",
        help="TrialConfig JSON (default: the built-in tiny GPT on 2 ranks)",
    )
    trial.add_argument(
        "--json", action="store_true", help="print the full result as JSON on stdout"
    )
    add_store_db_arg(trial)
    add_ray_args(trial)
    add_debug_arg(trial)
    trial.set_defaults(run=run)

    profile = sub.add_parser(
        "profile",
        help="run one configuration and print its per-rank timeline breakdown",
        description="Run a TrialConfig with profiled steps after the timed ones, store it, and "
        "print compute / communication / overlap / exposed communication / idle per rank and "
        "the bytes each collective moves per step. " + EXAMPLES,
    )
    profile.add_argument("--config", metavar="FILE", help="TrialConfig JSON (default: built-in)")
    add_store_db_arg(profile)
    add_ray_args(profile)
    add_debug_arg(profile)
    profile.set_defaults(run=run_profile)


def run(args: argparse.Namespace) -> int:
    result, trial_id = run_one(args, quiet=args.json)
    if args.json:
        json.dump({**result.to_dict(), "trial_id": trial_id}, sys.stdout, indent=2)
        print()
    else:
        print(format_result(result))
    return 0


def run_profile(args: argparse.Namespace) -> int:
    result, _ = run_one(args, quiet=False, profiled=True)
    print(format_result(result))
    print()
    print(format_breakdown([s for r in result.ranks for s in r.spans]))
    return 0


def run_one(args: argparse.Namespace, *, quiet: bool, profiled: bool = False):
    """Validate, open the database, run the trial on Ray, store it: (result, trial id)."""
    config = TrialConfig.from_file(args.config) if args.config else TrialConfig()
    if profiled and config.num_profiled_steps == 0:
        config = dataclasses.replace(config, num_profiled_steps=PROFILED_STEPS)
    config.validate()  # before importing torch and Ray: bad input fails in a fraction of a second
    # A bad URL fails before any trial runs.
    with opened_db(args.db) as database:
        if config.workload.workload:
            from autotune.trial.models.build import load_builder

            load_builder(config.workload.workload)  # fail here, not on every rank
        from autotune.trial.executor import RayExecutor

        settings = executor_settings(args)
        if not quiet:
            print(
                f"running {config.workload.name}: world {config.world_size} = tp "
                f"{config.tp_degree} × pp {config.pp_degree} × cp {config.cp_degree} × dp "
                f"{config.dp_degree}, ZeRO-"
                f"{config.zero_stage}, micro-batch {config.micro_batch_size} × "
                f"{config.grad_accum_steps} accumulation …",
                file=sys.stderr,
                flush=True,
            )
        with RayExecutor(settings) as executor:
            result = executor.run(config)
        trial_id = None
        if database is not None:
            from autotune.study.store import store_result

            trial_id = store_result(database, result)
            if not quiet:
                print(f"stored as trial {trial_id} in {database.url_for_display}", file=sys.stderr)
        return result, trial_id


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
            f"{b.num_steps:>6}"
        )
    lines.append(
        "(per step, averaged over the profiled steps; overlap = |comm ∩ compute| / |comm|)"
    )
    lines += ["", "rank  kind  collective        group        MB/step"]
    for rank, by_key in sorted(bytes_per_step(spans).items()):
        for (kind, name, group), nbytes in sorted(by_key.items()):
            lines.append(
                f"{rank:>4}  {kind:<5} {name:<17} {group or '-':<8} {nbytes / 2**20:>11.3f}"
            )
    return "\n".join(lines)


def format_result(result) -> str:
    from autotune.trial.result import TrialResult

    assert isinstance(result, TrialResult)
    c, derived = result.config, result.config["derived"]
    w = c["workload"]
    name = w["workload"] or f"{w['family']}-{w['size']}"
    overlap = "on" if c["overlap_enabled"] else "off"
    lines = [
        f"workload     {name}"
        f"  seq {c['workload']['seq_len']}  global batch {c['workload']['global_batch_size']}",
        f"layout       world {c['world_size']} = tp {c['tp_degree']} × pp {c['pp_degree']} × "
        f"cp {c.get('cp_degree', 1)} × dp {derived['dp_degree']}   ZeRO-{c['zero_stage']}   "
        f"micro-batch {c['micro_batch_size']} × accumulation {derived['grad_accum_steps']}",
        f"knobs        bucket {c['bucket_mb']:g} MB   overlap {overlap}"
        f"   activation ckpt {c['activation_checkpointing']}"
        + (f" (first {c['ac_layers']} blocks per stage)" if c.get("ac_layers") else "")
        + f"   attention {c['attention']}"
        + ("   sequence parallel" if c.get("sequence_parallel") else "")
        + (f"   HSDP {c['dp_replicate']} replicas" if c.get("dp_replicate", 1) > 1 else "")
        + (f"   schedule {c['pp_schedule']}" if c["pp_degree"] > 1 else "")
        + (
            f" × {c['virtual_stages']} virtual stages"
            if c["pp_degree"] > 1 and c["pp_schedule"] == "interleaved_1f1b"
            else ""
        )
        + ("   compiled" if c.get("compile") else "")
        + ("   float8" if c.get("float8") else ""),
        f"device       {result.env['device']} ({result.env['backend']}), "
        f"{result.env['threads_per_rank']} thread(s) per rank",
        "",
        f"step time    {result.step_time_s * 1e3:.2f} ms (median of the slowest rank over "
        f"{c['num_timed_steps']} timed steps)",
        f"throughput   {result.throughput_tokens_per_s:,.0f} tokens/s"
        + (f"   MFU {result.mfu:.1%}" if result.mfu is not None else ""),
        f"losses       {' '.join(f'{x:.4f}' for x in result.losses)}",
        f"overhead     {result.overhead_s:.3f} s ({'cold' if result.cold_start else 'warm'} "
        f"worker group; wall {result.wall_s:.2f} s)"
        + (
            f"\ncompile      {result.compile_s:.2f} s (setup: the first warm-up step's excess "
            "over a timed step)"
            if result.compile_s is not None
            else ""
        ),
        "",
        "rank  pp dp tp   params MB   grads MB   optim MB   activ. MB   other MB    peak MB",
    ]
    mb = 2**20
    for r in result.ranks:
        m = r.memory
        lines.append(
            f"{r.rank:>4}  {r.pp_rank:>2} {r.dp_rank:>2} {r.tp_rank:>2}  "
            f"{m.parameters / mb:>10.2f} {m.gradients / mb:>10.2f} {m.optimizer_state / mb:>10.2f} "
            f"{m.activations / mb:>11.2f} {m.other / mb:>10.2f} {m.peak / mb:>10.2f}"
        )
    lines.append(f"memory measured by {result.ranks[0].memory.source}")
    return "\n".join(lines)
