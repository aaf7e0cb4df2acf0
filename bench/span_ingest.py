"""Span storage: ingestion rate, bytes on disk, and timeline reads, on SQLite.

Measures, with spans shaped like a profiler's (8 ranks, per-rank increasing starts on an
epoch-based ns clock, durations of 1-500 µs, names from a small vocabulary of aten ops,
collectives and step phases, payload bytes on comm/p2p spans):

1. **Ingestion**: spans/s through ``Database.add_trial`` into a fresh SQLite file (the trial row,
   its memory and step rows and the spans, one transaction, commit included); median of
   ``--runs`` runs of ``--spans-per-run`` spans, each run into a new file.
2. **Size and reads**: a database of ``--trials`` trials holding ``--total-spans`` spans in all;
   the file size after the WAL is checkpointed (``Database.close``), per span and per million
   spans; the time of ``trial_spans(trial_id)`` and ``trial_spans(trial_id, rank=0)`` (median of
   ``--reads`` reads, frozen records built).
3. **Layouts** (``--no-layouts`` skips): the same spans as plain rows through the sqlite3 driver
   into three layouts of the span table, to show what the timeline index costs: a rowid table
   with no index, a rowid table with an index on (trial_id, rank, start_ns), and the layout
   ``db`` uses, a ``WITHOUT ROWID`` table whose primary key (trial_id, rank, start_ns, seq) is
   the timeline order.
4. **Insert path**: SQLAlchemy Core ``insert()`` with a list of dicts against the driver-level
   ``executemany`` of tuples that ``add_trial`` uses, same table, same rows.

Usage (from the repo root)::

    python bench/span_ingest.py            # table
    python bench/span_ingest.py --json     # raw figures as JSON
    python bench/span_ingest.py --runs 3 --total-spans 200000 --no-layouts   # quick smoke run
"""

from __future__ import annotations

import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

import argparse  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import sqlite3  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from datetime import UTC, datetime  # noqa: E402

import sqlalchemy  # noqa: E402

from db import (  # noqa: E402
    Database,
    RankMemoryRecord,
    SpanRecord,
    StepMetricRecord,
    TrialRecord,
)

TARGET_SPANS_PER_S = 300_000
CLOCK_ORIGIN_NS = 1_764_000_000_000_000_000  # time.time_ns()-like: 8-byte integers

COMPUTE_OPS = (
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::gelu",
    "aten::_softmax",
    "aten::layer_norm",
    "aten::add_",
    "aten::mul",
    "aten::copy_",
    "aten::view",
    "aten::scaled_dot_product_attention",
    "aten::embedding",
    "aten::native_dropout",
    "aten::sum",
    "aten::_foreach_add_",
    "aten::_foreach_mul_",
)
COLLECTIVES = (
    ("all_reduce", "dp"),
    ("reduce_scatter_tensor", "dp"),
    ("all_gather_into_tensor", "dp"),
    ("all_reduce", "tp"),
)
PHASES = ("forward", "backward", "optimizer")


def log(message: str) -> None:
    print(f"[span_ingest] {message}", file=sys.stderr, flush=True)


# ---- data ------------------------------------------------------------------------------------
def make_spans(num_spans: int, *, ranks: int, seed: int) -> list[SpanRecord]:
    """``num_spans`` spans, rank after rank (as a driver concatenates the ranks' results)."""
    rng = random.Random(seed)
    spans: list[SpanRecord] = []
    per_rank = num_spans // ranks
    for rank in range(ranks):
        count = per_rank + (1 if rank < num_spans % ranks else 0)
        clock = CLOCK_ORIGIN_NS + rng.randint(0, 50_000)
        step = 0
        emitted = 0
        while emitted < count:
            # One step: a 'step' span per phase enclosing ops and, in backward, collectives.
            for phase in PHASES:
                if emitted >= count:
                    break
                phase_start = clock
                spans.append(SpanRecord(rank, step, "step", phase, phase, phase_start, 0))
                phase_index = len(spans) - 1
                emitted += 1
                for _ in range(rng.randint(20, 60)):
                    if emitted >= count:
                        break
                    duration = rng.randint(1_000, 500_000)
                    roll = rng.random()
                    if phase == "backward" and roll < 0.15:
                        name, group = rng.choice(COLLECTIVES)
                        spans.append(
                            SpanRecord(
                                rank,
                                step,
                                "comm",
                                name,
                                phase,
                                clock,
                                duration,
                                bytes=rng.choice((1, 4, 25, 50)) << 20,
                                group=group,
                            )
                        )
                    elif roll < 0.02:
                        spans.append(
                            SpanRecord(
                                rank,
                                step,
                                "p2p",
                                rng.choice(("send", "recv")),
                                phase,
                                clock,
                                duration,
                                bytes=4 << 20,
                                group="pp",
                            )
                        )
                    else:
                        spans.append(
                            SpanRecord(
                                rank,
                                step,
                                "compute",
                                rng.choice(COMPUTE_OPS),
                                "op",
                                clock,
                                duration,
                            )
                        )
                    emitted += 1
                    clock += duration + rng.randint(100, 20_000)
                spans[phase_index] = SpanRecord(
                    rank, step, "step", phase, phase, phase_start, clock - phase_start
                )
            step += 1
    return spans


def make_trial(study_id: int | None, number: int | None, ranks: int) -> TrialRecord:
    memory = tuple(
        RankMemoryRecord(rank, category, 1 << 30, (1 << 30) + rank)
        for rank in range(ranks)
        for category in (
            "parameters",
            "gradients",
            "optimizer_state",
            "activations",
            "other",
            "peak",
        )
    )
    steps = tuple(
        StepMetricRecord(rank, step, "timed", 0.1 + 0.001 * step, 5.0 - 0.01 * step)
        for rank in range(ranks)
        for step in range(20)
    )
    return TrialRecord(
        id=None,
        study_id=study_id,
        number=number,
        status="complete",
        config={"zero_stage": 2, "tp_degree": 2, "pp_degree": 2, "bucket_mb": 25},
        metrics={"step_time_s": 0.1, "throughput_tokens_per_s": 1.0e5},
        env={"torch": "2.13.0", "device": "cpu", "world_size": ranks},
        error=None,
        created_at=datetime.now(UTC),
        memory=memory,
        steps=steps,
    )


def file_bytes(path: str) -> int:
    return sum(
        os.path.getsize(path + suffix)
        for suffix in ("", "-wal", "-shm")
        if os.path.exists(path + suffix)
    )


# ---- 1. ingestion ----------------------------------------------------------------------------
def bench_ingest(spans: list[SpanRecord], runs: int, ranks: int, workdir: str) -> dict:
    rates = []
    for run in range(runs):
        path = os.path.join(workdir, f"ingest-{run}.db")
        with Database.open(f"sqlite:///{path}") as database:
            study = database.create_study("bench", {})
            trial = make_trial(study.id, 0, ranks)
            start = time.perf_counter()
            database.add_trial(trial, spans)
            elapsed = time.perf_counter() - start
        rates.append(len(spans) / elapsed)
        log(f"ingest run {run}: {rates[-1]:,.0f} spans/s")
    return {
        "spans_per_run": len(spans),
        "runs": runs,
        "rates": rates,
        "median_spans_per_s": statistics.median(rates),
    }


# ---- 2. size and reads -----------------------------------------------------------------------
def bench_database(total_spans: int, trials: int, ranks: int, reads: int, workdir: str) -> dict:
    path = os.path.join(workdir, "million.db")
    per_trial = total_spans // trials
    stored = 0
    insert_s = 0.0
    with Database.open(f"sqlite:///{path}") as database:
        study = database.create_study("bench", {})
        for number in range(trials):
            spans = make_spans(per_trial, ranks=ranks, seed=1000 + number)
            start = time.perf_counter()
            trial_id = database.add_trial(make_trial(study.id, number, ranks), spans)
            insert_s += time.perf_counter() - start
            stored += len(spans)
        assert database.count_spans() == stored
        middle = database.list_trials(study.id)[trials // 2].id

        def timed(call) -> tuple[float, int]:
            times = []
            for _ in range(reads):
                start = time.perf_counter()
                result = call()
                times.append(time.perf_counter() - start)
            return statistics.median(times), len(result)

        trial_s, trial_count = timed(lambda: database.trial_spans(middle))
        rank_s, rank_count = timed(lambda: database.trial_spans(middle, rank=0))
        start = time.perf_counter()
        database.count_spans()
        count_s = time.perf_counter() - start
    size = file_bytes(path)  # close() checkpointed the WAL into the file and removed it
    return {
        "spans": stored,
        "trials": trials,
        "ranks": ranks,
        "insert_spans_per_s": stored / insert_s,
        "file_bytes": size,
        "wal_left": os.path.exists(path + "-wal"),
        "bytes_per_span": size / stored,
        "mb_per_million_spans": size / stored,
        "read_trial_s": trial_s,
        "read_trial_spans": trial_count,
        "read_rank_s": rank_s,
        "read_rank_spans": rank_count,
        "count_all_s": count_s,
        "last_trial_id": trial_id,
    }


# ---- 3. layouts ------------------------------------------------------------------------------
COLUMNS = (
    "trial_id INTEGER NOT NULL, rank INTEGER NOT NULL, start_ns INTEGER NOT NULL, "
    "seq INTEGER NOT NULL, step INTEGER NOT NULL, name_id INTEGER NOT NULL, "
    "dur_ns INTEGER NOT NULL, bytes INTEGER NOT NULL"
)
LAYOUTS = {
    "rowid table, no index": (f"CREATE TABLE spans ({COLUMNS}) STRICT", "ORDER BY rank, start_ns"),
    "rowid table + index (trial_id, rank, start_ns)": (
        f"CREATE TABLE spans ({COLUMNS}) STRICT; "
        "CREATE INDEX ix_spans_timeline ON spans (trial_id, rank, start_ns)",
        "ORDER BY rank, start_ns",
    ),
    "WITHOUT ROWID, pk (trial_id, rank, start_ns, seq) [db]": (
        f"CREATE TABLE spans ({COLUMNS}, PRIMARY KEY (trial_id, rank, start_ns, seq)) "
        "WITHOUT ROWID, STRICT",
        "ORDER BY rank, start_ns, seq",
    ),
}


def span_rows(spans: list[SpanRecord], trial_id: int, names: dict) -> list[tuple]:
    origin = spans[0].start_ns
    rows = []
    for seq, s in enumerate(spans):
        key = (s.kind, s.name, s.category, s.group)
        name_id = names.setdefault(key, len(names) + 1)
        rows.append(
            (trial_id, s.rank, s.start_ns - origin, seq, s.step, name_id, s.dur_ns, s.bytes)
        )
    return rows


def _median_query_s(connection: sqlite3.Connection, reads: int, sql: str, params: tuple) -> float:
    times = []
    for _ in range(reads):
        start = time.perf_counter()
        connection.execute(sql, params).fetchall()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_layouts(total_spans: int, trials: int, ranks: int, reads: int, workdir: str) -> list:
    names: dict = {}
    per_trial = total_spans // trials
    trial_rows = [
        span_rows(make_spans(per_trial, ranks=ranks, seed=1000 + t), t + 1, names)
        for t in range(trials)
    ]
    results = []
    for index, (layout, (ddl, order)) in enumerate(LAYOUTS.items()):
        path = os.path.join(workdir, f"layout-{index}.db")
        connection = sqlite3.connect(path, isolation_level=None)
        connection.execute("PRAGMA journal_mode = WAL")
        connection.execute("PRAGMA synchronous = NORMAL")
        connection.executescript(ddl)
        insert_s = 0.0
        for rows in trial_rows:
            start = time.perf_counter()
            connection.execute("BEGIN")
            connection.executemany("INSERT INTO spans VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
            connection.execute("COMMIT")
            insert_s += time.perf_counter() - start
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        size = file_bytes(path)
        middle = trials // 2 + 1
        columns = "rank, step, name_id, start_ns, dur_ns, bytes"

        trial_s = _median_query_s(
            connection, reads, f"SELECT {columns} FROM spans WHERE trial_id = ? {order}", (middle,)
        )
        rank_s = _median_query_s(
            connection,
            reads,
            f"SELECT {columns} FROM spans WHERE trial_id = ? AND rank = ? {order}",
            (middle, 0),
        )
        connection.close()
        stored = sum(len(rows) for rows in trial_rows)
        results.append(
            {
                "layout": layout,
                "rows_per_s": stored / insert_s,
                "bytes_per_span": size / stored,
                "read_trial_s": trial_s,
                "read_rank_s": rank_s,
            }
        )
        log(f"layout {layout}: {stored / insert_s:,.0f} rows/s")
    return results


# ---- 4. insert path --------------------------------------------------------------------------
def bench_insert_paths(spans: list[SpanRecord], workdir: str) -> dict:
    from db.models import SPAN_COLUMNS, SpanRow

    rows = span_rows(spans, 1, {})
    results = {}
    for label in ("core_insert_dicts", "driver_executemany"):
        path = os.path.join(workdir, f"path-{label}.db")
        engine = sqlalchemy.create_engine(f"sqlite:///{path}")
        SpanRow.__table__.create(engine)  # same DDL as db, without its foreign-key parents
        table = SpanRow.__table__
        start = time.perf_counter()
        with engine.begin() as connection:
            if label == "core_insert_dicts":
                connection.execute(
                    sqlalchemy.insert(table), [dict(zip(SPAN_COLUMNS, row)) for row in rows]
                )
            else:
                cursor = connection.connection.cursor()
                cursor.executemany(
                    str(sqlalchemy.insert(table).compile(dialect=engine.dialect)), rows
                )
                cursor.close()
        results[label] = len(rows) / (time.perf_counter() - start)
        engine.dispose()
        log(f"insert path {label}: {results[label]:,.0f} rows/s")
    return results


# ---- report ----------------------------------------------------------------------------------
def print_table(figures: dict) -> None:
    ingest, database = figures["ingest"], figures["database"]
    ok = "OK" if ingest["median_spans_per_s"] >= TARGET_SPANS_PER_S else "BELOW TARGET"
    env = figures["env"]
    print(
        f"span storage on SQLite {env['sqlite']} (SQLAlchemy {env['sqlalchemy']}, "
        f"Python {env['python']}, {env['cpus']} CPUs)"
    )
    print()
    print(f"1. ingestion through Database.add_trial, fresh file, {figures['ranks']} ranks")
    print(f"   spans per run                  {ingest['spans_per_run']:>12,}")
    median = f"median of {ingest['runs']} runs"
    print(
        f"   {median:30} {ingest['median_spans_per_s']:>12,.0f} spans/s   "
        f"(target {TARGET_SPANS_PER_S:,}: {ok})"
    )
    print("   runs                           " + ", ".join(f"{r:,.0f}" for r in ingest["rates"]))
    print()
    print(
        f"2. database of {database['spans']:,} spans in {database['trials']} trials of "
        f"{database['ranks']} ranks"
    )
    print(f"   ingest while filling it        {database['insert_spans_per_s']:>12,.0f} spans/s")
    print(
        f"   file size, WAL checkpointed    {database['file_bytes'] / 2**20:>12.1f} MiB   "
        f"({database['bytes_per_span']:.1f} bytes/span = "
        f"{database['bytes_per_span']:.1f} MB per million spans)"
    )
    print(
        f"   trial_spans(trial)             {database['read_trial_s'] * 1e3:>12.1f} ms     "
        f"({database['read_trial_spans']:,} spans, "
        f"{database['read_trial_s'] / database['read_trial_spans'] * 1e6:.2f} µs/span)"
    )
    print(
        f"   trial_spans(trial, rank=0)     {database['read_rank_s'] * 1e3:>12.1f} ms     "
        f"({database['read_rank_spans']:,} spans)"
    )
    print(f"   count_spans() over all         {database['count_all_s'] * 1e3:>12.1f} ms")
    if figures.get("layouts"):
        print()
        print(
            f"3. span-table layouts (sqlite3 executemany of ready tuples, same "
            f"{database['spans']:,} rows)"
        )
        print(f"   {'layout':56} {'rows/s':>10} {'B/span':>7} {'trial ms':>9} {'rank ms':>8}")
        for row in figures["layouts"]:
            print(
                f"   {row['layout']:56} {row['rows_per_s']:>10,.0f} "
                f"{row['bytes_per_span']:>7.1f} {row['read_trial_s'] * 1e3:>9.1f} "
                f"{row['read_rank_s'] * 1e3:>8.1f}"
            )
    if figures.get("insert_paths"):
        paths = figures["insert_paths"]
        print()
        print(f"4. insert path, {figures['ingest']['spans_per_run']:,} ready rows, db's span table")
        print(
            f"   SQLAlchemy Core insert(), list of dicts   {paths['core_insert_dicts']:>10,.0f}"
            " rows/s"
        )
        print(
            f"   driver executemany, tuples (add_trial)    "
            f"{paths['driver_executemany']:>10,.0f} rows/s"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="ingestion runs (median reported)")
    parser.add_argument("--spans-per-run", type=int, default=200_000)
    parser.add_argument(
        "--total-spans",
        type=int,
        default=1_000_000,
        help="spans in the database that size and reads are measured on",
    )
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--reads", type=int, default=5, help="reads per query (median reported)")
    parser.add_argument(
        "--no-layouts", action="store_true", help="skip the layout and insert-path comparisons"
    )
    parser.add_argument("--json", action="store_true", help="print the raw figures as JSON")
    args = parser.parse_args()

    figures: dict = {
        "ranks": args.ranks,
        "env": {
            "sqlite": sqlite3.sqlite_version,
            "sqlalchemy": sqlalchemy.__version__,
            "python": sys.version.split()[0],
            "cpus": os.cpu_count(),
        },
    }
    with tempfile.TemporaryDirectory(prefix="span_ingest-") as workdir:
        spans = make_spans(args.spans_per_run, ranks=args.ranks, seed=0)
        log(f"{len(spans):,} spans generated")
        figures["ingest"] = bench_ingest(spans, args.runs, args.ranks, workdir)
        figures["database"] = bench_database(
            args.total_spans, args.trials, args.ranks, args.reads, workdir
        )
        if not args.no_layouts:
            figures["layouts"] = bench_layouts(
                args.total_spans, args.trials, args.ranks, args.reads, workdir
            )
            figures["insert_paths"] = bench_insert_paths(spans, workdir)
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print_table(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
