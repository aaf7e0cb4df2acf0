"""The study's calibration: a real search predicts each trial's step time before running it,
stores the cluster and a refit after every complete trial, and ``autotune calibrate`` fits the
same calibration again and writes it as a cluster file the search reads."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from test_search import spec

from autotune.cli.main import main
from autotune.config import TrialConfig
from autotune.errors import ConfigError
from autotune.layouts import short_name
from autotune.model.calibration import SHAPE_SHRINK, Sample, fit_calibration
from autotune.model.cluster import ClusterSpec, load_cluster, local_cpu_cluster
from autotune.model.perf_model import TERMS, Calibration, layer_shape_key, predict_step_time
from autotune.search.search import Search
from autotune.search.study_calibration import StudyCalibration, fit_study
from db import Database

STUDY = "calibrated"
SWEEP_E = Path(__file__).resolve().parents[2] / "bench" / "data" / "cpu_sweep_e.json"


@pytest.fixture(scope="module")
def searched(executor, tmp_path_factory):
    """A real search on 2 CPU ranks: 3 configurations, each with one profiled step."""
    url = f"sqlite:///{tmp_path_factory.mktemp('calibrate') / 'study.db'}"
    database = Database.open(url)
    search = Search.open(
        spec(study_name=STUDY, n_trials=3, num_profiled_steps=1, top_k=1, remeasure_repeats=0),
        database,
        executor,
        out=None,
    )
    outcome = search.run()
    yield url, database, outcome.study_id, search
    database.close()


def _complete(database, study_id):
    return [t for t in database.list_trials(study_id) if t.status == "complete"]


def test_each_trial_was_predicted_with_the_calibration_of_the_trials_before_it(searched):
    _, database, study_id, _ = searched
    trials = _complete(database, study_id)
    rows = database.list_calibrations(study_id)
    assert len(trials) == 3
    # The cluster as described first (nothing fitted), then one refit per complete trial.
    assert [r.num_trials for r in rows] == [0, 1, 2, 3]
    assert rows[0].cluster == local_cpu_cluster(2).to_dict()
    assert rows[0].calibration == Calibration.for_cluster(local_cpu_cluster(2)).to_dict()
    for k, trial in enumerate(trials):
        metrics = trial.metrics
        breakdown = metrics["predicted_breakdown"]
        assert set(breakdown) == set(TERMS)
        # Each layout pays the terms of its parallelism and no other.
        config = TrialConfig.from_dict(trial.config)
        assert (breakdown["tp_comm"] > 0) is (config.tp_degree > 1), short_name(config)
        assert (breakdown["pp_p2p"] > 0) is (breakdown["pp_bubble"] > 0) is (config.pp_degree > 1)
        assert (breakdown["dp_comm"] > 0) is (config.dp_degree > 1), short_name(config)
        assert breakdown["compute"] > 0 and breakdown["optimizer"] > 0
        # Predicted before it ran, with what the k trials before it had fitted.
        expected = predict_step_time(
            TrialConfig.from_dict(trial.config),
            ClusterSpec.from_dict(rows[k].cluster),
            Calibration.from_dict(rows[k].calibration),
        )
        assert metrics["predicted_step_time_s"] == expected.step_time_s
        assert breakdown == expected.breakdown


def test_the_stored_fit_reproduces_its_residuals(searched):
    _, database, study_id, search = searched
    latest = database.latest_calibration(study_id)
    assert search.study_calibration.calibration.to_dict() == latest.calibration
    cluster = ClusterSpec.from_dict(latest.cluster)
    calibration = Calibration.from_dict(latest.calibration)
    trials = {t.id: t for t in _complete(database, study_id)}
    rows = latest.residuals["trials"]
    assert sorted(r["trial_id"] for r in rows) == sorted(trials)
    errors = []
    for row in rows:
        trial = trials[row["trial_id"]]
        config = TrialConfig.from_dict(trial.config)
        assert row["config"] == short_name(config)
        assert row["measured_s"] == trial.metrics["step_time_s"]
        predicted = predict_step_time(config, cluster, calibration).step_time_s
        assert row["predicted_s"] == pytest.approx(predicted, rel=1e-9)
        errors.append(abs(predicted / row["measured_s"] - 1))
    assert latest.residuals["mape"] == pytest.approx(sum(errors) / len(errors), rel=1e-9)
    # The profiled spans gave the fit its starting point: the dp all-reduce of every gradient.
    link = latest.residuals["spans"]["links"]["intra_node"]
    assert link["num_points"] >= 3 and link["bandwidth_gbs"] > 0
    assert latest.residuals["spans"]["compute"]["num_trials"] == 3


def test_calibrate_writes_the_latest_calibration_as_a_cluster_file(searched, tmp_path, capsys):
    url, database, study_id, _ = searched
    out = tmp_path / "cluster.json"
    assert main(["calibrate", "--study", STUDY, "--db", url, "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    latest = database.latest_calibration(study_id)
    for trial in _complete(database, study_id):
        assert short_name(TrialConfig.from_dict(trial.config)) in printed
    assert f"MAPE {100 * latest.residuals['mape']:.1f}%" in printed
    for name in ("compute_efficiency", "comm_efficiency", "layer_overhead_s"):
        assert name in printed
    loaded = ClusterSpec.from_file(out)
    assert loaded.calibration == latest.calibration
    assert dataclasses.replace(loaded, calibration=None) == dataclasses.replace(
        ClusterSpec.from_dict(latest.cluster), calibration=None
    )
    assert load_cluster(str(out)) == loaded
    # The search reads it as its cluster (checked before anything runs) and starts from it.
    other = Database.open(f"sqlite:///{tmp_path / 'next.db'}")
    try:
        search = Search.open(spec(study_name="next", cluster=str(out)), other, None, out=None)
        assert search.cluster == loaded
        assert Calibration.for_cluster(search.cluster).to_dict() == latest.calibration
    finally:
        other.close()


def test_a_cluster_too_small_for_the_world_is_refused(tmp_path):
    with Database.open(f"sqlite:///{tmp_path / 'x.db'}") as database:
        with pytest.raises(
            ConfigError,
            match=r"cluster 'cpu-local' has 1 node\(s\) × 2 devices "
            r"= 2, fewer than the world size 4",
        ):
            Search.open(
                spec(study_name="big", world_size=4, cluster="cpu-local"), database, None, out=None
            )
        with pytest.raises(ConfigError, match="unknown cluster 'nowhere'"):
            Search.open(spec(study_name="big", cluster="nowhere"), database, None, out=None)


def test_a_failing_refit_keeps_the_calibration_and_says_so_once(searched):
    _, database, study_id, _ = searched
    # A cluster file that gives no float32 peak: the model cannot price these trials.
    cluster = local_cpu_cluster(2)
    cluster = dataclasses.replace(
        cluster, device=dataclasses.replace(cluster.device, peak_flops={"bfloat16": 1e12})
    )
    said = []
    calibration = StudyCalibration(database, study_id, cluster, Calibration(), say=said.append)
    before = len(database.list_calibrations(study_id))
    assert calibration.refit() is None and calibration.refit() is None
    assert calibration.calibration == Calibration()
    assert len(said) == 1 and "calibration refit failed" in said[0]
    assert "no peak FLOP/s for float32" in said[0]
    assert len(database.list_calibrations(study_id)) == before
    config = TrialConfig.from_dict(_complete(database, study_id)[0].config)
    assert calibration.predict(config) == {}  # no prediction rather than a crash


@pytest.mark.parametrize(
    "args, message",
    [
        (["--db", "none"], "calibrate reads a study's trials from a database: give --db URL"),
        (["--study", "missing"], "no study named 'missing' in"),
        (
            ["--study", "empty"],
            "study 'empty' has no complete trials of a built-in workload to "
            "calibrate from; run a search first",
        ),
    ],
)
def test_bad_calibrate_input_is_one_line_exit_2(tmp_path, capsys, args, message):
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    with Database.open(url) as database:
        database.create_study("empty", {})
    argv = ["calibrate", "--study", "empty", "--db", url, *args]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("autotune: error: ") and message in err
    assert not (tmp_path / "cluster.json").exists()


def test_the_stored_fit_explains_its_trials_better_than_its_start(searched):
    """The step-time fit starts from the cluster's calibration with the span fits' efficiencies
    (``fit_study``) and minimises the squared log errors plus a prior that is zero at that
    start, so the stored fit's squared log errors can be no larger than the start's; the
    per-shape factors then pull each shape's mean error toward zero. Checked with the model on
    the trials' measured step times, not with the fit's own residuals."""
    _, database, study_id, _ = searched
    latest = database.latest_calibration(study_id)
    cluster = ClusterSpec.from_dict(latest.cluster)
    spans = fit_study(database, study_id, cluster).spans
    start = Calibration.for_cluster(cluster)
    start = spans.start_calibration(start) if spans else start

    def squared_log_errors(calibration: Calibration) -> float:
        return sum(
            math.log(
                predict_step_time(TrialConfig.from_dict(t.config), cluster, calibration).step_time_s
                / t.metrics["step_time_s"]
            )
            ** 2
            for t in _complete(database, study_id)
        )

    fitted = Calibration.from_dict(latest.calibration)
    assert fitted != start
    assert squared_log_errors(fitted) <= squared_log_errors(start)


# ---- per-shape factors on CPU trials ----------------------------------------------------------
def _sweep_e_samples() -> list[Sample]:
    """Sweep E's 48 measured layouts (tiny GPT on 2 and 4 gloo ranks of a 2-core machine; the
    configs name no precision, so they trained in the CPU default, float32), each on the
    cluster its world size ran on, as ``bench/cpu_sweep.py evaluate`` fits them."""
    table = json.loads(SWEEP_E.read_text())
    cores = table["machine"]["cores"]
    samples = []
    for row in table["rows"]:
        if row["status"] != "complete":
            continue
        config = TrialConfig.from_dict(row["config"])
        samples.append(
            Sample(
                config,
                row["step_time_s"],
                cluster=local_cpu_cluster(config.world_size, cores=cores),
            )
        )
    return samples


def _mean_log_error(group: list[Sample], calibration: Calibration) -> float:
    return sum(
        math.log(predict_step_time(s.config, s.cluster, calibration).step_time_s / s.step_time_s)
        for s in group
    ) / len(group)


def test_shape_factors_fitted_on_cpu_trials_apply_to_their_predictions():
    """The per-shape corrections are keyed as a gloo prediction looks them up (float32, the CPU
    default), so they change the predictions they were fitted to. Each shape's factor is the
    one that zeroes its trials' mean log error (checked here by predicting with the unshrunk
    factor), shrunk toward 1 by n / (n + SHAPE_SHRINK) for n trials: with it the shape's mean
    error keeps its sign and shrinks. Keyed as on a GPU (bfloat16) no factor applied and every
    prediction stayed as it was."""
    samples = _sweep_e_samples()
    cluster = samples[0].cluster
    start = Calibration.for_cluster(cluster)
    # Nothing but the shape factors is fitted: the start's predictions are the base.
    report = fit_calibration(samples, cluster, start=start, fitted=(), fit_shapes=True)
    cal = report.calibration
    assert report.fitted == ()
    assert set(cal.layer_shape_factors).isdisjoint(cal.host_shape_factors)
    factors = {**cal.layer_shape_factors, **cal.host_shape_factors}
    by_key: dict[str, list[Sample]] = {}
    for s in samples:
        by_key.setdefault(layer_shape_key(s.config, s.config.workload.shape, "cpu"), []).append(s)
    assert all(key.endswith(" float32") for key in by_key)
    assert set(factors) <= set(by_key) and len(factors) >= len(by_key) - 2
    for key, factor in factors.items():
        group = by_key[key]
        n = len(group)
        table = "layer_shape_factors" if key in cal.layer_shape_factors else "host_shape_factors"
        unshrunk = math.exp(math.log(factor) * (n + SHAPE_SHRINK) / n)
        assert _mean_log_error(
            group, dataclasses.replace(start, **{table: {key: unshrunk}})
        ) == pytest.approx(0.0, abs=1e-6)
        before, after = _mean_log_error(group, start), _mean_log_error(group, cal)
        assert 0 < after / before < 1, key  # toward the measured times, not past them
    # Over the whole table the predictions moved toward the measurements.
    base = [
        abs(predict_step_time(s.config, s.cluster, start).step_time_s / s.step_time_s - 1)
        for s in samples
    ]
    assert report.mape < sum(base) / len(base) - 0.01
