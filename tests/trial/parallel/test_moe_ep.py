"""Expert parallelism trains the tiny mixture of experts as one process does.

Dropless routing, ``moe-tiny`` (8 experts, top-2, one shared expert, the first layer dense):
EP 2 on 2 gloo ranks under DDP, EP 2 × tp 2 on 4 ranks (the ep groups are the tp pairs, the
experts' data group the dp pair), EP 2 × FSDP (ZeRO-3 and ZeRO-2, world 2 and 4; HSDP 2 × 2)
train every step to the single-process losses within ``test_layouts.LOSS_ATOL``; the reference
steps the balancing bias before each optimizer step as the runner does. Under FSDP at world 4
each rank holds 1/efsdp of its E/ep experts (torchtitan's sharding over efsdp, 2; under HSDP
over the expert-data group, 2) and the experts' synced first-step gradients are the single
process's (AdamW would hide a wrong scale from the losses). The tokens per expert each rank
stores per step (``RankResult.extra["tokens_per_expert"]``) add up to the one process's. The
negative control combines each token's output from another row (a permuted combine) and misses
the reference by far more.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from spawn import run_ranks
from test_layouts import LOSS_ATOL

from autotune.config import TrialConfig, WorkloadSpec
from autotune.trial.models.build import build_workload
from autotune.trial.models.moe import moe_layers, update_expert_bias
from autotune.trial.parallel.distributed_optimizer import local_tensor
from autotune.trial.parallel.zero import LEARNING_RATE

NUM_STEPS = 3  # 2 timed + the memory step
BASE = TrialConfig(
    workload=WorkloadSpec(family="moe", size="tiny", seq_len=16, global_batch_size=4),
    world_size=2,
    ep_degree=2,
    num_warmup_steps=0,
    num_timed_steps=2,
    num_profiled_steps=0,
    device="cpu",
)
WORLD2 = [
    BASE,  # DDP, dp 2 = ep 2
    dataclasses.replace(BASE, zero_stage=3, micro_batch_size=1),  # FSDP, 2 accumulation steps
]
WORLD4 = [
    # replicate over dp 2, ep = the tp pair; one step profiled, for its spans' groups
    dataclasses.replace(BASE, world_size=4, tp_degree=2, num_timed_steps=1, num_profiled_steps=1),
    dataclasses.replace(BASE, world_size=4, zero_stage=2),  # FSDP over 4, efsdp 2
    dataclasses.replace(BASE, world_size=4, zero_stage=3),  # the same, resharded after forward
    dataclasses.replace(BASE, world_size=4, zero_stage=3, dp_replicate=2),  # HSDP, efsdp 1
]
EXPERT_ROWS = 8 // 2 * 32  # moe-tiny: E / ep local experts of 32 rows (its expert ffn) each
"""The rows of a rank's w1 with its experts unsharded: a shard over efsdp holds 1/efsdp."""


def reference_losses(config: TrialConfig, num_steps: int, counts: list | None = None) -> list:
    """One process, the whole global batch, fp32, the bias stepped before each AdamW step;
    ``counts`` gets each step's tokens per expert per MoE layer."""
    workload = build_workload(config.workload, seed=config.seed)
    model = workload.model
    opt = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.0)
    losses = []
    for step in range(num_steps):
        inputs, targets = workload.batch(step)
        loss = workload.loss_fn(model(inputs), targets)
        loss.backward()
        if counts is not None:
            counts.append([m.tokens_per_expert.tolist() for m in moe_layers(model)])
        update_expert_bias(moe_layers(model))
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def _run_all(rank: int, configs: list[TrialConfig], permuted: int | None = None) -> list:
    """Each config's losses; the one at index ``permuted`` with each token's output combined
    from the next row (the negative control)."""
    from autotune.trial.parallel import expert, parallelize, zero
    from autotune.trial.runner import run_rank

    out, init, shard = [], expert.ExpertParallel.__init__, zero.shard_experts
    apply, step = parallelize.apply_ep, expert.MoEStep.__call__
    for i, config in enumerate(configs):
        if i == permuted:

            def wrong(self, group, ep, combine_order=None):
                init(self, group, ep, lambda out: torch.arange(len(out)).roll(1))

            expert.ExpertParallel.__init__ = wrong
        rows: list[int] = []  # each MoE layer's w1 rows on this rank after FSDP2 wrapping

        def spy(part, config, rows=rows, **fsdp):
            shard(part, config, **fsdp)
            rows.extend(local_tensor(m.experts.w1).numel() // 32 for m in moe_layers(part))

        moes: list = []
        grad: list[float] = []  # the first step's synced w1 gradients: Σ ‖local‖²

        def spy_apply(part, config, moes=moes):
            apply(part, config)
            moes.extend(moe_layers(part))

        def spy_step(self, moes=moes, grad=grad):
            step(self)
            if not grad:
                grad.append(
                    sum(float(local_tensor(m.experts.w1.grad).square().sum()) for m in moes)
                )

        zero.shard_experts, parallelize.apply_ep, expert.MoEStep.__call__ = spy, spy_apply, spy_step
        try:
            result = run_rank(config)
            groups = {(s.name, s.group) for s in result.spans if s.kind == "comm"}
            named = sorted(expert.expert_group_names(config, "cpu").values())  # CUDA's names
            out.append(
                (result.losses, result.extra["tokens_per_expert"], rows, groups, named, grad[0])
            )
        finally:
            expert.ExpertParallel.__init__, zero.shard_experts = init, shard
            parallelize.apply_ep, expert.MoEStep.__call__ = apply, step
    return out


def reference_expert_grad(config: TrialConfig) -> float:
    """Σ over the MoE layers of ‖∂loss/∂w1‖² at the first step, one process, the whole batch."""
    workload = build_workload(config.workload, seed=config.seed)
    inputs, targets = workload.batch(0)
    workload.loss_fn(workload.model(inputs), targets).backward()
    return sum(float(m.experts.w1.grad.square().sum()) for m in moe_layers(workload.model))


def _check(configs: list[TrialConfig], ranks: list) -> None:
    """Each of ``configs`` (the first results of every rank) trains to the reference."""
    for i, config in enumerate(configs):
        losses, expected = ranks[0][i][0], reference_losses(config, NUM_STEPS)
        assert len(losses) == NUM_STEPS
        assert max(abs(a - b) for a, b in zip(losses, expected)) <= LOSS_ATOL, (
            config,
            losses,
            expected,
        )
        assert abs(losses[-1] - losses[0]) > 1e-3  # it trains


@pytest.mark.slow
def test_ep2_matches_single_process_and_a_permuted_combine_does_not():
    ranks = run_ranks(2, _run_all, [*WORLD2, BASE], len(WORLD2), timeout=300.0)
    _check(WORLD2, ranks)
    # the stored routing: per step, each rank's tokens per expert add up to the one process's
    counts: list = []
    reference_losses(BASE, NUM_STEPS, counts)
    stored = torch.tensor([r[0][1] for r in ranks])  # [rank, step, layer, expert]
    assert stored.shape == (2, NUM_STEPS, 3, 8)
    assert torch.equal(stored.sum(0), torch.tensor(counts))
    assert (stored.sum(-1) == 4 * 16 // 2 * 2).all()  # each rank: 32 tokens × top-2 a layer
    wrong, expected = ranks[0][-1][0], reference_losses(BASE, NUM_STEPS)
    assert max(abs(a - b) for a, b in zip(wrong, expected)) > 10 * LOSS_ATOL


@pytest.mark.slow
def test_ep2_with_tp2_and_with_fsdp_at_world_4_match_single_process():
    ranks = run_ranks(4, _run_all, WORLD4, timeout=300.0)
    _check(WORLD4, ranks)
    for rank in ranks:  # the profiler names the experts' groups: ep, and the expert-data pair
        groups = rank[0][3]
        assert {g for name, g in groups if name == "all_to_all"} == {"ep"}, groups
        assert ("all_reduce", "edp") in groups, groups
        assert [r[4] for r in rank] == [
            ["edp", "ep"],  # DDP: the experts' gradients summed on edp, no FSDP2 mesh made
            ["edp", "efsdp", "ep"],
            ["edp", "efsdp", "ep"],
            ["edp", "ep"],  # HSDP: FSDP2 shards the experts over the expert-data group
        ]
    # the experts' synced gradients are the one process's: each expert's rows held once over
    # the ranks under ZeRO-2/3 and HSDP (ep × the expert-data group = 4), twice under DDP
    expected = reference_expert_grad(BASE)
    ratios = [sum(rank[i][5] for rank in ranks) / expected for i in range(len(WORLD4))]
    assert max(abs(r / c - 1) for r, c in zip(ratios, (2, 1, 1, 1))) < 1e-4, ratios
    for rank in ranks:  # 3 MoE layers; FSDP2 shards each layer's experts over efsdp
        assert [r[2] for r in rank[1:]] == [[EXPERT_ROWS // 2] * 3] * 3


def _spans_and_routing(rank: int, config: TrialConfig) -> tuple[list, list]:
    from autotune.trial.runner import run_rank

    result = run_rank(config)
    spans = [(s.step, s.bytes) for s in result.spans if s.name == "all_to_all"]
    assert {s.group for s in result.spans if s.name == "all_to_all"} == {"ep"}
    return spans, result.extra["tokens_per_expert"]


@pytest.mark.slow
def test_the_profiled_all_to_all_bytes_are_what_the_routing_implies():
    """EP 2, one profiled step of 2 micro-batches: per MoE layer and micro-batch the counts'
    exchange (8 int64), the dispatch of the S rows a rank routes (its tokens × top-2, to its
    own experts and the other rank's) and the combine of the R rows its experts took, each of
    h fp32; backward sends both again. The profiler records each call's input buffer, so a
    step's bytes are Σ_layers 2 · 64 + 2 · h · 4 · (S + R), S and R from the stored routing."""
    config = dataclasses.replace(BASE, num_timed_steps=1, num_profiled_steps=1)
    ranks = run_ranks(2, _spans_and_routing, config, timeout=300.0)
    step = 1  # the timed step is 0, the profiled one 1
    routing = torch.tensor([r[1][step] for r in ranks])  # [rank, layer, expert]
    for rank, (spans, _) in enumerate(ranks):
        mine = slice(4 * rank, 4 * rank + 4)  # experts 0-3 on rank 0, 4-7 on rank 1
        sent = routing[rank].sum()
        took = routing[:, :, mine].sum()
        expected = 3 * 2 * 64 + 2 * 32 * 4 * (sent + took)
        assert sum(b for s, b in spans if s == step) == expected, rank
