"""Measured tables, the table executor, the baseline strategies and the replay (no Ray)."""

import dataclasses
import importlib.util
import json
import random
import statistics
from pathlib import Path

import pytest
from testkit.replay_table import (
    CSV_COLUMNS,
    Answer,
    MeasuredRow,
    MeasuredTable,
    TableExecutor,
    TableGroup,
    TableTraining,
    one_round_trials,
    replay,
    trial_wall_s,
)
from testkit.strategies import (
    DeepSpeedHeuristic,
    GridStrategy,
    RandomStrategy,
    TPInsideNodeRule,
)

from autotune.config import TrialConfig, WorkloadSpec
from autotune.errors import ConfigError
from autotune.layouts import enumerate_configs, short_name
from autotune.search.strategies.base import Measured
from autotune.shapes import ModelShape

ROOT = Path(__file__).resolve().parents[2]

# (GPUs, global batch, micro batch, hidden, heads, layers, seq, tp, dp, pp, ms)
BIG = [
    (4, 16, mb, 1024, 16, 24, 1024, tp, 4 // (tp * pp), pp, ms)
    for mb, tp, pp, ms in [
        (1, 1, 1, 500.0),
        (2, 1, 1, 450.0),
        (4, 1, 1, 430.0),
        (1, 2, 1, 420.0),
        (2, 2, 1, 400.0),
        (4, 2, 1, 410.0),
        (1, 4, 1, 600.0),
        (1, 1, 2, 480.0),
        (2, 1, 2, 470.0),
    ]
]
SMALL = [(2, 8, mb, 2048, 16, 12, 1024, 2, 1, 1, ms) for mb, ms in [(1, 300.0), (2, 290.0)]]


def write_csv(path: Path, rows, columns=CSV_COLUMNS) -> Path:
    lines = [",".join(columns)] + [",".join(str(v) for v in r[: len(columns)]) for r in rows]
    # The shared table's first line starts with a UTF-8 byte-order mark; so does this one.
    path.write_text("\ufeff" + "\r\n".join(lines) + "\r\n", encoding="utf-8")
    return path


def tiny(world=4, gb=8, seq=64, family="gpt") -> TrialConfig:
    return TrialConfig(
        workload=WorkloadSpec(family=family, seq_len=seq, global_batch_size=gb),
        world_size=world,
        device="cpu",
        num_warmup_steps=1,
        num_profiled_steps=0,
    )


def synthetic_candidates() -> list[TrialConfig]:
    """50 valid layouts of tiny GPT on 4 ranks: tp, pp, dp, ZeRO 0-2, micro-batch, AC (no
    context parallelism: the landscape below does not price it)."""
    return list(
        enumerate_configs(
            tiny(),
            zero_stages=(0, 1, 2),
            activation_checkpointing=("none", "full"),
            pp_schedules=("1f1b",),
            extra={"cp_degree": (1,)},
        )
    )


def synthetic_time(c: TrialConfig) -> float:
    """A landscape whose best is tp 2, pp 1, ZeRO 0, micro-batch 4, no recomputation (0.5 s)."""
    t = 1.0 + 0.2 * abs(c.tp_degree - 2) + 0.3 * (c.pp_degree - 1) + 0.1 * c.zero_stage
    t += 0.2 * (c.activation_checkpointing == "full") + 0.1 / c.micro_batch_size
    return (
        0.5
        if (c.tp_degree, c.pp_degree, c.zero_stage, c.micro_batch_size, c.activation_checkpointing)
        == (2, 1, 0, 4, "none")
        else t
    )


def synthetic_group(times=synthetic_time, configs=None) -> TableGroup:
    configs = configs or synthetic_candidates()
    return TableGroup(
        "synthetic", tuple(MeasuredRow(c, None, times(c), 1000, "complete") for c in configs)
    )


def exhaust(strategy, candidates, times) -> list[TrialConfig]:
    """Propose until the strategy stops, feeding each proposal its measured time."""
    history = []
    while (p := strategy.choose(candidates, history)) is not None:
        history.append(Measured(p.config, times(p.config)))
        assert len(history) <= len(candidates), "proposed more than there are candidates"
    return [m.config for m in history]


# ---- reading tables --------------------------------------------------------------------
def test_csv_table_rows_and_groups(tmp_path):
    table = MeasuredTable.from_csv(write_csv(tmp_path / "t.csv", BIG + SMALL))
    assert table.kind == "csv" and len(table.rows) == len(BIG) + len(SMALL)
    row = table.rows[3]  # 4 GPUs, mb 1, tp 2, dp 2, pp 1, 420 ms
    c = row.config
    assert (c.world_size, c.tp_degree, c.pp_degree, c.dp_degree, c.micro_batch_size) == (
        4,
        2,
        1,
        2,
        1,
    )
    assert c.workload.global_batch_size == 16 and c.workload.seq_len == 1024
    assert (
        c.workload.dtype,
        c.activation_checkpointing,
        c.pp_schedule,
        c.overlap_enabled,
        c.attention,
        c.zero_stage,
        c.workload.vocab_size,
    ) == ("float16", "full", "1f1b", False, "eager", 0, 50257)
    assert row.shape == ModelShape("gpt", 24, 1024, 16, 16, 4096, 50257, 1024)
    assert row.step_time_s == pytest.approx(0.420) and row.status == "complete"
    assert row.peak_memory_bytes is None
    [group] = table.groups()  # only the 9-layout group has ≥ 8
    assert [r.config.micro_batch_size for r in group.rows] == [r[2] for r in BIG]
    assert group.best_step_time_s == pytest.approx(0.400) and group.world_size == 4
    assert len(table.groups(min_layouts=2)) == 2
    bf16 = MeasuredTable.from_csv(
        tmp_path / "t.csv", training=TableTraining(dtype="bfloat16", zero_stage=1)
    )
    assert bf16.rows[0].config.workload.dtype == "bfloat16"
    assert bf16.rows[0].config.zero_stage == 1


def test_json_table_rows_and_groups(tmp_path):
    configs = list(enumerate_configs(tiny(world=2)))[:9] + [tiny(world=2, seq=128)]
    rows = [
        {
            "config": c.to_dict(),
            "step_time_s": 0.01 * (i + 1),
            "peak_memory_bytes": 100 + i,
            "status": "complete",
            "rounds": [0.01],
        }
        for i, c in enumerate(configs)
    ]
    rows[2] = {**rows[2], "status": "failed", "step_time_s": None, "error": "boom"}
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({"machine": {"cores": 2}, "rows": rows}))
    table = MeasuredTable.load(path)
    assert table.kind == "json" and table.cores == 2 and len(table.rows) == 10
    assert table.rows[0].config == configs[0] and table.rows[0].step_time_s == 0.01
    assert table.rows[0].peak_memory_bytes == 100 and table.rows[0].shape is None
    assert table.rows[2].status == "failed" and table.rows[2].step_time_s is None
    [group] = table.groups()  # the seq-128 row is a group of its own
    assert [r.config for r in group.rows] == configs[:9]
    assert group.key == "w2-gb8-s64-gpt-tiny" and group.best_step_time_s == 0.01
    assert table.rows[0].rounds == (0.01,)
    rows[0] = {**rows[0], "rounds": [0.01, -1]}
    path.write_text(json.dumps({"rows": rows}))
    with pytest.raises(ConfigError, match="row 0: rounds must be a list of positive"):
        MeasuredTable.load(path)


def test_the_noise_floor_orders_by_each_round_and_counts_against_the_medians():
    configs = list(enumerate_configs(tiny(world=2)))[:3]
    # Medians 1.1, 1.05, 2.0: the best is the second, and 3% of it (1.0815) excludes the first.
    rounds = [(1.0, 1.2), (1.1, 1.0), (2.0, 2.0)]
    group = TableGroup(
        "g",
        tuple(
            MeasuredRow(c, None, sorted(r)[0] / 2 + sorted(r)[1] / 2, None, "complete", r)
            for c, r in zip(configs, rounds)
        ),
    )
    # Round 1 puts the first row first (a miss) and the best second; round 2 puts the best first.
    assert one_round_trials(group) == (2 + 1) / 2
    assert one_round_trials(group, within=0.05) == 1  # 1.1 is within 5% of 1.05
    uneven = TableGroup("u", (*group.rows[:2], dataclasses.replace(group.rows[2], rounds=(2.0,))))
    assert one_round_trials(uneven) is None  # rows must carry the same rounds


# ---- the table executor ------------------------------------------------------------------
def test_table_executor_answers_each_row_and_refuses_others(tmp_path):
    table = MeasuredTable.from_csv(write_csv(tmp_path / "t.csv", BIG))
    ex = TableExecutor(table)
    for row, raw in zip(table.rows, BIG):
        out = ex.run(row.config)
        assert (out.status, out.step_time_s, out.peak_memory_bytes) == (
            "complete",
            raw[-1] / 1000,
            None,
        )
    # The measurement's own settings are not compared: another seed, other step counts.
    other = dataclasses.replace(table.rows[0].config, seed=7, num_warmup_steps=9)
    assert ex.run(other).step_time_s == BIG[0][-1] / 1000
    missing = dataclasses.replace(table.rows[0].config, micro_batch_size=8)
    with pytest.raises(ConfigError, match=short_name(missing)):
        ex.run(missing)
    assert len(ex.calls) == len(BIG) + 1


def test_table_executor_ignores_knobs_without_effect():
    # Without data parallelism overlap has no effect; without a pipeline, the schedule.
    configs = [
        c
        for c in enumerate_configs(
            tiny(world=2), overlap=(True, False), pp_schedules=("gpipe", "1f1b")
        )
        if c.overlap_enabled or c.dp_degree > 1
    ]
    ex = TableExecutor(
        [MeasuredRow(c, None, 1.0 + i, None, "complete") for i, c in enumerate(configs)]
    )
    tp2 = next(c for c in configs if c.tp_degree == 2)
    assert ex.run(
        dataclasses.replace(tp2, overlap_enabled=False, pp_schedule="gpipe")
    ).step_time_s == 1.0 + configs.index(tp2)


def repeated_rows() -> list[MeasuredRow]:
    """Two configurations measured more than once (another seed is the same configuration):
    the first three times (1.0, 2.0, 4.0 s, median 2.0 — where the mean is 2.33 and the union
    of their rounds has median 3.1), the second twice complete (1.0, 3.0: median 2.0) and once
    failed; then one measured once."""
    a, b, c = list(enumerate_configs(tiny(world=2)))[:3]
    return [
        MeasuredRow(a, None, 1.0, 100, "complete", (1.0,)),
        MeasuredRow(b, None, 1.0, 300, "complete", (0.9, 1.1)),
        MeasuredRow(dataclasses.replace(a, seed=3), None, 2.0, 200, "complete", (1.8, 2.2)),
        MeasuredRow(c, None, 5.0, 500, "complete", (5.0,)),
        MeasuredRow(dataclasses.replace(b, seed=1), None, None, None, "failed", ()),
        MeasuredRow(dataclasses.replace(a, seed=5), None, 4.0, 150, "complete", (4.0, 5.0, 6.0)),
        MeasuredRow(dataclasses.replace(b, seed=2), None, 3.0, 250, "complete", (3.0,)),
    ]


def test_repeated_configurations_are_merged_into_the_median_of_their_repeats(tmp_path):
    rows = repeated_rows()
    a, b, c = rows[0].config, rows[1].config, rows[3].config
    ex = TableExecutor(rows)
    assert ex.merged_rows == 4  # a twice more, b three times more
    assert [ex.run(x).step_time_s for x in (a, b, c)] == [2.0, 2.0, 5.0]
    merged_a = ex.row_for(dataclasses.replace(a, seed=9))
    assert merged_a.config == a and merged_a.status == "complete"
    assert merged_a.rounds == (1.0, 1.8, 2.2, 4.0, 5.0, 6.0)  # the union, in file order
    assert merged_a.peak_memory_bytes == 200  # the largest repeat's
    assert ex.row_for(b).rounds == (0.9, 1.1, 3.0) and ex.row_for(b).status == "complete"
    # Read from a file: one row per configuration, in first-seen order, and the count.
    path = tmp_path / "repeats.json"
    path.write_text(
        json.dumps(
            {
                "rows": [
                    {
                        "config": r.config.to_dict(),
                        "step_time_s": r.step_time_s,
                        "status": r.status,
                        "peak_memory_bytes": r.peak_memory_bytes,
                        "rounds": list(r.rounds),
                    }
                    for r in rows
                ]
            }
        )
    )
    table = MeasuredTable.load(path)
    assert (table.merged_rows, table.merged_configs) == (4, 2)
    assert [(r.config, r.step_time_s) for r in table.rows] == [(a, 2.0), (b, 2.0), (c, 5.0)]
    # A CSV that measured one layout twice (420 and 380 ms): its median, 400 ms.
    again = MeasuredTable.from_csv(write_csv(tmp_path / "t.csv", BIG + [BIG[3][:-1] + (380.0,)]))
    assert (again.merged_rows, again.merged_configs, len(again.rows)) == (1, 1, len(BIG))
    assert again.rows[3].step_time_s == pytest.approx(0.400)


# ---- answering one round per trial -------------------------------------------------------
def test_one_round_answers_draw_the_rows_rounds_independently_per_trial():
    rows = repeated_rows()
    a, b = rows[0].config, rows[1].config
    rounds_a = (1.0, 1.8, 2.2, 4.0, 5.0, 6.0)  # a's three repeats' rounds
    ex = TableExecutor(rows, answer="one-round", seed=7)
    draws = [ex.run(a).step_time_s for _ in range(300)]
    assert set(draws) == set(rounds_a)  # every round is drawn, and nothing else
    # The mean of the draws is the rounds' mean (3.33; σ of a 300-draw mean 0.1); the median
    # (2.0, what the default answers) is 13 σ away.
    assert statistics.fmean(draws) == pytest.approx(statistics.fmean(rounds_a), abs=0.3)
    assert len(set(draws[:5])) > 1  # a configuration measured again reads another round
    # Seeded: the same seed draws the same rounds, another seed others; the k-th trial of a
    # configuration draws the same round whatever ran before it (every strategy meets the
    # same machine).
    again = TableExecutor(rows, answer=Answer.ONE_ROUND, seed=7)
    again.run(b)
    assert [again.run(a).step_time_s for _ in range(300)] == draws
    other = TableExecutor(rows, answer="one-round", seed=8)
    assert [other.run(a).step_time_s for _ in range(300)] != draws
    # The default answers with the median, every time.
    assert {TableExecutor(rows).run(a).step_time_s for _ in range(5)} == {2.0}
    # A round that failed answers as a failed trial; a failed row, as failed.
    flaky = MeasuredRow(a, None, 1.5, None, "complete", (1.5, None))
    dead = MeasuredRow(b, None, None, None, "failed", ())
    ex = TableExecutor([flaky, dead], answer="one-round", seed=1)
    outcomes = {(o.status, o.step_time_s) for o in (ex.run(a) for _ in range(50))}
    assert outcomes == {("complete", 1.5), ("failed", None)}
    assert (ex.run(b).status, ex.run(b).step_time_s) == ("failed", None)


def test_one_round_refuses_a_table_without_rounds(tmp_path):
    table = MeasuredTable.from_csv(write_csv(tmp_path / "t.csv", BIG))
    with pytest.raises(ConfigError, match="keeps no rounds for 9 of its complete rows"):
        TableExecutor(table, answer="one-round")
    with pytest.raises(ConfigError, match="answer must be one of median, one-round"):
        TableExecutor(table, answer="mean")
    assert TableExecutor(table).run(table.rows[0].config).step_time_s == BIG[0][-1] / 1000


def test_a_one_round_replay_is_judged_by_the_medians():
    """Grid's order does not depend on what it reads, so under any draw it reaches the target
    where it does on the medians: a lucky round of a slow layout (0.5 s, its median 1.5 s)
    ahead of the best in grid's order is no find, and the answers it read are rounds."""

    def rounds_of(c):
        t = synthetic_time(c)
        return (0.5, t, 2 * t) if t > 0.5 else (0.45, 0.5, 0.55)

    group = TableGroup(
        "g",
        tuple(
            MeasuredRow(c, None, synthetic_time(c), 1000, "complete", rounds_of(c))
            for c in synthetic_candidates()
        ),
    )
    on_medians = replay(GridStrategy(), group).trials_to_target
    assert on_medians > 1
    for seed in range(10):
        run = replay(GridStrategy(), group, answer="one-round", seed=seed)
        assert run.trials_to_target == on_medians
        assert all(m.step_time_s in rounds_of(m.config) for m in run.history)


# ---- baselines ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "strategy", [GridStrategy(), RandomStrategy(3), TPInsideNodeRule(2)], ids=lambda s: s.name
)
def test_baseline_proposes_every_candidate_once_then_stops(strategy):
    candidates = synthetic_candidates()
    order = exhaust(strategy, candidates, synthetic_time)
    assert sorted(map(short_name, order)) == sorted(map(short_name, candidates))
    assert len(set(order)) == len(candidates)


def test_grid_order_is_zero_then_tp_pp_micro_batch_ascending():
    candidates = synthetic_candidates()
    order = exhaust(GridStrategy(), candidates, synthetic_time)
    keys = [(c.zero_stage, c.tp_degree, c.pp_degree, c.micro_batch_size) for c in order]
    assert keys == sorted(keys)
    # Within equal leading knobs, no recomputation comes first.
    assert order[0].activation_checkpointing == "none"
    assert (order[0].zero_stage, order[0].tp_degree, order[0].micro_batch_size) == (0, 1, 1)


def test_tp_inside_node_order():
    order = exhaust(TPInsideNodeRule(2), synthetic_candidates(), synthetic_time)
    tps = [c.tp_degree for c in order]
    # tp 2 (the largest inside a node of 2) first, then tp 1, tp 4 (spans nodes) last.
    assert tps == sorted(tps, key=lambda t: {2: 0, 1: 1, 4: 2}[t])
    first = order[0]
    assert (first.tp_degree, first.pp_degree, first.micro_batch_size) == (2, 1, 4)


def test_random_is_deterministic_given_a_seed():
    c = synthetic_candidates()
    assert exhaust(RandomStrategy(5), c, synthetic_time) == exhaust(
        RandomStrategy(5), c, synthetic_time
    )
    assert exhaust(RandomStrategy(5), c, synthetic_time) != exhaust(
        RandomStrategy(6), c, synthetic_time
    )


def test_deepspeed_heuristic_follows_its_rules():
    candidates = synthetic_candidates()
    times = {
        (0, 2): 1.0,
        (0, 1): 0.9,  # smaller micro-batch > 5% faster: kept
        (1, 2): 1.2,
        (1, 1): 1.3,  # slower: the stage ends
        (2, 2): 0.8,
        (2, 1): 0.79,
    }  # faster by < 5%: the stage ends

    def time_of(c):
        return times.get((c.zero_stage, c.micro_batch_size), 9.0)

    order = exhaust(DeepSpeedHeuristic(), candidates, time_of)
    assert all(c.tp_degree == 1 and c.pp_degree == 1 for c in order)
    assert all(c.activation_checkpointing == "none" for c in order)  # the user's setting
    assert [(c.zero_stage, c.micro_batch_size) for c in order] == [
        (0, 2),
        (0, 1),
        (1, 2),
        (1, 1),
        (2, 2),
        (2, 1),
    ]
    # The largest micro-batch that runs: an infeasible one is passed over.
    history, strategy = [], DeepSpeedHeuristic()
    while (p := strategy.choose(candidates, history)) is not None:
        c = p.config
        if (c.zero_stage, c.micro_batch_size) == (0, 2):
            history.append(Measured(c, None, "infeasible"))
        else:
            history.append(Measured(c, time_of(c)))
    assert [(m.config.zero_stage, m.config.micro_batch_size) for m in history][:2] == [
        (0, 2),
        (0, 1),
    ]
    # Nothing it can express: it stops at once.
    tp2 = [c for c in candidates if c.tp_degree == 2]
    assert DeepSpeedHeuristic().choose(tp2, []) is None


# ---- the replay ------------------------------------------------------------------------
def brute_force(order, times, within=0.03) -> int:
    best = min(times(c) for c in order)
    return next(i for i, c in enumerate(order, 1) if times(c) <= best * (1 + within))


def test_replay_counts_trials_to_within_3_percent():
    group = synthetic_group()
    candidates = [r.config for r in group.rows]
    run = replay(GridStrategy(), group)
    grid_order = sorted(
        candidates,
        key=lambda c: (
            c.zero_stage,
            c.tp_degree,
            c.pp_degree,
            c.micro_batch_size,
            c.activation_checkpointing != "none",
        ),
    )
    assert run.trials_to_target == brute_force(grid_order, synthetic_time)
    expected_wall = sum(7 * synthetic_time(c) + 0.02 for c in grid_order[: run.trials_to_target])
    assert run.wall_s == pytest.approx(expected_wall)
    shuffled = list(candidates)
    random.Random(4).shuffle(shuffled)
    assert replay(RandomStrategy(4), group).trials_to_target == brute_force(
        shuffled, synthetic_time
    )
    # The heuristic cannot reach tp 2: it stops, and counts as candidates + 1.
    ds = replay(DeepSpeedHeuristic(), group)
    assert ds.stopped and ds.reached_at is None and ds.trials_to_target == len(candidates) + 1


# ---- bad input -------------------------------------------------------------------------
def test_bad_tables(tmp_path):
    with pytest.raises(ConfigError, match="lacks column.*iteration time"):
        MeasuredTable.from_csv(write_csv(tmp_path / "a.csv", BIG, CSV_COLUMNS[:-1]))
    with pytest.raises(ConfigError, match="cannot read table"):
        MeasuredTable.load(tmp_path / "missing.csv")
    with pytest.raises(ConfigError, match=r"\.csv .* or a \.json"):
        MeasuredTable.load(tmp_path / "t.txt")
    (tmp_path / "b.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="'rows' list"):
        MeasuredTable.load(tmp_path / "b.json")
    (tmp_path / "c.json").write_text(json.dumps({"rows": [{"config": tiny().to_dict()}]}))
    with pytest.raises(ConfigError, match="row 0 lacks step_time_s, status"):
        MeasuredTable.load(tmp_path / "c.json")
    small = MeasuredTable.from_csv(write_csv(tmp_path / "d.csv", SMALL))
    with pytest.raises(ConfigError, match="no group of ≥ 8.*largest has 2"):
        small.groups()


def _bench():
    spec = importlib.util.spec_from_file_location(
        "search_replay", ROOT / "bench" / "search_replay.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_replays_a_table_and_refuses_bad_input(tmp_path, capsys):
    bench = _bench()
    path = write_csv(tmp_path / "t.csv", BIG + SMALL)
    assert (
        bench.main(["--table", str(path), "--json", "--strategies", "grid,deepspeed,tp-in-node"])
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["groups"] == 1
    # Grid: tp 1 pp 1 at mb 1, 2, 4 then tp 1 pp 2 … ; the best (400 ms) is tp 2, mb 2.
    group = MeasuredTable.from_csv(path).groups()[0]
    order = sorted(
        (r.config for r in group.rows), key=lambda c: (c.tp_degree, c.pp_degree, c.micro_batch_size)
    )
    times = {r.config: r.step_time_s for r in group.rows}
    assert report["strategies"]["grid"]["median_trials"] == brute_force(order, times.get)
    # The heuristic's tp-1 layouts are all > 3% slower than the best: never reached.
    assert report["strategies"]["deepspeed"]["reached_fraction"] == 0
    # TP inside a node of 8: tp 4 (600 ms) first, then tp 2 at mb 4 (410 ms, within 3%).
    assert report["strategies"]["tp-in-node"]["median_trials"] == 2
    # Two tables pool their groups; each table's own figure is kept beside the pooled one.
    other = write_csv(tmp_path / "u.csv", BIG[:4] + BIG[5:] + SMALL)  # without the best
    assert (
        bench.main(["--table", str(path), "--table", str(other), "--json", "--strategies", "grid"])
        == 0
    )
    pooled = json.loads(capsys.readouterr().out)
    small_group = MeasuredTable.from_csv(other).groups()[0]
    small_order = sorted(
        (r.config for r in small_group.rows),
        key=lambda c: (c.tp_degree, c.pp_degree, c.micro_batch_size),
    )
    small_times = {r.config: r.step_time_s for r in small_group.rows}
    each = [brute_force(order, times.get), brute_force(small_order, small_times.get)]
    assert pooled["groups_per_table"] == {str(path): 1, str(other): 1} and each[0] != each[1]
    assert pooled["strategies"]["grid"]["trials"] == each
    assert [pooled["per_table"][str(t)]["grid"]["mean_trials"] for t in (path, other)] == each
    for argv, message in [
        (["--strategies", "grid,nope"], "unknown strategy 'nope'"),
        (["--min-layouts", "20"], "no group of ≥ 20"),
    ]:
        assert bench.main(["--table", str(path), *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0]
    bad = write_csv(tmp_path / "bad.csv", BIG, CSV_COLUMNS[1:])
    assert bench.main(["--table", str(bad)]) == 2
    assert "lacks column(s): # GPUs" in capsys.readouterr().err


def test_bench_merges_repeats_and_answers_one_round(tmp_path, capsys):
    bench = _bench()
    configs = list(enumerate_configs(tiny(world=2)))[:9]
    # Nine layouts, 1.0 … 1.8 s over two rounds each; the fastest measured twice more (1.3 s
    # and 1.5 s: its median becomes 1.3, so the second layout, 1.1 s, is the best).
    rows = [
        {
            "config": c.to_dict(),
            "step_time_s": 1.0 + 0.1 * i,
            "status": "complete",
            "rounds": [0.95 + 0.1 * i, 1.05 + 0.1 * i],
        }
        for i, c in enumerate(configs)
    ]
    rows += [
        {
            "config": dataclasses.replace(configs[0], seed=s).to_dict(),
            "step_time_s": t,
            "status": "complete",
            "rounds": [t, t],
        }
        for s, t in ((1, 1.3), (2, 1.5))
    ]
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({"machine": {"cores": 2}, "rows": rows}))
    assert bench.main(["--table", str(path), "--json", "--strategies", "grid"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["merged"]["rows"] == 2 and report["merged"]["configurations"] == 1
    assert report["merged"]["per_table"] == {str(path): {"rows": 2, "configurations": 1}}
    # Grid tries ZeRO 0 first, recomputation none (median now 1.3 s, not within 3% of the best
    # 1.1 s), then selective (1.1 s): 2 trials. Taking the first repeat (1.0 s) would make it 1.
    expected = 2
    assert report["strategies"]["grid"]["trials"] == [expected]
    assert bench.main(["--table", str(path), "--strategies", "grid"]) == 0
    assert f"{path}: 2 rows repeated a configuration and were merged into 1" in (
        capsys.readouterr().out
    )
    # One round per trial: every strategy runs once per seed, the answer and seeds reported.
    assert (
        bench.main(
            [
                "--table",
                str(path),
                "--json",
                "--strategies",
                "grid,deepspeed",
                "--answer",
                "one-round",
                "--seeds",
                "2",
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["answer"] == "one-round" and report["seeds"] == 2
    assert report["strategies"]["grid"]["runs"] == 2
    assert report["strategies"]["grid"]["trials"] == [expected] * 2  # judged by the medians
    # What it cost is what the drawn rounds cost: seed s's draws, not the medians.
    grid_first = MeasuredTable.load(path).rows[:expected]  # ZeRO 0: none, then selective
    walls = []
    for seed in range(2):
        ex = TableExecutor(MeasuredTable.load(path), answer="one-round", seed=seed)
        walls.append(sum(trial_wall_s(ex.run(r.config).step_time_s) for r in grid_first))
    on_medians = sum(trial_wall_s(r.step_time_s) for r in grid_first)
    assert report["strategies"]["grid"]["mean_wall_s"] == pytest.approx(statistics.fmean(walls))
    assert statistics.fmean(walls) != pytest.approx(on_medians)
    # A table without rounds is refused under one-round, in one line.
    csv_path = write_csv(tmp_path / "t.csv", BIG)
    assert bench.main(["--table", str(csv_path), "--answer", "one-round"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "keeps no rounds" in err[0] and "median" in err[0]


def test_bench_model_warm_starts_each_one_round_seed_afresh(tmp_path, capsys, monkeypatch):
    """Under one-round every strategy runs once per seed; model-warm must not carry one seed's
    trials into the next seed's pass over the same groups (it would start them calibrated on
    the very layouts it is about to search)."""
    bench = _bench()
    configs = list(enumerate_configs(tiny(world=2)))[:9]
    rows = [
        {
            "config": c.to_dict(),
            "step_time_s": 0.01 * (1 + i),
            "status": "complete",
            "rounds": [0.01 * (1 + i)] * 2,
        }
        for i, c in enumerate(configs)
    ]
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({"machine": {"cores": 2}, "rows": rows}))
    carried = []
    make = bench.make_strategy

    def recording(name, seed, group, setting, model_cls):
        carried.append((seed, len(setting.samples)))
        return make(name, seed, group, setting, model_cls)

    monkeypatch.setattr(bench, "make_strategy", recording)
    assert (
        bench.main(
            [
                "--table",
                str(path),
                "--json",
                "--strategies",
                "model-warm",
                "--answer",
                "one-round",
                "--seeds",
                "2",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["strategies"]["model-warm"]["runs"] == 2
    assert carried == [(0, 0), (1, 0)]  # one group: each seed's pass starts with nothing


# ---- the replay is the shipped search --------------------------------------------------
SWEEP_B = Path(__file__).resolve().parents[2] / "bench" / "data" / "cpu_sweep_b.json"


@pytest.mark.parametrize("sampler", ["tpe", "random"])
def test_a_replayed_sampler_measures_what_autotune_search_runs(tmp_path, sampler):
    """The replay of an Optuna sampler runs the same trials, in the same order, as a search
    (``Search.open(...).run()``, what ``autotune search`` runs) over the same table with that
    sampler, the same seed and no baseline: the bench measures the shipped TPE."""
    from testkit.replay_table import ReplayTrialExecutor

    from autotune.search.search import Search, SearchSpec
    from db import Database

    (group,) = [g for g in MeasuredTable.load(SWEEP_B).groups(8) if g.world_size == 2]
    run = replay(sampler, group, seed=3)  # until a layout within 3% of the best
    executor = ReplayTrialExecutor(group.rows)
    spec = SearchSpec(
        workload=WorkloadSpec(family="gpt", size="tiny", seq_len=64, global_batch_size=16),
        world_size=2,
        device="cpu",
        study_name="s",
        n_trials=len(run.history),
        patience=None,
        top_k=1,
        remeasure_repeats=0,
        sampler=sampler,
        seed=3,
    )
    Search.open(
        spec,
        Database.open(f"sqlite:///{tmp_path / 's.db'}"),
        executor,
        out=None,
        baseline=None,
        include=executor.contains,
    ).run()
    replayed = [short_name(m.config) for m in run.history]
    searched = [short_name(c) for c in executor.table.calls]
    assert len(set(replayed)) == len(replayed) >= 3  # repeats are answered, not run
    assert replayed == searched
