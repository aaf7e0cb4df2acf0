"""``autotune export``: write a stored study's best configuration again (best_config.json,
ds_config.json, the Accelerate / torchtitan configs and megatron_args.txt)."""

from __future__ import annotations

import argparse

from autotune.cli.args import add_db_arg, add_debug_arg, opened_db
from autotune.search.spec import SearchSpec


def add_parser(sub) -> None:
    p = sub.add_parser(
        "export",
        help="write best_config.json, ds_config.json, the "
        "Accelerate / torchtitan configs and megatron_args.txt again",
        description="Export a stored study's best configuration.",
    )
    add_db_arg(p, with_help=False)
    p.add_argument("--study", default=SearchSpec().study_name, metavar="NAME")
    p.add_argument("--out", default=".", metavar="DIR")
    add_debug_arg(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from autotune.export.best_config import export_study

    with opened_db(
        args.db, create=False, required_by="autotune export reads the study from a database"
    ) as database:
        paths = export_study(database, args.study, args.out)
    print(f"wrote {', '.join(map(str, paths))}")
    return 0
