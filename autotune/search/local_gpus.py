"""The CUDA devices this host's torch sees, asked without loading torch into the driver.

The driver (the CLI, the search) never imports torch (``tests/test_driver_imports.py``): it
trains nothing, torch costs it a second and hundreds of MB, and ``get_device_properties`` would
open a CUDA context on GPU 0 in a process that holds no tensors. The search's device questions —
is there a GPU, how many, GPU 0's memory, name and properties — are answered by one
short-lived interpreter that imports torch, at most once per driver process and only when a
question is asked (a search
on ``device="cpu"`` with a memory limit asks none). The answers are torch's own, under the same
environment (``CUDA_VISIBLE_DEVICES`` included), as if the driver had imported it.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

_PROBE = """\
import json, torch
available = torch.cuda.is_available()
props = torch.cuda.get_device_properties(0) if available else None
print(json.dumps({
    "available": available,
    "count": torch.cuda.device_count() if available else 0,
    "name": torch.cuda.get_device_name(0) if available else "",
    "total_memory": props.total_memory if available else 0,
    # What describes a GPU that autotune's table does not know (gpu_properties); the clock
    # and memory fields are missing from older torch, so each is read if present.
    "properties": {k: getattr(props, k) for k in PROPERTIES if hasattr(props, k)},
}))
"""
PROPERTIES = (
    "name",
    "major",
    "minor",
    "multi_processor_count",
    "total_memory",
    "clock_rate",
    "memory_clock_rate",
    "memory_bus_width",
    "gcnArchName",
)
"""The ``torch.cuda.get_device_properties`` fields the probe reports (all plain values)."""


@dataclass(frozen=True, slots=True)
class LocalGpus:
    """What ``torch.cuda`` answers on this host."""

    available: bool
    """``torch.cuda.is_available()``."""
    count: int
    """``torch.cuda.device_count()`` (0 when none is available)."""
    name: str
    """Device 0's ``get_device_name`` ('' when none is available)."""
    total_memory: int
    """Device 0's memory in bytes (0 when none is available)."""
    properties: dict[str, Any] = field(default_factory=dict)
    """Device 0's ``get_device_properties`` fields named in ``PROPERTIES`` that this torch
    has (empty when none is available)."""

    def device_properties(self) -> SimpleNamespace:
        """The properties as attributes, like torch's own object."""
        return SimpleNamespace(**self.properties)


@functools.cache
def local_gpus() -> LocalGpus:
    """Ask torch, in a child interpreter, once per process."""
    code = f"PROPERTIES = {PROPERTIES!r}\n{_PROBE}"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"asking torch for this host's CUDA devices failed: {last}")
    return LocalGpus(**json.loads(proc.stdout.strip().splitlines()[-1]))
