"""The memory model's predicted peak for each named Hugging Face family against its CPU trials,
as rows: read by ``bench/hf_memory.py`` (printed) and ``tests/model/test_hf_memory.py``
(asserted).

Each family of :data:`testkit.hf_families.NAMED` (tiny configs keeping the family's features)
at dp 2 and tp 2 on 2 CPU ranks (gloo, sequence 32, micro-batch 2, no checkpointing), one rank
launch for all 14 trials (``tests/spawn.py``). The measured peak is the trial's (states exact,
the rest from the CPU profiler's allocation events, as ``tests/model/test_memory.py`` measures);
a CPU reading can only overstate it, so with ``readings`` > 1 the lowest is kept.
"""

from __future__ import annotations

import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from autotune.config import TrialConfig, WorkloadSpec
from autotune.model.memory import estimate_all_stages
from testkit.hf_families import NAMED, write_tiny

LAYOUTS = {"dp2": dict(), "tp2": dict(tp_degree=2)}
MEDIAN_GOAL = 0.05
"""The median |error| the predictions must stay within."""
WORST_UNDER_GOAL = -0.12
"""The worst under-prediction allowed (a model that under-predicts makes false fits)."""


@dataclass(frozen=True)
class Row:
    family: str
    layout: str
    predicted: int
    measured: int

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1


def hf_config(path: str, **kw) -> TrialConfig:
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


def _measure(rank: int, configs: list[TrialConfig], readings: int) -> list[int]:
    """Each trial's peak on this rank: the lowest of ``readings``."""
    from autotune.trial.runner import run_rank

    return [min(run_rank(c).memory.peak for _ in range(readings)) for c in configs]


def measure(readings: int = 2) -> list[tuple[str, str, TrialConfig, int]]:
    """Every named family at each of :data:`LAYOUTS` on CPU trials: (family, layout, config,
    measured peak bytes). The configs name tiny config folders that live until the process
    exits."""
    from spawn import run_ranks

    root = Path(tempfile.mkdtemp(prefix="hf-memory-"))
    plan = {
        (f, name): hf_config(str(write_tiny(f, root / f)), **kw)
        for f in NAMED
        for name, kw in LAYOUTS.items()
    }
    measured = run_ranks(2, _measure, list(plan.values()), readings, timeout=600)
    return [
        (family, layout, config, max(r[i] for r in measured))
        for i, ((family, layout), config) in enumerate(plan.items())
    ]


def predicted_rows(measured: list[tuple[str, str, TrialConfig, int]]) -> list[Row]:
    """The memory model's peak beside each measured one."""
    return [
        Row(family, layout, estimate_all_stages(config, device_type="cpu")[0].total, peak)
        for family, layout, config, peak in measured
    ]


def measured_rows(readings: int = 2) -> list[Row]:
    return predicted_rows(measure(readings))


def summary(rows: list[Row]) -> tuple[float, float]:
    """(median |error|, worst error) over ``rows``."""
    errors = [r.error for r in rows]
    return statistics.median(abs(e) for e in errors), min(errors)
