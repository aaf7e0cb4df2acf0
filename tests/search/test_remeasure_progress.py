"""The search's re-measurement rounds report their progress: on a terminal a line rewritten
after each measurement, the rounds' lines above it; off a terminal one summary line at the end.
Through ``remeasure_top`` itself, on a stored study, with the measurement stubbed (no Ray)."""

from __future__ import annotations

import io
import re
from datetime import UTC, datetime
from types import SimpleNamespace

from autotune.config import TrialConfig
from autotune.errors import TrialFailed
from autotune.search.remeasure import remeasure_top
from autotune.search.spec import SearchSpec
from db import Database, TrialRecord

# Three layouts and the throughput each measures (tokens/s), distinct enough to separate.
LAYOUTS = [
    (TrialConfig(world_size=2, micro_batch_size=m, device="cpu"), x)
    for m, x in ((1, 1000.0), (2, 1500.0), (4, 2400.0))
]
SUMMARY = r"re-measured (\d+) finalists? in (\d+) rounds? in \d+\.\d s"


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class StubMeasurer:
    """Each layout's throughput, the same every time (``figure`` overrides), or a failure."""

    def __init__(self, figure=None, fails=()) -> None:
        self.calls: list[TrialConfig] = []
        self.figure, self.fails = figure, fails

    def measure(self, config: TrialConfig):
        self.calls.append(config)
        if config in self.fails:
            raise TrialFailed("out of memory on rank 1")
        x = dict(LAYOUTS)[config] if self.figure is None else self.figure
        return SimpleNamespace(throughput_tokens_per_s=x)


def _study(tmp_path, figure=None) -> tuple[Database, int]:
    """A study of the three layouts, each complete with its figure (or ``figure``)."""
    database = Database.open(f"sqlite:///{tmp_path / 'r.db'}")
    study = database.create_study("progress", {})
    stored = dict(id=None, study_id=study.id, status="complete", env={}, error=None)
    for number, (config, x) in enumerate(LAYOUTS):
        x = x if figure is None else figure
        metrics = {"throughput_tokens_per_s": x, "step_time_s": config.tokens_per_step / x}
        database.add_trial(
            TrialRecord(
                number=number,
                config=config.resolved(),
                metrics=metrics,
                created_at=datetime.now(UTC),
                **stored,
            )
        )
    return database, study.id


def _remeasure(tmp_path, stream, measurer, said, **spec):
    database, study_id = _study(tmp_path, measurer.figure)
    spec = SearchSpec(**{"top_k": 3, "remeasure_repeats": 2, "remeasure_max_repeats": 4, **spec})
    remeasure_top(spec, database, study_id, measurer, said, lambda: None, stream=stream)
    rounds = [t.metrics.get("remeasured_rounds", []) for t in database.list_trials(study_id)]
    return rounds


def _screen(text: str) -> list[str]:
    """What a terminal shows after ``text``: a carriage return goes back to the line's start,
    and what follows overwrites it."""
    lines, col = [[]], 0
    for ch in text:
        if ch == "\r":
            col = 0
        elif ch == "\n":
            lines.append([])
            col = 0
        else:
            line = lines[-1]
            line[col : col + 1] = [ch]
            col += 1
    return ["".join(line).rstrip() for line in lines]


def _frames(text: str) -> list[tuple[int, int]]:
    """The progress line's (done, planned) each time it is drawn, repeats dropped."""
    drawn = [tuple(map(int, m)) for m in re.findall(r"re-measuring: +\d+% \((\d+)/(\d+)\)", text)]
    return [f for i, f in enumerate(drawn) if i == 0 or f != drawn[i - 1]]


def test_a_terminal_sees_a_line_per_measurement_then_the_summary(tmp_path):
    stream, measurer = FakeTerminal(), StubMeasurer()
    said: list[str] = []
    rounds = _remeasure(tmp_path, stream, measurer, said.append)
    out = stream.getvalue()
    # Two rounds of the three finalists: six measurements, each drawn as done of six.
    assert len(measurer.calls) == 6 and rounds == [[1, 2]] * 3
    assert _frames(out) == [(done, 6) for done in range(7)]
    for done in range(7):  # drawn as Progress draws it
        assert f"re-measuring: {done / 6:4.0%} ({done}/6)" in out
    # One line on the terminal: the summary, in place of the progress line.
    assert out.count("\n") == 1 and out.endswith("\n")
    (summary,) = [line for line in _screen(out) if line]
    assert re.fullmatch(SUMMARY, summary)
    assert re.fullmatch(SUMMARY, summary).groups() == ("3", "2")
    assert len(said) == 2 and said[0].startswith("re-measured, round 1: ")


def test_off_a_terminal_only_the_summary_is_written(tmp_path):
    stream, measurer = io.StringIO(), StubMeasurer()
    rounds = _remeasure(tmp_path, stream, measurer, lambda text: None)
    out = stream.getvalue()
    assert len(measurer.calls) == 6 and rounds == [[1, 2]] * 3
    assert out.endswith("\n") and out.count("\n") == 1 and "\r" not in out
    assert re.fullmatch(SUMMARY, out[:-1]).groups() == ("3", "2")


def test_rounds_a_tie_adds_grow_the_plan_and_lines_said_stay_whole(tmp_path):
    # Every layout measures the same: a tie, so rounds go on to the limit of four, each
    # adding its three measurements to the plan. The lines said go to the same terminal.
    stream, measurer = FakeTerminal(), StubMeasurer(figure=2000.0)
    rounds = _remeasure(tmp_path, stream, measurer, lambda text: print(text, file=stream))
    out = stream.getvalue()
    assert len(measurer.calls) == 12 and rounds == [[1, 2, 3, 4]] * 3
    assert _frames(out) == [
        *((done, 6) for done in range(7)),
        *((done, 9) for done in range(6, 10)),
        *((done, 12) for done in range(9, 13)),
    ]
    screen = [line for line in _screen(out) if line]
    assert [line.split(":")[0] for line in screen[:-1]] == [
        f"re-measured, round {r}" for r in (1, 2, 3, 4)
    ]
    assert re.fullmatch(SUMMARY, screen[-1]).groups() == ("3", "4")


def test_a_failed_finalist_is_said_on_its_own_line_and_counted(tmp_path):
    failing = LAYOUTS[0][0]
    stream, measurer = FakeTerminal(), StubMeasurer(fails={failing})
    _remeasure(tmp_path, stream, measurer, lambda text: print(text, file=stream))
    screen = [line for line in _screen(stream.getvalue()) if line]
    assert screen[0] == "re-measuring trial 0 failed: out of memory on rank 1"
    assert [line.split(":")[0] for line in screen[1:3]] == [
        "re-measured, round 1",
        "re-measured, round 2",
    ]
    # The failed finalist is measured once: five measurements, the plan shrunk to match.
    assert len(measurer.calls) == 5 and _frames(stream.getvalue())[-1] == (5, 5)
    assert re.fullmatch(SUMMARY + "; 1 failed", screen[-1]).groups() == ("3", "2")


def test_no_round_no_progress(tmp_path):
    stream, measurer = FakeTerminal(), StubMeasurer()
    _remeasure(tmp_path, stream, measurer, lambda text: None, remeasure_repeats=0)
    assert stream.getvalue() == "" and measurer.calls == []
