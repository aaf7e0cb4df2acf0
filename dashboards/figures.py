"""One function per view of a study, each returning a Plotly figure built from ``StudyData``.

Text that comes from trials or users (error messages, op names, workload and study names) goes
through :func:`esc` before it reaches a figure: Plotly renders a few HTML tags in titles, table
cells and hover labels and decodes ``&lt;``-style entities, so escaped text shows as typed.
Memory is drawn in MiB (2^20 bytes), time in milliseconds, throughput in tokens/s. Every
``TrialStatus`` has a ``StatusStyle`` (label, colour, marker, leaderboard row); trials that
measured no throughput are drawn where they have a place (the history's "not measured" strip,
at 0 on the memory scatter with their predicted peak) and counted in a note where they have none.
"""

from __future__ import annotations

import html
import math
import warnings
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go

from autotune.config import MIB
from autotune.layouts import KNOB_ORDER
from autotune.model.memory import estimate_all_stages, estimate_memory
from autotune.status import STATUS_ORDER, TrialStatus
from dashboards.data import RAN, StudyData, Timeline, TrialView

TEMPLATE = "plotly_white"


@dataclass(frozen=True, slots=True)
class StatusStyle:
    """How one ``TrialStatus`` is drawn: its label, marker colour and symbol, leaderboard row."""

    label: str
    color: str
    symbol: str
    """Its marker where trials are points (history, throughput against memory)."""
    fill: str
    """Its row of the leaderboard table."""


# Every TrialStatus, in leaderboard order; colours from Tableau 10 (Vega's default categorical
# scheme), row fills a light tint of each. tests/dashboards check every status has one.
STATUS_STYLES: dict[TrialStatus, StatusStyle] = {
    TrialStatus.COMPLETE: StatusStyle("complete", "#4C78A8", "circle", "#FFFFFF"),
    TrialStatus.INFEASIBLE_MEASURED: StatusStyle(
        "infeasible (measured)", "#E45756", "x", "#FDE2E1"
    ),
    TrialStatus.INFEASIBLE_PREDICTED: StatusStyle(
        "infeasible (predicted, not run)", "#F58518", "x-open", "#FEEBD6"
    ),
    TrialStatus.SKIPPED_PREDICTED: StatusStyle(
        "skipped (predicted no faster, not run)", "#72B7B2", "circle-open", "#E3F1F0"
    ),
    TrialStatus.FAILED: StatusStyle("failed", "#79706E", "triangle-down-open", "#ECEAE9"),
    TrialStatus.RUNNING: StatusStyle("running", "#B279A2", "diamond-open", "#F1E6EF"),
}
STATUS_LABELS = {status: style.label for status, style in STATUS_STYLES.items()}
COLORS = {
    **{status: style.color for status, style in STATUS_STYLES.items()},
    "pareto": "#54A24B",
    "compute": "#4C78A8",
    "comm": "#F58518",
    "p2p": "#E45756",
    "step": "#BAB0AC",
    "idle": "#BAB0AC",
    "predicted": "#9ECAE9",
    "measured": "#4C78A8",
    "limit": "#E45756",
}
ROW_FILLS = {status: style.fill for status, style in STATUS_STYLES.items()}


def style(status: str) -> StatusStyle:
    """The status's style; a status this version has none for (a test fails on that) is drawn
    grey under its own name rather than failing the report."""
    return STATUS_STYLES.get(
        status, StatusStyle(str(status).replace("_", " "), "#BAB0AC", "square-open", "#FFFFFF")
    )


MEMORY_VIEW = ("parameters", "gradients", "optimizer_state", "activations", "peak")
MEMORY_LABELS = ("parameters", "gradients", "optimizer state", "activations & buffers", "peak")
MAX_ERROR_CHARS = 300


def esc(text: object) -> str:
    """``text`` safe to hand to Plotly (and to HTML): <, > and & escaped."""
    return html.escape(str(text), quote=False)


def _figure(traces: list, title: str, note: str = "", **layout) -> go.Figure:
    """A figure of ``traces`` with a title (escaped by the caller where it holds user text) and
    a one-line note under it (see ``_spec``)."""
    return go.Figure(_spec(traces, title, note, **layout))


def _spec(traces: list, title: str, note: str = "", **layout) -> dict:
    """The figure as a plain dict ``{"data", "layout"}``, which ``go.Figure`` validates.

    Traces are plain dicts and the figure is built in one call, with no template: Plotly
    validates a ``go.Bar`` and then the figure holding it (every element twice), copies its
    default template into each new figure (~30 ms) and copies the figure again on each
    ``add_trace``/``update_layout``, which made a 500-trial report take tens of seconds. The
    report applies ``TEMPLATE`` once, for all figures; ``fig.update_layout(template=TEMPLATE)``
    does the same for one figure.
    """
    layout.setdefault("margin", {"t": 90, "l": 70, "r": 30, "b": 60})
    return {
        "data": traces,
        "layout": {
            "template": "none",
            **layout,
            "title": {"text": title, "subtitle": {"text": note}},
        },
    }


def _axis(title: str, **props) -> dict:
    # Nested dicts, not Plotly's "xaxis_title" shorthand: plotly.js reads the JSON as written
    # and unvalidated specs (memory_spec) never pass through the Python shorthand expansion.
    return {"title": {"text": title}, **props}


def _mib(value: int | None) -> float | None:
    return None if value is None else value / MIB


def status_text(trial: TrialView) -> str:
    """The status as the leaderboard shows it: label, then the reason when there is one."""
    label = style(trial.status).label
    if trial.error and trial.status != TrialStatus.COMPLETE:
        error = (
            trial.error
            if len(trial.error) <= MAX_ERROR_CHARS
            else trial.error[:MAX_ERROR_CHARS] + "…"
        )
        # "skipped: the reason" as the search stores it: the label says skipped already.
        word = label.split(" ", 1)[0]
        label += ": " + error.removeprefix(f"{word}: ")
    return label


def _drawn_peak(trial: TrialView) -> int | None:
    """Where a trial sits on the memory axis: measured peak, else the predicted one."""
    return trial.measured_peak if trial.measured_peak is not None else trial.predicted_peak


def measured_throughput(trial: TrialView) -> float | None:
    """The tokens/s a trial measured: the leaderboard's median for a complete one, its run's for
    one that ran over the limit; None for one that measured none (not run, out of memory,
    failed, running)."""
    if trial.status == TrialStatus.COMPLETE:
        return trial.throughput
    if trial.status == TrialStatus.INFEASIBLE_MEASURED:
        return trial.run_throughput
    return None


def _drawn_throughput(trial: TrialView) -> float:
    """Where a trial sits on the memory scatter's throughput axis: what it measured, 0 for
    trials that measured nothing."""
    measured = measured_throughput(trial)
    return 0.0 if measured is None else measured


def _throughput_text(trial: TrialView) -> str:
    measured = measured_throughput(trial)
    return "no throughput measured" if measured is None else f"{measured:,.0f} tokens/s"


# ---- leaderboard ---------------------------------------------------------------------------
STATUS_CHARS_PER_LINE = 55
"""About how many characters of the status column fit on one line (it wraps; rows grow)."""
LEADERBOARD_COLUMNS = (
    "#",
    "trial",
    "configuration",
    "tokens/s (median)",
    "95% CI (n)",
    "step ms",
    "peak MiB",
    "of limit",
    "predicted MiB",
    "status",
)


def interval_cell(t) -> str:
    """A trial's 95% interval and its number of runs; "s" after the count when the interval
    comes from the timed steps of its one run."""
    if t.interval is None:
        return "–"
    steps = "" if t.interval.source == "runs" else " s"
    return f"{t.interval.low:,.0f}–{t.interval.high:,.0f} ({t.num_measurements}{steps})"


def leaderboard_table(study: StudyData) -> go.Figure:
    """Every trial in leaderboard order: throughput, step time, peak against the limit, status."""
    rows = []
    for t in study.trials:
        peak = _mib(t.measured_peak)
        rows.append(
            (
                t.position,
                "–" if t.number is None else t.number,
                t.name,
                f"{t.throughput:,.0f}" if t.throughput is not None else "–",
                interval_cell(t),
                f"{t.step_time_s * 1e3:.2f}" if t.step_time_s is not None else "–",
                f"{peak:,.1f}" if peak is not None else "–",
                f"{t.measured_peak / study.limit_bytes:.0%}"
                if t.measured_peak is not None and study.limit_bytes
                else "–",
                f"{_mib(t.predicted_peak):,.1f}" if t.predicted_peak is not None else "–",
                esc(status_text(t)),
            )
        )
    columns = [list(col) for col in zip(*rows)] if rows else [[] for _ in LEADERBOARD_COLUMNS]
    fills = [style(t.status).fill for t in study.trials]
    table = dict(
        type="table",
        columnwidth=[26, 36, 330, 84, 76, 60, 70, 50, 74, 300],
        header={
            "values": [f"<b>{c}</b>" for c in LEADERBOARD_COLUMNS],
            "align": "left",
            "fill_color": "#E8EEF4",
            "height": 40,
        },
        cells={
            "values": columns,
            "align": "left",
            "fill_color": [fills] * len(columns),
            "height": 24,
        },
    )
    limit = (
        f"memory limit {study.limit_bytes / MIB:,.1f} MiB per device"
        if study.limit_bytes
        else "no memory limit recorded in the study's spec"
    )
    return _figure(
        [table],
        "Leaderboard",
        f"complete trials by median throughput, then infeasible, skipped, failed and running, "
        f"then the configurations passed over (no trial number); 95% CI: "
        f"Student t over the runs (s: the timed steps of one run); {limit}",
        height=min(200 + sum(24 + 14 * (len(r[-1]) // STATUS_CHARS_PER_LINE) for r in rows), 640),
    )


# ---- history -------------------------------------------------------------------------------
NOT_MEASURED = "not measured"
"""The history's strip under the throughput axis: trials that measured no throughput."""


def best_so_far(trials: list[TrialView]) -> tuple[list[int], list[float]]:
    """(trial numbers, best median throughput among complete trials up to each), from the first
    complete trial on."""
    numbers, best, current = [], [], None
    for t in sorted((t for t in trials if t.number is not None), key=lambda t: t.number):
        if t.status == TrialStatus.COMPLETE and t.throughput is not None:
            current = t.throughput if current is None else max(current, t.throughput)
        if current is not None:
            numbers.append(t.number)
            best.append(current)
    return numbers, best


def history(study: StudyData) -> go.Figure:
    """Each trial's throughput in the order the search ran them, and the best so far. Trials
    that measured none (not run, out of memory, failed, running) are markers on a strip under
    the axis at their trial number, the configurations passed over without one after the last."""
    last = max((t.number for t in study.trials if t.number is not None), default=-1)
    order = sorted(study.trials, key=lambda t: last + 1 if t.number is None else t.number)
    strip = any(measured_throughput(t) is None for t in order)
    traces = []
    for status in STATUS_ORDER:
        shown = [t for t in order if t.status == status]
        on_axis = [t for t in shown if measured_throughput(t) is not None]
        under = [t for t in shown if measured_throughput(t) is None]
        for group, axis in ((on_axis, "y"), (under, "y2")):
            if group:
                legend = axis == "y" or not on_axis  # one legend entry per status
                traces.append(_history_points(status, group, last + 1, axis, legend))
    numbers, best = best_so_far(list(study.trials))
    if numbers:
        traces.append(
            dict(
                type="scatter",
                x=numbers,
                y=best,
                mode="lines",
                name="best so far",
                line={"shape": "hv", "color": COLORS["pareto"], "width": 2},
                hovertemplate="best so far %{y:,.0f} tokens/s<extra></extra>",
            )
        )
    layout = {"xaxis": _axis("trial number"), "yaxis": _axis("tokens/s"), "height": 420}
    note = "median tokens/s of each trial"
    if strip:
        layout["height"] = 470
        layout["yaxis"]["domain"] = [0.24, 1]
        layout["yaxis2"] = {"domain": [0, 0.12], "type": "category", "fixedrange": True}
        layout["xaxis"]["anchor"] = "y2"
        note += f"; '{NOT_MEASURED}': trials that measured no throughput, at their trial number"
        if any(t.number is None for t in order):
            note += f" (passed over: at {last + 1}, after the last trial)"
    return _figure(traces, "Search history", note, **layout)


def _history_points(
    status: TrialStatus, trials: list[TrialView], passed_at: int, axis: str, legend: bool
) -> dict:
    """One status's markers on the history: on the throughput axis (``y``) or on the strip of
    trials that measured none (``y2``); ``passed_at``: the x of trials without a number."""
    color, shape = style(status).color, style(status).symbol
    return dict(
        type="scatter",
        x=[passed_at if t.number is None else t.number for t in trials],
        y=[measured_throughput(t) if axis == "y" else NOT_MEASURED for t in trials],
        yaxis=axis,
        mode="markers",
        name=style(status).label,
        legendgroup=str(status),
        showlegend=legend,
        marker={"color": color, "size": 9, "symbol": shape, "line": {"width": 1.5, "color": color}},
        customdata=[
            [t.label, t.trial_id, esc(t.name), _throughput_text(t), esc(status_text(t))]
            for t in trials
        ],
        hovertemplate="%{customdata[0]} (id %{customdata[1]})<br>%{customdata[2]}<br>"
        "%{customdata[3]}<br>%{customdata[4]}<extra></extra>",
    )


# ---- knobs ---------------------------------------------------------------------------------
def knob_values(trials: list[TrialView]) -> dict[str, list]:
    """The knobs (search order) that take more than one value among ``trials``, with the sorted
    values they take."""
    out = {}
    for knob in KNOB_ORDER:
        values = sorted({getattr(t.config, knob) for t in trials})  # one type per knob
        if len(values) > 1:
            out[knob] = values
    return out


def knobs_parallel(study: StudyData) -> go.Figure:
    """Parallel coordinates of the complete trials: one axis per knob that varied, then tokens/s
    (the line colour)."""
    complete = study.by_status(TrialStatus.COMPLETE)
    knobs = knob_values(complete)
    title = "Knobs against throughput"
    if not complete:
        return empty_figure(title, "no complete trial yet")
    dims = [
        {
            "label": knob,
            "values": [values.index(getattr(t.config, knob)) for t in complete],
            "tickvals": list(range(len(values))),
            "ticktext": [str(v) for v in values],
            "range": [-0.25, len(values) - 0.75],
        }
        for knob, values in knobs.items()
    ]
    throughputs = [t.throughput for t in complete]
    dims.append({"label": "tokens/s", "values": throughputs})
    parcoords = dict(
        type="parcoords",
        dimensions=dims,
        line={
            "color": throughputs,
            "colorscale": "Viridis",
            "showscale": True,
            "colorbar": {"title": {"text": "tokens/s"}},
        },
    )
    note = (
        f"{len(complete)} complete trials; drag along an axis to select"
        if knobs
        else "every complete trial has the same knobs"
    )
    return _figure(
        [parcoords], title, note, height=470, margin={"t": 150, "l": 80, "r": 40, "b": 40}
    )


def knob_importances(study: StudyData) -> tuple[dict[str, float], str]:
    """Each varying knob's importance for throughput, by Optuna's default evaluator (PED-ANOVA)
    over the complete trials, and a note saying what the numbers can be trusted for.

    The search's own Optuna study is not used: its parameter names carry their value sets
    (``micro_batch_size|1,2``) and infeasible trials are told 0 tokens/s there; here each knob is
    one parameter and only measured throughputs count."""
    import optuna
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import create_trial

    complete = study.by_status(TrialStatus.COMPLETE)
    knobs = knob_values(complete)
    if len(complete) < 2 or not knobs:
        return {}, "needs at least two complete trials that differ in a knob"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    ranking = optuna.create_study(direction="maximize")
    distributions = {k: CategoricalDistribution(v) for k, v in knobs.items()}
    for t in complete:
        ranking.add_trial(
            create_trial(
                params={k: getattr(t.config, k) for k in knobs},
                distributions=distributions,
                value=t.throughput,
            )
        )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            importances = optuna.importance.get_param_importances(ranking)
        except Exception as e:  # noqa: BLE001 - an evaluator's limit is a note, not a failure
            return {}, f"optuna could not rank the knobs: {type(e).__name__}: {e}"
    note = (
        f"PED-ANOVA (optuna.importance) over {len(complete)} complete trials: how much each "
        "knob separates the fastest 10% from the rest"
    )
    if any("will be equal" in str(w.message) for w in caught):
        note = (
            f"only {len(complete)} complete trials: too few to tell the knobs apart "
            "(PED-ANOVA gives them equal weight)"
        )
    return importances, note


def knob_importance(study: StudyData) -> go.Figure:
    importances, note = knob_importances(study)
    title = "Knob importance for throughput"
    if not importances:
        return empty_figure(title, note)
    knobs = list(importances)[::-1]  # most important on top
    bars = dict(
        type="bar",
        x=[importances[k] for k in knobs],
        y=knobs,
        orientation="h",
        marker={"color": COLORS[TrialStatus.COMPLETE]},
        hovertemplate="%{y}: %{x:.3f}<extra></extra>",
    )
    return _figure([bars], title, note, xaxis=_axis("importance (sums to 1)"), height=360)


# ---- throughput against memory -------------------------------------------------------------
def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points (peak, throughput) that no other point beats on both (lower peak,
    higher throughput), ordered by peak."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front, best = [], float("-inf")
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front


def memory_scatter(study: StudyData) -> go.Figure:
    """Throughput against peak memory for every trial with a peak, the limit drawn, the Pareto
    front of the complete trials marked, infeasible and failed trials in their own markers."""
    traces = []
    unplaced = {}
    for status in STATUS_ORDER:
        trials = [t for t in study.by_status(status) if _drawn_peak(t) is not None]
        if len(study.by_status(status)) > len(trials):
            unplaced[style(status).label] = len(study.by_status(status)) - len(trials)
        if not trials:
            continue
        color = style(status).color
        traces.append(
            dict(
                type="scatter",
                x=[_drawn_peak(t) / MIB for t in trials],
                y=[_drawn_throughput(t) for t in trials],
                mode="markers",
                name=style(status).label,
                marker={
                    "color": color,
                    "size": 10,
                    "symbol": style(status).symbol,
                    "line": {"width": 1.5, "color": color},
                },
                customdata=[
                    [
                        t.label,
                        esc(t.name),
                        esc(status_text(t)),
                        "measured" if t.measured_peak is not None else "predicted",
                        _throughput_text(t),
                    ]
                    for t in trials
                ],
                hovertemplate="%{customdata[0]}: %{customdata[1]}<br>%{customdata[4]}<br>"
                "%{customdata[3]} peak %{x:,.1f} MiB<br>%{customdata[2]}"
                "<extra></extra>",
            )
        )
    traces += _pareto_and_limit(study)
    note = (
        "x: measured peak of the worst rank (predicted for trials that did not measure one);"
        " trials that measured no throughput sit at 0"
    )
    if unplaced:
        which = ", ".join(f"{n} {label}" for label, n in unplaced.items())
        note += f"; not drawn, without any peak figure: {esc(which)}"
    if not study.limit_bytes:
        note += "; no memory limit recorded"
    return _figure(
        traces,
        "Throughput against peak memory",
        note,
        xaxis=_axis("peak memory per device (MiB)"),
        yaxis=_axis("tokens/s"),
        height=460,
    )


def _pareto_and_limit(study: StudyData) -> list[dict]:
    """The memory scatter's Pareto front of the complete trials and its memory-limit line."""
    traces = []
    complete = [t for t in study.by_status(TrialStatus.COMPLETE) if t.measured_peak is not None]
    points = [(t.measured_peak / MIB, t.throughput or 0.0) for t in complete]
    front = [complete[i] for i in pareto_front(points)]
    if front:
        traces.append(
            dict(
                type="scatter",
                x=[t.measured_peak / MIB for t in front],
                y=[t.throughput for t in front],
                mode="lines+markers",
                name="Pareto front",
                line={"color": COLORS["pareto"], "dash": "dot"},
                marker={"symbol": "star", "size": 15, "color": COLORS["pareto"]},
                customdata=[[t.number, esc(t.name)] for t in front],
                hovertemplate="Pareto: trial %{customdata[0]}: %{customdata[1]}<br>"
                "%{y:,.0f} tokens/s at %{x:,.1f} MiB<extra></extra>",
            )
        )
    if study.limit_bytes:
        top = max([_drawn_throughput(t) for t in study.trials] + [1.0]) * 1.08
        traces.append(
            dict(
                type="scatter",
                x=[study.limit_bytes / MIB] * 2,
                y=[0, top],
                mode="lines",
                name="memory limit",
                line={"color": COLORS["limit"], "dash": "dash", "width": 2},
                hovertemplate="memory limit %{x:,.1f} MiB<extra></extra>",
            )
        )
    return traces


# ---- timeline ------------------------------------------------------------------------------
# (trace name, kinds, lane half: offset and width in rank units, hover template)
TIMELINE_TRACES = (
    (
        "steps",
        ("step",),
        -0.48,
        0.96,
        "step %{customdata[0]}<br>%{x:.3f} ms<extra>rank %{y}</extra>",
    ),
    (
        "compute",
        ("compute",),
        -0.44,
        0.42,
        "<b>%{customdata[0]}</b> (%{customdata[1]})<br>step %{customdata[2]}<br>"
        "%{x:.3f} ms<extra>rank %{y}</extra>",
    ),
    (
        "collectives",
        ("comm",),
        0.02,
        0.42,
        "collective <b>%{customdata[0]}</b> on %{customdata[1]}<br>%{customdata[2]:,} bytes<br>"
        "step %{customdata[3]}<br>%{x:.3f} ms<extra>rank %{y}</extra>",
    ),
    (
        "send/recv",
        ("p2p",),
        0.02,
        0.42,
        "<b>%{customdata[0]}</b> on %{customdata[1]}<br>%{customdata[2]:,} bytes<br>"
        "step %{customdata[3]}<br>%{x:.3f} ms<extra>rank %{y}</extra>",
    ),
)
TRACE_COLORS = {
    "steps": COLORS["step"],
    "compute": COLORS["compute"],
    "collectives": COLORS["comm"],
    "send/recv": COLORS["p2p"],
}


def _span_data(span, name: str) -> list:
    if name == "steps":
        return [span.step]
    if name == "compute":
        return [esc(span.name), esc(span.category or "op"), span.step]
    return [esc(span.name), esc(span.group or "-"), span.bytes, span.step]


def timeline(tl: Timeline) -> go.Figure:
    """One lane per rank (compute in its upper half, communication in its lower half), steps
    shaded behind with their boundaries drawn; time in ms from the first span."""
    origin = min((s.start_ns for s in tl.spans), default=0)
    traces = []
    for name, kinds, offset, width, hover in TIMELINE_TRACES:
        spans = [s for s in tl.spans if s.kind in kinds]
        # numpy arrays: Plotly validates an array at once, a list element by element.
        traces.append(
            {
                "type": "bar",
                "name": name,
                "orientation": "h",
                "y": np.array([s.rank for s in spans], dtype=np.int64),
                "base": np.array([(s.start_ns - origin) / 1e6 for s in spans], dtype=np.float64),
                "x": np.array([s.dur_ns / 1e6 for s in spans], dtype=np.float64),
                "offset": offset,
                "width": width,
                "hovertemplate": hover,
                "customdata": np.array([_span_data(s, name) for s in spans], dtype=object),
                "marker": {"color": TRACE_COLORS[name], "line": {"width": 0}},
                "opacity": 0.35 if name == "steps" else 1.0,
            }
        )
    shapes = [
        {
            "type": "line",
            "xref": "x",
            "yref": "y",
            "x0": x,
            "x1": x,
            "y0": s.rank - 0.5,
            "y1": s.rank + 0.5,
            "line": {"color": "#555555", "width": 1, "dash": "dot"},
        }
        for s in tl.spans
        if s.kind == "step"
        for x in ((s.start_ns - origin) / 1e6, (s.start_ns + s.dur_ns - origin) / 1e6)
    ]
    shown = len(tl.spans)
    note = (
        f"all {shown:,} spans"
        if shown == tl.total_spans
        else f"{shown:,} of {tl.total_spans:,} spans drawn (every step and communication span, "
        "then the longest compute ops)"
    )
    note += "; compute in the upper half of each lane, communication in the lower; dotted: steps"
    return _figure(
        traces,
        f"Timeline of trial {tl.number}: {esc(tl.name)}",
        note,
        barmode="overlay",
        shapes=shapes,
        xaxis=_axis("ms since the first span"),
        bargap=0,
        yaxis=_axis(
            "",
            tickvals=list(tl.ranks),
            ticktext=lane_labels(tl),
            range=[max(tl.ranks, default=0) + 0.5, -0.5],
        ),
        height=180 + 90 * max(len(tl.ranks), 1),
    )


def lane_labels(tl: Timeline) -> list[str]:
    """'rank 0' or, where the node is known, 'rank 0 · host/3f2a1c': lanes labelled by node."""
    nodes = tl.nodes or ("",) * len(tl.ranks)
    return [f"rank {r} · {esc(n)}" if n else f"rank {r}" for r, n in zip(tl.ranks, nodes)]


def no_timeline() -> go.Figure:
    return empty_figure(
        "Timeline",
        "no trial of this study has a timeline (profiled steps): "
        "run the search with num_profiled_steps > 0",
    )


# ---- predicted against measured step time -------------------------------------------------
def step_time_scatter(study: StudyData) -> go.Figure:
    """The performance model's step time (stored by the search before each trial ran) against
    the measured one, for every complete trial that has both; y = x dashed, the mean absolute
    percentage error in the title. Log axes: a relative error is the same distance from the
    line at any step time."""
    complete = study.by_status(TrialStatus.COMPLETE)
    shown = [t for t in complete if t.step_time_error is not None and t.predicted_step_time_s]
    title = "Predicted against measured step time"
    if not shown:
        return empty_figure(
            title,
            "no complete trial yet"
            if not complete
            else "no complete trial has a predicted step time (trials stored "
            "before the performance model have none)",
        )
    measured = [t.step_time_s * 1e3 for t in shown]
    predicted = [t.predicted_step_time_s * 1e3 for t in shown]
    mape = sum(abs(t.step_time_error) for t in shown) / len(shown)
    low, high = min(measured + predicted) / 1.25, max(measured + predicted) * 1.25
    span = [math.log10(low), math.log10(high)]
    traces = [
        dict(
            type="scatter",
            x=[low, high],
            y=[low, high],
            mode="lines",
            name="y = x",
            line={"color": COLORS[TrialStatus.FAILED], "dash": "dash", "width": 1.5},
            hoverinfo="skip",
        ),
        dict(
            type="scatter",
            x=measured,
            y=predicted,
            mode="markers",
            name="complete trials",
            marker={"color": COLORS[TrialStatus.COMPLETE], "size": 10},
            customdata=[[t.number, esc(t.name), f"{t.step_time_error:+.1%}"] for t in shown],
            hovertemplate="trial %{customdata[0]}: %{customdata[1]}<br>measured %{x:,.2f} ms"
            "<br>predicted %{y:,.2f} ms<br>error %{customdata[2]}"
            "<extra></extra>",
        ),
    ]
    note = (
        f"{len(shown)} complete trials; error = predicted / measured − 1 (above the line: "
        "predicted slower than measured)"
    )
    if len(complete) > len(shown):
        note += (
            f"; {len(complete) - len(shown)} complete trial(s) without a prediction are not drawn"
        )
    return _figure(
        traces,
        f"{title}: MAPE {mape:.1%}",
        note,
        xaxis=_axis("measured step time (ms)", type="log", range=span),
        yaxis=_axis("predicted step time (ms)", type="log", range=span),
        height=480,
    )


# ---- per-rank breakdown --------------------------------------------------------------------
BREAKDOWN_PARTS = (
    ("compute", "compute_ns", COLORS["compute"]),
    ("exposed communication", "exposed_comm_ns", COLORS["comm"]),
    ("idle", "idle_ns", COLORS["idle"]),
)
BREAKDOWN_VISIBLE_BARS = 40
# perf_model.TERMS → (label, colour): Tableau 20's light hues, the measured part's where the
# term is one (compute; communication orange and red; the bubble idles, as idle does).
PREDICTED_TERMS = {
    "compute": ("compute", "#9ECAE9"),
    "tp_comm": ("TP collectives", "#FFBF79"),
    "pp_p2p": ("pipeline send/recv", "#FF9D98"),
    "pp_bubble": ("pipeline bubble", "#D6A5C9"),
    "dp_comm": ("exposed DP sync", "#F2CF5B"),
    "optimizer": ("optimizer step", "#88D27A"),
    "overhead": ("fixed overheads", "#D8B5A5"),
}
PREDICTED_BAR = "predicted"
"""The second-level x label of a trial's predicted bar, beside its ranks' measured ones."""


def predicted_trace_name(term: str) -> str:
    return f"predicted {PREDICTED_TERMS.get(term, (term, ''))[0]}"


def breakdown_bars(study: StudyData) -> go.Figure:
    """Per trial and rank, milliseconds per profiled step of compute, exposed communication and
    idle (they stack to the step window); figures from ``profiler.analysis``. Beside a trial's
    ranks, when the search stored one, the performance model's predicted step by term."""
    # (trial, rank) for a measured bar, (trial, None) for a predicted one; every trace spans
    # every bar (None where it has no value) so the bars keep this order on the axis.
    rows = []
    for t in study.trials:
        if t.predicted_breakdown and t.status in RAN:
            rows.append((t, None))
        rows += [(t, r) for r in t.ranks]
    title = "Compute, exposed communication and idle per step"
    if not rows:
        return empty_figure(title, "no trial has a timeline (profiled steps)")
    x = [
        [t.label for t, _ in rows],
        [PREDICTED_BAR if r is None else f"rank {r.rank}" for t, r in rows],
    ]
    traces = []
    for label, field, color in BREAKDOWN_PARTS:
        traces.append(
            dict(
                type="bar",
                name=label,
                x=x,
                marker={"color": color},
                y=[
                    None if r is None else getattr(r, field) / max(1, r.num_steps) / 1e6
                    for _, r in rows
                ],
                customdata=[
                    [esc(t.name), "" if r is None else f"{r.overlap:.1%}"] for t, r in rows
                ],
                hovertemplate=f"{label}: %{{y:.3f}} ms<br>%{{customdata[0]}}<br>overlap "
                "%{customdata[1]}<extra>%{x}</extra>",
            )
        )
    predicted = [dict(t.predicted_breakdown) if r is None else None for t, r in rows]
    terms = list(dict.fromkeys(term for p in predicted if p for term in p))
    for term in terms:
        name = predicted_trace_name(term)
        traces.append(
            dict(
                type="bar",
                name=esc(name),
                x=x,
                marker={"color": PREDICTED_TERMS.get(term, (term, COLORS["step"]))[1]},
                y=[p[term] * 1e3 if p and term in p else None for p in predicted],
                customdata=[
                    [
                        esc(t.name),
                        f"{t.predicted_step_time_s * 1e3:,.3f}"
                        if t.predicted_step_time_s is not None
                        else "–",
                    ]
                    for t, _ in rows
                ],
                hovertemplate=f"{esc(name)}: %{{y:.3f}} ms<br>%{{customdata[0]}}<br>predicted step "
                "%{customdata[1]} ms<extra>%{x}</extra>",
            )
        )
    layout = {"barmode": "stack", "yaxis": _axis("ms per profiled step"), "height": 440}
    note = (
        "leaderboard order; HTA definitions: exposed = communication not overlapped by "
        "compute, idle = step window − busy"
    )
    if terms:
        layout["yaxis"] = _axis("ms per step (measured: per profiled step)")
        note += (
            f"; '{PREDICTED_BAR}': the performance model's terms per step, stored before "
            "the trial ran"
        )
    if len(rows) > BREAKDOWN_VISIBLE_BARS:  # the first ones; pan for the rest
        layout["xaxis"] = {"range": [-0.5, BREAKDOWN_VISIBLE_BARS - 0.5]}
    return _figure(traces, title, note, **layout)


# ---- memory by category --------------------------------------------------------------------
def peak_rank(trial: TrialView) -> int | None:
    """The rank with the highest measured peak (the one the limit binds), None if unmeasured."""
    peaks = [
        (m.measured_bytes, -m.rank)
        for m in trial.memory
        if m.category == "peak" and m.measured_bytes is not None
    ]
    return -max(peaks)[1] if peaks else None


def predicted_categories(trial: TrialView, rank: int | None) -> dict[str, int] | None:
    """The memory model's bytes for ``rank``'s pipeline stage (the worst stage when ``rank`` is
    None) in the measured categories: the measurement counts comm buffers and other
    temporaries as activations (activations = peak − model states, docs/architecture.md)."""
    config = trial.config
    if config.workload.shape is None:  # a user workload: its shape is not stored
        return None
    if rank is None:
        estimate = estimate_memory(config)
    else:
        # Mesh dims (pp, dp, cp, tp), pp outermost (autotune/trial/parallel/mesh.py).
        pp_rank = rank // (config.world_size // config.pp_degree)  # a stage: dp × cp × tp ranks
        estimate = estimate_all_stages(config)[pp_rank]
    return {
        "parameters": estimate.parameters,
        "gradients": estimate.gradients,
        "optimizer_state": estimate.optimizer_state,
        "activations": estimate.activations + estimate.comm_buffers + estimate.other,
        "peak": estimate.total,
    }


def memory_by_category(study: StudyData, trial: TrialView) -> go.Figure:
    """Predicted beside measured bytes by category on the trial's peak rank."""
    return go.Figure(memory_spec(study, trial))


def memory_spec(study: StudyData, trial: TrialView) -> dict:
    """``memory_by_category`` unvalidated: the report embeds one per trial, and validating
    500 small figures costs more than a second (tests/test_dashboard.py validates them)."""
    rank = peak_rank(trial)
    measured = {
        m.category: m.measured_bytes
        for m in trial.memory
        if m.rank == rank and m.measured_bytes is not None
    }
    predicted = predicted_categories(trial, rank)
    if predicted is None and trial.predicted_peak is not None:
        predicted = {"peak": trial.predicted_peak}
    traces = []
    for name, values in (("predicted", predicted or {}), ("measured", measured)):
        traces.append(
            dict(
                type="bar",
                name=name,
                x=list(MEMORY_LABELS),
                marker={"color": COLORS[name]},
                y=[_mib(values.get(c)) for c in MEMORY_VIEW],
                hovertemplate=f"{name} %{{x}}: %{{y:,.1f}} MiB<extra></extra>",
            )
        )
    shapes, notes = [], []
    if study.limit_bytes:
        shapes.append(
            {
                "type": "line",
                "name": "memory limit",
                "xref": "paper",
                "x0": 0,
                "x1": 1,
                "yref": "y",
                "y0": study.limit_bytes / MIB,
                "y1": study.limit_bytes / MIB,
                "line": {"color": COLORS["limit"], "dash": "dash", "width": 2},
            }
        )
        notes.append(f"dashed: the limit, {study.limit_bytes / MIB:,.1f} MiB")
    where = (
        f"rank {rank} (highest measured peak)"
        if rank is not None
        else "worst pipeline stage, predicted only: the trial measured nothing"
    )
    notes.extend(_device_note(measured))
    if predicted is None:
        notes.append("no prediction: the workload's shape is not known")
    return _spec(
        traces,
        f"Memory of {trial.label}: {esc(trial.name)}",
        "; ".join([where] + notes),
        barmode="group",
        shapes=shapes,
        yaxis=_axis("MiB"),
        height=420,
    )


def _device_note(measured: dict[str, int]) -> list[str]:
    """The allocator's reserved peak and the memory outside it, where they say more than the
    allocated peak does (on CPU reserved = allocated and nothing is reported outside)."""
    reserved, outside = measured.get("peak_reserved"), measured.get("outside_allocator")
    if outside is None and (reserved is None or reserved == measured.get("peak")):
        return []
    parts = [
        f"reserved {_mib(reserved):,.1f} MiB" if reserved is not None else None,
        f"outside the allocator {_mib(outside):,.1f} MiB" if outside is not None else None,
    ]
    return ["peak held from the device: " + " + ".join(p for p in parts if p)]


# ---- helpers -------------------------------------------------------------------------------
def empty_figure(title: str, note: str) -> go.Figure:
    """A figure with nothing to plot yet that still says why."""
    return _figure(
        [], title, esc(note), height=260, xaxis={"visible": False}, yaxis={"visible": False}
    )
