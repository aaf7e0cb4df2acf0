"""The GPU check's multi-GPU layouts: every layout kind the runtime has (DDP, ZeRO-1/2/3, TP,
TP × SP, each pipeline schedule, CP, HSDP, compile) trains the single-process reference's
losses on NCCL, with its memory and step time beside the models'.

Imported by ``bench/gpu_check.py`` (its ``layouts`` stage). :func:`plan` picks the layouts from
the GPUs visible (world 2: every kind; world 4 adds tp × dp, HSDP 2 × 2, pp × dp, cp × dp;
world 8 adds tp 2 × pp 2 × dp 2, HSDP 2 × 4, tp × SP × cp × dp; each world its dp);
:func:`run_layouts` runs them through one executor, and every judge below is pure, so
``tests/bench/test_gpu_layouts.py`` checks them on made-up figures and runs the same plan on
CPU (gloo, world 2, GPT-tiny: ``CPU_SCALE``).

Rows per layout ``w<world> <name>``:

- ``trial``: ran on the device, the backend and the allocator meant (cuda / nccl /
  cuda_allocator, or cpu / gloo / cpu_profiler in the dry run); its step time beside the
  step-time model's (``measured / model``, the prior calibration): a figure, not judged.
- ``losses``: every step's loss within ``LOSS_ATOL`` of the single-process reference
  (``tests/reference.py``: the same model, seed and global batch in one process, fp32, on the
  trials' device: :func:`reference`). The layouts train in 32-true, so the comparison is fp32
  against fp32; a skipped gradient sync,
  a mis-scaled accumulation or CP's dK/dV gradients lost (its K/V reduce-scatter) moves the
  loss by > 1e-3 within 2 steps (``tests/trial/parallel/test_layouts.py``,
  ``test_context_parallel.py``), 10× the tolerance.
- ``memory peak``: each rank's measured peak against the memory model's figure for its
  pipeline stage; the worst rank's ratio within ``PEAK_BAND``.
- ``NCCL gradient payload`` (pure data parallelism): ``gpu_check.payload_check``.
- ``send/recv bytes`` (pipelines): each rank's send and recv payload per step (the NCCL
  ``SendRecv`` kernels, labelled by their records: ``profiler/capture.py``) against the
  activation bytes the layout implies (:func:`expected_p2p_bytes`), within ``P2P_RTOL``.
- ``w2 after a profiled trial``: the dp layout, unprofiled, run again after every profiled
  trial of the world, against its first run: within ``CUPTI_RTOL`` (CUPTI left attached to the
  worker slows every later kernel launch by 10–20%).
"""

from __future__ import annotations

import functools
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from gpu_table import Check, Status, mib, relative_error

LOSS_ATOL = 1e-4
"""Largest |loss − reference loss| of any step (losses ≈ 6.2 GPT-tiny, ≈ 10.9 GPT-small). The
CPU lanes hold 2e-5 (fp32 summation order, ``test_layouts.LOSS_ATOL``); on a GPU the layouts'
kernels (cuBLAS on sharded shapes, NCCL's reduction order, SDPA's fused kernels) differ from
the single-GPU reference's more, so 5× that; not yet measured on a GPU (the row prints the
largest |Δ|). The defects it is there for move the loss by > 1e-3."""
PEAK_BAND = 0.25
"""Largest |measured / predicted − 1| of a rank's peak (``gpu_check.TOLERANCES['peak']``)."""
P2P_RTOL = 0.02
"""Largest |measured / expected − 1| of a pipeline rank's send or recv bytes per step: the
expectation is exact (activations of one micro-batch per stage boundary each way)."""
CUPTI_RTOL = 0.08
"""Largest step-time slowdown of the trial after the profiled ones against its first run:
half of what CUPTI left attached costs, twice a warm GPU's run-to-run noise (~4%)."""
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True, slots=True)
class Layout:
    """One layout of the plan: its row label, world size and the knobs it sets."""

    name: str
    world: int
    knobs: tuple[tuple[str, object], ...] = ()
    microbatches: int = 1
    """Micro-batches per optimizer step on each data-parallel rank (a pipeline's: 2 × pp)."""

    @property
    def label(self) -> str:
        return f"w{self.world} {self.name}"

    @property
    def compiled(self) -> bool:
        return dict(self.knobs).get("compile", False)


def _layout(name: str, world: int, **knobs) -> Layout:
    pp = knobs.get("pp_degree", 1)
    return Layout(name, world, tuple(sorted(knobs.items())), 2 * pp if pp > 1 else 1)


def world_two() -> list[Layout]:
    """Every layout kind a world of 2 allows: the first, dp, is the CUPTI check's trial."""
    return [
        _layout("dp", 2),
        _layout("ZeRO-1", 2, zero_stage=1),
        _layout("ZeRO-2", 2, zero_stage=2),
        _layout("ZeRO-3", 2, zero_stage=3),
        _layout("tp 2", 2, tp_degree=2),
        _layout("tp 2 × SP", 2, tp_degree=2, sequence_parallel=True),
        _layout("pp 2 gpipe", 2, pp_degree=2, pp_schedule="gpipe"),
        _layout("pp 2 1f1b", 2, pp_degree=2, pp_schedule="1f1b"),
        _layout("pp 2 interleaved v2", 2, pp_degree=2, pp_schedule="interleaved_1f1b"),
        _layout("cp 2", 2, cp_degree=2),
        _layout("HSDP 2 × 1", 2, zero_stage=3, dp_replicate=2),
        _layout("compile dp 2", 2, compile=True),
    ]


def world_four() -> list[Layout]:
    return [
        _layout("dp", 4),
        _layout("tp 2 × dp 2 ZeRO-1", 4, tp_degree=2, zero_stage=1),
        _layout("HSDP 2 × 2", 4, zero_stage=3, dp_replicate=2),
        _layout("pp 2 × dp 2 1f1b", 4, pp_degree=2),
        _layout("cp 2 × dp 2", 4, cp_degree=2),
    ]


def world_eight() -> list[Layout]:
    return [
        _layout("dp", 8),
        _layout("tp 2 × pp 2 × dp 2", 8, tp_degree=2, pp_degree=2, zero_stage=1),
        _layout("HSDP 2 × 4", 8, zero_stage=3, dp_replicate=2),
        _layout("tp 2 × SP × cp 2 × dp 2", 8, tp_degree=2, sequence_parallel=True, cp_degree=2),
    ]


def plan(num_gpus: int) -> list[Layout]:
    """The layouts of the GPUs visible: world 2 with two or more, 4 with four or more, 8 with
    eight or more (a world is a power of two: the layouts' degrees are)."""
    out: list[Layout] = []
    for world, layouts in ((2, world_two), (4, world_four), (8, world_eight)):
        if num_gpus >= world:
            out += layouts()
    return out


class Seconds(NamedTuple):
    """Estimated seconds: of one trial (setup, steps, the profile, Ray's round trip), of what
    compiling adds to one (inductor, every block), of a world's first trial beyond ``trial``
    (its workers start: CUDA, NCCL), and of the reference losses (on the driver's CPU)."""

    trial: float
    compile: float
    group: float
    reference: float


@dataclass(frozen=True, slots=True)
class Scale:
    """What every layout trains: one workload and global batch (one reference for all) in
    32-true, ``steps`` = (warm-up, timed, profiled) steps, on ``device``."""

    device: str
    size: str
    seq_len: int
    global_batch: int
    steps: tuple[int, int, int]
    seconds: Seconds

    def workload(self):
        from autotune.config import WorkloadSpec

        return WorkloadSpec(
            family="gpt", size=self.size, seq_len=self.seq_len, global_batch_size=self.global_batch
        )

    def config(self, layout: Layout, *, profiled: bool = True, timed: int | None = None):
        from autotune.config import TrialConfig

        knobs = dict(layout.knobs)
        model_ranks = (
            knobs.get("tp_degree", 1) * knobs.get("pp_degree", 1) * knobs.get("cp_degree", 1)
        )
        dp = layout.world // model_ranks
        warmup, timed_steps, profiled_steps = self.steps
        return TrialConfig(
            workload=self.workload(),
            world_size=layout.world,
            micro_batch_size=self.global_batch // (dp * layout.microbatches),
            device=self.device,
            precision="32-true",
            num_warmup_steps=warmup,
            num_timed_steps=timed_steps if timed is None else timed,
            num_profiled_steps=profiled_steps if profiled else 0,
            **knobs,
        )

    def estimate_s(self, layout: Layout) -> float:
        return self.seconds.trial + (self.seconds.compile if layout.compiled else 0.0)


GPU_SCALE = Scale("cuda", "small", 128, 16, (1, 3, 1), Seconds(7.0, 45.0, 20.0, 20.0))
"""GPT-small (163M parameters) at seq 128: large enough for the allocator's figures to be the
model's, small enough for 21 trials in 5 minutes."""
CPU_SCALE = Scale("cpu", "tiny", 64, 8, (1, 1, 1), Seconds(4.0, 90.0, 10.0, 10.0))
"""The dry run: GPT-tiny on gloo, 1 timed step after 1 warm-up (compile wants one: its first
step compiles) (``--dry-run``, the suite's test)."""
CUPTI_TIMED = 5
"""Timed steps of the CUPTI check's two runs (their medians are compared)."""


def plan_seconds(layouts: list[Layout], scale: Scale) -> float:
    """The plan's estimated seconds: the reference, each trial, each world's first trial (its
    workers start), and the CUPTI check's warm-up, first and last runs in the first world."""
    worlds = {layout.world for layout in layouts}
    return (
        scale.seconds.reference
        + sum(scale.estimate_s(layout) for layout in layouts)
        + len(worlds) * scale.seconds.group
        + (3 * scale.seconds.trial if worlds else 0.0)
    )


def format_plan(layouts: list[Layout], scale: Scale) -> str:
    """The plan, one line per world, and its estimated time."""
    lines = []
    for world in sorted({layout.world for layout in layouts}):
        names = [layout.name for layout in layouts if layout.world == world]
        lines.append(f"  world {world}: {', '.join(names)}")
    return "\n".join(
        [
            f"layouts: {len(layouts)} trials of gpt-{scale.size} (seq {scale.seq_len}, global "
            f"batch {scale.global_batch}, 32-true) on {scale.device}, estimated "
            f"{plan_seconds(layouts, scale):.0f}s",
            *lines,
        ]
    )


# ---- judging (pure) --------------------------------------------------------------------------
def loss_check(
    label: str, losses: list[float], reference: list[float], atol: float = LOSS_ATOL
) -> Check:
    """Every step's loss finite and within ``atol`` of the reference's, as many steps."""
    diffs = [abs(a - b) for a, b in zip(losses, reference)]
    worst = max(range(len(diffs)), key=diffs.__getitem__, default=None)
    finite = all(math.isfinite(x) for x in losses)
    ok = finite and len(losses) == len(reference) and worst is not None and diffs[worst] <= atol
    measured = (
        f"{len(losses)} steps, max |Δ| {diffs[worst]:.1e} at step {worst}, last {losses[-1]:.5f}"
        if worst is not None
        else "no losses"
    )
    if len(losses) != len(reference):
        measured += f" (reference has {len(reference)})"
    return Check.judged(
        f"{label} losses", f"= single-process reference ±{atol:g} each step", measured, ok
    )


def memory_check(
    label: str, measured: dict[int, tuple[int, int]], predicted: list[int], band: float = PEAK_BAND
) -> Check:
    """``measured``: rank → (pipeline rank, peak bytes); ``predicted``: the memory model's
    total per pipeline rank. The worst rank's ratio within ``band``."""
    if not measured:
        return Check.judged(f"{label} memory peak", "a peak per rank", "no ranks", False)
    errors = {r: relative_error(peak, predicted[pp]) for r, (pp, peak) in measured.items()}
    worst = max(errors, key=lambda r: abs(errors[r]))
    pp, peak = measured[worst]
    return Check.judged(
        f"{label} memory peak",
        f"model ±{band:.0%} on each rank",
        f"rank {worst}: {mib(peak)} / model {mib(predicted[pp])} = "
        f"{peak / predicted[pp] if predicted[pp] else math.inf:.2f}; {len(measured)} ranks",
        all(abs(e) <= band for e in errors.values()),
    )


ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float8": 1}


def expected_p2p_bytes(config, pp_rank: int, device_type: str = "cuda") -> int:
    """Bytes one pipeline rank sends (and receives: the same count) per optimizer step, from the
    layout: each micro-batch crosses every stage boundary once forward (its activations) and
    once backward (their gradients), mb × seq × hidden elements in the compute dtype (a
    pipeline's stages gather a sequence-parallel sequence at their ends). Of the
    ``pp · v`` stages a rank holds ``v``; the first stage sends no gradient, the last no
    activation."""
    if config.pp_degree < 2 or config.cp_degree > 1:
        raise ValueError("expected_p2p_bytes covers pipelines without context parallelism")
    v = config.virtual_stages if config.pp_schedule == "interleaved_1f1b" else 1
    shape = config.workload.shape
    boundary = config.micro_batch_size * config.workload.seq_len * shape.hidden_size
    element = ELEMENT_BYTES[config.compute_dtype(device_type)]
    ends = (pp_rank == 0) + (pp_rank == config.pp_degree - 1)
    return config.grad_accum_steps * (2 * v - ends) * boundary * element


def p2p_check(label: str, config, ranks: list[tuple[int, list]], device_type: str) -> Check:
    """``ranks``: (pipeline rank, spans) per rank. Each rank's send and recv bytes per step
    (``profiler.bytes_per_step``, kind 'p2p') equal :func:`expected_p2p_bytes` within
    P2P_RTOL; a rank that reported none fails it."""
    from profiler import bytes_per_step

    worst = None
    for pp_rank, spans in ranks:
        want = expected_p2p_bytes(config, pp_rank, device_type)
        per_step = next(iter(bytes_per_step(spans).values()), {})
        for direction in ("send", "recv"):
            got = sum(v for (k, n, _), v in per_step.items() if k == "p2p" and n == direction)
            error = relative_error(got, want)
            if worst is None or abs(error) > abs(worst[0]):
                worst = (error, pp_rank, direction, got, want)
    if worst is None:
        return Check.judged(f"{label} send/recv bytes", "per rank", "no ranks", False)
    error, pp_rank, direction, got, want = worst
    return Check.judged(
        f"{label} send/recv bytes",
        f"activations per boundary ±{P2P_RTOL:.0%}, each rank and way",
        f"pp rank {pp_rank} {direction}: {mib(got)}/step of {mib(want)} ({error:+.1%}); "
        f"{len(ranks)} ranks",
        abs(error) <= P2P_RTOL,
    )


def cupti_check(label: str, first_s: float, after_s: float, device: str = "cuda") -> Check:
    """The unprofiled trial after the profiled ones no slower than its first run, within
    CUPTI_RTOL. On CPU there is no CUPTI (and two ranks' timings on shared cores are noise):
    the figures, SKIP."""
    slowdown = after_s / first_s - 1 if first_s > 0 else math.inf
    measured = f"{after_s * 1e3:.1f} ms vs {first_s * 1e3:.1f} ms first ({slowdown:+.1%})"
    name = f"{label} after a profiled trial"
    expected = f"step time ≤ first run +{CUPTI_RTOL:.0%} (CUPTI detached)"
    if device != "cuda":
        return Check(name, expected, f"SKIP: no CUPTI on {device}; {measured}", Status.SKIP)
    return Check.judged(name, expected, measured, slowdown <= CUPTI_RTOL)


def skipped(layout: Layout, why: str) -> list[Check]:
    """A layout's rows, SKIP: never counted as passed."""
    return [
        Check(f"{layout.label} {row}", "runs", why, Status.SKIP)
        for row in ("trial", "losses", "memory peak")
    ]


# ---- the runs --------------------------------------------------------------------------------
def reference(scale: Scale) -> list[float]:
    """The single-process losses every layout must train (``tests/reference.py``), as many
    steps as a trial runs, on the trials' device, in a spawned process (its CUDA context ends
    with it). On the device: a CUDA trial initialises its weights on the GPU, whose generator
    draws other numbers than the CPU's from the same seed."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_reference_losses, scale).result()


def _reference_losses(scale: Scale) -> list[float]:
    """``reference.reference_losses`` with its model built on ``scale.device`` and each
    batch moved there (the function itself builds on the CPU)."""
    tests = os.path.join(REPO_ROOT, "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    import reference as single_process

    from autotune.trial.models.build import build_workload

    def build_on_device(spec, *, attention: str, seed: int):
        workload = build_workload(spec, attention=attention, seed=seed, device=scale.device)
        batch = workload.batch
        workload.batch = lambda step: tuple(t.to(scale.device) for t in batch(step))
        return workload

    single_process.build_workload = build_on_device
    config = scale.config(Layout("reference", 1))
    return single_process.reference_losses(config, len(config.step_schedule()))


def _backend(device: str) -> tuple[str, str]:
    return ("nccl", "cuda_allocator") if device == "cuda" else ("gloo", "cpu_profiler")


def trial_rows(
    layout: Layout, config, result, reference_losses: list[float], gradient_check
) -> list[Check]:
    """A finished trial's rows: the trial, its losses, its memory, and its payloads."""
    from autotune.model.memory import estimate_all_stages
    from autotune.model.perf_model import predict_step_time
    from autotune.search.study_calibration import describe_cluster

    device = config.device
    backend, source = _backend(device)
    rank0 = result.ranks[0]
    predicted_s = predict_step_time(config, describe_cluster(layout.world, device)).step_time_s
    checks = [
        Check.judged(
            f"{layout.label} trial",
            f"{device}, {backend}, {source}",
            f"{rank0.device}, {rank0.backend}, {rank0.memory.source}; "
            f"{result.step_time_s * 1e3:.1f} ms/step, model {predicted_s * 1e3:.1f} ms "
            f"(measured/model {result.step_time_s / predicted_s:.2f})",
            rank0.device.startswith(device)
            and rank0.backend == backend
            and rank0.memory.source == source,
        ),
        loss_check(layout.label, result.losses, reference_losses),
    ]
    stages = [e.total for e in estimate_all_stages(config, device_type=device)]
    checks.append(
        memory_check(
            layout.label, {r.rank: (r.pp_rank, r.memory.peak) for r in result.ranks}, stages
        )
    )
    spans = [s for r in result.ranks for s in r.spans]
    if config.pp_degree > 1 and config.cp_degree == 1:
        by_rank = [(r.pp_rank, [s for s in r.spans if s.rank == r.rank]) for r in result.ranks]
        checks.append(p2p_check(layout.label, config, by_rank, device))
    elif _pure_dp(config) and gradient_check is not None:
        checks.append(gradient_check(layout.label, config, spans, device))
    return checks


def _pure_dp(config) -> bool:
    return (
        config.tp_degree == config.pp_degree == config.cp_degree == config.dp_replicate == 1
        and config.dp_degree > 1
        and not config.compile
    )


def run_layouts(
    executor,
    layouts: list[Layout],
    scale: Scale,
    *,
    deadline: float = math.inf,
    gradient_check: Callable | None = None,
    warm_up: bool = True,
) -> list[Check]:
    """Every layout of the plan through ``executor``, world by world. The first world starts
    with its dp layout unprofiled (after a discarded warm-up run when ``warm_up``) and ends
    with it again (:func:`cupti_check`). A layout whose estimate does not fit before
    ``deadline`` (``time.monotonic()``) is SKIP; one whose trial fails is a FAIL."""
    reference_losses = functools.cache(lambda: reference(scale))  # when a trial first ran
    worlds = sorted({layout.world for layout in layouts})
    checks: list[Check] = []
    for world in worlds:
        timing = scale.config(Layout("dp", world), profiled=False, timed=CUPTI_TIMED)
        first = None
        if world == worlds[0]:
            first, rows = _first_run(executor, timing, warm_up, deadline, scale)
            checks += rows
        for layout in (layout for layout in layouts if layout.world == world):
            checks += _layout_rows(
                executor, layout, scale, deadline, reference_losses, gradient_check
            )
        if world == worlds[0]:
            checks.append(_cupti_row(executor, world, timing, first, deadline, scale))
    return checks


def _first_run(executor, timing, warm_up: bool, deadline: float, scale: Scale):
    """(step time of the CUPTI check's first run or None, rows of a failure)."""
    from autotune.errors import AutotuneError

    if time.monotonic() + scale.seconds.group + 2 * scale.seconds.trial > deadline:
        return None, []
    try:
        if warm_up:
            executor.run(timing)
        return executor.run(timing).step_time_s, []
    except AutotuneError as e:
        label = f"w{timing.world_size} dp unprofiled"
        return None, [Check.judged(label, "completes", f"{type(e).__name__}: {e}"[:140], False)]


def _layout_rows(
    executor, layout: Layout, scale: Scale, deadline: float, reference_losses, gradient_check
) -> list[Check]:
    from autotune.errors import AutotuneError

    left = deadline - time.monotonic()
    if scale.estimate_s(layout) > left:
        why = f"SKIP: estimated {scale.estimate_s(layout):.0f}s, {max(0.0, left):.0f}s left"
        return skipped(layout, why + " of --max-minutes")
    config = scale.config(layout)
    try:
        result = executor.run(config)
    except AutotuneError as e:
        why = f"{type(e).__name__}: {e}"[:140]
        return [Check.judged(f"{layout.label} trial", "completes", why, False)]
    try:
        return trial_rows(layout, config, result, reference_losses(), gradient_check)
    except Exception as e:  # noqa: BLE001 - one layout's FAIL row; the others still run
        why = f"{type(e).__name__}: {e}"[:140]
        return [Check.judged(f"{layout.label} rows", "judged", why, False)]


def _cupti_row(executor, world: int, timing, first: float | None, deadline: float, scale) -> Check:
    from autotune.errors import AutotuneError

    label = f"w{world}"
    if first is None or time.monotonic() + scale.seconds.trial > deadline:
        why = "no first run to compare with" if first is None else "no time left"
        return Check(f"{label} after a profiled trial", "runs", f"SKIP: {why}", Status.SKIP)
    try:
        after = executor.run(timing).step_time_s
    except AutotuneError as e:
        return Check.judged(f"{label} after a profiled trial", "completes", str(e)[:140], False)
    return cupti_check(label, first, after, timing.device)
