"""Baseline strategies: what the shipped ones are measured against (benchmarks only).

Each implements ``autotune.search.strategies.base.Strategy``, so the search's own loop runs it
(``testkit.replay_table``'s ``replay``), and is deterministic given its seed and
the history: the same candidates and measured outcomes give the same proposal, so a replay is
reproducible and a resumed search proposes what the interrupted one would have.

- :class:`GridStrategy`: every candidate in a fixed order (DeepSpeed's grid tuner's).
- :class:`RandomStrategy`: every candidate in a seeded random order.
- :class:`DeepSpeedHeuristic`: the DeepSpeed autotuner's ZeRO-stage / micro-batch heuristic.
- :class:`TPInsideNodeRule`: the engineers' rule "TP inside the node, ZeRO-1/DP across nodes".
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from autotune.config import AC_ORDER, PP_SCHEDULES, TrialConfig
from autotune.layouts import DEFAULT_BUCKET_MB
from autotune.search.strategies.base import Measured, Proposal, SearchState, Strategy
from autotune.shapes import ModelShape
from autotune.status import RowStatus

SCHEDULE_ORDER = {schedule: i for i, schedule in enumerate(PP_SCHEDULES)}


class OrderStrategy(Strategy):
    """A strategy that chooses among all of the space's configurations and its history
    (``choose``), as the loop asks it (``propose``)."""

    def propose(self, state: SearchState) -> Proposal | None:
        return self.choose(state.configs, state.history, state.shape)

    def choose(
        self,
        candidates: Sequence[TrialConfig],
        history: Sequence[Measured],
        shape: ModelShape | None = None,
    ) -> Proposal | None:
        raise NotImplementedError


def _first_untried(
    order: Sequence[TrialConfig], history: Sequence[Measured], reason: str
) -> Proposal | None:
    done = {m.config for m in history}
    for i, config in enumerate(order):
        if config not in done:
            return Proposal(config, reason=f"{reason} ({i + 1} of {len(order)})")
    return None


def _other_knobs(c: TrialConfig) -> tuple:
    """The knobs after the ones a strategy orders by: recomputation from none, schedules in
    their listed order, overlap on first, the default bucket size first."""
    return (
        AC_ORDER[c.activation_checkpointing],
        SCHEDULE_ORDER[c.pp_schedule],
        not c.overlap_enabled,
        abs(c.bucket_mb - DEFAULT_BUCKET_MB),
        c.bucket_mb,
        c.attention,
        c.optimizer_offload_enabled,
    )


# ---- grid ------------------------------------------------------------------------------
def grid_key(c: TrialConfig) -> tuple:
    """ZeRO stage ascending, then tp, pp and micro-batch ascending, then the other knobs."""
    return (c.zero_stage, c.tp_degree, c.pp_degree, c.micro_batch_size, *_other_knobs(c))


class GridStrategy(OrderStrategy):
    """Every candidate in DeepSpeed's order: the DeepSpeed autotuner explores ZeRO stages from
    low to high (``[0, 1, 2, 3]``, deepspeed/autotuning/README.md, "Autotuning Workflow") and,
    within a stage, micro-batch sizes; its grid tuner runs a stage's experiments in the order
    it generated them. Here over all candidates: ZeRO stage ascending, then tp ascending, pp
    ascending, micro-batch ascending, then recomputation (none, selective, full), schedule
    (gpipe, 1f1b, interleaved), overlap on before off, the default bucket size first (ties keep
    the candidates' order). Stops when every candidate has been tried."""

    name = "grid"

    def choose(
        self,
        candidates: Sequence[TrialConfig],
        history: Sequence[Measured],
        shape: ModelShape | None = None,
    ) -> Proposal | None:
        return _first_untried(sorted(candidates, key=grid_key), history, "grid order")


# ---- random ----------------------------------------------------------------------------
class RandomStrategy(OrderStrategy):
    """Every candidate in a random order drawn from ``seed`` (``random.Random(seed)``'s shuffle
    of the candidates as given). Stops when every candidate has been tried."""

    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def choose(
        self,
        candidates: Sequence[TrialConfig],
        history: Sequence[Measured],
        shape: ModelShape | None = None,
    ) -> Proposal | None:
        order = list(candidates)
        random.Random(self.seed).shuffle(order)
        return _first_untried(order, history, f"random order, seed {self.seed}")


# ---- DeepSpeed's autotuner --------------------------------------------------------------
METRIC_PERCENT_DIFF = 0.05
"""A smaller micro-batch is kept only if its throughput beats the stage's best by more than 5%
(``METRIC_PERCENT_DIFF_CONST`` of deepspeed/autotuning/constants.py)."""
UNTUNED_KNOBS = (
    "activation_checkpointing",
    "overlap_enabled",
    "bucket_mb",
    "attention",
    "optimizer_offload_enabled",
    "pp_schedule",
)


def _plain_key(c: TrialConfig) -> tuple:
    return (*_other_knobs(c), c.zero_stage, c.micro_batch_size)


class DeepSpeedHeuristic(OrderStrategy):
    """The DeepSpeed autotuner's heuristic in its default ``fast`` mode, which tunes only the
    ZeRO stage and the micro-batch size per GPU (deepspeed/autotuning/README.md and
    ``Autotuner.tune``/``tune_space``/``run_tuning_micro_batch_sizes`` of autotuner.py):

    - It cannot express tensor or pipeline parallelism, so it proposes only tp = 1, pp = 1
      candidates; when none remain it stops. The knobs it does not tune (recomputation,
      overlap, bucket size, …) stay at the user's setting, taken here as the plainest value
      the candidates offer: no recomputation, overlap on, the default bucket size.
    - ZeRO stages from the lowest (DeepSpeed's order ``[0, 1, 2, 3]``). In each stage it
      first finds the largest micro-batch that fits: it tries micro-batches from the largest
      down until one runs (DeepSpeed estimates the largest from memory and then probes; the
      candidates here are already screened for memory). A stage whose largest fitting
      micro-batch is smaller than an earlier stage's is not tuned further ("no need to tune
      ZeRO stage").
    - Then smaller micro-batches, one at a time from the largest down, each kept while its
      throughput beats the stage's best by more than ``METRIC_PERCENT_DIFF``; the stage ends
      at the first that does not (or fails). With a fixed global batch, gradient accumulation
      follows the micro-batch, where DeepSpeed would grow the global batch instead.

    It stops when every stage is done, which can be before the best candidate is tried."""

    name = "deepspeed"

    def choose(
        self,
        candidates: Sequence[TrialConfig],
        history: Sequence[Measured],
        shape: ModelShape | None = None,
    ) -> Proposal | None:
        plain = [c for c in candidates if c.tp_degree == 1 and c.pp_degree == 1]
        if not plain:
            return None
        user = min(plain, key=_plain_key)
        space = [c for c in plain if all(getattr(c, k) == getattr(user, k) for k in UNTUNED_KNOBS)]
        outcome = {m.config: m for m in history}
        largest_so_far = 0
        for stage in sorted({c.zero_stage for c in space}):
            by_micro = {}
            for c in space:
                if c.zero_stage == stage:
                    by_micro.setdefault(c.micro_batch_size, c)
            micro = sorted(by_micro, reverse=True)
            largest, best = None, None
            for mb in micro:  # the largest micro-batch that runs
                m = outcome.get(by_micro[mb])
                if m is None:
                    return Proposal(
                        by_micro[mb], reason=f"ZeRO-{stage}: largest micro-batch that fits"
                    )
                if m.status == RowStatus.COMPLETE and m.step_time_s is not None:
                    largest, best = mb, m.step_time_s
                    break
            if largest is None or largest < largest_so_far:
                continue
            largest_so_far = largest
            for mb in (x for x in micro if x < largest):  # smaller, while throughput improves
                m = outcome.get(by_micro[mb])
                if m is None:
                    return Proposal(by_micro[mb], reason=f"ZeRO-{stage}: smaller micro-batch")
                if not (
                    m.status == RowStatus.COMPLETE
                    and m.step_time_s is not None
                    and m.step_time_s * (1 + METRIC_PERCENT_DIFF) < best
                ):
                    break
                best = m.step_time_s
        return None


# ---- TP inside the node ---------------------------------------------------------------
ZERO_PREFERENCE = {1: 0, 0: 1, 2: 2, 3: 3}
"""ZeRO-1 first (it shards the optimizer state at the same traffic as plain DP), then DP, then
the stages that add traffic."""


class TPInsideNodeRule(OrderStrategy):
    """The engineers' rule "tensor parallelism inside the node, ZeRO-1/data parallelism
    across nodes" (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on
    GPU Clusters", takeaway #1: tensor parallelism up to the GPUs per server, since its
    all-reduces need the fast intra-node links), as an order over the candidates:

    1. tp: the largest tp that fits inside a node (≤ ``devices_per_node``) first, then smaller
       ones; tp spanning nodes last (ascending);
    2. pp = 1 first, then ascending;
    3. ZeRO-1 first, then 0, 2, 3;
    4. the largest micro-batch first (the fewest accumulation steps);
    5. then no recomputation first, overlap on, the default bucket size.

    It proposes in that order and stops when every candidate has been tried."""

    name = "tp-in-node"

    def __init__(self, devices_per_node: int) -> None:
        self.devices_per_node = devices_per_node

    def key(self, c: TrialConfig) -> tuple:
        inside = c.tp_degree <= self.devices_per_node
        return (
            (0, -c.tp_degree) if inside else (1, c.tp_degree),
            c.pp_degree,
            ZERO_PREFERENCE[c.zero_stage],
            -c.micro_batch_size,
            *_other_knobs(c),
        )

    def choose(
        self,
        candidates: Sequence[TrialConfig],
        history: Sequence[Measured],
        shape: ModelShape | None = None,
    ) -> Proposal | None:
        return _first_untried(
            sorted(candidates, key=self.key),
            history,
            f"TP inside the node ({self.devices_per_node} devices)",
        )
