"""The re-measurement phase, after the search's trials: the finalists measured again in
interleaved rounds, each figure stored with its round, until a best can be declared.

The finalists (``finalist_ids``) are fixed before the first round, so every round compares the
same ones. Each round measures every finalist once, starting one further along each round
(A B C, B C A, …), so drift over a round's minutes falls on all of them alike and the
per-round ratios cancel it (``leaderboard.compare``). Rounds continue until each finalist has
``remeasure_repeats`` of them and the runner-up is no longer tied with the fastest, or
``remeasure_max_repeats`` rounds have run. A finalist that fails is measured no more. The
leaderboard ranks by median throughput and declares the best with its interval
(``leaderboard.declare_best``).

Progress goes to standard error (``autotune.progress.Progress``): on a terminal a line
rewritten after each measurement (``re-measuring:  50% (3/6)``, over the measurements still
planned: the finalists left × the rounds still due, a round more for each tie to resolve), the
round's lines printed above it; off a terminal, one line at the end (``re-measured 3
finalists in 2 rounds in 52.1 s``). Nothing when no round runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

from autotune.errors import ClusterError, TrialFailed
from autotune.progress import Progress
from autotune.status import TrialStatus
from autotune.study.leaderboard import Entry, build_leaderboard, declare_best

if TYPE_CHECKING:
    from autotune.search.schedule import Measurer
    from autotune.search.spec import SearchSpec


def remeasure_top(
    spec: SearchSpec,
    database,
    study_id: int,
    measurer: Measurer,
    say: Callable[[str], None],
    cluster_stopped: Callable[[], str | None],
    *,
    stream: TextIO | None = None,
) -> list[Entry]:
    """Measure the finalists again in interleaved rounds (see the module docstring); the
    final leaderboard. ``cluster_stopped`` says when the cluster can run no more; ``stream``:
    where the progress goes (standard error by default)."""
    board = build_leaderboard(database.list_trials(study_id))
    most = max(spec.remeasure_repeats, spec.remeasure_max_repeats) if spec.remeasure_repeats else 0
    next_round = 1 + max((r for e in board for r in e.rounds if r > 0), default=0)
    finalists = finalist_ids(board, spec.top_k)
    failed: set[int] = set()
    progress = _RoundsProgress(stream, say)
    for done in range(most):
        if cluster_stopped():
            break
        top = [e for e in board if e.trial_id in finalists and e.trial_id not in failed]
        short = [e for e in top if len(e.rounds) < spec.remeasure_repeats]
        if not top or (not short and not _tie_to_resolve(board, top)):
            break
        due = max(1, spec.remeasure_repeats - min(len(e.rounds) for e in top))
        progress.begin_round(len(top) * due)
        shift = done % len(top)
        figures = []
        for entry in top[shift:] + top[:shift]:
            if cluster_stopped():
                break
            try:
                x = measurer.measure(entry.config).throughput_tokens_per_s
            except (TrialFailed, ClusterError) as e:
                failed.add(entry.trial_id)
                progress.measured(entry.trial_id, f"re-measuring trial {entry.number} failed: {e}")
                continue
            add_remeasurement(database, entry.trial_id, x, next_round)
            figures.append(f"trial {entry.number} {x:,.0f}")
            progress.measured(entry.trial_id)
        progress.say(f"re-measured, round {next_round}: {'; '.join(figures)} tok/s")
        next_round += 1
        board = build_leaderboard(database.list_trials(study_id))
    progress.close(len(failed))
    return board


class _RoundsProgress:
    """The rounds' progress (``Progress``, begun with the first round, so nothing is written
    when none runs) and their lines: ``say`` on a terminal first blanks the progress line and
    draws it again below what was said, so neither runs into the other."""

    def __init__(self, stream: TextIO | None, say: Callable[[str], None]) -> None:
        self.stream, self._say = stream, say
        self.line: Progress | None = None
        self.done = self.rounds = 0
        self.trials: set[int] = set()

    def begin_round(self, planned: int) -> None:
        """A round starts with ``planned`` measurements still due, this round's included."""
        if self.line is None:
            self.line = Progress(planned, "re-measuring", self.stream)
        # Progress reads its total at each update: the plan grows by each round a tie adds
        # and shrinks by a failed finalist's rounds.
        self.line.total = self.done + planned
        self.rounds += 1
        self.line.update(self.done)

    def measured(self, trial_id: int, failure: str | None = None) -> None:
        """One measurement done (``failure``: why it failed, said)."""
        self.done += 1
        self.trials.add(trial_id)
        if failure is None:
            self.line.update(self.done)
        else:
            self.say(failure)

    def say(self, text: str) -> None:
        self._blank()
        self._say(text)
        if self.line is not None:
            self.line.update(self.done)

    def close(self, failed: int) -> None:
        if self.line is None:
            return
        self._blank()
        n, r = len(self.trials), self.rounds
        self.line.close(
            f"re-measured {n} finalist{'s' * (n != 1)} in {r} round{'s' * (r != 1)} in "
            f"{{elapsed}}{f'; {failed} failed' if failed else ''}"
        )

    def _blank(self) -> None:
        """Blank the progress line on a terminal (the longest it can be)."""
        line = self.line
        if line is not None and line.tty:
            width = len(f"{line.doing}: 100% ({line.total:,}/{line.total:,})")
            line.stream.write(f"\r{' ' * width}\r")
            line.stream.flush()


def finalist_ids(board: list[Entry], top_k: int) -> set[int]:
    """The trials re-measured before a best is declared: the top_k complete ones by the figure
    each measured during the search, and the study's first trial if it completed.

    The first trial is the plain baseline (``search.plain_baseline``) unless the search was
    started without one: the layout a user would run without autotune. A recommendation has to
    beat it side by side, in the same interleaved rounds. Its one search figure alone can miss
    the top_k by noise (10-23% between trials on a shared machine): in ``bench/
    ranking_stability.py`` the plain layout, the truth's best by 30%, was dropped that way."""
    complete = [e for e in board if e.status == TrialStatus.COMPLETE]
    ranked = sorted(complete, key=lambda e: -e.throughputs[0])
    finalists = {e.trial_id for e in ranked[:top_k]}
    first = min(board, key=lambda e: e.number, default=None)
    if first is not None and first.status == TrialStatus.COMPLETE:
        finalists.add(first.trial_id)
    return finalists


def _tie_to_resolve(board: list[Entry], top: list[Entry]) -> bool:
    """The runner-up is tied with the fastest and both are among those re-measured (with
    top_k 1 another round cannot separate them)."""
    verdict = declare_best(board)
    ids = {e.trial_id for e in top}
    return (
        verdict is not None
        and verdict.is_tie
        and verdict.fastest.trial_id in ids
        and verdict.runner_up.trial_id in ids
    )


def add_remeasurement(database, trial_id: int, throughput: float, round_: int) -> None:
    """Append a re-measurement and its round to a trial's metrics, and store its interval
    over all its runs now (``throughput_interval``)."""
    from autotune.model.noise import throughput_interval

    record = database.get_trial(trial_id)
    m = record.metrics
    runs = m.get("remeasured_throughputs", []) + [throughput]
    metrics = {
        **m,
        "remeasured_throughputs": runs,
        "remeasured_rounds": m.get("remeasured_rounds", []) + [round_],
        "throughput_interval": throughput_interval([m["throughput_tokens_per_s"], *runs]).to_dict(),
    }
    database.update_trial(trial_id, status=record.status, metrics=metrics)
