"""Every trial status drawn: a label, a colour and a place in each figure, from a real study in a
real SQLite database (``dashboard_study.statuses_study``: each trial stored as the search stores
it), and the build's progress on a terminal and off it."""

from __future__ import annotations

import html
import io
import json
import re
from collections import Counter

import dashboard_study as ds
import plotly.graph_objects as go
import pytest
from plotly.io.json import to_json_plotly

from autotune.cli.main import main
from autotune.status import TrialStatus
from dashboards import data, figures, report
from dashboards.data import BuildProgress
from dashboards.report import figure_json, write_report
from db import Database

STEP_TIME_S = 0.004  # dashboard_study.status_record's measured step time
ONLY_SKIPPED = "only-skipped"
ONLY_FAILED = "only-failed"
STUDIES = {
    ds.EVERY_STATUS: ds.every_status(),
    ONLY_SKIPPED: [(TrialStatus.SKIPPED_PREDICTED, n) for n in (0, 1, None)],
    ONLY_FAILED: [(TrialStatus.FAILED, n) for n in (0, 1, 2)],
}
DATA = re.compile(r'<script type="application/json" id="figures-data">(.*?)</script>', re.S)


@pytest.fixture(scope="module")
def url(tmp_path_factory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('statuses') / 'statuses.db'}"
    for name, trials in STUDIES.items():
        ds.statuses_study(url, name, trials)
    return url


@pytest.fixture(scope="module")
def pages(url, tmp_path_factory) -> dict[str, tuple[str, dict]]:
    """Each study's report: (the page, its figures' payload)."""
    out = {}
    with Database.open(url, create=False) as database:
        for name in STUDIES:
            path, _ = write_report(database, name, tmp_path_factory.mktemp("r") / f"{name}.html")
            page = path.read_text(encoding="utf-8")
            out[name] = (page, json.loads(DATA.search(page).group(1)))
    return out


def test_every_status_has_a_label_a_colour_a_marker_and_a_row_fill():
    for status in TrialStatus:  # a status added without a style fails here
        assert status in figures.STATUS_STYLES, status
        assert figures.STATUS_LABELS[status] and figures.COLORS[status].startswith("#")
        assert figures.ROW_FILLS[status].startswith("#") and figures.style(status).symbol
    labels = [figures.STATUS_LABELS[s] for s in TrialStatus]
    colors = [figures.COLORS[s] for s in TrialStatus]
    assert len(set(labels)) == len(labels) and len(set(colors)) == len(colors)
    # The build's step count knows how many figures the report draws once.
    assert len(report.DRAWN_ONCE) == data.FIGURES_DRAWN_ONCE


def _every_figure(payload: dict) -> list[dict]:
    return [*payload["figures"].values(), *(v for vs in payload["selectors"].values() for v in vs)]


@pytest.mark.parametrize("name", STUDIES)
def test_each_study_draws_every_figure(pages, name):
    page, payload = pages[name]
    for fig in _every_figure(payload):  # each one Plotly accepts, as plotly.js reads it
        assert json.loads(to_json_plotly(figure_json(go.Figure(fig)))) == fig
    planted = Counter(status for status, _ in STUDIES[name])
    summary = re.search(r"<dt>trials</dt><dd>(.*?)</dd>", page).group(1)
    assert summary.startswith(f"{sum(planted.values())} (")
    for status, n in planted.items():
        assert f"{n} {html.escape(figures.STATUS_LABELS[status])}" in summary
    # Each planted trial's memory view, and its option naming its status.
    assert len(payload["selectors"]["memory"]) == sum(planted.values())
    options = re.findall(r'<select id="select-memory">(.*?)</select>', page, re.S)[0]
    for status in planted:
        if status != TrialStatus.COMPLETE:
            assert html.escape(f" · {figures.STATUS_LABELS[status]}") in options


def _cells(payload: dict) -> list[list]:
    return payload["figures"]["leaderboard"]["data"][0]["cells"]["values"]


def test_leaderboard_rows_show_each_status_with_its_label_and_fill(pages):
    _, payload = pages[ds.EVERY_STATUS]
    cells = _cells(payload)
    table = payload["figures"]["leaderboard"]["data"][0]
    planted = ds.every_status()
    # Leaderboard order is TrialStatus's; the one passed over (no number) last.
    assert cells[1] == [n if n is not None else "–" for _, n in planted]
    statuses = [status for status, _ in planted]
    for status, text, fill in zip(statuses, cells[-1], table["cells"]["fill"]["color"][0]):
        assert text.startswith(html.escape(figures.STATUS_LABELS[status]))
        assert fill == figures.ROW_FILLS[status]
    assert cells[-1][3].endswith(": predicted no faster than the best measured")  # once skipped
    assert cells[-1][4] == "failed: rank 1: RuntimeError: boom" and cells[-1][5] == "running"
    throughput = ds.STATUS_CONFIGS[0].tokens_per_step / STEP_TIME_S
    assert cells[3][0] == f"{throughput:,.0f}" and set(cells[3][1:]) == {"–"}


def test_history_places_each_status_at_its_trial_number(pages):
    _, payload = pages[ds.EVERY_STATUS]
    fig = payload["figures"]["history"]
    legend = [t["name"] for t in fig["data"] if t.get("showlegend", True)]
    assert legend == [figures.STATUS_LABELS[s] for s in TrialStatus] + ["best so far"]
    points = {(t["name"], t["yaxis"]): t for t in fig["data"] if "yaxis" in t}
    measured = {TrialStatus.COMPLETE, TrialStatus.INFEASIBLE_MEASURED}
    for status, number in ds.every_status():
        axis = "y" if status in measured else "y2"
        trace = points[(figures.STATUS_LABELS[status], axis)]
        x = number if number is not None else len(TrialStatus)  # passed over: after the last
        assert x in trace["x"]
        i = trace["x"].index(x)
        if axis == "y":
            config = ds.STATUS_CONFIGS[number]
            assert trace["y"][i] == pytest.approx(config.tokens_per_step / STEP_TIME_S)
        else:
            assert trace["y"][i] == figures.NOT_MEASURED
            assert trace["customdata"][i][3] == "no throughput measured"
    assert fig["layout"]["yaxis2"]["type"] == "category"
    assert "passed over: at 6" in fig["layout"]["title"]["subtitle"]["text"]


def test_memory_scatter_places_each_status_that_has_a_peak(pages):
    _, payload = pages[ds.EVERY_STATUS]
    fig = payload["figures"]["memory-scatter"]
    names = {t["name"]: t for t in fig["data"]}
    for status in (TrialStatus.INFEASIBLE_PREDICTED, TrialStatus.SKIPPED_PREDICTED):
        trace = names[figures.STATUS_LABELS[status]]
        assert set(trace["y"]) == {0.0}  # measured nothing: at 0, the predicted peak on x
        assert all(c[3] == "predicted" for c in trace["customdata"])
    assert len(names[figures.STATUS_LABELS[TrialStatus.SKIPPED_PREDICTED]]["x"]) == 2
    note = fig["layout"]["title"]["subtitle"]["text"]
    assert "not drawn, without any peak figure: 1 failed, 1 running" in note


@pytest.mark.parametrize(
    "name, status", [(ONLY_SKIPPED, "SKIPPED_PREDICTED"), (ONLY_FAILED, "FAILED")]
)
def test_a_study_of_one_status_draws_it_alone(pages, name, status):
    page, payload = pages[name]
    label = figures.STATUS_LABELS[TrialStatus[status]]
    history = payload["figures"]["history"]["data"]
    assert [t["name"] for t in history] == [label] and history[0]["yaxis"] == "y2"
    assert sorted(history[0]["x"]) == ([0, 1, 2])  # the one passed over after trial 1
    assert all(text.startswith(html.escape(label)) for text in _cells(payload)[-1])
    assert "no complete trial yet" in page
    assert payload["figures"]["knobs-parallel"]["data"] == []


@pytest.mark.parametrize("name", STUDIES)
def test_the_command_draws_each_study(url, tmp_path, capsys, name):
    out = tmp_path / "report.html"
    assert main(["dashboard", "--db", url, "--study", name, "-o", str(out)]) == 0
    captured = capsys.readouterr()
    trials = len(STUDIES[name])
    assert f"wrote the dashboard of study '{name}' ({trials} trials" in captured.out
    # stderr is not a terminal here: the build's one summary line, no progress line.
    assert re.fullmatch(
        rf"built the dashboard of {trials} trials and \d timelines in \d+\.\d s\n", captured.err
    )
    assert all(html.escape(figures.STATUS_LABELS[s]) in out.read_text() for s, _ in STUDIES[name])


# ---- the build's progress --------------------------------------------------------------------
class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _steps(trials: int, timelines: int) -> int:
    """Each timeline read and drawn, the seven figures drawn once, each trial's memory figure,
    the encoding."""
    return 2 * timelines + 7 + trials + 1


def test_progress_on_a_terminal_is_one_rewritten_line(url, tmp_path):
    stream = Terminal()
    with Database.open(url, create=False) as database:
        write_report(database, ds.EVERY_STATUS, tmp_path / "r.html", progress=BuildProgress(stream))
    text = stream.getvalue()
    total = _steps(trials=7, timelines=2)  # complete and infeasible (measured) have one each
    frames = text.split("\r")[1:]
    *progress, summary = frames
    assert [
        f"building the dashboard: {k / total:4.0%} ({k}/{total})" for k in range(total + 1)
    ] == (progress)
    assert re.fullmatch(r"built the dashboard of 7 trials and 2 timelines in \d+\.\d s\n", summary)
    assert text.count("\n") == 1 and text.startswith("\r")


def test_progress_ends_at_its_total_when_a_breakdown_has_no_spans(tmp_path):
    url = f"sqlite:///{tmp_path / 'no-spans.db'}"
    complete = [(TrialStatus.COMPLETE, 0), (TrialStatus.COMPLETE, 1), (TrialStatus.FAILED, 2)]
    ds.statuses_study(url, "no-spans", complete, spans=False)
    stream = Terminal()
    with Database.open(url, create=False) as database:
        write_report(database, "no-spans", tmp_path / "r.html", progress=BuildProgress(stream))
    total = _steps(trials=3, timelines=2)  # two with a breakdown: looked for, none drawn
    *_, last, summary = stream.getvalue().split("\r")
    assert last == f"building the dashboard: 100% ({total}/{total})"
    assert summary.startswith("built the dashboard of 3 trials and 0 timelines in")


def test_progress_off_a_terminal_is_one_summary_line(url, tmp_path):
    stream = io.StringIO()
    with Database.open(url, create=False) as database:
        write_report(database, ONLY_FAILED, tmp_path / "r.html", progress=BuildProgress(stream))
    assert re.fullmatch(
        r"built the dashboard of 3 trials and 0 timelines in \d+\.\d s\n", stream.getvalue()
    )


def test_a_build_that_fails_ends_the_terminal_line(url, tmp_path, monkeypatch):
    def broken(study):
        raise RuntimeError("drawing failed")

    monkeypatch.setitem(report.DRAWN_ONCE, "history", broken)
    stream = Terminal()
    with Database.open(url, create=False) as database, pytest.raises(RuntimeError):
        write_report(database, ds.EVERY_STATUS, tmp_path / "r.html", progress=BuildProgress(stream))
    assert stream.getvalue().endswith("\n") and "built" not in stream.getvalue()
    assert not (tmp_path / "r.html").exists()
