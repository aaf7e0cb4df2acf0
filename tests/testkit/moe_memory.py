"""The memory model's predicted peak of the built-in mixture of experts (``moe-tiny``) against its
CPU trials, as rows: read by ``bench/moe_memory.py`` (printed) and
``tests/model/test_moe_memory.py`` (asserted).

:data:`LAYOUTS`: expert parallelism 1, 2 and 4 with DDP, FSDP (ZeRO-2 and ZeRO-3), TP, and PP at
ep 1, under each checkpointing mode the runtime runs (none, selective, full), on 2 and 4 gloo
ranks (sequence 128, global batch 8). One row per layout and pipeline stage: the stage's
predicted peak (``memory.estimate_all_stages``) against the largest peak its ranks measured
(the CPU profiler's allocation events, as ``testkit.hf_memory`` measures; the lowest of
``readings``). Each row also carries the routing the trial measured: the worst rank's received
(token, slot) pairs over the even share, from the tokens per expert every rank stores
(``RankResult.extra["tokens_per_expert"]``), summed over each ep group and the MoE layers at
the measured step (:func:`routing_share`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from autotune.config import TrialConfig, WorkloadSpec
from autotune.model import memory, moe_memory
from testkit.hf_memory import MEDIAN_GOAL, WORST_UNDER_GOAL, Row, summary  # noqa: F401

SEQ, GLOBAL_BATCH = 128, 8
LAYOUTS: dict[str, tuple[int, dict]] = {
    "ep1-dp2": (2, dict()),
    "ep1-tp2": (2, dict(tp_degree=2)),
    "ep1-pp2": (2, dict(pp_degree=2)),
    "ep1-pp2-full": (2, dict(pp_degree=2, activation_checkpointing="full")),
    "ep2-dp2": (2, dict(ep_degree=2)),
    "ep2-z3-sel": (2, dict(ep_degree=2, zero_stage=3, activation_checkpointing="selective")),
    "ep2-z2-full": (2, dict(ep_degree=2, zero_stage=2, activation_checkpointing="full")),
    "ep2-tp2": (2, dict(ep_degree=2, tp_degree=2)),
    "ep1-w4-pp2-z2-sel": (
        4,
        dict(pp_degree=2, zero_stage=2, activation_checkpointing="selective"),
    ),
    "ep2-w4-tp2-full": (4, dict(ep_degree=2, tp_degree=2, activation_checkpointing="full")),
    "ep2-w4-z2": (4, dict(ep_degree=2, zero_stage=2)),
    "ep4-w4-sel": (4, dict(ep_degree=4, activation_checkpointing="selective")),
    "ep4-w4-z3": (4, dict(ep_degree=4, zero_stage=3)),
    "ep4-w4-tp2-z3-full": (
        4,
        dict(ep_degree=4, tp_degree=2, zero_stage=3, activation_checkpointing="full"),
    ),
}
"""Name: (world size, the layout's knobs); micro-batch 2 unless given."""


@dataclass(frozen=True)
class Measured:
    """One trial's measurement: per pipeline stage the largest peak of its ranks and their
    largest (parameters, gradients, optimizer state) bytes, and the worst rank's received pairs
    over the even share (1.0 at ep 1)."""

    name: str
    config: TrialConfig
    stage_peaks: tuple[int, ...]
    routing: float
    stage_states: tuple[tuple[int, int, int], ...] = ()


def moe_config(world: int, **kw) -> TrialConfig:
    kw.setdefault("micro_batch_size", 2)
    return TrialConfig(
        workload=WorkloadSpec(
            family="moe", size="tiny", seq_len=SEQ, global_batch_size=GLOBAL_BATCH
        ),
        world_size=world,
        device="cpu",
        precision="32-true",
        num_warmup_steps=1,
        num_timed_steps=1,
        num_profiled_steps=0,
        **kw,
    )


def _measure(rank: int, configs: list[TrialConfig], readings: int) -> list[tuple]:
    """Each trial's (pp rank, lowest peak of ``readings``, the measured step's tokens per
    expert per MoE layer, the model states' bytes) on this rank."""
    from autotune.trial.runner import run_rank

    out = []
    for config in configs:
        results = [run_rank(config) for _ in range(readings)]
        tokens = results[-1].extra["tokens_per_expert"][-1]
        m = results[-1].memory
        states = (m.parameters, m.gradients, m.optimizer_state)
        out.append((results[0].pp_rank, min(r.memory.peak for r in results), tokens, states))
    return out


def routing_share(config: TrialConfig, tokens: list) -> float:
    """The worst rank's received (token, slot) pairs, summed over its MoE layers (their saved
    tensors are held together), over the even share of its ep group; ``tokens``: per rank, per
    MoE layer, the pairs it routed to each expert."""
    ep = config.ep_degree
    if ep == 1:
        return 1.0
    worst = 1.0
    for start in range(0, len(tokens), ep):  # ep groups are consecutive ranks (pp 1 under ep)
        group = tokens[start : start + ep]
        local = len(group[0][0]) // ep
        received = [
            sum(sum(layer[j * local : (j + 1) * local]) for sent in group for layer in sent)
            for j in range(ep)
        ]
        worst = max(worst, max(received) * ep / sum(received))
    return worst


def measure(names=tuple(LAYOUTS), readings: int = 2) -> list[Measured]:
    """The layouts ``names`` on CPU trials, one rank launch per world size."""
    from spawn import run_ranks

    rows: list[Measured] = []
    for world in sorted({LAYOUTS[n][0] for n in names}):
        plan = {n: moe_config(world, **LAYOUTS[n][1]) for n in names if LAYOUTS[n][0] == world}
        results = run_ranks(world, _measure, list(plan.values()), readings, timeout=900)
        for i, (name, config) in enumerate(plan.items()):
            stages, held = [0] * config.pp_degree, [(0, 0, 0)] * config.pp_degree
            for per_rank in results:
                pp_rank, peak, _, states = per_rank[i]
                stages[pp_rank] = max(stages[pp_rank], peak)
                held[pp_rank] = tuple(map(max, held[pp_rank], states))
            share = routing_share(config, [per_rank[i][2] for per_rank in results])
            rows.append(Measured(name, config, tuple(stages), share, tuple(held)))
    return rows


@contextlib.contextmanager
def routed_allowance(allowance: float):
    """The memory model with the worst rank's routing share ``allowance`` instead of
    ``moe_memory.ROUTED_ALLOWANCE`` (its memos cleared on entry and exit)."""
    saved = moe_memory.ROUTED_ALLOWANCE
    moe_memory.ROUTED_ALLOWANCE = allowance
    memory.clear_memos()
    try:
        yield
    finally:
        moe_memory.ROUTED_ALLOWANCE = saved
        memory.clear_memos()


def predicted_rows(measured: list[Measured], *, measured_routing: bool = False) -> list[Row]:
    """The model's peak per stage beside each measured one; ``measured_routing``: with each
    trial's own routing share (at least 1) rather than the stated allowance."""
    rows = []
    for m in measured:
        allowance = max(1.0, m.routing) if measured_routing else moe_memory.ROUTED_ALLOWANCE
        with routed_allowance(allowance):
            estimates = memory.estimate_all_stages(m.config, device_type="cpu")
        for est, peak in zip(estimates, m.stage_peaks, strict=True):
            layout = m.name if m.config.pp_degree == 1 else f"{m.name}/s{est.stage}"
            rows.append(Row("moe-tiny", layout, est.total, peak))
    return rows


def state_misses(measured: list[Measured]) -> list[tuple[str, int, tuple, tuple]]:
    """The (layout, stage, predicted, measured) model states that differ: (parameters,
    gradients, optimizer state) bytes of each stage's worst rank, which the model predicts
    exactly."""
    misses = []
    for m in measured:
        for est, held in zip(
            memory.estimate_all_stages(m.config, device_type="cpu"), m.stage_states
        ):
            predicted = (est.parameters, est.gradients, est.optimizer_state)
            if predicted != held:
                misses.append((m.name, est.stage, predicted, held))
    return misses


def false_fits(rows: list[Row]) -> list[Row]:
    """The rows predicted to fit a limit their measured peak exceeds: the search's screen
    (``screen.predicted_to_fit``: the prediction × (1 + margin) within the limit) admits a row
    at any limit from ``screen.required_bytes(predicted)`` up, so a measurement above that
    tightest limit is a false fit there."""
    from autotune.search.screen import required_bytes

    return [r for r in rows if r.measured > required_bytes(r.predicted, "cpu")]
