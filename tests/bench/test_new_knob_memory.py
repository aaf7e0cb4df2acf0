"""bench/new_knob_memory.py without trials: every layout it runs is valid and exercises the knob
it is named for, and its summary (``common.memory_error_summary``, shared with
bench/search_efficiency.py) gives the median |error|, the worst errors and the false fits of a
hand-made list, worked out here by hand."""

from __future__ import annotations

import new_knob_memory as bench  # noqa: E402
import pytest
from new_knob_memory import LAYOUTS, Measurement  # noqa: E402

MIB = 2**20


@pytest.mark.parametrize("name", list(bench.layouts()))
def test_every_layout_validates(name):
    config = bench.layouts()[name]
    shape = config.workload.shape
    config.validate(
        num_heads=shape.num_heads, num_kv_heads=shape.num_kv_heads, num_layers=shape.num_layers
    )
    assert config.device == "cpu" and config.world_size in (2, 4)


def test_each_newer_knob_has_a_layout():
    configs = list(LAYOUTS.values())
    assert any(c.sequence_parallel for c in configs)
    assert {c.zero_stage for c in configs if c.sequence_parallel and c.dp_degree > 1} == {0, 1, 3}
    assert {
        (c.dp_degree, c.zero_stage)
        for c in configs
        if c.cp_degree == 2 and c.tp_degree == 1 and c.dp_replicate == 1
    } == {(1, 0), (2, 0), (2, 1), (2, 3)}
    assert {c.zero_stage for c in configs if c.dp_replicate == 2 and c.cp_degree == 1} == {2, 3}
    assert any(c.dp_replicate == 2 and c.cp_degree == 2 for c in configs)
    v4 = [c for c in configs if c.pp_schedule == "interleaved_1f1b" and c.virtual_stages == 4]
    assert v4 and all(c.workload.shape.num_layers >= 8 for c in v4)
    assert any(c.activation_checkpointing == "op" for c in configs)
    assert any(c.activation_checkpointing == "full" and c.ac_layers == 1 for c in configs)


def _m(layout: str, predicted_mib: float, *measured_mib: float) -> Measurement:
    return Measurement(
        layout, int(predicted_mib * MIB), 0, tuple(int(m * MIB) for m in measured_mib), 0
    )


def test_summary_of_a_hand_made_list():
    a, b, c, d = list(LAYOUTS)[:4]
    rows = [
        _m(a, 100, 90, 100),  # worst rank 100: error 0
        _m(b, 110, 100),  # +10%
        _m(c, 80, 125),  # -36%
        _m(d, 150, 100),  # +50%
        _m(a, 100, 120),  # a's second run: -1/6
        _m("ref gpt w2 dp2 z0", 10, 100),  # a reference layout: left out (-90%)
    ]
    s = bench.summary(rows)
    assert s["measurements"] == 5
    # |errors| 0, 0.1, 1/6, 0.36, 0.5: the median is 1/6
    assert s["median_abs_rel_error"] == pytest.approx(1 / 6)
    assert s["worst_under"] == pytest.approx(-0.36)
    assert s["worst_over"] == pytest.approx(0.5)
    # limit: the median prediction over the four layouts, (100 + 110) / 2 = 105 MiB. Admitted
    # (prediction × 1.15 ≤ 105): c only (92); it measured 125 > 105: one false fit.
    assert s["limit_bytes"] == 105 * MIB
    assert s["fit_but_measured_over"] == 1
    # over their own prediction × 1.15: c (125 > 92) and a's second run (120 > 115)
    assert s["over_own_margin"] == 2
    assert not bench.within_today(s)


def test_within_today_judges_each_figure():
    ok = {
        "median_abs_rel_error": 0.05,
        "worst_under": -0.10,
        "worst_over": 0.30,
        "fit_but_measured_over": 0,
    }
    assert bench.within_today(ok)
    for key, bad in (
        ("median_abs_rel_error", 0.09),
        ("worst_under", -0.12),
        ("worst_over", 0.34),
        ("fit_but_measured_over", 1),
    ):
        assert not bench.within_today(ok | {key: bad})
