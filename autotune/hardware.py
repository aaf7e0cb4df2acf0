"""Peak dense FLOP/s of known accelerators and the model-FLOPs formula for MFU.

``PEAK_FLOPS`` is the one table of peaks: the executor's MFU reads it by CUDA device name, and
the built-in clusters (``autotune/model/cluster.py``) take their devices' peaks from it.

Peaks are the vendors' dense (non-sparse) figures: NVIDIA H100 SXM and H200 datasheets
(989 TFLOP/s bf16/fp16, 67 TFLOP/s fp32 non-tensor), A100 SXM datasheet (312 / 19.5).
"""

from __future__ import annotations

PEAK_FLOPS: dict[str, dict[str, float]] = {
    "H200": {"bfloat16": 989e12, "float16": 989e12, "float32": 67e12},
    "H100": {"bfloat16": 989e12, "float16": 989e12, "float32": 67e12},
    "A100": {"bfloat16": 312e12, "float16": 312e12, "float32": 19.5e12},
}


def device_tag(device_name: str) -> str | None:
    """The ``PEAK_FLOPS`` key a device's name contains (CUDA's 'NVIDIA H200' → 'H200', the
    built-in 'H200-SXM-141GB' too); None when unknown."""
    return next((key for key in PEAK_FLOPS if key in device_name), None)


def peak_flops(device_name: str, dtype: str) -> float | None:
    """Peak FLOP/s of a device by its CUDA name (e.g. 'NVIDIA H200'); None when unknown."""
    tag = device_tag(device_name)
    return PEAK_FLOPS[tag].get(dtype) if tag else None


def flops_per_token(num_params: int, num_layers: int, hidden_size: int, seq_len: int) -> float:
    """Training FLOPs per token, PaLM (Chowdhery et al. 2022, Appendix B): 6N + 12·L·H·Q·T,
    with H·Q = hidden size; recomputation is not counted."""
    return 6 * num_params + 12 * num_layers * hidden_size * seq_len
