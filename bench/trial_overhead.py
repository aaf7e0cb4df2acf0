"""Per-trial overhead of the Ray executor, and the harness's step time against a plain DDP loop.

Measures, for the built-in tiny GPT at world size 2 on CPU (gloo):

1. Ray start (once), then the per-trial overhead (``TrialResult.overhead_s`` = executor wall time
   minus the slowest rank's time in steps) of a COLD trial (the call creates the worker group:
   placement group, actors, process group; ``discard_group()`` between samples) and of a WARM one
   (repeated calls on the same group).
2. The harness's step time (``TrialResult.step_time_s``) against a hand-written
   ``torch.multiprocessing`` + gloo + DDP loop of the same model, batch, optimizer and step
   counts, timed the same way (median over timed steps of the slowest rank). The two alternate
   for ``--rounds`` rounds (ABBA order) while the Ray worker group sits idle between calls.
   Both sides' niceness is printed: the executor starts local Ray workers at niceness 0 (Ray's
   own default is 15, ``RAY_worker_niceness``); ``--plain-niceness N`` runs the plain loop at
   another niceness, to tell priority apart from per-step overhead under CPU load.

Usage (from the repo root)::

    python bench/trial_overhead.py                 # table
    python bench/trial_overhead.py --json          # raw figures as JSON
    python bench/trial_overhead.py --repeats 2 --rounds 1 --timed 5   # quick smoke run
"""

from __future__ import annotations

import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from types import SimpleNamespace  # noqa: E402

WORLD_SIZE = 2
WARM_OVERHEAD_TARGET_S = 1.0
STEP_RATIO_TOLERANCE = 0.05
PLAIN_LR = 1e-3  # autotune.trial.parallel.zero.LEARNING_RATE


def log(msg: str) -> None:
    print(f"[trial_overhead] {msg}", file=sys.stderr, flush=True)


# ---- the plain hand-written DDP loop ------------------------------------------------------
def _plain_rank(
    rank: int, world_size: int, config_dict: dict, out_dir: str, niceness: int | None
) -> None:
    """One rank of the reference loop (module level so torch.multiprocessing spawn can pickle)."""
    if niceness is not None and niceness > os.nice(0):
        os.nice(niceness - os.nice(0))  # raising niceness needs no privilege
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from autotune.config import TrialConfig
    from autotune.trial.models.build import build_workload

    t0 = time.perf_counter()
    torch.set_num_threads(1)  # 2 cores / 2 local ranks, as the harness's workers do
    # A file rendezvous: no free-port race with other processes on a busy machine (gloo's own
    # connections are the same loopback TCP pairs as with a tcp:// rendezvous).
    dist.init_process_group(
        "gloo",
        init_method=f"file://{os.path.join(out_dir, 'store')}",
        rank=rank,
        world_size=world_size,
    )
    try:
        config = TrialConfig.from_dict(config_dict)
        workload = build_workload(config.workload, attention=config.attention, seed=config.seed)
        model = DDP(workload.model, bucket_cap_mb=config.bucket_mb, gradient_as_bucket_view=True)
        optimizer = torch.optim.AdamW(model.parameters(), lr=PLAIN_LR, weight_decay=0.0)
        rows = config.workload.global_batch_size // world_size
        lo, hi = rank * rows, (rank + 1) * rows
        setup_s = time.perf_counter() - t0
        step_times: list[float] = []
        losses: list[torch.Tensor] = []
        for step in range(config.num_warmup_steps + config.num_timed_steps):
            start = time.perf_counter()
            inputs, targets = workload.batch(step)
            inputs, targets = inputs[lo:hi], targets[lo:hi]
            loss = workload.loss_fn(model(inputs), targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step_times.append(time.perf_counter() - start)
            losses.append(loss.detach())
        # Global-batch mean loss per step (outside the timed region), to check both loops
        # train the same thing.
        stacked = torch.stack(losses)
        dist.all_reduce(stacked)
        global_losses = (stacked / world_size).tolist()
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(
                {
                    "rank": rank,
                    "step_times": step_times,
                    "losses": global_losses,
                    "setup_s": setup_s,
                    "num_threads": torch.get_num_threads(),
                    "niceness": os.nice(0),
                },
                f,
            )
    finally:
        dist.destroy_process_group()


def run_plain(config, niceness: int | None = None) -> dict:
    """Spawn WORLD_SIZE processes running the plain loop; return its step time and raw data."""
    import torch.multiprocessing as mp

    from autotune.trial.result import summarize_steps

    with tempfile.TemporaryDirectory(prefix="plain_ddp_") as out_dir:
        start = time.perf_counter()
        mp.spawn(
            _plain_rank,
            args=(WORLD_SIZE, config.to_dict(), out_dir, niceness),
            nprocs=WORLD_SIZE,
            join=True,
            start_method="spawn",
        )
        wall = time.perf_counter() - start
        ranks = []
        for r in range(WORLD_SIZE):
            with open(os.path.join(out_dir, f"rank{r}.json")) as f:
                ranks.append(json.load(f))

    # summarize_steps only reads .step_times: the harness's own definition of the step time.
    step_time, steps_s = summarize_steps(
        [SimpleNamespace(step_times=r["step_times"]) for r in ranks], config.timed_steps
    )
    return {
        "step_time_s": step_time,
        "steps_s": steps_s,
        "wall_s": wall,
        "losses": ranks[0]["losses"],
        "setup_s": max(r["setup_s"] for r in ranks),
        "num_threads": [r["num_threads"] for r in ranks],
        "niceness": [r["niceness"] for r in ranks],
        "step_times": [r["step_times"] for r in ranks],
    }


# ---- the harness --------------------------------------------------------------------------
def _niceness(pid: int) -> int | None:
    try:
        return os.getpriority(os.PRIO_PROCESS, pid)
    except OSError:  # a remote node's pid, or the process is gone
        return None


def trial_record(result) -> dict:
    return {
        "wall_s": result.wall_s,
        "steps_s": result.steps_s,
        "overhead_s": result.overhead_s,
        "cold_start": result.cold_start,
        "step_time_s": result.step_time_s,
        "setup_s": max(r.setup_s for r in result.ranks),
        "memory_step_s": max(r.step_times[-1] for r in result.ranks),
        "num_threads": [r.num_threads for r in result.ranks],
        "niceness": [_niceness(r.extra.get("pid", -1)) for r in result.ranks],
    }


def stats(values: list[float]) -> dict:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
        "values": values,
    }


def run_benchmark(args) -> dict:
    from autotune.config import TrialConfig, WorkloadSpec
    from autotune.trial.executor import RayExecutor

    gb = args.global_batch
    if gb % WORLD_SIZE:
        raise SystemExit(f"--global-batch {gb} must be divisible by world size {WORLD_SIZE}")
    config = TrialConfig(
        workload=WorkloadSpec(
            family="gpt", size="tiny", seq_len=args.seq_len, global_batch_size=gb
        ),
        world_size=WORLD_SIZE,
        zero_stage=0,
        micro_batch_size=gb // WORLD_SIZE,
        num_warmup_steps=args.warmup,
        num_timed_steps=args.timed,
        device="cpu",
    )
    config.validate()
    assert config.grad_accum_steps == 1

    out: dict = {
        "config": config.resolved(),
        "args": {k: v for k, v in vars(args).items() if k != "json"},
    }
    executor = RayExecutor()
    try:
        log("starting Ray")
        t = time.perf_counter()
        executor.start()
        out["ray_start_s"] = time.perf_counter() - t

        cold = []
        for i in range(args.cold_repeats):
            if i:
                executor.discard_group()
            log(f"cold trial {i + 1}/{args.cold_repeats}")
            r = executor.run(config)
            if not r.cold_start:
                raise RuntimeError("expected a cold start after discard_group()")
            cold.append(trial_record(r))
        # Warm trials alternate the default (num_profiled_steps steps under the profiler, which
        # count as overhead: they are neither warm-up, timed nor memory steps) with none.
        unprofiled = dataclasses.replace(config, num_profiled_steps=0)
        warm, warm_bare = [], []
        for i in range(2 * args.repeats):
            which, runs = ((config, warm), (unprofiled, warm_bare))[i % 2]
            log(
                f"warm trial {i // 2 + 1}/{args.repeats}, profiled steps {which.num_profiled_steps}"
            )
            r = executor.run(which)
            if r.cold_start:
                raise RuntimeError("expected a warm trial on the existing group")
            runs.append(trial_record(r))
        out["cold"], out["warm"], out["warm_unprofiled"] = cold, warm, warm_bare

        rounds = []
        for k in range(args.rounds):
            harness_first = k % 2 == 0  # ABBA: cancels a linear drift in machine speed
            entry: dict = {"harness_first": harness_first}
            for which in ("harness", "plain") if harness_first else ("plain", "harness"):
                log(f"round {k + 1}/{args.rounds}: {which}")
                if which == "harness":
                    r = executor.run(config)
                    entry["harness"] = {**trial_record(r), "losses": r.losses}
                else:
                    entry["plain"] = run_plain(config, args.plain_niceness)
            h, p = entry["harness"], entry["plain"]
            entry["ratio"] = h["step_time_s"] / p["step_time_s"]
            n = config.num_warmup_steps + config.num_timed_steps
            entry["max_loss_diff"] = max(
                abs(a - b) for a, b in zip(h["losses"][:n], p["losses"][:n])
            )
            rounds.append(entry)
        out["rounds"] = rounds
    finally:
        executor.close()

    out["summary"] = {
        "ray_start_s": out["ray_start_s"],
        "cold_overhead_s": stats([c["overhead_s"] for c in cold]),
        "warm_overhead_s": stats([w["overhead_s"] for w in warm]),
        "warm_unprofiled_overhead_s": stats([w["overhead_s"] for w in warm_bare]),
        "cold_setup_s": stats([c["setup_s"] for c in cold]),
        "warm_setup_s": stats([w["setup_s"] for w in warm]),
        "harness_step_s": stats([e["harness"]["step_time_s"] for e in rounds]),
        "plain_step_s": stats([e["plain"]["step_time_s"] for e in rounds]),
        "ratio": stats([e["ratio"] for e in rounds]),
    }
    out["summary"]["best_ratio"] = (
        out["summary"]["harness_step_s"]["min"] / out["summary"]["plain_step_s"]["min"]
    )
    s = out["summary"]
    warm_med = s["warm_overhead_s"]["median"]
    ratio_med = s["ratio"]["median"]
    out["targets"] = {
        "warm_overhead_lt_1s": {"value": warm_med, "met": warm_med < WARM_OVERHEAD_TARGET_S},
        "harness_step_within_5pct": {
            "value": ratio_med,
            "met": abs(ratio_med - 1.0) <= STEP_RATIO_TOLERANCE,
        },
    }
    return out


# ---- output -------------------------------------------------------------------------------
def format_table(out: dict) -> str:
    s = out["summary"]
    cfg = out["config"]
    wl = cfg["workload"]
    lines = [
        f"trial overhead (tiny gpt, world {WORLD_SIZE}, CPU/gloo; seq_len {wl['seq_len']}, "
        f"global batch {wl['global_batch_size']}, warm-up {cfg['num_warmup_steps']}, "
        f"timed {cfg['num_timed_steps']})",
        f"{'phase':<16}{'median_s':>10}{'min_s':>10}{'max_s':>10}{'n':>4}",
    ]

    def row(name: str, st: dict) -> str:
        return f"{name:<16}{st['median']:>10.3f}{st['min']:>10.3f}{st['max']:>10.3f}{st['n']:>4}"

    rs = out["ray_start_s"]
    lines.append(row("ray start", {"median": rs, "min": rs, "max": rs, "n": 1}))
    lines.append(row("cold trial", s["cold_overhead_s"]))
    lines.append(row("  rank setup", s["cold_setup_s"]))
    lines.append(row("warm trial", s["warm_overhead_s"]))
    lines.append(row("  rank setup", s["warm_setup_s"]))
    lines.append(row("warm, 0 profiled", s["warm_unprofiled_overhead_s"]))
    lines.append(
        f"(trial rows: overhead_s = executor wall - slowest rank's time in warm-up, "
        f"timed and memory steps, so it includes the {cfg['num_profiled_steps']} "
        "profiled steps every trial runs by default; '0 profiled' runs none, "
        "alternating with the default; 'rank setup' = build + parallelise, part of "
        "the overhead)"
    )
    lines.append("")
    h0, p0 = out["rounds"][0]["harness"], out["rounds"][0]["plain"]
    lines.append(
        f"(threads per rank: harness {h0['num_threads']}, plain {p0['num_threads']}; "
        f"niceness: harness {h0['niceness']}, plain {p0['niceness']})"
    )
    lines.append(
        f"{'step time':<16}{'harness_ms':>12}{'plain_ms':>10}{'ratio':>8}"
        f"{'  order':<16}{'loss_diff':>10}"
    )
    for i, e in enumerate(out["rounds"], 1):
        order = "harness,plain" if e["harness_first"] else "plain,harness"
        lines.append(
            f"{'round ' + str(i):<16}{e['harness']['step_time_s'] * 1e3:>12.2f}"
            f"{e['plain']['step_time_s'] * 1e3:>10.2f}{e['ratio']:>8.3f}"
            f"  {order:<14}{e['max_loss_diff']:>10.1e}"
        )
    lines.append(
        f"{'median':<16}{s['harness_step_s']['median'] * 1e3:>12.2f}"
        f"{s['plain_step_s']['median'] * 1e3:>10.2f}{s['ratio']['median']:>8.3f}"
    )
    best_h, best_p = s["harness_step_s"]["min"], s["plain_step_s"]["min"]
    lines.append(f"{'best':<16}{best_h * 1e3:>12.2f}{best_p * 1e3:>10.2f}{best_h / best_p:>8.3f}")
    lines.append(
        "(median row: medians of each column, the ratio the median of the per-round "
        "ratios; best row: fastest round of each, less sensitive to other load)"
    )
    lines.append("")
    lines.append(
        f"targets: warm overhead < {WARM_OVERHEAD_TARGET_S:g} s; harness step within "
        f"{STEP_RATIO_TOLERANCE:.0%} of plain loop"
    )
    t = out["targets"]
    w = t["warm_overhead_lt_1s"]
    lines.append(
        f"warm overhead < {WARM_OVERHEAD_TARGET_S:g} s: median {w['value']:.3f} s -> "
        f"{'met' if w['met'] else 'NOT MET'}"
    )
    r = t["harness_step_within_5pct"]
    lines.append(
        f"harness step within {STEP_RATIO_TOLERANCE:.0%} of plain loop: median ratio "
        f"{r['value']:.3f} ({(r['value'] - 1) * 100:+.1f}%) -> "
        f"{'met' if r['met'] else 'NOT MET'}"
    )
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="warm trials (default 5); cold trials default to min(3, this)",
    )
    p.add_argument(
        "--cold-repeats", type=int, default=None, help="cold trials (default min(3, --repeats))"
    )
    p.add_argument(
        "--rounds", type=int, default=3, help="interleaved harness / plain-loop rounds (default 3)"
    )
    p.add_argument("--seq-len", type=int, default=128, help="tokens per sequence (default 128)")
    p.add_argument(
        "--global-batch",
        type=int,
        default=16,
        help="sequences per step over both ranks (default 16)",
    )
    p.add_argument("--warmup", type=int, default=3, help="warm-up steps (default 3)")
    p.add_argument("--timed", type=int, default=20, help="timed steps (default 20)")
    p.add_argument(
        "--plain-niceness",
        type=int,
        default=None,
        help="run the plain loop's ranks at this niceness (e.g. 15, as Ray runs its "
        "workers) instead of the inherited one",
    )
    p.add_argument("--json", action="store_true", help="print the raw figures as JSON")
    args = p.parse_args(argv)
    if args.cold_repeats is None:
        args.cold_repeats = min(3, args.repeats)
    for name in ("repeats", "cold_repeats", "rounds", "timed"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.warmup < 0:
        p.error("--warmup must be >= 0")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    out = run_benchmark(args)
    out["bench_wall_s"] = time.perf_counter() - start
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(format_table(out))
        print(f"(benchmark wall time {out['bench_wall_s']:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
