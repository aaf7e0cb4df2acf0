"""How fast ``autotune rank`` scores layouts at scale, with every newer knob enumerated
(sequence parallelism, each context-parallel degree, each HSDP replica count, virtual stages):

- SC21 Table 1's 145.6B GPT (80 layers, h 12,288, 96 heads, vocabulary 51,200, global batch
  2,304, sequence 2,048) on 192 nodes of 8 A100 80GB, 1,536 GPUs;
- Llama 3.1 405B (``llama-405b``, global batch 2,048 × sequence 8,192: Llama 3's 16M tokens,
  Dubey et al. 2024 §3.4.1) on 128 nodes of 8 H100 SXM, 1,024 GPUs.

It runs the command itself (``autotune rank ... --json``), so it times the path users run:
``ranking.score.rank_screened``, the memory screen included. Under 15 s each is the goal on
the 2-core development machine.

    python bench/rank_speed.py [--case sc21|405b|sc21-megatron|both|all] [--repeat 1]

``sc21-megatron`` is the SC21 case judged as Megatron-LM stores memory and runs
(``--engine megatron``); ``both`` runs the first two cases, ``all`` every case.

Prints, per case, the layouts scored (those the memory screen kept), the groups and branches
the screen dropped, the scoring time, and the whole command's wall and CPU time (the 2 cores
are shared, so CPU time is the steadier figure).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.cli.main import main as autotune_main  # noqa: E402

CASES = {
    "sc21": [
        "--num-layers",
        "80",
        "--hidden-size",
        "12288",
        "--num-heads",
        "96",
        "--vocab-size",
        "51200",
        "--cluster",
        "a100-sxm4-80gb",
        "--nodes",
        "192",
        "--global-batch",
        "2304",
        "--seq-len",
        "2048",
    ],
    "405b": [
        "--model",
        "llama-405b",
        "--cluster",
        "h100-sxm",
        "--nodes",
        "128",
        "--global-batch",
        "2048",
        "--seq-len",
        "8192",
    ],
}
CASES["sc21-megatron"] = [*CASES["sc21"], "--engine", "megatron"]


def run_case(name: str) -> str:
    argv = ["rank", *CASES[name], "--top", "5", "--json"]
    err, out = io.StringIO(), io.StringIO()
    wall, cpu = time.perf_counter(), time.process_time()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = autotune_main(argv)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    progress = err.getvalue().strip().splitlines()[-1]  # "scored N layouts in T s; ..."
    scoring_s = float(progress.split(" in ")[1].split(" s")[0])
    data = json.loads(out.getvalue()) if code == 0 else {}
    return (
        f"{name}: exit {code}: {data.get('scored', 0):,} layouts scored, "
        f"{data.get('fit', 0):,} fit; screened before scoring: "
        f"{data.get('screened_groups', 0):,} groups, {data.get('screened_branches', 0):,} "
        f"branches; scoring {scoring_s:.1f} s; whole command {wall:.1f} s wall, "
        f"{cpu:.1f} s CPU"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", choices=(*CASES, "both", "all"), default="both")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args(argv)
    for _ in range(args.repeat):
        names = {"both": ("sc21", "405b"), "all": tuple(CASES)}.get(args.case, (args.case,))
        for name in names:
            print(run_case(name), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
