"""The memory screen: whether a configuration is predicted to fit under a per-device limit.

The search screens every proposal with it before anything runs (``search.loop``), picks its
baseline among the configurations it passes (``search``), and ``autotune rank`` ranks only
those it passes. No torch: the memory model (``autotune.model.memory``) is imported when used.

What is held against the limit is what the device must hold, measured and predicted alike:
- measured (``TrialResult.device_peak_bytes``): the allocator's reserved peak plus the memory
  outside the allocator (CUDA context, NCCL's buffers), not the allocated peak alone;
- predicted (``required_bytes``): the memory model predicts the allocated peak, so the screen
  turns it into the same figure, ``predicted × (1 + model_margin) × fragmentation +
  outside_allocator``, with the constants of ``ALLOWANCES`` for the device;
- predicted as another engine runs the layout (``autotune rank --engine``, the engine's memory
  traits): the same, less what the traits already count (``allowance(device, traits)``:
  DeepSpeed's measured reserve and context, torchtitan's expandable segments), never twice.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache
from typing import TYPE_CHECKING

from autotune.config import GIB, TrialConfig
from autotune.model.engines import AUTOTUNE_MEMORY

if TYPE_CHECKING:
    from autotune.model.memory import MemoryTraits


@dataclass(frozen=True)
class MemoryAllowance:
    """What the screen adds to a predicted allocated peak to get the bytes the device needs."""

    model_margin: float
    """The memory model's worst under-prediction of the allocated peak, rounded up."""
    fragmentation: float
    """Reserved peak ÷ allocated peak of the device's allocator (1: no caching allocator)."""
    outside_allocator: int
    """Bytes the device holds outside the allocator (CUDA context, NCCL's buffers)."""

    def required_bytes(self, predicted: int) -> int:
        """The device bytes a configuration whose allocated peak is predicted at ``predicted``
        needs, allowances included."""
        return int(
            predicted * (1 + self.model_margin) * self.fragmentation + self.outside_allocator
        )

    def describe(self) -> str:
        """The allowances in words, for the messages that give a screen's verdict."""
        parts = [f"+{self.model_margin:.0%} margin"]
        if self.fragmentation != 1:
            parts.append(f"×{self.fragmentation:g} allocator reserve")
        if self.outside_allocator:
            parts.append(f"+{self.outside_allocator / GIB:g} GiB outside the allocator")
        return ", ".join(parts)


ALLOWANCES: dict[str, MemoryAllowance] = {
    "cpu": MemoryAllowance(model_margin=0.15, fragmentation=1.0, outside_allocator=0),
    "cuda": MemoryAllowance(
        model_margin=0.15, fragmentation=1.10, outside_allocator=int(1.5 * GIB)
    ),
}
"""The screen's allowances per device type, and where each number comes from.

``model_margin`` 0.15 (both devices): the memory model's worst under-prediction of the
measured allocated peak over ``bench/search_efficiency.py``'s sweep was 11.5% (CPU trials,
``docs/benchmarks.md``), rounded up. On CUDA the first GPU run (H200, 2026-12-04,
``docs/gpu-runs``: eight configurations of a 1.5B Llama) found the model over, never under,
``max_memory_allocated``: by 2.8% to 16.0% (``bench/gpu_check.py``'s memory rows), so the
margin is kept there as a bound on what one GPU did not show (other layouts, other shapes).

``fragmentation``:
- CPU 1.0: no caching allocator; the runner stores reserved = allocated (``measure_memory``).
- CUDA 1.10: measured 1.066 to 1.097 on the H200 (2026-12-04; the rows whose reserved peak
  was their own: no AC, selective AC, seq 2048 at micro-batch 4; the other rows carried the
  earlier trials' cached blocks, which the runner now releases). torch's caching allocator
  keeps freed blocks for reuse and rounds requests up: to 512 bytes, requests over 1 MiB to 2 MiB
  (``kRoundLarge``), and serves requests of 1–10 MiB from 20 MiB segments
  (``c10/core/AllocatorConfig.h``: ``kSmallBuffer``, ``kMinLargeAlloc``, ``kRoundLarge``), so
  ``max_memory_reserved`` exceeds ``max_memory_allocated`` by the rounding plus the cached
  blocks that are too small or too fragmented to reuse at the peak. The GPU check measures
  reserved ÷ allocated per configuration; this is the worst ratio it measured, rounded up.

``outside_allocator``:
- CPU 0: on CPU the limit has always been held against the tensors' bytes alone (the process's
  other memory is not the trial's to fit).
- CUDA 1.5 GiB: measured 1,338.8 to 1,340.8 MiB on the H200 (torch 2.11, CUDA 13, NCCL
  2.28.9, one rank), rounded up; more ranks add NCCL buffers. It is the CUDA context (the
  driver's and the loaded kernels' memory, which torch never allocates) plus NCCL's communicator
  buffers
  (``NCCL_BUFFSIZE``, 4 MiB by default, per channel and peer, and more with NVLink SHARP). The
  runner reports the measured figure (total − free − reserved, ``torch.cuda.mem_get_info``) in
  ``RankResult.extra["non_allocator_bytes"]``.
"""


def allowance(device_type: str, engine: MemoryTraits = AUTOTUNE_MEMORY) -> MemoryAllowance:
    """The screen's allowances on ``device_type`` ('cpu' or 'cuda') for the predictions of an
    engine's memory part (``EngineProfile.memory``; autotune's runtime's by default). Where an
    engine's estimate already counts the allocator's reserve (``MemoryTraits.fragmentation``
    measured) or the bytes outside it (``context_bytes``), the device's are not added again;
    the model margin always is. autotune's runtime counts neither: the device's allowances."""
    if device_type not in ALLOWANCES:
        raise ValueError(
            f"no memory allowances for device type '{device_type}'; known: {', '.join(ALLOWANCES)}"
        )
    return _engine_allowance(
        device_type, engine.fragmentation is None, engine.context_bytes is None
    )


@cache
def _engine_allowance(device_type: str, add_reserve: bool, add_outside: bool) -> MemoryAllowance:
    """The device's allowances, less the reserve and the outside bytes an engine counts
    (cached: ``rank`` asks once per layout)."""
    device = ALLOWANCES[device_type]
    if add_reserve and add_outside:
        return device
    return replace(
        device,
        fragmentation=device.fragmentation if add_reserve else 1.0,
        outside_allocator=device.outside_allocator if add_outside else 0,
    )


MEMORY_MARGIN = ALLOWANCES["cpu"].model_margin
"""The model margin alone: on CPU a configuration is run only if its predicted peak ×
(1 + MEMORY_MARGIN) is within the limit (``ALLOWANCES`` gives every device's rule)."""


def required_bytes(predicted: int, device_type: str) -> int:
    """The device bytes the screen holds against the limit for a predicted allocated peak."""
    return allowance(device_type).required_bytes(predicted)


def predicted_to_fit(
    predicted: int | None,
    limit: int | None,
    device_type: str,
    engine: MemoryTraits = AUTOTUNE_MEMORY,
) -> bool:
    """Whether a prediction (None: unknown) leaves room to run on ``device_type``; unknown
    ones are run and their measured peak decides. ``engine``: the prediction is of that
    engine's memory traits (``allowance``)."""
    if limit is None or predicted is None:
        return True
    return allowance(device_type, engine).required_bytes(predicted) <= limit


def predict_peak(config: TrialConfig, device_type: str) -> int | None:
    """The memory model's predicted peak, or None for a user workload whose shape it does not
    know (then the trial's measured peak is the only judge)."""
    from autotune.model.memory import estimate_memory

    if config.workload.shape is None:
        return None
    return estimate_memory(config, device_type=device_type).total
