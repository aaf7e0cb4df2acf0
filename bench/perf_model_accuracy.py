"""How well the performance model predicts measured step times it was not fitted to.

    python bench/perf_model_accuracy.py --calibrate-on TABLE --predict TABLE [--json]
        [--cluster examples/clusters/a100-megatron.json]
    python bench/perf_model_accuracy.py --split TABLE --every 10 --out DIR   # the documented split

A TABLE has the columns of ``shared/data/a100-megatron/single_node.csv``: # GPUs, global batch,
micro batch, hidden size, attention heads, # layers, sequence length, tensor / data / pipeline
parallelism, iteration time (ms). Each row becomes a ``TrialConfig`` on an explicit GPT shape
(4h MLP, learned positions, ``--vocab-size``) trained as the table's code trained it (the
defaults below: Megatron's engine, fp16, full recomputation, 1F1B, gradient sync after the
backward, unfused attention). The model is calibrated on the first table only — nothing of the
second is seen before its predictions are made — and then predicts every row of the second, in
order. Printed: each row's prediction (``--json``: a list of ``{"predicted_ms": …}``), the mean
absolute percentage error, Spearman's ρ within each group of rows with the same GPUs, global
batch and model, and how often a group's predicted-best layout measures within 3% of its best.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autotune.calibration import Sample, fit_calibration  # noqa: E402
from autotune.cluster import load_cluster  # noqa: E402
from autotune.errors import ConfigError  # noqa: E402
from autotune.perf_model import ENGINES, predict_step_time  # noqa: E402
from autotune.replay import (  # noqa: E402
    CSV_COLUMNS,
    TableTraining,
    csv_group_key,
    csv_row,
    read_csv_rows,
)

DEFAULT_CLUSTER = Path(__file__).resolve().parent.parent / "examples/clusters/a100-megatron.json"
COLUMNS = CSV_COLUMNS
WITHIN = 0.03


def read_table(path: str) -> list[dict[str, float]]:
    """Rows of a table in the shared format, as numbers (``autotune.replay.read_csv_rows``)."""
    return read_csv_rows(path)


def training_of(args: argparse.Namespace) -> TableTraining:
    """How the table's code trained, from the command line (defaults: the shared table's)."""
    return TableTraining(dtype=args.dtype, activation_checkpointing=args.ac,
                         pp_schedule=args.schedule, attention=args.attention,
                         zero_stage=args.zero, overlap_enabled=not args.no_overlap,
                         vocab_size=args.vocab_size)


def row_sample(row: dict[str, float], args: argparse.Namespace) -> Sample:
    """The TrialConfig and shape a table row describes (``autotune.replay.csv_row``)."""
    measured = csv_row(row, training_of(args))
    return Sample(measured.config, measured.step_time_s, measured.shape)


group_key = csv_group_key


def spearman(xs: list[float], ys: list[float]) -> float:
    from scipy.stats import spearmanr

    rho = spearmanr(xs, ys).statistic
    return float(rho) if rho == rho else 1.0  # constant input: no order to get wrong


def evaluate(rows, predicted_s: list[float], min_layouts: int = 3) -> dict:
    measured = [r["iteration time (ms)"] / 1000 for r in rows]
    ape = [abs(p / m - 1) for p, m in zip(predicted_s, measured)]
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        groups[group_key(r)].append(i)
    rhos, hits, gaps = [], 0, []
    ranked = [g for g in groups.values() if len(g) >= min_layouts]
    for idx in ranked:
        rhos.append(spearman([predicted_s[i] for i in idx], [measured[i] for i in idx]))
        pick = min(idx, key=lambda i: predicted_s[i])
        best = min(measured[i] for i in idx)
        gap = measured[pick] / best - 1
        gaps.append(gap)
        hits += gap <= WITHIN
    return {"rows": len(rows), "mape": statistics.mean(ape),
            "median_ape": statistics.median(ape), "groups": len(ranked),
            "median_group_spearman": statistics.median(rhos) if rhos else None,
            "mean_group_spearman": statistics.mean(rhos) if rhos else None,
            "best_within_3pct": hits / len(ranked) if ranked else None,
            "mean_best_gap": statistics.mean(gaps) if gaps else None}


def split(args: argparse.Namespace) -> int:
    """Write calibrate.csv (every k-th row in a stable order) and predict.csv (the rest)."""
    path = Path(args.split)
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        rows = list(reader)
    order = sorted(range(len(rows)), key=lambda i: [float(x) for x in rows[i][:-1]])
    chosen = set(order[args.offset::args.every])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, keep in (("calibrate.csv", True), ("predict.csv", False)):
        with open(out / name, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(header)
            w.writerows(r for i, r in enumerate(rows) if (i in chosen) == keep)
    print(f"{len(chosen)} rows → {out / 'calibrate.csv'}, {len(rows) - len(chosen)} → "
          f"{out / 'predict.csv'} (every {args.every}th row from row {args.offset} "
          "of the table sorted by its configuration columns)")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calibrate-on", metavar="TABLE")
    p.add_argument("--predict", metavar="TABLE")
    p.add_argument("--cluster", default=str(DEFAULT_CLUSTER), metavar="NAME|FILE")
    p.add_argument("--json", action="store_true", help="print the predictions as JSON only")
    p.add_argument("--split", metavar="TABLE", help="write a calibrate/predict split instead")
    p.add_argument("--every", type=int, default=10, help="--split: every k-th row calibrates")
    p.add_argument("--offset", type=int, default=0, help="--split: first calibrating row")
    p.add_argument("--out", default="split", help="--split: output folder")
    train = p.add_argument_group("how the table's code trained (defaults: the shared table's)")
    train.add_argument("--engine", choices=sorted(ENGINES), default="megatron")
    train.add_argument("--dtype", default="float16", choices=("float16", "bfloat16", "float32"))
    train.add_argument("--ac", default="full", choices=("none", "selective", "full"))
    train.add_argument("--schedule", default="1f1b", choices=("gpipe", "1f1b", "interleaved_1f1b"))
    train.add_argument("--attention", default="eager", choices=("eager", "sdpa"))
    train.add_argument("--zero", type=int, default=0, choices=(0, 1, 2, 3))
    train.add_argument("--no-overlap", action="store_true", default=True)
    train.add_argument("--vocab-size", type=int, default=50257)
    args = p.parse_args(argv)
    try:
        if args.split:
            return split(args)
        if not (args.calibrate_on and args.predict):
            p.error("give --calibrate-on TABLE and --predict TABLE (or --split TABLE)")
        return run(args)
    except ConfigError as e:
        print(f"perf_model_accuracy: error: {e}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace) -> int:
    base = load_cluster(args.cluster)
    engine = ENGINES[args.engine]
    calib_rows, predict_rows = read_table(args.calibrate_on), read_table(args.predict)
    # A layout is placed by devices per node (the rows' GPUs fill ⌈GPUs / node⌉ nodes).
    calib = [row_sample(r, args) for r in calib_rows]
    t0 = time.perf_counter()
    report = fit_calibration(calib, base, engine=engine)
    fit_s = time.perf_counter() - t0
    predicted = []
    for r in predict_rows:
        smp = row_sample(r, args)
        est = predict_step_time(smp.config, base, report.calibration, shape=smp.shape, engine=engine)
        predicted.append(est.step_time_s)
    if args.json:
        print(json.dumps([{"predicted_ms": round(t * 1000, 4)} for t in predicted]))
        return 0
    stats = evaluate(predict_rows, predicted)
    big = evaluate(predict_rows, predicted, min_layouts=8)
    print(f"calibrated on {len(calib_rows)} rows of {args.calibrate_on} in {fit_s:.1f} s "
          f"(engine {engine.name}, cluster {base.name}):")
    print(report.table())
    print()
    print(f"{'#':>5} {'GPUs':>4} {'h':>5} {'L':>3} {'gb':>4} {'mb':>3} {'tp':>3} {'dp':>3} "
          f"{'pp':>3} {'measured ms':>12} {'predicted ms':>13} {'error':>7}")
    for i, (r, t) in enumerate(zip(predict_rows, predicted)):
        m = r["iteration time (ms)"]
        print(f"{i:>5} {r['# GPUs']:>4.0f} {r['hidden size']:>5.0f} {r['# layers']:>3.0f} "
              f"{r['global batch']:>4.0f} {r['micro batch']:>3.0f} "
              f"{r['tensor parallelism']:>3.0f} {r['data parallelism']:>3.0f} "
              f"{r['pipeline parallelism']:>3.0f} {m:>12.1f} {t * 1000:>13.1f} "
              f"{100 * (t * 1000 / m - 1):>+6.1f}%")
    print()
    print(f"predicted {stats['rows']} rows of {args.predict}")
    print(f"  MAPE                           {100 * stats['mape']:.2f}%  "
          f"(median {100 * stats['median_ape']:.2f}%)")
    if stats["groups"]:
        print(f"  groups of ≥ 3 layouts          {stats['groups']}")
        print(f"  in-group Spearman ρ            median {stats['median_group_spearman']:.3f}, "
              f"mean {stats['mean_group_spearman']:.3f}")
        print(f"  predicted best within 3%       {100 * stats['best_within_3pct']:.1f}% of "
              f"groups (mean gap {100 * stats['mean_best_gap']:.2f}%)")
    if big["groups"]:
        print(f"  groups of ≥ 8 layouts          {big['groups']}: ρ median "
              f"{big['median_group_spearman']:.3f}, best within 3% in "
              f"{100 * big['best_within_3pct']:.1f}% (mean gap {100 * big['mean_best_gap']:.2f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
