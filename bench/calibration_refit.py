"""What a search's calibration refit costs as the study grows.

A study of N complete trials of the tiny GPT on 2 CPU ranks (configurations from the default
search space, in a fixed shuffled order) is stored in a fresh SQLite file. Each trial's step
time is the performance model's under a fixed "true" calibration with ±10% deterministic noise;
its spans are shaped like a profiled trial's (2 ranks × 2 profiled steps × ``--ops`` compute
spans per step in forward / backward / optimizer, and the dp all-reduce of every gradient).

Measured, median of ``--repeats`` runs each:

1. **refit in a search**: ``StudyCalibration.refit`` after the N-th trial, with every trial's
   span summary kept from when it finished (as the search does): read the trials, the span and
   step-time fits, and the stored calibration row;
2. **summary of one trial's spans**: ``span_fit.summarize`` on one trial (paid once per trial,
   when it finishes);
3. **cold fit** (``autotune calibrate``): ``fit_study`` with the spans of all N trials loaded from
   the database.

Usage (from the repo root)::

    python bench/calibration_refit.py                 # N = 5, 10, 20, 40
    python bench/calibration_refit.py --trials 10 40 --repeats 3
"""

from __future__ import annotations

import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

import argparse  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from datetime import UTC, datetime  # noqa: E402

from autotune.config import TrialConfig  # noqa: E402
from autotune.model.cluster import local_cpu_cluster  # noqa: E402
from autotune.model.perf_model import Calibration, predict_step_time  # noqa: E402
from autotune.model.span_fit import summarize  # noqa: E402
from autotune.search.search import SearchSpec, base_config  # noqa: E402
from autotune.search.space import SearchSpace  # noqa: E402
from autotune.search.study_calibration import StudyCalibration, fit_study  # noqa: E402
from db import Database, SpanRecord, TrialRecord  # noqa: E402

TRUE = Calibration(
    compute_efficiency=0.3,
    half_efficiency_rows=2e6,
    layer_overhead_s=3e-4,
    step_overhead_s=2e-3,
    comm_efficiency=0.4,
)


def make_spans(
    config: TrialConfig, step_s: float, ops: int, rng: random.Random
) -> list[SpanRecord]:
    nbytes = 4 * config.workload.shape.num_params()
    spans, origin = [], 1_764_000_000_000_000_000
    for rank in range(config.world_size):
        clock = origin
        for step in (0, 1):
            start = clock
            op_ns = int(step_s * 0.8e9 / ops)
            for i in range(ops):
                category = (
                    "forward" if i < ops // 3 else ("backward" if i < 0.9 * ops else "optimizer")
                )
                spans.append(SpanRecord(rank, step, "compute", "aten::mm", category, clock, op_ns))
                clock += op_ns
            spans.append(
                SpanRecord(
                    rank,
                    step,
                    "comm",
                    "all_reduce",
                    "",
                    clock,
                    rng.randint(1_000_000, 3_000_000),
                    nbytes,
                    "dp",
                )
            )
            clock += 3_000_000
            spans.append(SpanRecord(rank, step, "step", "step", "", start, clock - start))
    return spans


def build(path: str, configs: list[TrialConfig], ops: int) -> tuple[Database, int, dict]:
    rng = random.Random(0)
    cluster = local_cpu_cluster(2)
    database = Database.open(f"sqlite:///{path}")
    study = database.create_study("bench", {})
    spans_of = {}
    for number, config in enumerate(configs):
        step = predict_step_time(config, cluster, TRUE).step_time_s * (
            1 + 0.1 * math.sin(1.3 * number)
        )
        spans = make_spans(config, step, ops, rng)
        trial_id = database.add_trial(
            TrialRecord(
                id=None,
                study_id=study.id,
                number=number,
                status="complete",
                config=config.resolved(),
                metrics={"step_time_s": step},
                env={},
                error=None,
                created_at=datetime.now(UTC),
            ),
            spans,
        )
        spans_of[trial_id] = (config, spans)
    return database, study.id, spans_of


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, nargs="+", default=[5, 10, 20, 40])
    parser.add_argument("--ops", type=int, default=3000, help="compute spans per rank per step")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    spec = SearchSpec(world_size=2, device="cpu")
    configs = list(SearchSpace(base_config(spec)).configs)
    random.Random(1).shuffle(configs)
    if max(args.trials) > len(configs):
        parser.error(f"the space has {len(configs)} configurations; ask for at most that many")
    cluster = local_cpu_cluster(2)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.trials:
            database, study_id, spans_of = build(
                os.path.join(tmp, f"n{n}.db"), configs[:n], args.ops
            )
            calibration = StudyCalibration(database, study_id, cluster, Calibration())
            for trial_id, (config, spans) in spans_of.items():
                calibration.remember_spans(trial_id, config, spans)
            calibration.refit()  # first call imports scipy
            refit = median_time(calibration.refit, args.repeats)
            config, spans = next(iter(spans_of.values()))
            summary = median_time(lambda s=spans, c=config: summarize(s, c, cluster), args.repeats)
            cold = median_time(
                lambda db=database, i=study_id: fit_study(db, i, cluster), args.repeats
            )
            fit = calibration.refit()
            rows.append((n, refit, summary, cold, fit.report.mape, len(spans)))
            database.close()
    print(
        f"{'trials':>6} {'refit in a search s':>20} {'summary of 1 trial s':>21} "
        f"{'cold fit s':>11} {'MAPE':>6} {'spans/trial':>12}"
    )
    for n, refit, summary, cold, mape, num_spans in rows:
        print(f"{n:>6} {refit:>20.3f} {summary:>21.3f} {cold:>11.3f} {mape:>6.1%} {num_spans:>12,}")


if __name__ == "__main__":
    main()
