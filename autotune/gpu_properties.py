"""A GPU that ``hardware.GPUS`` does not know, described from its CUDA properties.

The properties are torch's (``torch.cuda.get_device_properties``: ``multi_processor_count``,
``major``/``minor``, ``clock_rate`` and ``memory_clock_rate`` in kHz, ``memory_bus_width`` in
bits, ``total_memory`` in bytes, ``gcnArchName`` on ROCm; the clock and memory fields exist in
newer torch only, so each may be missing). Peak = SMs × clock × the dense FLOP per SM per clock
of its architecture, which the table below derives from one datasheet GPU of each; memory
bandwidth = 2 (double data rate) × memory clock × bus width. What cannot be read is assumed,
and ``AssumedGpu.assumed`` names every assumption in one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotune.hardware import PCIE4_GBS, PCIE5_GBS, PCIE_RING_SHARE, Gpu

GB = 1e9


@dataclass(frozen=True, slots=True)
class _Arch:
    """Dense FLOP per SM (CU on AMD) per clock, and the clock its datasheet peak is quoted at."""

    bf16: int
    fp16: int
    fp8: int
    fp32: int
    clock_ghz: float
    derived_from: str


# NVIDIA by compute capability. Each row: the datasheet peak ÷ (SMs × clock) of one GPU.
_NVIDIA: dict[tuple[int, int], _Arch] = {
    # V100: 125 TFLOP/s fp16 = 80 SMs × 1.53 GHz × 1024; 15.7 fp32 = × 128. No bf16 tensor
    # cores: bf16 runs at the fp32 rate.
    (7, 0): _Arch(128, 1024, 0, 128, 1.53, "the V100"),
    # T4: 65 TFLOP/s fp16 = 40 × 1.59 GHz × 1024; 8.1 fp32 = × 128.
    (7, 5): _Arch(128, 1024, 0, 128, 1.59, "the T4"),
    # A100: 312 = 108 × 1.41 GHz × 2048; 19.5 fp32 = × 128.
    (8, 0): _Arch(2048, 2048, 0, 128, 1.41, "the A100"),
    # A40: 149.7 = 84 × 1.74 GHz × 1024; 37.4 fp32 = × 256.
    (8, 6): _Arch(1024, 1024, 0, 256, 1.74, "the A40"),
    # L4: 121 = 58 × 2.04 GHz × 1024; fp8 twice that; 30.3 fp32 = × 256. (GeForce cards run
    # half the tensor rate per SM.)
    (8, 9): _Arch(1024, 1024, 2048, 256, 2.04, "the L4"),
    # H100 SXM: 989.4 = 132 × 1.83 GHz × 4096; fp8 twice; fp32 256 per SM per clock.
    (9, 0): _Arch(4096, 4096, 8192, 256, 1.83, "the H100 SXM"),
    # B200: 2.25 PFLOP/s = 148 × 1.856 GHz × 8192; fp8 twice; 75 fp32 = 148 × 1.98 × 256.
    (10, 0): _Arch(8192, 8192, 16384, 256, 1.86, "the B200"),
    # Blackwell workstation parts, assumed at Ada's per-SM rate (8.9).
    (12, 0): _Arch(1024, 1024, 2048, 256, 2.4, "the L4, assumed alike"),
}
# AMD by gfx architecture (ROCm's torch reports it as gcnArchName), per compute unit.
_AMD: dict[str, _Arch] = {
    # MI250X: 383 TFLOP/s bf16 = 220 CUs × 1.7 GHz × 1024; 95.7 fp32 (packed) = × 256.
    "gfx90a": _Arch(1024, 1024, 0, 256, 1.7, "the MI250X"),
    # MI300X: 1,307.4 = 304 × 2.1 GHz × 2048; fp8 twice; 163.4 fp32 = × 256.
    "gfx942": _Arch(2048, 2048, 4096, 256, 2.1, "the MI300X"),
    # MI355X: 2.5 PFLOP/s bf16 = 256 × 2.4 GHz × 4096; fp8 twice.
    "gfx950": _Arch(4096, 4096, 8192, 256, 2.4, "the MI355X"),
}
BYTES_PER_FLOP = 3350.0 / 989.4e3
"""Memory bandwidth (GB/s) per dense bf16 GFLOP/s when the memory clock cannot be read: the
H100 SXM's (3.35 TB/s for 989.4 TFLOP/s; B200's 7.7 / 2,250 is the same)."""
ASSUMED_NIC_GBITS = 100.0
"""The network of a node of unknown GPUs: one 100 Gb/s NIC."""


@dataclass(frozen=True, slots=True)
class AssumedGpu:
    gpu: Gpu
    assumed: str
    """One line naming everything that was assumed."""


def _arch(props: Any) -> tuple[_Arch, str]:
    """The per-SM rates of the device's architecture, and the assumption in words."""
    gfx = str(getattr(props, "gcnArchName", "") or "").split(":")[0]
    cc = (int(getattr(props, "major", 0) or 0), int(getattr(props, "minor", 0) or 0))
    if gfx.startswith("gfx"):  # ROCm; CUDA builds report no gfx name
        arch = _AMD.get(gfx, _AMD["gfx942"])
        return arch, f"{arch.bf16} bf16 FLOP per CU per clock for {gfx} (as {arch.derived_from})"
    if cc == (0, 0):
        arch = _NVIDIA[9, 0]
        return arch, (
            f"{arch.bf16} bf16 FLOP per SM per clock (as {arch.derived_from}; no "
            "compute capability reported)"
        )
    arch = _NVIDIA[max((k for k in _NVIDIA if k <= cc), default=min(_NVIDIA))]
    return arch, (
        f"{arch.bf16} bf16 FLOP per SM per clock for compute capability "
        f"{cc[0]}.{cc[1]} (as {arch.derived_from})"
    )


def gpu_from_properties(props: Any, *, name: str = "", devices_per_node: int = 8) -> AssumedGpu:
    """A ``Gpu`` for a device ``hardware.GPUS`` does not know, from an object with torch's
    device-property attribute names (``torch.cuda.get_device_properties(0)`` or the same read
    back from the probe's JSON); ``name`` when given, else the properties', names it."""
    name = name or str(getattr(props, "name", "") or "unknown GPU")
    arch, assumed = _arch(props)
    units = int(getattr(props, "multi_processor_count", 0) or 0)
    notes = [assumed]
    if units <= 0:
        units = 132
        notes.append("132 SMs (as the H100 SXM; none reported)")
    clock_khz = int(getattr(props, "clock_rate", 0) or 0)
    clock = clock_khz * 1e3 if clock_khz > 0 else arch.clock_ghz * 1e9
    if clock_khz <= 0:
        notes.append(f"a {arch.clock_ghz} GHz clock (as {arch.derived_from}; none reported)")
    peak = {"bfloat16": arch.bf16, "float16": arch.fp16, "float8": arch.fp8, "float32": arch.fp32}
    flops = {k: units * clock * v for k, v in peak.items() if v}
    mem_khz = int(getattr(props, "memory_clock_rate", 0) or 0)
    bus = int(getattr(props, "memory_bus_width", 0) or 0)
    if mem_khz > 0 and bus > 0:
        bandwidth = 2 * mem_khz * 1e3 * bus / 8 / GB
    else:
        bandwidth = flops["bfloat16"] / GB * BYTES_PER_FLOP
        notes.append(
            f"{bandwidth:,.0f} GB/s of memory bandwidth (the H100 SXM's per FLOP; "
            "no memory clock reported)"
        )
    memory = int(getattr(props, "total_memory", 0) or 0)
    if memory <= 0:
        notes.append("80 GiB of memory (none reported)")
    pcie = PCIE5_GBS if arch.fp8 and arch.bf16 >= 2048 else PCIE4_GBS  # Hopper, CDNA 3 on
    notes.append(
        f"PCIe Gen{5 if pcie == PCIE5_GBS else 4} between GPUs, "
        f"{ASSUMED_NIC_GBITS:.0f} Gb/s between nodes"
    )
    gpu = Gpu(
        key=name,
        name=name,
        dense_flops=flops,
        memory_bandwidth_gbs=bandwidth,
        memory_gib=memory / 2**30 if memory > 0 else 80.0,
        link="PCIe (assumed)",
        link_gbs=pcie,
        allreduce_busbw_gbs=PCIE_RING_SHARE * pcie,
        devices_per_node=devices_per_node,
        nic_gbits=ASSUMED_NIC_GBITS,
        source=f"described from its CUDA properties; assumed {'; '.join(notes)}",
    )
    return AssumedGpu(
        gpu,
        f"{name} is not in autotune's GPU table; described from its CUDA "
        f"properties, assuming {'; '.join(notes)}",
    )
