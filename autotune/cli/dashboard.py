"""``autotune dashboard``: a stored study's HTML report, written to a file or served on
localhost (``dashboards.report`` / ``dashboards.serve``, imported when run: they load plotly)."""

from __future__ import annotations

import argparse
import sys

from autotune.cli.args import add_db_arg, add_debug_arg, opened_db, port


def add_parser(sub) -> None:
    p = sub.add_parser(
        "dashboard",
        help="a study's leaderboard, history and timelines as one HTML file",
        description="Write a self-contained HTML report of a stored study (plotly.js inside, "
        "opens offline): leaderboard, search history, knobs against throughput, throughput "
        "against memory, per-rank timelines, time and memory breakdowns. --serve serves it on "
        "localhost instead, refreshing while a search runs.",
    )
    add_db_arg(p)
    p.add_argument(
        "--study", metavar="NAME", help="study name (default: the latest study in the database)"
    )
    p.add_argument(
        "-o",
        "--output",
        default="dashboard.html",
        metavar="FILE",
        help="HTML file to write (default dashboard.html)",
    )
    p.add_argument(
        "--serve",
        action="store_true",
        help="serve the report on http://127.0.0.1:PORT/ instead of writing "
        "it; the page reloads when the study changes",
    )
    # Not given: dashboards.serve.DEFAULT_PORT (not imported here: it loads plotly).
    p.add_argument(
        "--port", type=port, metavar="N", help="port for --serve (default 8050; 0: any free port)"
    )
    add_debug_arg(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    with opened_db(args.db, create=False, required_by="the dashboard reads a database") as database:
        if args.serve:
            from dashboards.serve import serve

            return serve(database, args.study, **({} if args.port is None else {"port": args.port}))
        from dashboards.data import BuildProgress
        from dashboards.report import write_report

        # A rewritten progress line on a terminal; one summary line on stderr either way.
        path, study = write_report(
            database, args.study, args.output, progress=BuildProgress(sys.stderr)
        )
    print(
        f"wrote the dashboard of study '{study.name}' ({len(study.trials)} trials, "
        f"{len(study.timelines)} timelines) to {path}"
    )
    return 0
