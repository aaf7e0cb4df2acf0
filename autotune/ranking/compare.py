"""A reference layout against a ranking (``autotune rank --compare``): parsed from
``key=value`` pairs, predicted the same way, placed among the layouts predicted to fit, and
the term in which the top pick gains most over it."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from autotune.config import TrialConfig
from autotune.errors import ConfigError
from autotune.model.cluster import ClusterSpec
from autotune.model.perf_model import EngineTraits, StepTimeEstimate, predict_step_time
from autotune.ranking.scored import Ranking, ScoredLayout
from autotune.shapes import ModelShape

LAYOUT_KEYS = {
    "tp": "tp_degree",
    "pp": "pp_degree",
    "cp": "cp_degree",
    "mb": "micro_batch_size",
    "zero": "zero_stage",
    "ac": "activation_checkpointing",
    "schedule": "pp_schedule",
    "v": "virtual_stages",
    "bucket": "bucket_mb",
    "overlap": "overlap_enabled",
    "sp": "sequence_parallel",
}
"""``--compare``'s keys and the TrialConfig fields they set."""
_ON, _OFF = ("1", "on", "true", "yes"), ("0", "off", "false", "no")


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
        if field_name in ("activation_checkpointing", "pp_schedule"):
            fields[field_name] = value
        elif field_name in ("overlap_enabled", "sequence_parallel"):
            if value.lower() not in _ON + _OFF:
                raise ConfigError(f"--compare: {key}={value}: give on or off")
            fields[field_name] = value.lower() in _ON
        else:
            number = float if field_name == "bucket_mb" else int
            try:
                fields[field_name] = number(value)
            except ValueError:
                kind = "a number" if number is float else "an integer"
                raise ConfigError(f"--compare: {key}={value}: give {kind}") from None
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
    engine: EngineTraits,
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
