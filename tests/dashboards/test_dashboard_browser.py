"""The report in a real browser: headless Chromium (Debian's, driven by Playwright) opens the
file offline with no JavaScript error, draws every figure, shows the script-tag study name and
the HTML error text as text (no dialog opens), and switches the per-trial views."""

from __future__ import annotations

import os

import dashboard_study as ds
import pytest

from dashboards.data import MAX_SPANS_PER_TIMELINE
from dashboards.report import write_report
from db import Database

CHROMIUM = "/usr/bin/chromium"
pytestmark = [
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM),
        reason=f"no {CHROMIUM}: install Debian's chromium (apt-get install "
        "chromium; .ci/run does) to run the browser test",
    ),
    pytest.mark.filterwarnings("ignore:Query string argument"),
]
# --no-sandbox: Chromium refuses to run as root (CI) with its sandbox; the page is our own file.
# --enable-unsafe-swiftshader: software WebGL (parallel coordinates) on machines without a GPU.
CHROMIUM_ARGS = ["--no-sandbox", "--enable-unsafe-swiftshader"]
ALL_DRAWN = (
    "document.querySelectorAll('div.figure').length > 0 && "
    "Array.from(document.querySelectorAll('div.figure')).every("
    "d => d.classList.contains('js-plotly-plot') && d.querySelector('.main-svg'))"
)


@pytest.fixture(scope="module")
def report_path(executor, tmp_path_factory):
    url = ds.build(executor, tmp_path_factory.getbasetemp())
    with Database.open(url, create=False) as database:
        path, _ = write_report(database, ds.NAME, tmp_path_factory.mktemp("browser") / "r.html")
    return path


def test_chromium_draws_every_figure_without_errors(report_path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            errors, dialogs, requests = [], [], []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(report_path.as_uri())
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
