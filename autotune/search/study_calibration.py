"""A study's cluster and performance-model calibration: described when a search starts,
refitted after every complete trial, kept in the study's database.

Where it lives: ``autotune_calibrations`` (``Database.add_calibration`` /
``latest_calibration``), one row per fit, each with the cluster description, the fitted
``Calibration``, and the residuals (per-trial errors, MAPE, and the span fits). The first row of
a search (``num_trials`` 0) is the cluster as described, with its own calibration (the defaults,
or what a ``--cluster`` file carries); the newest row is the study's calibration.

How a fit is made (``fit_study``), the same in a search and in ``autotune calibrate``:

1. the span summaries of the complete trials (``autotune.model.span_fit``) give the links' latency
   and bandwidth and the compute rate, which set the starting ``comm_efficiency`` and
   ``compute_efficiency`` (and half-efficiency size) over the cluster's own calibration;
2. ``autotune.model.calibration.fit_calibration`` fits the model's parameters to the trials'
measured
   step times from that start (its prior is centred there).

Every refit starts from the cluster's calibration, not from the previous fit, so the prior stays
put as trials accumulate and a fit depends only on the trials it is given.

No torch or Ray at import (``describe_cluster`` imports Ray when it runs, and asks torch for
the GPU in a child process, ``autotune.search.local_gpus``).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from autotune.config import TrialConfig
from autotune.errors import ConfigError
from autotune.model.calibration import FitReport, Sample, fit_calibration
from autotune.model.cluster import (
    ClusterSpec,
    gpu_node,
    load_cluster,
    local_cpu_cluster,
)
from autotune.model.perf_model import Calibration, predict_step_time
from autotune.model.span_fit import SpanFit, TrialSpans, fit_spans, summarize
from autotune.status import TrialStatus


# ---- the cluster -----------------------------------------------------------------------------
def resolve_cluster(name_or_path: str, world_size: int) -> ClusterSpec:
    """A ``--cluster`` built-in name or file, refused if it has too few devices for the world."""
    cluster = load_cluster(name_or_path)
    if cluster.world_size < world_size:
        raise ConfigError(
            f"cluster '{cluster.name}' has {cluster.num_nodes} node(s) × "
            f"{cluster.devices_per_node} devices = {cluster.world_size}, fewer than the world "
            f"size {world_size}; give a cluster with more nodes or a smaller --world-size"
        )
    return cluster


def describe_cluster(
    world_size: int, device_type: str, *, warn: Callable[[str], None] | None = None
) -> ClusterSpec:
    """The machine the trials run on. CPU ranks: ``local_cpu_cluster``. GPUs: the nodes of the
    Ray cluster that have GPUs (or this host's, before Ray starts), each GPU its built-in node
    by the name torch reports (``model.cluster.gpu_node``), or, when the table does not know
    it, described from its CUDA properties with a one-line warning (``warn``, else stderr)."""
    if device_type == "cpu":
        return local_cpu_cluster(world_size)
    from autotune.search.local_gpus import local_gpus

    gpus = local_gpus()  # asked of torch in a child process: the driver loads no torch
    name = gpus.name if gpus.available else "unknown GPU"
    nodes, per_node = _gpu_nodes(gpus.count if gpus.available else 0)
    node = gpu_node(name, gpus.device_properties(), warn=warn or _warn)
    per_node = max(per_node, 1)
    nodes = max(nodes, math.ceil(world_size / per_node))
    return dataclasses.replace(node, num_nodes=nodes, devices_per_node=per_node)


def _warn(text: str) -> None:
    print(f"autotune: warning: {text}", file=sys.stderr, flush=True)


def _gpu_nodes(local_gpus: int) -> tuple[int, int]:
    """(nodes with GPUs, GPUs per node) of the running Ray cluster, or this host alone."""
    try:
        import ray

        if ray.is_initialized():
            # The facts the executor places ranks by (``autotune.trial.placement``).
            from autotune.trial.placement import cluster_shape, read_nodes

            nodes = read_nodes(use_gpu=True, cpus_per_rank=1.0)
            if nodes:
                return cluster_shape(nodes)
    except ImportError:
        pass
    return 1, local_gpus


# ---- the fit ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StudyFit:
    """One calibration of a study: the trials, the span fits and the step-time fit."""

    cluster: ClusterSpec
    trials: tuple[Any, ...]
    """The complete trials fitted on (``db.TrialRecord``), oldest first."""
    spans: SpanFit | None
    report: FitReport
    seconds: float
    """Wall time of the fit (span loading included)."""

    @property
    def calibration(self) -> Calibration:
        return self.report.calibration

    def rows(self) -> list[dict[str, Any]]:
        """Per trial: number, configuration name, measured and predicted seconds, error."""
        from autotune.layouts import short_name

        out = []
        for trial, error in zip(self.trials, self.report.residuals):
            measured = trial.metrics["step_time_s"]
            out.append(
                {
                    "trial_id": trial.id,
                    "number": trial.number,
                    "config": short_name(TrialConfig.from_dict(trial.config)),
                    "measured_s": measured,
                    "predicted_s": measured * (1 + error),
                    "error": error,
                }
            )
        return out

    def residuals(self) -> dict[str, Any]:
        """What the database keeps beside the calibration."""
        return {
            "trials": self.rows(),
            "mape": self.report.mape,
            "fitted": list(self.report.fitted),
            "fit_s": self.seconds,
            "spans": self.spans.as_dict() if self.spans is not None else None,
        }

    def cluster_with_calibration(self) -> ClusterSpec:
        return dataclasses.replace(self.cluster, calibration=self.calibration.to_dict())


def complete_trials(database, study_id: int) -> list:
    """The study's complete trials of built-in workloads with a measured step time."""
    trials = []
    for t in database.list_trials(study_id):
        step = t.metrics.get("step_time_s")
        if t.status != TrialStatus.COMPLETE or not isinstance(step, (int, float)) or not step > 0:
            continue
        if TrialConfig.from_dict(t.config).workload.shape is None:
            continue  # a user workload: the model has no shape to predict it with
        trials.append(t)
    return trials


def fit_study(
    database,
    study_id: int,
    cluster: ClusterSpec,
    *,
    span_cache: dict[int, TrialSpans] | None = None,
) -> StudyFit | None:
    """Fit the study's calibration on its complete trials (None when there are none).

    ``span_cache`` maps trial id → span summary; missing ones are loaded from the database once
    and added to it."""
    from autotune.study.store import load_spans

    start_time = time.perf_counter()
    trials = complete_trials(database, study_id)
    if not trials:
        return None
    cache = span_cache if span_cache is not None else {}
    summaries = []
    for t in trials:
        if t.id not in cache:
            cache[t.id] = summarize(
                load_spans(database, t.id), TrialConfig.from_dict(t.config), cluster
            )
        summaries.append(cache[t.id])
    base = Calibration.for_cluster(cluster)
    spans = None
    if any(s.collectives or s.compute for s in summaries):
        spans = fit_spans(summaries, cluster, base)
        base = spans.start_calibration(base)
    samples = [Sample(TrialConfig.from_dict(t.config), t.metrics["step_time_s"]) for t in trials]
    report = fit_calibration(samples, cluster, start=base)
    return StudyFit(cluster, tuple(trials), spans, report, time.perf_counter() - start_time)


def prediction_metrics(
    config: TrialConfig, cluster: ClusterSpec, calibration: Calibration
) -> dict[str, Any]:
    """``predicted_step_time_s`` and ``predicted_breakdown`` (seconds per term) for a trial's
    metrics; empty for a user workload (no shape) or a layout the model cannot place."""
    if config.workload.shape is None:
        return {}
    try:
        estimate = predict_step_time(config, cluster, calibration)
    except (ConfigError, ValueError, ZeroDivisionError):
        return {}
    return {
        "predicted_step_time_s": estimate.step_time_s,
        "predicted_breakdown": dict(estimate.breakdown),
    }


# ---- during a search -------------------------------------------------------------------------
class StudyCalibration:
    """The cluster and current calibration of a running search; refits after each complete
    trial. Called on the search's own thread only."""

    def __init__(
        self,
        database,
        study_id: int,
        cluster: ClusterSpec,
        calibration: Calibration,
        *,
        say: Callable[[str], None] = lambda text: None,
    ) -> None:
        self.db, self.study_id, self.cluster = database, study_id, cluster
        self.calibration = calibration
        self._say = say
        self._spans: dict[int, TrialSpans] = {}
        self._warned = False
        self.fit_seconds: list[float] = []
        """Wall time of each refit, for the record."""
        self.last_report: FitReport | None = None
        """The latest refit's step-time fit (its residuals), None before the first."""

    @classmethod
    def begin(
        cls,
        database,
        study_id: int,
        cluster: ClusterSpec | None,
        describe: Callable[[], ClusterSpec],
        *,
        say: Callable[[str], None] = lambda text: None,
    ) -> StudyCalibration:
        """The study's stored cluster and calibration when it has some and no cluster is
        given (a resumed search); otherwise ``cluster`` (or the described machine), stored
        with its own calibration as the study's first row."""
        latest = database.latest_calibration(study_id)
        if cluster is None and latest is not None:
            stored = ClusterSpec.from_dict(latest.cluster, where="the study's stored cluster")
            return cls(
                database, study_id, stored, Calibration.from_dict(latest.calibration), say=say
            )
        cluster = cluster or describe()
        calibration = Calibration.for_cluster(cluster)
        database.add_calibration(
            study_id,
            num_trials=0,
            cluster=cluster.to_dict(),
            calibration=calibration.to_dict(),
            residuals={},
        )
        return cls(database, study_id, cluster, calibration, say=say)

    def predict(self, config: TrialConfig) -> dict[str, Any]:
        return prediction_metrics(config, self.cluster, self.calibration)

    def remember_spans(self, trial_id: int, config: TrialConfig, spans) -> None:
        """Summarise a trial's spans while they are in memory (no reload at the next refit)."""
        self._spans[trial_id] = summarize(spans, config, self.cluster)

    def refit(self) -> StudyFit | None:
        """Fit on every complete trial so far and store it; a failure keeps the previous
        calibration (said once per search)."""
        try:
            fit = fit_study(self.db, self.study_id, self.cluster, span_cache=self._spans)
            if fit is None:
                return None
            self.db.add_calibration(
                self.study_id,
                num_trials=len(fit.trials),
                cluster=self.cluster.to_dict(),
                calibration=fit.calibration.to_dict(),
                residuals=fit.residuals(),
            )
        except Exception as e:  # noqa: BLE001 - a refit is advice; the search goes on
            if not self._warned:
                self._warned = True
                self._say(
                    f"calibration refit failed ({type(e).__name__}: {e}); predictions "
                    "keep the previous calibration"
                )
            return None
        self.calibration = fit.calibration
        self.last_report = fit.report
        self.fit_seconds.append(fit.seconds)
        return fit
