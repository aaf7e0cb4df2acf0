"""A search over one study: its spec, and the thin front that sets the study up and runs the loop.

    SearchSpec → SearchSpace (the valid grid) → memory limit, cluster
      → Optuna study "autotune:NAME" in the same database as our tables (new; or resumed:
        trials an interrupted search left RUNNING are failed)
      → baseline enqueued (a new study) → ``search.loop.SearchLoop.run``

``Search`` is the front (as optuna's ``Study`` is to ``_optimize``): ``Search.open`` checks the
spec and the study's name, builds the space and the study, refuses a space where nothing is
predicted to fit; ``run`` begins the study's calibration, makes the strategy and hands the rest
to the loop (``autotune.search.loop``: propose, screen, run, conclude, re-measure). Trial
records are built by ``autotune.study.store``, the leaderboard by
``autotune.study.leaderboard``, the memory screen is ``autotune.search.screen``.

Optuna learns where the memory wall is through ``Trial.set_constraint`` (a trial is feasible
when its predicted or measured peak minus the limit is ≤ 0). Trials are numbered within the
study; ``resume`` continues a study without re-running a finished trial.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TextIO

from autotune.config import GIB, TrialConfig, WorkloadSpec
from autotune.errors import ConfigError
from autotune.layouts import DEFAULT_BUCKET_MB
from autotune.search import screen
from autotune.search.conclude import CONSTRAINT_ATTR
from autotune.search.local_gpus import local_gpus
from autotune.search.loop import SearchLoop, SearchOutcome
from autotune.search.schedule import TrialExecutor
from autotune.search.screen import MEMORY_MARGIN, predicted_to_fit
from autotune.search.space import SearchSpace
from autotune.search.spec import DEFAULT_SAMPLER, DEFAULT_STRATEGY, SAMPLERS, STRATEGIES, SearchSpec
from autotune.search.strategies.base import Strategy
from autotune.search.strategies.optuna_strategy import OptunaStrategy, make_sampler
from autotune.study.leaderboard import Entry, build_leaderboard, format_leaderboard, simplicity

if TYPE_CHECKING:
    from autotune.search.study_calibration import StudyCalibration

__all__ = [
    "CONSTRAINT_ATTR",
    "DEFAULT_SAMPLER",
    "DEFAULT_STRATEGY",
    "GIB",
    "MEMORY_MARGIN",
    "SAMPLERS",
    "STRATEGIES",
    "Entry",
    "resolve_strategy",
    "Search",
    "SearchOutcome",
    "SearchSpec",
    "base_config",
    "default_world_size",
    "device_type",
    "format_leaderboard",
    "make_sampler",
    "memory_limit_bytes",
    "plain_baseline",
    "predicted_to_fit",
]
"""This module's own names, and those of the loop, the leaderboard and the screen that a
caller of ``Search`` uses (each also importable from its own module)."""


def default_world_size() -> int:
    gpus = local_gpus()
    return gpus.count if gpus.available else 2


def memory_limit_bytes(spec: SearchSpec) -> int | None:
    if spec.memory_limit_gib is not None:
        return int(spec.memory_limit_gib * GIB)
    if spec.device != "cpu" and local_gpus().available:
        return local_gpus().total_memory
    return None


def device_type(spec: SearchSpec) -> str:
    """Where the trials will run, for the memory model's device-specific terms."""
    if spec.device != "auto":
        return spec.device
    return "cuda" if local_gpus().available else "cpu"


def base_config(spec: SearchSpec) -> TrialConfig:
    return TrialConfig(
        workload=spec.workload,
        world_size=spec.world_size,
        seed=spec.seed,
        num_warmup_steps=spec.num_warmup_steps,
        num_timed_steps=spec.num_timed_steps,
        num_profiled_steps=spec.num_profiled_steps,
        device=spec.device,
        precision=spec.precision,
    ).with_precision(device_type(spec))


def plain_baseline(space: SearchSpace, device_type: str, limit: int | None) -> TrialConfig | None:
    """The configuration an engineer (or DeepSpeed's autotuner) tries first: no tensor or
    pipeline parallelism, no recomputation, the lowest ZeRO stage and then the largest
    micro-batch predicted to fit; None when nothing is predicted to fit."""

    def fits(c: TrialConfig) -> bool:
        return predicted_to_fit(screen.predict_peak(c, device_type), limit, device_type)

    candidates = sorted(
        (c for c in space.configs if fits(c)),
        key=lambda c: (
            *simplicity(c),
            -c.micro_batch_size,
            not c.overlap_enabled,
            abs(c.bucket_mb - DEFAULT_BUCKET_MB),
        ),
    )
    return candidates[0] if candidates else None


@dataclass(eq=False)
class Search:
    """A search over one study, opened by ``Search.open``; ``run`` may be called on a new or an
    interrupted study. Building one does nothing else: ``open`` checks the spec, builds the
    space and opens the studies (ours and Optuna's)."""

    spec: SearchSpec
    db: Any
    executor: TrialExecutor | None
    """Runs the trials (``schedule.TrialExecutor``); None: set up, not to be run."""
    out: TextIO | None
    space: SearchSpace
    limit: int | None
    """Bytes per device (None: no limit)."""
    device_type: str
    cluster: Any
    """The ``--cluster`` given (a ``ClusterSpec``), else None: described when it runs."""
    study_record: Any
    strategy: str
    """The strategy ``--strategy`` resolved to (``resolve_strategy``): model, tpe, gp, random."""
    study: Any
    """The Optuna study "autotune:NAME" in the same database: the trials' books."""
    proposer: Strategy | None = None
    """A strategy that proposes instead of ``strategy`` (a benchmark's grid, say); None: the
    one ``strategy`` names."""
    study_calibration: StudyCalibration | None = None
    """The study's calibration, once ``run`` begins it."""

    @classmethod
    def open(
        cls,
        spec: SearchSpec,
        database,
        executor: TrialExecutor | None,
        *,
        resume: bool = False,
        out: TextIO | None = sys.stderr,
        baseline: TrialConfig | Literal["plain"] | None = "plain",
        include: Callable[[TrialConfig], bool] | None = None,
        strategy: Strategy | None = None,
    ) -> Search:
        """Check ``spec``, build the space, and create (or, with ``resume``, reopen) the study.

        ``executor`` runs the trials (a ``RayExecutor``, or a ``TrialPool`` whose ``slots`` > 1
        runs that many at once); None sets a search up without running it. ``baseline`` is the
        first trial of a new study, enqueued before the strategy proposes anything:
        ``"plain"`` (the default) is ``plain_baseline``'s layout, a ``TrialConfig`` of the
        space is that configuration, None enqueues nothing (the strategy starts alone).
        ``include`` keeps only the space's configurations it accepts (a replay over a measured
        table: ``ReplayTrialExecutor.contains``). ``strategy`` proposes instead of the one
        ``spec.sampler`` names (its Optuna study is then TPE's, as for the model-guided)."""
        from autotune.search.study_calibration import resolve_cluster

        spec.validate()
        space = SearchSpace(base_config(spec), fixed=spec.fixed, narrowed=spec.narrowed)
        if include is not None:  # e.g. the configurations a measured table holds
            space = space.only(include)
        limit, device = memory_limit_bytes(spec), device_type(spec)
        _check_something_fits(space, limit, device)
        baseline = None if resume else _resolve_baseline(baseline, space, device, limit)
        # A --cluster is checked now, before anything runs; a described one when the search
        # starts (on GPUs it is read from the running Ray cluster).
        cluster = resolve_cluster(spec.cluster, spec.world_size) if spec.cluster else None
        record = _open_study_record(spec, database, limit, resume)
        name, note = resolve_strategy(spec.sampler, device, spec.workload)
        if note:
            _say(out, f"autotune: note: {note}")
        study = _open_optuna_study(spec, database, name if name in SAMPLERS else "tpe")
        if baseline is not None:
            study.enqueue_trial(space.params_for(baseline), skip_if_exists=True)
        return cls(
            spec,
            database,
            executor,
            out,
            space,
            limit,
            device,
            cluster,
            record,
            name,
            study,
            proposer=strategy,
        )

    def _say(self, text: str) -> None:
        _say(self.out, text)

    def _begin_calibration(self) -> None:
        """The cluster the study runs on and its calibration, stored with the study."""
        from autotune.search.study_calibration import StudyCalibration, describe_cluster

        if self.study_calibration is not None:
            return
        self.study_calibration = StudyCalibration.begin(
            self.db,
            self.study_record.id,
            self.cluster,
            lambda: describe_cluster(self.spec.world_size, self.device_type),
            say=self._say,
        )
        c = self.study_calibration.cluster
        self._say(
            f"cluster '{c.name}': {c.num_nodes} × {c.devices_per_node} "
            f"{c.device.name} ({c.backend}); step times predicted, the calibration "
            "refitted after each complete trial"
        )

    def _make_strategy(self) -> Strategy:
        """The strategy that proposes: the one given, model-guided, or the study's sampler."""
        if self.proposer is not None:
            return self.proposer
        if self.strategy == "model":
            from autotune.search.strategies.model_guided import ModelGuided

            # The study refits after every trial already; the strategy reads that fit
            # rather than fitting the same trials again.
            study = self.study_calibration
            return ModelGuided(
                study.cluster, calibration=study.calibration, fitted=lambda: study.last_report
            )
        return OptunaStrategy(self.strategy, self.study, self.space)

    # ---- the loop ---------------------------------------------------------------------------
    def run(self) -> SearchOutcome:
        """Run the loop (``search.loop.SearchLoop``) until a budget is spent, then re-measure
        the best; the outcome's leaderboard ranks every trial of the study."""
        if self.executor is None:
            raise ConfigError(
                "this search was set up without an executor; pass one to Search.open(...) to run it"
            )
        start = time.monotonic()
        self._begin_calibration()
        loop = SearchLoop(
            spec=self.spec,
            space=self.space,
            study=self.study,
            database=self.db,
            study_id=self.study_record.id,
            executor=self.executor,
            limit=self.limit,
            device_type=self.device_type,
            calibration=self.study_calibration,
            say=self._say,
            strategy=self._make_strategy(),
        )
        return loop.run(start)

    def leaderboard(self) -> list[Entry]:
        """The study's trials as they stand, ranked."""
        return build_leaderboard(self.db.list_trials(self.study_record.id))


def _say(out: TextIO | None, text: str) -> None:
    if out is not None:
        print(text, file=out, flush=True)


def _resolve_baseline(
    baseline, space: SearchSpace, device: str, limit: int | None
) -> TrialConfig | None:
    """The first trial of a new study: ``plain_baseline``'s, the configuration given (one of
    the space's), or None."""
    if baseline == "plain":
        return plain_baseline(space, device, limit)
    if baseline is not None and not (
        isinstance(baseline, TrialConfig) and baseline in space.configs
    ):
        from autotune.layouts import short_name

        name = short_name(baseline) if isinstance(baseline, TrialConfig) else repr(baseline)
        raise ConfigError(
            f"the baseline {name} is not a configuration of this search's "
            "space; give one of its configurations, 'plain' or None"
        )
    return baseline


def _check_something_fits(space: SearchSpace, limit: int | None, device: str) -> None:
    if limit is None:
        return
    peaks = [screen.predict_peak(c, device) for c in space.configs]
    if None in peaks:
        return  # a user workload: only measurements can tell
    lowest = min(peaks)
    if not predicted_to_fit(lowest, limit, device):
        raise ConfigError(
            f"no configuration fits in {limit / GIB:.3g} GiB per device: the smallest "
            f"predicted peak is {lowest / GIB:.3g} GiB "
            f"({screen.allowance(device).describe()}); raise --memory-limit, add "
            "ranks, or allow more ZeRO/activation checkpointing"
        )


def _open_study_record(spec: SearchSpec, database, limit: int | None, resume: bool):
    """Our study: created (its name free), or reopened with ``resume`` (its name taken). It
    keeps the limit the search used (on a GPU, the device's memory by default)."""
    names = {s.name for s in database.list_studies()}
    if resume and spec.study_name not in names:
        raise ConfigError(
            f"no study named '{spec.study_name}' to resume in "
            f"{database.url_for_display}; existing: "
            f"{', '.join(sorted(names)) or 'none'} (drop --resume to start "
            "a new one)"
        )
    if spec.study_name in names and not resume:
        raise ConfigError(
            f"a study named '{spec.study_name}' already exists in "
            f"{database.url_for_display}; pass --resume to continue it or "
            "choose another --study"
        )
    if resume:
        return database.get_study(spec.study_name)
    resolved = dataclasses.replace(
        spec, memory_limit_gib=limit / GIB if limit is not None else None
    )
    return database.create_study(spec.study_name, resolved.to_dict())


def _open_optuna_study(spec: SearchSpec, database, sampler: str):
    """Optuna's study "autotune:NAME", its trials an interrupted search left RUNNING failed.
    Constraints reach TPE through Trial.set_constraint (Optuna 5): ≤ 0 is feasible. Under the
    model-guided strategy (which enqueues its choices) TPE stands behind it."""
    import optuna
    from optuna.trial import TrialState

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        study_name=f"autotune:{spec.study_name}",
        storage=_optuna_storage(database),
        direction="maximize",
        sampler=make_sampler(sampler, spec.seed),
        load_if_exists=True,
    )
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
    return study


def resolve_strategy(name: str, device_type: str, workload: WorkloadSpec) -> tuple[str, str]:
    """(the strategy to run, a note to print or ''): auto becomes model on GPUs and TPE on CPU
    ranks; model (auto on GPUs too) falls back to TPE for a workload the performance model
    cannot describe, and says so.

    Why TPE on CPU ranks, where bench/search_replay.py has model-guided reach the best in
    fewer trials on every CPU sweep: bench/ranking_stability.py with model-guided searches
    declared a best within 3% of the interleaved truth's best in 1 of 10 runs (TPE: 10 of 10).
    On 2 cores its finalists are bucket and overlap variants of one layout that the truth
    itself cannot order (docs/benchmarks.md)."""
    if name == "auto":
        name = "model" if device_type == "cuda" else "tpe"
    if name != "model":
        return name, ""
    if workload.shape is None:
        return "tpe", (
            f"--strategy model needs a model the performance model can describe; "
            f"user workload '{workload.name}' has no known shape, so the search "
            "uses TPE"
        )
    return "model", ""


def _optuna_storage(database):
    """Optuna's RDB storage on the ``db.Database``'s database (its tables have no autotune_
    prefix). Created under the database's setup lock: Optuna creates its tables
    check-then-create, which fails for one of two drivers starting together on a new
    PostgreSQL database."""
    import optuna

    url = database.connect_url
    kwargs = (
        {"connect_args": {"timeout": 30}} if url.startswith("sqlite") else {"pool_pre_ping": True}
    )
    with database.setup_lock():
        return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
