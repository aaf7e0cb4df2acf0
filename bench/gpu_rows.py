"""The GPU check's model rows: a ~1B Llama on one GPU in several configurations, each trial's
allocator figures against the memory model, its step time against the step-time model
calibrated on two of the rows, its profile, and a real out-of-memory inside the same worker
group followed by a trial that completes.

Imported by ``bench/gpu_check.py``; every function that judges figures is pure, so the tests
(``tests/bench/test_gpu_check.py``) check them on made-up figures.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass

from gpu_table import Check, Status, mib, relative_error

GIB = 2**30
PEAK_RTOL = 0.20
"""Largest |measured / predicted − 1| of a row's allocated peak (the CUDA allocator's
``max_memory_allocated``) against the memory model's total."""
RESERVED_RTOL = 0.25
"""Largest |measured / predicted − 1| of a row's reserved peak plus the device memory outside
the allocator against the memory model's total × the screen's fragmentation plus its outside
allowance (``autotune.search.screen.ALLOWANCES``, without the model margin)."""
TIME_MAPE = 0.25
"""Largest mean |predicted / measured − 1| of the step-time model over the rows it was not
calibrated on."""
TIME_RTOL = 0.40
"""Largest |predicted / measured − 1| of any one of those rows."""
COMPUTE_SHARE = 0.70
"""Smallest share of the profiled step window the CUDA compute kernels must cover on a
compute-bound layout (one GPU, no collective: the rest is launch gaps and the host)."""
OOM_FACTOR = 1.5
"""The out-of-memory row's predicted peak, in device memories."""


@dataclass(frozen=True, slots=True)
class Row:
    """One configuration of the memory and step-time rows."""

    name: str
    seq_len: int
    micro_batch: int
    activation_checkpointing: str
    precision: str
    zero_stage: int = 0
    offload: bool = False


ROWS = (
    Row("ac none", 4096, 1, "none", "bf16-mixed"),
    Row("ac selective", 4096, 1, "selective", "bf16-mixed"),
    Row("ac full", 4096, 1, "full", "bf16-mixed"),
    Row("ac full mb 2", 4096, 2, "full", "bf16-mixed"),
    Row("seq 8192", 8192, 1, "full", "bf16-mixed"),
    Row("seq 2048 mb 4", 2048, 4, "none", "bf16-mixed"),
    Row("32-true", 4096, 1, "full", "32-true"),
    Row("bf16-true", 4096, 1, "full", "bf16-true"),
    Row("ZeRO-3 offload", 4096, 1, "full", "bf16-mixed", zero_stage=3, offload=True),
)
"""Activation checkpointing none / selective / full, micro-batch 1 / 2 / 4, sequence 2048 to
8192, three precisions and optimizer offload."""
CALIBRATE_ON = ("ac none", "ac full mb 2")
"""The two rows the step-time model is calibrated on: one without recomputation and one with
it, at two micro-batches, so the compute rate and the fixed costs are both informed."""
PROFILED_ROW = "ac none"


@dataclass(frozen=True, slots=True)
class Scale:
    """What the rows run: the ~1B Llama on CUDA, or (``--cpu-dry-run``) a tiny one on CPU that
    exercises the same code paths in seconds."""

    family: str = "llama"
    size: str = "1b"
    device: str = "cuda"
    seq_divisor: int = 1
    """The rows' sequence lengths are divided by this."""

    def config(self, row: Row, *, profiled_steps: int = 1):
        from autotune.config import TrialConfig, WorkloadSpec

        precision = row.precision if self.device == "cuda" else "32-true"
        return TrialConfig(
            workload=WorkloadSpec(
                family=self.family,
                size=self.size,
                seq_len=row.seq_len // self.seq_divisor,
                global_batch_size=row.micro_batch,
            ),
            world_size=1,
            micro_batch_size=row.micro_batch,
            device=self.device,
            precision=precision,
            activation_checkpointing=row.activation_checkpointing,
            zero_stage=row.zero_stage,
            optimizer_offload_enabled=row.offload,
            num_warmup_steps=2,
            num_timed_steps=3,
            num_profiled_steps=profiled_steps,
        )


CPU_DRY_RUN = Scale(size="tiny", device="cpu", seq_divisor=32)


@dataclass(frozen=True, slots=True)
class Measured:
    """What one row's trial measured on rank 0."""

    row: Row
    config: object
    step_time_s: float
    allocated_peak: int
    reserved_peak: int | None
    outside_allocator: int | None


# ---- judging (pure) ------------------------------------------------------------------------------
def memory_row_checks(m: Measured, predicted_peak: int, predicted_device: int) -> list[Check]:
    """A row's allocated peak against the memory model's total, and its reserved peak plus
    what lies outside the allocator against the model's device figure."""
    label = f"1B {m.row.name}"
    error = relative_error(m.allocated_peak, predicted_peak)
    checks = [
        Check.judged(
            f"{label} allocated peak",
            f"{mib(predicted_peak)} ±{PEAK_RTOL:.0%}",
            f"{mib(m.allocated_peak)} ({error:+.1%})",
            abs(error) <= PEAK_RTOL,
        )
    ]
    if m.reserved_peak is None:
        checks.append(
            Check(
                f"{label} reserved + outside",
                "the allocator's reserved peak",
                "not reported by the trial",
                Status.FAIL,
            )
        )
        return checks
    device = m.reserved_peak + (m.outside_allocator or 0)
    error = relative_error(device, predicted_device)
    checks.append(
        Check.judged(
            f"{label} reserved + outside",
            f"{mib(predicted_device)} ±{RESERVED_RTOL:.0%}",
            f"{mib(m.reserved_peak)} + {mib(m.outside_allocator or 0)} ({error:+.1%}); reserved "
            f"/ allocated {m.reserved_peak / max(1, m.allocated_peak):.3f}",
            abs(error) <= RESERVED_RTOL,
        )
    )
    return checks


def time_checks(measured: list[Measured], predicted_s: dict[str, float]) -> list[Check]:
    """Each row's predicted step time against its measurement (calibration rows marked), and
    the mean error over the rows not calibrated on, within TIME_MAPE (each within TIME_RTOL)."""
    checks, held_out = [], []
    for m in measured:
        error = predicted_s[m.row.name] / m.step_time_s - 1
        fitted = m.row.name in CALIBRATE_ON
        if not fitted:
            held_out.append(error)
        checks.append(
            Check(
                f"1B {m.row.name} step time",
                "calibrated on this row" if fitted else f"within ±{TIME_RTOL:.0%}",
                f"{m.step_time_s * 1e3:.1f} ms, predicted {predicted_s[m.row.name] * 1e3:.1f} "
                f"({error:+.1%})",
                Status.SKIP
                if fitted
                else (Status.PASS if abs(error) <= TIME_RTOL else Status.FAIL),
            )
        )
    mape = sum(map(abs, held_out)) / len(held_out) if held_out else math.nan
    checks.append(
        Check.judged(
            "1B step-time model, held-out rows",
            f"MAPE ≤ {TIME_MAPE:.0%}, calibrated on {' + '.join(CALIBRATE_ON)}",
            f"{mape:.1%} over {len(held_out)} rows",
            mape <= TIME_MAPE,
        )
    )
    return checks


def profile_checks(config, spans: list) -> list[Check]:
    """The profiled steps of a compute-bound row: every step captured once, CUDA kernels
    inside them, and compute covering at least COMPUTE_SHARE of the step window."""
    from profiler import breakdown

    rank0 = [s for s in spans if s.rank == 0]
    steps = {s.step for s in rank0 if s.kind == "step"}
    kernels = cuda_kernels(rank0)
    phases = {s.category for s in kernels}
    rows = breakdown(rank0)
    share = rows[0].compute_ns / rows[0].window_ns if rows and rows[0].window_ns else 0.0
    return [
        Check.judged(
            "1B profile: steps",
            f"{config.num_profiled_steps} profiled steps",
            f"{len(steps)} ({rows[0].num_steps if rows else 0} in the breakdown)",
            len(steps) == config.num_profiled_steps,
        ),
        Check.judged(
            "1B profile: CUDA kernels",
            "> 0, in forward, backward and optimizer",
            f"{len(kernels)}; phases {', '.join(sorted(phases)) or 'none'}",
            bool(kernels) and {"forward", "backward", "optimizer"} <= phases,
        ),
        Check.judged(
            "1B profile: compute share",
            f"≥ {COMPUTE_SHARE:.0%} of the step window",
            f"{share:.1%}",
            share >= COMPUTE_SHARE,
        ),
    ]


# ---- the runs --------------------------------------------------------------------------------
def batch_beyond_device(
    config_at, device_bytes: int, start: int = 1, device_type: str = "cuda"
) -> int:
    """The smallest micro-batch, ``start`` doubled, whose configuration (``config_at(batch)``)
    the memory model puts beyond OOM_FACTOR × the device's memory."""
    from autotune.model.memory import estimate_memory

    batch = start
    while (
        estimate_memory(config_at(batch), device_type=device_type).total
        <= OOM_FACTOR * device_bytes
    ):
        batch *= 2
    return batch


def oom_row(scale: Scale, device_bytes: int) -> Row:
    """The ``ac none`` row at the smallest doubled micro-batch beyond OOM_FACTOR × the
    device's memory."""
    row = Row("out of memory", ROWS[0].seq_len, 1, "none", "bf16-mixed")
    batch = batch_beyond_device(
        lambda b: scale.config(dataclasses.replace(row, micro_batch=b)),
        device_bytes,
        device_type=scale.device,
    )
    return dataclasses.replace(row, micro_batch=batch)


def cuda_kernels(spans: list) -> list:
    """The spans of CUDA kernels: on CUDA every compute span is a kernel, in the phase of the
    op that launched it (``profiler/capture.py``); on CPU an aten op."""
    return [s for s in spans if s.kind == "compute" and not s.name.startswith("aten::")]


def predicted_memory(config, device_type: str) -> tuple[int, int]:
    """(allocated peak, device bytes) the memory model predicts for a row."""
    from autotune.model.memory import estimate_memory
    from autotune.search.screen import ALLOWANCES

    total = estimate_memory(config, device_type=device_type).total
    allowance = ALLOWANCES[device_type]
    # The screen's device bytes without its safety margin: what the device should hold.
    return total, int(total * allowance.fragmentation + allowance.outside_allocator)


def _measured(row: Row, config, result) -> Measured:
    rank0 = result.ranks[0]
    reserved = getattr(rank0.memory, "reserved_peak", None)
    outside = rank0.extra.get("non_allocator_bytes")
    return Measured(row, config, result.step_time_s, rank0.memory.peak, reserved, outside)


def run_rows(scale: Scale, device_bytes: int, timeout_s: float, *, oom: bool = True) -> list[Check]:
    """Every row in one worker group, then the out-of-memory row and one more trial in the
    same group; then the memory, profile and step-time judgements."""
    from autotune.errors import AutotuneError
    from autotune.trial.executor import ExecutorSettings, RayExecutor

    checks: list[Check] = []
    measured: list[Measured] = []
    with RayExecutor(ExecutorSettings(trial_timeout_s=timeout_s)) as executor:
        # The group's first trial is cold (its workers load CUDA, cuBLAS and NCCL): it runs
        # once unmeasured, as the search discards a group's cold figure.
        with contextlib.suppress(AutotuneError):
            executor.run(scale.config(ROWS[0], profiled_steps=0))
        for row in ROWS:
            config = scale.config(row, profiled_steps=2 if row.name == PROFILED_ROW else 1)
            refused = _refusal(config)
            if refused:
                checks.append(
                    Check(
                        f"1B {row.name} trial",
                        "runs where the runtime allows it",
                        f"refused: {refused}"[:140],
                        Status.SKIP,
                    )
                )
                continue
            try:
                result = executor.run(config)
            except AutotuneError as e:
                checks.append(
                    Check.judged(
                        f"1B {row.name} trial", "completes", f"{type(e).__name__}: {e}"[:140], False
                    )
                )
                continue
            m = _measured(row, config, result)
            measured.append(m)
            checks.append(
                Check.judged(
                    f"1B {row.name} trial",
                    f"{scale.device} trial completes",
                    f"{result.ranks[0].device}, {result.ranks[0].backend}, "
                    f"{result.step_time_s * 1e3:.1f} ms/step",
                    True,
                )
            )
            checks += memory_row_checks(m, *predicted_memory(config, scale.device))
            if row.name == PROFILED_ROW:
                checks += profile_checks(config, result.ranks[0].spans)
        if oom:
            checks += _oom_then_next(executor, scale, device_bytes)
    checks += _step_time_checks(scale, measured)
    return checks


def _refusal(config) -> str | None:
    """The one-line reason the runtime refuses a row's configuration on this machine (offload
    needs dp > 1, or a GPU), or None."""
    from autotune.errors import ConfigError

    try:
        config.validate()
    except ConfigError as e:
        return str(e)
    return None


def _oom_then_next(executor, scale: Scale, device_bytes: int) -> list[Check]:
    """The out-of-memory row must fail as out of memory, and the next trial complete."""
    from autotune.errors import AutotuneError, TrialFailed
    from autotune.status import FailureKind

    row = oom_row(scale, device_bytes)
    try:
        executor.run(scale.config(row))
        verdict, ok = "completed", False
    except TrialFailed as e:
        verdict, ok = f"{e.kind}: {str(e)[:80]}", e.kind == FailureKind.OOM
    except AutotuneError as e:
        verdict, ok = f"{type(e).__name__}: {str(e)[:80]}", False
    checks = [
        Check.judged(
            f"1B out of memory (micro-batch {row.micro_batch})",
            "fails as out of memory",
            verdict,
            ok,
        )
    ]
    after = scale.config(ROWS[2])
    try:
        result = executor.run(after)
        checks.append(
            Check.judged(
                "1B trial after the OOM",
                "completes in the same executor",
                f"{result.step_time_s * 1e3:.1f} ms/step",
                True,
            )
        )
    except AutotuneError as e:
        checks.append(
            Check.judged(
                "1B trial after the OOM",
                "completes in the same executor",
                f"{type(e).__name__}: {e}"[:140],
                False,
            )
        )
    return checks


def _step_time_checks(scale: Scale, measured: list[Measured]) -> list[Check]:
    """Calibrate on CALIBRATE_ON's measurements, predict every row."""
    from autotune.model.calibration import Sample, fit_calibration
    from autotune.model.perf_model import predict_step_time
    from autotune.search.study_calibration import describe_cluster

    fit_rows = [m for m in measured if m.row.name in CALIBRATE_ON]
    if len(fit_rows) < len(CALIBRATE_ON):
        return [
            Check(
                "1B step-time model",
                "calibrated on " + " + ".join(CALIBRATE_ON),
                "a calibration row did not complete",
                Status.FAIL,
            )
        ]
    cluster = describe_cluster(1, scale.device)
    report = fit_calibration([Sample(m.config, m.step_time_s) for m in fit_rows], cluster)
    predicted = {
        m.row.name: predict_step_time(m.config, cluster, report.calibration).step_time_s
        for m in measured
    }
    return time_checks(measured, predicted)
