"""Measured CPU trials of many layouts, and how well the performance model predicts them.

    python bench/cpu_sweep.py measure --out bench/data/cpu_sweep_a.json [--rounds 3] [--count 44]
        [--seed 0] [--family gpt|llama] [--seq-len N] [--global-batch N] [--bucket-mb 5,25,100]
    python bench/cpu_sweep.py evaluate --table bench/data/cpu_sweep_a.json
        [--calibrate-count 8] [--seed 0] [--seeds 5] [--json]

``measure`` picks ``--count`` valid layouts of the built-in tiny GPT (and a quarter of tiny
Llama) at world sizes 2 and 4 — tp, pp with each schedule, dp, ZeRO 0-3, micro-batch and
accumulation, activation checkpointing, overlap on/off, gradient bucket 5/25/100 MB (with
dp > 1), seq_len 64/128, global batch 8/16 — from the search's own grid
(``autotune.search.space.SearchSpace``: every row is a configuration a search could propose) by a
seeded greedy choice that keeps every knob's values as evenly represented as the valid layouts
allow (each value appears at least once).

``--family``, ``--seq-len`` and ``--global-batch`` fix the model and the workload: with all
three, the sweep is two groups of layouts (one per world size, half the count each) of one
workload, each a search could be replayed on. ``--bucket-mb`` lists the bucket sizes (the
first alone where dp is 1, as in the search's grid); sweep A was chosen with ``--bucket-mb 25``
(the default bucket, before bucket size was a knob here), so this reproduces its layouts::

    python bench/cpu_sweep.py measure --count 44 --seed 0 --bucket-mb 25 …       # sweep A
    python bench/cpu_sweep.py measure --family gpt --seq-len 64 --global-batch 16 \
        --count 48 --seed 1 --out bench/data/cpu_sweep_b.json                     # sweep B
    python bench/cpu_sweep.py measure --family llama --seq-len 64 --global-batch 16 \
        --count 48 --seed 2 --out bench/data/cpu_sweep_c.json                     # sweep C

It runs each one ``--rounds`` times as short real trials on one ``RayExecutor``: round 1 over
all layouts, then round 2 over all, … so that a drift in the shared machine's speed hits every
layout alike; inside a round the layouts are grouped by world size (one worker group per world
size; the order of the two alternates between rounds, the order inside a group is shuffled per
round). The table is written after every round.

``evaluate`` calibrates the model (``autotune.model.calibration.fit_calibration``, cluster
``autotune.model.cluster.local_cpu_cluster``, autotune's engine) on ``--calibrate-count`` rows
chosen
by seed, split evenly over world sizes, predicts every other row and prints each prediction,
the mean absolute percentage error (MAPE), Spearman's ρ over all predicted rows and within
each world size, the signed error by knob value, and the machine's NOISE FLOOR: the median
over rows of the coefficient of variation of its rounds, and the MAPE of predicting each
round from the median of the row's other rounds (what a perfect model would still show).
It repeats this for ``--seeds`` consecutive seeds and prints the mean ± standard deviation of
MAPE and ρ across them. Nothing is re-measured: it runs in seconds.

The table (JSON) — also read by whatever replays a search over measured layouts::

    {"machine": {"cores": 2, "torch": "2.13.0+cpu", "ray": …, "python": …, "cpu_model": …,
                 "threads_per_rank": {"2": 1, "4": 1}},
     "measured_at": "2026-…Z",            # UTC, when the measurement started
     "settings": {"rounds": 3, "rounds_done": 3, "count": 44, "seed": 0, …},
     "rounds_info": [{"round": 1, "wall_s": …, "loadavg_start": [1m, 5m, 15m]}, …],
     "rows": [{"config": TrialConfig.to_dict(),   # TrialConfig.from_dict reads it back
               "step_time_s": 0.0231,             # median over the rounds that completed
               "rounds": [0.0229, 0.0231, 0.0240],# each round's step time (null: failed)
               "peak_memory_bytes": 12345678,     # smallest reading over rounds (a CPU
                                                  # reading can only overstate), slowest rank
               "status": "complete",              # or "failed" (no round completed)
               "error": "…"}, …]}                 # only when a round failed: the last error

Each round's step time is the trial's own (``TrialResult.step_time_s``: median over timed steps
of the slowest rank).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import platform
import random
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import common  # noqa: E402,F401  (the repository on the path)

from autotune.config import TrialConfig, WorkloadSpec  # noqa: E402
from autotune.errors import AutotuneError, ConfigError  # noqa: E402
from autotune.layouts import DEFAULT_BUCKET_MB, short_name  # noqa: E402
from autotune.search.space import DEFAULT_BUCKETS_MB, SearchSpace  # noqa: E402

WORLD_SIZES = (2, 4)
SEQ_LENS = (64, 128)
GLOBAL_BATCHES = (8, 16)
FAMILIES = ("gpt", "llama")
LLAMA_SHARE = 0.25
"""Fraction of each world size's layouts that train tiny Llama (the rest tiny GPT), when both
families are measured."""
DEFAULT_COUNT = 44
NUM_WARMUP_STEPS = 1
NUM_TIMED_STEPS = 5
TRIAL_TIMEOUT_S = 120.0


log = common.logger("cpu_sweep")


# ---- which layouts ------------------------------------------------------------------------
@dataclass(frozen=True)
class Scope:
    """The workloads and bucket sizes the layouts are chosen among."""

    families: tuple[str, ...] = FAMILIES
    seq_lens: tuple[int, ...] = SEQ_LENS
    global_batches: tuple[int, ...] = GLOBAL_BATCHES
    buckets_mb: tuple[float, ...] = DEFAULT_BUCKETS_MB

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Scope:
        return cls(
            families=(args.family,) if args.family else FAMILIES,
            seq_lens=(args.seq_len,) if args.seq_len else SEQ_LENS,
            global_batches=(args.global_batch,) if args.global_batch else GLOBAL_BATCHES,
            buckets_mb=args.bucket_mb,
        )

    def describe(self) -> str:
        return (
            f"{'/'.join(self.families)}, seq_len {'/'.join(map(str, self.seq_lens))}, "
            f"global batch {'/'.join(map(str, self.global_batches))}, bucket "
            f"{'/'.join(f'{b:g}' for b in self.buckets_mb)} MB"
        )


def knob_values(c: TrialConfig) -> dict[str, object]:
    """The knobs the choice spreads over; a knob without effect in a layout is left out (the
    schedule without a pipeline, ZeRO, overlap and bucket size without data parallelism)."""
    knobs: dict[str, object] = {
        "world_size": c.world_size,
        "family": c.workload.family,
        "seq_len": c.workload.seq_len,
        "global_batch": c.workload.global_batch_size,
        "tp": c.tp_degree,
        "pp": c.pp_degree,
        "dp": c.dp_degree,
        "micro_batch": c.micro_batch_size,
        "grad_accum": c.grad_accum_steps,
        "ac": c.activation_checkpointing,
    }
    if c.pp_degree > 1:
        knobs["schedule"] = c.pp_schedule
    if c.dp_degree > 1:
        knobs["zero"] = c.zero_stage
        knobs["overlap"] = c.overlap_enabled
        knobs["bucket_mb"] = c.bucket_mb
    return knobs


def layout_name(c: TrialConfig) -> str:
    """short_name with the bucket size wherever there is data parallelism: …-noov-b25
    (short_name itself names only a bucket other than the default)."""
    named = c.dp_degree > 1 and c.bucket_mb == DEFAULT_BUCKET_MB
    return short_name(c) + (f"-b{c.bucket_mb:g}" if named else "")


def row_name(c: TrialConfig) -> str:
    """layout_name plus the workload: w2-tp2-…-ac_none gpt-s64-gb8."""
    w = c.workload
    return f"{layout_name(c)} {w.family}-s{w.seq_len}-gb{w.global_batch_size}"


def candidate_pool(world_size: int, family: str, scope: Scope = Scope()) -> list[TrialConfig]:
    """Every configuration of the search's grid (``SearchSpace``: overlap off only where there
    is data parallelism for it to change, each bucket size only there too) for tiny
    ``family`` at ``world_size`` over the scope's seq_lens and global batches."""
    pool = []
    for seq_len, global_batch in itertools.product(scope.seq_lens, scope.global_batches):
        base = TrialConfig(
            workload=WorkloadSpec(
                family=family, size="tiny", seq_len=seq_len, global_batch_size=global_batch
            ),
            world_size=world_size,
            device="cpu",
            num_warmup_steps=NUM_WARMUP_STEPS,
            num_timed_steps=NUM_TIMED_STEPS,
            num_profiled_steps=0,
        )
        try:
            pool += SearchSpace(base, buckets_mb=scope.buckets_mb).configs
        except ConfigError:
            continue  # no valid layout of this workload (a stratum left empty is reported)
    return pool


def select_configs(count: int, seed: int, scope: Scope = Scope()) -> list[TrialConfig]:
    """``count`` layouts, half per world size, LLAMA_SHARE of them Llama when both families
    are in scope: each pick is the candidate whose knob values have been picked least so far
    (ties broken by a seeded shuffle), so every knob's values spread as evenly as the valid
    layouts allow. A knob with one value in a stratum's pool (the bucket size with one
    bucket, the workload when fixed) carries no choice and is left out of the score."""
    rng = random.Random(seed)
    strata = []
    for i, world in enumerate(WORLD_SIZES):
        n = count // len(WORLD_SIZES) + (1 if i < count % len(WORLD_SIZES) else 0)
        if len(scope.families) == 1:
            strata.append((world, scope.families[0], n))
        else:
            num_llama = round(n * LLAMA_SHARE)
            strata += [(world, "gpt", n - num_llama), (world, "llama", num_llama)]
    # Counted per world size: tp 2 is a different split of 2 ranks than of 4.
    counts: dict[tuple[int, str], dict[object, int]] = defaultdict(lambda: defaultdict(int))
    pools, varying = {}, {}
    for world, family, n in strata:
        pool = candidate_pool(world, family, scope)
        if len(pool) < n:
            raise ConfigError(
                f"only {len(pool)} valid layouts of tiny {family} at world size {world} "
                f"({scope.describe()}), fewer than the {n} asked; lower --count or widen "
                "the workload"
            )
        rng.shuffle(pool)
        pools[world, family] = pool
        values: dict[str, set] = defaultdict(set)
        for c in pool:
            for k, v in knob_values(c).items():
                values[k].add(v)
        varying[world, family] = {k for k, vs in values.items() if len(vs) > 1} - {
            "world_size",
            "family",
        }
    quota = {(w, f): n for w, f, n in strata}
    chosen: list[TrialConfig] = []
    # Round-robin over the strata, so that each stratum's picks see the others' counts.
    while any(quota.values()):
        for world, family, _ in strata:
            if not quota[world, family]:
                continue
            pool = pools[world, family]

            def score(c: TrialConfig, world=world, family=family) -> float:
                # Mean count of its knobs' values (a mean, not a sum: a layout with more
                # knobs in effect, such as ZeRO and overlap with data parallelism, is not
                # penalised for them).
                cs = [
                    counts[world, k][v]
                    for k, v in knob_values(c).items()
                    if k in varying[world, family]
                ]
                return sum(cs) / len(cs) if cs else 0.0

            best = min(range(len(pool)), key=lambda i: score(pool[i]))
            config = pool.pop(best)
            for k, v in knob_values(config).items():
                counts[world, k][v] += 1
            chosen.append(config)
            quota[world, family] -= 1
    return chosen


def coverage(configs: list[TrialConfig]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for c in configs:
        for k, v in knob_values(c).items():
            out[k][str(v)] += 1
    return {k: dict(sorted(v.items())) for k, v in out.items()}


def missing_values(configs: list[TrialConfig], scope: Scope = Scope()) -> list[str]:
    """Knob values that some valid layout in scope has and none of ``configs`` has."""
    every = coverage(
        [c for w in WORLD_SIZES for f in scope.families for c in candidate_pool(w, f, scope)]
    )
    have = coverage(configs)
    return [f"{k}={v}" for k, vals in every.items() for v in vals if v not in have.get(k, {})]


# ---- measure ------------------------------------------------------------------------------
def machine_info() -> dict:
    import ray
    import torch

    cpu_model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cores": os.cpu_count(),
        "cpu_model": cpu_model,
        "torch": torch.__version__,
        "ray": ray.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def round_order(configs: list[TrialConfig], round_index: int, seed: int) -> list[int]:
    """Indices of one round: grouped by world size (alternating which comes first, so the
    worker group left from the previous round is reused), shuffled inside each group."""
    rng = random.Random(seed * 1000 + round_index)
    worlds = list(WORLD_SIZES) if round_index % 2 == 0 else list(reversed(WORLD_SIZES))
    order = []
    for w in worlds:
        group = [i for i, c in enumerate(configs) if c.world_size == w]
        rng.shuffle(group)
        order += group
    return order


def write_table(path: Path, table: dict) -> None:
    out = dict(table)
    out["rows"] = [{k: v for k, v in r.items() if not k.startswith("_")} for r in table["rows"]]
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(out, indent=1) + "\n")
    tmp.replace(path)  # an interruption never leaves half a table


def measure(args: argparse.Namespace) -> int:
    from autotune.errors import TrialFailed, WorkloadError
    from autotune.trial.executor import ExecutorSettings, RayExecutor

    scope = Scope.from_args(args)
    configs = select_configs(args.count, args.seed, scope)
    if args.limit:
        configs = configs[: args.limit]
    gaps = missing_values(configs, scope)
    log(
        f"{len(configs)} layouts of {scope.describe()} "
        f"({sum(c.world_size == 2 for c in configs)} at world 2, "
        f"{sum(c.world_size == 4 for c in configs)} at world 4); knob values never picked: "
        f"{', '.join(gaps) or 'none'}"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    table = {
        "machine": machine_info(),
        "measured_at": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "settings": {
            "rounds": args.rounds,
            "rounds_done": 0,
            "count": len(configs),
            "seed": args.seed,
            "num_warmup_steps": NUM_WARMUP_STEPS,
            "num_timed_steps": NUM_TIMED_STEPS,
            "trial_timeout_s": TRIAL_TIMEOUT_S,
        },
        "rounds_info": [],
        "rows": [
            {
                "config": c.to_dict(),
                "step_time_s": None,
                "rounds": [],
                "peak_memory_bytes": None,
                "status": "failed",
                "_memory": [],
            }
            for c in configs
        ],
    }
    settings = ExecutorSettings(trial_timeout_s=TRIAL_TIMEOUT_S)
    start = time.perf_counter()
    threads: dict[str, int] = {}
    with RayExecutor(settings) as executor:
        log("starting Ray")
        executor.start()
        for r in range(args.rounds):
            t_round = time.perf_counter()
            load = list(os.getloadavg())
            order = round_order(configs, r, args.seed)
            for n, i in enumerate(order, 1):
                config, row = configs[i], table["rows"][i]
                if row.get("_invalid"):
                    row["rounds"].append(None)
                    continue
                t0 = time.perf_counter()
                try:
                    result = executor.run(config)
                except (TrialFailed, ConfigError, WorkloadError) as e:
                    row["rounds"].append(None)
                    row["error"] = f"{type(e).__name__}: {e}"
                    row["_invalid"] = isinstance(e, (ConfigError, WorkloadError))
                    log(
                        f"round {r + 1}/{args.rounds} trial {n}/{len(order)} "
                        f"{row_name(config)}: FAILED {row['error']}"
                    )
                    continue
                row["rounds"].append(result.step_time_s)
                row["_memory"].append(result.peak_memory_bytes)
                threads[str(config.world_size)] = result.env.get("threads_per_rank")
                log(
                    f"round {r + 1}/{args.rounds} trial {n}/{len(order)} {row_name(config)}: "
                    f"{result.step_time_s * 1e3:.1f} ms (trial {time.perf_counter() - t0:.1f} s, "
                    f"elapsed {time.perf_counter() - start:.0f} s)"
                )
            for row in table["rows"]:
                memory = [m for m in row["_memory"] if m is not None]
                done = [s for s in row["rounds"] if s is not None]
                row["step_time_s"] = statistics.median(done) if done else None
                row["peak_memory_bytes"] = min(memory) if memory else None
                row["status"] = "complete" if done else "failed"
            table["machine"]["threads_per_rank"] = threads
            table["settings"]["rounds_done"] = r + 1
            table["rounds_info"].append(
                {
                    "round": r + 1,
                    "wall_s": round(time.perf_counter() - t_round, 1),
                    "loadavg_start": load,
                }
            )
            write_table(out, table)
            log(f"round {r + 1} done in {time.perf_counter() - t_round:.0f} s; wrote {out}")
    total = time.perf_counter() - start
    table["settings"]["wall_s"] = round(total, 1)
    write_table(out, table)
    failed = sum(r["status"] == "failed" for r in table["rows"])
    print(
        f"measured {len(configs)} layouts × {args.rounds} rounds in {total:.0f} s "
        f"({failed} failed); wrote {out}"
    )
    return 0


# ---- evaluate -----------------------------------------------------------------------------
def load_table(path: str) -> tuple[dict, list[tuple[TrialConfig, dict]]]:
    try:
        table = json.loads(Path(path).read_text())
    except OSError as e:
        raise ConfigError(f"cannot read table '{path}': {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"table '{path}' is not valid JSON: {e}") from None
    if not isinstance(table, dict) or not isinstance(table.get("rows"), list):
        raise ConfigError(
            f"table '{path}' has no 'rows' list; write it with 'cpu_sweep.py measure'"
        )
    rows = [
        (TrialConfig.from_dict(r["config"]), r)
        for r in table["rows"]
        if r.get("status") == "complete" and r.get("step_time_s")
    ]
    if not rows:
        raise ConfigError(f"table '{path}' has no completed rows")
    return table, rows


def calibration_rows(rows: list[tuple[TrialConfig, dict]], count: int, seed: int) -> list[int]:
    """``count`` row indices by seed, split evenly over the strata (world size × whether tensor
    parallel): a calibration that never saw a TP layout cannot know gloo's per-collective cost,
    as one that never saw a world size cannot know its core sharing."""
    rng = random.Random(seed)
    strata = sorted({(c.world_size, c.tp_degree > 1) for c, _ in rows})
    chosen = []
    for k, key in enumerate(strata):
        n = count // len(strata) + (1 if k < count % len(strata) else 0)
        idx = [i for i, (c, _) in enumerate(rows) if (c.world_size, c.tp_degree > 1) == key]
        chosen += rng.sample(idx, min(n, len(idx)))
    return sorted(chosen)


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Over three layouts or more; None for fewer, or a constant input."""
    return common.spearman(xs, ys, min_points=3)


def noise_floor(rows: list[tuple[TrialConfig, dict]]) -> dict:
    """Median coefficient of variation of a row's rounds, and the MAPE of predicting each round
    from the median of the row's other rounds (leave one out)."""
    cvs, loo = [], []
    for _, r in rows:
        rounds = [s for s in r["rounds"] if s is not None]
        if len(rounds) < 2:
            continue
        cvs.append(statistics.stdev(rounds) / statistics.mean(rounds))
        for j, s in enumerate(rounds):
            others = rounds[:j] + rounds[j + 1 :]
            loo.append(abs(statistics.median(others) / s - 1))
    return {
        "rows": len(cvs),
        "median_cv": statistics.median(cvs) if cvs else None,
        "leave_one_out_mape": statistics.mean(loo) if loo else None,
    }


def choose_clusters(rows: list[tuple[TrialConfig, dict]], cores: int | None) -> dict:
    """Each world size's ``local_cpu_cluster`` (its ranks share the machine's cores)."""
    from autotune.model.cluster import local_cpu_cluster

    return {w: local_cpu_cluster(w, cores=cores) for w in sorted({c.world_size for c, _ in rows})}


def run_seed(rows, clusters: dict, count: int, seed: int) -> dict:
    from autotune.model.calibration import Sample, fit_calibration
    from autotune.model.perf_model import AUTOTUNE_ENGINE, predict_step_time

    calib = calibration_rows(rows, count, seed)
    samples = [
        Sample(rows[i][0], rows[i][1]["step_time_s"], cluster=clusters[rows[i][0].world_size])
        for i in calib
    ]
    t0 = time.perf_counter()
    report = fit_calibration(samples, next(iter(clusters.values())), engine=AUTOTUNE_ENGINE)
    fit_s = time.perf_counter() - t0
    predictions = []
    for i, (c, r) in enumerate(rows):
        if i in calib:
            continue
        est = predict_step_time(
            c, clusters[c.world_size], report.calibration, engine=AUTOTUNE_ENGINE
        )
        top = max(est.breakdown, key=est.breakdown.get)
        predictions.append(
            {
                "index": i,
                "name": layout_name(c),
                "family": c.workload.family,
                "seq_len": c.workload.seq_len,
                "global_batch": c.workload.global_batch_size,
                "world_size": c.world_size,
                "measured_s": r["step_time_s"],
                "predicted_s": est.step_time_s,
                "error": est.step_time_s / r["step_time_s"] - 1,
                "top_term": top,
            }
        )
    err = [abs(p["error"]) for p in predictions]
    out = {
        "seed": seed,
        "calibrated_on": [row_name(rows[i][0]) for i in calib],
        "calibration": report.calibration.to_dict(),
        "fit_mape": report.mape,
        "fit_s": fit_s,
        "fit_table": report.table(),
        "predictions": predictions,
        "mape": statistics.mean(err),
        "median_ape": statistics.median(err),
        "spearman": spearman(
            [p["predicted_s"] for p in predictions], [p["measured_s"] for p in predictions]
        ),
        "spearman_by_world": {},
    }
    for w in sorted({p["world_size"] for p in predictions}):
        ps = [p for p in predictions if p["world_size"] == w]
        out["spearman_by_world"][str(w)] = spearman(
            [p["predicted_s"] for p in ps], [p["measured_s"] for p in ps]
        )
    return out


def residuals_by_knob(rows, runs: list[dict]) -> dict[str, dict[str, dict]]:
    """Signed error (predicted / measured − 1) by knob value, pooled over every seed's
    predictions: mean, mean |error| and count, over all world sizes and within each."""
    acc: dict[str, dict[str, dict[str, list[float]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list))
    )
    for run in runs:
        for p in run["predictions"]:
            values = {**knob_values(rows[p["index"]][0]), "top_term": p["top_term"]}
            for k, v in values.items():
                for where in ("all", f"w{p['world_size']}"):
                    acc[k][str(v)][where].append(p["error"])

    def stats(e: list[float]) -> dict:
        return {"n": len(e), "mean_error": statistics.mean(e), "mape": statistics.mean(map(abs, e))}

    return {
        k: {
            v: {where: stats(e) for where, e in sorted(by_world.items())}
            for v, by_world in sorted(vals.items(), key=lambda kv: _sort_key(kv[0]))
        }
        for k, vals in acc.items()
    }


def _sort_key(value: str):
    try:
        return (0, float(value), "")
    except ValueError:
        return (1, 0.0, value)


def _mean_sd(values: list[float | None]) -> dict:
    vals = [v for v in values if v is not None]
    if not vals:
        return {"mean": None, "sd": None, "min": None, "max": None}
    return {
        "mean": statistics.mean(vals),
        "sd": statistics.stdev(vals) if len(vals) > 1 else 0.0,
        "min": min(vals),
        "max": max(vals),
    }


def evaluate(args: argparse.Namespace) -> int:
    t_start = time.perf_counter()
    table, rows = load_table(args.table)
    if args.calibrate_count < 1 or args.calibrate_count >= len(rows):
        raise ConfigError(
            f"--calibrate-count must be between 1 and {len(rows) - 1} (the table "
            f"has {len(rows)} completed rows)"
        )
    cores = table.get("machine", {}).get("cores")
    clusters = choose_clusters(rows, cores)
    runs = [
        run_seed(rows, clusters, args.calibrate_count, s)
        for s in range(args.seed, args.seed + args.seeds)
    ]
    noise = noise_floor(rows)
    knobs = residuals_by_knob(rows, runs)
    summary = {
        "mape": _mean_sd([r["mape"] for r in runs]),
        "spearman": _mean_sd([r["spearman"] for r in runs]),
        **{
            f"spearman_world_{w}": _mean_sd([r["spearman_by_world"].get(w) for r in runs])
            for w in sorted({str(c.world_size) for c, _ in rows})
        },
    }
    wall = time.perf_counter() - t_start
    if args.json:
        print(
            json.dumps(
                {
                    "table": args.table,
                    "rows": len(rows),
                    "clusters": {w: c.to_dict() for w, c in clusters.items()},
                    "noise_floor": noise,
                    "seeds": [{k: v for k, v in r.items() if k != "fit_table"} for r in runs],
                    "summary": summary,
                    "residuals_by_knob": knobs,
                    "wall_s": wall,
                },
                indent=1,
            )
        )
        return 0
    first = runs[0]
    m = table.get("machine", {})
    st = table.get("settings", {})
    print(
        f"table {args.table}: {len(rows)} completed rows of {len(table['rows'])}, measured "
        f"{table.get('measured_at', '?')} on {m.get('cores', '?')} cores "
        f"({m.get('cpu_model', '')}), torch {m.get('torch', '?')}, "
        f"{st.get('rounds_done', '?')} rounds of {st.get('num_warmup_steps', '?')} warm-up + "
        f"{st.get('num_timed_steps', '?')} timed steps"
    )
    print(
        f"clusters: local_cpu_cluster(world, cores={cores}) per world size "
        f"({', '.join(str(w) for w in clusters)}): the ranks share the cores"
    )
    print()
    print(f"seed {first['seed']}: calibrated on {len(first['calibrated_on'])} rows:")
    for name in first["calibrated_on"]:
        print(f"  {name}")
    print(first["fit_table"])
    print()
    print(
        f"{'layout':<54} {'model':<16} {'measured ms':>11} {'predicted ms':>12} "
        f"{'error':>8}  top term"
    )
    for p in sorted(first["predictions"], key=lambda p: (p["world_size"], p["measured_s"])):
        model = f"{p['family']}-s{p['seq_len']}-gb{p['global_batch']}"
        print(
            f"{p['name']:<54} {model:<16} {p['measured_s'] * 1e3:>11.1f} "
            f"{p['predicted_s'] * 1e3:>12.1f} "
            f"{100 * p['error']:>+7.1f}%  {p['top_term']}"
        )
    print()

    def fmt_rho(x):
        return "n/a" if x is None else f"{x:.3f}"

    print(
        f"seed {first['seed']}: {len(first['predictions'])} predicted rows: MAPE "
        f"{100 * first['mape']:.1f}% (median {100 * first['median_ape']:.1f}%), Spearman ρ "
        f"{fmt_rho(first['spearman'])}; within world size: "
        + ", ".join(f"w{w} {fmt_rho(v)}" for w, v in first["spearman_by_world"].items())
    )
    print(
        f"NOISE FLOOR ({noise['rows']} rows with ≥ 2 rounds): median CV of the rounds "
        f"{100 * noise['median_cv']:.1f}%; predicting each round from the median of the "
        f"others: MAPE {100 * noise['leave_one_out_mape']:.1f}%"
    )
    print()
    print(
        f"{'seed':>4} {'MAPE':>7} {'ρ':>7} "
        + " ".join(f"{'ρ w' + w:>7}" for w in first["spearman_by_world"])
        + f" {'fit MAPE':>9} {'fit s':>6}"
    )
    for r in runs:
        print(
            f"{r['seed']:>4} {100 * r['mape']:>6.1f}% {fmt_rho(r['spearman']):>7} "
            + " ".join(f"{fmt_rho(v):>7}" for v in r["spearman_by_world"].values())
            + f" {100 * r['fit_mape']:>8.1f}% {r['fit_s']:>6.1f}"
        )

    def fmt(s, pct=False):
        if s["mean"] is None:
            return "n/a"
        k = 100 if pct else 1
        unit = "%" if pct else ""
        return (
            f"{k * s['mean']:.{1 if pct else 3}f}{unit} ± {k * s['sd']:.{1 if pct else 3}f}"
            f" (range {k * s['min']:.{1 if pct else 3}f}–{k * s['max']:.{1 if pct else 3}f})"
        )

    print(
        f"over {len(runs)} seeds: MAPE {fmt(summary['mape'], True)}; ρ "
        f"{fmt(summary['spearman'])}; "
        + "; ".join(
            f"ρ w{k.rsplit('_', 1)[1]} {fmt(v)}"
            for k, v in summary.items()
            if k.startswith("spearman_world")
        )
    )
    print(
        f"targets: MAPE ≤ 15%, ρ ≥ 0.8 — beside a noise floor of "
        f"{100 * noise['leave_one_out_mape']:.1f}% (leave-one-round-out MAPE)"
    )
    print()
    print(
        f"signed error by knob value, pooled over the {len(runs)} seeds' predictions "
        "(+ over-predicts):"
    )
    print("  knob value: mean signed error (mean |error|, predictions) [by world size]")
    for k, vals in knobs.items():
        print(f"  {k}")
        for v, by in vals.items():
            a = by["all"]
            worlds = ", ".join(
                f"{w} {100 * st['mean_error']:+.0f}% n {st['n']}"
                for w, st in by.items()
                if w != "all"
            )
            print(
                f"    {v:<17} {100 * a['mean_error']:+5.0f}% (|{100 * a['mape']:.0f}%|, "
                f"n {a['n']}) [{worlds}]"
            )
    print(f"(evaluate took {wall:.1f} s)")
    return 0


# ---- command line -------------------------------------------------------------------------
def bucket_list(text: str) -> tuple[float, ...]:
    """'5,25,100' → (5.0, 25.0, 100.0); argparse turns the ValueError into a usage error."""
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"'{text}' is not a comma-separated list of sizes in MB, e.g. 5,25,100"
        ) from None
    if not values or any(not v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"bucket sizes must be > 0 MB, not '{text}'")
    return values


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="run the trials and write the table")
    m.add_argument("--out", required=True, help="table to write (JSON)")
    m.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    m.add_argument(
        "--count",
        type=int,
        default=DEFAULT_COUNT,
        help=f"layouts, half per world size (default {DEFAULT_COUNT})",
    )
    m.add_argument("--seed", type=int, default=0, help="seed of the layout choice (default 0)")
    m.add_argument(
        "--family",
        choices=FAMILIES,
        default=None,
        help="measure only this tiny model (default: both, a quarter Llama)",
    )
    m.add_argument(
        "--seq-len",
        type=int,
        default=None,
        help=f"fix the sequence length (default: each of {SEQ_LENS})",
    )
    m.add_argument(
        "--global-batch",
        type=int,
        default=None,
        help=f"fix the global batch (default: each of {GLOBAL_BATCHES})",
    )
    m.add_argument(
        "--bucket-mb",
        type=bucket_list,
        default=DEFAULT_BUCKETS_MB,
        help="gradient bucket sizes in MB, comma-separated, where dp > 1 (default "
        f"{','.join(f'{b:g}' for b in DEFAULT_BUCKETS_MB)}; sweep A: 25)",
    )
    m.add_argument(
        "--limit", type=int, default=0, help="measure only the first N chosen layouts (a smoke run)"
    )
    e = sub.add_parser("evaluate", help="calibrate on some rows, predict the rest")
    e.add_argument("--table", required=True, help="a table written by 'measure'")
    e.add_argument(
        "--calibrate-count", type=int, default=8, help="rows the model is calibrated on (default 8)"
    )
    e.add_argument("--seed", type=int, default=0, help="first seed of the choice (default 0)")
    e.add_argument(
        "--seeds", type=int, default=5, help="consecutive seeds to repeat the split for (default 5)"
    )
    e.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = p.parse_args(argv)
    for name in ("rounds", "count", "seeds"):
        if getattr(args, name, 1) < 1:
            p.error(f"--{name} must be at least 1")
    for name in ("seq_len", "global_batch"):
        if getattr(args, name, None) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    try:
        return measure(args) if args.command == "measure" else evaluate(args)
    except AutotuneError as e:
        print(f"cpu_sweep: error: {e}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
