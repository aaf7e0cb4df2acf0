"""Ranking stability: does the default search declare a best that an exhaustive, interleaved
"truth" agrees with, on a noisy machine?

1. ``autotune search`` with no options (the default search: tiny GPT, 2 CPU ranks, its own local
   Ray, interleaved re-measurement of the top 3 and the plain baseline) runs ``--runs`` times,
   each in a subprocess with a study of its own, as a user would run it. From each study: the
   declared best (``leaderboard.declare_best``), its interval, whether it declared a tie.
2. The truth: every configuration some run re-measured (each run's finalists, its pick among
   them) is measured ``--truth-rounds`` times, interleaved (each round measures every candidate
   once, in rotated order) on one warm worker group (its cold first run discarded). Truth's best =
   the highest median over the rounds; the truth's noise around it = the paired per-round
   interval (``noise.paired_ratio_interval``) of each candidate against that best.
3. A run is **correct** when its pick's truth median is within 3% of the truth's best; it is
   also counted **within the truth's noise** when the truth's own paired interval of pick / best
   holds 1 (the truth cannot tell them apart either). The ranking step alone (re-measure the
   finalists, declare the best) is judged against the truth's best among that run's own
   finalists: what a search did not measure, or did not make a finalist, no ranking can pick.
   A tie is
   **reported as a tie** when a run's fastest and runner-up are also tied in the truth (their
   truth paired interval contains 1) and the run said so; a run that declared a tie the truth
   separates is counted apart (correct or not by rule 3: the tie rule trades the fastest for
   less memory only when the two are shown equivalent within 3%).

Usage: python bench/ranking_stability.py [--runs 5] [--truth-rounds 6] [--json out.json]
    [--strategy model|tpe|gp|random]   (the searches' --strategy; default: the default search)
16 minutes for 10 runs and 6 truth rounds on the quiet machine (load 2-8).
About 2-5 min per run and 3-5 min of truth on the 2-core machine under others' load: 14 and
17 minutes in all at load averages 6-37, 28 minutes at 15-50 (8 truth rounds).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from autotune.config import TrialConfig  # noqa: E402
from autotune.layouts import short_name  # noqa: E402
from autotune.model.noise import paired_ratio_interval  # noqa: E402
from autotune.status import TrialStatus  # noqa: E402
from autotune.study.leaderboard import build_leaderboard, declare_best  # noqa: E402
from db import Database  # noqa: E402

WITHIN = 0.03
ROOT = Path(__file__).resolve().parent.parent


def load_avg() -> float:
    return os.getloadavg()[0]


def run_search(workdir: Path, i: int, strategy: str | None = None) -> dict:
    """One default search in a subprocess (with ``--strategy`` when given); what its study
    declared."""
    db_url = f"sqlite:///{workdir / 'ranking.db'}"
    out = workdir / f"run{i}"
    start, load = time.monotonic(), load_avg()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for attempt in range(2):  # a loaded machine can time Ray's own start-up out: once more
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "autotune",
                "search",
                "--db",
                db_url,
                "--study",
                f"run{i}" + ("" if attempt == 0 else "-again"),
                "--out",
                str(out),
                *(["--strategy", strategy] if strategy else []),
            ],
            env=env,
            capture_output=True,
            text=True,
            cwd=workdir,
        )
        if proc.returncode == 0 or "timed out during startup" not in proc.stderr:
            break
    study = f"run{i}" + ("" if attempt == 0 else "-again")
    if proc.returncode != 0:
        raise SystemExit(f"run {i} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    db = Database.open(db_url)
    try:
        board = build_leaderboard(db.list_trials(db.get_study(study).id))
    finally:
        db.close()
    verdict = declare_best(board)
    remeasured = [e for e in board if e.status == TrialStatus.COMPLETE and e.rounds]
    interval = verdict.pick.interval
    return {
        "run": i,
        "seconds": time.monotonic() - start,
        "load_before": load,
        "trials": sum(1 for e in board if e.status == TrialStatus.COMPLETE),
        "rounds": max((len(e.rounds) for e in remeasured), default=0),
        "pick": verdict.pick.config,
        "fastest": verdict.fastest.config,
        "runner_up": verdict.runner_up.config if verdict.runner_up else None,
        "pick_tok_s": verdict.pick.throughput,
        "pick_ci": (interval.low, interval.high) if interval else None,
        "tie": verdict.is_tie,
        "remeasured": [e.config for e in remeasured],
    }


def measure_truth(candidates: list[TrialConfig], rounds: int) -> dict[TrialConfig, list[float]]:
    """``rounds`` interleaved rounds over ``candidates`` on one warm worker group."""
    from autotune.trial.executor import ExecutorSettings, RayExecutor

    figures: dict[TrialConfig, list[float]] = {c: [] for c in candidates}
    with RayExecutor(ExecutorSettings(trial_timeout_s=300.0)) as ex:
        ex.run(candidates[0])  # the cold first run on a new group: discarded
        for r in range(rounds):
            shift = r % len(candidates)
            for c in candidates[shift:] + candidates[:shift]:
                figures[c].append(ex.run(c).throughput_tokens_per_s)
            print(
                f"truth round {r + 1}/{rounds}: load {load_avg():.1f}", file=sys.stderr, flush=True
            )
    return figures


def tied_in_truth(truth: dict, a: TrialConfig, b: TrialConfig) -> bool:
    ratio = paired_ratio_interval(truth[b], truth[a])
    return ratio is not None and ratio.contains(1.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--truth-rounds", type=int, default=6)
    ap.add_argument("--json", metavar="FILE", help="also write every figure here")
    ap.add_argument("--strategy", help="the search's --strategy (default: the search's own)")
    args = ap.parse_args()
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ranking-") as tmp:
        runs = []
        for i in range(1, args.runs + 1):
            runs.append(run_search(Path(tmp), i, args.strategy))
            r = runs[-1]
            print(
                f"run {i}: {short_name(r['pick'])} {r['pick_tok_s']:,.0f} tok/s, "
                f"tie {r['tie']}, {r['rounds']} rounds, {r['seconds']:.0f}s, "
                f"load {r['load_before']:.1f}",
                file=sys.stderr,
                flush=True,
            )
    candidates = list(dict.fromkeys(c for r in runs for c in (r["remeasured"] + [r["pick"]])))
    truth = measure_truth(candidates, args.truth_rounds)
    median = {c: statistics.median(v) for c, v in truth.items()}
    best = max(median, key=median.get)
    print(
        f"\ntruth: {len(candidates)} candidates × {args.truth_rounds} interleaved rounds; "
        f"machine load (1 min) now {load_avg():.1f}"
    )
    print("| candidate | truth median tok/s | / best | paired 95% CI of / best |")
    print("|---|---|---|---|")
    for c in sorted(candidates, key=lambda c: -median[c]):
        ratio = paired_ratio_interval(truth[c], truth[best])
        ci = f"{ratio.low:.3f}–{ratio.high:.3f}" if ratio and c != best else "–"
        print(f"| {short_name(c)} | {median[c]:,.0f} | {median[c] / median[best]:.3f} | {ci} |")
    print(
        "\n| run | declared best | its tok/s (95% CI) | tie declared | truth: top two tied "
        "| pick / truth best | correct | within truth's noise | pick / best of its finalists "
        "| rounds | s | load |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    correct = within_noise = ranked = ties_truth = ties_reported = ties_extra = 0
    for r in runs:
        ok = median[r["pick"]] >= median[best] * (1 - WITHIN)
        correct += ok
        # the truth cannot tell the pick from its best: their paired interval holds 1
        noise_ok = r["pick"] == best or tied_in_truth(truth, best, r["pick"])
        within_noise += noise_ok
        # the ranking step alone: the pick against the truth's best of the run's own finalists
        own = median[r["pick"]] / max(median[c] for c in r["remeasured"] + [r["pick"]])
        ranked += own >= 1 - WITHIN
        truth_tie = (
            r["runner_up"] is not None
            and r["runner_up"] in truth
            and r["fastest"] in truth
            and tied_in_truth(truth, r["fastest"], r["runner_up"])
        )
        ties_truth += truth_tie
        ties_reported += truth_tie and r["tie"]
        ties_extra += r["tie"] and not truth_tie
        ci = f"{r['pick_ci'][0]:,.0f}–{r['pick_ci'][1]:,.0f}" if r["pick_ci"] else "–"
        print(
            f"| {r['run']} | {short_name(r['pick'])} | {r['pick_tok_s']:,.0f} ({ci}) | "
            f"{'yes' if r['tie'] else 'no'} | {'yes' if truth_tie else 'no'} | "
            f"{median[r['pick']] / median[best]:.3f} | {'yes' if ok else 'NO'} | "
            f"{'yes' if noise_ok else 'no'} | {own:.3f} | "
            f"{r['rounds']} | {r['seconds']:.0f} | {r['load_before']:.1f} |"
        )
    print(
        f"\ndeclared best within {WITHIN:.0%} of the truth's best: {correct} of {len(runs)}; "
        f"within the truth's own noise of it: {within_noise} of {len(runs)}; within {WITHIN:.0%} "
        f"of the truth's best among the run's own finalists (the ranking step alone): {ranked} "
        f"of {len(runs)}; "
        f"ties in the truth reported as ties: {ties_reported} of {ties_truth}; ties declared "
        f"that the truth separates: {ties_extra}; {time.monotonic() - began:.0f}s in all"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "runs": [
                        {
                            **r,
                            "pick": short_name(r["pick"]),
                            "fastest": short_name(r["fastest"]),
                            "runner_up": short_name(r["runner_up"]) if r["runner_up"] else None,
                            "remeasured": [short_name(c) for c in r["remeasured"]],
                        }
                        for r in runs
                    ],
                    "truth": {short_name(c): v for c, v in truth.items()},
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
