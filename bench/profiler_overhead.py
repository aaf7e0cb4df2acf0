"""Profiler overhead, and proof that timed steps are untouched by profiling.

For a few layouts of the tiny GPT at world size 2 on CPU (gloo), in one run:
1. profiled-step time (the median of the slowest rank over the profiled steps) against the
   unprofiled timed-step time of the same trial;
2. the timed-step time of trials with ``num_profiled_steps=2`` against trials of the same config
   with profiling off (``num_profiled_steps=0``), alternated for ``--rounds`` rounds: profiling
   happens after the timed steps, so the ratio should be 1 within machine noise.

Usage: python bench/profiler_overhead.py [--rounds 3] [--timed 10] [--json]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402

from autotune.config import TrialConfig  # noqa: E402
from autotune.trial.executor import RayExecutor  # noqa: E402

LAYOUTS = {
    "ddp dp2": dict(zero_stage=0, micro_batch_size=4),
    "zero3 dp2": dict(zero_stage=3, micro_batch_size=4),
    "pp2 1f1b": dict(pp_degree=2, micro_batch_size=2, pp_schedule="1f1b"),
    "tp2": dict(tp_degree=2, micro_batch_size=8),
}


def profiled_step_time(result, config: TrialConfig) -> float:
    first = config.num_warmup_steps + config.num_timed_steps
    idx = range(first, first + config.num_profiled_steps)
    return statistics.median(max(r.step_times[i] for r in result.ranks) for i in idx)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--timed", type=int, default=10)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    rows = []
    with RayExecutor() as ex:
        ex.start()
        for name, layout in LAYOUTS.items():
            base = TrialConfig(
                world_size=2,
                device="cpu",
                num_warmup_steps=2,
                num_timed_steps=args.timed,
                num_profiled_steps=2,
                **layout,
            )
            off = dataclasses.replace(base, num_profiled_steps=0)
            ex.run(base)  # warm the group and the layout's mesh
            timed_on, timed_off, profiled, spans = [], [], [], []
            for _ in range(args.rounds):
                on_result = ex.run(base)
                timed_on.append(on_result.step_time_s)
                profiled.append(profiled_step_time(on_result, base))
                spans.append(sum(len(r.spans) for r in on_result.ranks))
                timed_off.append(ex.run(off).step_time_s)
            rows.append(
                {
                    "layout": name,
                    "timed_ms": statistics.median(timed_on) * 1e3,
                    "profiled_ms": statistics.median(profiled) * 1e3,
                    "profiled_over_timed": statistics.median(profiled)
                    / statistics.median(timed_on),
                    "timed_without_profiler_ms": statistics.median(timed_off) * 1e3,
                    "timed_ratio_on_off": statistics.median(
                        a / b for a, b in zip(timed_on, timed_off)
                    ),
                    "spans_per_step": statistics.median(spans) / (2 * 2),
                }
            )
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(
        f"profiler overhead (tiny gpt, world 2, CPU/gloo; {args.timed} timed steps, "
        f"2 profiled, {args.rounds} rounds)"
    )
    print(
        f"{'layout':<12}{'timed ms':>10}{'profiled ms':>13}{'prof/timed':>12}"
        f"{'timed ms (prof off)':>21}{'timed on/off':>14}{'spans/rank/step':>17}"
    )
    for r in rows:
        print(
            f"{r['layout']:<12}{r['timed_ms']:>10.2f}{r['profiled_ms']:>13.2f}"
            f"{r['profiled_over_timed']:>12.2f}{r['timed_without_profiler_ms']:>21.2f}"
            f"{r['timed_ratio_on_off']:>14.3f}{r['spans_per_step']:>17.0f}"
        )


if __name__ == "__main__":
    main()
