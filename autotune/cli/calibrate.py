"""``autotune calibrate``: fit the performance model to a study's measured trials.

Loads the study's complete trials, fits the calibration as the search does after each trial
(``autotune.search.study_calibration.fit_study``: span fits for the starting point, then the
step-time
fit), prints every fitted parameter, the span fits and the per-trial residuals with their MAPE,
and with ``-o FILE`` writes the cluster with its ``calibration`` filled: a file that
``autotune search --cluster FILE`` (and ``ClusterSpec.from_file``) reads. It stores nothing:
the search is the database's one writer.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from autotune.cli.args import add_db_arg, add_debug_arg
from autotune.errors import AutotuneError, ConfigError


def add_calibrate_parser(sub) -> None:
    p = sub.add_parser(
        "calibrate",
        help="fit the step-time model to a study's trials; write the cluster file",
        description="Fit the performance model's calibration to the complete trials of a "
        "stored study (link latency and bandwidth and the compute rate from their spans, then "
        "every parameter from their step times), print the parameters and each trial's "
        "measured and predicted step time, and optionally write the calibrated cluster.",
    )
    p.add_argument("--study", required=True, metavar="NAME", help="the study to fit")
    add_db_arg(p)
    p.add_argument(
        "--cluster",
        metavar="FILE|NAME",
        help="the cluster the trials ran on (default: the one the search stored)",
    )
    p.add_argument(
        "-o", "--output", metavar="FILE", help="write the cluster with its calibration as JSON"
    )
    add_debug_arg(p)
    p.set_defaults(run=cmd_calibrate)


def cmd_calibrate(args: argparse.Namespace) -> int:
    if args.db.strip().lower() == "none":
        raise ConfigError(
            "calibrate reads a study's trials from a database: give --db URL (not 'none')"
        )
    from db import Database

    database = Database.open(args.db, create=False)
    try:
        names = [s.name for s in database.list_studies()]
        if args.study not in names:
            raise ConfigError(
                f"no study named '{args.study}' in {database.url_for_display}; "
                f"existing: {', '.join(names) or 'none'}"
            )
        study = database.get_study(args.study)
        fit = _fit(database, study, args.cluster)
    finally:
        database.close()
    print(format_fit(study.name, fit))
    if args.output:
        from autotune.export.files import write_json_atomically

        path = Path(args.output)
        try:
            write_json_atomically(path, fit.cluster_with_calibration().to_dict())
        except OSError as e:
            raise AutotuneError(f"cannot write '{path}': {e.strerror}") from None
        print(f"wrote the calibrated cluster to {path} (autotune search --cluster {path})")
    return 0


def _fit(database, study, cluster_arg: str | None):
    from autotune.model.cluster import ClusterSpec, load_cluster
    from autotune.search.study_calibration import complete_trials, fit_study

    if not complete_trials(database, study.id):
        raise ConfigError(
            f"study '{study.name}' has no complete trials of a built-in workload "
            f"to calibrate from; run a search first (autotune search --study "
            f"{study.name})"
        )
    if cluster_arg is not None:
        cluster = load_cluster(cluster_arg)
    else:
        stored = database.latest_calibration(study.id)
        if stored is None:
            raise ConfigError(
                f"study '{study.name}' has no stored cluster (its search predates "
                "calibration); pass --cluster FILE|NAME for the machine it ran "
                "on"
            )
        # The cluster as the search stored it, its own calibration included (not a fitted
        # one): the fit starts where the search's did, so the same trials give the same fit.
        cluster = ClusterSpec.from_dict(stored.cluster, where="the study's stored cluster")
    return fit_study(database, study.id, cluster)


def format_fit(study_name: str, fit) -> str:
    c = fit.cluster
    lines = [
        f"study '{study_name}': {len(fit.trials)} complete trials on cluster '{c.name}' "
        f"({c.num_nodes} × {c.devices_per_node} {c.device.name}, {c.backend})",
        "",
    ]
    if fit.spans is not None:
        lines.append("from the profiled spans (the fit's starting point):")
        for link in fit.spans.links.values():
            held = "" if link.latency_fitted else " (held at the cluster's: sizes too alike)"
            lines.append(
                f"  {link.link:<11} latency {link.latency_s * 1e6:9.1f} µs{held}, bus "
                f"bandwidth {link.bandwidth_gbs:8.3f} GB/s over {link.num_points} "
                f"collectives, residual {link.residual:.1%}"
            )
        if fit.spans.compute is not None:
            cf = fit.spans.compute
            lines.append(
                f"  compute     {cf.flops_per_s / 1e9:9.2f} GFLOP/s "
                f"({cf.fraction_of_peak:.1%} of peak) over {cf.num_trials} trials, "
                f"residual {cf.residual:.1%}"
            )
        lines.append("")
    lines.append(fit.report.table())
    lines += [
        "",
        f"{'trial':>5}  {'configuration':<44} {'measured ms':>12} "
        f"{'predicted ms':>13} {'error':>8}",
    ]
    for row in fit.rows():
        lines.append(
            f"{row['number']:>5}  {row['config']:<44} {row['measured_s'] * 1e3:>12.2f} "
            f"{row['predicted_s'] * 1e3:>13.2f} {row['error']:>+8.1%}"
        )
    lines.append(f"MAPE {fit.report.mape:.1%} over {len(fit.trials)} trials")
    return "\n".join(lines)
