"""Scoring: each layout's exact peak memory and, for those predicted to fit the limit with the
search's margin (``search.screen.predicted_to_fit``), its step time (``perf_model``), fastest
first. ``rank_screened`` is the whole path ``autotune rank`` runs: the memory screen
(``space.screen_layouts``), then the scoring of what it kept."""

from __future__ import annotations

from collections.abc import Callable

from autotune.config import TrialConfig
from autotune.errors import ConfigError
from autotune.model.cluster import ClusterSpec
from autotune.model.engine_memory import estimate_engine_memory
from autotune.model.engines import AUTOTUNE_MEMORY, EngineProfile
from autotune.model.memory import MemoryTraits, estimate_memory, peak_lower_bound
from autotune.model.perf_model import AUTOTUNE_ENGINE, Calibration, StepTimeModel
from autotune.progress import Progress
from autotune.ranking.collapse import collapse_equivalent
from autotune.ranking.scored import Ranking, ScoredLayout
from autotune.ranking.space import Screened, no_layout_message, screen_layouts
from autotune.search.screen import allowance, predicted_to_fit
from autotune.shapes import ModelShape


class ScoringProgress(Progress):
    """Scoring layouts: the shared progress line, ended by how many were predicted to fit."""

    def __init__(self, total: int) -> None:
        super().__init__(total, "scoring layouts")

    def close(self, fit: int) -> None:  # type: ignore[override]
        super().close(f"scored {self.total:,} layouts in {{elapsed}}; {fit:,} predicted to fit")


def rank_screened(
    base: TrialConfig,
    shape: ModelShape | None,
    cluster: ClusterSpec,
    choices: dict[str, tuple],
    *,
    limit_bytes: int,
    engine: EngineProfile = AUTOTUNE_ENGINE,
    memory_traits: MemoryTraits = AUTOTUNE_MEMORY,
    ac_layers: int | None = None,
    progress: Callable[[int], ScoringProgress | None] = ScoringProgress,
) -> tuple[Screened, Ranking]:
    """What ``autotune rank`` ranks: ``base``'s layouts with the newer knobs' ``choices``
    (``space.knob_choices``), screened by memory (``space.screen_layouts``), the rest scored
    (``rank_layouts``) on ``cluster`` with its stored calibration. ``progress(n)``: the
    progress line of n layouts (None for none). No layout at all (nothing splits the global
    batch) is a ``ConfigError`` saying which batches would."""
    device_type = cluster.device_type
    screened = screen_layouts(
        base,
        shape,
        choices,
        limit_bytes=limit_bytes,
        device_type=device_type,
        traits=memory_traits,
        ac_layers=ac_layers,
    )
    if not screened.layouts and screened.smallest is None:
        raise ConfigError(no_layout_message(base, shape))
    ranking = rank_layouts(
        screened.layouts,
        cluster,
        shape=shape,
        limit_bytes=limit_bytes,
        device_type=device_type,
        progress=progress(len(screened.layouts)),
        engine=engine,
        memory_traits=memory_traits,
        screened=True,
    )
    return screened, ranking


def rank_layouts(
    layouts: list[TrialConfig],
    cluster: ClusterSpec,
    *,
    shape: ModelShape | None = None,
    limit_bytes: int | None,
    device_type: str = "cuda",
    calibration: Calibration | None = None,
    progress: ScoringProgress | None = None,
    memory_traits: MemoryTraits = AUTOTUNE_MEMORY,
    engine: EngineProfile = AUTOTUNE_ENGINE,
    screened: bool = False,
) -> Ranking:
    """Predict every layout's peak memory; of those predicted to fit ``limit_bytes`` (with the
    search's margin), the step time; fastest first (ties: smaller peak first).

    ``layouts`` are valid (``space.enumerate_layouts``), so they are not validated again. A
    layout whose ``memory.peak_lower_bound`` already exceeds the limit is not estimated
    further (the bound is a few cached look-ups, the exact estimate three pipeline ranks'
    arithmetic); the smallest peak of those that do not fit is only needed, and only
    computed, when none fits. ``memory_traits``: judge memory as that engine stores it (an
    ``EngineProfile``'s ``memory``; autotune's runtime's by default); another engine's has
    every layout estimated (the bound is autotune's runtime's); ``engine``: judge time so.
    ``screened``: the layouts come from ``space.screened_layouts``, whose bounds (the least
    over their bucket and overlap) already fit, so they are not bounded again: the bound drops
    a few dozen of SC21's 250,297 and costs more than it saves."""
    calibration = calibration or Calibration.for_cluster(cluster)
    shape_of = shape or (layouts[0].workload.shape if layouts else None)
    # The largest peak predicted_to_fit accepts: a rank above it settles the layout.
    rule = allowance(device_type, memory_traits)
    stop = (
        None
        if limit_bytes is None
        else int(
            (limit_bytes - rule.outside_allocator) / ((1 + rule.model_margin) * rule.fragmentation)
        )
    )
    step_time = StepTimeModel(cluster, calibration, shape=shape, engine=engine)
    fitting = []
    for done, config in enumerate(layouts, 1):
        if not memory_traits.own_runtime:
            peak = estimate_engine_memory(
                config, shape_of, memory_traits, device_type=device_type, checked=True
            ).total
        elif screened or predicted_to_fit(
            peak_lower_bound(config, shape_of, device_type=device_type), limit_bytes, device_type
        ):
            peak = estimate_memory(
                config, shape_of, device_type=device_type, checked=True, stop_above=stop
            ).total
        else:
            peak = None
        if peak is not None and (limit_bytes is None or rule.required_bytes(peak) <= limit_bytes):
            time = step_time.predict(config)
            fitting.append(ScoredLayout(config, time, peak))
        if progress is not None:
            progress.update(done)
    if progress is not None:
        progress.close(len(fitting))
    fitting.sort(key=lambda s: (-s.time.tokens_per_s, s.peak_memory_bytes))
    return Ranking(
        scored=len(layouts),
        fitting=tuple(fitting),
        smallest_peak=_smallest_peak(layouts, shape_of, memory_traits, device_type)
        if not fitting and layouts
        else None,
        rows=tuple(collapse_equivalent(fitting)),
    )


def _smallest_peak(
    layouts: list[TrialConfig],
    shape: ModelShape | None,
    traits: MemoryTraits,
    device_type: str,
) -> tuple[TrialConfig, int]:
    """The layout with the smallest predicted peak, and that peak."""
    peaks = (
        (c, estimate_engine_memory(c, shape, traits, device_type=device_type, checked=True).total)
        for c in layouts
    )
    return min(peaks, key=lambda cp: cp[1])
