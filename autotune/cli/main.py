"""The ``autotune`` command: ``build_parser`` asks each verb's module to add its subcommand, in
the order ``autotune --help`` lists them, and ``main`` runs the chosen verb's handler.

One module per verb, each parsing its arguments and calling the layer below: ``trial`` (with
``profile``, the trial profiled), ``trace``, ``search``, ``export``, ``dashboard``,
``estimate``, ``rank``, ``calibrate``; what they share is in ``args``. Every error a user can
cause is one line on stderr and a non-zero exit (2: usage, 1: runtime); ``--debug`` adds the
traceback (``args.run_command``). Ctrl-C exits 130 within a few seconds whatever the load, a
second Ctrl-C at once (``interrupt.interrupt_guard``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from autotune.cli import dashboard, export, search, trace, trial
from autotune.cli.args import run_command
from autotune.cli.calibrate import add_calibrate_parser
from autotune.cli.estimate import add_estimate_parser
from autotune.cli.interrupt import interrupt_guard
from autotune.cli.rank import add_rank_parser

VERBS = (
    trial.add_parser,
    trace.add_parser,
    search.add_parser,
    export.add_parser,
    dashboard.add_parser,
    add_estimate_parser,
    add_rank_parser,
    add_calibrate_parser,
)
"""Each adds its subcommand(s) and sets ``run``, its handler; in the order --help lists them."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autotune",
        description="Find the fastest distributed-training configuration "
        "that fits in memory, by measuring.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_parser in VERBS:
        add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with interrupt_guard():
        return run_command(args.run, args)


if __name__ == "__main__":
    sys.exit(main())
