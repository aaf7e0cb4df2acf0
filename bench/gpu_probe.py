"""What a GPU machine offers the trial runtime, in one short run: versions, the torch APIs the
runtime and the coming knobs use, and a few trials through the Ray executor on CUDA with the
memory model's prediction beside each.

Prints one table (fact, value). Run it first on a machine nobody has run autotune on; then
``bench/gpu_check.py`` judges the GPU path.

Usage (from the repo root)::

    python bench/gpu_probe.py
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

APIS = (
    ("torch.distributed", "init_process_group", "device_id"),
    ("torch.distributed.fsdp", "fully_shard", None),
    ("torch.distributed.fsdp", "CPUOffloadPolicy", None),
    ("torch.distributed.fsdp", "MixedPrecisionPolicy", None),
    ("torch.distributed.pipelining", "ScheduleInterleaved1F1B", None),
    ("torch.distributed.pipelining", "ScheduleInterleavedZeroBubble", None),
    ("torch.distributed.tensor.parallel", "SequenceParallel", None),
    ("torch.distributed.tensor.experimental", "context_parallel", None),
    ("torch.utils.checkpoint", "create_selective_checkpoint_contexts", None),
    ("torch", "_foreach_copy_", None),
    ("torch.optim", "AdamW", "fused"),
    ("torchao.float8", "convert_to_float8_training", None),
)
"""(module, name, keyword the call must take or None)."""


def api_rows() -> list[tuple[str, str]]:
    rows = []
    for module, name, keyword in APIS:
        label = f"{module}.{name}" + (f"({keyword}=)" if keyword else "")
        try:
            obj = getattr(importlib.import_module(module), name)
            ok = keyword is None or keyword in inspect.signature(obj).parameters
            rows.append((label, "yes" if ok else "no keyword"))
        except Exception as e:  # noqa: BLE001 - a probe reports, never raises
            rows.append((label, f"no ({type(e).__name__})"))
    return rows


def trial_rows(timeout_s: float) -> list[tuple[str, str]]:
    """A few CUDA trials at world size 1 through the executor, with their predictions."""
    from autotune.config import TrialConfig, WorkloadSpec
    from autotune.model.memory import estimate_memory
    from autotune.trial.executor import ExecutorSettings, RayExecutor

    def config(size: str, family: str, seq: int, mb: int, ac: str, profiled: int):
        return TrialConfig(
            workload=WorkloadSpec(family=family, size=size, seq_len=seq, global_batch_size=mb),
            world_size=1,
            micro_batch_size=mb,
            device="cuda",
            activation_checkpointing=ac,
            num_warmup_steps=1,
            num_timed_steps=3,
            num_profiled_steps=profiled,
        )

    plan = [
        ("gpt-tiny, not profiled", config("tiny", "gpt", 64, 4, "none", 0)),
        ("gpt-tiny, 1 profiled step", config("tiny", "gpt", 64, 4, "none", 1)),
        ("llama-1b seq 4096 ac none", config("1b", "llama", 4096, 1, "none", 0)),
        ("llama-1b seq 4096 ac full mb 2", config("1b", "llama", 4096, 2, "full", 0)),
    ]
    rows = []
    with RayExecutor(ExecutorSettings(trial_timeout_s=timeout_s)) as executor:
        for label, cfg in plan:
            start = time.monotonic()
            predicted = estimate_memory(cfg, device_type="cuda")
            try:
                result = executor.run(cfg)
            except Exception as e:  # noqa: BLE001 - a probe reports, never raises
                rows.append((label, f"{type(e).__name__}: {e}"[:200]))
                continue
            r0 = result.ranks[0]
            m = dataclasses.asdict(r0.memory)
            rows.append(
                (
                    label,
                    f"{r0.device} {r0.backend}; {result.step_time_s * 1e3:.1f} "
                    f"ms/step, MFU {result.mfu or 0:.1%}; setup {r0.setup_s:.1f}s, "
                    f"wall {time.monotonic() - start:.0f}s",
                )
            )
            rows.append(
                (
                    f"  {label} memory",
                    ", ".join(f"{k} {v / 2**20:,.0f}" for k, v in m.items() if isinstance(v, int))
                    + f" MiB; predicted total {predicted.total / 2**20:,.0f} MiB "
                    f"(activations {predicted.activations / 2**20:,.0f}, other "
                    f"{predicted.other / 2**20:,.0f})",
                )
            )
            rows.append(
                (f"  {label} extra", str({k: v for k, v in r0.extra.items() if k != "pid"})[:200])
            )
    return rows


def main() -> int:
    import torch

    start = time.monotonic()
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else "-"
    rows = [
        (
            "torch",
            f"{torch.__version__}, CUDA {torch.version.cuda}, NCCL {nccl}",
        ),
        ("python", sys.version.split()[0]),
    ]
    try:
        import ray

        rows.append(("ray", ray.__version__))
    except ImportError as e:
        rows.append(("ray", f"missing: {e}"))
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        free, total = torch.cuda.mem_get_info(0)
        rows.append(
            (
                "device",
                f"{torch.cuda.device_count()} × {p.name}, sm {p.major}.{p.minor}, "
                f"{p.multi_processor_count} SMs, {total / 2**30:.1f} GiB "
                f"({free / 2**30:.1f} free)",
            )
        )
    rows += api_rows()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if torch.cuda.is_available():
        rows += trial_rows(timeout_s=180)
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k.ljust(width)}  {v}")
    print(f"probe took {time.monotonic() - start:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
