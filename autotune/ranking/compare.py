"""A reference layout against a ranking (``autotune rank --compare``): parsed from
``key=value`` pairs, predicted the same way, placed among the layouts predicted to fit, and
the term in which the top pick gains most over it."""

from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass

from autotune.config import TrialConfig
from autotune.errors import ConfigError
from autotune.knobs import COMPARE_KEYS
from autotune.model.cluster import ClusterSpec
from autotune.model.engines import EngineProfile
from autotune.model.perf_model import StepTimeEstimate, predict_step_time
from autotune.ranking.scored import Ranking, ScoredLayout
from autotune.shapes import ModelShape

LAYOUT_KEYS = COMPARE_KEYS
"""``--compare``'s keys and the TrialConfig fields they set (``knobs.Knob.compare_key``)."""
_ON, _OFF = ("1", "on", "true", "yes"), ("0", "off", "false", "no")


def _value_type(hint) -> type:
    """bool, int, float, or str: a Literal's by its values (ZeRO's are ints)."""
    if typing.get_origin(hint) is typing.Literal:
        return type(typing.get_args(hint)[0])
    return hint if hint in (bool, int, float) else str


_FIELD_TYPES = {n: _value_type(h) for n, h in typing.get_type_hints(TrialConfig).items()}
"""Each field's value type as ``--compare`` parses it."""


def parse_layout(text: str, base: TrialConfig) -> TrialConfig:
    """``base`` with the ``key=value`` pairs of ``--compare`` (``LAYOUT_KEYS``), separated by
    commas or spaces, applied; a pair that does not parse is a ``ConfigError`` naming it."""
    fields: dict = {}
    for item in re.split(r"[,\s]+", text.strip()):
        key, _, value = item.partition("=")
        if key not in LAYOUT_KEYS or not value:
            raise ConfigError(
                f"--compare: '{item}' is not KEY=VALUE with KEY one of {', '.join(LAYOUT_KEYS)}"
            )
        field_name = LAYOUT_KEYS[key]
        kind = _FIELD_TYPES[field_name]
        if kind is bool:
            if value.lower() not in _ON + _OFF:
                raise ConfigError(f"--compare: {key}={value}: give on or off")
            fields[field_name] = value.lower() in _ON
        elif kind in (int, float):
            try:
                fields[field_name] = kind(value)
            except ValueError:
                words = "a number" if kind is float else "an integer"
                raise ConfigError(f"--compare: {key}={value}: give {words}") from None
        else:  # a Literal of names (checkpointing, schedule): validate() checks the name
            fields[field_name] = value
    config = dataclasses.replace(base, **fields)
    config.validate()
    return config


@dataclass(frozen=True, slots=True)
class Comparison:
    """Where a reference layout stands against the ranking."""

    reference: TrialConfig
    time: StepTimeEstimate
    position: int
    """Layouts predicted faster than it, plus one."""
    percentile: float
    """Its position as a share of the layouts predicted to fit (0: the top)."""
    top: ScoredLayout
    term: str
    """The term in which the top pick gains most over the reference."""
    gain_s: float


def compare_to_top(
    ranking: Ranking,
    reference: TrialConfig,
    cluster: ClusterSpec,
    shape: ModelShape | None,
    engine: EngineProfile,
) -> Comparison:
    """The reference layout's predicted step, its place among ``ranking.fitting`` and the term
    (``perf_model.TERMS``) that most separates it from the top pick."""
    time = predict_step_time(reference, cluster, shape=shape, engine=engine)
    faster = sum(1 for s in ranking.fitting if s.time.step_time_s < time.step_time_s)
    top = ranking.fitting[0]
    gains = {k: time.breakdown[k] - top.time.breakdown[k] for k in time.breakdown}
    term = max(gains, key=gains.get)
    return Comparison(
        reference, time, faster + 1, faster / max(len(ranking.fitting), 1), top, term, gains[term]
    )
