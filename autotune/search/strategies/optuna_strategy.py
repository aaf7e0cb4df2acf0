"""Optuna's samplers as a ``Strategy``: the study's sampler proposes through
``SearchSpace.suggest``, define-by-run, so it only ever sees valid combinations, and reads the
memory constraint that the loop sets on each concluded trial (``Trial.set_constraint``).

The study is Optuna's; its trials are the search's books whichever strategy proposes (the
loop opens a trial for every configuration it runs). Here the trial is asked first and the
sampler fills it, so the ``Proposal`` carries the trial.
"""

from __future__ import annotations

from autotune.errors import ConfigError
from autotune.search.space import SearchSpace
from autotune.search.spec import SAMPLERS
from autotune.search.strategies.base import Proposal, SearchState, Strategy


def make_sampler(name: str, seed: int):
    """A seeded Optuna sampler. Each reads the memory constraint that ``Trial.set_constraint``
    stores (Optuna 5): TPE and GP steer away from configurations over the limit."""
    import optuna

    if name == "tpe":  # multivariate: the knobs interact (tp × pp × micro-batch)
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=5, multivariate=True)
    if name == "gp":
        # The space is define-by-run (pp_schedule only when pp > 1): GP models the knobs
        # every trial has and samples the conditional ones at random, which is intended here.
        return optuna.samplers.GPSampler(
            seed=seed, n_startup_trials=5, warn_independent_sampling=False
        )
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise ConfigError(f"unknown sampler '{name}'; choose one of {', '.join(SAMPLERS)}")


class OptunaStrategy(Strategy):
    """The study's own sampler (``make_sampler``: tpe, gp, random) proposes each trial."""

    def __init__(self, name: str, study, space: SearchSpace) -> None:
        self.name, self.study, self.space = name, study, space

    def propose(self, state: SearchState) -> Proposal:
        """Asks the study for a trial and suggests its knobs; never done (the loop's budgets
        stop it). The configuration may be one tried before: the loop answers that one."""
        trial = self.study.ask()
        return Proposal(self.space.suggest(trial), trial=trial)
