"""``autotune rank --plot``: the figure holds one point per record, its Pareto front is the
brute-force one, its limit lines stand where the screen's arithmetic puts them and the top rows
are ringed; the command draws every row of its ranking, and bad names and paths are one line."""

from __future__ import annotations

import dataclasses
import json
import random
import re

import pytest

from autotune.cli.main import main
from autotune.errors import AutotuneError
from autotune.search.screen import ALLOWANCES
from dashboards.rank_plot import (
    RankPoint,
    RankSummary,
    build_rank_page,
    rank_figure,
    write_rank_page,
)

GIB = 2**30
# title, limit, largest peak that fits, allowances, scored, fit, groups and branches screened, top
SUMMARY = RankSummary("gpt-small on 8 GPUs", 4 * GIB, int(1.98 * GIB), "+15%", 500, 70, 3, 40, 5)


def _records(n: int, seed: int = 0) -> list[RankPoint]:
    """``n`` rows, fastest first, of random layouts: peaks and tokens/s all distinct."""
    rng = random.Random(seed)
    raw = []
    for _ in range(n):
        tp, pp = rng.choice((1, 2, 4, 8)), rng.choice((1, 2, 4))
        step = rng.uniform(0.5, 3.0)
        raw.append((tp, pp, rng.randrange(4), rng.uniform(0.5, 1.9) * GIB, 1e6 / step, step))
    raw.sort(key=lambda r: -r[4])
    return [
        RankPoint(
            rank=i,
            tp=tp,
            pp=pp,
            dp=8 // min(tp * pp, 8),
            zero=zero,
            layout=f"tp {tp} × pp {pp}, ZeRO-{zero} <b>",
            peak_bytes=int(peak),
            tokens_per_s=tps,
            step_time_s=step,
            term="tp_comm" if tp > 1 else "compute",
            term_s=step * 0.6,
            folded=i % 3,
        )
        for i, (tp, pp, zero, peak, tps, step) in enumerate(raw, 1)
    ]


def _traces(figure: dict, meta: str) -> list[dict]:
    return [t for t in figure["data"] if t.get("meta") == meta]


def _points(traces: list[dict]) -> list[tuple[float, float]]:
    return sorted((x, y) for t in traces for x, y in zip(t["x"], t["y"]))


def _drawn(r) -> tuple[float, float]:
    """Where a record is drawn: GiB and tokens/s, to the figure's rounding."""
    return (round(r.peak_bytes / GIB, 4), round(r.tokens_per_s, 1))


# ---- records → figure ----------------------------------------------------------------------
def test_every_record_is_one_point_coloured_by_tp_pp_symbol_by_zero():
    records = _records(70)
    figure = rank_figure(records, SUMMARY)
    layouts = _traces(figure, "layouts")
    assert sum(len(t["x"]) for t in layouts) == len(records)
    assert _points(layouts) == sorted(_drawn(r) for r in records)
    by_rank = {r.rank: r for r in records}
    symbol_of_zero: dict[int, set[str]] = {}
    for t in layouts:
        # A trace per (tp, pp), one colour; each point's symbol follows its ZeRO stage alone.
        assert isinstance(t["marker"]["color"], str) and t["showlegend"] is False
        for text, symbol in zip(t["text"], t["marker"]["symbol"]):
            r = by_rank[int(re.match(r"#(\d+)", text).group(1))]
            assert t["name"] == f"tp {r.tp} × pp {r.pp}"
            symbol_of_zero.setdefault(r.zero, set()).add(symbol)
            # The hover: the layout (escaped), its largest term.
            assert f"tp {r.tp} × pp {r.pp}, ZeRO-{r.zero} &lt;b&gt;" in text
            assert f"most in {r.term}: " in text and "(60%)" in text
    assert all(len(s) == 1 for s in symbol_of_zero.values())
    assert len(set.union(*symbol_of_zero.values())) == len(symbol_of_zero) == 4
    colours = {t["name"]: t["marker"]["color"] for t in layouts}
    assert len(set(colours.values())) == len(colours)
    legend = {t["name"] for t in _traces(figure, "legend")}
    assert set(colours) | {f"ZeRO-{z}" for z in range(4)} == legend


def test_pareto_front_is_the_brute_force_one_as_a_step_line():
    records = _records(300, seed=1)
    figure = rank_figure(records, SUMMARY)
    (front,) = _traces(figure, "pareto")
    # Brute force: no other record has at most its peak and more tokens/s.
    expected = [
        r
        for r in records
        if not any(
            q is not r and q.peak_bytes <= r.peak_bytes and q.tokens_per_s >= r.tokens_per_s
            for q in records
        )
    ]
    assert 2 < len(expected) < len(records)
    assert list(zip(front["x"], front["y"])) == sorted(_drawn(r) for r in expected)
    assert front["line"]["shape"] == "hv"  # flat until the next point: a step
    # The step's height at each record's peak is at least its tokens/s.
    for r in records:
        x, y = _drawn(r)
        assert max(fy for fx, fy in zip(front["x"], front["y"]) if fx <= x) >= y


def test_limit_lines_and_the_top_rows():
    records = _records(70)
    figure = rank_figure(records, SUMMARY)
    lines = figure["layout"]["shapes"]
    assert [(s["x0"], s["x1"]) for s in lines] == [(4.0, 4.0), (int(1.98 * GIB) / GIB,) * 2]
    assert lines[1]["line"]["dash"] == "dash" and "dash" not in lines[0]["line"]
    assert all(s["yref"] == "paper" and (s["y0"], s["y1"]) == (0, 1) for s in lines)
    (top,) = _traces(figure, "top")
    assert top["text"] == ["1", "2", "3", "4", "5"]
    assert list(zip(top["x"], top["y"])) == [_drawn(r) for r in records[:5]]
    assert top["marker"]["symbol"] == "circle-open"


@pytest.mark.parametrize("n, kind", [(40, "scatter"), (41, "scattergl")])
def test_webgl_above_the_threshold(n, kind):
    figure = rank_figure(_records(n), SUMMARY, webgl_above=40)
    assert {t["type"] for t in _traces(figure, "layouts")} == {kind}


def test_plain_dicts_draw_the_same_figure():
    records = _records(20)
    summary = dataclasses.asdict(SUMMARY)
    assert rank_figure([dataclasses.asdict(r) for r in records], summary) == rank_figure(
        records, SUMMARY
    )


def _payload(page: str) -> dict:
    found = re.search(r'<script type="application/json" id="rank-data">(.*?)</script>', page, re.S)
    return json.loads(found.group(1))


def test_page_is_self_contained_and_says_what_it_draws():
    records = _records(70)
    page = build_rank_page(records, dataclasses.replace(SUMMARY, title="<script>x</script>"))
    assert "<script>x</script>" not in page and "&lt;script&gt;x&lt;/script&gt;" in page
    assert not re.search(r"<script[^>]+src=", page)  # plotly.js inline: opens offline
    assert "Plotly.newPlot" in page and len(page) > 3_000_000
    # The figure's JSON holds no "<" (hover line breaks included) that could end its script.
    raw = page.split('id="rank-data">', 1)[1].split("</script>", 1)[0]
    assert "<" not in raw and "\\u003cbr\\u003e" in raw
    figure = _payload(page)["figure"]
    assert sum(len(t["x"]) for t in _traces(figure, "layouts")) == 70
    notes = re.search(r'<ul class="notes" id="what-is-drawn">(.*?)</ul>', page, re.S).group(1)
    assert "70 points, one per row" in notes and "the 70 layouts predicted to fit." in notes
    assert "the 430 predicted not to fit are not drawn" in notes
    assert (
        "neither scored nor drawn: the 3 (tp, pp, cp, ZeRO, HSDP, schedule) groups and 40" in notes
    )
    assert "Drawn with SVG markers" in notes


def test_write_is_atomic_and_a_bad_path_is_one_line(tmp_path):
    path = write_rank_page(tmp_path / "r.html", _records(5), SUMMARY)
    assert path.read_text().startswith("<!DOCTYPE html>")
    assert [p.name for p in path.parent.iterdir()] == ["r.html"]
    (tmp_path / "file").write_text("")
    with pytest.raises(AutotuneError, match="No such file or directory"):
        write_rank_page(tmp_path / "no" / "r.html", _records(5), SUMMARY)
    with pytest.raises(AutotuneError, match=r"cannot write .*; choose another --plot path$"):
        write_rank_page(tmp_path / "file" / "r.html", _records(5), SUMMARY)
    (tmp_path / "dir.html").mkdir()
    with pytest.raises(AutotuneError, match="cannot write"):
        write_rank_page(tmp_path / "dir.html", _records(5), SUMMARY)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.html", "file", "r.html"]


# ---- the command ---------------------------------------------------------------------------
# tests/cli/test_rank.py's ranking: 4 GiB bites, layouts folded, groups and branches screened.
RANK = (
    "rank --model gpt-small --cp 1 --dp-replicate 1 --virtual-stages 2 --cluster a100-sxm4-80gb "
    "--global-batch 32 --seq-len 1024 --memory-limit 4 --json"
).split()


def test_rank_plot_draws_every_row_and_rings_the_top(capsys, tmp_path):
    out = tmp_path / "rank.html"
    assert main([*RANK, "--top", "10000", "--plot", str(out)]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)  # stdout is still the ranking alone
    rows = data["layouts"]
    assert len(rows) == data["fit"] - data["collapsed"] and data["collapsed"] > 0
    assert captured.err.splitlines()[-1] == (
        f"plot: {len(rows):,} rows ({data['fit']:,} layouts predicted to fit) written to {out}"
    )
    figure = _payload(out.read_text())["figure"]
    layouts = _traces(figure, "layouts")
    expected = sorted(
        (round(r["peak_memory_bytes"] / GIB, 4), round(r["tokens_per_s"], 1)) for r in rows
    )
    assert _points(layouts) == expected
    # The limit, and the largest predicted peak that fits it with the CUDA allowances.
    cuda = ALLOWANCES["cuda"]
    fit_below = (4 * GIB - cuda.outside_allocator) / ((1 + cuda.model_margin) * cuda.fragmentation)
    solid, dashed = figure["layout"]["shapes"]
    assert solid["x0"] == 4.0 and dashed["x0"] == pytest.approx(fit_below / GIB, abs=1e-9)
    assert max(x for x, _ in expected) <= dashed["x0"]
    assert max(r["peak_memory_bytes"] for r in rows) > 0.9 * fit_below  # the limit bites

    # --top 5: those five ringed, in the table's order.
    assert main([*RANK, "--top", "5", "--plot", str(out)]) == 0
    top5 = json.loads(capsys.readouterr().out)["layouts"]
    (top,) = _traces(_payload(out.read_text())["figure"], "top")
    assert top["text"] == ["1", "2", "3", "4", "5"]
    assert list(zip(top["x"], top["y"])) == [
        (round(r["peak_memory_bytes"] / GIB, 4), round(r["tokens_per_s"], 1)) for r in top5
    ]


SMALL = ("rank", "--model", "gpt-small", "--cluster", "h100-sxm", "--global-batch", "8")


@pytest.mark.parametrize(
    "plot, code, message",
    [
        (
            "out.png",
            2,
            "--plot writes an HTML page: give a name ending in .html, not '{tmp}/out.png'",
        ),
        ("file/out.html", 1, "cannot write '{tmp}/file/out.html': Not a directory; choose "),
    ],
)
def test_bad_plot_name_or_path_is_one_line(capsys, tmp_path, plot, code, message):
    (tmp_path / "file").write_text("")
    assert main([*SMALL, "--seq-len", "128", "--top", "1", "--plot", str(tmp_path / plot)]) == code
    err = capsys.readouterr().err.splitlines()
    errors = [ln for ln in err if ln.startswith("autotune: error: ")]
    assert len(errors) == 1 and message.format(tmp=tmp_path) in errors[0]
    assert err[-1] == errors[0] and not any("Traceback" in ln for ln in err)


def test_help_names_the_flag(capsys):
    with pytest.raises(SystemExit):
        main(["rank", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--plot FILE.html" in text and "self-contained HTML page" in text
