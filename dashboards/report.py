"""The report: one self-contained HTML file with plotly.js inline, so it opens offline.

Layout of the file: a header (study, database, workload, limit, trial counts), one section per
view, one ``<script type="application/json">`` holding every figure's JSON (Plotly's encoder
escapes ``<``, ``>`` and ``/``, so no text can close the script), plotly.js once, and a short
script that draws the figures and switches the per-trial views (timeline, memory) when their
selector changes. Everything written here from a trial or a user is escaped with
``html.escape``; the database URL appears only with its password hidden.
"""

from __future__ import annotations

import html
import json
import os
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import plotly.graph_objects as go
import plotly.io as pio
from plotly.io.json import to_json_plotly
from plotly.offline import get_plotlyjs

from autotune.errors import AutotuneError
from autotune.status import TrialStatus, status_rank
from dashboards import figures
from dashboards.data import BuildProgress, StudyData, load_study
from db import Database

# (section id, heading, what it shows); the figures of each are in _figures().
SECTIONS = (
    (
        "leaderboard",
        "Leaderboard",
        "Rank, configuration, throughput, step time, peak memory "
        "against the limit, and status with the reason for infeasible and failed trials.",
    ),
    (
        "history",
        "Search history",
        "Each trial's throughput in the order the search ran them, and the best so far.",
    ),
    ("knobs", "Knobs", "How the knobs relate to throughput among the complete trials."),
    (
        "memory-scatter",
        "Throughput against memory",
        "Every trial's throughput against its peak "
        "memory; the limit is dashed, the Pareto front starred.",
    ),
    (
        "timeline",
        "Timeline",
        "One lane per rank, labelled with its node, over the profiled "
        "steps; hover a span for its op or collective, bytes and duration.",
    ),
    (
        "step-time",
        "Predicted against measured step time",
        "Every complete trial's step time "
        "as the performance model predicted it before the trial ran, against what it measured; "
        "on the dashed line the prediction was exact.",
    ),
    (
        "breakdown",
        "Where the step time goes",
        "Per trial and rank: compute, exposed "
        "communication and idle per profiled step; beside them, for trials the search predicted, "
        "the performance model's step by term.",
    ),
    (
        "memory",
        "Memory by category",
        "Predicted beside measured, on the rank with the highest measured peak.",
    ),
)
FIGURE_IDS = {
    "leaderboard": ("leaderboard",),
    "history": ("history",),
    "knobs": ("knobs-parallel", "knobs-importance"),
    "memory-scatter": ("memory-scatter",),
    "timeline": ("timeline",),
    "step-time": ("step-time",),
    "breakdown": ("breakdown",),
    "memory": ("memory",),
}
PLOT_CONFIG = {"responsive": True, "displaylogo": False}
REFRESH_S = 5


def build_report(
    study: StudyData,
    *,
    live_state: str | None = None,
    generated_at: datetime | None = None,
    progress: BuildProgress | None = None,
) -> str:
    """The whole HTML page. ``live_state`` (serve mode) adds a poll of ``/state`` that reloads
    the page once the study has changed; ``progress`` (begun by ``load_study``) steps through
    the figures and the encoding."""
    single, selectors = _figures(study, progress)
    payload = {
        "config": PLOT_CONFIG,
        "template": pio.templates[figures.TEMPLATE],
        "figures": {k: figure_json(f) for k, f in single.items()},
        "selectors": {
            k: [figure_json(v) for v in variants] for k, (_, variants, _) in selectors.items()
        },
    }
    sections = "\n".join(
        _section(key, heading, about, selectors) for key, heading, about in SECTIONS
    )
    when = (generated_at or datetime.now(UTC)).strftime("%Y-%m-%d %H:%M:%S UTC")
    live = (
        ""
        if live_state is None
        else _LIVE_JS.replace("__STATE__", json.dumps(live_state)).replace(
            "__MS__", str(REFRESH_S * 1000)
        )
    )
    encoded = to_json_plotly(payload)
    if progress is not None:
        progress.step()
    return _PAGE.format(
        title=html.escape(f"autotune · {study.name}"),
        header=_header(study, when),
        sections=sections,
        plotlyjs=get_plotlyjs(),
        payload=encoded,
        script=_DRAW_JS,
        live=live,
    )


def write_report(
    database: Database,
    study_name: str | None,
    path: str | Path,
    *,
    progress: BuildProgress | None = None,
) -> tuple[Path, StudyData]:
    """Builds the report of ``study_name`` (None: the latest study) and writes it atomically;
    ``progress`` shows the build (``autotune dashboard`` passes one on standard error) and ends
    with one summary line."""
    try:
        study = load_study(database, study_name, progress=progress)
        text = build_report(study, progress=progress)
    except BaseException:
        if progress is not None:
            progress.abandon()
        raise
    if progress is not None:
        progress.close(
            f"built the dashboard of {len(study.trials):,} trials and {len(study.timelines)} "
            "timelines in {elapsed}"
        )
    path = Path(path)
    # A temporary file beside it, then a rename: an interrupted build never leaves half a
    # report. Opened normally (not mkstemp's 0600) so the report gets the umask's permissions.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise AutotuneError(f"cannot write '{path}': {e.strerror}; choose another -o") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path, study


# The figures drawn once per study, by id (data.FIGURES_DRAWN_ONCE counts them).
DRAWN_ONCE = {
    "leaderboard": figures.leaderboard_table,
    "history": figures.history,
    "knobs-parallel": figures.knobs_parallel,
    "knobs-importance": figures.knob_importance,
    "memory-scatter": figures.memory_scatter,
    "step-time": figures.step_time_scatter,
    "breakdown": figures.breakdown_bars,
}


def _figures(study: StudyData, progress: BuildProgress | None = None):
    """(figures drawn once by id, selector figures by id: (option labels, variants, initial)),
    a step of ``progress`` for each figure drawn."""

    def drawn(figure):
        if progress is not None:
            progress.step()
        return figure

    single = {key: drawn(draw(study)) for key, draw in DRAWN_ONCE.items()}
    trials = {t.trial_id: t for t in study.trials}
    selectors = {}
    if study.timelines:
        selectors["timeline"] = (
            [_option(trials[tl.trial_id]) for tl in study.timelines],
            [drawn(figures.timeline(tl)) for tl in study.timelines],
            0,
        )
    else:
        single["timeline"] = figures.no_timeline()
    if study.trials:
        best = study.best
        selectors["memory"] = (
            [_option(t) for t in study.trials],
            [drawn(figures.memory_spec(study, t)) for t in study.trials],
            study.trials.index(best) if best is not None else 0,
        )
    else:
        single["memory"] = figures.empty_figure("Memory by category", "no trial yet")
    return single, selectors


def _option(trial) -> str:
    label = figures.style(trial.status).label
    status = "" if trial.status == TrialStatus.COMPLETE else f" · {label}"
    return f"#{trial.position} · {trial.label} · {trial.name}{status}"


def figure_json(fig: go.Figure | dict) -> dict:
    """A figure (or a figure's dict) without its template: the page applies one to all."""
    d = fig.to_plotly_json() if isinstance(fig, go.Figure) else fig
    return {"data": d["data"], "layout": {k: v for k, v in d["layout"].items() if k != "template"}}


def _section(key: str, heading: str, about: str, selectors: dict) -> str:
    parts = [
        f'<section id="{key}"><h2>{html.escape(heading)}</h2>',
        f'<p class="about">{html.escape(about)}</p>',
    ]
    for fig_id in FIGURE_IDS[key]:
        if fig_id in selectors:
            labels, _, initial = selectors[fig_id]
            options = "".join(
                f'<option value="{i}"{" selected" if i == initial else ""}>'
                f"{html.escape(label)}</option>"
                for i, label in enumerate(labels)
            )
            note = (
                f" ({len(labels)} embedded: the first trials on the leaderboard with a timeline)"
                if fig_id == "timeline"
                else ""
            )
            parts.append(
                f'<label class="selector">Trial{html.escape(note)}: <select '
                f'id="select-{fig_id}">{options}</select></label>'
            )
        parts.append(f'<div class="figure" id="fig-{fig_id}"></div>')
    parts.append("</section>")
    return "\n".join(parts)


def _header(study: StudyData, when: str) -> str:
    counts = Counter(t.status for t in study.trials)
    summary = ", ".join(
        f"{counts[s]} {figures.style(s).label}" for s in sorted(counts, key=status_rank)
    )
    best = study.best
    limit = (
        f"{study.limit_bytes / figures.MIB:,.1f} MiB per device"
        if study.limit_bytes
        else "none recorded"
    )
    # Stored configs name their precision (older ones their dtype, the same *-true).
    precisions = sorted(
        {
            t.config.resolved_precision("cpu" if t.config.device == "cpu" else "cuda")
            for t in study.trials
        }
    )
    rows = [
        ("database", study.database),
        ("workload", study.workload),
        ("precision", ", ".join(precisions) or "no trial yet"),
        ("world size", str(study.spec.get("world_size", "?"))),
        ("memory limit", limit),
        ("trials", f"{len(study.trials)} ({summary or 'none yet'})"),
        (
            "timelines",
            f"{len(study.timelines)} embedded of {study.num_with_timeline} trials with one",
        ),
        (
            "best",
            f"{best.label}: {best.name}, {best.throughput:,.0f} tokens/s"
            if best is not None
            else "no complete trial yet",
        ),
        (
            "ranking",
            study.verdict.split("\n", 1)[1] if "\n" in study.verdict else study.verdict or "–",
        ),
        ("generated", when),
    ]
    items = "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in rows)
    return (
        f'<h1>Study <span id="study-name">{html.escape(study.name)}</span></h1>'
        f'<dl class="summary">{items}</dl>'
    )


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1280px;
       padding: 0 1em; color: #222; }}
h1 {{ font-size: 1.5em; margin-bottom: 0.3em; }}
h2 {{ font-size: 1.2em; margin: 1.6em 0 0.2em; border-bottom: 1px solid #ddd; }}
dl.summary {{ display: grid; grid-template-columns: max-content 1fr; gap: 0.15em 1em;
              margin: 0; font-size: 0.92em; }}
dl.summary dt {{ color: #666; }}
dl.summary dd {{ margin: 0; word-break: break-all; }}
p.about {{ color: #555; margin: 0.2em 0 0.5em; font-size: 0.92em; }}
label.selector {{ font-size: 0.92em; }}
label.selector select {{ max-width: 100%; }}
div.figure {{ width: 100%; }}
</style>
</head>
<body>
<header>{header}</header>
<main>
{sections}
</main>
<script type="application/json" id="figures-data">{payload}</script>
<script type="text/javascript">{plotlyjs}</script>
<script type="text/javascript">{script}</script>
{live}
</body>
</html>
"""

_DRAW_JS = """
(function () {
  const payload = JSON.parse(document.getElementById("figures-data").textContent);
  const config = payload.config;
  function styled(layout) { return Object.assign({}, layout, {template: payload.template}); }
  for (const [id, fig] of Object.entries(payload.figures)) {
    Plotly.newPlot("fig-" + id, fig.data, styled(fig.layout), config);
  }
  // Selected trials live in the URL's hash (#timeline=2&memory=5) so a reload keeps them.
  const chosen = new URLSearchParams(location.hash.slice(1));
  function draw(id, index) {
    const variant = payload.selectors[id][index];
    return Plotly.react("fig-" + id, variant.data, styled(variant.layout), config);
  }
  for (const [id, variants] of Object.entries(payload.selectors)) {
    const select = document.getElementById("select-" + id);
    const wanted = Number(chosen.get(id));
    if (chosen.has(id) && wanted >= 0 && wanted < variants.length) {
      select.value = String(wanted);
    }
    draw(id, Number(select.value));
    select.addEventListener("change", function () {
      chosen.set(id, select.value);
      history.replaceState(null, "", "#" + chosen.toString());
      draw(id, Number(select.value));
    });
  }
})();
"""

_LIVE_JS = """<script type="text/javascript">
(function () {
  // Served by `autotune dashboard --serve`: reload once the study has changed.
  const state = __STATE__;
  setInterval(function () {
    fetch("/state", {cache: "no-store"})
      .then(function (r) { return r.ok ? r.text() : state; })
      .then(function (now) { if (now !== state) { location.reload(); } })
      .catch(function () {});
  }, __MS__);
})();
</script>"""
