"""The report in a real browser: headless Chromium (Debian's, driven by Playwright) opens the
file offline with no JavaScript error, draws every figure, shows the script-tag study name and
the HTML error text as text (no dialog opens), and switches the per-trial views; and the page
``autotune dashboard`` writes for a study holding a trial of every status draws each status.

Without Chromium (or Playwright) the browser tests are skipped, except under CI (``CI`` set),
which installs both (``.ci/run``): there a missing browser fails them instead."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dashboard_study as ds
import pytest

from autotune.status import TrialStatus
from dashboards.data import MAX_SPANS_PER_TIMELINE
from dashboards.figures import NOT_MEASURED, STATUS_LABELS
from dashboards.report import write_report
from db import Database

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:Query string argument")]
# --no-sandbox: Chromium refuses to run as root (CI) with its sandbox; the page is our own file.
# --enable-unsafe-swiftshader: software WebGL (parallel coordinates) on machines without a GPU.
CHROMIUM_ARGS = ["--no-sandbox", "--enable-unsafe-swiftshader"]
PAGE_LOAD_MS = 120_000
"""A page's load event: the inline Plotly bundle (~4 MB) is parsed first, which took over
Playwright's default 30 s on a loaded 2-core machine."""
ALL_DRAWN = (
    "document.querySelectorAll('div.figure').length > 0 && "
    "Array.from(document.querySelectorAll('div.figure')).every("
    "d => d.classList.contains('js-plotly-plot') && d.querySelector('.main-svg'))"
)
LEGEND = "Array.from(document.querySelectorAll('#fig-{fig} .legendtext')).map(e => e.textContent)"


def missing_browser(path: str = CHROMIUM) -> str | None:
    """Why the browser tests cannot run here (None when they can)."""
    if not os.path.exists(path):
        return (
            f"no {path}: install Debian's chromium (apt-get install chromium; .ci/run does) "
            "to run the browser tests"
        )
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed: pip install -e '.[test]'"
    return None


def require_browser(reason: str | None, environ=os.environ) -> None:
    """Skips for ``reason``; under CI, which installs the browser, fails instead."""
    if reason is None:
        return
    if environ.get("CI"):
        pytest.fail(f"the browser tests must run under CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def chromium() -> str:
    require_browser(missing_browser())
    return CHROMIUM


@pytest.fixture(scope="module")
def report_path(executor, tmp_path_factory):
    url = ds.build(executor, tmp_path_factory.getbasetemp())
    with Database.open(url, create=False) as database:
        path, _ = write_report(database, ds.NAME, tmp_path_factory.mktemp("browser") / "r.html")
    return path


def test_chromium_draws_every_figure_without_errors(chromium, report_path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            errors, dialogs, requests = [], [], []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(report_path.as_uri(), timeout=PAGE_LOAD_MS)
            page.wait_for_function(ALL_DRAWN, timeout=60_000)
            figures = page.locator("div.figure").count()
            assert figures == 9
            assert page.locator("div.figure.js-plotly-plot").count() == figures
            assert (
                page.evaluate(
                    "Array.from(document.querySelectorAll('div.figure'))"
                    ".filter(d => d.querySelector('.main-svg')).length"
                )
                == figures
            )
            assert all(r.startswith("file://") for r in requests)  # nothing from the network

            # Names and error texts are text, not markup.
            assert page.inner_text("#study-name") == ds.NAME
            assert "<img src=x" in page.inner_text("#fig-leaderboard")
            # The timeline draws the capped number of bars; switching trials redraws it.
            bars = "document.querySelectorAll('#fig-timeline .trace.bars .point').length"
            assert page.evaluate(bars) == MAX_SPANS_PER_TIMELINE
            title = page.text_content("#fig-timeline .gtitle")
            options = page.locator("#select-timeline option").all_inner_texts()
            assert len(options) >= 2
            page.select_option("#select-timeline", "1")
            page.wait_for_function(
                f"document.querySelector('#fig-timeline .gtitle').textContent !== {title!r}"
            )
            number = options[1].split("trial ")[1].split(" ")[0]
            assert f"trial {number}:" in page.text_content("#fig-timeline .gtitle")
            # The failed trial's memory view: predicted only.
            failed = next(
                i
                for i, o in enumerate(page.locator("#select-memory option").all_inner_texts())
                if "failed" in o
            )
            page.select_option("#select-memory", str(failed))
            page.wait_for_function(
                "document.querySelector('#fig-memory .gtitle').textContent"
                ".includes('Memory of trial')"
            )
            assert "predicted only" in page.inner_text("#fig-memory")
            assert page.evaluate("location.hash") == f"#timeline=1&memory={failed}"
            page.reload()  # as --serve does when the study changes: the choices stay
            page.wait_for_function(ALL_DRAWN, timeout=60_000)
            assert page.input_value("#select-memory") == str(failed)
            assert page.input_value("#select-timeline") == "1"
            assert not errors, errors
            assert not dialogs, dialogs
        finally:
            browser.close()


@pytest.mark.parametrize(
    "environ, outcome",
    [({"CI": "true"}, pytest.fail.Exception), ({}, pytest.skip.Exception)],
)
def test_a_missing_browser_fails_under_ci_and_is_skipped_elsewhere(tmp_path, environ, outcome):
    reason = missing_browser(str(tmp_path / "no-chromium"))
    assert reason is not None and "no-chromium" in reason
    # BaseException: a skip where a failure is due must not skip this test too.
    with pytest.raises(BaseException, match="no-chromium") as raised:
        require_browser(reason, environ)
    assert raised.type is outcome
    require_browser(None, environ)  # a browser that is there: nothing happens


@pytest.fixture(scope="module")
def every_status_page(tmp_path_factory) -> Path:
    """The page the real command writes for a study holding a trial of every status."""
    directory = tmp_path_factory.mktemp("statuses")
    url = f"sqlite:///{directory / 'statuses.db'}"
    ds.statuses_study(url, ds.EVERY_STATUS, ds.every_status())
    path = directory / "every.html"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "autotune", "dashboard", "--db", url]
        + ["--study", ds.EVERY_STATUS, "-o", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "wrote the dashboard of study 'every-status' (7 trials, 2 timelines)" in done.stdout
    assert "built the dashboard of 7 trials and 2 timelines in" in done.stderr
    return path


def test_chromium_draws_a_study_of_every_status(chromium, every_status_page):
    from playwright.sync_api import sync_playwright

    labels = [STATUS_LABELS[s] for s in TrialStatus]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            errors = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(every_status_page.as_uri(), timeout=PAGE_LOAD_MS)
            page.wait_for_function(ALL_DRAWN, timeout=60_000)
            assert page.locator("div.figure").count() == 9
            legend = page.evaluate(LEGEND.format(fig="history"))
            assert legend == [*labels, "best so far"]
            assert NOT_MEASURED in page.inner_text("#fig-history")
            # Markers drawn: two measured, five on the strip (the passed-over one among them).
            assert page.locator("#fig-history .scatterlayer .point").count() == 7
            scatter = page.evaluate(LEGEND.format(fig="memory-scatter"))
            assert set(labels[:4]) <= set(scatter)  # failed and running have no peak: noted
            board = page.inner_text("#fig-leaderboard")
            assert all(label in board for label in labels)
            assert not errors, errors
        finally:
            browser.close()
