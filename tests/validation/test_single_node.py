"""The step-time model predicts the shared A100 table's rows it was not calibrated on within
the bands of ``docs/benchmarks.md`` (Performance model accuracy, the documented split, offset
0): MAPE 3.62% with the per-shape factors and 7.20% without them, the predicted best within 3%
of the measured best in 96.9% of the groups of ≥ 3 layouts. (The page states 3.89%, from before
the fit last changed; ``bench/perf_model_accuracy.py`` on main prints 3.62%, the figure held
here.)

The split is worked here from the table alone (every 10th row of the table sorted by its
configuration columns calibrates, the other 1,296 are predicted). The fit takes tens of
seconds, so the calibration is the one ``bench/perf_model_accuracy.py --save-calibration``
stored on those 144 rows (``tests/validation/data/a100-megatron``, README); a change to the
model or the fit refits it with the command the README gives."""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections import defaultdict
from pathlib import Path

import pytest
from bands import band, floor
from testkit.replay_table import CSV_COLUMNS, csv_group_key, csv_row, read_csv_rows

from autotune.model.cluster import load_cluster
from autotune.model.perf_model import ENGINES, Calibration, predict_step_time

pytestmark = pytest.mark.validation

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data" / "a100-megatron"
TABLE = DATA / "single_node.csv"
STORED_FIT = DATA / "single_node_every10_calibration.json"
CLUSTER = ROOT / "examples" / "clusters" / "a100-megatron.json"
ENGINE = "megatron-legacy"
"""What the bench runs by default: Megatron's TP plan on the calibrated size curve."""
STATED = {"mape": 3.62, "mape_without_shape_factors": 7.20, "best_within_3pct": 96.9}


def predicted_rows() -> list[dict[str, float]]:
    """The rows the documented split predicts, in the table's order."""
    rows = read_csv_rows(TABLE)
    assert CSV_COLUMNS[-1] == "iteration time (ms)"
    order = sorted(range(len(rows)), key=lambda i: [rows[i][c] for c in CSV_COLUMNS[:-1]])
    calibrating = set(order[::10])
    assert (len(rows), len(calibrating)) == (1440, 144)
    return [r for i, r in enumerate(rows) if i not in calibrating]


def _mape(rows, predicted_s) -> float:
    return statistics.fmean(
        abs(p / (r["iteration time (ms)"] / 1000) - 1) for r, p in zip(rows, predicted_s)
    )


def _best_within_3pct(rows, predicted_s) -> float:
    """Share of the groups of ≥ 3 layouts (same GPUs, global batch, model) whose predicted
    fastest layout measures within 3% of the group's measured fastest."""
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        groups[csv_group_key(r)].append(i)
    ranked = [g for g in groups.values() if len(g) >= 3]
    measured = [r["iteration time (ms)"] for r in rows]
    hits = 0
    for g in ranked:
        pick = min(g, key=lambda i: predicted_s[i])
        hits += measured[pick] <= 1.03 * min(measured[i] for i in g)
    return hits / len(ranked)


@pytest.fixture(scope="module")
def predictions():
    cluster, engine = load_cluster(str(CLUSTER)), ENGINES[ENGINE]
    cal = Calibration.from_dict(json.loads(STORED_FIT.read_text())["calibration"])
    bare = dataclasses.replace(cal, layer_shape_factors={}, host_shape_factors={})
    rows = predicted_rows()
    out: dict[str, list[float]] = {"with": [], "without": []}
    for r in rows:
        m = csv_row(r)
        for key, c in (("with", cal), ("without", bare)):
            t = predict_step_time(m.config, cluster, c, shape=m.shape, engine=engine)
            out[key].append(t.step_time_s)
    return rows, out


def test_held_out_rows_are_within_the_stated_mape(predictions):
    rows, predicted = predictions
    assert len(rows) == 1296
    mape = _mape(rows, predicted["with"])
    assert mape <= band(STATED["mape"]), f"MAPE {mape:.2%}"
    bare = _mape(rows, predicted["without"])
    assert bare <= band(STATED["mape_without_shape_factors"]), f"without: MAPE {bare:.2%}"


def test_the_predicted_best_is_within_3pct_as_often_as_stated(predictions):
    rows, predicted = predictions
    share = _best_within_3pct(rows, predicted["with"])
    assert share >= floor(STATED["best_within_3pct"]), f"best within 3%: {share:.1%}"
