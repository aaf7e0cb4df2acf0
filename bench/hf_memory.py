"""The memory model's predicted peak for every named Hugging Face family against CPU trials.

    python bench/hf_memory.py

Each family of ``testkit.hf_families.NAMED`` (tiny configs keeping the family's features) at
dp 2 and tp 2 on 2 CPU ranks, one rank launch for all 14 trials, each run twice and the lower
reading kept (``testkit.hf_memory`` says how the peak is measured). Prints each row's
predicted and measured MiB and the error, then the median |error| and the worst
under-prediction beside the goal (≤ 5% and ≥ −12%; ``tests/model/test_hf_memory.py`` holds
them). About 40 s on an idle machine.
"""

from __future__ import annotations

import sys

import common  # noqa: F401  (the repository and its testing kit on the path)
from testkit.hf_memory import MEDIAN_GOAL, WORST_UNDER_GOAL, measured_rows, summary


def main() -> int:
    rows = measured_rows(readings=2)
    print("family        layout  predicted  measured   error")
    for r in rows:
        print(
            f"{r.family:13} {r.layout:6} {r.predicted / 2**20:9.3f} {r.measured / 2**20:9.3f}  "
            f"{r.error:+7.1%}"
        )
    median, worst = summary(rows)
    print(
        f"median |error| {median:.1%} (goal ≤ {MEDIAN_GOAL:.0%}); worst under-prediction "
        f"{worst:+.1%} (goal ≥ {WORST_UNDER_GOAL:.0%})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
