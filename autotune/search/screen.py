"""The memory screen: whether a configuration is predicted to fit under a per-device limit.

The search screens every proposal with it before anything runs (``search.loop``), picks its
baseline among the configurations it passes (``search``), and ``autotune rank`` ranks only
those it passes. No torch: the memory model (``autotune.model.memory``) is imported when used.
"""

from __future__ import annotations

from autotune.config import TrialConfig
MEMORY_MARGIN = 0.15
"""A configuration is run only if its predicted peak × (1 + MEMORY_MARGIN) is within the limit:
the memory model's worst under-prediction over bench/search_efficiency.py's sweep was 11.5%."""


def predicted_to_fit(predicted: int | None, limit: int | None) -> bool:
    """Whether a prediction (None: unknown) leaves room to run; unknown ones are run and their
    measured peak decides."""
    return limit is None or predicted is None or predicted * (1 + MEMORY_MARGIN) <= limit


def predict_peak(config: TrialConfig, device_type: str) -> int | None:
    """The memory model's predicted peak, or None for a user workload whose shape it does not
    know (then the trial's measured peak is the only judge)."""
    from autotune.model.memory import estimate_memory

    if config.workload.shape is None:
        return None
    return estimate_memory(config, device_type=device_type).total
