"""The roofline's GEMM and attention arithmetic, against figures worked by hand."""

from __future__ import annotations

import pytest

from autotune.model.roofline import (
    Gemm,
    causal_flash_flops,
    gemm_efficiency,
    gemm_time,
    layer_gemms,
)
from autotune.shapes import ModelShape

PEAK, BW = 100e12, 1000e9


def test_a_large_gemm_is_compute_bound_at_the_curves_efficiency():
    # 4096³: 2·4096³ FLOPs = 1.374e11; efficiency 0.8 · (4096/(4096+128))³ = 0.72095...
    g = Gemm(4096, 4096, 4096)
    eff = 0.8 * (4096 / 4224) ** 3
    assert gemm_efficiency(g, 0.8, 128) == pytest.approx(eff, rel=1e-12)
    expected = 2 * 4096**3 / (PEAK * eff)
    assert gemm_time(
        g, peak=PEAK, mem_bw=BW, elem_bytes=2, e_max=0.8, half_dim=128
    ) == pytest.approx(expected, rel=1e-12)


def test_a_thin_gemm_is_bound_by_its_bytes():
    # m = 65,536 rows, n = 8, k = 8: 2·65536·64 = 8.4 MFLOP at even full peak 84 ns; the bytes,
    # 2 · (65536·8 + 64 + 65536·8) = 2,097,280 B at 1000 GB/s, take 2.097 µs.
    g = Gemm(65536, 8, 8)
    t = gemm_time(g, peak=PEAK, mem_bw=BW, elem_bytes=2, e_max=1.0, half_dim=0.0)
    assert t == pytest.approx(2 * (65536 * 8 + 8 * 8 + 65536 * 8) / BW, rel=1e-12)


def test_causal_flash_does_half_the_score_flops():
    shape = ModelShape("gpt", 2, 1024, 16, 16, 4096, 100, 2048)
    # 4·b·s²·h = 4 · 2 · 2048² · 1024 = 3.436e10 whole; causal half, over tp 4: 4.295e9.
    assert causal_flash_flops(shape, batch=2, seq=2048, keys=2048, tp=4) == pytest.approx(
        4 * 2 * 2048 * 2048 * 1024 / 2 / 4
    )


def test_the_layers_gemms_are_megatrons_count():
    # GQA and a gated MLP: 2·m·(h·(h + 2kv) + h·h + 2·h·f + f·h) / t FLOPs = the 2bs(2h² + 2h·kv)
    # + 2bs·3hf of Narayanan et al. generalised (perf_model.layer_forward_flops).
    shape = ModelShape("llama", 2, 4096, 32, 8, 14336, 100, 4096)
    m, tp, h, kv, f = 8192, 8, 4096, 8 * 128, 14336
    flops = sum(2 * g.m * g.n * g.k for g in layer_gemms(shape, tokens=m, tp=tp))
    assert flops == pytest.approx(2 * m * (2 * h * h + 2 * h * kv + 3 * h * f) / tp)
