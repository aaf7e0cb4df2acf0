"""``autotune rank --plot``'s page in a real browser: headless Chromium (Debian's, driven by
Playwright, launched as ``test_dashboard_browser.py`` launches it) opens the file offline, with no
JavaScript error, and the drawn Plotly figure holds every row the ranking scored and predicted
to fit, drawn with WebGL (the ranking has more rows than ``WEBGL_ABOVE``), the top rows
ringed and numbered."""

from __future__ import annotations

import json

import pytest
from test_dashboard_browser import (
    CHROMIUM,
    CHROMIUM_ARGS,
    PAGE_LOAD_MS,
    missing_browser,
    require_browser,
)

from autotune.cli.main import main
from dashboards.rank_plot import WEBGL_ABOVE

pytestmark = pytest.mark.slow  # starts a browser
DRAWN = (
    "(() => { const gd = document.querySelector('.js-plotly-plot');"
    " return gd && gd.querySelector('.main-svg') && gd._fullLayout"
    " && gd.querySelectorAll('canvas').length > 0; })()"
)
POINTS = (
    "Array.from(document.querySelector('.js-plotly-plot').data)"
    ".filter(t => t.meta === 'layouts').reduce((n, t) => n + t.x.length, 0)"
)


@pytest.fixture
def chromium():
    """Debian's Chromium and Playwright: skipped where missing, a failure under CI."""
    require_browser(missing_browser())
    return CHROMIUM


def test_chromium_draws_every_scored_layout(chromium, tmp_path, capsys):
    path = tmp_path / "rank.html"
    # gpt-small on one H100 node: 4,476 layouts, every one fits, more rows than WEBGL_ABOVE.
    argv = ["rank", "--model", "gpt-small", "--cluster", "h100-sxm", "--global-batch", "16"]
    argv += ["--seq-len", "256", "--top", "7", "--json", "--plot", str(path)]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    rows = data["fit"] - data["collapsed"]
    assert rows > WEBGL_ABOVE

    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            errors, requests = [], []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(path.as_uri(), timeout=PAGE_LOAD_MS)
            page.wait_for_function(DRAWN, timeout=60_000)
            assert page.evaluate(POINTS) == rows
            types = page.evaluate(
                "Array.from(new Set(document.querySelector('.js-plotly-plot')._fullData"
                ".filter(t => t.meta === 'layouts').map(t => t.type)))"
            )
            assert types == ["scattergl"]
            # The top rows: ringed (SVG), numbered 1..7 on the page.
            labels = page.evaluate(
                "Array.from(document.querySelectorAll('#rank-plot .scatterlayer .textpoint'))"
                ".map(t => t.textContent)"
            )
            assert sorted(labels, key=int) == [str(i) for i in range(1, 8)]
            assert f"{rows:,} points, one per row" in page.inner_text("#what-is-drawn")
            assert all(r.startswith("file://") for r in requests)  # nothing from the network
            assert not errors, errors
        finally:
            browser.close()
