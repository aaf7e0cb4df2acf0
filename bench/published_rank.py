"""Where ``autotune rank --engine megatron`` puts each SC21 Table 1 layout among all it scores.

    python bench/published_rank.py [--engine megatron] [--rows 0,3,9]

For each row of SC21 Table 1 (Narayanan et al. 2021; the layout of NVIDIA/Megatron-LM
``examples/sc21/run_table_1.sh``: TP, PP, micro-batch, interleaving, full recomputation) it runs
the ranking ``autotune rank --engine ENGINE --cluster a100-sxm4-80gb --nodes GPUs/8`` runs
(``ranking.score.rank_screened``: the layouts of ``ranking.space.screen_layouts`` with the
command's default knob choices, screened by the engine's memory, then scored with its memory
traits and the search's memory margin against the device's memory), predicts the published
layout the same way (``ranking.compare.compare_to_top``) and prints
its place: the percentile among the layouts predicted to fit (the goal: the top 5%), the
percentile among those with its own activation checkpointing (``pct/AC``: 2021's Megatron had
full recomputation only), and, when the model's own pick is faster, the term (compute, tp_comm,
pp_bubble, dp_comm, …) in which it gains most. The published layout is predicted as the engine
named runs it (with ``--engine megatron``: sequence parallelism, overlap, the distributed
optimizer it did not have in 2021), so both sides are judged by the same engine."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # the checkout and its testing kit (testkit)

from testkit.published_rows import sc21_table1  # noqa: E402

from autotune.config import GIB, TrialConfig  # noqa: E402
from autotune.model.cluster import load_cluster  # noqa: E402
from autotune.model.engines import engine_traits  # noqa: E402
from autotune.ranking.compare import compare_to_top  # noqa: E402
from autotune.ranking.score import rank_screened  # noqa: E402
from autotune.ranking.space import knob_choices  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", default="megatron")
    ap.add_argument("--rows", help="comma-separated row indices (default: all 10)")
    args = ap.parse_args(argv)
    engine = engine_traits(args.engine)
    rows = sc21_table1()
    chosen = [int(i) for i in args.rows.split(",")] if args.rows else range(len(rows))
    print(
        f"{'row':<14} {'published':<34} {'place':>14} {'pct':>6} {'pct/AC':>7} {'scored':>8}  "
        "top pick and the term it gains in"
    )
    for i in chosen:
        r = rows[i]
        t0 = time.perf_counter()
        cluster = load_cluster("a100-sxm4-80gb", nodes=r.config.world_size // 8)
        # The rank command's base config: the workload on the cluster's world and device,
        # bf16-mixed (rank's default on GPUs), every layout knob at TrialConfig's default.
        base = TrialConfig(
            workload=r.config.workload,
            world_size=cluster.world_size,
            device=cluster.device_type,
            precision="bf16-mixed",
        )
        published = dataclasses.replace(r.config, precision="bf16-mixed", attention="sdpa")
        reference = dataclasses.replace(published, zero_stage=1 if published.dp_degree > 1 else 0)
        _, ranking = rank_screened(
            base,
            r.shape,
            cluster,
            knob_choices(base),
            limit_bytes=int(cluster.device.memory_gib * GIB),
            engine=engine,
            memory_traits=engine.memory,
            progress=lambda n: None,
        )
        if not ranking.fitting:
            print(f"{r.label:<14} no layout predicted to fit")
            continue
        c = compare_to_top(ranking, reference, cluster, r.shape, engine)
        ref = reference
        v = ref.num_pp_stages // ref.pp_degree
        name = (
            f"tp{ref.tp_degree} pp{ref.pp_degree} dp{ref.dp_degree} mb"
            f"{ref.micro_batch_size} v{v} {c.time.step_time_s:.2f}s"
        )
        top = c.top.config
        pick = (
            f"tp{top.tp_degree} pp{top.pp_degree} dp{top.dp_degree} mb{top.micro_batch_size}"
            f" z{top.zero_stage} {top.activation_checkpointing} "
            f"{c.top.time.step_time_s:.2f}s"
        )
        gain = "" if c.position == 1 else f"; gains {c.gain_s:.2f}s in {c.term}"
        same_ac = [
            s
            for s in ranking.fitting
            if s.config.activation_checkpointing == ref.activation_checkpointing
        ]
        faster = sum(s.time.step_time_s < c.time.step_time_s for s in same_ac)
        print(
            f"{r.label:<14} {name:<34} {c.position:>6,}/{len(ranking.fitting):<7,} "
            f"{c.percentile:>6.1%} {faster / max(len(same_ac), 1):>7.1%} "
            f"{ranking.scored:>8,}  {pick}{gain} ({time.perf_counter() - t0:.0f} s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
