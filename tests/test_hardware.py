"""The GPU table (``autotune.hardware``): datasheet figures, the names torch reports, the
built-in clusters made from it, and a GPU it does not know described from its CUDA properties
rather than as a CPU."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

import autotune.search.local_gpus as local_gpus_module
from autotune.cli.main import main
from autotune.hardware import GPUS, NVLINK_RING_SHARE, gpu_by_name, peak_flops
from autotune.model.cluster import builtin_names, gpu_node, load_cluster, local_cpu_cluster
from autotune.search.local_gpus import LocalGpus
from autotune.search.study_calibration import describe_cluster

T, GIB = 1e12, 2**30

# (cluster, dense bf16 FLOP/s, HBM GB/s, memory GB) as each vendor's datasheet prints them;
# the ones printed with sparsity (marked *) halved here.
DATASHEETS = [
    ("a100-sxm4-80gb", 312 * T, 2039, 80),  # NVIDIA A100 datasheet (2021)
    ("a100-sxm4-40gb", 312 * T, 1555, 40),
    ("a100-pcie-80gb", 312 * T, 1935, 80),
    ("a100-pcie-40gb", 312 * T, 1555, 40),
    ("h100-sxm", 989.4 * T, 3350, 80),  # H100 architecture whitepaper (2022), datasheet (2023)
    ("h100-pcie", 1513 / 2 * T, 2000, 80),  # H100 datasheet: 1,513* TFLOP/s
    ("h100-nvl", 1671 / 2 * T, 3900, 94),  # H100 datasheet (2024): 1,671*
    ("h200-sxm", 1979 / 2 * T, 4800, 141),  # H200 datasheet (2024): 1,979*
    ("h200-nvl", 1671 / 2 * T, 4800, 141),
    ("h20", 148 * T, 4000, 96),  # HGX H20 product brief (2023)
    ("b200", 4.5e15 / 2, 7700, 180),  # Blackwell datasheet (2025), HGX B200: 4.5* PFLOP/s
    ("gb200-nvl72", 5e15 / 2, 8000, 186),  # GB200 NVL72: 5* PFLOP/s
    ("l40s", 362.05 * T, 864, 48),  # NVIDIA L40S datasheet (2023)
    ("l4", 242 / 2 * T, 300, 24),  # NVIDIA L4 datasheet (2023): 242*
    ("mi300x", 1307.4 * T, 5300, 192),  # AMD Instinct MI300X data sheet (2023)
    ("mi325x", 1307.4 * T, 6000, 256),  # AMD Instinct MI325X data sheet (2024)
]


@pytest.mark.parametrize("key,bf16,hbm,memory", DATASHEETS)
def test_builtin_clusters_carry_the_datasheet_figures(key, bf16, hbm, memory):
    cluster = load_cluster(key)
    device = cluster.device
    assert device.flops("bfloat16") == pytest.approx(bf16, rel=1e-3)
    assert device.flops("float16") == pytest.approx(bf16, rel=1e-3)
    assert device.memory_bandwidth_gbs == pytest.approx(hbm)
    assert device.memory_gib == memory
    assert device.asynchronous and cluster.backend == "nccl"
    # Non-tensor fp32 is below the tensor-core rate on every one of them (the H20's tensor
    # cores are throttled to 3.4 times it).
    assert device.flops("float32") < device.flops("bfloat16") / 3


def test_the_table_covers_the_issue_s_gpus_once_each():
    keys = [gpu.key for gpu in GPUS]
    assert sorted(keys) == sorted(k for k, *_ in DATASHEETS)
    assert set(keys) <= set(builtin_names())


@pytest.mark.parametrize("gpu", GPUS, ids=lambda g: g.key)
def test_each_entry_is_consistent(gpu):
    # fp8 tensor cores run twice the bf16 rate on every GPU that has them (the datasheets;
    # the L40S's print 733 beside 362.05); Ampere has none.
    if gpu.key.startswith("a100"):
        assert "float8" not in gpu.dense_flops
    else:
        assert gpu.dense_flops["float8"] == pytest.approx(2 * gpu.dense_flops["bfloat16"], rel=0.02)
    assert gpu.allreduce_busbw_gbs < gpu.link_gbs
    cluster = load_cluster(gpu.key)
    assert cluster.intra_node.bandwidth_gbs == gpu.allreduce_busbw_gbs
    assert cluster.inter_node.bandwidth_gbs == gpu.nic_gbits / 8
    assert gpu.source and "20" in gpu.source  # a cited document and its year


@pytest.mark.parametrize(
    "key,link_gbs,nic_gbits,per_node",
    [
        ("h100-sxm", 900 / 2, 8 * 400, 8),  # NVLink 4 900 GB/s both ways; DGX H100 8 x NDR
        ("h200-sxm", 900 / 2, 8 * 400, 8),
        ("a100-sxm4-80gb", 600 / 2, 8 * 200, 8),  # NVLink 3 600 GB/s; DGX A100 8 x HDR
        ("b200", 1800 / 2, 8 * 400, 8),  # NVLink 5 1.8 TB/s; DGX B200 8 x 400 Gb/s
        ("gb200-nvl72", 1800 / 2, 72 * 400, 72),  # one NVLink domain of 72
        ("mi300x", 896 / 2, 8 * 400, 8),  # 896 GB/s Infinity Fabric aggregate
        ("l40s", 64 / 2, 8 * 200, 8),  # PCIe Gen4 x16: 64 GB/s both ways
    ],
)
def test_links_follow_the_datasheets(key, link_gbs, nic_gbits, per_node):
    gpu = gpu_by_name(key)
    assert gpu.link_gbs == link_gbs and gpu.nic_gbits == nic_gbits
    assert gpu.devices_per_node == per_node


def test_nvlink_all_reduce_share_matches_the_shipped_nccl_tests_run():
    """The share taken for NVLink is within a few percent of what nccl-tests measured on 8
    A100s (examples/clusters/a100-megatron.json, 1 GiB, 8 ranks) over NVLink 3's 300 GB/s."""
    measured = load_cluster("a100-megatron").intra_node.busbw_curve["8"][-1][1]
    assert measured / 300 == pytest.approx(NVLINK_RING_SHARE, abs=0.05)


@pytest.mark.parametrize(
    "torch_name,key",
    [
        ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"),
        ("NVIDIA A100-SXM4-40GB", "a100-sxm4-40gb"),
        ("NVIDIA A100-PCIE-40GB", "a100-pcie-40gb"),
        ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H100 NVL", "h100-nvl"),
        ("NVIDIA H200", "h200-sxm"),
        ("NVIDIA H200 NVL", "h200-nvl"),
        ("NVIDIA H20", "h20"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA GB200", "gb200-nvl72"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA L4", "l4"),
        ("AMD Instinct MI300X", "mi300x"),
        ("AMD Instinct MI300X VF", "mi300x"),
        ("AMD Instinct MI325X", "mi325x"),
    ],
)
def test_the_names_torch_reports_map_to_their_gpu(torch_name, key):
    assert gpu_by_name(torch_name).key == key
    assert load_cluster(torch_name).name == key  # --cluster "NVIDIA L40S" too


@pytest.mark.parametrize(
    "torch_name",
    ["NVIDIA L40", "NVIDIA GeForce RTX 4090", "NVIDIA B300 SXM6 AC", "AMD Instinct MI250X", "cpu"],
)
def test_other_devices_are_not_mistaken_for_a_known_one(torch_name):
    assert gpu_by_name(torch_name) is None and peak_flops(torch_name, "bfloat16") is None


@pytest.mark.parametrize("gpu", GPUS, ids=lambda g: g.key)
def test_built_in_names_and_aliases_round_trip(gpu):
    assert gpu_by_name(gpu.name) is gpu  # the table's own device name
    for alias in (gpu.key, gpu.key.upper(), *gpu.aliases):
        assert load_cluster(alias).name == gpu.key


def test_the_executor_mfu_reads_the_table_by_cuda_name():
    assert peak_flops("NVIDIA H100 80GB HBM3", "bfloat16") == 989.4 * T
    assert peak_flops("NVIDIA B200", "float8") == 4.5e15
    assert peak_flops("NVIDIA A100-SXM4-80GB", "float8") is None  # no fp8 on Ampere


# ---- a GPU the table does not know ------------------------------------------------------------
H100_PER_SM_CLOCK = 989.4e12 / (132 * 1.83e9)
"""Dense bf16 FLOP per SM per clock of Hopper, from the H100 SXM whitepaper: 132 SMs at the
1.83 GHz its tensor peak is quoted at."""


def _future_hopper(**overrides):
    """A fake ``torch.cuda.get_device_properties`` object (torch's attribute names)."""
    props = dict(
        name="NVIDIA Hopper Experimental",
        major=9,
        minor=0,
        multi_processor_count=100,
        clock_rate=2_000_000,
        memory_clock_rate=2_619_000,
        memory_bus_width=5120,
        total_memory=96 * GIB,
        gcnArchName="",
    )
    return SimpleNamespace(**{**props, **overrides})


def test_unknown_gpu_is_described_from_its_properties_with_one_warning():
    warnings = []
    cluster = gpu_node("NVIDIA Hopper Experimental", _future_hopper(), warn=warnings.append)
    device = cluster.device
    # 100 SMs × 2.0 GHz (clock_rate is in kHz) × Hopper's FLOP per SM per clock.
    assert device.flops("bfloat16") == pytest.approx(100 * 2.0e9 * H100_PER_SM_CLOCK, rel=1e-3)
    # 2 (DDR) × 2.619 GHz × 5120 bits / 8: the H100's 3.35 TB/s, from its own memory clock.
    assert device.memory_bandwidth_gbs == pytest.approx(2 * 2.619e9 * 5120 / 8 / 1e9)
    assert device.memory_gib == 96
    assert device.name == "NVIDIA Hopper Experimental" and cluster.backend == "nccl"
    assert device.asynchronous
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert "NVIDIA Hopper Experimental" in warnings[0]
    assert "compute capability 9.0" in warnings[0] and "PCIe" in warnings[0]


def test_what_torch_does_not_report_is_assumed_and_named():
    warnings = []
    props = _future_hopper(major=10, minor=3)
    del props.clock_rate, props.memory_clock_rate
    cluster = gpu_node("NVIDIA B300 SXM6 AC", props, warn=warnings.append)
    (line,) = warnings
    assert "clock" in line and "memory bandwidth" in line and "compute capability 10.3" in line
    # Blackwell's per-SM rate (B200: 2.25 PFLOP/s = 148 SMs at 1.86 GHz) at that clock.
    assert cluster.device.flops("bfloat16") == pytest.approx(
        100 * 1.86e9 * 2.25e15 / (148 * 1.86e9), rel=2e-2
    )


def test_a_known_gpu_is_its_built_in_node_without_a_warning():
    warnings = []
    assert gpu_node("NVIDIA H200", _future_hopper(), warn=warnings.append) == load_cluster(
        "h200-sxm"
    )
    assert warnings == []


def _fake_host(monkeypatch, name, props, count=8):
    gpus = LocalGpus(
        available=True,
        count=count,
        name=name,
        total_memory=props.get("total_memory", 0),
        properties=props,
    )
    monkeypatch.setattr(local_gpus_module, "local_gpus", lambda: gpus)


def test_describe_cluster_maps_a_known_gpu_and_never_falls_back_to_a_cpu(monkeypatch):
    """An L40S host: the built-in L40S node, not the CPU description (80 GFLOP/s a core,
    5 GB/s links) that made GPT-small on 8 x L40S take 590 s a step."""
    _fake_host(monkeypatch, "NVIDIA L40S", {"name": "NVIDIA L40S", "total_memory": 48 * GIB})
    cluster = describe_cluster(8, "cuda", warn=pytest.fail)
    cpu = local_cpu_cluster(8)
    assert cluster.device.flops("bfloat16") == pytest.approx(362.05 * T)
    assert cluster.intra_node.bandwidth_gbs != cpu.intra_node.bandwidth_gbs
    assert (cluster.num_nodes, cluster.devices_per_node) == (1, 8)


def test_describe_cluster_describes_an_unknown_gpu_from_its_properties(monkeypatch):
    props = vars(_future_hopper())
    _fake_host(monkeypatch, props["name"], props, count=4)
    warnings = []
    cluster = describe_cluster(8, "cuda", warn=warnings.append)
    assert cluster.device.flops("bfloat16") == pytest.approx(
        100 * 2.0e9 * H100_PER_SM_CLOCK, rel=1e-3
    )
    assert cluster.backend == "nccl" and cluster.device.asynchronous
    assert (cluster.num_nodes, cluster.devices_per_node) == (2, 4)
    assert len(warnings) == 1


def test_the_warning_goes_to_stderr_by_default(monkeypatch, capsys):
    props = vars(_future_hopper())
    _fake_host(monkeypatch, props["name"], props)
    describe_cluster(8, "cuda")
    err = capsys.readouterr().err
    assert err.startswith("autotune: warning: NVIDIA Hopper Experimental is not in")
    assert err.count("\n") == 1


def test_the_probe_reads_fields_torch_has():
    """Every field the child interpreter reads is one of ``_CudaDeviceProperties``' in this
    torch's own stub (read as text: the driver's tests load no torch for it)."""
    stub = Path(importlib.util.find_spec("torch").origin).parent / "_C" / "__init__.pyi"
    text = stub.read_text()
    body = text[text.index("class _CudaDeviceProperties:") :]
    body = body[: body.index("\n\n")]
    fields = set(re.findall(r"^\s+(\w+):", body, re.MULTILINE))
    assert set(local_gpus_module.PROPERTIES) <= fields


# ---- the CLI ------------------------------------------------------------------------------------
GPT_SMALL_ON_8 = (
    "--model",
    "gpt-small",
    "--world-size",
    "8",
    "--zero",
    "1",
    "--micro-batch",
    "8",
    "--global-batch",
    "64",
    "--seq-len",
    "1024",
    "--precision",
    "bf16-mixed",
)


@pytest.mark.parametrize("cluster", ["b200", "l40s"])
def test_estimate_on_new_gpus_predicts_a_plausible_mfu(capsys, cluster):
    assert main(["estimate", *GPT_SMALL_ON_8, "--cluster", cluster, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert 0.15 <= data["time"]["mfu"] <= 0.85
    # GPT-small's 64 × 1024 tokens take milliseconds on these, not the CPU fallback's minutes.
    assert data["time"]["step_time_s"] < 1.0


def test_rank_on_b200(capsys):
    argv = [
        "rank",
        "--model",
        "gpt-small",
        "--cluster",
        "b200",
        "--global-batch",
        "64",
        "--seq-len",
        "1024",
        "--top",
        "3",
        "--json",
    ]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["cluster"] == "b200" and data["world_size"] == 8
    assert all(0.15 <= layout["mfu"] <= 0.85 for layout in data["layouts"])
