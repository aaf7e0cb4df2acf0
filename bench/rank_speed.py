"""How fast ``autotune rank`` scores layouts at scale: SC21 Table 1's 145.6B GPT (80 layers,
h 12,288, 96 heads, vocabulary 51,200, global batch 2,304, sequence 2,048) on 192 nodes of
8 A100 80GB, 1,536 GPUs: 213,288 layouts (issue 24 asks for under 15 s).

    python bench/rank_speed.py [--nodes 192] [--repeat 1]

Prints the enumeration time, the scoring time (``rank.rank_layouts``: memory screen, exact
memory, step time of those that fit), layouts scored per second, and the whole command's time
and CPU time (the development machine's 2 cores are shared, so CPU time is the steadier figure).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.cli.main import main as autotune_main  # noqa: E402


def rank_argv(nodes: int) -> list[str]:
    return ["rank", "--num-layers", "80", "--hidden-size", "12288", "--num-heads", "96",
            "--vocab-size", "51200", "--cluster", "a100-sxm4-80gb", "--nodes", str(nodes),
            "--global-batch", "2304", "--seq-len", "2048", "--top", "5"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=192)
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args(argv)
    for _ in range(args.repeat):
        err, out = io.StringIO(), io.StringIO()
        wall, cpu = time.perf_counter(), time.process_time()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = autotune_main(rank_argv(args.nodes))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        progress = err.getvalue().strip().splitlines()[-1]  # "scored N layouts in T s; ..."
        scored = int(progress.split()[1].replace(",", ""))
        scoring_s = float(progress.split(" in ")[1].split(" s")[0])
        print(f"exit {code}: {scored:,} layouts; scoring {scoring_s:.1f} s "
              f"({scored / scoring_s:,.0f} layouts/s); whole command {wall:.1f} s wall, "
              f"{cpu:.1f} s CPU ({scored / cpu:,.0f} layouts/s of CPU)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
