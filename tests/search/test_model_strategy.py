"""The model-guided strategy inside the real search: on a measured table (no Ray), its choices
are Optuna trials of the study, it stops by its rule and records what it skipped, and an
interrupted search resumes without measuring anything twice."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import pytest
from testkit.replay_table import MeasuredTable, ReplayTrialExecutor

from autotune.cli.main import main
from autotune.config import TrialConfig, WorkloadSpec
from autotune.model.calibration import FitReport
from autotune.model.cluster import local_cpu_cluster
from autotune.model.perf_model import Calibration
from autotune.search.search import Search, SearchSpec, resolve_strategy
from autotune.search.strategies.base import Measured
from autotune.search.strategies.model_guided import ModelGuided
from autotune.status import TrialStatus
from db import Database

TABLE = Path(__file__).resolve().parents[2] / "bench" / "data" / "cpu_sweep_b.json"


@pytest.fixture
def world2_rows():
    """Sweep B's world-2 group: 24 measured layouts of the tiny GPT (seq 64, batch 16)."""
    table = MeasuredTable.load(TABLE)
    (group,) = [g for g in table.groups(8) if g.world_size == 2]
    return group.rows


def spec(name: str, n_trials: int) -> SearchSpec:
    return SearchSpec(
        workload=WorkloadSpec(family="gpt", size="tiny", seq_len=64, global_batch_size=16),
        world_size=2,
        device="cpu",
        study_name=name,
        n_trials=n_trials,
        patience=None,
        top_k=1,
        remeasure_repeats=0,
        sampler="model",
    )


def search(db, rows, name, n_trials, *, resume=False):
    executor = ReplayTrialExecutor(rows)
    s = Search.open(
        spec(name, n_trials),
        db,
        executor,
        resume=resume,
        out=io.StringIO(),
        baseline=None,
        include=executor.contains,
    )
    return s, executor


def test_model_guided_search_on_a_table(tmp_path, world2_rows):
    db = Database.open(f"sqlite:///{tmp_path / 'm.db'}")
    s, executor = search(db, world2_rows, "m", 24)
    assert len(s.space) == len(world2_rows)  # the space is the table's layouts
    outcome = s.run()
    calls = executor.table.calls
    assert len(calls) == len(set(calls)) == outcome.num_run  # nothing measured twice
    assert outcome.num_run < len(world2_rows)  # it stopped by its own rule
    assert "performance model predicts no untried configuration" in outcome.stopped_because
    trials = db.list_trials(outcome.study_id)
    complete = [t for t in trials if t.status == TrialStatus.COMPLETE]
    skipped = [t for t in trials if t.status == TrialStatus.SKIPPED_PREDICTED]
    assert len(complete) == outcome.num_run
    assert all("predicted_step_time_s" in t.metrics for t in complete)
    assert 1 <= len(skipped) <= 3 and all(t.error.startswith("skipped: predicted") for t in skipped)
    # Each run trial is an Optuna trial of the study with the same parameters.
    assert len([t for t in s.study.trials if t.value is not None]) >= outcome.num_run
    # The best it measured is the table's value for that layout.
    best = outcome.best
    assert best.throughput == pytest.approx(
        best.config.tokens_per_step / executor.table.row_for(best.config).step_time_s
    )


def test_an_interrupted_replayed_search_resumes_without_rerunning(tmp_path, world2_rows):
    db = Database.open(f"sqlite:///{tmp_path / 'r.db'}")
    first, ex1 = search(db, world2_rows, "r", 2)
    first.run()
    assert len(ex1.table.calls) == 2
    second, ex2 = search(db, world2_rows, "r", 24, resume=True)
    second.run()
    assert ex2.table.calls  # it went on
    assert not set(ex1.table.calls) & set(ex2.table.calls)  # and ran nothing again


def test_a_cpu_shape_is_measured_whether_or_not_its_precision_is_spelled_out():
    """On gloo ranks a config naming no precision trains in 32-true, so its layer shape is the
    measured one of the same layout spelled 32-true (a replayed table names none; a search
    stores each config with its precision): its doubt is not tripled as an unmeasured shape's.
    Keyed as on a GPU, the unnamed one read as bfloat16 and looked unmeasured. One trial:
    σ = max(min_sigma 0.05, residual spread 0, prior 0.5 / √1) = 0.5, × 3 when unmeasured."""
    layout = TrialConfig(
        workload=WorkloadSpec(family="gpt", size="tiny", seq_len=64, global_batch_size=16),
        world_size=2,
        micro_batch_size=2,
        device="cpu",
    )
    fit = FitReport(Calibration(), (), 1, (0.0,))
    strategy = ModelGuided(cluster=local_cpu_cluster(2), fitted=lambda: fit)
    history = [Measured(layout.with_precision("cpu"), 0.1)]
    calibration = strategy.current_calibration(history, None)
    assert layout.precision is None and history[0].config.precision == "32-true"
    assert strategy.sigma(layout, calibration, history, None) == pytest.approx(0.5)
    other_shape = dataclasses.replace(layout, micro_batch_size=4)
    assert strategy.sigma(other_shape, calibration, history, None) == pytest.approx(1.5)


def test_model_falls_back_to_tpe_for_a_workload_it_cannot_describe():
    user = WorkloadSpec(workload="tests.user_workload:build")
    name, note = resolve_strategy("model", "cpu", user)
    assert name == "tpe" and "uses TPE" in note and "tests.user_workload:build" in note
    assert resolve_strategy("auto", "cuda", user)[0] == "tpe"  # on GPUs auto is model: alike
    assert resolve_strategy("auto", "cpu", WorkloadSpec()) == ("tpe", "")
    assert resolve_strategy("auto", "cuda", WorkloadSpec()) == ("model", "")
    assert resolve_strategy("gp", "cuda", WorkloadSpec()) == ("gp", "")


def test_unknown_strategy_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["search", "--strategy", "annealing", "--db", "none"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'annealing'" in err and "Traceback" not in err


def test_gp_sampler_under_a_memory_limit(tmp_path, world2_rows):
    """GP needs a constraint on every trial once one has it: a search under a memory limit that
    some layouts break runs to its budget, and every trial Optuna was told about carries it."""
    import dataclasses

    import optuna

    from autotune.search.search import GIB

    peaks = sorted(r.peak_memory_bytes for r in world2_rows if r.peak_memory_bytes)
    limit = peaks[len(peaks) // 2]
    db = Database.open(f"sqlite:///{tmp_path / 'gp.db'}")
    executor = ReplayTrialExecutor(world2_rows)
    s = Search.open(
        dataclasses.replace(spec("gp", 12), sampler="gp", memory_limit_gib=limit / GIB),
        db,
        executor,
        out=io.StringIO(),
        baseline=None,
        include=executor.contains,
    )
    outcome = s.run()
    assert outcome.stopped_because == "trial budget"
    trials = db.list_trials(outcome.study_id)
    complete = [t for t in trials if t.status == TrialStatus.COMPLETE]
    assert complete and all(t.metrics["peak_memory_bytes"] <= limit for t in complete)
    assert any(TrialStatus(t.status).infeasible for t in trials)
    told = [
        t for t in s.study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE
    ]
    assert told and all(any(k.startswith("constraints") for k in t.system_attrs) for t in told)


def test_model_guided_search_records_the_fastest_layouts_memory_ruled_out(tmp_path, world2_rows):
    """Under a memory limit the model-guided strategy sees only layouts predicted to fit; when it
    stops, the study shows the best few it never saw because they do not fit, never run."""
    import dataclasses

    from autotune.search import screen
    from autotune.search.search import GIB, MEMORY_MARGIN

    configs = [r.config for r in world2_rows]
    peaks = sorted(screen.predict_peak(c, "cpu") * (1 + MEMORY_MARGIN) for c in configs)
    limit = (peaks[len(peaks) // 2 - 1] + peaks[len(peaks) // 2]) / 2  # half fit
    db = Database.open(f"sqlite:///{tmp_path / 'mem.db'}")
    executor = ReplayTrialExecutor(world2_rows)
    s = Search.open(
        dataclasses.replace(spec("mem", 24), memory_limit_gib=limit / GIB),
        db,
        executor,
        out=io.StringIO(),
        baseline=None,
        include=executor.contains,
    )
    outcome = s.run()
    over = {
        c for c in s.space.configs if screen.predict_peak(c, "cpu") * (1 + MEMORY_MARGIN) > limit
    }
    assert over and len(over) < len(s.space)
    trials = db.list_trials(outcome.study_id)
    ruled_out = [t for t in trials if t.status == TrialStatus.INFEASIBLE_PREDICTED]
    assert len(ruled_out) == min(3, len(over))
    ruled = {TrialConfig.from_dict(t.config) for t in ruled_out}
    assert ruled <= over
    assert not ruled & set(executor.table.calls)  # never run
    assert not over & set(executor.table.calls)  # nor anything else over the limit
    assert all(
        "predicted peak" in t.error and t.metrics["predicted_step_time_s"] > 0 for t in ruled_out
    )
