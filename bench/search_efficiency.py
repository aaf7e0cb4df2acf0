"""Search efficiency: trials (and wall time) each strategy needs to come within 3% of the best.

One run, tiny GPT on 2 CPU ranks, on a fixed space small enough to sweep exhaustively:
1. the exhaustive grid is measured ``--sweeps`` times through the real executor (every
   configuration, its timed throughput and per-rank memory), in DeepSpeed's grid order;
2. each strategy is then replayed against that table (a tabular benchmark: a strategy that
   proposes a configuration gets the measured result, and pays its measured wall time), so all
   strategies see the same, noise-free numbers:
   - grid: the exhaustive order (DeepSpeed autotuner's default tuner);
   - random: a seeded random order;
   - ds-heuristic: DeepSpeed-autotuner style — ZeRO stage by stage, the largest micro-batch
     that fits (by our memory model) then smaller ones until throughput stops improving; tp/pp
     1, no activation checkpointing (knobs DeepSpeed's autotuner does not tune);
   - autotune-<sampler>: ``autotune.search.search.Search`` (define-by-run space, enqueued baseline,
     dedup) with each Optuna sampler it offers (TPE, GP, random), on an executor that replays
     the table; and each "(no baseline)": the same without the enqueued baseline trial
     (``Search.open(..., baseline=None)``), which measures the sampler alone. The search's default
     sampler is the one that needs the fewest trials without the baseline.
   "Trials to 3%" = trials run until one within 3% of the grid's best has been measured;
   medians over ``--seeds`` seeds × ``--sweeps`` independently measured sweeps (the tiny
   workload's configurations lie within a few percent of each other on 2 cores, so which one is
   best changes between sweeps; one sweep decides nothing).
3. the memory model: predicted against measured peak per rank over every configuration of the
   sweep (median and worst relative error), and configurations the search would run under a
   limit (the median predicted peak; predicted × (1 + MEMORY_MARGIN) within it) that measured
   over it.

Usage: python bench/search_efficiency.py [--sweeps 3] [--seeds 5] [--json] [--memory-only]

``--memory-only`` measures the sweeps and reports the memory model alone (3 above), without
replaying the strategies: each replayed search refits the study's calibration after every
trial, so the replays take most of the run.
"""

from __future__ import annotations

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import sys
import tempfile  # noqa: E402
import time  # noqa: E402

import common  # noqa: E402,F401  (the repository on the path)
from testkit.replay_table import MeasuredRow, TableExecutor  # noqa: E402

from autotune.config import TrialConfig  # noqa: E402
from autotune.layouts import short_name  # noqa: E402
from autotune.model.memory import estimate_memory  # noqa: E402
from autotune.search.search import (  # noqa: E402
    DEFAULT_SAMPLER,
    SAMPLERS,
    Search,
    SearchSpec,
)
from autotune.search.space import SearchSpace  # noqa: E402
from autotune.trial.executor import RayExecutor  # noqa: E402
from db import Database  # noqa: E402

SPACE = dict(
    fixed={"bucket_mb": 25.0, "overlap_enabled": True},
    narrowed={"activation_checkpointing": ["none", "full"]},
)
WITHIN = 0.03


def make_spec(seed: int, n_trials: int) -> SearchSpec:
    return SearchSpec(
        world_size=2,
        n_trials=n_trials,
        patience=None,
        seed=seed,
        device="cpu",
        num_warmup_steps=2,
        num_timed_steps=5,
        num_profiled_steps=0,
        top_k=1,
        remeasure_repeats=0,
        study_name=f"seed{seed}",
        **SPACE,
    )


class TargetReached(Exception):
    """Raised by ``Replay`` once a configuration within the target has been run."""


class Replay:
    """The search's executor on a measured sweep: ``replay_table.TableExecutor`` finds the
    row that measured a proposed configuration (whatever its seed), the sweep's TrialResult of
    that row is the answer, and the search ends at the target (only the trials up to the first
    hit are counted)."""

    def __init__(self, table: dict, target: float) -> None:
        self.table, self.target, self.calls = table, target, []
        self.executor = TableExecutor(
            MeasuredRow(c, None, r.step_time_s, r.peak_memory_bytes, "complete")
            for c, r in table.items()
        )

    def run(self, config: TrialConfig):
        key = self.executor.row_for(config).config
        self.calls.append(key)
        if self.table[key].throughput_tokens_per_s >= self.target:
            raise TargetReached
        return dataclasses.replace(self.table[key], config=config.resolved())


def trials_to_target(order: list[TrialConfig], table: dict, target: float) -> tuple[int, float]:
    """(trials until the first within target, wall seconds spent), or (inf, total) if never."""
    wall = 0.0
    for i, c in enumerate(order, 1):
        wall += table[c].wall_s
        if table[c].throughput_tokens_per_s >= target:
            return i, wall
    return float("inf"), wall


def ds_heuristic(space: SearchSpace, table: dict) -> list[TrialConfig]:
    """DeepSpeed-autotuner style: per ZeRO stage, largest fitting micro-batch first, then
    smaller until throughput stops improving; tp = pp = 1, no activation checkpointing."""
    order = []
    plain = [
        c
        for c in space.configs
        if c.tp_degree == 1 and c.pp_degree == 1 and c.activation_checkpointing == "none"
    ]
    for stage in sorted({c.zero_stage for c in plain}):
        candidates = sorted(
            (c for c in plain if c.zero_stage == stage), key=lambda c: -c.micro_batch_size
        )
        best = 0.0
        for c in candidates:
            order.append(c)
            value = table[c].throughput_tokens_per_s
            if value < best:
                break
            best = value
    return order


def measure_grid(configs: list[TrialConfig]) -> tuple[dict, float]:
    """One exhaustive sweep through the real executor: {config: TrialResult}, seconds."""
    table = {}
    start = time.monotonic()
    with RayExecutor() as ex:
        ex.start()
        for c in configs:
            table[c] = ex.run(c)
    return table, time.monotonic() - start


def strategies(space: SearchSpace, table: dict, seeds: int, db) -> dict[str, list]:
    """{strategy: [(trials to target, wall s), …]} for one measured sweep."""
    configs = space.configs
    best = max(r.throughput_tokens_per_s for r in table.values())
    target = best * (1 - WITHIN)
    rows = {"grid": [trials_to_target(configs, table, target)], "random": []}
    for seed in range(seeds):
        order = list(configs)
        random.Random(seed).shuffle(order)
        rows["random"].append(trials_to_target(order, table, target))
    rows["ds-heuristic"] = [trials_to_target(ds_heuristic(space, table), table, target)]
    for sampler in SAMPLERS:
        for baseline in (True, False):
            name = f"autotune-{sampler}" + ("" if baseline else " (no baseline)")
            rows[name] = []
            for seed in range(seeds):
                replay = Replay(table, target)
                spec = dataclasses.replace(
                    make_spec(seed, len(configs)),
                    sampler=sampler,
                    study_name=f"{name}-{seed}-{id(table)}",
                )
                search = Search.open(
                    spec, db, replay, out=None, baseline="plain" if baseline else None
                )
                try:
                    search.run()
                except TargetReached:
                    pass
                rows[name].append(trials_to_target(replay.calls, table, target))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument(
        "--sweeps",
        type=int,
        default=3,
        help="exhaustive sweeps measured (each replayed with every seed)",
    )
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--memory-only",
        action="store_true",
        help="measure the sweeps and report the memory model, without the strategies' replays",
    )
    args = p.parse_args()
    space = SearchSpace(
        TrialConfig(
            world_size=2, device="cpu", num_warmup_steps=2, num_timed_steps=5, num_profiled_steps=0
        ),
        **SPACE,
    )
    configs = space.configs
    rows: dict[str, list] = {}
    sweeps = []
    pairs = []
    predicted = {c: estimate_memory(c).total for c in configs}
    limit = statistics.median(predicted.values())
    with tempfile.TemporaryDirectory() as tmp:
        db = Database.open(f"sqlite:///{tmp}/bench.db")
        for sweep in range(args.sweeps):
            print(
                f"[search_efficiency] sweep {sweep + 1}/{args.sweeps}: measuring "
                f"{len(configs)} configurations …",
                file=sys.stderr,
                flush=True,
            )
            table, sweep_s = measure_grid(configs)
            best_config = max(table, key=lambda c: table[c].throughput_tokens_per_s)
            heuristic = ds_heuristic(space, table)
            sweeps.append(
                {
                    "sweep_s": sweep_s,
                    "best_tokens_per_s": table[best_config].throughput_tokens_per_s,
                    "best": short_name(best_config),
                    "ds_heuristic_gap": 1
                    - max(table[c].throughput_tokens_per_s for c in heuristic)
                    / table[best_config].throughput_tokens_per_s,
                }
            )
            if not args.memory_only:
                for name, results in strategies(space, table, args.seeds, db).items():
                    rows.setdefault(name, []).extend(results)
            # memory model against measurement
            pairs += [(predicted[c], r.peak_memory_bytes) for c, r in table.items()]
        db.close()
    if args.memory_only:
        memory = common.memory_error_summary(pairs, limit)
        if args.json:
            print(json.dumps({"grid_size": len(configs), "sweeps": sweeps, "memory_model": memory}))
        else:
            print(f"{len(sweeps)} sweeps of {len(configs)} configurations")
            _print_sweeps(sweeps)
            _print_memory(memory, limit)
        return

    summary = {}
    for name, results in rows.items():
        trials = [t for t, _ in results]
        walls = [w for _, w in results]
        summary[name] = {
            "median_trials": statistics.median(trials),
            "median_wall_s": statistics.median(walls),
            "fraction_of_grid": statistics.median(trials) / len(configs),
            "mean_fraction_of_grid": statistics.fmean(min(t, len(configs)) for t in trials)
            / len(configs),
            "runs": len(results),
        }
    samplers = {s: summary[f"autotune-{s} (no baseline)"] for s in SAMPLERS}
    chosen = min(
        SAMPLERS, key=lambda s: (samplers[s]["median_trials"], samplers[s]["mean_fraction_of_grid"])
    )
    report = {
        "grid_size": len(configs),
        "sweeps": sweeps,
        "strategies": summary,
        "best_sampler": chosen,
        "default_sampler": DEFAULT_SAMPLER,
        "memory_model": common.memory_error_summary(pairs, limit),
    }
    if args.json:
        print(json.dumps(report, indent=2, default=float))
        return
    print(
        f"search efficiency (tiny gpt, world 2, CPU/gloo): grid of {len(configs)} "
        f"configurations, {args.sweeps} sweeps × {args.seeds} seeds, target: within "
        f"{WITHIN:.0%} of each sweep's exhaustive best"
    )
    _print_sweeps(sweeps)
    print(
        f"{'strategy':<32}{'runs':>5}{'median trials':>15}{'% of grid':>11}"
        f"{'mean % of grid':>16}{'median wall s':>15}"
    )
    for name, s in summary.items():
        print(
            f"{name:<32}{s['runs']:>5}{s['median_trials']:>15}{s['fraction_of_grid']:>11.0%}"
            f"{s['mean_fraction_of_grid']:>16.0%}{s['median_wall_s']:>15.1f}"
        )
    print("(inf = never within 3%; mean % of grid counts a never as the whole grid)")
    _print_memory(report["memory_model"], limit)
    print(
        f"fewest trials without the baseline: sampler '{chosen}' (the search's default is "
        f"'{DEFAULT_SAMPLER}')"
    )
    best = summary[f"autotune-{DEFAULT_SAMPLER}"]
    target_met = best["fraction_of_grid"] <= 0.20
    print(
        f"target: within 3% in ≤ 20% of the grid's trials -> "
        f"{'met' if target_met else 'NOT met'} ({best['median_trials']} of {len(configs)})"
    )


def _print_sweeps(sweeps: list[dict]) -> None:
    for i, sw in enumerate(sweeps, 1):
        print(
            f"  sweep {i}: best {sw['best']} {sw['best_tokens_per_s']:,.0f} tok/s "
            f"({sw['sweep_s']:.0f}s); ds-heuristic's best {sw['ds_heuristic_gap']:.1%} below"
        )


def _print_memory(m: dict, limit: float) -> None:
    print(
        f"memory model, predicted vs measured peak per rank over {m['measurements']} "
        f"measurements: median |error| {m['median_abs_rel_error']:.1%}, worst "
        f"under-prediction {m['worst_under']:.1%}, worst over-prediction "
        f"{m['worst_over']:.1%}; predicted to fit {limit / 2**20:.1f} MiB but measured "
        f"over: {m['fit_but_measured_over']}"
    )


if __name__ == "__main__":
    main()
