"""Search efficiency: trials (and wall time) each strategy needs to come within 3% of the best.

One run, tiny GPT on 2 CPU ranks, on a fixed space small enough to sweep exhaustively:
1. the exhaustive grid is measured once through the real executor (every configuration, the
   throughput of its timed steps and its per-rank memory), in DeepSpeed's grid-tuner order;
2. each strategy is then replayed against that table (a tabular benchmark: a strategy that
   proposes a configuration gets the measured result, and pays its measured wall time), so all
   strategies see the same, noise-free numbers:
   - grid: the exhaustive order (DeepSpeed autotuner's default tuner);
   - random: a seeded random order;
   - ds-heuristic: DeepSpeed-autotuner style — ZeRO stage by stage, the largest micro-batch
     that fits (by our memory model) then smaller ones until throughput stops improving; tp/pp
     1, no activation checkpointing (knobs DeepSpeed's autotuner does not tune);
   - autotune: ``autotune.search.Search`` (Optuna TPE, define-by-run space, dedup) with an
     executor that replays the table.
   "Trials to 3%" = trials run until one within 3% of the grid's best has been measured;
   medians over ``--seeds`` seeds.
3. the memory model: predicted against measured peak per rank over every configuration of the
   sweep (median and worst relative error), and configurations the search would run under a
   limit (the median predicted peak; predicted × (1 + MEMORY_MARGIN) within it) that measured
   over it.

Usage: python bench/search_efficiency.py [--seeds 5] [--json]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

from autotune.config import TrialConfig  # noqa: E402
from autotune.executor import RayExecutor  # noqa: E402
from autotune.memory import estimate_memory  # noqa: E402
from autotune.search import Search, SearchSpec, predicted_to_fit  # noqa: E402
from autotune.space import SearchSpace  # noqa: E402
from db import Database  # noqa: E402

SPACE = dict(fixed={"bucket_mb": 25.0, "overlap_enabled": True},
             narrowed={"activation_checkpointing": ["none", "full"]})
WITHIN = 0.03


def make_spec(seed: int, n_trials: int) -> SearchSpec:
    return SearchSpec(world_size=2, n_trials=n_trials, patience=None, seed=seed, device="cpu",
                      num_warmup_steps=2, num_timed_steps=5, num_profiled_steps=0,
                      top_k=1, remeasure_repeats=0, study_name=f"seed{seed}", **SPACE)


class Replay:
    """An executor that answers from the measured table."""

    def __init__(self, table: dict) -> None:
        self.table, self.calls = table, []

    def run(self, config: TrialConfig):
        key = dataclasses.replace(config, seed=0)  # the table was measured with seed 0
        self.calls.append(key)
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
    plain = [c for c in space.configs if c.tp_degree == 1 and c.pp_degree == 1
             and c.activation_checkpointing == "none"]
    for stage in sorted({c.zero_stage for c in plain}):
        candidates = sorted((c for c in plain if c.zero_stage == stage),
                            key=lambda c: -c.micro_batch_size)
        best = 0.0
        for c in candidates:
            order.append(c)
            value = table[c].throughput_tokens_per_s
            if value < best:
                break
            best = value
    return order


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    space = SearchSpace(TrialConfig(world_size=2, device="cpu", num_warmup_steps=2,
                                    num_timed_steps=5, num_profiled_steps=0), **SPACE)
    configs = space.configs
    print(f"[search_efficiency] sweeping {len(configs)} configurations …", file=sys.stderr)
    table = {}
    start = time.monotonic()
    with RayExecutor() as ex:
        ex.start()
        for c in configs:
            table[c] = ex.run(c)
    sweep_s = time.monotonic() - start
    best = max(r.throughput_tokens_per_s for r in table.values())
    target = best * (1 - WITHIN)

    rows = {"grid": [trials_to_target(configs, table, target)]}
    rows["random"] = []
    for seed in range(args.seeds):
        order = list(configs)
        random.Random(seed).shuffle(order)
        rows["random"].append(trials_to_target(order, table, target))
    heuristic = ds_heuristic(space, table)
    h_trials, h_wall = trials_to_target(heuristic, table, target)
    h_best = max(table[c].throughput_tokens_per_s for c in heuristic)
    rows["ds-heuristic"] = [(h_trials, h_wall)]
    rows["autotune"] = []
    with tempfile.TemporaryDirectory() as tmp:
        db = Database.open(f"sqlite:///{tmp}/bench.db")
        for seed in range(args.seeds):
            replay = Replay(table)
            Search(make_spec(seed, len(configs)), db, replay, out=None).run()
            rows["autotune"].append(trials_to_target(replay.calls, table, target))
        db.close()

    # memory model against measurement
    errors, over = [], 0
    predicted = {c: estimate_memory(c).total for c in configs}
    limit = statistics.median(predicted.values())
    for c, r in table.items():
        measured = max(rank.memory.peak for rank in r.ranks)
        errors.append((predicted[c] - measured) / measured)
        if predicted_to_fit(predicted[c], limit) and measured > limit:
            over += 1

    summary = {}
    for name, results in rows.items():
        trials = [t for t, _ in results]
        walls = [w for _, w in results]
        summary[name] = {"median_trials": statistics.median(trials),
                         "median_wall_s": statistics.median(walls),
                         "fraction_of_grid": statistics.median(trials) / len(configs),
                         "runs": len(results)}
    summary["ds-heuristic"]["best_gap"] = 1 - h_best / best
    report = {"grid_size": len(configs), "sweep_s": sweep_s, "best_tokens_per_s": best,
              "strategies": summary,
              "memory_model": {"median_rel_error": statistics.median(errors),
                               "median_abs_rel_error": statistics.median(abs(e) for e in errors),
                               "worst_under": min(errors), "worst_over": max(errors),
                               "limit_bytes": limit, "fit_but_measured_over": over}}
    if args.json:
        print(json.dumps(report, indent=2, default=float))
        return
    print(f"search efficiency (tiny gpt, world 2, CPU/gloo): grid of {len(configs)} "
          f"configurations, exhaustive best {best:,.0f} tok/s, target ≥ {target:,.0f} (3%)")
    print(f"{'strategy':<14}{'runs':>5}{'median trials':>15}{'% of grid':>11}"
          f"{'median wall s':>15}")
    for name, s in summary.items():
        t = s["median_trials"]
        print(f"{name:<14}{s['runs']:>5}{t:>15}{s['fraction_of_grid']:>11.0%}"
              f"{s['median_wall_s']:>15.1f}")
    print(f"(ds-heuristic's best is {summary['ds-heuristic']['best_gap']:.1%} below the "
          "exhaustive best; inf = never within 3%)")
    m = report["memory_model"]
    print(f"memory model, predicted vs measured peak per rank over {len(configs)} configs: "
          f"median |error| {m['median_abs_rel_error']:.1%}, worst under-prediction "
          f"{m['worst_under']:.1%}, worst over-prediction {m['worst_over']:.1%}; predicted to "
          f"fit {limit / 2**20:.1f} MiB but measured over: {over}")
    target_met = summary["autotune"]["fraction_of_grid"] <= 0.20
    print(f"target: within 3% in ≤ 20% of the grid's trials -> "
          f"{'met' if target_met else 'NOT met'} "
          f"({summary['autotune']['median_trials']} of {len(configs)})")


if __name__ == "__main__":
    main()
