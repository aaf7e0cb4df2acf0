"""NVIDIA's DGX-H100 FP8 tables (``tests/validation/data/published-h100-fp8``) predicted with
the built-in ``h100-sxm`` cluster as it ships, held to the MAPE each table gives today plus half
a point (``bands.band``): NeMo 24.07's pre-training table (12 rows; the one the H100 cluster's
calibration, ``autotune/model/data/h100_published.json``, is fitted on), Megatron-Bridge's dense
Llama rows (13) and NeMo's long-sequence Llama 2 7B rows with context parallelism (9), the last
two predicted, each at 12% or less.

The measured step of each row is worked here from the CSVs alone: global batch · sequence over
tokens/s/GPU · GPUs, and for the long-sequence table (TFLOP/s only) NeMo's Llama 2 model FLOPs
over TFLOP/s · GPUs, with Llama 2 7B's dimensions written out."""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

import pytest
from bands import band
from testkit.published_rows import H100_DATA, H100_FITTED, h100_rows

import autotune.model.cluster as cluster_module
from autotune.model.cluster import load_cluster
from autotune.model.perf_model import Calibration, predict_step_time

pytestmark = pytest.mark.validation

STATED = {"nemo-24.07": 5.8, "bridge-h100": 8.5, "nemo-long-seq": 9.6}
"""Step-time MAPE over every row of each table, %, with ``h100-sxm``'s shipped calibration
(``python bench/published_runs.py``); restate these when they move."""
PREDICTED_AT_MOST = 0.12
"""The two predicted tables' MAPE may not pass 12% whatever the stated figures."""
ROWS = {"nemo-24.07": 12, "bridge-h100": 13, "nemo-long-seq": 9}
FILES = {
    "nemo-24.07": "nemo_24.07_h100_fp8_pretrain.csv",
    "bridge-h100": "megatron_bridge_perf_summary_h100_dense_llama.csv",
    "nemo-long-seq": "nemo_long_sequence_h100_llama2_7b_cp.csv",
}


def _llama2_7b_flops_per_token(seq: int) -> float:
    """NeMo 24.07's ``llama2`` model FLOPs per token for Llama 2 7B (32 layers, h 4,096, MHA,
    f 11,008, V 32,000), attention counted whole."""
    layers, h, f, v = 32, 4096, 11008, 32000
    return layers * h * h * (12 + 12 + 18 * f / h + 12 * seq / h + 6 * v / (layers * h))


def _measured(table: str) -> list[float]:
    with open(H100_DATA / FILES[table], newline="") as f:
        rows = list(csv.DictReader(f))
    if table == "nemo-long-seq":
        out = []
        for r in rows:
            s, gpus = int(r["seq_len_k"]) * 1024, int(r["num_gpus"])
            flops = int(r["global_batch_size"]) * s * _llama2_7b_flops_per_token(s)
            out.append(flops / (float(r["with_cp_tflops_per_gpu"]) * 1e12 * gpus))
        return out
    return [
        int(r["global_batch_size"])
        * int(r["seq_len"])
        / (float(r["tokens_per_sec_per_gpu"]) * int(r["num_gpus"]))
        for r in rows
    ]


@pytest.fixture(scope="module")
def errors() -> dict[str, list[float]]:
    """Per table, |predicted / measured − 1| of each row, measured from the CSV."""
    measured = {t: _measured(t) for t in FILES}
    seen: dict[str, int] = {}
    out: dict[str, list[float]] = {}
    for r in h100_rows():
        i = seen.get(r.table, 0)
        seen[r.table] = i + 1
        assert r.measured_s == pytest.approx(measured[r.table][i], rel=1e-9), r.label
        assert r.cluster == "h100-sxm" and r.config.float8
        cluster = load_cluster(r.cluster, nodes=max(1, r.config.world_size // 8))
        t = predict_step_time(
            r.config, cluster, Calibration.for_cluster(cluster), shape=r.shape, engine=r.engine
        ).step_time_s
        out.setdefault(r.table, []).append(abs(t / r.measured_s - 1))
    return out


@pytest.mark.parametrize("table", sorted(STATED))
def test_each_h100_tables_mape_is_within_its_band(errors, table):
    errs = errors[table]
    assert len(errs) == ROWS[table]
    mape = statistics.fmean(errs)
    assert mape <= band(STATED[table]), f"{table}: MAPE {mape:.2%}, stated {STATED[table]}%"


def test_the_h100_tables_are_the_three_and_one_is_fitted(errors):
    assert set(errors) == set(STATED)
    assert H100_FITTED == ("nemo-24.07",)
    for table in set(STATED) - set(H100_FITTED):
        assert statistics.fmean(errors[table]) <= PREDICTED_AT_MOST, table


def test_h100_sxm_reads_the_h100_fit_and_a100_the_a100_fit():
    def stored(name: str) -> dict:
        path = Path(cluster_module.__file__).parent / "data" / name
        return json.loads(path.read_text())["calibration"]

    assert load_cluster("h100-sxm").calibration == stored("h100_published.json")
    assert load_cluster("a100-sxm4-80gb").calibration == stored("a100_published.json")
    assert stored("h100_published.json") != stored("a100_published.json")
    assert (
        "nemo_24.07_h100_fp8_pretrain.csv"
        in json.loads(
            (Path(cluster_module.__file__).parent / "data" / "h100_published.json").read_text()
        )["source"]
    )


def test_nemos_llama2_flops_give_its_printed_tflops():
    # NeMo 24.07, Llama 2 7B on 8 GPUs at seq 4,096: 16,934 tokens/s/GPU, 780 TFLOP/s printed.
    assert 16934 * _llama2_7b_flops_per_token(4096) / 1e12 == pytest.approx(780, abs=0.5)
