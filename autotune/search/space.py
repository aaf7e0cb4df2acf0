"""The search space: every valid configuration of a workload on a world size, proposed
define-by-run so that Optuna only ever sees valid combinations.

The valid grid is enumerated once (``layouts.enumerate_configs`` plus bucket size and overlap);
each knob is then suggested from the values that some still-reachable valid configuration takes,
in a fixed order (tp → pp → schedule → ZeRO → overlap → micro-batch → checkpointing → bucket).
A knob whose reachable values differ from its full set is suggested under a name that carries the
value set (``micro_batch_size|1,2``), because Optuna requires one distribution per name.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from autotune.config import (
    CHECKPOINTING_MODES,
    OVERLAP_CHOICES,
    PP_SCHEDULES,
    ZERO_STAGES,
    TrialConfig,
)
from autotune.errors import ConfigError
from autotune.layouts import KNOB_ORDER, SEARCHED_BY_DEFAULT, enumerate_configs

DEFAULT_BUCKETS_MB = (5.0, 25.0, 100.0)
FIXABLE = {f.name for f in dataclasses.fields(TrialConfig)} - {"workload", "world_size"}


def parse_fix(items: Iterable[str]) -> dict[str, Any]:
    """'zero_stage=3' → {'zero_stage': 3}; values parse as JSON, else as strings."""
    fixed: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--fix '{item}' must be KNOB=VALUE, e.g. --fix zero_stage=3")
        if key not in FIXABLE:
            raise ConfigError(f"--fix: unknown knob '{key}'; knobs: {', '.join(sorted(FIXABLE))}")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        fixed[key] = value
    return fixed


def load_space_file(path: str | Path) -> dict[str, list]:
    """A JSON object {knob: [values…]} narrowing the searched values of some knobs."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise ConfigError(f"cannot read space file '{path}': {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"space file '{path}' is not valid JSON: {e.msg}") from None
    if not isinstance(data, dict) or not all(isinstance(v, list) and v for v in data.values()):
        raise ConfigError(
            f"space file '{path}' must be an object of non-empty lists, e.g. "
            '{"zero_stage": [2, 3]}'
        )
    unknown = sorted(set(data) - set(KNOB_ORDER))
    if unknown:
        raise ConfigError(
            f"space file '{path}': unknown knob(s) {', '.join(unknown)}; "
            f"knobs: {', '.join(KNOB_ORDER)}"
        )
    return data


class SearchSpace:
    """The valid configurations of ``base`` under the fixed and narrowed knobs."""

    def __init__(
        self,
        base: TrialConfig,
        *,
        fixed: dict[str, Any] | None = None,
        narrowed: dict[str, list] | None = None,
        buckets_mb: tuple[float, ...] = DEFAULT_BUCKETS_MB,
    ) -> None:
        fixed = dict(fixed or {})
        narrowed = {k: list(v) for k, v in (narrowed or {}).items()}
        for key, value in fixed.items():
            if key not in FIXABLE:
                raise ConfigError(f"unknown knob '{key}'; knobs: {', '.join(sorted(FIXABLE))}")
            narrowed[key] = [value]
        base_fixed = {k: v for k, v in fixed.items() if k not in KNOB_ORDER}
        try:
            base = TrialConfig.from_dict({**base.to_dict(), **base_fixed})
        except ConfigError as e:
            raise ConfigError(f"--fix: {e}") from None
        self.base = base
        _check_values(base, narrowed)
        choice = {k: tuple(narrowed[k]) for k in KNOB_ORDER if k in narrowed}
        grid = enumerate_configs(
            base,
            zero_stages=choice.get("zero_stage", ZERO_STAGES),
            activation_checkpointing=choice.get("activation_checkpointing", CHECKPOINTING_MODES),
            pp_schedules=choice.get("pp_schedule", PP_SCHEDULES),
            overlap=choice.get("overlap_enabled", OVERLAP_CHOICES),
            tp_degrees=choice.get("tp_degree"),
            pp_degrees=choice.get("pp_degree"),
            dedupe_zero_at_dp1=True,
            extra={k: choice[k] for k in SEARCHED_BY_DEFAULT if k in choice},
        )
        buckets = tuple(float(b) for b in choice.get("bucket_mb", buckets_mb))
        configs = []
        for c in grid:
            if (
                "micro_batch_size" in choice
                and c.micro_batch_size not in choice["micro_batch_size"]
            ):
                continue
            if c.dp_degree == 1 and not c.overlap_enabled:
                continue  # nothing to overlap without data parallelism
            for b in buckets if c.dp_degree > 1 else buckets[:1]:
                configs.append(dataclasses.replace(c, bucket_mb=b))
        if not configs:
            raise ConfigError(
                f"the search space holds no valid configuration for {base.workload.name} on "
                f"{base.world_size} ranks under the fixed/narrowed knobs; loosen --fix or the "
                "space file (see `autotune trial` for the rule a single config breaks)"
            )
        self.configs = configs

    def __len__(self) -> int:
        return len(self.configs)

    @classmethod
    def of(cls, configs: Iterable[TrialConfig]) -> SearchSpace:
        """A space of exactly ``configs`` (a replayed table's layouts), proposed as any is."""
        space = cls.__new__(cls)
        space.configs = list(configs)
        space.base = space.configs[0]
        return space

    def only(self, include: Callable[[TrialConfig], bool]) -> SearchSpace:
        """This space with only the configurations ``include`` accepts (a replay's table)."""
        kept = copy.copy(self)
        kept.configs = [c for c in self.configs if include(c)]
        if not kept.configs:
            raise ConfigError(
                "no configuration of the search space is among those "
                "included (a replay table must hold this workload's layouts)"
            )
        return kept

    def _walk(self, choose) -> TrialConfig:
        """Fix each knob in KNOB_ORDER to ``choose(name, knob, values)`` among the values some
        still-reachable valid configuration takes; a knob with one such value is not asked."""
        rows = self.configs
        for knob in KNOB_ORDER:
            values = sorted({getattr(c, knob) for c in rows}, key=_sort_key)
            if len(values) == 1:
                value = values[0]
            else:
                full = sorted({getattr(c, knob) for c in self.configs}, key=_sort_key)
                name = knob if values == full else f"{knob}|{','.join(map(str, values))}"
                value = choose(name, knob, values)
            rows = [c for c in rows if getattr(c, knob) == value]
        return rows[0]

    def suggest(self, trial) -> TrialConfig:
        """Define-by-run: choose each knob among values some valid configuration still takes."""
        return self._walk(lambda name, knob, values: trial.suggest_categorical(name, values))

    def params_for(self, config: TrialConfig) -> dict[str, Any]:
        """The Optuna parameters under which ``suggest`` proposes ``config`` (for enqueueing)."""
        params: dict[str, Any] = {}
        self._walk(lambda name, knob, values: params.setdefault(name, getattr(config, knob)))
        return params


def _check_values(base: TrialConfig, narrowed: dict[str, list]) -> None:
    """Every fixed or narrowed value must be one the knob takes (type and allowed values, as a
    config file is checked): a value no configuration can have is an error, not dropped."""
    for knob, values in narrowed.items():
        for value in values:
            try:
                TrialConfig.from_dict({**base.to_dict(), knob: value})
            except ConfigError as e:
                raise ConfigError(f"search space: {e}") from None


def _sort_key(v: Any) -> tuple:
    return (str(type(v)), v)
