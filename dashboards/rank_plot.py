"""``autotune rank --plot FILE.html``: every scored layout on one self-contained page.

The figure takes plain records, :class:`RankPoint` (one per row of the ranking) and
:class:`RankSummary` (what was ranked and how it was screened), or dicts of the same fields;
it imports nothing of the ranking, which builds the records (``cli/rank.py``). Drawn:
x = predicted peak memory per rank (GiB), y = predicted tokens/s; colour by (tp, pp) (a hue per
tp, darker for more pipeline stages), marker symbol by ZeRO stage; the Pareto front (most tokens/s
for at most that memory) as a step line; the memory limit, and the largest predicted peak the
ranking lets fit under it with its allowances, as vertical lines; the rows the table prints
(``--top``) ringed and numbered. Above ``WEBGL_ABOVE`` points the layouts are drawn with WebGL
(``scattergl``). The page embeds plotly.js as the dashboard's report does, so it opens offline.
"""

from __future__ import annotations

import html
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import plotly.io as pio
from plotly.offline import get_plotlyjs

from autotune.config import GIB
from autotune.errors import AutotuneError
from dashboards.figures import COLORS, TEMPLATE, esc, pareto_front
from dashboards.report import PLOT_CONFIG

WEBGL_ABOVE = 2_000
"""Layouts drawn with SVG markers up to this many points, with WebGL (``scattergl``) above:
SVG slows down past a few thousand markers, and the ranking scores 100k+ at cluster scale."""
ZERO_SYMBOLS = ("circle", "square", "diamond", "triangle-up")
"""Marker symbol per ZeRO stage 0-3 (all of them drawn by WebGL as by SVG)."""
SYMBOL_NUMBERS = {"circle": 0, "square": 1, "diamond": 2, "triangle-up": 5}
"""Plotly's number for each symbol: a point's symbol is written as its number (fewer bytes)."""
TP_HUES = (212, 28, 130, 352, 275, 185, 48)
"""HSL hue per tensor-parallel degree in increasing order (Tableau's blue, orange, green, red,
purple, teal, yellow); the pipeline degree sets the lightness."""
LAYOUTS, PARETO, TOP = "layouts", "pareto", "top"
"""The ``meta`` of the traces that hold the layouts, the Pareto front and the top rows."""


@dataclass(frozen=True, slots=True)
class RankPoint:
    """One row of the ranking, as plain values."""

    rank: int
    """Its place in the ranking (1: predicted fastest)."""
    tp: int
    pp: int
    dp: int
    zero: int
    layout: str
    """The layout's knobs in words, for the hover."""
    peak_bytes: int
    """Predicted peak memory of its worst rank."""
    tokens_per_s: float
    step_time_s: float
    term: str
    """The largest term of its predicted step (compute, tp_comm, pp_bubble, dp_comm, ...)."""
    term_s: float
    folded: int = 0
    """Layouts folded into this row: the same but for the bucket size, predicted alike."""


@dataclass(frozen=True, slots=True)
class RankSummary:
    """What was ranked, against which limit, and what was not drawn."""

    title: str
    limit_bytes: int
    """The per-device memory limit the ranking screens against."""
    fit_below_bytes: int
    """The largest predicted peak the ranking lets fit: the limit less its allowances."""
    allowances: str
    """The allowances in words ('+15% margin, ×1.1 allocator reserve, ...')."""
    scored: int
    """Layouts scored (memory estimated); those predicted to fit were also timed."""
    fit: int
    screened_groups: int = 0
    screened_branches: int = 0
    top: int = 10
    """Rows the table prints (``--top``): the ones ringed."""


def _record(cls, value):
    return value if isinstance(value, cls) else cls(**value)


def rank_figure(records, summary: RankSummary | dict, *, webgl_above: int = WEBGL_ABOVE) -> dict:
    """The figure, ``{"data", "layout"}``, of ``records`` (:class:`RankPoint` or dicts): one
    point per record in the traces whose ``meta`` is ``LAYOUTS``."""
    points = [_record(RankPoint, r) for r in records]
    summary = _record(RankSummary, summary)
    kind = _kind(len(points), webgl_above)
    front = [points[i] for i in pareto_front([(p.peak_bytes, p.tokens_per_s) for p in points])]
    top = sorted((p for p in points if p.rank <= summary.top), key=lambda p: p.rank)
    data = [
        *_layout_traces(points, kind),
        *_zero_legend(points),
        _front_trace(front),
        _top_trace(top, _kind(len(top), webgl_above)),
    ]
    highest = max((p.tokens_per_s for p in points), default=1.0)
    return {
        "data": data,
        "layout": {
            "title": {"text": "Every layout predicted to fit: tokens/s against peak memory"},
            "xaxis": {
                "title": {"text": "predicted peak memory per rank (GiB)"},
                "rangemode": "tozero",
            },
            "yaxis": {
                "title": {"text": "predicted tokens/s"},
                "rangemode": "tozero",
                "range": [0, highest * 1.12],
            },
            "shapes": _limit_lines(summary),
            "annotations": _limit_labels(summary),
            "legend": {"title": {"text": "tp × pp · ZeRO"}},
            "hovermode": "closest",
            "height": 720,
            "margin": {"t": 70, "l": 80, "r": 30, "b": 60},
        },
    }


def _kind(n: int, webgl_above: int) -> str:
    return "scattergl" if n > webgl_above else "scatter"


def _layout_traces(points: list[RankPoint], kind: str) -> list[dict]:
    """One trace per (tp, pp): its hue by tp, lighter for fewer stages; symbol by ZeRO."""
    tps = sorted({p.tp for p in points})
    pps = sorted({p.pp for p in points})
    groups: dict[tuple[int, int], list[RankPoint]] = {}
    for p in points:
        groups.setdefault((p.tp, p.pp), []).append(p)
    traces = []
    for (tp, pp), group in sorted(groups.items()):
        lightness = 68 - 40 * pps.index(pp) / max(len(pps) - 1, 1)
        colour = f"hsl({TP_HUES[tps.index(tp) % len(TP_HUES)]},62%,{lightness:.0f}%)"
        name = f"tp {tp} × pp {pp}"
        # Its legend entry alone, a plain circle: a trace's own shows its first point's symbol.
        traces.append(
            {
                "type": "scatter",
                "mode": "markers",
                "meta": "legend",
                "name": name,
                "legendgroup": name,
                "x": [None],
                "y": [None],
                "marker": {"color": colour, "size": 9},
                "hoverinfo": "skip",
            }
        )
        traces.append(
            {
                "type": kind,
                "mode": "markers",
                "meta": LAYOUTS,
                "name": name,
                "legendgroup": name,
                "showlegend": False,
                "x": [round(p.peak_bytes / GIB, 4) for p in group],
                "y": [round(p.tokens_per_s, 1) for p in group],
                "text": [_hover(p) for p in group],
                "hovertemplate": "%{text}<br>%{y:,.0f} tokens/s, peak %{x:.2f} GiB<extra></extra>",
                "marker": {
                    "color": colour,
                    "size": 7,
                    "opacity": 0.8,
                    "symbol": [SYMBOL_NUMBERS[ZERO_SYMBOLS[p.zero]] for p in group],
                },
            }
        )
    return traces


def _hover(p: RankPoint) -> str:
    folded = f" (+{p.folded} folded)" if p.folded else ""
    return (
        f"#{p.rank:,}{folded}: {_esc(p.layout)}<br>step {_seconds(p.step_time_s)}, most in "
        f"{_esc(p.term)}: {_seconds(p.term_s)} ({p.term_s / p.step_time_s:.0%})"
    )


def _esc(text: str) -> str:
    """``figures.esc``, skipped for the (usual) text with nothing to escape: 100k+ hovers."""
    return esc(text) if "<" in text or ">" in text or "&" in text else text


def _seconds(t: float) -> str:
    return f"{t:.2f} s" if t >= 1 else f"{t * 1e3:.2f} ms"


def _zero_legend(points: list[RankPoint]) -> list[dict]:
    """Legend entries alone (no point) naming each ZeRO stage's symbol."""
    return [
        {
            "type": "scatter",
            "mode": "markers",
            "meta": "legend",
            "name": f"ZeRO-{z}",
            "x": [None],
            "y": [None],
            "marker": {"color": "#79706E", "size": 9, "symbol": ZERO_SYMBOLS[z]},
            "hoverinfo": "skip",
        }
        for z in sorted({p.zero for p in points})
    ]


def _front_trace(front: list[RankPoint]) -> dict:
    return {
        "type": "scatter",
        "mode": "lines+markers",
        "meta": PARETO,
        "name": "Pareto front",
        "x": [round(p.peak_bytes / GIB, 4) for p in front],
        "y": [round(p.tokens_per_s, 1) for p in front],
        # Most tokens/s for at most that memory: flat until the next point of the front.
        "line": {"shape": "hv", "color": COLORS["pareto"], "width": 2},
        "marker": {"color": COLORS["pareto"], "size": 5},
        "text": [_hover(p) for p in front],
        "hovertemplate": "Pareto: %{text}<br>%{y:,.0f} tokens/s, peak %{x:.2f} GiB<extra></extra>",
    }


def _top_trace(top: list[RankPoint], kind: str) -> dict:
    return {
        "type": kind,
        "mode": "markers+text",
        "meta": TOP,
        "name": f"top {len(top)} (the table's rows)",
        "x": [round(p.peak_bytes / GIB, 4) for p in top],
        "y": [round(p.tokens_per_s, 1) for p in top],
        "text": [str(p.rank) for p in top],
        "textposition": "top center",
        "marker": {
            "symbol": "circle-open",
            "size": 16,
            "color": "#222",
            "line": {"width": 2, "color": "#222"},
        },
        "customdata": [_hover(p) for p in top],
        "hovertemplate": "%{customdata}<br>%{y:,.0f} tokens/s, peak %{x:.2f} GiB<extra></extra>",
    }


def _limit_lines(s: RankSummary) -> list[dict]:
    line = {"type": "line", "xref": "x", "yref": "paper", "y0": 0, "y1": 1}
    return [
        {
            **line,
            "x0": s.limit_bytes / GIB,
            "x1": s.limit_bytes / GIB,
            "line": {"color": COLORS["limit"], "width": 2},
        },
        {
            **line,
            "x0": s.fit_below_bytes / GIB,
            "x1": s.fit_below_bytes / GIB,
            "line": {"color": COLORS["limit"], "width": 1.5, "dash": "dash"},
        },
    ]


def _limit_labels(s: RankSummary) -> list[dict]:
    label = {"xref": "x", "yref": "paper", "y": 1, "yanchor": "top", "showarrow": False}
    label |= {"textangle": -90}
    return [
        {
            **label,
            "x": s.limit_bytes / GIB,
            "xshift": -10,  # inside, left of the line
            "text": f"memory limit {s.limit_bytes / GIB:g} GiB",
        },
        {
            **label,
            "x": s.fit_below_bytes / GIB,
            "xshift": 10,  # right of the line, where no layout fits
            "text": f"fits: predicted peak ≤ {s.fit_below_bytes / GIB:.2f} GiB",
        },
    ]


# ---- the page ------------------------------------------------------------------------------
def what_is_drawn(n_points: int, s: RankSummary, kind: str) -> list[str]:
    """The page's account of which layouts are points and which are not, in sentences."""
    folded = s.fit - n_points
    drawn = (
        f"{n_points:,} points, one per row of the ranking: the {s.fit:,} layouts predicted to fit"
    )
    if folded:
        drawn += (
            f", {folded:,} of them folded into the row of a layout that differs only in bucket "
            "size and is predicted alike (step and peak within 0.1%), their buckets in its hover"
        )
    left_out = (
        f"The ranking scored {s.scored:,} layouts; the {s.scored - s.fit:,} predicted not to "
        "fit are not drawn (their peak is estimated only until a pipeline rank is over the limit)"
        if s.scored > s.fit
        else f"The ranking scored {s.scored:,} layouts, all predicted to fit"
    )
    if s.screened_groups or s.screened_branches:
        left_out += (
            f"; neither scored nor drawn: the {s.screened_groups:,} (tp, pp, cp, ZeRO, HSDP, "
            f"schedule) groups and {s.screened_branches:,} (micro-batch, checkpointing, SP) "
            "branches screened out on memory before their layouts were built"
        )
    return [
        drawn + ".",
        left_out + ".",
        f"A layout fits when its predicted peak with {s.allowances} is within the memory limit "
        f"({s.limit_bytes / GIB:g} GiB, the solid line): a predicted peak of at most "
        f"{s.fit_below_bytes / GIB:.2f} GiB (the dashed line).",
        "Colour: tensor × pipeline parallel degree; symbol: ZeRO stage; ringed and numbered: "
        f"the top {min(s.top, n_points):,} rows, as the table prints them; the green step line "
        "is the Pareto front (most tokens/s for at most that memory). Drawn with "
        f"{'WebGL (scattergl)' if kind == 'scattergl' else 'SVG markers'}.",
    ]


def build_rank_page(records, summary: RankSummary | dict, *, webgl_above: int = WEBGL_ABOVE) -> str:
    """The whole HTML page: the figure, what it draws and leaves out, plotly.js inline."""
    points = [_record(RankPoint, r) for r in records]
    summary = _record(RankSummary, summary)
    figure = rank_figure(points, summary, webgl_above=webgl_above)
    kind = _kind(len(points), webgl_above)
    notes = "".join(
        f"<li>{html.escape(line)}</li>" for line in what_is_drawn(len(points), summary, kind)
    )
    payload = {
        "figure": figure,
        "config": PLOT_CONFIG,
        "template": pio.templates[TEMPLATE].to_plotly_json(),
    }
    return _PAGE.format(
        title=html.escape(f"autotune rank · {summary.title}"),
        heading=html.escape(summary.title),
        notes=notes,
        payload=_script_json(payload),
        plotlyjs=get_plotlyjs(),
    )


def _script_json(value) -> str:
    """``value`` as JSON that no text in it can end the ``<script>`` holding it: <, > and /
    escaped, as Plotly's ``to_json_plotly`` does (whose per-element cleaning takes seconds at
    100k points; the figure is plain lists and numbers already)."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("/", "\\/")


def write_rank_page(path: str | Path, records, summary: RankSummary | dict) -> Path:
    """Writes the page to ``path`` whole or not at all (a temporary file beside it, renamed)."""
    path = Path(path)
    text = build_rank_page(records, summary)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp's 0600 → what open() would have given
        os.replace(tmp, path)
    except BaseException as e:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise AutotuneError(
                f"cannot write '{path}': {e.strerror}; choose another --plot path"
            ) from None
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font: 15px system-ui, sans-serif; color: #222; margin: 1.5em auto; padding: 0 1em;
       max-width: 1400px; }}
h1 {{ font-size: 1.3em; margin-bottom: 0.3em; }}
ul.notes {{ color: #555; font-size: 0.92em; margin: 0.2em 0 0.8em; padding-left: 1.2em; }}
#rank-plot {{ width: 100%; }}
</style></head>
<body>
<h1>{heading}</h1>
<ul class="notes" id="what-is-drawn">{notes}</ul>
<div id="rank-plot"></div>
<script type="application/json" id="rank-data">{payload}</script>
<script type="text/javascript">{plotlyjs}</script>
<script type="text/javascript">
(function () {{
  const payload = JSON.parse(document.getElementById("rank-data").textContent);
  const layout = Object.assign({{}}, payload.figure.layout, {{template: payload.template}});
  Plotly.newPlot("rank-plot", payload.figure.data, layout, payload.config);
}})();
</script>
</body></html>
"""
