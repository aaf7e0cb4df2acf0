"""Dashboard build time and file size for a large study.

Builds a synthetic study in a temporary SQLite database through ``Database.add_trial``, shaped
as a real search leaves one (defaults: 500 trials of GPT-2 small on 8 ranks, seq 1024, global
batch 64):

- the configurations are 500 distinct valid ones of that space (``SearchSpace``), in random
  order, numbered 0…499;
- the memory limit sits at the 70th percentile of the predicted peaks (× 1.15, the search's
  margin), so the ~30% predicted not to fit are ``infeasible_predicted`` with only a predicted
  peak, as the search records them;
- of the rest, 4% fail (no metrics, the predicted peak, an error text), 3% run out of memory
  (``infeasible_measured`` without a measurement, as an OOM is stored); the others get a
  measured peak = prediction × U(0.88, 1.12) per rank (over the limit: ``infeasible_measured``,
  with metrics and a timeline, as the search stores them), a throughput, the step time it
  implies, per-rank memory by category, and a timeline of 2 profiled steps on each of the 8
  ranks with ``--ops`` compute ops per rank per step plus the collectives of that layout
  (DDP/FSDP buckets on dp, TP all-reduces, pipeline send/recv), step spans around them, and
  the per-rank breakdown ``autotune.study.store`` keeps (``profiler.breakdown``);
- the best three carry two re-measurements each.

Then times ``load_study`` + ``build_report`` + writing the file (median of ``--runs``) and
prints the file's size. Target: under 5 s for 500 trials. With Chromium at ``--chromium``
(Debian's, driven by Playwright), also the time from opening the file to every figure drawn.

Usage (from the repo root)::

    python bench/dashboard_build.py              # table
    python bench/dashboard_build.py --json       # raw figures
    python bench/dashboard_build.py --trials 40 --runs 1   # quick smoke run
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
import random  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from datetime import UTC, datetime  # noqa: E402

from autotune.config import WorkloadSpec  # noqa: E402
from autotune.model.memory import estimate_memory  # noqa: E402
from autotune.search.search import GIB, MEMORY_MARGIN, SearchSpec, base_config  # noqa: E402
from autotune.search.space import SearchSpace  # noqa: E402
from autotune.study import store  # noqa: E402
from dashboards.data import load_study  # noqa: E402
from dashboards.report import build_report  # noqa: E402
from db import Database, RankMemoryRecord, SpanRecord, TrialRecord  # noqa: E402
from profiler import Span  # noqa: E402

TARGET_S = 5.0
CLOCK_ORIGIN_NS = 1_764_000_000_000_000_000
COMPUTE_OPS = (
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::gelu",
    "aten::_softmax",
    "aten::layer_norm",
    "aten::add_",
    "aten::mul",
    "aten::copy_",
    "aten::view",
    "aten::scaled_dot_product_attention",
    "aten::embedding",
    "aten::sum",
    "aten::_foreach_add_",
    "aten::_foreach_mul_",
)
PHASES = ("forward", "backward", "optimizer")
ERRORS = (
    "rank 3: RuntimeError: [gloo] Connection closed by peer",
    "trial timed out after 300 s (a hung collective?)",
    "rank 0: worker died (actor crashed: SIGKILL)",
)
MEMORY_CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "other", "peak")


def log(message: str) -> None:
    print(f"[dashboard_build] {message}", file=sys.stderr, flush=True)


def make_spans(config, rng: random.Random, ops: int) -> list[SpanRecord]:
    """Two profiled steps on every rank: compute ops by phase, the layout's collectives in the
    backward (and p2p between stages), one 'step' span around each step."""
    spans: list[SpanRecord] = []
    for rank in range(config.world_size):
        clock = CLOCK_ORIGIN_NS + rng.randint(0, 20_000)
        for step in range(2):
            start = clock
            for i in range(ops):
                phase = PHASES[min(2, i * 3 // ops)]
                duration = rng.randint(2_000, 400_000)
                spans.append(
                    SpanRecord(
                        rank, step, "compute", rng.choice(COMPUTE_OPS), phase, clock, duration
                    )
                )
                if phase == "backward" and i % 25 == 0:
                    if config.dp_degree > 1:  # overlapped bucket collectives on a gloo thread
                        name = "all_reduce" if config.zero_stage < 2 else "reduce_scatter"
                        spans.append(
                            SpanRecord(
                                rank,
                                step,
                                "comm",
                                name,
                                "",
                                clock,
                                rng.randint(50_000, 2_000_000),
                                bytes=int(config.bucket_mb * 2**20),
                                group="dp",
                            )
                        )
                    if config.tp_degree > 1:
                        spans.append(
                            SpanRecord(
                                rank,
                                step,
                                "comm",
                                "all_reduce",
                                "",
                                clock + duration,
                                rng.randint(20_000, 300_000),
                                bytes=rng.choice((1, 4)) << 20,
                                group="tp",
                            )
                        )
                    if config.pp_degree > 1:
                        spans.append(
                            SpanRecord(
                                rank,
                                step,
                                "p2p",
                                rng.choice(("send", "recv")),
                                "",
                                clock,
                                rng.randint(10_000, 200_000),
                                bytes=4 << 20,
                                group="pp",
                            )
                        )
                clock += duration + rng.randint(200, 30_000)
            spans.append(SpanRecord(rank, step, "step", "step", "", start, clock - start))
    return spans


def rank_metrics(spans: list[SpanRecord]) -> list[dict]:
    """What the store keeps of a trial's timeline (``autotune.study.store.rank_metrics``)."""
    return store.rank_metrics(
        Span(s.rank, s.step, s.kind, s.name, s.category, s.start_ns, s.dur_ns, s.bytes, s.group)
        for s in spans
    )


def make_study(path: str, num_trials: int, ops: int, seed: int) -> dict:
    rng = random.Random(seed)
    spec = SearchSpec(
        workload=WorkloadSpec(family="gpt", size="small", seq_len=1024, global_batch_size=64),
        world_size=8,
        device="cpu",
        study_name="bench-500",
    )
    configs = list(SearchSpace(base_config(spec)).configs)
    rng.shuffle(configs)
    configs = configs[:num_trials]
    predicted = [estimate_memory(c).total for c in configs]
    screened = sorted(p * (1 + MEMORY_MARGIN) for p in predicted)
    limit = screened[int(0.7 * (len(screened) - 1))]
    spec = dataclasses.replace(spec, memory_limit_gib=limit / GIB)
    num_spans, statuses = 0, Counter()
    with Database.open(f"sqlite:///{path}") as database:
        study = database.create_study(spec.study_name, spec.to_dict())
        complete = []
        for number, (config, peak) in enumerate(zip(configs, predicted)):
            metrics, memory, spans, error = {}, (RankMemoryRecord(0, "peak", peak, None),), [], None
            if peak * (1 + MEMORY_MARGIN) > limit:
                status = "infeasible_predicted"
                error = (
                    f"predicted peak {peak / GIB:.3g} GiB (+{MEMORY_MARGIN:.0%} margin) > "
                    f"limit {limit / GIB:.3g} GiB"
                )
            elif rng.random() < 0.04:
                status, error = "failed", rng.choice(ERRORS)
            elif rng.random() < 0.03:  # out of memory: the trial stored no measurement
                status = "infeasible_measured"
                error = "rank 2: out of memory (CPU allocator): tried to allocate 1.5 GiB"
            else:
                peaks = [int(peak * rng.uniform(0.88, 1.12)) for _ in range(config.world_size)]
                status = "complete" if max(peaks) <= limit else "infeasible_measured"
                if status != "complete":
                    error = (
                        f"measured peak {max(peaks) / GIB:.3g} GiB > limit {limit / GIB:.3g} GiB"
                    )
                step_time = rng.uniform(0.4, 2.5)
                spans = make_spans(config, rng, ops)
                metrics = {
                    "step_time_s": step_time,
                    "throughput_tokens_per_s": config.tokens_per_step / step_time,
                    "peak_memory_bytes": max(peaks),
                    "ranks": rank_metrics(spans),
                }
                states = peak // 3
                memory = tuple(
                    RankMemoryRecord(r, c, peak if c == "peak" else None, value)
                    for r, p in enumerate(peaks)
                    for c, value in zip(
                        MEMORY_CATEGORIES, (states // 4, states // 4, states // 2, p - states, 0, p)
                    )
                )
            trial_id = database.add_trial(
                TrialRecord(
                    id=None,
                    study_id=study.id,
                    number=number,
                    status=status,
                    config=config.resolved(),
                    metrics=metrics,
                    env={"device": "cpu"},
                    error=error,
                    created_at=datetime.now(UTC),
                    memory=memory,
                ),
                spans,
            )
            if status == "complete":
                complete.append((metrics["throughput_tokens_per_s"], trial_id))
            num_spans += len(spans)
            statuses[status] += 1
        for throughput, trial_id in sorted(complete, reverse=True)[:3]:
            record = database.get_trial(trial_id)
            database.update_trial(
                trial_id,
                status="complete",
                metrics={
                    **record.metrics,
                    "remeasured_throughputs": [
                        throughput * rng.uniform(0.97, 1.03) for _ in range(2)
                    ],
                },
            )
    return {
        "trials": num_trials,
        "statuses": dict(statuses),
        "spans": num_spans,
        "trials_with_spans": statuses["complete"] + statuses["infeasible_measured"],
        "limit_gib": limit / GIB,
    }


def bench_build(path: str, runs: int, out_dir: str) -> dict:
    loads, builds, writes, size, study = [], [], [], 0, None
    for run in range(runs):
        with Database.open(f"sqlite:///{path}", create=False) as database:
            start = time.perf_counter()
            study = load_study(database)
            loaded = time.perf_counter()
            text = build_report(study)
            built = time.perf_counter()
            out = os.path.join(out_dir, "report.html")
            with open(out, "w", encoding="utf-8") as f:
                f.write(text)
            written = time.perf_counter()
        loads.append(loaded - start)
        builds.append(built - loaded)
        writes.append(written - built)
        size = os.path.getsize(out)
        log(f"run {run}: {written - start:.2f} s, {size / 1e6:.1f} MB")
    totals = [a + b + c for a, b, c in zip(loads, builds, writes)]
    return {
        "runs": runs,
        "total_s": totals,
        "median_total_s": statistics.median(totals),
        "median_load_s": statistics.median(loads),
        "median_build_s": statistics.median(builds),
        "median_write_s": statistics.median(writes),
        "file_bytes": size,
        "timelines": len(study.timelines),
        "spans_drawn": sum(len(t.spans) for t in study.timelines),
        "spans_of_drawn_trials": sum(t.total_spans for t in study.timelines),
    }


def bench_browser(path: str, chromium: str) -> float | None:
    """Seconds from opening the report in headless Chromium to every figure drawn."""
    if not os.path.exists(chromium):
        return None
    from playwright.sync_api import sync_playwright

    drawn = (
        "Array.from(document.querySelectorAll('div.figure'))"
        ".every(d => d.querySelector('.main-svg'))"
    )
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=chromium, args=["--no-sandbox", "--enable-unsafe-swiftshader"]
        )
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            start = time.perf_counter()
            page.goto(f"file://{path}")
            page.wait_for_function(drawn, timeout=120_000)
            return time.perf_counter() - start
        finally:
            browser.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=500)
    parser.add_argument(
        "--ops", type=int, default=600, help="compute ops per rank per profiled step (default 600)"
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--chromium",
        default="/usr/bin/chromium",
        help="browser for the open-and-draw time (skipped when missing)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        path = os.path.join(workdir, "study.db")
        start = time.perf_counter()
        made = make_study(path, args.trials, args.ops, args.seed)
        log(f"study made in {time.perf_counter() - start:.1f} s: {made}")
        made["db_bytes"] = os.path.getsize(path)
        result = {**made, **bench_build(path, args.runs, workdir)}
        result["browser_s"] = bench_browser(os.path.join(workdir, "report.html"), args.chromium)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    s = result["statuses"]
    rows = [
        (
            "trials (complete / infeasible measured / predicted / failed)",
            f"{result['trials']} ({s.get('complete', 0)} / {s.get('infeasible_measured', 0)} / "
            f"{s.get('infeasible_predicted', 0)} / {s.get('failed', 0)})",
        ),
        (
            "spans in the database (trials with a timeline)",
            f"{result['spans']:,} ({result['trials_with_spans']})",
        ),
        ("database file", f"{result['db_bytes'] / 1e6:.1f} MB"),
        (
            "timelines embedded (spans drawn / theirs)",
            f"{result['timelines']} ({result['spans_drawn']:,} / "
            f"{result['spans_of_drawn_trials']:,})",
        ),
        (
            f"build time, median of {result['runs']} (target < {TARGET_S:g} s)",
            f"{result['median_total_s']:.2f} s"
            f" ({'met' if result['median_total_s'] < TARGET_S else 'MISSED'})",
        ),
        ("— load_study (database reads, leaderboard)", f"{result['median_load_s']:.2f} s"),
        ("— build_report (figures, JSON, HTML)", f"{result['median_build_s']:.2f} s"),
        ("— write the file", f"{result['median_write_s']:.3f} s"),
        ("report file size", f"{result['file_bytes'] / 1e6:.1f} MB"),
        (
            "opened in headless Chromium until every figure is drawn",
            f"{result['browser_s']:.2f} s" if result["browser_s"] is not None else "no browser",
        ),
    ]
    width = max(len(k) for k, _ in rows)
    print(f"{'measure':<{width}}  figure")
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
