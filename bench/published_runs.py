"""Predicted against measured: every row of the published A100 and H100 tables, step time and
memory.

    python bench/published_runs.py [--json] [--fit] [--no-memory]

Step time (``tests/testkit/published_rows.py``: the layouts and engines the papers state) with the
built-in ``a100-sxm4-80gb`` cluster and its shipped calibration
(``autotune/model/data/a100_published.json``). That calibration is fitted on the even-numbered
rows of every table (SC21 Tables 1-2, Korthikanti et al. Tables 3/5, torchtitan's A100 rows);
the odd-numbered rows are predicted. Each row prints measured and predicted seconds, the error
and F (fitted) or P (predicted); each table its MAPE over its predicted rows and over all.

Then NVIDIA's DGX-H100 FP8 tables (``h100_rows``; ``tests/validation/data/published-h100-fp8``)
with the built-in ``h100-sxm`` cluster: NeMo 24.07's pre-training table, the one the H100
cluster is to be fitted on (every row F), and Megatron-Bridge's dense Llama rows and NeMo's
long-sequence context-parallel rows, predicted (every row P); each table its MAPE over all rows.
``--fit`` refits the shipped parameters (``FITTED``; ``FIXED`` are held) by least squares of
log(predicted / measured) over the fitted rows and writes the JSONs: the A100 one and the H100
nodes' (``autotune/model/data/h100_published.json``, NeMo 24.07's rows only, ``H100_HELD``).

Memory (``tests/testkit/published_memory.py``, printed by ``bench/published_memory.py``):
BigScience's sweep (stated peaks, OOM rows) and torchtitan's OOM verdicts, with
``engine_memory``'s presets.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # the checkout and its testing kit (testkit)

from testkit.published_rows import H100_FITTED, TimeRow, all_rows, h100_rows  # noqa: E402

from autotune.model.cluster import (  # noqa: E402
    H100_CALIBRATION,
    SHIPPED_CALIBRATION,
    ClusterSpec,
    load_cluster,
)
from autotune.model.perf_model import Calibration, predict_step_time  # noqa: E402

FITTED = {
    "compute_efficiency": (0.3, 1.0),
    "gemm_half_dim": (8.0, 2000.0),
    "flash_efficiency": (0.3, 0.73),
    "ring_step_latency_s": (0.0, 1e-4),
    "overlap_efficiency": (0.5, 1.0),
}
"""Fitted parameters and their bounds (flash: FlashAttention-2's forward reaches up to 73% of
an A100's peak, Dao 2023 §4.1)."""
FIXED = {"elementwise_bytes": 22.0, "elementwise_sharded_bytes": 16.0, "score_bytes": 8.0}
"""Held at their byte counts, not fitted, so that a GPU whose HBM grew less than its peak
(H100: 1.6× the bandwidth, 3.2× the FLOP/s) pays for them as it should. Per b·s·h element per
layer forward, 2-byte elements: two LayerNorms (read, write: 4 each), two bias-dropout-adds
(input, residual, output, 1-byte mask: 7 each) on the whole activation; the bias-GELU on the
4h/t MLP activation (read, write: 16/t); per score element the fused scale-mask-softmax (4) and
the attention dropout (read, write, mask: 5), rounded to 8 (Megatron's fused kernels,
``megatron/fused_kernels``, ``fused_bias_gelu.py``, ``fused_bias_dropout_add``)."""


def fitted(index_in_table: int) -> bool:
    """Rows the shipped calibration is fitted on: every table's even-numbered rows (0, 2, …);
    the odd-numbered ones are predicted."""
    return index_in_table % 2 == 0


def split(rows: list[TimeRow]) -> list[bool]:
    """Per row, whether it is fitted (``fitted`` of its index within its table)."""
    seen: dict[str, int] = {}
    out = []
    for r in rows:
        i = seen.get(r.table, 0)
        seen[r.table] = i + 1
        out.append(fitted(i))
    return out


def cluster_for(row: TimeRow, cache: dict[tuple[str, int], ClusterSpec]) -> ClusterSpec:
    """The row's built-in cluster with as many 8-GPU nodes as the run used (one at least)."""
    key = (row.cluster, max(1, row.config.world_size // 8))
    if key not in cache:
        cache[key] = load_cluster(key[0], nodes=key[1])
    return cache[key]


def predict(rows: list[TimeRow], cal: Calibration | None = None) -> list[float]:
    cache: dict[tuple[str, int], ClusterSpec] = {}
    out = []
    for r in rows:
        cluster = cluster_for(r, cache)
        out.append(
            predict_step_time(
                r.config,
                cluster,
                cal or Calibration.for_cluster(cluster),
                shape=r.shape,
                engine=r.engine,
            ).step_time_s
        )
    return out


H100_HELD = ("ring_step_latency_s",)
"""Held in the H100 fit at the shipped A100 fit's value: NeMo 24.07's rows use Megatron's
distributed optimizer, never ZeRO-3's per-module rings, so that table cannot tell the ring
step's latency (a fit drives it to its bound, 0). It is the network's per-hop latency (nccl-tests
``PERFORMANCE.md``), not the GPU's, and DGX-H100's InfiniBand is of the same kind."""


def fit(rows: list[TimeRow], held: dict[str, float] | None = None) -> dict[str, float]:
    """Least squares of log(predicted / measured) over ``rows`` (scipy, bench only); ``held``
    takes parameters of ``FITTED`` out of the fit at the given values."""
    from scipy.optimize import least_squares

    fixed = {**FIXED, **(held or {})}
    names = [n for n in FITTED if n not in fixed]
    lo, hi = zip(*(FITTED[n] for n in names))
    span = [h - lo_ for lo_, h in zip(lo, hi)]

    def cal(x) -> Calibration:
        return Calibration(**fixed, **{n: lo[i] + x[i] * span[i] for i, n in enumerate(names)})

    def residuals(x) -> list[float]:
        return [math.log(p / r.measured_s) for p, r in zip(predict(rows, cal(x)), rows)]

    sol = least_squares(residuals, [0.5] * len(names), bounds=(0, 1))
    return {**fixed, **{n: float(lo[i] + sol.x[i] * span[i]) for i, n in enumerate(names)}}


def _write_fit(
    path: Path, rows: list[TimeRow], over: str, held: dict[str, float] | None = None
) -> dict[str, float]:
    """Fit ``rows`` (``fit``) and write the calibration JSON a built-in cluster reads."""
    params = fit(rows, held)
    source = f"bench/published_runs.py --fit: least squares of log step time over {over}"
    kept = ", ".join([*FIXED, *(f"{n} (the A100 fit's)" for n in held or {})])
    path.write_text(
        json.dumps({"source": f"{source}; held: {kept}", "calibration": params}, indent=1) + "\n"
    )
    print(f"wrote {path.relative_to(ROOT)}: {params}")
    return params


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--fit", action="store_true", help="refit the shipped calibration")
    ap.add_argument("--no-memory", action="store_true", help="step time only")
    args = ap.parse_args(argv)
    rows = all_rows()
    is_fit = split(rows)
    if args.fit:
        a100 = json.loads(SHIPPED_CALIBRATION.read_text())["calibration"]  # as shipped
        _write_fit(
            SHIPPED_CALIBRATION,
            [r for r, f in zip(rows, is_fit) if f],
            "the even-numbered rows of each table of tests/validation/data/published-a100 "
            "(SC21 Tables 1-2, Korthikanti et al. Tables 3/5, torchtitan A100)",
        )
        _write_fit(
            H100_CALIBRATION,
            [r for r in h100_rows() if r.table in H100_FITTED],
            "every row of NeMo 24.07's DGX-H100 FP8 pre-training table "
            "(tests/validation/data/published-h100-fp8/nemo_24.07_h100_fp8_pretrain.csv) only",
            {n: a100[n] for n in H100_HELD},
        )
    predicted = predict(rows)
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "table": r.table,
                        "row": r.label,
                        "measured_s": r.measured_s,
                        "predicted_s": p,
                        "fitted": f,
                    }
                    for r, p, f in zip(rows, predicted, is_fit)
                ],
                indent=1,
            )
        )
        return 0
    print(f"{'table':<12} {'row':<32} {'engine':<14} {'measured':>9} {'predicted':>9} {'error':>7}")
    errors: dict[str, list[tuple[float, bool]]] = {}
    for r, p, f in zip(rows, predicted, is_fit):
        err = p / r.measured_s - 1
        errors.setdefault(r.table, []).append((abs(err), f))
        print(
            f"{r.table:<12} {r.label:<32} {r.engine.name:<14} {r.measured_s:>8.2f}s "
            f"{p:>8.2f}s {err:>+7.1%} {'F' if f else 'P'}"
        )
    for table, errs in errors.items():
        held = [e for e, f in errs if not f]
        print(
            f"{table}: step-time MAPE {statistics.fmean(held):.1%} over its {len(held)} "
            f"predicted rows (not fitted), {statistics.fmean(e for e, _ in errs):.1%} over "
            f"all {len(errs)}; worst predicted {max(held):.1%}"
        )
    _h100()
    if not args.no_memory:
        _memory()
    return 0


def _h100() -> None:
    """The H100 FP8 tables: each row predicted against measured, each table's MAPE, F for the
    table the H100 cluster is fitted on, P for the predicted ones."""
    rows = h100_rows()
    errors: dict[str, list[float]] = {}
    print(f"H100 FP8 (h100-sxm, {', '.join(H100_FITTED)} fitted, the others predicted)")
    for r, p in zip(rows, predict(rows)):
        err = p / r.measured_s - 1
        errors.setdefault(r.table, []).append(abs(err))
        mark = "F" if r.table in H100_FITTED else "P"
        print(
            f"{r.table:<13} {r.label:<31} {r.engine.name:<14} {r.measured_s:>8.2f}s "
            f"{p:>8.2f}s {err:>+7.1%} {mark}"
        )
    for table, errs in errors.items():
        kind = "fitted" if table in H100_FITTED else "predicted (not fitted)"
        print(
            f"{table}: step-time MAPE {statistics.fmean(errs):.1%} over its {len(errs)} rows, "
            f"{kind}; worst {max(errs):.1%}"
        )


def _memory() -> None:
    from testkit.published_memory import mape, predict_memory_rows

    preds = predict_memory_rows()
    big = [p for p in preds if p.row.table == "bigscience"]
    stated = [p for p in big if p.error is not None]
    wrong = [p for p in preds if p.fits == p.row.oom]
    print(
        f"memory (engine_memory, bench/published_memory.py for rows): BigScience MAPE "
        f"{mape(big):.1%} over {len(stated)} stated peaks (odd rows, not fitted: "
        f"{mape(stated[1::2]):.1%}); OOM verdicts wrong on {len(wrong)} of {len(preds)} rows "
        f"(BigScience and torchtitan)"
    )


if __name__ == "__main__":
    sys.exit(main())
