"""The pages a user reads: every list of knobs (the commands' help, the README, the docs) names
the knobs the config declares, all of them; no text a user reads names an issue of the tracker;
every page the README links exists.

The knobs are ``layouts.KNOB_ORDER`` (each a ``TrialConfig`` field); their words are
``layouts.KNOB_WORDS``. A knob list in a Markdown page sits between ``<!-- knobs -->`` and
``<!-- /knobs -->`` and names each knob's field in backticks (the first mentions, in order).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import pytest

from autotune.cli.main import build_parser
from autotune.config import TrialConfig
from autotune.layouts import KNOB_ORDER, KNOB_WORDS, knobs_in_words

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
KNOB_BLOCK = re.compile(r"<!-- knobs -->(.*?)<!-- /knobs -->", re.S)
ISSUE = re.compile(r"\bissues? #?\d+|\(#\d+\)", re.I)


def _help(command: str) -> str:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.choices and command in a.choices)
    command_parser = sub.choices[command]
    # One unwrapped line, so that a wrap at a hyphen does not split a knob's words.
    command_parser.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=100_000)
    return " ".join(command_parser.format_help().split())


def _pages_text() -> dict[str, str]:
    return {p.name: p.read_text() for p in PAGES}


def test_every_knob_is_a_config_field_and_has_words_in_the_same_order():
    fields = {f.name for f in dataclasses.fields(TrialConfig)}
    assert set(KNOB_ORDER) <= fields
    assert tuple(KNOB_WORDS) == KNOB_ORDER
    words = knobs_in_words()
    assert all(w in words for w in KNOB_WORDS.values())


@pytest.mark.parametrize("command", ["search", "rank"])
def test_the_help_names_every_knob(command):
    text = _help(command)
    missing = [k for k, w in KNOB_WORDS.items() if w not in text]
    assert not missing, f"autotune {command} --help does not name {missing}"


def test_every_knob_list_in_the_docs_names_exactly_the_knobs():
    blocks = [
        (name, block) for name, text in _pages_text().items() for block in KNOB_BLOCK.findall(text)
    ]
    assert {"README.md", "search.md"} <= {name for name, _ in blocks}
    for name, block in blocks:
        fields = {f.name for f in dataclasses.fields(TrialConfig)}
        named = dict.fromkeys(re.findall(r"`([a-z0-9_]+)`", block))  # first mention's order
        listed = [n for n in named if n in fields]
        assert listed == list(KNOB_ORDER), f"{name}: the knob list is {listed}"


def test_the_derived_degrees_name_context_parallelism():
    for name, text in _pages_text().items():
        for found in re.findall(r"world_size / \(([^)]*)\)", text):
            assert "cp" in found, f"{name}: dp = world_size / ({found}) leaves out cp"


def test_no_page_or_help_names_an_issue():
    texts = {**_pages_text(), **{f"{c} --help": _help(c) for c in ("search", "rank", "estimate")}}
    named = {name: ISSUE.findall(text) for name, text in texts.items() if ISSUE.search(text)}
    assert not named


def test_every_page_the_readme_links_exists():
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(((?:docs/)?[\w./-]+\.(?:md|png))\)", readme)
    assert len(links) >= 12
    missing = [link for link in links if not (ROOT / link).exists()]
    assert not missing
    for page in PAGES[1:]:
        for link in re.findall(r"\]\(([\w./-]+\.(?:md|png))\)", page.read_text()):
            assert (page.parent / link).exists(), f"{page.name} links {link}, which is missing"
