"""The memory model's predicted peak for every named Hugging Face family against CPU trials.

    python bench/hf_memory.py

Each family of ``testkit.hf_families.NAMED`` (tiny configs keeping the family's features) at
dp 2 and tp 2 on 2 CPU ranks (gloo, sequence 32, micro-batch 2, no checkpointing), one rank
launch for all 14 trials (``tests/spawn.py``). The measured peak is the trial's (states exact,
the rest from the CPU profiler's allocation events, as ``tests/model/test_memory.py`` measures);
a CPU reading can only overstate it, so each trial runs twice and the lower reading is kept.
Prints each row's predicted and measured MiB and the error, then the median |error| and the
worst under-prediction beside the goal (≤ 5% and ≥ −12%). About 40 s on an idle machine.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

import common  # noqa: F401  (the repository and its testing kit on the path)
from spawn import run_ranks
from testkit.hf_families import NAMED, write_tiny

from autotune.config import TrialConfig, WorkloadSpec
from autotune.model.memory import estimate_all_stages

LAYOUTS = {"dp2": dict(), "tp2": dict(tp_degree=2)}
MEDIAN_GOAL = 0.05
WORST_UNDER_GOAL = -0.12


def _config(path: str, **kw) -> TrialConfig:
    spec = WorkloadSpec(hf_model=path, seq_len=32, global_batch_size=4)
    return TrialConfig(
        workload=spec,
        world_size=2,
        device="cpu",
        micro_batch_size=2,
        activation_checkpointing="none",
        num_warmup_steps=1,
        num_timed_steps=1,
        num_profiled_steps=0,
        **kw,
    )


def _measure(rank: int, configs: list[TrialConfig]) -> list[int]:
    """Each trial's peak on this rank: the lower of two readings."""
    from autotune.trial.runner import run_rank

    return [min(run_rank(c).memory.peak for _ in range(2)) for c in configs]


def main() -> int:
    with tempfile.TemporaryDirectory() as root:
        plan = {
            (f, name): _config(str(write_tiny(f, Path(root) / f)), **kw)
            for f in NAMED
            for name, kw in LAYOUTS.items()
        }
        measured = run_ranks(2, _measure, list(plan.values()), timeout=600)
        rows = []
        for i, (key, config) in enumerate(plan.items()):
            (est,) = estimate_all_stages(config, device_type="cpu")
            peak = max(r[i] for r in measured)
            rows.append((*key, est.total, peak, est.total / peak - 1))
    print("family        layout  predicted  measured   error")
    for f, lay, pred, peak, err in rows:
        print(f"{f:13} {lay:6} {pred / 2**20:9.3f} {peak / 2**20:9.3f}  {err:+7.1%}")
    errors = [err for *_, err in rows]
    median = statistics.median(abs(e) for e in errors)
    print(
        f"median |error| {median:.1%} (goal ≤ {MEDIAN_GOAL:.0%}); worst under-prediction "
        f"{min(errors):+.1%} (goal ≥ {WORST_UNDER_GOAL:.0%})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
