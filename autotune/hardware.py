"""The accelerators autotune knows: one entry per GPU with its datasheet figures, the lookup of
a device by the name torch reports, and the model-FLOPs formula for MFU.

``GPUS`` is the one table: the built-in clusters (``autotune/model/cluster.py``) are made from
it, the executor's MFU reads its peaks by CUDA device name (``peak_flops``), and a GPU that is
not in it is described from its CUDA properties (``autotune/gpu_properties.py``).

Conventions, the same for every entry:

- ``dense_flops``: the vendor's dense (not 2:4-sparse) peak FLOP/s per dtype: ``bfloat16``,
  ``float16`` (tensor cores, FP32 accumulate), ``float8`` (tensor cores; absent where the GPU
  has none), ``tfloat32`` (tensor cores) and ``float32`` (non-tensor, what an fp32 matmul gets
  with torch's default ``allow_tf32 = False``). Datasheets that print sparse figures with a
  footnote are halved.
- ``memory_gib``: the datasheet's memory; its "GB" of HBM are binary in practice (an 80 GB H100
  reports 79.1 GiB to ``torch.cuda``, a 141 GB H200 139.7 GiB).
- ``link_gbs``: the intra-node link per GPU and per direction (NVLink's "900 GB/s" is
  bidirectional: 450 each way); ``allreduce_busbw_gbs`` what NCCL's ring all-reduce reaches on
  it over a node (nccl-tests' bus bandwidth, ``doc/PERFORMANCE.md`` of NVIDIA/nccl-tests), the
  figure the performance model's intra-node link takes.
- ``nic_gbits``: the inter-node network of one node, all its compute NICs together, in Gb/s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

FLOAT_DTYPES = ("bfloat16", "float16", "float8", "tfloat32", "float32")
"""The dtypes ``Gpu.dense_flops`` may give."""

NVLINK_RING_SHARE = 0.8
"""NCCL ring all-reduce bus bandwidth over an 8-GPU NVSwitch node as a share of the per-GPU
link bandwidth per direction: nccl-tests ``all_reduce_perf`` reaches about 360 GB/s of
NVLink 4's 450 on a DGX H100 without NVLink SHARP; the shipped measurement of 8 A100s
(``examples/clusters/a100-megatron.json``: 229 GB/s of 300) is 0.76. Also taken for AMD's
Infinity Fabric mesh, which RCCL drives with one ring per link."""
PCIE_RING_SHARE = 0.6
"""The same share for GPUs that talk over PCIe (switches and the host's root complexes in the
path): assumed, no vendor figure; a study's calibration (``comm_efficiency``) scales it."""
PCIE4_GBS, PCIE5_GBS = 32.0, 64.0
"""PCIe Gen4 / Gen5 x16 per direction (datasheets print 64 / 128 GB/s, both directions)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Gpu:
    """One accelerator and the node it usually comes in."""

    key: str
    """Its built-in cluster name (``--cluster KEY``), e.g. 'h100-sxm'."""
    name: str
    """Device name in tables, e.g. 'H100-SXM5-80GB'."""
    dense_flops: dict[str, float]
    """Dense peak FLOP/s per dtype (``FLOAT_DTYPES``)."""
    memory_bandwidth_gbs: float
    """Device memory bandwidth, GB/s."""
    memory_gib: float
    """Device memory, GiB (the datasheet's GB; see the module's conventions)."""
    link: str
    """What joins the GPUs of a node, e.g. 'NVLink 4 (NVSwitch)'."""
    link_gbs: float
    """That link's bandwidth per GPU and per direction, GB/s."""
    allreduce_busbw_gbs: float
    """NCCL all-reduce bus bandwidth over the node's GPUs for large messages, GB/s."""
    devices_per_node: int
    """GPUs per node (for GB200 NVL72: per NVLink domain)."""
    nic_gbits: float
    """Inter-node network per node, all compute NICs together, Gb/s."""
    source: str
    """The datasheets the figures come from (vendor, document, year)."""
    aliases: tuple[str, ...] = ()
    """Other names ``--cluster`` accepts."""
    pattern: str = ""
    """Regular expression (case-insensitive) matching the names torch reports for it."""

    def flops(self, dtype: str) -> float | None:
        return self.dense_flops.get(dtype)


def _dense(bf16: float, fp8: float | None, tf32: float, fp32: float) -> dict[str, float]:
    """Dense peaks in TFLOP/s → FLOP/s per dtype (fp16 runs at the bf16 rate on all of these)."""
    peaks = {"bfloat16": bf16, "float16": bf16, "float8": fp8, "tfloat32": tf32, "float32": fp32}
    return {k: v * 1e12 for k, v in peaks.items() if v is not None}


_A100 = _dense(312, None, 156, 19.5)
_DGX_A100_NICS = 8 * 200.0
_A100_SRC = (
    "NVIDIA A100 Tensor Core GPU datasheet (2021): 312 TFLOP/s bf16/fp16, 156 tf32, "
    "19.5 fp32, dense"
)
_H100_SXM = _dense(989.4, 1978.9, 494.7, 66.9)
_PCIE_NODE_NICS = 8 * 200.0
_PCIE_NODE_SRC = (
    "8 per node on PCIe, 200 Gb/s east-west per GPU as NVIDIA's Enterprise "
    "Reference Architecture 2-8-5-200 (2024) lays out"
)
_HGX_NICS = 8 * 400.0
_NVL = _dense(835.5, 1670.5, 417.5, 60)  # H100 NVL and H200 NVL: 1,671 TFLOP/s bf16 sparse
_MI300 = _dense(1307.4, 2614.9, 653.7, 163.4)

GPUS: tuple[Gpu, ...] = (
    # ---- NVIDIA Ampere ----------------------------------------------------------------------
    Gpu(
        key="a100-pcie-40gb",
        name="A100-PCIE-40GB",
        dense_flops=_A100,
        memory_bandwidth_gbs=1555.0,
        memory_gib=40.0,
        link="PCIe Gen4 x16",
        link_gbs=PCIE4_GBS,
        allreduce_busbw_gbs=PCIE_RING_SHARE * PCIE4_GBS,
        devices_per_node=8,
        nic_gbits=_PCIE_NODE_NICS,
        source=f"{_A100_SRC}; 40 GB HBM2 1,555 GB/s; {_PCIE_NODE_SRC}; NVLink bridges join "
        "pairs only, so a node's collectives run on PCIe",
        pattern=r"A100.*PCIE.*40\s*GB|A100.*40\s*GB.*PCIE",
    ),
    Gpu(
        key="a100-pcie-80gb",
        name="A100-PCIE-80GB",
        dense_flops=_A100,
        memory_bandwidth_gbs=1935.0,
        memory_gib=80.0,
        link="PCIe Gen4 x16",
        link_gbs=PCIE4_GBS,
        allreduce_busbw_gbs=PCIE_RING_SHARE * PCIE4_GBS,
        devices_per_node=8,
        nic_gbits=_PCIE_NODE_NICS,
        source=f"{_A100_SRC}; 80 GB HBM2e 1,935 GB/s; {_PCIE_NODE_SRC}",
        pattern=r"A100.*PCIE",
    ),
    Gpu(
        key="a100-sxm4-40gb",
        name="A100-SXM4-40GB",
        dense_flops=_A100,
        memory_bandwidth_gbs=1555.0,
        memory_gib=40.0,
        link="NVLink 3 (NVSwitch)",
        link_gbs=300.0,
        allreduce_busbw_gbs=230.0,
        devices_per_node=8,
        nic_gbits=_DGX_A100_NICS,
        source=f"{_A100_SRC}; 40 GB HBM2 1,555 GB/s; NVLink 600 GB/s bidirectional; "
        "DGX A100 user guide (2020): 8 x 200 Gb/s HDR InfiniBand",
        pattern=r"A100.*40\s*GB",
    ),
    Gpu(
        key="a100-sxm4-80gb",
        name="A100-SXM4-80GB",
        dense_flops=_A100,
        memory_bandwidth_gbs=2039.0,
        memory_gib=80.0,
        link="NVLink 3 (NVSwitch)",
        link_gbs=300.0,
        allreduce_busbw_gbs=230.0,
        devices_per_node=8,
        nic_gbits=_DGX_A100_NICS,
        source=f"{_A100_SRC}; 80 GB HBM2e 2,039 GB/s; NVLink 600 GB/s bidirectional, "
        "all-reduce 229 GB/s measured by nccl-tests on 8 A100s (a100-megatron); "
        "DGX A100 user guide (2020): 8 x 200 Gb/s HDR InfiniBand",
        aliases=("a100",),
        pattern=r"\bA100\b",
    ),
    # ---- NVIDIA Hopper ----------------------------------------------------------------------
    Gpu(
        key="h100-nvl",
        name="H100-NVL-94GB",
        dense_flops=_NVL,
        memory_bandwidth_gbs=3900.0,
        memory_gib=94.0,
        link="PCIe Gen5 x16",
        link_gbs=PCIE5_GBS,
        allreduce_busbw_gbs=PCIE_RING_SHARE * PCIE5_GBS,
        devices_per_node=8,
        nic_gbits=_PCIE_NODE_NICS,
        source="NVIDIA H100 Tensor Core GPU datasheet (2024), H100 NVL: 1,671 TFLOP/s bf16, "
        "3,341 fp8, 835 tf32 sparse (halved), 60 fp32, 94 GB 3.9 TB/s; "
        f"{_PCIE_NODE_SRC}; NVLink bridges (600 GB/s) join pairs only",
        pattern=r"H100.*NVL",
    ),
    Gpu(
        key="h100-pcie",
        name="H100-PCIE-80GB",
        dense_flops=_dense(756.5, 1513, 378, 51),
        memory_bandwidth_gbs=2000.0,
        memory_gib=80.0,
        link="PCIe Gen5 x16",
        link_gbs=PCIE5_GBS,
        allreduce_busbw_gbs=PCIE_RING_SHARE * PCIE5_GBS,
        devices_per_node=8,
        nic_gbits=_PCIE_NODE_NICS,
        source="NVIDIA H100 Tensor Core GPU datasheet (2023), H100 PCIe: 1,513 TFLOP/s bf16, "
        "3,026 fp8, 756 tf32 sparse (halved), 51 fp32, 80 GB 2 TB/s; "
        f"{_PCIE_NODE_SRC}",
        pattern=r"H100.*PCIE",
    ),
    Gpu(
        key="h100-sxm",
        name="H100-SXM5-80GB",
        dense_flops=_H100_SXM,
        memory_bandwidth_gbs=3350.0,
        memory_gib=80.0,
        link="NVLink 4 (NVSwitch)",
        link_gbs=450.0,
        allreduce_busbw_gbs=NVLINK_RING_SHARE * 450.0,
        devices_per_node=8,
        nic_gbits=_HGX_NICS,
        source="NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022), SXM5: 989.4 "
        "TFLOP/s bf16/fp16, 1,978.9 fp8, 494.7 tf32, 66.9 fp32 dense; H100 datasheet "
        "(2023): 80 GB 3.35 TB/s, NVLink 900 GB/s bidirectional; DGX H100 user guide "
        "(2023): 8 x 400 Gb/s NDR InfiniBand",
        aliases=("h100",),
        pattern=r"\bH100\b",
    ),
    Gpu(
        key="h200-nvl",
        name="H200-NVL-141GB",
        dense_flops=_NVL,
        memory_bandwidth_gbs=4800.0,
        memory_gib=141.0,
        link="PCIe Gen5 x16",
        link_gbs=PCIE5_GBS,
        allreduce_busbw_gbs=PCIE_RING_SHARE * PCIE5_GBS,
        devices_per_node=8,
        nic_gbits=_PCIE_NODE_NICS,
        source="NVIDIA H200 Tensor Core GPU datasheet (2024), H200 NVL: 1,671 TFLOP/s bf16, "
        "3,341 fp8, 835 tf32 sparse (halved), 60 fp32, 141 GB 4.8 TB/s; "
        f"{_PCIE_NODE_SRC}; NVLink bridges join 2 or 4 only",
        pattern=r"H200.*NVL",
    ),
    Gpu(
        key="h200-sxm",
        name="H200-SXM-141GB",
        dense_flops=_H100_SXM,
        memory_bandwidth_gbs=4800.0,
        memory_gib=141.0,
        link="NVLink 4 (NVSwitch)",
        link_gbs=450.0,
        allreduce_busbw_gbs=NVLINK_RING_SHARE * 450.0,
        devices_per_node=8,
        nic_gbits=_HGX_NICS,
        source="NVIDIA H200 Tensor Core GPU datasheet (2024), SXM: the H100 SXM's compute "
        "(1,979 TFLOP/s bf16 sparse = 989.4 dense), 141 GB HBM3e 4.8 TB/s, NVLink "
        "900 GB/s bidirectional; DGX H200 user guide (2024): 8 x 400 Gb/s NDR",
        aliases=("h200",),
        pattern=r"\bH200\b",
    ),
    Gpu(
        key="h20",
        name="H20-96GB",
        dense_flops=_dense(148, 296, 74, 44),
        memory_bandwidth_gbs=4000.0,
        memory_gib=96.0,
        link="NVLink 4 (NVSwitch)",
        link_gbs=450.0,
        allreduce_busbw_gbs=NVLINK_RING_SHARE * 450.0,
        devices_per_node=8,
        nic_gbits=_HGX_NICS,
        source="NVIDIA HGX H20 product brief (2023): 148 TFLOP/s bf16/fp16, 296 fp8, 74 tf32, "
        "44 fp32 dense, 96 GB HBM3 4.0 TB/s, NVLink 900 GB/s bidirectional; network "
        "as DGX H100 (8 x 400 Gb/s), assumed",
        pattern=r"\bH20\b",
    ),
    # ---- NVIDIA Blackwell -------------------------------------------------------------------
    Gpu(
        key="b200",
        name="B200-180GB",
        dense_flops=_dense(2250, 4500, 1100, 75),
        memory_bandwidth_gbs=7700.0,
        memory_gib=180.0,
        link="NVLink 5 (NVSwitch)",
        link_gbs=900.0,
        allreduce_busbw_gbs=NVLINK_RING_SHARE * 900.0,
        devices_per_node=8,
        nic_gbits=_HGX_NICS,
        source="NVIDIA Blackwell datasheet (2025), HGX B200 per GPU: 4.5 PFLOP/s bf16/fp16, "
        "9 fp8, 2.2 tf32 sparse (halved), 75 TFLOP/s fp32, 180 GB HBM3e 7.7 TB/s, "
        "NVLink 5 1.8 TB/s bidirectional; DGX B200 user guide (2024): 8 x 400 Gb/s "
        "ConnectX-7",
        aliases=("hgx-b200", "b200-sxm"),
        pattern=r"\bB200\b",
    ),
    Gpu(
        key="gb200-nvl72",
        name="GB200-186GB",
        dense_flops=_dense(2500, 5000, 1250, 80),
        memory_bandwidth_gbs=8000.0,
        memory_gib=186.0,
        link="NVLink 5 (NVL72 switch trays)",
        link_gbs=900.0,
        allreduce_busbw_gbs=NVLINK_RING_SHARE * 900.0,
        devices_per_node=72,
        nic_gbits=72 * 400.0,
        source="NVIDIA Blackwell datasheet (2025), GB200 NVL72 per GPU: 5 PFLOP/s bf16/fp16, "
        "10 fp8, 2.5 tf32 sparse (halved), 80 TFLOP/s fp32, 186 GB HBM3e 8 TB/s, "
        "NVLink 5 1.8 TB/s bidirectional, 72 GPUs per NVLink domain (one 'node'); "
        "DGX GB200 (2024): one 400 Gb/s ConnectX-7 per GPU",
        aliases=("gb200",),
        pattern=r"\bGB200\b",
    ),
    # ---- NVIDIA Ada (PCIe cards) ------------------------------------------------------------
    Gpu(
        key="l40s",
        name="L40S-48GB",
        dense_flops=_dense(362.05, 733, 183, 91.6),
        memory_bandwidth_gbs=864.0,
        memory_gib=48.0,
        link="PCIe Gen4 x16",
        link_gbs=PCIE4_GBS,
        allreduce_busbw_gbs=PCIE_RING_SHARE * PCIE4_GBS,
        devices_per_node=8,
        nic_gbits=_PCIE_NODE_NICS,
        source="NVIDIA L40S datasheet (2023): 362.05 TFLOP/s bf16/fp16 (FP32 accumulate), "
        "733 fp8, 183 tf32 dense, 91.6 fp32, 48 GB GDDR6 864 GB/s, PCIe Gen4 x16, no "
        f"NVLink; {_PCIE_NODE_SRC}",
        pattern=r"\bL40S\b",
    ),
    Gpu(
        key="l4",
        name="L4-24GB",
        dense_flops=_dense(121, 242.5, 60, 30.3),
        memory_bandwidth_gbs=300.0,
        memory_gib=24.0,
        link="PCIe Gen4 x16",
        link_gbs=PCIE4_GBS,
        allreduce_busbw_gbs=PCIE_RING_SHARE * PCIE4_GBS,
        devices_per_node=8,
        nic_gbits=100.0,
        source="NVIDIA L4 datasheet (2023): 242 TFLOP/s bf16/fp16, 485 fp8, 120 tf32 sparse "
        "(halved), 30.3 fp32, 24 GB GDDR6 300 GB/s, PCIe Gen4 x16; Google Cloud "
        "g2-standard-96 (8 x L4, 2023): 100 Gb/s per node",
        pattern=r"\bL4\b",
    ),
    # ---- AMD CDNA 3 -------------------------------------------------------------------------
    Gpu(
        key="mi300x",
        name="MI300X-192GB",
        dense_flops=_MI300,
        memory_bandwidth_gbs=5300.0,
        memory_gib=192.0,
        link="Infinity Fabric (7 links, mesh)",
        link_gbs=448.0,
        allreduce_busbw_gbs=NVLINK_RING_SHARE * 448.0,
        devices_per_node=8,
        nic_gbits=_HGX_NICS,
        source="AMD Instinct MI300X data sheet (2023): 1,307.4 TFLOP/s bf16/fp16, 2,614.9 "
        "fp8, 653.7 tf32, 163.4 fp32 dense, 192 GB HBM3 5.3 TB/s, 7 Infinity Fabric "
        "links 896 GB/s aggregate (bidirectional); Microsoft Azure ND MI300X v5 "
        "(2024): 8 x 400 Gb/s NDR InfiniBand",
        pattern=r"MI300X",
    ),
    Gpu(
        key="mi325x",
        name="MI325X-256GB",
        dense_flops=_MI300,
        memory_bandwidth_gbs=6000.0,
        memory_gib=256.0,
        link="Infinity Fabric (7 links, mesh)",
        link_gbs=448.0,
        allreduce_busbw_gbs=NVLINK_RING_SHARE * 448.0,
        devices_per_node=8,
        nic_gbits=_HGX_NICS,
        source="AMD Instinct MI325X data sheet (2024): the MI300X's compute (1,307.4 "
        "TFLOP/s bf16 dense), 256 GB HBM3E 6 TB/s, 896 GB/s Infinity Fabric; network "
        "as the MI300X platform (8 x 400 Gb/s), assumed",
        pattern=r"MI325X",
    ),
)
"""Every known GPU. Order matters for ``gpu_by_name``: a more specific pattern comes first
(A100 PCIe before A100 SXM, H100 NVL and PCIe before H100 SXM)."""

_BY_KEY = {name: gpu for gpu in GPUS for name in (gpu.key, *gpu.aliases)}


def gpu_by_key(key: str) -> Gpu | None:
    """The GPU whose built-in name or alias is ``key`` (any case)."""
    return _BY_KEY.get(key.lower())


def gpu_by_name(device_name: str) -> Gpu | None:
    """The GPU a device name denotes: what torch reports ('NVIDIA H100 80GB HBM3', 'NVIDIA
    A100-SXM4-80GB', 'AMD Instinct MI300X'), a built-in device name ('H200-SXM-141GB') or a
    built-in key; None when unknown."""
    if gpu := gpu_by_key(device_name):
        return gpu
    return next((g for g in GPUS if re.search(g.pattern, device_name, re.IGNORECASE)), None)


def peak_flops(device_name: str, dtype: str) -> float | None:
    """Dense peak FLOP/s of a device by its CUDA name (e.g. 'NVIDIA H200'); None when unknown."""
    gpu = gpu_by_name(device_name)
    return gpu.flops(dtype) if gpu else None


def flops_per_token(num_params: int, num_layers: int, hidden_size: int, seq_len: int) -> float:
    """Training FLOPs per token, PaLM (Chowdhery et al. 2022, Appendix B): 6N + 12·L·H·Q·T,
    with H·Q = hidden size; recomputation is not counted."""
    return 6 * num_params + 12 * num_layers * hidden_size * seq_len
