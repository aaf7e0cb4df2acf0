"""The memory model on the newer knobs: predicted against measured per-rank peak of real CPU
trials in the layouts sequence parallelism, context parallelism, HSDP, virtual stages, op-level
and partial activation checkpointing make.

Each layout of ``LAYOUTS`` (tiny GPT and an 8-layer tiny Llama, world size 2 and 4, gloo) is run
``--repeats`` times as a short real trial through the executor the other benches use
(``RayExecutor``), interleaved (every layout once, then every layout again), and its measured
peak — the slowest rank's ``RankResult.memory.peak``, the CPU profiler's allocated peak — is
set against ``estimate_memory(config, device_type="cpu").total`` (the worst pipeline rank), as
``bench/search_efficiency.py`` does for today's layouts. The summary
(``common.memory_error_summary``, the same function that bench uses) is the median |error|,
the worst under- and over-prediction and the false fits: measurements the search's screen
(``screen.predicted_to_fit``, prediction × 1.15 within the limit) would run under a limit at the
median predicted peak that measured over it. Beside it, the tightest limit: a measurement over
its own prediction × 1.15 (a layout the screen admits at the limit it just fits, which then
overflows).

Usage: python bench/new_knob_memory.py [--repeats 2] [--only NAME,…] [--json] [--out FILE]
"""

from __future__ import annotations

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import common  # noqa: E402,F401  (the repository on the path)

from autotune.config import MIB, TrialConfig, WorkloadSpec  # noqa: E402
from autotune.errors import AutotuneError  # noqa: E402
from autotune.model.memory import estimate_memory  # noqa: E402
from autotune.search.screen import MEMORY_MARGIN  # noqa: E402

log = common.logger("new_knob_memory")

LLAMA_8 = "examples/hf/llama_tiny_8layers"
"""An 8-layer HF Llama config: pp 2 × 4 virtual stages needs 8 layers (tiny GPT has 4)."""
TODAY = {"median_abs": 0.086, "worst_under": -0.115, "worst_over": 0.337, "false_fits": 0}
"""Today's CPU figures (docs/benchmarks.md, search efficiency: 3 × 54 tiny-GPT trials)."""


def _gpt(world: int, micro_batch: int = 2, **knobs) -> TrialConfig:
    return TrialConfig(
        workload=WorkloadSpec(family="gpt", size="tiny", seq_len=64, global_batch_size=8),
        world_size=world,
        micro_batch_size=micro_batch,
        device="cpu",
        num_warmup_steps=1,
        num_timed_steps=2,
        num_profiled_steps=0,
        **knobs,
    )


def _llama8(world: int, **knobs) -> TrialConfig:
    return TrialConfig(
        workload=WorkloadSpec(hf_model=str(common.ROOT / LLAMA_8), seq_len=64, global_batch_size=8),
        world_size=world,
        micro_batch_size=1,
        device="cpu",
        num_warmup_steps=1,
        num_timed_steps=2,
        num_profiled_steps=0,
        **knobs,
    )


LAYOUTS: dict[str, TrialConfig] = {
    "gpt w2 tp2 sp": _gpt(2, tp_degree=2, sequence_parallel=True),
    "gpt w4 tp2 sp dp2 z0": _gpt(4, tp_degree=2, sequence_parallel=True, zero_stage=0),
    "gpt w4 tp2 sp dp2 z1": _gpt(4, tp_degree=2, sequence_parallel=True, zero_stage=1),
    "gpt w4 tp2 sp dp2 z3": _gpt(4, tp_degree=2, sequence_parallel=True, zero_stage=3),
    "gpt w2 cp2": _gpt(2, cp_degree=2),
    "gpt w4 cp2 dp2 z0": _gpt(4, cp_degree=2, zero_stage=0),
    "gpt w4 cp2 dp2 z1": _gpt(4, cp_degree=2, zero_stage=1),
    "gpt w4 cp2 dp2 z3": _gpt(4, cp_degree=2, zero_stage=3),
    "gpt w4 hsdp2x2 z2": _gpt(4, dp_replicate=2, zero_stage=2),
    "gpt w4 hsdp2x2 z3": _gpt(4, dp_replicate=2, zero_stage=3),
    # HSDP × cp: FSDP2 shards over dp_shard × cp = 2 ranks, replicated over 2 (parallel/mesh.py)
    "gpt w4 hsdp2 cp2 z3": _gpt(4, dp_replicate=2, cp_degree=2, zero_stage=3),
    "gpt w4 cp2 tp2 sp": _gpt(4, cp_degree=2, tp_degree=2, sequence_parallel=True),
    "gpt w4 cp2 tp2": _gpt(4, cp_degree=2, tp_degree=2),
    "gpt w2 pp2 v2": _gpt(2, pp_degree=2, pp_schedule="interleaved_1f1b", micro_batch=1),
    "llama8 w2 pp2 v4": _llama8(2, pp_degree=2, pp_schedule="interleaved_1f1b", virtual_stages=4),
    "gpt w2 dp2 ac op": _gpt(2, activation_checkpointing="op"),
    "gpt w2 dp2 ac full 1": _gpt(2, activation_checkpointing="full", ac_layers=1),
    "gpt w4 pp2 dp2 z1 ac full 1": _gpt(
        4, pp_degree=2, zero_stage=1, activation_checkpointing="full", ac_layers=1
    ),
    "llama8 w2 tp2 sp": _llama8(2, tp_degree=2, sequence_parallel=True),
    "llama8 w2 cp2": _llama8(2, cp_degree=2),
}
"""One layout per newer knob and a few combinations (world 2 and 4, on 2 cores)."""


REFERENCE: dict[str, TrialConfig] = {
    "ref gpt w2 dp2 z0": _gpt(2),
    "ref gpt w4 dp4 z3": _gpt(4, zero_stage=3),
}
"""Layouts without a newer knob, measured beside them (today's kind; not in the summary)."""


@dataclass(frozen=True)
class Measurement:
    """One trial of one layout: the prediction and what each rank measured."""

    layout: str
    predicted: int
    """Bytes, the worst pipeline rank (``estimate_memory(…, device_type='cpu').total``)."""
    predicted_states: int
    """Its parameters + gradients + optimizer state."""
    measured: tuple[int, ...]
    """Each rank's measured peak (the CPU profiler's), rank order."""
    measured_states: int
    """The worst rank's measured parameters + gradients + optimizer state."""

    @property
    def worst(self) -> int:
        return max(self.measured)

    @property
    def error(self) -> float:
        return (self.predicted - self.worst) / self.worst


def layouts() -> dict[str, TrialConfig]:
    return LAYOUTS | REFERENCE


def predicted_states(config: TrialConfig) -> tuple[int, int]:
    """(predicted peak, its model states) of the worst rank: ``estimate_memory`` on CPU, what
    the search's screen predicts (``screen.predict_peak``)."""
    est = estimate_memory(config, device_type="cpu")
    return est.total, est.model_states


def _measurement(name: str, config: TrialConfig, result) -> Measurement:
    worst = max(result.ranks, key=lambda r: r.memory.peak).memory
    return Measurement(
        name,
        *predicted_states(config),
        tuple(r.memory.peak for r in sorted(result.ranks, key=lambda r: r.rank)),
        worst.parameters + worst.gradients + worst.optimizer_state,
    )


def measure(names: list[str], repeats: int) -> list[Measurement]:
    """Every layout once per repeat, interleaved, on one executor (a failed trial is logged
    and left out)."""
    from autotune.trial.executor import RayExecutor

    out = []
    with RayExecutor() as ex:
        ex.start()
        for repeat in range(repeats):
            for name in names:
                start = time.monotonic()
                try:
                    result = ex.run(layouts()[name])
                except AutotuneError as e:
                    log(f"{repeat + 1}/{repeats} {name}: failed: {e}")
                    continue
                log(f"{repeat + 1}/{repeats} {name}: {time.monotonic() - start:.0f} s")
                out.append(_measurement(name, layouts()[name], result))
    return out


def summary(rows: list[Measurement]) -> dict[str, float | int]:
    """``common.memory_error_summary`` over the newer knobs' measurements (references left
    out), the limit the median predicted peak over their layouts (as in search_efficiency)."""
    rows = [m for m in rows if m.layout in LAYOUTS]
    limit = statistics.median({m.layout: m.predicted for m in rows}.values())
    return common.memory_error_summary([(m.predicted, m.worst) for m in rows], int(limit))


def within_today(s: dict[str, float | int]) -> bool:
    return (
        s["median_abs_rel_error"] <= TODAY["median_abs"]
        and s["worst_under"] >= TODAY["worst_under"]
        and s["worst_over"] <= TODAY["worst_over"]
        and s["fit_but_measured_over"] <= TODAY["false_fits"]
    )


def print_table(rows: list[Measurement]) -> None:
    """Markdown: one line per layout, each repeat's worst-rank peak and error."""
    print(
        "| layout | predicted MiB | measured MiB, worst rank (each run) | error "
        "| states predicted / measured MiB |"
    )
    print("|---|---|---|---|---|")
    for name in dict.fromkeys(m.layout for m in rows):
        ms = [m for m in rows if m.layout == name]
        print(
            f"| {name} | {ms[0].predicted / MIB:.2f} | "
            f"{' / '.join(f'{m.worst / MIB:.2f}' for m in ms)} | "
            f"{' / '.join(f'{m.error:+.1%}' for m in ms)} | "
            f"{ms[0].predicted_states / MIB:.2f} / {ms[0].measured_states / MIB:.2f} |"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--only", default=None, help="comma-separated layout names")
    p.add_argument("--json", action="store_true")
    p.add_argument("--out", default=None, help="also write the JSON report to this file")
    args = p.parse_args()
    names = args.only.split(",") if args.only else list(layouts())
    start = time.monotonic()
    rows = measure(names, args.repeats)
    s = summary(rows)
    report = json.dumps(
        {
            "rows": [dataclasses.asdict(m) | {"error": m.error} for m in rows],
            "summary": s,
            "today": TODAY,
            "wall_s": time.monotonic() - start,
        },
        indent=2,
    )
    if args.out:
        Path(args.out).write_text(report + "\n")
    if args.json:
        print(report)
        return
    print_table(rows)
    print(
        f"\nnewer knobs, {s['measurements']} measurements: median |error| "
        f"{s['median_abs_rel_error']:.1%} (today {TODAY['median_abs']:.1%}), worst under "
        f"{s['worst_under']:+.1%} (today {TODAY['worst_under']:+.1%}), worst over "
        f"{s['worst_over']:+.1%} (today {TODAY['worst_over']:+.1%}); false fits under "
        f"{s['limit_bytes'] / MIB:.2f} MiB at the {MEMORY_MARGIN:.2f} margin: "
        f"{s['fit_but_measured_over']} (today {TODAY['false_fits']}); over their own "
        f"prediction × {1 + MEMORY_MARGIN:.2f}: {s['over_own_margin']}"
    )
    print(
        f"within today's figures: {'yes' if within_today(s) else 'NO'} "
        f"({time.monotonic() - start:.0f} s)"
    )


if __name__ == "__main__":
    main()
