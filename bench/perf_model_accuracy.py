"""How well the performance model predicts measured step times it was not fitted to.

    python bench/perf_model_accuracy.py --calibrate-on TABLE --predict TABLE [--json]
        [--cluster examples/clusters/a100-megatron.json]
    python bench/perf_model_accuracy.py --split TABLE --every 10 --out DIR   # the documented split
    python bench/perf_model_accuracy.py --split TABLE --hold-out-shapes 4 --offset K --out DIR

A TABLE has the columns of ``shared/data/a100-megatron/single_node.csv``: # GPUs, global batch,
micro batch, hidden size, attention heads, # layers, sequence length, tensor / data / pipeline
parallelism, iteration time (ms). Each row becomes a ``TrialConfig`` on an explicit GPT shape
(4h MLP, learned positions, ``--vocab-size``) trained as the table's code trained it (the
defaults below: Megatron's engine, fp16, full recomputation, 1F1B, gradient sync after the
backward, unfused attention). The model is calibrated on the first table only — nothing of the
second is seen before its predictions are made — and then predicts every row of the second, in
order. Printed: each row's prediction (``--json``: a list of ``{"predicted_ms": …,
"predicted_without_shape_factors_ms": …}``), the mean
absolute percentage error, Spearman's ρ within each group of rows with the same GPUs, global
batch and model, and how often a group's predicted-best layout measures within 3% of its best
— with the calibration's per-shape corrections (``layer_shape_factors``, ``host_shape_factors``)
and, beside it, with them dropped from the same fit (the parameters are fitted before the shape
factors, so a fit without them finds the same parameters).

``--split`` writes the split: every ``--every``-th row of the table sorted by its configuration
columns calibrates and the rest is predicted. With ``--hold-out-shapes K`` the layer shapes
(``perf_model.layer_shape_key``: model, tokens per micro-batch, tp, dtype) fall into K folds
(``shape_folds``) and fold ``--offset`` is held out whole — all its rows are predicted — while as
many rows as the plain split's (table rows / ``--every``), spread evenly over the other shapes'
rows, calibrate: no predicted row's shape was measured, so the per-shape corrections cannot
help. Offsets 0 … K−1 hold out each shape exactly once.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import common  # noqa: E402,F401  (the repository on the path)
from testkit.replay_table import (  # noqa: E402
    CSV_COLUMNS,
    TableTraining,
    csv_group_key,
    csv_row,
    read_csv_rows,
)

from autotune.errors import ConfigError  # noqa: E402
from autotune.model.calibration import Sample, fit_calibration  # noqa: E402
from autotune.model.cluster import load_cluster  # noqa: E402
from autotune.model.perf_model import ENGINES, layer_shape_key, predict_step_time  # noqa: E402

DEFAULT_CLUSTER = Path(__file__).resolve().parent.parent / "examples/clusters/a100-megatron.json"
COLUMNS = CSV_COLUMNS
WITHIN = 0.03


def read_table(path: str) -> list[dict[str, float]]:
    """Rows of a table in the shared format, as numbers (``replay_table.read_csv_rows``)."""
    return read_csv_rows(path)


def training_of(args: argparse.Namespace) -> TableTraining:
    """How the table's code trained, from the command line (defaults: the shared table's)."""
    return TableTraining(
        dtype=args.dtype,
        activation_checkpointing=args.ac,
        pp_schedule=args.schedule,
        attention=args.attention,
        zero_stage=args.zero,
        overlap_enabled=args.overlap,
        vocab_size=args.vocab_size,
    )


def row_sample(row: dict[str, float], args: argparse.Namespace) -> Sample:
    """The TrialConfig and shape a table row describes (``replay_table.csv_row``)."""
    measured = csv_row(row, training_of(args))
    return Sample(measured.config, measured.step_time_s, measured.shape)


group_key = csv_group_key


def spearman(xs: list[float], ys: list[float]) -> float:
    """1.0 for a constant input: no order to get wrong."""
    return common.spearman(xs, ys, constant=1.0)


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
    return {
        "rows": len(rows),
        "mape": statistics.mean(ape),
        "median_ape": statistics.median(ape),
        "groups": len(ranked),
        "median_group_spearman": statistics.median(rhos) if rhos else None,
        "mean_group_spearman": statistics.mean(rhos) if rhos else None,
        "best_within_3pct": hits / len(ranked) if ranked else None,
        "mean_best_gap": statistics.mean(gaps) if gaps else None,
    }


def shape_of(row: dict[str, float], args: argparse.Namespace) -> tuple[tuple, str]:
    """A row's layer shape: its coordinates ((hidden, heads, FFN), tokens per micro-batch, tp)
    and ``layer_shape_key``, the key its per-shape correction is stored under."""
    smp = row_sample(row, args)
    c, s = smp.config, smp.shape
    order = (
        (s.hidden_size, s.num_heads, s.ffn_hidden_size),
        c.micro_batch_size * c.workload.seq_len,
        c.tp_degree,
    )
    return order, layer_shape_key(c, s, c.device)


def shape_folds(shapes: list[tuple[tuple, str]], num_folds: int) -> dict[str, int]:
    """Each layer shape's fold: the sum of its coordinates' ranks (the model's block, tokens
    per micro-batch, tp; each ranked among the table's distinct values) mod ``num_folds`` — a
    Latin-square assignment, so that a fold holds shapes of every tp and every micro-batch
    size (not all of tp 1, say) and a held-out shape's neighbours along each coordinate (one
    step in one of them) are in other folds, measured."""
    values = [sorted({order[d] for order, _ in shapes}) for d in range(len(shapes[0][0]))]
    return {
        key: sum(values[d].index(v) for d, v in enumerate(order)) % num_folds
        for order, key in shapes
    }


def split(args: argparse.Namespace) -> int:
    """Write calibrate.csv (every k-th row in a stable order) and predict.csv (the rest); with
    --hold-out-shapes, predict.csv holds every row of the held-out shapes only."""
    if args.every < 1 or (args.hold_out_shapes is not None and args.hold_out_shapes < 2):
        raise ConfigError("--every must be ≥ 1 and --hold-out-shapes ≥ 2")
    path = Path(args.split)
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            reader = csv.reader(f)
            header = next(reader)
            rows = list(reader)
    except OSError as e:
        raise ConfigError(f"cannot read table '{path}': {e.strerror}") from None
    order = sorted(range(len(rows)), key=lambda i: [float(x) for x in rows[i][:-1]])
    how = (
        f"every {args.every}th row from row {args.offset} of the table sorted by its "
        "configuration columns"
    )
    if args.hold_out_shapes is None:
        chosen = set(order[args.offset :: args.every])
        predicted = set(range(len(rows))) - chosen
    else:
        shapes = [shape_of(r, args) for r in read_table(str(path))]
        folds = shape_folds(shapes, args.hold_out_shapes)
        fold = args.offset % args.hold_out_shapes
        predicted = {i for i, (_, key) in enumerate(shapes) if folds[key] == fold}
        seen = [i for i in order if i not in predicted]
        # As many calibrating rows as the row split has, spread evenly over the other shapes'.
        count = min(len(seen), max(1, len(rows) // args.every))
        chosen = {seen[int(j * len(seen) / count)] for j in range(count)}
        how = (
            f"fold {fold} of {args.hold_out_shapes}: {sum(f == fold for f in folds.values())}"
            f" of {len(folds)} layer shapes held out, all their rows predicted; "
            f"{len(chosen)} rows spread evenly over the other shapes' calibrate"
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, keep in (("calibrate.csv", True), ("predict.csv", False)):
        with open(out / name, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(header)
            w.writerows(r for i, r in enumerate(rows) if i in (chosen if keep else predicted))
    print(
        f"{len(chosen)} rows → {out / 'calibrate.csv'}, {len(predicted)} → "
        f"{out / 'predict.csv'} ({how})"
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calibrate-on", metavar="TABLE")
    p.add_argument("--predict", metavar="TABLE")
    p.add_argument("--cluster", default=str(DEFAULT_CLUSTER), metavar="NAME|FILE")
    p.add_argument("--json", action="store_true", help="print the predictions as JSON only")
    p.add_argument("--split", metavar="TABLE", help="write a calibrate/predict split instead")
    p.add_argument("--every", type=int, default=10, help="--split: every k-th row calibrates")
    p.add_argument(
        "--offset",
        type=int,
        default=0,
        help="--split: first calibrating row (with --hold-out-shapes: the held-out fold)",
    )
    p.add_argument(
        "--hold-out-shapes",
        type=int,
        metavar="K",
        help="--split: put the layer shapes in K folds and hold out fold --offset "
        "whole (predict all its rows)",
    )
    p.add_argument("--out", default="split", help="--split: output folder")
    p.add_argument(
        "--save-calibration",
        metavar="FILE",
        help="also write the fitted calibration as JSON (the validation suite's stored fit: "
        "tests/validation/data/a100-megatron/)",
    )
    train = p.add_argument_group("how the table's code trained (defaults: the shared table's)")
    train.add_argument(
        "--engine",
        choices=sorted(ENGINES),
        default="megatron-legacy",
        help="megatron-legacy: Megatron's TP plan on the calibrated size curve, "
        "as these figures were first made",
    )
    train.add_argument("--dtype", default="float16", choices=("float16", "bfloat16", "float32"))
    train.add_argument("--ac", default="full", choices=("none", "selective", "full"))
    train.add_argument("--schedule", default="1f1b", choices=("gpipe", "1f1b", "interleaved_1f1b"))
    train.add_argument("--attention", default="eager", choices=("eager", "sdpa"))
    train.add_argument("--zero", type=int, default=0, choices=(0, 1, 2, 3))
    train.add_argument(
        "--overlap",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="whether the runs overlapped gradient sync with the backward "
        "(default --no-overlap: the shared table's code synced after it)",
    )
    train.add_argument("--vocab-size", type=int, default=50257)
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
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
    if args.save_calibration:
        _save_calibration(Path(args.save_calibration), report.calibration, args)
    # The same fit less its per-shape corrections: what the formulas and fitted parameters
    # alone predict (the parameters are fitted before the shapes, so no refit is needed).
    bare = dataclasses.replace(report.calibration, layer_shape_factors={}, host_shape_factors={})
    corrected = set(report.calibration.layer_shape_factors) | set(
        report.calibration.host_shape_factors
    )
    predicted, predicted_bare, num_measured_shape = [], [], 0
    for r in predict_rows:
        smp = row_sample(r, args)
        for cal, out in ((report.calibration, predicted), (bare, predicted_bare)):
            out.append(
                predict_step_time(smp.config, base, cal, shape=smp.shape, engine=engine).step_time_s
            )
        num_measured_shape += shape_of(r, args)[1] in corrected
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "predicted_ms": round(t * 1000, 4),
                        "predicted_without_shape_factors_ms": round(u * 1000, 4),
                    }
                    for t, u in zip(predicted, predicted_bare)
                ]
            )
        )
        return 0
    print(
        f"calibrated on {len(calib_rows)} rows of {args.calibrate_on} in {fit_s:.1f} s "
        f"(engine {engine.name}, cluster {base.name}):"
    )
    print(report.table())
    print()
    print(
        f"{'#':>5} {'GPUs':>4} {'h':>5} {'L':>3} {'gb':>4} {'mb':>3} {'tp':>3} {'dp':>3} "
        f"{'pp':>3} {'measured ms':>12} {'predicted ms':>13} {'error':>7}"
    )
    for i, (r, t) in enumerate(zip(predict_rows, predicted)):
        m = r["iteration time (ms)"]
        print(
            f"{i:>5} {r['# GPUs']:>4.0f} {r['hidden size']:>5.0f} {r['# layers']:>3.0f} "
            f"{r['global batch']:>4.0f} {r['micro batch']:>3.0f} "
            f"{r['tensor parallelism']:>3.0f} {r['data parallelism']:>3.0f} "
            f"{r['pipeline parallelism']:>3.0f} {m:>12.1f} {t * 1000:>13.1f} "
            f"{100 * (t * 1000 / m - 1):>+6.1f}%"
        )
    print()
    print(
        f"predicted {len(predict_rows)} rows of {args.predict}; {num_measured_shape} of them "
        f"have a layer shape the calibration rows measured ({len(corrected)} shapes corrected)"
    )
    print(f"  {'':<31} {'with per-shape factors':>24} {'without (same fit)':>20}")
    for label, figures in summary_lines(
        evaluate(predict_rows, predicted),
        evaluate(predict_rows, predicted_bare),
        evaluate(predict_rows, predicted, min_layouts=8),
        evaluate(predict_rows, predicted_bare, min_layouts=8),
    ):
        print(f"  {label:<31} {figures[0]:>24} {figures[1]:>20}")
    return 0


def _save_calibration(path: Path, calibration, args: argparse.Namespace) -> None:
    """The fitted calibration as JSON, with the command that fitted it."""
    source = (
        f"bench/perf_model_accuracy.py --calibrate-on {Path(args.calibrate_on).name} "
        f"--engine {args.engine} --cluster {Path(args.cluster).name}"
    )
    payload = {"source": source, "calibration": calibration.to_dict()}
    path.write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n")


def summary_lines(stats: dict, bare: dict, big: dict, big_bare: dict):
    """(label, (with factors, without)) rows of the printed summary."""

    def pct(x):
        return "n/a" if x is None else f"{100 * x:.2f}%"

    def rho(x):
        return "n/a" if x is None else f"{x:.3f}"

    yield "MAPE", (pct(stats["mape"]), pct(bare["mape"]))
    yield "median |error|", (pct(stats["median_ape"]), pct(bare["median_ape"]))
    if stats["groups"]:
        yield (
            f"groups of ≥ 3 layouts ({stats['groups']}): ρ median",
            (rho(stats["median_group_spearman"]), rho(bare["median_group_spearman"])),
        )
        yield "  ρ mean", (rho(stats["mean_group_spearman"]), rho(bare["mean_group_spearman"]))
        yield (
            "  predicted best within 3%",
            (pct(stats["best_within_3pct"]), pct(bare["best_within_3pct"])),
        )
        yield (
            "  mean gap of the predicted best",
            (pct(stats["mean_best_gap"]), pct(bare["mean_best_gap"])),
        )
    if big["groups"]:
        yield (
            f"groups of ≥ 8 layouts ({big['groups']}): ρ median",
            (rho(big["median_group_spearman"]), rho(big_bare["median_group_spearman"])),
        )
        yield (
            "  predicted best within 3%",
            (pct(big["best_within_3pct"]), pct(big_bare["best_within_3pct"])),
        )


if __name__ == "__main__":
    sys.exit(main())
