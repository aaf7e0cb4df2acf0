"""``autotune trace``: a stored trial's timeline as a Chrome/Perfetto trace."""

from __future__ import annotations

import argparse

from autotune.cli.args import add_db_arg, add_debug_arg, opened_db
from autotune.errors import AutotuneError


def add_parser(sub) -> None:
    p = sub.add_parser(
        "trace",
        help="export a stored trial's timeline as a Chrome trace",
        description="Write a Chrome/Perfetto trace (one process per rank, "
        "compute and communication on separate tracks) that "
        "chrome://tracing and ui.perfetto.dev open.",
    )
    add_db_arg(p)
    p.add_argument("--trial", type=int, required=True, metavar="ID", help="trial id")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="trace file")
    add_debug_arg(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from autotune.study.store import load_spans
    from profiler.trace import write_chrome_trace

    with opened_db(
        args.db,
        create=False,
        required_by="autotune trace reads the trial's timeline from a database",
    ) as database:
        spans = load_spans(database, args.trial)  # names the trial if it does not exist
    if not spans:
        raise AutotuneError(
            f"trial {args.trial} has no timeline; run it with "
            "num_profiled_steps > 0 (autotune profile)"
        )
    try:
        count = write_chrome_trace(spans, args.output, title=f"autotune trial {args.trial}")
    except OSError as e:
        raise AutotuneError(f"cannot write '{args.output}': {e.strerror}") from None
    print(
        f"wrote {count} spans of {len({s.rank for s in spans})} ranks to {args.output} "
        "(open in ui.perfetto.dev or chrome://tracing)"
    )
    return 0
