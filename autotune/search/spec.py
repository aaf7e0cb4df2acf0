"""What one search is asked to do (``SearchSpec``), and the strategies it may be asked to use."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from autotune.config import WorkloadSpec, _positive
from autotune.errors import ConfigError

SAMPLERS = ("tpe", "gp", "random")
STRATEGIES = ("auto", "model", *SAMPLERS)
"""``--strategy``: the model-guided strategy (``strategies/model_guided.py``), one of Optuna's
samplers, or auto: model-guided on GPUs (best on bench/search_replay.py's A100 groups), TPE on
CPU ranks (bench/ranking_stability.py; see ``resolve_strategy``)."""
DEFAULT_STRATEGY = "auto"
DEFAULT_SAMPLER = "tpe"


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
    """How many of the best configurations are measured again before one is declared best
    (with the study's first trial, the baseline: ``search.loop.finalist_ids``)."""
    remeasure_repeats: int = 2
    """Interleaved re-measurement rounds over the top_k, at least (0: none)."""
    remeasure_max_repeats: int = 6
    """Rounds at most: beyond remeasure_repeats, rounds go on while the runner-up is tied with
    the fastest within noise."""
    num_warmup_steps: int = 2
    num_timed_steps: int = 5
    num_profiled_steps: int = 2
    device: str = "auto"
    precision: str | None = None
    """Training precision (``TrialConfig.precision``); None: bf16-mixed on GPUs, 32-true on
    CPUs (or the workload's old dtype)."""
    sampler: str = DEFAULT_STRATEGY
    """The search strategy: one of ``STRATEGIES`` (model, or an Optuna sampler: tpe, gp,
    random; auto picks model on GPUs and TPE on CPUs, as bench/search_replay.py and
    bench/ranking_stability.py measured)."""
    cluster: str | None = None
    """The cluster the trials run on, for the performance model: a built-in name or a
    JSON/TOML file (``autotune.model.cluster.load_cluster``); None: described from Ray and torch."""

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
        if self.sampler not in STRATEGIES:
            raise ConfigError(
                f"unknown strategy '{self.sampler}'; choose one of {', '.join(STRATEGIES)}"
            )
        if self.top_k < 1 or self.remeasure_repeats < 0 or self.remeasure_max_repeats < 0:
            raise ConfigError("top_k must be ≥ 1, remeasure_repeats and remeasure_max_repeats ≥ 0")
