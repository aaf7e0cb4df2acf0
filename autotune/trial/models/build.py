"""The one place a spec becomes a Workload: a built-in model (``workload``), a Hugging Face
model (``hf``), or a user's ``pkg.module:build`` function."""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch

from autotune.config import WorkloadSpec
from autotune.errors import WorkloadError
from autotune.trial.models.workload import Workload, build_builtin


def load_builder(path: str) -> Callable[[WorkloadSpec], Workload]:
    """Import 'pkg.module:function'; raise WorkloadError with the cause on failure."""
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # an import can fail in any way; the user must see why
        raise WorkloadError(
            f"workload '{path}' does not import: {type(e).__name__}: {e}; check the module "
            "path and that it is importable (PYTHONPATH) on every worker"
        ) from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise WorkloadError(f"workload '{path}': module '{module_name}' has no function '{attr}'")
    return fn


def build_workload(
    spec: WorkloadSpec,
    *,
    attention: str = "sdpa",
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> Workload:
    """Build the workload of a spec on this process, seeded identically on every rank; a
    built-in model is initialised on ``device`` (others are built where their code builds
    them, and moved by ``parallelize``)."""
    if spec.hf_model is not None:
        from autotune.trial.models.hf import build_hf  # transformers only when asked for

        return build_hf(spec, attention=attention, seed=seed)
    if spec.workload is None:
        return build_builtin(spec, attention=attention, seed=seed, device=device)
    builder = load_builder(spec.workload)
    torch.manual_seed(seed)
    try:
        workload = builder(spec)
    except Exception as e:
        raise WorkloadError(
            f"workload '{spec.workload}' raised while building: {type(e).__name__}: {e}"
        ) from None
    if not isinstance(workload, Workload):
        raise WorkloadError(
            f"workload '{spec.workload}' must return an autotune Workload, "
            f"not {type(workload).__name__}"
        )
    return workload
