"""Search strategies replayed on measured tables: trials to within 3% of each group's best.

    python bench/search_replay.py --table TABLE [--table TABLE …] [--json]
        [--strategies a,b,...] [--seeds N] [--answer median|one-round] [--cluster FILE]
        [--min-layouts 8] [--full]

TABLE is a CSV in the shared format (``shared/data/a100-megatron/single_node.csv``) or a JSON
table of ``bench/cpu_sweep.py``. It is split into groups of rows with the same world size,
global batch, sequence length and model (``replay_table.MeasuredTable.groups``); every group
with at least ``--min-layouts`` layouts (8) is one search. Each strategy runs on a
``TableExecutor`` of the group: its candidates are the group's configurations, every trial it
proposes is answered from the measured row, and its history grows by that answer. Counted: the
trials until one tries a layout whose median is within 3% of the group's best median. A
strategy that stops before that counts as the number of candidates + 1 (it would take another
search), and how often it got there before stopping is printed beside it.

Answers (``--answer``): ``median`` (default) answers each trial with the row's median over its
rounds, quieter than any live trial; ``one-round`` answers each with one of the row's rounds,
drawn at random, as one live trial would have measured it (``replay_table.Answer``), and
then every strategy is replayed over ``--seeds`` seeds (seed s draws the rounds, and orders
random and TPE). A table without rounds (a CSV in the shared format) is refused under
``one-round``. A table that measured one configuration more than once is replayed with the
median of the repeats (``replay_table.merge_repeats``); how many rows were merged is
printed (JSON: ``merged``).

Cost: the wall time its measured trials (up to the target) would have taken,
Σ (warm-up + timed steps) × step time + a fixed overhead per trial, with the steps of
``TrialConfig``'s defaults (2 + 5) and the warm per-trial overhead that
``bench/trial_overhead.py`` measured (0.02 s); a failed trial costs the overhead alone
(``replay_table.trial_wall_s``).

Strategies (``--strategies``, default all): grid (DeepSpeed's order), random, tpe (Optuna TPE
over the real knobs, no baseline), deepspeed (the DeepSpeed autotuner's heuristic), tp-in-node
(the engineers' "TP inside the node, ZeRO-1/DP across nodes" rule), model (the model-guided
strategy, ``autotune.search.strategies.model_guided.ModelGuided``, each group from the cluster
description alone), model-warm (the same, starting each group from a calibration fitted to the
trials it ran itself in the earlier groups of this replay, in table order: what a cluster file
calibrated by earlier searches gives a user; under ``--answer one-round`` each seed's pass over
a table starts afresh). Random and TPE are averaged over ``--seeds``
seeds (5). The model-guided strategy
sees only the cluster and its own trials: for a CSV table the cluster is
``examples/clusters/a100-megatron.json`` and the engine Megatron's, for a JSON table
``local_cpu_cluster(world size)`` (the table's cores) and autotune's engine; ``--cluster``
replaces the cluster.

Several ``--table`` pool their groups into one figure per strategy (each table replayed with
its own cluster; model-warm starts afresh at each table), and print a line per table beside it
(JSON: ``per_table``).

For a JSON table whose rows carry their rounds, the NOISE FLOOR is printed too
(``replay_table.one_round_trials``): what a strategy needs that knew one round's step times
exactly, counted against the rounds' medians, as the MAPE floor of ``bench/cpu_sweep.py``,
with the strategies whose pooled mean is under it (JSON: ``below_noise_floor``). It bounds a
strategy that ranks layouts by what it measured; one whose first pick reads no answer (a
prior, grid's fixed order) can come in under it however it is answered.

With ``--full`` each strategy runs until it stops by itself (the trials it spends in all are
printed too); otherwise a replay ends at the target.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import common  # noqa: E402,F401  (the repository on the path)
from testkit.replay_table import (  # noqa: E402
    MIN_LAYOUTS,
    TRIAL_OVERHEAD_S,
    TRIAL_STEPS,
    WITHIN,
    Answer,
    MeasuredTable,
    ReplayRun,
    TableExecutor,
    TableGroup,
    one_round_trials,
    replay,
    trial_wall_s,
)
from testkit.strategies import DeepSpeedHeuristic, GridStrategy, TPInsideNodeRule  # noqa: E402

from autotune.errors import ConfigError  # noqa: E402
from autotune.model.cluster import ClusterSpec, load_cluster, local_cpu_cluster  # noqa: E402
from autotune.model.engines import EngineProfile  # noqa: E402
from autotune.model.perf_model import (  # noqa: E402
    AUTOTUNE_ENGINE,
    MEGATRON_LEGACY_ENGINE,
)
from autotune.search.spec import SAMPLERS  # noqa: E402
from autotune.search.strategies.base import Strategy  # noqa: E402

log = common.logger("search_replay")
A100_CLUSTER = Path(__file__).resolve().parent.parent / "examples/clusters/a100-megatron.json"
STRATEGIES = ("grid", "random", "tpe", "gp", "deepspeed", "tp-in-node", "model", "model-warm")
CARRIED_SAMPLES = 60
"""model-warm refits its starting calibration on at most this many of its latest trials."""
SEEDED = SAMPLERS
"""Strategies whose order depends on a seed: replayed once per seed."""


class Setting:
    """The cluster and engine a table's groups ran on (what a model-guided strategy may see)."""

    def __init__(self, table: MeasuredTable, cluster_file: str | None) -> None:
        self.table = table
        self.engine: EngineProfile = (
            MEGATRON_LEGACY_ENGINE if table.kind == "csv" else AUTOTUNE_ENGINE
        )
        self.fixed: ClusterSpec | None = None
        if cluster_file:
            self.fixed = load_cluster(cluster_file)
        elif table.kind == "csv":
            self.fixed = load_cluster(str(A100_CLUSTER))

        self.samples: list = []
        """model-warm's own trials in earlier groups of this replay (never the table's rows
        it did not run)."""

    def carried(self, cluster: ClusterSpec):
        """The calibration fitted to model-warm's own earlier trials (None before any): what
        a user's cluster file holds after earlier searches on the same cluster."""
        if not self.samples:
            return None
        from autotune.model.calibration import fit_calibration

        return fit_calibration(
            self.samples[-CARRIED_SAMPLES:], cluster, engine=self.engine
        ).calibration

    def carry(self, run: ReplayRun, group: TableGroup) -> None:
        from autotune.model.calibration import Sample

        cluster = self.cluster(group)
        self.samples += [
            Sample(m.config, m.step_time_s, group.shape, cluster=cluster)
            for m in run.history
            if m.status == "complete" and m.step_time_s
        ]

    def cluster(self, group: TableGroup) -> ClusterSpec:
        if self.fixed is not None:
            return self.fixed
        return local_cpu_cluster(group.world_size, cores=self.table.cores)


def model_factory() -> tuple[Callable | None, str]:
    """(ModelGuided's class, '') or (None, why it is skipped)."""
    try:
        from autotune.search.strategies.model_guided import ModelGuided
    except ImportError as e:
        return None, f"autotune.search.strategies.model_guided is not available ({e})"
    return ModelGuided, ""


def make_strategy(
    name: str, seed: int, group: TableGroup, setting: Setting, model_cls: Callable | None
) -> Strategy | str:
    """A fresh strategy for one replay (strategies keep per-search state); the name of one of
    the search's Optuna samplers (tpe, gp, random) for those, which ``replay`` runs as the
    search does (``OptunaStrategy``, seeded)."""
    if name in SAMPLERS:
        return name
    if name == "grid":
        return GridStrategy()
    if name == "deepspeed":
        return DeepSpeedHeuristic()
    cluster = setting.cluster(group)
    if name == "tp-in-node":
        return TPInsideNodeRule(cluster.devices_per_node)
    if name == "model":
        return model_cls(cluster, engine=setting.engine)
    if name == "model-warm":
        return model_cls(cluster, engine=setting.engine, calibration=setting.carried(cluster))
    raise ConfigError(f"unknown strategy '{name}'; choose among {', '.join(STRATEGIES)}")


def parse_strategies(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in names if s not in STRATEGIES]
    if unknown or not names:
        raise ConfigError(
            f"unknown strategy '{', '.join(unknown) or text}'; choose among "
            f"{', '.join(STRATEGIES)} (comma-separated)"
        )
    return names


def summarise(runs: list[ReplayRun], seeds: int) -> dict:
    trials = [r.trials_to_target for r in runs]
    walls = [r.wall_s for r in runs]
    return {
        "median_trials": statistics.median(trials),
        "mean_trials": statistics.fmean(trials),
        "reached_fraction": sum(r.reached_at is not None for r in runs) / len(runs),
        "mean_wall_s": statistics.fmean(walls),
        "total_wall_s": sum(walls) / seeds,
        "mean_trials_run": statistics.fmean(len(r.history) for r in runs),
        "runs": len(runs),
        "seeds": seeds,
        "trials": trials,
    }


def floor_trials(groups: list[TableGroup]) -> dict | None:
    """The noise floor of ``groups`` (``one_round_trials``) as median, mean and each group's,
    or None when some group's rows do not carry their rounds."""
    floors = [one_round_trials(g, WITHIN) for g in groups]
    if any(f is None for f in floors):
        return None
    return {
        "median_trials": statistics.median(floors),
        "mean_trials": statistics.fmean(floors),
        "trials": floors,
    }


def run(args: argparse.Namespace) -> int:
    names = parse_strategies(args.strategies)
    if args.seeds < 1:
        raise ConfigError(f"--seeds must be ≥ 1, not {args.seeds}")
    if args.min_layouts < 1:
        raise ConfigError(f"--min-layouts must be ≥ 1, not {args.min_layouts}")
    parts = []  # (path, its groups, its setting), one per --table
    merged = {}
    for path in args.table:
        table = MeasuredTable.load(path)
        TableExecutor(table, answer=args.answer)  # refuses one-round on a table without rounds
        merged[path] = {"rows": table.merged_rows, "configurations": table.merged_configs}
        parts.append((path, table.groups(args.min_layouts), Setting(table, args.cluster)))
    groups = [g for _, gs, _ in parts for g in gs]
    wants_model = any(n.startswith("model") for n in names)
    model_cls, why = model_factory() if wants_model else (None, "")
    skipped = {}
    if wants_model and model_cls is None:
        skipped.update({n: why for n in names if n.startswith("model")})
        names = [n for n in names if not n.startswith("model")]
    results, per_table = {}, {path: {} for path, _, _ in parts}
    for name in names:
        seeds = args.seeds if name in SEEDED or args.answer == Answer.ONE_ROUND else 1
        start = time.perf_counter()
        runs, by_table = [], {path: [] for path, _, _ in parts}
        for path, table_groups, setting in parts:
            for seed in range(seeds):
                setting.samples = []  # model-warm carries its trials within one pass only
                for g in table_groups:  # in table order: model-warm carries them forward
                    run_ = replay(
                        make_strategy(name, seed, g, setting, model_cls),
                        g,
                        within=WITHIN,
                        until_target=not args.full,
                        answer=args.answer,
                        seed=seed,
                    )
                    runs.append(run_)
                    by_table[path].append(run_)
                    if name == "model-warm":
                        setting.carry(run_, g)
        results[name] = summarise(runs, seeds)
        for path, table_runs in by_table.items():
            per_table[path][name] = summarise(table_runs, seeds)
        log(f"{name}: {len(runs)} replays in {time.perf_counter() - start:.1f} s")
    sizes = [len(g.rows) for g in groups]
    exhaustive = sum(sum(trial_wall_s(r.step_time_s) for r in g.rows) for g in groups)
    report = {
        "table": ", ".join(args.table),
        "tables": list(args.table),
        "groups": len(groups),
        "groups_per_table": {path: len(gs) for path, gs, _ in parts},
        "min_layouts": args.min_layouts,
        "layouts": {
            "median": statistics.median(sizes),
            "mean": statistics.fmean(sizes),
            "min": min(sizes),
            "max": max(sizes),
        },
        "within": WITHIN,
        "full": args.full,
        "exhaustive_wall_s": exhaustive,
        "answer": str(args.answer),
        "seeds": args.seeds,
        "merged": {
            "rows": sum(m["rows"] for m in merged.values()),
            "configurations": sum(m["configurations"] for m in merged.values()),
            "per_table": merged,
        },
        "strategies": results,
        "skipped": skipped,
    }
    floors = {path: floor_trials(gs) for path, gs, _ in parts}
    pooled_floor = floor_trials(groups)
    if pooled_floor is not None:
        report["noise_floor"] = pooled_floor
        report["below_noise_floor"] = [
            n for n, r in results.items() if r["mean_trials"] < pooled_floor["mean_trials"]
        ]
    if len(parts) > 1:
        report["per_table"] = {
            path: {
                n: {k: s[k] for k in ("median_trials", "mean_trials")} for n, s in by_name.items()
            }
            | ({"noise_floor": floors[path]} if floors[path] else {})
            for path, by_name in per_table.items()
        }
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(
        f"search replay on {report['table']}: {len(groups)} groups of ≥ {args.min_layouts} "
        f"layouts (median {statistics.median(sizes):g}, {min(sizes)}-{max(sizes)}); trials "
        f"until one tries a layout within {WITHIN:.0%} of the group's best (medians); "
        + (
            "each trial answered with the row's median"
            if args.answer == Answer.MEDIAN
            else f"each trial answered with one round drawn at random, {args.seeds} seeds"
        )
    )
    for path, m in merged.items():
        if m["rows"]:
            print(
                f"{path}: {m['rows']} rows repeated a configuration and were merged into "
                f"{m['configurations']} (the median of the repeats, their rounds pooled)"
            )
    print(
        f"{'strategy':<12}{'runs':>6}{'median':>8}{'mean':>7}{'reached':>9}"
        f"{'wall s/group':>14}{'wall s total':>14}" + (f"{'trials run':>12}" if args.full else "")
    )
    for name, s in results.items():
        line = (
            f"{name:<12}{s['runs']:>6}{s['median_trials']:>8g}{s['mean_trials']:>7.2f}"
            f"{s['reached_fraction']:>9.0%}{s['mean_wall_s']:>14.2f}"
            f"{s['total_wall_s']:>14.1f}"
        )
        if args.full:
            line += f"{s['mean_trials_run']:>12.2f}"
        print(line)
    print(
        f"(every layout once: {statistics.fmean(sizes):.1f} trials per group on average, "
        f"{exhaustive:.1f} s in all. A strategy that stops before reaching the target counts "
        f"as its group's layouts + 1; 'reached' is how often it got there. Wall time: "
        f"Σ ({TRIAL_STEPS} steps × step time + {TRIAL_OVERHEAD_S} s) over the trials up to "
        f"the target; "
        + ("random and tpe" if args.answer == Answer.MEDIAN else "all")
        + f" averaged over {args.seeds} seeds.)"
    )
    if "noise_floor" in report:
        nf = report["noise_floor"]
        print(
            f"noise floor: {nf['median_trials']:.2f} / {nf['mean_trials']:.2f} trials (median / "
            "mean) for a strategy that knew one round's step times exactly and tried the "
            "fastest first, averaged over the rounds (the rounds disagree on close layouts)"
        )
        below = ", ".join(report["below_noise_floor"]) or "none"
        print(
            f"below the floor in mean: {below}"
            + (
                " (answered with medians, a strategy reads quieter figures than the floor's one "
                "round: --answer one-round answers as a live search would see them)"
                if args.answer == Answer.MEDIAN
                else ""
            )
        )
    if len(parts) > 1:
        print("\nmedian / mean trials per table:")
        print(
            f"{'table':<24}{'groups':>7}"
            + "".join(f"{n:>13}" for n in results)
            + f"{'noise floor':>14}"
        )
        for path, table_groups, _ in parts:
            cells = "".join(
                f"{per_table[path][n]['median_trials']:>6g} /"
                f"{per_table[path][n]['mean_trials']:>5.2f}"
                for n in results
            )
            floor = (
                f"{floors[path]['median_trials']:>6.2f} /{floors[path]['mean_trials']:>5.2f}"
                if floors[path]
                else f"{'-':>13}"
            )
            print(f"{Path(path).name:<24}{len(table_groups):>7}{cells} {floor}")
    for name, why in skipped.items():
        print(f"note: strategy '{name}' skipped: {why}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--table",
        required=True,
        metavar="TABLE",
        action="append",
        help="a CSV in the shared format or a JSON table of bench/cpu_sweep.py; "
        "give it several times to pool their groups (each table keeps its own "
        "cluster, and model-warm carries its trials within a table only)",
    )
    p.add_argument("--json", action="store_true", help="print the results as JSON only")
    p.add_argument(
        "--strategies",
        default=",".join(STRATEGIES),
        help=f"comma-separated, among {', '.join(STRATEGIES)} (default all)",
    )
    p.add_argument(
        "--seeds",
        type=int,
        default=5,
        help="seeds of random and tpe, and of every strategy's draws under --answer one-round (5)",
    )
    p.add_argument(
        "--answer",
        choices=tuple(Answer),
        default=Answer.MEDIAN,
        type=Answer,
        help="what a trial reads: the row's median over its rounds (median, the "
        "default) or one of its rounds drawn at random, as a live trial (one-round)",
    )
    p.add_argument(
        "--cluster",
        metavar="FILE",
        help="the cluster the model-guided strategy "
        "sees (default: a100-megatron for a CSV, the local CPU for a JSON table)",
    )
    p.add_argument(
        "--min-layouts",
        type=int,
        default=MIN_LAYOUTS,
        help=f"smallest group replayed ({MIN_LAYOUTS})",
    )
    p.add_argument(
        "--full",
        action="store_true",
        help="run every strategy until it stops, not only to the target",
    )
    args = p.parse_args(argv)
    try:
        return run(args)
    except ConfigError as e:
        print(f"search_replay: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
