"""The dashboard: a report of a real study (complete, infeasible and failed trials) whose every
view carries the study's numbers, computed here again from the database; escaping; no password;
the CLI's one-line errors; and --serve following a study as it changes."""

from __future__ import annotations

import base64
import html
import json
import math
import os
import re
import statistics
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import dashboard_study as ds
import numpy as np
import plotly.graph_objects as go
import pytest
from plotly.io.json import to_json_plotly

from autotune.cli.main import main
from autotune.config import TrialConfig
from autotune.layouts import short_name
from autotune.model.memory import estimate_all_stages, estimate_memory
from autotune.model.perf_model import TERMS as PERF_TERMS
from autotune.search.search import GIB
from autotune.search.space import KNOB_ORDER
from autotune.study.leaderboard import build_leaderboard
from autotune.study.store import load_spans
from dashboards.data import MAX_SPANS_PER_TIMELINE, cap_spans
from dashboards.figures import predicted_trace_name
from dashboards.report import figure_json, write_report
from dashboards.serve import make_server
from db import Database, TrialRecord
from profiler import breakdown

pytestmark = pytest.mark.filterwarnings("ignore:Query string argument")
ROOT = Path(__file__).resolve().parents[2]
MIB = 2**20
LABELS = {
    "complete": "complete",
    "infeasible_predicted": "infeasible (predicted",
    "infeasible_measured": "infeasible (measured)",
    "failed": "failed",
}
DATA = re.compile(r'<script type="application/json" id="figures-data">(.*?)</script>', re.S)


def payload(page: str) -> dict:
    return json.loads(DATA.search(page).group(1))


@pytest.fixture(scope="module")
def url(executor, tmp_path_factory) -> str:
    return ds.build(executor, tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def database(url):
    database = Database.open(url, create=False)
    yield database
    database.close()


@pytest.fixture(scope="module")
def report(database, tmp_path_factory) -> tuple[str, dict]:
    path, _ = write_report(database, ds.NAME, tmp_path_factory.mktemp("report") / "r.html")
    page = path.read_text(encoding="utf-8")
    return page, payload(page)


@pytest.fixture(scope="module")
def study(database):
    """(study record, trials by id, the leaderboard as the search computes it)."""
    record = database.get_study(ds.NAME)
    return (
        record,
        {t.id: t for t in database.list_trials(record.id)},
        build_leaderboard(database.list_trials(record.id)),
    )


def traces(fig: dict) -> dict[str, dict]:
    """The figure's traces by name, numeric arrays decoded (Plotly writes numpy arrays as
    base64 typed arrays: {"dtype", "bdata"})."""
    return {t.get("name"): {k: array(v) for k, v in t.items()} for t in fig["data"]}


def flat(rows) -> list:
    """Rows of numbers (tuples of one width) as one list, for pytest.approx, which refuses nested
    sequences (pytest 9.2): equal flat lists of rows of one width are equal rows, row for row."""
    return [x for row in rows for x in row]


def array(value):
    if isinstance(value, dict) and "bdata" in value:
        return np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"]).tolist()
    return value


def test_every_view_is_present(report, study):
    page, data = report
    _, trials, _ = study
    assert {t.status for t in trials.values()} == {
        "complete",
        "infeasible_predicted",
        "infeasible_measured",
        "failed",
    }
    assert set(data["figures"]) == {
        "leaderboard",
        "history",
        "knobs-parallel",
        "knobs-importance",
        "memory-scatter",
        "step-time",
        "breakdown",
    }
    assert set(data["selectors"]) == {"timeline", "memory"}
    for fig_id in [*data["figures"], *data["selectors"]]:
        assert f'<div class="figure" id="fig-{fig_id}"></div>' in page
    # plotly.js inline, once: the file opens offline.
    assert page.count("plotly.js v") >= 1 and '<script src="http' not in page
    for fig in [*data["figures"].values(), *(v for vs in data["selectors"].values() for v in vs)]:
        # Every embedded figure is one Plotly accepts, already in the form plotly.js reads
        # (the per-trial memory figures are embedded unvalidated).
        assert json.loads(to_json_plotly(figure_json(go.Figure(fig)))) == fig


def test_leaderboard_rows_follow_the_search(report, study):
    _, data = report
    record, trials, board = study
    limit = record.spec["memory_limit_gib"] * GIB
    cells = data["figures"]["leaderboard"]["data"][0]["cells"]["values"]
    assert cells[0] == list(range(1, len(board) + 1))
    assert cells[1] == [e.number for e in board]
    for row, e in enumerate(board):
        complete = e.status == "complete"
        assert cells[3][row] == (f"{e.throughput:,.0f}" if complete else "–")
        assert cells[6][row] == (f"{e.measured_peak / MIB:,.1f}" if e.measured_peak else "–")
        assert cells[7][row] == (f"{e.measured_peak / limit:.0%}" if e.measured_peak else "–")
        assert cells[8][row] == (f"{e.predicted_peak / MIB:,.1f}" if e.predicted_peak else "–")
        step = trials[e.trial_id].metrics.get("step_time_s")
        assert cells[5][row] == (f"{step * 1e3:.2f}" if step else "–")
        assert cells[9][row].startswith(LABELS[e.status])
        if not complete:
            assert html.escape(e.error, quote=False) in cells[9][row]
    best = board[0]
    assert best.status == "complete" and len(best.throughputs) == 2  # re-measured once
    # its 95% interval over the two runs, by hand: exp(mean ± t(0.975, 1) · s / √2) of log tok/s
    logs = [math.log(x) for x in best.throughputs]
    half = 12.706 * statistics.stdev(logs) / math.sqrt(2)
    low, high = cells[4][0].removesuffix(" (2)").replace(",", "").split("–")
    assert (float(low), float(high)) == pytest.approx(
        (math.exp(statistics.fmean(logs) - half), math.exp(statistics.fmean(logs) + half)),
        rel=1e-3,
        abs=1,
    )


def test_history_shows_each_trial_and_the_best_so_far(report, study):
    _, data = report
    _, _, board = study
    fig = traces(data["figures"]["history"])
    complete = sorted((e for e in board if e.status == "complete"), key=lambda e: e.number)
    assert fig["complete"]["x"] == [e.number for e in complete]
    assert fig["complete"]["y"] == pytest.approx([e.throughput for e in complete])
    expected, best = [], None
    for e in sorted(board, key=lambda e: e.number):
        if e.status == "complete":
            best = max(best or 0.0, e.throughput)
        if best is not None:
            expected.append((e.number, best))
    assert flat(zip(fig["best so far"]["x"], fig["best so far"]["y"])) == pytest.approx(
        flat(expected)
    )
    # Trials that measured nothing: on the strip under the axis, at their trial numbers.
    not_run = [e.number for e in board if e.status == "infeasible_predicted"]
    failed = [e.number for e in board if e.status == "failed"]
    assert fig["failed"]["y"] == ["not measured"] and fig["failed"]["x"] == failed
    assert fig["infeasible (predicted, not run)"]["y"] == ["not measured"] * len(not_run)
    assert fig["infeasible (predicted, not run)"]["x"] == sorted(not_run)
    assert fig["failed"]["yaxis"] == "y2" and fig["complete"]["yaxis"] == "y"


def test_scatter_points_limit_and_pareto_front(report, study):
    _, data = report
    record, trials, board = study
    fig = traces(data["figures"]["memory-scatter"])
    points = lambda trace: sorted(zip(trace["x"], trace["y"]))  # noqa: E731
    complete = [e for e in board if e.status == "complete"]
    assert flat(points(fig["complete"])) == pytest.approx(
        flat(sorted((e.measured_peak / MIB, e.throughput) for e in complete))
    )
    over = next(t for t in trials.values() if t.status == "infeasible_measured")
    assert flat(points(fig["infeasible (measured)"])) == pytest.approx(
        [over.metrics["peak_memory_bytes"] / MIB, over.metrics["throughput_tokens_per_s"]]
    )
    assert flat(points(fig["infeasible (predicted, not run)"])) == pytest.approx(
        flat(
            sorted(
                (e.predicted_peak / MIB, 0.0) for e in board if e.status == "infeasible_predicted"
            )
        )
    )
    failed = next(e for e in board if e.status == "failed")
    assert flat(points(fig["failed"])) == pytest.approx([failed.predicted_peak / MIB, 0.0])
    limit_mib = record.spec["memory_limit_gib"] * GIB / MIB
    assert fig["memory limit"]["x"] == pytest.approx([limit_mib, limit_mib])
    # Pareto front, by definition: no other complete trial has a peak ≤ and throughput ≥
    # with one of them strict.
    front = sorted(
        (e.measured_peak / MIB, e.throughput)
        for e in complete
        if not any(
            o.measured_peak <= e.measured_peak
            and o.throughput >= e.throughput
            and (o.measured_peak, o.throughput) != (e.measured_peak, e.throughput)
            for o in complete
        )
    )
    assert flat(points(fig["Pareto front"])) == pytest.approx(flat(front))


def test_timeline_has_a_lane_per_rank_and_the_stored_spans(report, study, database):
    page, data = report
    _, _, board = study
    best = board[0]
    spans = database.trial_spans(best.trial_id)
    assert len(spans) > MAX_SPANS_PER_TIMELINE  # the cap is exercised
    with_timeline = [e for e in board if database.count_spans(e.trial_id)]
    variants = data["selectors"]["timeline"]
    assert len(variants) == len(with_timeline)
    assert page.count(
        "<option", page.index('id="select-timeline"'), page.index('id="fig-timeline"')
    ) == len(with_timeline)
    fig = variants[0]  # the best trial's, shown first
    assert f"trial {best.number}:" in fig["layout"]["title"]["text"]
    by_name = traces(fig)
    ranks = sorted({s.rank for s in spans})
    assert fig["layout"]["yaxis"]["tickvals"] == ranks == [0, 1]
    # Lanes are labelled by the node each rank ran on (the local cluster's one node).
    nodes = {n.rank: n for n in database.get_trial(best.trial_id).nodes}
    assert fig["layout"]["yaxis"]["ticktext"] == [
        f"rank {r} · {nodes[r].hostname}/{nodes[r].node_id[:6]}" for r in ranks
    ]
    assert {y for t in by_name.values() for y in t["y"]} == set(ranks)
    assert sum(len(t["x"]) for t in by_name.values()) == MAX_SPANS_PER_TIMELINE
    assert (
        f"{MAX_SPANS_PER_TIMELINE:,} of {len(spans):,} spans"
        in fig["layout"]["title"]["subtitle"]["text"]
    )
    # Every step and collective is drawn where it happened, with its name, group and bytes.
    step0 = min(s.start_ns for s in spans if s.kind == "step")
    base0 = min(b for t in (by_name["steps"],) for b in t["base"])
    for name, kind in (("steps", "step"), ("collectives", "comm")):
        stored = sorted(
            (s.rank, (s.start_ns - step0) / 1e6, s.dur_ns / 1e6) for s in spans if s.kind == kind
        )
        drawn = sorted(
            zip(by_name[name]["y"], (b - base0 for b in by_name[name]["base"]), by_name[name]["x"])
        )
        assert len(stored) > 0 and flat(drawn) == pytest.approx(flat(stored))
    stored = sorted((s.rank, s.name, s.group, s.bytes) for s in spans if s.kind == "comm")
    assert (
        sorted(
            (y, c[0], c[1], c[2])
            for y, c in zip(by_name["collectives"]["y"], by_name["collectives"]["customdata"])
        )
        == stored
    )
    assert len(fig["layout"]["shapes"]) == 2 * sum(s.kind == "step" for s in spans)


def test_cap_keeps_steps_and_communication_then_the_longest_ops(database, study):
    _, _, board = study
    spans = database.trial_spans(board[0].trial_id)
    kept = cap_spans(spans, 300)
    assert len(kept) == 300
    assert [s for s in spans if s.kind != "compute"] == [s for s in kept if s.kind != "compute"]
    shortest_kept = min(s.dur_ns for s in kept if s.kind == "compute")
    assert sum(s.kind == "compute" and s.dur_ns > shortest_kept for s in spans) <= sum(
        s.kind == "compute" for s in kept
    )
    assert list(kept) == sorted(kept, key=lambda s: (s.rank, s.start_ns))


def test_breakdown_bars_equal_profiler_analysis(report, study, database):
    _, data = report
    _, _, board = study
    fig = traces(data["figures"]["breakdown"])
    expected = {"compute": [], "exposed communication": [], "idle": []}
    labels = []
    for e in board:
        for b in breakdown(load_spans(database, e.trial_id)):
            labels.append((f"trial {e.number}", f"rank {b.rank}"))
            for name, ns in (
                ("compute", b.compute_ns),
                ("exposed communication", b.exposed_comm_ns),
                ("idle", b.idle_ns),
            ):
                expected[name].append(ns / b.num_steps / 1e6)
    assert labels  # the complete trials' timelines
    for name, values in expected.items():
        drawn = [(x, y) for x, y in zip(zip(*fig[name]["x"]), fig[name]["y"]) if y is not None]
        assert [x for x, _ in drawn] == labels
        assert [y for _, y in drawn] == pytest.approx(values)


# ---- the performance model's prediction beside the measurement -------------------------------
def _predicted(trial: TrialRecord) -> bool:
    return "predicted_step_time_s" in trial.metrics


def test_step_time_scatter_shows_each_prediction_and_the_mape(report, study):
    _, data = report
    _, trials, _ = study
    complete = [t for t in trials.values() if t.status == "complete"]
    with_prediction = [t for t in complete if _predicted(t)]
    assert 0 < len(with_prediction) == len(complete) - 1  # one trial stored without
    fig = data["figures"]["step-time"]
    points = traces(fig)["complete trials"]
    expected = sorted(
        (t.number, t.metrics["step_time_s"] * 1e3, t.metrics["predicted_step_time_s"] * 1e3)
        for t in with_prediction
    )
    drawn = sorted(zip((c[0] for c in points["customdata"]), points["x"], points["y"]))
    assert [d[0] for d in drawn] == [e[0] for e in expected]
    assert [d[1] for d in drawn] == pytest.approx([e[1] for e in expected])
    assert [d[2] for d in drawn] == pytest.approx([e[2] for e in expected])
    errors = {
        t.number: t.metrics["predicted_step_time_s"] / t.metrics["step_time_s"] - 1
        for t in with_prediction
    }
    for number, name, error in points["customdata"]:
        config = TrialConfig.from_dict(
            next(t.config for t in with_prediction if t.number == number)
        )
        assert name == html.escape(short_name(config), quote=False)
        assert error == f"{errors[number]:+.1%}"
        assert "%{customdata[1]}" in points["hovertemplate"]
        assert "%{customdata[2]}" in points["hovertemplate"]
    mape = sum(abs(e) for e in errors.values()) / len(errors)
    assert (
        fig["layout"]["title"]["text"] == f"Predicted against measured step time: MAPE {mape:.1%}"
    )
    assert (
        "1 complete trial(s) without a prediction are not drawn"
        in fig["layout"]["title"]["subtitle"]["text"]
    )
    line = traces(fig)["y = x"]
    assert line["x"] == line["y"]
    assert line["x"][0] < min(min(e[1:]) for e in expected)
    assert line["x"][1] > max(max(e[1:]) for e in expected)


def test_breakdown_shows_the_stored_prediction_beside_the_ranks(report, study):
    _, data = report
    _, trials, board = study
    fig = traces(data["figures"]["breakdown"])
    predicted = {name: t for name, t in fig.items() if name.startswith("predicted ")}
    assert predicted
    # Every trace spans every bar: the categories in leaderboard order, a trial's prediction
    # first, then its ranks.
    categories = list(zip(*fig["compute"]["x"]))
    expected_categories = []
    for e in board:
        t = trials[e.trial_id]
        if _predicted(t) and t.status in ("complete", "infeasible_measured"):
            expected_categories.append((f"trial {e.number}", "predicted"))
        expected_categories += [
            (f"trial {e.number}", f"rank {r['rank']}") for r in t.metrics.get("ranks", ())
        ]
    assert categories == expected_categories
    # The trial that ran over the limit, without a timeline, shows its prediction alone; the
    # complete trial stored before the model (no prediction, no timeline) has no bar.
    over = next(t for t in trials.values() if t.status == "infeasible_measured")
    assert (f"trial {over.number}", "predicted") in categories
    old = next(t for t in trials.values() if t.status == "complete" and not _predicted(t))
    assert all(label != f"trial {old.number}" for label, _ in categories)
    for term in PERF_TERMS:
        trace = predicted[predicted_trace_name(term)]
        assert list(zip(*trace["x"])) == categories
        for (trial_label, bar), y in zip(categories, trace["y"]):
            if bar != "predicted":
                assert y is None
                continue
            number = int(trial_label.split()[1])
            stored = next(t for t in trials.values() if t.number == number)
            assert y == pytest.approx(stored.metrics["predicted_breakdown"][term] * 1e3)
    assert set(predicted) == {predicted_trace_name(term) for term in PERF_TERMS}


def test_report_of_trials_without_predictions(tmp_path):
    """Older trials (no prediction) and a malformed one: no prediction drawn, no failure."""
    with Database.open(f"sqlite:///{tmp_path / 'old.db'}") as database:
        study = database.create_study("old", {"world_size": 2})
        for number, extra in enumerate(
            (
                {},
                {"predicted_step_time_s": None, "predicted_breakdown": "compute"},
                {"predicted_step_time_s": "fast", "predicted_breakdown": {"compute": -1.0}},
            )
        ):
            database.add_trial(
                TrialRecord(
                    id=None,
                    study_id=study.id,
                    number=number,
                    status="complete",
                    config=TrialConfig(
                        world_size=2, device="cpu", micro_batch_size=(1, 2, 4)[number]
                    ).resolved(),
                    metrics={
                        "step_time_s": 0.05,
                        "throughput_tokens_per_s": 9_000.0 + number,
                        "peak_memory_bytes": 1 << 20,
                        "ranks": ds.RANKS,
                        **extra,
                    },
                    env={},
                    error=None,
                    created_at=datetime.now(UTC),
                )
            )
        path, loaded = write_report(database, "old", tmp_path / "old.html")
    data = payload(path.read_text(encoding="utf-8"))
    assert all(
        t.predicted_step_time_s is None and t.predicted_breakdown == () for t in loaded.trials
    )
    fig = data["figures"]["step-time"]
    assert fig["data"] == []
    assert (
        "no complete trial has a predicted step time" in fig["layout"]["title"]["subtitle"]["text"]
    )
    bars = traces(data["figures"]["breakdown"])
    assert set(bars) == {"compute", "exposed communication", "idle"}
    assert all(bar == "rank 0" or bar == "rank 1" for bar in bars["compute"]["x"][1])


def test_knob_plots_draw_compile_and_float8_when_a_study_varies_them(tmp_path):
    """The newer boolean knobs are axes of the parallel coordinates and bars of the importance,
    with their values as tick labels."""
    throughput = {
        (False, False): 9_000.0,
        (True, False): 11_000.0,
        (False, True): 12_000.0,
        (True, True): 15_000.0,
    }
    with Database.open(f"sqlite:///{tmp_path / 'knobs.db'}") as database:
        study = database.create_study("knobs", {"world_size": 2})
        for number, ((compiled, f8), tokens) in enumerate(throughput.items()):
            config = TrialConfig(
                world_size=2, device="cuda", precision="bf16-mixed", compile=compiled, float8=f8
            )
            database.add_trial(
                TrialRecord(
                    id=None,
                    study_id=study.id,
                    number=number,
                    status="complete",
                    config=config.resolved(),
                    metrics={
                        "step_time_s": 0.05,
                        "throughput_tokens_per_s": tokens,
                        "peak_memory_bytes": 1 << 20,
                    },
                    env={},
                    error=None,
                    created_at=datetime.now(UTC),
                )
            )
        path, _ = write_report(database, "knobs", tmp_path / "knobs.html")
    data = payload(path.read_text(encoding="utf-8"))
    dims = data["figures"]["knobs-parallel"]["data"][0]["dimensions"]
    assert [d["label"] for d in dims] == ["compile", "float8", "tokens/s"]
    lines = zip(
        *([dim["ticktext"][i] for i in dim["values"]] for dim in dims[:2]), dims[2]["values"]
    )
    assert {(c, f): tokens for c, f, tokens in lines} == {
        (str(c), str(f)): tokens for (c, f), tokens in throughput.items()
    }
    bars = data["figures"]["knobs-importance"]["data"]
    assert not bars or set(bars[0]["y"]) == {"compile", "float8"}


def test_memory_predicted_beside_measured(report, study):
    _, data = report
    record, trials, board = study
    variants = data["selectors"]["memory"]
    assert len(variants) == len(board)
    categories = ("parameters", "gradients", "optimizer_state", "activations", "peak")
    for e, fig in zip(board, variants):
        bars = traces(fig)
        config = TrialConfig.from_dict(trials[e.trial_id].config)
        memory = trials[e.trial_id].memory
        peaks = {
            m.rank: m.measured_bytes
            for m in memory
            if m.category == "peak" and m.measured_bytes is not None
        }
        if peaks:
            rank = max(peaks, key=lambda r: (peaks[r], -r))
            measured = {m.category: m.measured_bytes for m in memory if m.rank == rank}
            assert bars["measured"]["y"] == pytest.approx([measured[c] / MIB for c in categories])
            estimate = estimate_all_stages(config)[rank // (config.dp_degree * config.tp_degree)]
        else:  # predicted only: the worst stage
            assert bars["measured"]["y"] == [None] * 5
            estimate = estimate_memory(config)
        assert bars["predicted"]["y"] == pytest.approx(
            [
                x / MIB
                for x in (
                    estimate.parameters,
                    estimate.gradients,
                    estimate.optimizer_state,
                    estimate.activations + estimate.comm_buffers + estimate.other,
                    estimate.total,
                )
            ]
        )
        limit = record.spec["memory_limit_gib"] * GIB / MIB
        assert fig["layout"]["shapes"][0]["y0"] == pytest.approx(limit)


def test_knobs_parallel_coordinates_and_importance(report, study):
    _, data = report
    _, trials, board = study
    complete = [e for e in board if e.status == "complete"]
    varying = [k for k in KNOB_ORDER if len({getattr(e.config, k) for e in complete}) > 1]
    assert varying  # micro-batch and/or checkpointing differ
    dims = data["figures"]["knobs-parallel"]["data"][0]["dimensions"]
    assert [d["label"] for d in dims] == [*varying, "tokens/s"]
    assert dims[-1]["values"] == pytest.approx([e.throughput for e in complete])
    for dim in dims[:-1]:
        assert [dim["ticktext"][i] for i in dim["values"]] == [
            str(getattr(e.config, dim["label"])) for e in complete
        ]
    bars = data["figures"]["knobs-importance"]["data"]
    note = data["figures"]["knobs-importance"]["layout"]["title"]["subtitle"]["text"]
    assert "PED-ANOVA" in note or "too few" in note
    if bars:
        assert set(bars[0]["y"]) == set(varying)
        assert sum(bars[0]["x"]) == pytest.approx(1.0)


def test_names_and_errors_show_as_text(report, database, tmp_path):
    page, data = report
    assert f'<span id="study-name">{html.escape(ds.NAME)}</span>' in page
    for raw in (ds.NAME, "<img src=x", "<b>worse</b>"):
        assert raw not in page
    statuses = data["figures"]["leaderboard"]["data"][0]["cells"]["values"][9]
    assert any(html.escape(ds.FAILED_ERROR, quote=False) in s for s in statuses)
    path, _ = write_report(database, ds.USER_STUDY, tmp_path / "user.html")
    user_page = path.read_text(encoding="utf-8")
    assert f"<dd>{html.escape(ds.USER_WORKLOAD)}</dd>" in user_page
    assert ds.USER_WORKLOAD not in user_page


def test_password_never_in_the_report(report, url):
    page, _ = report
    assert ds.PASSWORD in url and ds.PASSWORD not in page
    assert "password=***" in page


# ---- the command line ------------------------------------------------------------------------
def test_cli_writes_the_report_of_the_chosen_or_latest_study(url, tmp_path, capsys):
    assert main(["dashboard", "--db", url, "--study", ds.NAME, "-o", str(tmp_path / "a.html")]) == 0
    out = capsys.readouterr().out
    assert "wrote the dashboard" in out and "7 trials" in out
    assert payload((tmp_path / "a.html").read_text())["selectors"]["timeline"]
    assert main(["dashboard", "--db", url, "-o", str(tmp_path / "b.html")]) == 0
    assert f"study '{ds.USER_STUDY}'" in capsys.readouterr().out  # the latest one


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["--study", "nope"], 1, "no study named 'nope'"),
        (["--db", "sqlite:///{tmp}/missing.db"], 1, "no SQLite database"),
        (["--db", "none"], 2, "the dashboard reads a database"),
        (["--port", "70000", "--serve"], 2, "must be a port number"),
        (["--db", f"postgresql://u:{ds.PASSWORD}@127.0.0.1:9/x"], 1, "postgresql://u:***@"),
    ],
)
def test_cli_errors_are_one_line(url, tmp_path, capsys, args, code, message):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    # Without the test database's ?password=: db's url_for_display shows a query-string
    # password in its own error messages (reported; db/ is not the dashboard's to change).
    plain = url.split("?", 1)[0]
    argv = [
        "dashboard",
        *([] if "--db" in args else ["--db", plain]),
        *args,
        "-o",
        str(tmp_path / "x.html"),
    ]
    if code == 2 and "--port" in args:
        with pytest.raises(SystemExit) as exit_info:  # argparse: usage error
            main(argv)
        assert exit_info.value.code == 2
    else:
        assert main(argv) == code
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("autotune")]
    assert len(lines) == 1 and message in lines[0], err
    assert ds.PASSWORD not in err and "Traceback" not in err
    if "nope" in args:
        assert html.escape(ds.NAME) not in lines[0] and ds.NAME in lines[0]  # names the others
    assert not (tmp_path / "x.html").exists()


def test_cli_on_a_database_without_studies(tmp_path, capsys):
    Database.open(f"sqlite:///{tmp_path / 'empty.db'}").close()
    assert (
        main(
            [
                "dashboard",
                "--db",
                f"sqlite:///{tmp_path / 'empty.db'}",
                "-o",
                str(tmp_path / "x.html"),
            ]
        )
        == 1
    )
    assert "no study in" in capsys.readouterr().err and not (tmp_path / "x.html").exists()


# ---- serving ---------------------------------------------------------------------------------
def _get(address: str, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _add_failed(database: Database, study_id: int, number: int) -> None:
    database.add_trial(
        TrialRecord(
            id=None,
            study_id=study_id,
            number=number,
            status="failed",
            config=TrialConfig(world_size=2, device="cpu").resolved(),
            metrics={},
            env={},
            error="boom",
            created_at=datetime.now(UTC),
        )
    )


def test_serve_rebuilds_and_signals_changes(tmp_path):
    database = Database.open(f"sqlite:///{tmp_path / 'live.db'}")
    study = database.create_study("live", {"world_size": 2})
    _add_failed(database, study.id, 0)
    server = make_server(database, "live", port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]
        assert host == "127.0.0.1"  # loopback only
        address = f"{host}:{port}"
        code, page = _get(address, "/")
        assert code == 200 and '<span id="study-name">live</span>' in page
        state = re.search(r'const state = "(\w+)";', page).group(1)
        assert _get(address, "/state") == (200, state)
        _add_failed(database, study.id, 1)  # the search stored another trial
        code, changed = _get(address, "/state")
        assert code == 200 and changed != state
        code, page = _get(address, "/")
        assert "2 (2 failed)" in page and f'const state = "{changed}"' in page
        assert _get(address, "/nothing")[0] == 404
        rebound = urllib.request.Request(f"http://{address}/", headers={"Host": "evil.example"})
        with pytest.raises(urllib.error.HTTPError, match="403"):
            urllib.request.urlopen(rebound, timeout=60)
    finally:
        server.shutdown()
        server.server_close()
        database.close()


def test_cli_serve_prints_its_local_address(url):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "autotune",
            "dashboard",
            "--db",
            url,
            "--study",
            ds.USER_STUDY,
            "--serve",
            "--port",
            "0",
        ],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = ""
        while "serving" not in line:
            line = proc.stderr.readline()
            assert line or proc.poll() is None, "the server exited"
        address = re.search(r"http://(127\.0\.0\.1:\d+)/", line).group(1)
        assert ds.PASSWORD not in line
        code, page = _get(address, "/")
        assert code == 200 and html.escape(ds.USER_WORKLOAD) in page
    finally:
        proc.terminate()
        proc.wait(timeout=30)
