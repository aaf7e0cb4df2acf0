"""The search loop: Optuna proposes, the memory model screens, Ray measures, the database keeps.

    spec → SearchSpace (valid grid) → Optuna study (same database as our tables)
    loop: ask → config → predicted step time (stored in the trial's metrics)
                       → predicted peak > limit? record infeasible_predicted, run nothing
                       → RayExecutor.run → measured peak > limit or OOM? infeasible_measured
                       → store trial + spans (one transaction) → tell Optuna (value, constraint)
                       → complete? refit the study's calibration (``study_calibration``)
    stop: trial budget, time budget, or no improvement for ``patience`` trials
    then: re-measure the top few, rank by median throughput, keep the spread.

Optuna learns where the memory wall is through ``constraints_func`` (a trial is feasible when
its predicted or measured peak minus the limit is ≤ 0). Trials are numbered within the study;
``resume`` continues a study without re-running a finished trial.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

from autotune.config import TrialConfig, WorkloadSpec, _positive
from autotune.errors import ConfigError, TrialFailed
from autotune.space import SearchSpace

GIB = 2**30
CONSTRAINT_ATTR = "memory_excess_gib"
MEMORY_MARGIN = 0.15
"""A configuration is run only if its predicted peak × (1 + MEMORY_MARGIN) is within the limit:
the memory model's worst under-prediction over bench/search_efficiency.py's sweep was 11.5%."""
MAX_DUPLICATES = 20
"""Proposals of already-measured configurations tolerated in a row before an untried one is
taken instead (TPE re-proposes its favourites once a small space is mostly explored)."""

SAMPLERS = ("tpe", "gp", "random")
DEFAULT_SAMPLER = "tpe"


def make_sampler(name: str, seed: int):
    """A seeded Optuna sampler. Each reads the memory constraint that ``Trial.set_constraint``
    stores (Optuna 5): TPE and GP steer away from configurations over the limit."""
    import optuna

    if name == "tpe":  # multivariate: the knobs interact (tp × pp × micro-batch)
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=5, multivariate=True)
    if name == "gp":
        # The space is define-by-run (pp_schedule only when pp > 1): GP models the knobs
        # every trial has and samples the conditional ones at random, which is intended here.
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=5,
                                         warn_independent_sampling=False)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise ConfigError(f"unknown sampler '{name}'; choose one of {', '.join(SAMPLERS)}")


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchSpec:
    """One search: the workload, the cluster, the limits and the budget."""

    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    """What is trained."""
    world_size: int = 2
    """Ranks per trial."""
    memory_limit_gib: float | None = None
    """Per-device memory limit; None: the CUDA device's memory, or no limit on CPU."""
    n_trials: int = 20
    """Trial budget (infeasible-predicted trials count; they cost nothing)."""
    timeout_s: float | None = None
    """Time budget in seconds; None: no limit."""
    patience: int | None = 10
    """Stop when the best has not improved for this many trials; None: never."""
    study_name: str = "autotune"
    """Name of the study in the database (one study per name)."""
    seed: int = 0
    """Seed of the sampler (and of each trial's model and data)."""
    fixed: dict = field(default_factory=dict)
    """Knobs fixed to one value, e.g. {'zero_stage': 3}."""
    narrowed: dict = field(default_factory=dict)
    """Knobs narrowed to some values, e.g. {'micro_batch_size': [1, 2]}."""
    top_k: int = 3
    """How many of the best configurations are measured again before one is declared best."""
    remeasure_repeats: int = 2
    """Extra measurements of each of the top_k."""
    num_warmup_steps: int = 2
    num_timed_steps: int = 5
    num_profiled_steps: int = 2
    device: str = "auto"
    sampler: str = DEFAULT_SAMPLER
    """Optuna sampler: one of ``SAMPLERS``; the default is the one bench/search_efficiency.py
    measured to need the fewest trials."""
    cluster: str | None = None
    """The cluster the trials run on, for the performance model: a built-in name or a
    JSON/TOML file (``autotune.cluster.load_cluster``); None: described from Ray and torch."""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def validate(self) -> None:
        for name in ("n_trials", "world_size", "num_timed_steps"):
            _positive(name, getattr(self, name))
        if self.timeout_s is not None and not (self.timeout_s > 0):
            raise ConfigError(f"the time budget must be > 0 seconds, not {self.timeout_s}")
        if self.memory_limit_gib is not None and not (self.memory_limit_gib > 0):
            raise ConfigError(f"--memory-limit must be > 0 GiB, not {self.memory_limit_gib}")
        if self.patience is not None and self.patience < 1:
            raise ConfigError(f"patience must be ≥ 1, not {self.patience}")
        if self.sampler not in SAMPLERS:
            raise ConfigError(f"unknown sampler '{self.sampler}'; choose one of "
                              f"{', '.join(SAMPLERS)}")
        if self.top_k < 1 or self.remeasure_repeats < 0:
            raise ConfigError("top_k must be ≥ 1 and remeasure_repeats ≥ 0")


@dataclass(frozen=True)
class Entry:
    """One configuration on the leaderboard."""

    trial_id: int
    number: int
    config: TrialConfig
    status: str
    throughputs: list[float]
    """Every measurement of tokens/s (first run, then re-measurements)."""
    predicted_peak: int | None
    measured_peak: int | None
    error: str | None = None
    step_time_s: float | None = None
    """Measured step time of the trial's run (None when it measured none)."""
    predicted_step_time_s: float | None = None
    """The performance model's step time, as the search stored it before the trial ran (None
    for trials stored without one)."""

    @property
    def step_time_error(self) -> float | None:
        """predicted / measured − 1 of the step time; None unless both are known."""
        if self.predicted_step_time_s is None or not self.step_time_s:
            return None
        return self.predicted_step_time_s / self.step_time_s - 1

    @property
    def throughput(self) -> float:
        return statistics.median(self.throughputs) if self.throughputs else 0.0

    @property
    def spread(self) -> float:
        """(max − min) / median of the measurements; 0 with one measurement."""
        if len(self.throughputs) < 2 or not self.throughput:
            return 0.0
        return (max(self.throughputs) - min(self.throughputs)) / self.throughput


@dataclass
class SearchOutcome:
    study_id: int
    leaderboard: list[Entry]
    """Complete trials by median throughput, then the infeasible and failed ones."""
    num_run: int
    num_infeasible_predicted: int
    elapsed_s: float
    stopped_because: str

    @property
    def best(self) -> Entry | None:
        complete = [e for e in self.leaderboard if e.status == "complete"]
        return complete[0] if complete else None


def default_world_size() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 2


def memory_limit_bytes(spec: SearchSpec) -> int | None:
    if spec.memory_limit_gib is not None:
        return int(spec.memory_limit_gib * GIB)
    import torch

    if spec.device != "cpu" and torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory
    return None


def device_type(spec: SearchSpec) -> str:
    """Where the trials will run, for the memory model's device-specific terms."""
    if spec.device != "auto":
        return spec.device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def predicted_to_fit(predicted: int | None, limit: int | None) -> bool:
    """Whether a prediction (None: unknown) leaves room to run; unknown ones are run and their
    measured peak decides."""
    return limit is None or predicted is None or predicted * (1 + MEMORY_MARGIN) <= limit


def predict_peak(config: TrialConfig, device_type: str) -> int | None:
    """The memory model's predicted peak, or None for a user workload whose shape it does not
    know (then the trial's measured peak is the only judge)."""
    from autotune.memory import estimate_memory

    if config.workload.shape is None:
        return None
    return estimate_memory(config, device_type=device_type).total


def _set_excess(trial, excess_gib: float) -> None:
    """Tell Optuna how far over the memory limit a trial was (its constraint; ≤ 0 feasible)."""
    trial.set_constraint(CONSTRAINT_ATTR, excess_gib)
    trial.set_user_attr(CONSTRAINT_ATTR, excess_gib)


def base_config(spec: SearchSpec) -> TrialConfig:
    return TrialConfig(workload=spec.workload, world_size=spec.world_size, seed=spec.seed,
                       num_warmup_steps=spec.num_warmup_steps,
                       num_timed_steps=spec.num_timed_steps,
                       num_profiled_steps=spec.num_profiled_steps, device=spec.device)


class Search:
    """A search over one study; ``run`` may be called on a new or an interrupted study.

    ``executor`` is anything with ``run(config) -> TrialResult`` (a ``RayExecutor``); one with
    ``slots`` > 1 (a ``TrialPool``) runs that many trials at once."""

    def __init__(self, spec: SearchSpec, database, executor, *, resume: bool = False,
                 out: TextIO | None = sys.stderr) -> None:
        import optuna

        spec.validate()
        self.spec, self.db, self.executor, self.out = spec, database, executor, out
        self.space = SearchSpace(base_config(spec), fixed=spec.fixed, narrowed=spec.narrowed)
        self.limit = memory_limit_bytes(spec)
        self.device_type = device_type(spec)
        self._check_something_fits()
        from autotune.study_calibration import resolve_cluster

        # A --cluster is checked now, before anything runs; a described one when the search
        # starts (on GPUs it is read from the running Ray cluster).
        self.cluster = (resolve_cluster(spec.cluster, spec.world_size) if spec.cluster
                        else None)
        self.study_calibration = None  # a StudyCalibration once run() starts
        self._predicted: dict[int, dict] = {}  # trial number → predicted step time metrics
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        storage = _optuna_storage(database.connect_url)
        names = {s.name for s in database.list_studies()}
        if resume and spec.study_name not in names:
            raise ConfigError(f"no study named '{spec.study_name}' to resume in "
                              f"{database.url_for_display}; existing: "
                              f"{', '.join(sorted(names)) or 'none'} (drop --resume to start "
                              "a new one)")
        if spec.study_name in names and not resume:
            raise ConfigError(f"a study named '{spec.study_name}' already exists in "
                              f"{database.url_for_display}; pass --resume to continue it or "
                              "choose another --study")
        self._duplicates = 0
        # The study keeps the limit the search used (on a GPU, the device's memory by default).
        resolved = dataclasses.replace(spec, memory_limit_gib=self.limit / GIB
                                       if self.limit is not None else None)
        self.study_record = (database.get_study(spec.study_name) if resume
                             else database.create_study(spec.study_name, resolved.to_dict()))
        # Constraints reach TPE through Trial.set_constraint (Optuna 5): ≤ 0 is feasible.
        sampler = make_sampler(spec.sampler, spec.seed)
        self.study = optuna.create_study(study_name=f"autotune:{spec.study_name}",
                                         storage=storage, direction="maximize",
                                         sampler=sampler, load_if_exists=True)
        self._fail_stale_trials()
        if not resume:
            self._enqueue_baseline()

    # ---- helpers ----------------------------------------------------------------------------
    def _check_something_fits(self) -> None:
        if self.limit is None:
            return
        peaks = [predict_peak(c, self.device_type) for c in self.space.configs]
        if None in peaks:
            return  # a user workload: only measurements can tell
        lowest = min(peaks)
        if not predicted_to_fit(lowest, self.limit):
            raise ConfigError(
                f"no configuration fits in {self.limit / GIB:.3g} GiB per device: the smallest "
                f"predicted peak is {lowest / GIB:.3g} GiB; raise --memory-limit, add ranks, or "
                "allow more ZeRO/activation checkpointing")

    def _enqueue_baseline(self) -> None:
        """Start from the configuration an engineer (or DeepSpeed's autotuner) tries first: no
        tensor or pipeline parallelism, no recomputation, the lowest ZeRO stage and then the
        largest micro-batch predicted to fit. TPE explores from there."""

        def fits(c: TrialConfig) -> bool:
            return predicted_to_fit(predict_peak(c, self.device_type), self.limit)

        ac_rank = {"none": 0, "selective": 1, "full": 2}
        candidates = sorted(
            (c for c in self.space.configs if fits(c)),
            key=lambda c: (c.tp_degree * c.pp_degree, ac_rank[c.activation_checkpointing],
                           c.zero_stage, -c.micro_batch_size, not c.overlap_enabled,
                           abs(c.bucket_mb - 25.0)))
        if candidates:
            self.study.enqueue_trial(self.space.params_for(candidates[0]),
                                     skip_if_exists=True)

    def _fail_stale_trials(self) -> None:
        """Trials left RUNNING by an interrupted search are marked failed in Optuna."""
        from optuna.trial import TrialState

        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            self.study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)

    def _say(self, text: str) -> None:
        if self.out is not None:
            print(text, file=self.out, flush=True)

    def _finished(self) -> list:
        from optuna.trial import TrialState

        return self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,
                                                         TrialState.FAIL))

    # ---- the loop ---------------------------------------------------------------------------
    def run(self) -> SearchOutcome:
        """Propose, screen and measure until a budget is spent; up to ``width`` trials run at
        once (the executor's ``slots``), each told to Optuna as it finishes."""
        from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

        spec, start = self.spec, time.monotonic()
        self._begin_calibration()
        self._best, self._since_best = self._best_so_far(), 0
        self._num_run, num_pred = 0, 0
        tried = {e.config for e in self.leaderboard()}
        self._initial_done = len(tried)
        width = max(1, int(getattr(self.executor, "slots", 1)))
        threads = ThreadPoolExecutor(width, "trial") if width > 1 else None
        in_flight: dict = {}  # future → (optuna trial, config, predicted peak)
        stopped = None
        try:
            while True:
                while stopped is None and len(in_flight) < width:
                    stopped = self._stop_reason(len(tried), start)
                    if stopped is not None:
                        break
                    trial, config = self._propose(tried, in_flight)
                    if trial is None:
                        continue
                    tried.add(config)
                    run, predicted = self._screen(trial, config, len(tried), start)
                    if not run:
                        num_pred += 1
                        continue
                    future = (threads.submit(self._run_trial, config) if threads
                              else _done_future(self._run_trial, config))
                    in_flight[future] = (trial, config, predicted)
                if not in_flight:
                    break
                finished, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                for future in sorted(finished, key=lambda f: in_flight[f][0].number):
                    trial, config, predicted = in_flight.pop(future)
                    self._finish(trial, config, predicted, future.result(),
                                 len(tried) - len(in_flight), start)
        finally:
            if threads is not None:
                threads.shutdown(wait=False, cancel_futures=True)
        board = self._remeasure_top()
        return SearchOutcome(self.study_record.id, board, self._num_run, num_pred,
                             time.monotonic() - start, stopped or "trial budget")

    def _begin_calibration(self) -> None:
        """The cluster the study runs on and its calibration, stored with the study."""
        from autotune.study_calibration import StudyCalibration, describe_cluster

        if self.study_calibration is not None:
            return
        self.study_calibration = StudyCalibration.begin(
            self.db, self.study_record.id, self.cluster,
            lambda: describe_cluster(self.spec.world_size, self.device_type), say=self._say)
        c = self.study_calibration.cluster
        self._say(f"cluster '{c.name}': {c.num_nodes} × {c.devices_per_node} "
                  f"{c.device.name} ({c.backend}); step times predicted, the calibration "
                  "refitted after each complete trial")

    def _stop_reason(self, done: int, start: float) -> str | None:
        spec = self.spec
        if done >= spec.n_trials:
            return "trial budget"
        if done >= len(self.space):
            return "every valid configuration tried"
        if spec.timeout_s is not None and time.monotonic() - start >= spec.timeout_s:
            return "time budget"
        if spec.patience is not None and self._since_best >= spec.patience:
            return f"no improvement in {spec.patience} trials"
        return None

    def _propose(self, tried: set[TrialConfig], in_flight: dict):
        """Ask Optuna for an untried configuration: (trial, config), or (None, None) when it
        proposed one already measured or running (then told and counted)."""
        from optuna.trial import TrialState

        trial = self.study.ask()
        config = self.space.suggest(trial)
        if config not in tried:
            self._duplicates = 0
            return trial, config
        # Optuna proposed a configuration already measured: tell it the stored outcome instead
        # of paying for the trial again; after a run of these, take an untried configuration so
        # the search keeps moving. One still running has no outcome yet: it is dropped.
        if any(c == config for _, c, _ in in_flight.values()):
            self.study.tell(trial, state=TrialState.FAIL)
        else:
            self._tell_known(trial, config)
        self._duplicates += 1
        if self._duplicates < MAX_DUPLICATES:
            return None, None
        self._duplicates = 0
        return self.study.ask(), self._untried(tried)  # a parameter-less trial, an untried config

    def _screen(self, trial, config: TrialConfig, done: int,
                start: float) -> tuple[bool, int | None]:
        """(run it?, predicted peak or None if unknown); one predicted not to fit is recorded
        as infeasible and told to Optuna without running anything."""
        self._predicted[trial.number] = self.study_calibration.predict(config)
        predicted = predict_peak(config, self.device_type)
        trial.set_user_attr("predicted_peak_bytes", predicted)
        if predicted_to_fit(predicted, self.limit):
            return True, predicted
        _set_excess(trial, (predicted * (1 + MEMORY_MARGIN) - self.limit) / GIB)
        self._record(trial.number, config, "infeasible_predicted", None, predicted,
                     error=f"predicted peak {predicted / GIB:.3g} GiB (+{MEMORY_MARGIN:.0%} "
                           f"margin) > limit {self.limit / GIB:.3g} GiB")
        self.study.tell(trial, 0.0)
        self._progress(done, config, "infeasible (predicted)", start)
        return False, predicted

    def _run_trial(self, config: TrialConfig):
        """Runs on a trial thread: the measurement only; the database and Optuna are touched
        on the search's own thread."""
        try:
            return self.executor.run(config)
        except TrialFailed as e:
            return e

    def _finish(self, trial, config: TrialConfig, predicted: int | None, outcome, done: int,
                start: float) -> None:
        from optuna.trial import TrialState

        value, status = self._store(trial, config, predicted, outcome)
        self._num_run += 1
        if status == "failed":
            self.study.tell(trial, state=TrialState.FAIL)
        else:
            self.study.tell(trial, value)
        if status == "complete" and value > self._best:
            self._best, self._since_best = value, 0
        else:
            self._since_best += 1
        self._progress(done, config, status, start)

    def _tell_known(self, trial, config: TrialConfig) -> None:
        from optuna.trial import TrialState

        entry = next(e for e in self.leaderboard() if e.config == config)
        if entry.status == "failed":
            self.study.tell(trial, state=TrialState.FAIL)
            return
        if entry.status.startswith("infeasible"):
            peak = entry.measured_peak or entry.predicted_peak or 0
            excess = (peak - self.limit) / GIB if self.limit is not None else 0.0
            _set_excess(trial, max(excess, 1e-9))
        self.study.tell(trial, entry.throughputs[0] if entry.throughputs else 0.0)

    def _untried(self, tried: set[TrialConfig]) -> TrialConfig:
        import random

        untried = [c for c in self.space.configs if c not in tried]
        return random.Random(self.spec.seed + len(tried)).choice(untried)

    def _best_so_far(self) -> float:
        values = [e.throughput for e in self.leaderboard() if e.status == "complete"]
        return max(values, default=0.0)

    def _store(self, trial, config: TrialConfig, predicted: int | None,
               result) -> tuple[float, str]:
        """Record a measured trial (a TrialResult, or the TrialFailed it raised)."""
        from autotune.store import to_record

        if isinstance(result, TrialFailed):
            e = result
            status = "infeasible_measured" if e.kind == "oom" else "failed"
            if status == "infeasible_measured":
                _set_excess(trial, 1.0)
            self._record(trial.number, config, status, None, predicted, error=str(e))
            return 0.0, status
        measured = result.peak_memory_bytes
        status = "complete"
        if self.limit is not None and measured > self.limit:
            status = "infeasible_measured"
            _set_excess(trial, (measured - self.limit) / GIB)
        record, spans = to_record(result, study_id=self.study_record.id, number=trial.number,
                                  status=status)
        record = dataclasses.replace(record, metrics={**record.metrics,
                                                      **self._predicted.pop(trial.number, {})})
        record = dataclasses.replace(record, memory=tuple(
            dataclasses.replace(m, predicted_bytes=predicted) if m.category == "peak" else m
            for m in record.memory))
        if status != "complete":
            record = dataclasses.replace(record, error=(
                f"measured peak {measured / GIB:.3g} GiB > limit {self.limit / GIB:.3g} GiB"))
        trial_id = self.db.add_trial(record, spans)
        if status == "complete":
            self.study_calibration.remember_spans(trial_id, config,
                                            [s for r in result.ranks for s in r.spans])
            self.study_calibration.refit()
        value = result.throughput_tokens_per_s if status == "complete" else 0.0
        return value, status

    def _record(self, number: int, config: TrialConfig, status: str, metrics: dict | None,
                predicted: int | None, *, error: str) -> None:
        from datetime import UTC, datetime

        from db import RankMemoryRecord, TrialRecord

        metrics = {**(metrics or {}), **self._predicted.pop(number, {})}
        self.db.add_trial(TrialRecord(
            id=None, study_id=self.study_record.id, number=number, status=status,
            config=config.resolved(), metrics=metrics, env={}, error=error,
            created_at=datetime.now(UTC),
            memory=(RankMemoryRecord(0, "peak", predicted, None),)))

    def _progress(self, i: int, config: TrialConfig, status: str, start: float) -> None:
        from autotune.layouts import short_name

        elapsed = time.monotonic() - start
        per = elapsed / max(1, i - self._initial_done)
        left = max(0, self.spec.n_trials - i)
        eta = f", ~{per * left:.0f}s left" if per else ""
        self._say(f"[{i}/{self.spec.n_trials}] {short_name(config)}: {status}; best "
                  f"{self._best:,.0f} tok/s; {elapsed:.0f}s elapsed{eta}")

    # ---- results ----------------------------------------------------------------------------
    def leaderboard(self) -> list[Entry]:
        return build_leaderboard(self.db, self.study_record.id)

    def _remeasure_top(self) -> list[Entry]:
        """Measure the top_k again (noisy machines) and store the extra figures."""
        board = self.leaderboard()
        top = [e for e in board if e.status == "complete"][: self.spec.top_k]
        for entry in top:
            have = len(entry.throughputs) - 1
            extra = []
            for _ in range(max(0, self.spec.remeasure_repeats - have)):
                try:
                    extra.append(self.executor.run(entry.config).throughput_tokens_per_s)
                except TrialFailed:
                    break
            if extra:
                record = self.db.get_trial(entry.trial_id)
                metrics = {**record.metrics, "remeasured_throughputs":
                           record.metrics.get("remeasured_throughputs", []) + extra}
                self.db.update_trial(entry.trial_id, status=record.status, metrics=metrics)
                self._say(f"re-measured trial {entry.number}: "
                          f"{', '.join(f'{x:,.0f}' for x in extra)} tok/s")
        return self.leaderboard()


def build_leaderboard(database, study_id: int) -> list[Entry]:
    """A study's trials as leaderboard entries: complete ones by median throughput, then
    infeasible (measured, predicted) and failed ones."""
    entries = []
    for t in database.list_trials(study_id):
        if t.number is None:
            continue
        throughputs = list(t.metrics.get("remeasured_throughputs", []))
        if t.status == "complete":
            throughputs = [t.metrics["throughput_tokens_per_s"]] + throughputs
        predicted = next((m.predicted_bytes for m in t.memory if m.category == "peak"), None)
        entries.append(Entry(t.id, t.number, TrialConfig.from_dict(t.config), t.status,
                             throughputs, predicted, t.metrics.get("peak_memory_bytes"),
                             t.error, _seconds(t.metrics.get("step_time_s")),
                             _seconds(t.metrics.get("predicted_step_time_s"))))
    order = {"complete": 0, "infeasible_measured": 1, "infeasible_predicted": 2, "failed": 3}
    entries.sort(key=lambda e: (order.get(e.status, 4), -e.throughput, e.number))
    return entries


def _seconds(value) -> float | None:
    """A stored time in seconds, or None when absent or not a finite number ≥ 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def step_time_mape(entries: list[Entry]) -> tuple[float, int] | None:
    """(mean absolute percentage error of the predicted step time, trials counted) over the
    complete entries that have both a prediction and a measurement; None when none has."""
    errors = [abs(e.step_time_error) for e in entries
              if e.status == "complete" and e.step_time_error is not None]
    return (sum(errors) / len(errors), len(errors)) if errors else None


def _done_future(fn, *args):
    """A future already resolved by calling ``fn`` here (one trial at a time: no thread, so
    Ctrl-C reaches the trial where it runs)."""
    from concurrent.futures import Future

    future: Future = Future()
    future.set_result(fn(*args))
    return future


def _optuna_storage(url: str):
    """Optuna's RDB storage on the same database (its tables have no autotune_ prefix)."""
    import optuna

    return optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 30}}
                                      if url.startswith("sqlite") else {})


def format_leaderboard(outcome: SearchOutcome, limit_bytes: int | None, top: int = 10) -> str:
    from autotune.layouts import short_name

    lines = [f"{'#':>3} {'trial':>5}  {'configuration':<44} {'tok/s':>10} {'spread':>7} "
             f"{'step ms':>9} {'pred ms':>9} {'error':>8} {'peak MiB':>9} {'pred MiB':>9}  "
             "status"]
    for i, e in enumerate(outcome.leaderboard[:top], 1):
        peak = f"{e.measured_peak / 2**20:.1f}" if e.measured_peak else "-"
        pred = f"{e.predicted_peak / 2**20:.1f}" if e.predicted_peak else "-"
        tput = f"{e.throughput:,.0f}" if e.status == "complete" else "-"
        spread = f"{e.spread:.1%}" if len(e.throughputs) > 1 else "-"
        step = f"{e.step_time_s * 1e3:.1f}" if e.step_time_s is not None else "-"
        pred_step = (f"{e.predicted_step_time_s * 1e3:.1f}"
                     if e.predicted_step_time_s is not None else "-")
        error = f"{e.step_time_error:+.1%}" if e.step_time_error is not None else "-"
        status = e.status if not e.error or e.status == "complete" else f"{e.status}: {e.error}"
        lines.append(f"{i:>3} {e.number:>5}  {short_name(e.config):<44} {tput:>10} "
                     f"{spread:>7} {step:>9} {pred_step:>9} {error:>8} {peak:>9} {pred:>9}  "
                     f"{status[:120]}")
    limit = f"{limit_bytes / 2**20:.1f} MiB" if limit_bytes else "none"
    lines.append(f"memory limit per device: {limit}; spread = (max − min) / median of the "
                 "re-measurements")
    if any(e.predicted_step_time_s is not None for e in outcome.leaderboard):
        mape = step_time_mape(outcome.leaderboard)
        lines.append("pred ms = the performance model's step time before the trial ran; error "
                     "= predicted / measured − 1" + (
                         f"; MAPE {mape[0]:.1%} over {mape[1]} complete trials" if mape else ""))
    return "\n".join(lines)
