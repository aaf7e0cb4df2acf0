"""Rankings that survive noise: the t quantile against published table values and closed forms,
the intervals against an independent coverage count, the tie rule, and the interleaved
re-measurement of a real search replayed on a measured table (no Ray)."""

from __future__ import annotations

import dataclasses
import io
import json
import math
import random
import statistics
from pathlib import Path

import pytest
from testkit.replay_table import MeasuredTable, ReplayTrialExecutor

from autotune.config import TrialConfig, WorkloadSpec
from autotune.export.best_config import export_study
from autotune.layouts import short_name
from autotune.model.noise import paired_ratio_interval, t_cdf, t_quantile, throughput_interval
from autotune.search.search import Search, SearchSpec, base_config
from autotune.search.space import SearchSpace
from autotune.status import TrialStatus
from autotune.study.leaderboard import Entry, declare_best, equivalent
from db import Database

TABLE = Path(__file__).resolve().parents[2] / "bench" / "data" / "cpu_sweep_b.json"

# Upper critical values of Student's t, NIST/SEMATECH e-Handbook of Statistical Methods,
# section 1.3.6.7.2 (3 decimals): {df: (t_0.95, t_0.975)}.
T_TABLE = {
    1: (6.314, 12.706),
    2: (2.920, 4.303),
    3: (2.353, 3.182),
    4: (2.132, 2.776),
    5: (2.015, 2.571),
    6: (1.943, 2.447),
    9: (1.833, 2.262),
    10: (1.812, 2.228),
    20: (1.725, 2.086),
    30: (1.697, 2.042),
    100: (1.660, 1.984),
}


@pytest.mark.parametrize("df", sorted(T_TABLE))
def test_t_quantiles_match_the_published_table(df):
    t95, t975 = T_TABLE[df]
    assert t_quantile(0.95, df) == pytest.approx(t95, abs=6e-4)
    assert t_quantile(0.975, df) == pytest.approx(t975, abs=6e-4)
    assert t_quantile(0.025, df) == -t_quantile(0.975, df)


def test_t_distribution_against_closed_forms_and_the_normal_limit():
    for p in (0.6, 0.9, 0.975, 0.995):
        # ν = 1 is Cauchy: tan(π(p − ½)); ν = 2: (2p − 1) / √(2p(1 − p)).
        assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-9)
        assert t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-9)
        # large ν approaches the normal quantile (Cornish-Fisher: z + (z³ + z) / 4ν)
        z = statistics.NormalDist().inv_cdf(p)
        assert t_quantile(p, 400) == pytest.approx(z + (z**3 + z) / 1600, rel=2e-4)
    assert t_cdf(0.0, 7) == 0.5 and t_cdf(1.0, 8) + t_cdf(-1.0, 8) == pytest.approx(1.0)


def test_interval_by_hand_and_its_coverage():
    runs = [30_000.0, 34_000.0, 27_500.0]
    logs = [math.log(x) for x in runs]
    m, s = statistics.fmean(logs), statistics.stdev(logs)
    ci = throughput_interval(runs)
    assert ci.source == "runs" and ci.n == 3
    assert (ci.low, ci.high) == pytest.approx(
        (math.exp(m - 4.303 * s / math.sqrt(3)), math.exp(m + 4.303 * s / math.sqrt(3))), rel=1e-4
    )
    # one run: its timed steps (tokens / step time each), narrower and labelled so
    steps = [0.050, 0.052, 0.049, 0.055, 0.051]
    one = throughput_interval([10_000.0], steps, tokens_per_step=512)
    assert one.source == "steps" and one.n == 5
    assert one.low < 512 / statistics.median(steps) < one.high
    assert throughput_interval([10_000.0]) is None
    # Coverage, counted: 3 runs of log-normal noise (CV ≈ 15%) around a known median; the 95%
    # interval must hold it about 95% of the time (binomial sd over 3,000 draws ≈ 0.4%).
    rng = random.Random(7)
    hits = sum(
        throughput_interval([30_000 * math.exp(rng.gauss(0, 0.15)) for _ in range(3)]).contains(
            30_000
        )
        for _ in range(3000)
    )
    assert 0.935 <= hits / 3000 <= 0.965


def test_pairing_within_rounds_cancels_machine_wide_drift():
    """A is 10% faster than B in every round, while the whole machine drifts by ±30%: each
    one's own interval overlaps the other's, the paired interval of B / A does not hold 1."""
    rng = random.Random(3)
    drift = [math.exp(rng.gauss(0, 0.3)) for _ in range(5)]
    a = [30_000 * d * math.exp(rng.gauss(0, 0.01)) for d in drift]
    b = [27_000 * d * math.exp(rng.gauss(0, 0.01)) for d in drift]
    assert throughput_interval(a).overlaps(throughput_interval(b))
    ratio = paired_ratio_interval(b, a)
    assert ratio.high < 1.0 and ratio.contains(0.9) and ratio.n == 5
    assert paired_ratio_interval(b[:1], a[:1]) is None


def entry(number, throughputs, *, rounds=None, peak=100, **layout) -> Entry:
    config = TrialConfig(world_size=2, device="cpu", **layout)
    rounds = tuple(range(1, len(throughputs))) if rounds is None else rounds
    return Entry(
        number, number, config, TrialStatus.COMPLETE, list(throughputs), peak, peak, rounds=rounds
    )


def test_tie_rule():
    # Separated beyond noise: the fastest is the pick, no tie.
    fast = entry(0, [31_000, 30_000, 30_500, 29_800], micro_batch_size=4)
    slow = entry(1, [27_000, 26_100, 26_600, 26_000], micro_batch_size=2, peak=50)
    v = declare_best([fast, slow])
    assert v.pick is fast and not v.is_tie and v.runner_up_ratio.high < 1
    # Tied, shown equivalent (paired ratios 0.990, 1.003, 1.003: the 95% interval, by hand
    # mean ± 4.303 s / √3, lies within 1 ± 3%) and using less memory: the rule picks it.
    close = entry(1, [30_900, 29_700, 30_600, 29_900], micro_batch_size=2, peak=50)
    logs = [math.log(x / y) for x, y in zip([29_700, 30_600, 29_900], [30_000, 30_500, 29_800])]
    half = 4.303 * statistics.stdev(logs) / math.sqrt(3)
    assert (
        0.97
        < math.exp(statistics.fmean(logs) - half)
        < math.exp(statistics.fmean(logs) + half)
        < 1.03
    )
    v = declare_best([fast, close])
    assert v.is_tie and equivalent(fast, close) and v.pick is close and v.fastest is fast
    assert v.to_dict()["tied_within_noise"] and v.to_dict()["picked_trial"] == 1
    assert "tied within noise" in v.describe()
    # Tied because the rounds disagree, its median within 3% yet not shown equivalent: the
    # fastest stays (a tie is no licence to trade throughput for memory).
    noisy = entry(1, [29_500, 25_000, 33_000, 29_500], micro_batch_size=2, peak=50)
    assert fast.throughput > noisy.throughput >= fast.throughput * 0.97
    v = declare_best([fast, noisy])
    assert v.is_tie and not equivalent(fast, noisy) and v.pick is fast
    # Tied with equal memory: the simpler layout (no recomputation) wins.
    full = entry(0, [31_000, 30_000, 30_500, 29_800], activation_checkpointing="full")
    plain = entry(1, [30_900, 29_700, 30_600, 29_900])
    assert declare_best([full, plain]).pick is plain
    # No shared rounds (e.g. stored before rounds were): the intervals' overlap decides.
    a = entry(0, [31_000, 29_000], rounds=(-1,))
    b = entry(1, [30_000, 30_500], rounds=(-1,))
    v = declare_best([a, b])
    assert v.runner_up_ratio is None and v.is_tie and v.pick is a


@pytest.fixture
def rows():
    """The 3 fastest complete layouts of sweep B's world-2 group (tiny GPT, seq 64, batch 16):
    a search space the search covers in 3 trials (each trial refits the calibration, the
    search's dearest step on a table)."""
    (group,) = [g for g in MeasuredTable.load(TABLE).groups(8) if g.world_size == 2]
    return sorted((r for r in group.rows if r.step_time_s), key=lambda r: r.step_time_s)[:3]


def replayed(db, rows, name, **kw):
    executor = ReplayTrialExecutor(rows)
    spec = SearchSpec(
        **{
            **dict(
                workload=WorkloadSpec(family="gpt", size="tiny", seq_len=64, global_batch_size=16),
                world_size=2,
                device="cpu",
                study_name=name,
                n_trials=3,
                patience=None,
                top_k=3,
                remeasure_repeats=2,
                remeasure_max_repeats=4,
                sampler="random",
            ),
            **kw,
        }
    )
    search = Search.open(spec, db, executor, out=io.StringIO(), include=executor.contains)
    return search, executor


def test_remeasurement_is_interleaved_and_stops_once_separated(tmp_path, rows):
    db = Database.open(f"sqlite:///{tmp_path / 'r.db'}")
    search, executor = replayed(db, rows, "sep")
    outcome = search.run()
    calls = executor.table.calls
    assert len(calls[:3]) == len(set(calls[:3])) == 3  # the search's trials
    top = [e.config for e in outcome.leaderboard[:3]]
    # Two rounds (the table's figures never change, so the fastest is separated at once),
    # round-robin over the top 3 starting one further along each round — never back to back.
    assert calls[3:] == top + top[1:] + top[:1]
    for e in outcome.leaderboard[:3]:
        assert e.rounds == (1, 2) and len(e.throughputs) == 3
    stored = {t.id: t.metrics for t in db.list_trials(outcome.study_id)}
    best = outcome.best
    assert stored[best.trial_id]["remeasured_rounds"] == [1, 2]
    interval = stored[best.trial_id]["throughput_interval"]
    assert interval["source"] == "runs" and interval["n"] == 3
    assert interval["low"] == pytest.approx(best.throughput)  # a table does not vary
    assert all("throughput_interval" in m for t_id, m in stored.items() if m.get("step_time_s"))
    assert not declare_best(outcome.leaderboard).is_tie


def test_a_tie_is_measured_to_the_round_limit_and_exported_as_a_tie(tmp_path, rows):
    # Give the table's fastest layout a twin: another layout with the same step time and less
    # memory. The two cannot be told apart, so rounds go on to the limit and the rule picks
    # the twin.
    best, twin = rows[0], rows[1]
    rows = [
        best,
        dataclasses.replace(
            twin, step_time_s=best.step_time_s, peak_memory_bytes=best.peak_memory_bytes // 2
        ),
        *rows[2:],
    ]
    db = Database.open(f"sqlite:///{tmp_path / 't.db'}")
    search, executor = replayed(db, rows, "tie")
    outcome = search.run()
    verdict = declare_best(outcome.leaderboard)
    names = {short_name(c) for c in (verdict.fastest.config, verdict.runner_up.config)}
    assert names == {short_name(best.config), short_name(twin.config)}
    assert verdict.is_tie and short_name(verdict.pick.config) == short_name(twin.config)
    assert len(verdict.pick.rounds) == 4 and len(executor.table.calls) == 3 + 3 * 4  # the limit
    assert outcome.best is verdict.pick or outcome.best.trial_id == verdict.pick.trial_id
    best_path, *_ = export_study(db, "tie", tmp_path / "out")
    doc = json.loads(best_path.read_text())
    assert short_name(TrialConfig.from_dict(doc["config"])) == short_name(twin.config)
    assert doc["metrics"]["tied_within_noise"] is True
    assert doc["metrics"]["rule"].startswith("tied within noise")
    assert doc["metrics"]["throughput_interval"]["n"] == 5


def test_the_baseline_is_a_finalist_even_when_its_figure_misses_the_top(tmp_path, rows):
    # The baseline is the group's slowest of three and top_k is 1: the fastest and the baseline
    # are both re-measured, interleaved, and the middle one is not.
    fastest, middle, slowest = rows
    db = Database.open(f"sqlite:///{tmp_path / 'b.db'}")
    executor = ReplayTrialExecutor(rows)
    spec = SearchSpec(
        workload=WorkloadSpec(family="gpt", size="tiny", seq_len=64, global_batch_size=16),
        world_size=2,
        device="cpu",
        study_name="base",
        n_trials=3,
        patience=None,
        top_k=1,
        remeasure_repeats=2,
        remeasure_max_repeats=2,
        sampler="random",
    )
    key = executor.table.key  # the table's identity of a layout (ignores unused knobs)
    space = SearchSpace(base_config(spec), fixed=spec.fixed, narrowed=spec.narrowed)
    baseline = next(c for c in space.configs if key(c) == key(slowest.config))
    outcome = Search.open(
        spec, db, executor, out=io.StringIO(), include=executor.contains, baseline=baseline
    ).run()
    calls = [key(c) for c in executor.table.calls]
    assert calls[0] == key(slowest.config)  # the baseline runs first
    remeasured = calls[3:]
    assert len(remeasured) == 4
    assert set(remeasured[:2]) == set(remeasured[2:]) == {key(fastest.config), key(slowest.config)}
    assert remeasured[:2] != remeasured[2:]  # the second round starts one further along
    rounds = {key(e.config): e.rounds for e in outcome.leaderboard}
    assert rounds[key(slowest.config)] == rounds[key(fastest.config)] == (1, 2)
    assert rounds[key(middle.config)] == ()
    assert key(outcome.best.config) == key(fastest.config)
