"""A process that reads a database while searches write to it, as the dashboard does.

    python read_while_writing.py URL STOP_FILE REPORT_DIR

From the moment a search has created the database until STOP_FILE exists, over and over: reads
every study and its trials (with memory and steps) through ``db.Database``, and the spans of each
trial the first time it appears; and, as ``autotune dashboard --serve`` does when a study
changes, writes the study's HTML report (``dashboards.report.write_report``, where it is
installed) into REPORT_DIR whenever its trials changed. Then prints a JSON summary: the number
of trials each pass saw, the digest of every trial seen, the number of reports written, and the
errors: a read or report that failed, a trial that changed or disappeared once seen. (A search
that re-measures nothing never changes a stored trial.)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import time
from pathlib import Path


def trial_digest(trial, spans) -> str:
    """A trial's stored content (record, memory, steps and spans) in one hash."""
    content = [dataclasses.asdict(trial), [dataclasses.astuple(s) for s in spans]]
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()


def main(url: str, stop_file: str, report_dir: str) -> int:

    try:
        from dashboards.report import write_report
    except ImportError:  # reads only, where the dashboard is not installed
        write_report = None

    seen: dict[int, str] = {}
    spans: dict[int, list] = {}  # read once: a stored trial's spans never change
    reported: dict[str, frozenset[int]] = {}  # the trials of each study's last report
    errors: list[str] = []
    trials_per_pass: list[int] = []
    reports = 0
    database = _wait_for_the_database(url, stop_file)
    try:
        while True:
            # The writers are done once the stop file exists: one last pass then sees the
            # final state (a pass begun before the last write would miss it).
            stopping = os.path.exists(stop_file)
            try:
                current = set()
                for study in database.list_studies():
                    trials = database.list_trials(study.id)
                    ids = frozenset(t.id for t in trials)
                    for trial in trials:
                        if trial.id not in spans:
                            spans[trial.id] = database.trial_spans(trial.id)
                        digest = trial_digest(trial, spans[trial.id])
                        if seen.setdefault(trial.id, digest) != digest:
                            errors.append(f"trial {trial.id} changed after it was read")
                    current |= ids
                    if write_report and ids and reported.get(study.name) != ids:
                        path, _ = write_report(
                            database, study.name, Path(report_dir) / f"{study.name}.html"
                        )
                        if not path.read_text().rstrip().endswith("</html>"):
                            errors.append(f"the report of {study.name} is not whole")
                        reported[study.name] = ids
                        reports += 1
                errors += [f"trial {i} disappeared" for i in sorted(set(seen) - current)]
                trials_per_pass.append(len(current))
            except Exception as e:  # noqa: BLE001 - every failed read is reported
                errors.append(f"{type(e).__name__}: {e}")
            if stopping:
                break
            time.sleep(0.2)
    finally:
        database.close()
    json.dump(
        {"trials_per_pass": trials_per_pass, "digests": seen, "reports": reports, "errors": errors},
        sys.stdout,
    )
    return 0


def _wait_for_the_database(url: str, stop_file: str):
    """The database, once the first search has created it (this reader creates nothing)."""
    from db import Database, StorageError

    while True:
        try:
            return Database.open(url, create=False)
        except StorageError:
            if os.path.exists(stop_file):
                raise
            time.sleep(0.2)


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
