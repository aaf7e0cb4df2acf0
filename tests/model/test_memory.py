"""The memory model (autotune/model/memory.py) against hand arithmetic, saved tensors, and real
trials.

Hand-computed expectations follow the cited formulas (ZeRO: Rajbhandari et al. 2020 §5;
activations: Korthikanti et al. 2022 Table 2, recounted for our block) and are written out in
the comments; none is read back from the code under test.

Tolerance reached against the runner's measurement (``runner.measure_memory``: states exact,
peak from the CPU profiler's allocation events), over a sweep of 2,181 (trial, pipeline stage)
pairs on the 2-core CPU machine — gpt/llama tiny, world 2 and 4, ZeRO 0-3, tp 1/2/4,
pp 1/2/4 with gpipe / 1f1b / interleaved, checkpointing none/selective/full, micro-batch 1/2/4,
sequence 64/128, float32/bfloat16, sdpa/eager, bucket 0.1-25 MB, overlap on/off (measured
before the runner counted DDP's buckets, so its DDP layouts read one copy of the gradients low):

| category                          | predicted − measured (worst rank of each stage)          |
|-----------------------------------|----------------------------------------------------------|
| parameters                        | exact (2,181 of 2,181), FSDP padding included            |
| gradients                         | exact (2,181 of 2,181)                                    |
| optimizer state                   | exact (2,181 of 2,181): ZeRO-1's greedy split reproduced  |
| everything above the model states | median +14%, p90 +31%, worst under −9%                    |
| peak (total)                      | median +11%, p90 +23%, p95 +28%, worst under −7.7%,       |
|                                   | worst over +73%; 92% of pairs within ±25%                 |

Nothing measured more than 10% above its prediction. The over-predictions beyond +25% are the
last pipeline stage (the logits every micro-batch keeps, which the CPU measurement sometimes
misses: the same layout measured 4.4 MiB and 6.5 MiB in different worker processes) and FSDP
with one micro-batch, where the gradients counted are not yet allocated at the peak. The CPU
measurement also carries tensors that gloo's threads free (the profiler records only frees on
profiled threads), so its peaks vary between runs by up to one FSDP unit; ``device_type="cpu"``
adds an allowance for that (``other``). The level it starts from counts DDP's gradient buckets,
which are allocated with the wrapper and never appear in a step's events. The trials
re-measured here run one warm-up step first, as every trial does: DDP rebuilds its buckets in
the second step, whose reading carries both sets. Two runs each (predicted / measured peak in
MiB, error; two stages separated by "|"):

| trial                                          | predicted   | measured          | error      |
|------------------------------------------------|-------------|-------------------|------------|
| gpt w2 ZeRO-0 mb1×4 s64                        | 6.75        | 6.76              | −0%        |
| gpt w2 ZeRO-1 mb4×1 s128 selective             | 14.49       | 14.52             | −0%        |
| gpt w2 ZeRO-2 mb2×2 s64                        | 7.56        | 6.83              | +11%       |
| gpt w2 ZeRO-3 mb1×4 s128 full                  | 5.99        | 5.34–5.72         | +5…+12%    |
| gpt w2 tp2 mb2×4 s64                           | 5.09        | 4.85–4.88         | +4…+5%     |
| gpt w2 pp2 1f1b mb1×8 s64                      | 3.50 | 3.05 | 3.45 | 3.05       | +2 | −0%   |
| llama bf16 w2 ZeRO-3 mb2×2 s128                | 6.47        | 6.05              | +7%        |
| gpt w4 ZeRO-3 tp2 mb2×2 s64 selective          | 5.09        | 4.43–4.71         | +8…+15%    |
| gpt w4 pp2 gpipe mb2×2 s128 full               | 4.64 | 5.46 | 4.36 | 5.42       | +7 | +1%   |
| gpt w4 ZeRO-2 pp2 interleaved mb1×4 s64        | 4.14 | 3.53 | 3.49 | 3.15       | +19 | +12% |
| gpt w4 ZeRO-1 pp2 1f1b no overlap mb2×2 sel.   | 3.98 | 3.39 | 3.41 | 3.59       | +17 | −6%  |
| llama w4 ZeRO-0 mb1×2 s128 full eager          | 6.61        | 5.88              | +12%       |

The test below asserts, per trial, exact model states and a peak within −10% … +30% (the
bound is looser than the sweep's +25% because the CPU measurement varies between runs).

Speed: about 50,000 estimates a second on one core of the CPU machine (asserted: 10,000 in
under 10 s).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import pytest

from autotune.cli.estimate import add_estimate_parser, cmd_estimate
from autotune.config import TrialConfig, WorkloadSpec
from autotune.errors import ConfigError
from autotune.model.memory import (
    CATEGORIES,
    MemoryEstimate,
    block_backward_bytes,
    estimate_all_stages,
    estimate_memory,
    layer_activation_bytes,
    microbatches_in_flight,
    model_state_bytes,
    stage_layer_counts,
)
from autotune.shapes import MODEL_SHAPES, ModelShape

GIB = 2**30


# ---- model states: the ZeRO paper's partitioning (§5), by hand ----------------------------
# GPT-2 small (h 768, 12 layers, f 3072, vocab 50257, context 1024, untied head):
#   embeddings 50257·768 + 1024·768 = 38,597,376 + 786,432
#   per layer  4·768² + 2·768·3072 + 4·768 (two LayerNorms, weight + bias) = 7,080,960
#   final LayerNorm 2·768 = 1,536; head 50257·768 = 38,597,376
#   Φ = 38,597,376 + 786,432 + 12·7,080,960 + 1,536 + 38,597,376 = 162,954,240
GPT2_SMALL_PARAMS = 162_954_240
GPT2_SMALL_TENSORS = 2 + 12 * 10 + 2 + 1  # wte, wpe; 6 Linears + 4 norm tensors a layer; norm; head


def _config(**kw) -> TrialConfig:
    # The hand-derived figures here are float32 (32-true); mixed precision has its own tests.
    workload = kw.pop("workload", {})
    kw.setdefault("precision", None if "dtype" in workload else "32-true")
    return TrialConfig(workload=WorkloadSpec(**workload), **kw)


def test_gpt2_small_param_count_by_hand():
    assert MODEL_SHAPES[("gpt", "small")].num_params() == GPT2_SMALL_PARAMS


def test_gpt2_small_zero1_over_8_ranks_by_hand():
    # float32, dp = 8. Parameters and gradients unsharded: 4Φ each = 651,816,960 bytes.
    # The paper's ZeRO-1 (mixed precision) would hold 4Φ + 12Φ/N; ours keeps fp32 params and
    # grads (8Φ) and shards the two fp32 moments (8Φ/N = 162,954,240 on average). But
    # ZeroRedundancyOptimizer assigns whole tensors, largest first, to the least-loaded rank:
    # the token embedding (38,597,376 params, 24% of Φ > 1/8) lands alone on one rank, whose
    # moments are 8·38,597,376 = 308,779,008 bytes, plus one 4-byte step counter = 308,779,012.
    config = _config(
        world_size=8,
        zero_stage=1,
        micro_batch_size=1,
        workload=dict(family="gpt", size="small", seq_len=1024),
    )
    est = estimate_memory(config, device_type="cuda")
    assert est.parameters == 4 * GPT2_SMALL_PARAMS == 651_816_960
    assert est.gradients == 651_816_960
    assert est.optimizer_state == 308_779_012
    assert est.optimizer_state > 8 * GPT2_SMALL_PARAMS // 8  # the greedy split is uneven
    # ZeRO-0 on the same ranks: 16Φ + 4 bytes per tensor, nothing divided by N.
    est0 = estimate_memory(dataclasses.replace(config, zero_stage=0), device_type="cuda")
    assert est0.model_states == 16 * GPT2_SMALL_PARAMS + 4 * GPT2_SMALL_TENSORS


@pytest.mark.parametrize("n", [1, 2, 4, 8, 16, 32, 64])
def test_zero_stage_scaling_what_divides_by_n(n):
    # gpt-tiny: every tensor's dim 0 (512, 256, 64 or 256 rows) is divisible by these N, so
    # FSDP's padded shards are exactly 1/N. Φ = 279,680 (shapes.py), 45 tensors.
    phi, tensors = MODEL_SHAPES[("gpt", "tiny")].num_params(), 45
    assert phi == 279_680
    est = {
        z: estimate_memory(
            _config(world_size=n, zero_stage=z, workload=dict(global_batch_size=64)),
            device_type="cuda",
        )
        for z in (0, 1, 2, 3)
    }
    # ZeRO-0: nothing sharded.
    assert (est[0].parameters, est[0].gradients, est[0].optimizer_state) == (
        4 * phi,
        4 * phi,
        8 * phi + 4 * tensors,
    )
    # ZeRO-1: only the moments, whole tensors per rank (at least 1/N, at most 1/N + the
    # largest tensor, 512·64 = 32,768 params); with N = 1 nothing is sharded.
    assert (est[1].parameters, est[1].gradients) == (4 * phi, 4 * phi)
    largest = 512 * 64
    assert 8 * phi / n <= est[1].optimizer_state <= 8 * (phi / n + largest) + 4 * tensors
    # ZeRO-2/3 (FSDP2): parameters, gradients and moments all /N at rest (16Φ/N); the step
    # counters are per tensor and not sharded.
    for z in (2, 3):
        assert (est[z].parameters, est[z].gradients, est[z].optimizer_state) == (
            4 * phi // n,
            4 * phi // n,
            8 * phi // n + 4 * tensors,
        )


def test_fsdp_pads_dim0_to_a_multiple_of_n():
    # N = 3 does not divide 64: each tensor's dim 0 is padded to ⌈rows/3⌉ rows on every rank.
    # gpt-tiny tensors (rows, elements per row): wte (512, 64), wpe (256, 64); per layer
    # LN (64, 1) ×4, wq/wk/wv/wo (64, 64), w1 (256, 64), w2 (64, 256); final LN (64, 1) ×2;
    # head (512, 64).  ⌈512/3⌉ = 171, ⌈256/3⌉ = 86, ⌈64/3⌉ = 22.
    per_layer = 4 * 22 + 4 * 22 * 64 + 86 * 64 + 22 * 256  # 88 + 5,632 + 5,504 + 5,632
    shard = 171 * 64 + 86 * 64 + 4 * per_layer + 2 * 22 + 171 * 64
    est = estimate_memory(
        _config(world_size=3, zero_stage=3, workload=dict(global_batch_size=6)), device_type="cuda"
    )
    assert est.parameters == 4 * shard == 4 * 94_860
    assert est.optimizer_state == 8 * shard + 4 * 45


def test_model_state_bytes_reproduces_the_zero_papers_example():
    # ZeRO paper Fig. 1: Φ = 7.5B on N = 64: baseline 120 GB, ZeRO-3 1.9 GB (16Φ/N).
    # Our float32 AdamW holds 16Φ too, split params 4Φ + grads 4Φ + moments 8Φ, so ZeRO-0 and
    # ZeRO-3 agree with the paper; ZeRO-1 keeps fp32 params and grads whole: 8Φ + 8Φ/N
    # = 60 GB + 0.9375 GB (the paper's 31.4 GB keeps only fp16 copies whole).
    phi, n = 7_500_000_000, 64
    states = {z: sum(model_state_bytes(phi, zero_stage=z, dp_degree=n)) for z in range(4)}
    assert states[0] == 120_000_000_000
    assert states[1] == 60_000_000_000 + 937_500_000
    assert states[2] == states[3] == 1_875_000_000
    # bf16-true halves every element (no fp32 master copy).
    assert sum(model_state_bytes(phi, zero_stage=0, dp_degree=n, precision="bf16-true")) == 60e9


# ---- tensor and pipeline parallelism -----------------------------------------------------------
def test_tp_divides_only_the_sharded_linears():
    # GPT-2 small, tp = 4 (dp 1): per layer the Linears (4·768² + 2·768·3072 = 7,077,888)
    # divide by 4 → 1,769,472; the norms (3,072), embeddings, final norm and head stay whole.
    replicated = 38_597_376 + 786_432 + 1_536 + 38_597_376
    per_layer = 7_077_888 // 4 + 3_072
    est = estimate_memory(
        _config(world_size=4, tp_degree=4, workload=dict(family="gpt", size="small", seq_len=128)),
        device_type="cuda",
    )
    assert est.parameters == 4 * (replicated + 12 * per_layer)


def test_pp_splits_layers_like_split_for_pipeline():
    import torch  # noqa: F401  (the real split below builds a model)

    from autotune.trial.models.transformer import Transformer, split_for_pipeline

    # 12 layers over 5 stages: 14 units (the embedding and head weigh a layer each) leave a
    # remainder of 4 that the 3 middle stages cannot take: earlier stages take the remainder.
    assert stage_layer_counts(12, 5) == [3, 3, 2, 2, 2]
    # Llama 3's 126 layers on 16 stages: a layer fewer on the first and last (§3.3.2).
    assert stage_layer_counts(126, 16) == [7] + [8] * 14 + [7]
    assert stage_layer_counts(32, 4) == [8] * 4  # even splits stay even
    shape = MODEL_SHAPES[("llama", "tiny")]  # 4 layers over 3 stages → 1, 2, 1
    for stage in range(3):
        model = split_for_pipeline(Transformer(shape, vocab_size=64), stage, 3)
        assert len(model.layers) == stage_layer_counts(4, 3)[stage]


def test_pp_stages_hold_their_layers_embeddings_and_head():
    # GPT-2 small on pp = 5: stage 0 has wte + wpe + 3 layers; stages 1-2 three/two layers;
    # the last has 2 layers + final norm + head. Per layer 7,080,960 params.
    layer = 7_080_960
    expected = [
        38_597_376 + 786_432 + 3 * layer,
        3 * layer,
        2 * layer,
        2 * layer,
        2 * layer + 1_536 + 38_597_376,
    ]
    config = _config(
        world_size=5,
        pp_degree=5,
        pp_schedule="gpipe",
        workload=dict(family="gpt", size="small", seq_len=128),
    )
    stages = estimate_all_stages(config, device_type="cuda")
    assert [e.parameters for e in stages] == [4 * p for p in expected]
    assert [e.stage for e in stages] == [0, 1, 2, 3, 4]
    assert estimate_memory(config, device_type="cuda") == max(stages, key=lambda e: e.total)


# ---- activations -----------------------------------------------------------------------------
def test_gpt2_small_layer_activations_by_hand():
    # GPT-2 small, s = 1024, b = 1, float32 (e = 4), t = 1: sbh = 786,432, sbf = 3,145,728.
    #   two LayerNorms (input + output saved, mean + rstd): 2·(2·4·sbh + 2·4·sb) = 12,599,296
    #   q, k, v and the attention output: 4·4·sbh = 12,582,912
    #   GELU input and output: 2·4·sbf = 25,165,824
    #   SDPA log-sum-exp: 4·a·s·b = 4·12·1024 = 49,152
    # = 50,397,184 bytes ≈ 64.1·sbh — against Korthikanti et al.'s sbh(34 + 5as/h) =
    # 114·sbh = 89,653,248 for 16-bit activations with dropout and an explicit softmax.
    shape = MODEL_SHAPES[("gpt", "small")]
    kw = dict(seq_len=1024, micro_batch=1, dtype="float32")
    none = layer_activation_bytes(shape, tp=1, checkpointing="none", attention="sdpa", **kw)
    assert none == 12_599_296 + 12_582_912 + 25_165_824 + 49_152 == 50_397_184
    # Eager attention keeps the softmax (4·a·s²·b = 50,331,648) and the s² bool mask
    # (1,048,576) instead of the log-sum-exp: the paper's 5as²b term, in our dtype.
    eager = layer_activation_bytes(shape, tp=1, checkpointing="none", attention="eager", **kw)
    assert eager == 12_599_296 + 12_582_912 + 25_165_824 + 50_331_648 + 1_048_576
    # TP t = 4 (no sequence parallelism, as the paper's "sbh(10 + 24/t + 5as/(ht))"): the norms
    # stay whole, the rest divides: 12,599,296 + 12,582,912/4 + 25,165,824/4 + 49,152/4.
    tp4 = layer_activation_bytes(shape, tp=4, checkpointing="none", attention="sdpa", **kw)
    assert tp4 == 12_599_296 + 3_145_728 + 6_291_456 + 12_288
    # Full recomputation keeps only the layer input: 4·sbh (the paper's 2sbh in 16-bit).
    full = layer_activation_bytes(shape, tp=1, checkpointing="full", attention="sdpa", **kw)
    assert full == 4 * 786_432


@pytest.mark.parametrize("family", ["gpt", "llama"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("checkpointing", ["none", "selective", "full"])
def test_layer_formula_matches_saved_tensors(family, attention, dtype, checkpointing):
    """The per-layer formula equals the bytes autograd really saves in one of our blocks."""
    import torch

    from autotune.trial.models.transformer import Transformer
    from autotune.trial.models.workload import transformer_blocks
    from autotune.trial.parallel.activation_checkpoint import apply_ac

    # Odd sizes so that no coefficient can hide: s 48, b 3, h 80, 5 heads (Llama: 5 KV heads
    # would be plain MHA, so GQA with 1 KV head), f 208.
    shape = ModelShape(family, 2, 80, 5, 5 if family == "gpt" else 1, 208, 96, 64)
    torch_dtype = getattr(torch, dtype)
    model = apply_ac(
        Transformer(shape, vocab_size=96, attention=attention).to(torch_dtype),
        checkpointing,
        transformer_blocks,
    )
    param_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in param_storages:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    x = torch.randn(3, 48, 80, dtype=torch_dtype, requires_grad=True)
    autocast = torch.autocast("cpu", dtype=torch_dtype, enabled=dtype != "float32")
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast:
        model.layers["0"](x)
    assert sum(saved.values()) == layer_activation_bytes(
        shape,
        seq_len=48,
        micro_batch=3,
        tp=1,
        checkpointing=checkpointing,
        attention=attention,
        dtype=dtype,
    )


@pytest.mark.parametrize("family", ["gpt", "llama"])
@pytest.mark.parametrize("checkpointing", ["none", "selective", "full"])
def test_block_backward_temporaries_match_the_profiler(family, checkpointing):
    """Measured bytes above the saved ones while two blocks run backward (SDPA, s·b = 256)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from autotune.trial.models.transformer import Transformer
    from autotune.trial.models.workload import transformer_blocks
    from autotune.trial.parallel.activation_checkpoint import apply_ac

    shape = ModelShape(family, 2, 64, 4, 4, 256 if family == "gpt" else 176, 64, 256)
    model = Transformer(shape, vocab_size=64)
    model.tok_embeddings = model.pos_embeddings = model.norm = model.output = None
    model = apply_ac(model, checkpointing, transformer_blocks)
    x = torch.randn(2, 128, 64, requires_grad=True)
    grad = torch.randn(2, 128, 64)
    model(x).backward(grad)  # parameter gradients exist before the measured step
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        model(x).backward(grad)
    events = sorted(
        (e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
        key=lambda e: e.start_ns(),
    )
    live = peak = 0
    for e in events:
        live += e.nbytes()
        peak = max(peak, live)
    kw = dict(
        seq_len=128,
        micro_batch=2,
        tp=1,
        checkpointing=checkpointing,
        attention="sdpa",
        dtype="float32",
    )
    above_saved = peak - 2 * layer_activation_bytes(shape, **kw)
    assert above_saved == pytest.approx(block_backward_bytes(shape, **kw), rel=0.05)


@pytest.mark.parametrize("model", ["gpt-small", "llama-7b"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_checkpointing_orders_activations_full_selective_none(model, attention):
    family, size = model.split("-")
    # ZeRO-3 over 8 ranks: the optimizer step's temporaries are small, so the peak is in
    # forward/backward for every mode and ``activations`` is what each mode keeps.
    acts = {}
    for ac in ("none", "selective", "full"):
        config = _config(
            world_size=8,
            zero_stage=3,
            activation_checkpointing=ac,
            attention=attention,
            micro_batch_size=2,
            workload=dict(family=family, size=size, seq_len=1024, global_batch_size=16),
        )
        est = estimate_memory(config, device_type="cuda")
        assert est.phase == "forward/backward"
        acts[ac] = est.activations
    assert acts["full"] < acts["selective"] < acts["none"]


def test_foreach_adamw_can_make_the_optimizer_step_the_peak():
    # Llama 7B (Φ = 6,738,415,616 with an untied head) on 8 GPUs with DDP in float32 and full
    # recomputation: foreach AdamW's sqrt of every second moment (4Φ ≈ 27 GB) outweighs the
    # activations, so the peak is after backward and the temporaries are under ``other``.
    config = _config(
        world_size=8,
        activation_checkpointing="full",
        micro_batch_size=1,
        workload=dict(family="llama", size="7b", seq_len=1024, global_batch_size=8),
    )
    est = estimate_memory(config, device_type="cuda")
    phi = MODEL_SHAPES[("llama", "7b")].num_params()
    assert est.phase == "after backward"
    assert est.other == 4 * phi and est.activations == 0


# ---- pipeline schedules ------------------------------------------------------------------------
def test_microbatches_in_flight_per_schedule():
    # GPipe holds all M; 1F1B stage i holds min(M, pp − i) (Narayanan et al. 2021 §2.2).
    assert [microbatches_in_flight("gpipe", 4, r, 8) for r in range(4)] == [(8,)] * 4
    assert [microbatches_in_flight("1f1b", 4, r, 8) for r in range(4)] == [(4,), (3,), (2,), (1,)]
    assert microbatches_in_flight("1f1b", 4, 0, 2) == (2,)
    # Interleaved, pp 2, M 4 (2 per round), 2 virtual stages: rank 0 warms up with
    # (2 − 1)·2 + 2·(2 − 1 − 0) = 4 forwards — stages 0, 0, 1, 1 — and holds a fifth
    # (stage 0) before its first backward: (3, 2). Rank 1: 2 warm-up forwards, 3 held: (2, 1).
    assert microbatches_in_flight("interleaved_1f1b", 2, 0, 4) == (3, 2)
    assert microbatches_in_flight("interleaved_1f1b", 2, 1, 4) == (2, 1)


def test_interleaved_replay_matches_torchs_schedule():
    """Our replay of ScheduleInterleaved1F1B's order against torch's own op list."""
    from torch.distributed.pipelining import schedules

    cls = schedules.ScheduleInterleaved1F1B
    if not hasattr(cls, "_calculate_single_rank_operations"):  # private API: torch 2.13's
        pytest.skip("torch no longer exposes _calculate_single_rank_operations")
    for pp in (2, 3, 4):
        for m in (1, 2, 4, 6, 8, 12):
            if m % max(1, m // pp):
                continue  # refused by validation
            for rank in range(pp):
                sched = cls.__new__(cls)
                sched.pp_group_size, sched.n_local_stages, sched._n_microbatches = pp, 2, m
                sched.number_of_rounds = max(1, m // pp)
                sched.microbatches_per_round = m // sched.number_of_rounds
                sched.rank = rank
                held, best, best_held = [0, 0], -1, None
                for action in sched._calculate_single_rank_operations(rank):
                    if action is None:
                        continue
                    local = action.stage_index // pp
                    if action.computation_type == schedules._ComputationType.FORWARD:
                        held[local] += 1
                        if sum(held) > best:
                            best, best_held = sum(held), tuple(held)
                    else:
                        held[local] -= 1
                assert microbatches_in_flight("interleaved_1f1b", pp, rank, m) == best_held


def _full_replay(pp: int, rank: int, m: int, weights: tuple[int, ...]) -> tuple[int, ...]:
    """The interleaved order replayed to its last forward, every step (the definition that
    ``memory._interleaved_peak`` shortens to one period after the warm-up)."""
    v = len(weights)
    per_round = m // max(1, m // pp)
    warmup = min((v - 1) * per_round + 2 * (pp - 1 - rank), v * m)
    held, load, best, best_held = [0] * v, 0, -1, None
    for k in range(v * m):
        f = (k // per_round) % v
        held[f] += 1
        load += weights[f]
        if load > best:
            best, best_held = load, tuple(held)
        if k >= warmup:
            b = v - 1 - ((k - warmup) // per_round) % v
            held[b] -= 1
            load -= weights[b]
    return best_held


def test_interleaved_peak_stops_one_period_after_the_warm_up_and_finds_the_same_peak():
    from autotune.model.memory import _interleaved_peak

    _interleaved_peak.cache_clear()
    checked = 0
    for pp in (2, 3, 4, 8):
        for m in (pp, 2 * pp, 3 * pp, 5 * pp, 16 * pp, 64, 96):
            if m % max(1, m // pp):
                continue  # refused by validation
            for weights in ((1, 1), (5, 3), (2, 7, 3), (4, 1, 1, 9), (1, 1, 1, 1)):
                for rank in range(pp):
                    full = _full_replay(pp, rank, m, weights)
                    assert _interleaved_peak(pp, rank, m, weights) == full, (pp, rank, m, weights)
                    checked += 1
    assert checked > 500


def test_gpipe_keeps_every_microbatch_and_1f1b_favours_later_stages():
    base = dict(
        world_size=4,
        pp_degree=4,
        micro_batch_size=1,
        workload=dict(family="gpt", size="small", seq_len=512, global_batch_size=8),
    )
    gpipe = estimate_all_stages(_config(pp_schedule="gpipe", **base), device_type="cuda")
    f1b = estimate_all_stages(_config(pp_schedule="1f1b", **base), device_type="cuda")
    # Stages 1 and 2 are identical (3 layers, no embeddings or head): GPipe holds 8
    # micro-batches on both, 1F1B 3 and 2.
    per_mb = (gpipe[1].activations - f1b[1].activations) / (8 - 3)
    assert f1b[1].activations - f1b[2].activations == pytest.approx(per_mb)
    assert gpipe[1].activations == gpipe[2].activations
    assert all(g.activations > f.activations for g, f in zip(gpipe[:3], f1b[:3]))


# ---- the large model nobody can run here --------------------------------------------------------
def test_llama_70b_on_512_gpus_is_finite_and_sane():
    # Llama 2 70B (h 8192, 80 layers, 64 heads / 8 KV heads of 128, f 28672, vocab 32000),
    # world 512 = tp 8 × pp 8 × dp 8, ZeRO-1, float32, s 4096, micro 1, global 1024 → M 128.
    # Per layer on one TP rank: wq, wo 8192²/8 = 8,388,608 each; wk, wv 1024·8192/8 =
    # 1,048,576 each; w1, w2, w3 28672·8192/8 = 29,360,128 each; 2 RMSNorms 8,192 each
    # → 106,971,136. Ten layers a stage; the embedding (32000·8192 = 262,144,000) on stage 0,
    # the final norm (8,192) and head (262,144,000) on stage 7.
    layer = 2 * 8_388_608 + 2 * 1_048_576 + 3 * 29_360_128 + 2 * 8_192
    assert layer == 106_971_136
    config = _config(
        world_size=512,
        tp_degree=8,
        pp_degree=8,
        zero_stage=1,
        micro_batch_size=1,
        workload=dict(family="llama", size="70b", seq_len=4096, global_batch_size=1024),
    )
    stages = estimate_all_stages(config, device_type="cuda")
    assert stages[0].parameters == 4 * (10 * layer + 262_144_000)
    assert stages[7].parameters == 4 * (10 * layer + 8_192 + 262_144_000)
    assert stages[3].parameters == 4 * 10 * layer
    # ZeRO-1 over dp 8 of TP's DTensors (the distributed optimizer): every 25 MB bucket split
    # into 8 equal shares, unpadded (every tensor size is a multiple of 8), so the two fp32
    # moments are 2·4/8 = 1 byte per stage parameter, plus a 4-byte step counter for each
    # tensor a rank holds a piece of (at most all: 10·9 + 1 on stage 0, 10·9 + 2 on stage 7).
    for e, numel, tensors in (
        (stages[0], 10 * layer + 262_144_000, 91),
        (stages[7], 10 * layer + 8_192 + 262_144_000, 92),
    ):
        assert 0 < e.optimizer_state - numel <= 4 * tensors
    # Stage 0 activations (1F1B holds pp − 0 = 8 micro-batches): per layer, s 4096, b 1, t 8,
    # sbh = 33,554,432, sbf = 117,440,512: norms 2·(8·sbh + 4·s + 4·sbh) = 805,339,136,
    # rotary 2·4·4096·128 = 4,194,304, q/k/v/out 16·sbh/8 = 67,108,864,
    # SwiGLU 16·sbf/8 = 234,881,024, log-sum-exp 4·64·4096/8 = 131,072 → 1,111,654,400;
    # ten layers + the stage output 4·sbh = 11,250,761,728 per micro-batch; × 8, plus one
    # block's backward temporaries 2·4·sbf/8 = 117,440,512.
    assert stages[0].activations == 8 * (10 * 1_111_654_400 + 134_217_728) + 117_440_512
    worst = estimate_memory(config, device_type="cuda")
    for e in stages:
        assert all(isinstance(v, int) and v >= 0 for v in e.as_dict().values())
        assert 10 * GIB < e.total < 1024 * GIB
    assert worst.total == max(e.total for e in stages)


# ---- input handling -----------------------------------------------------------------------------
def test_user_workload_needs_an_explicit_shape():
    config = _config(workload=dict(workload="pkg.module:build"))
    with pytest.raises(ConfigError, match="explicit"):
        estimate_memory(config)
    shape = ModelShape("gpt", 2, 32, 2, 2, 128, 100, 64)
    est = estimate_memory(config, shape)
    assert est.parameters == 4 * shape.num_params()


def test_invalid_layouts_are_refused_with_the_rule():
    with pytest.raises(ConfigError, match="divide"):
        estimate_memory(_config(world_size=4, tp_degree=3))
    with pytest.raises(ConfigError, match="global_batch_size"):
        estimate_memory(_config(world_size=16))


def test_estimate_categories_sum_to_total():
    est = estimate_memory(_config(world_size=4, zero_stage=3, micro_batch_size=1))
    d = est.as_dict()
    assert list(d) == [*CATEGORIES, "total"]
    assert d["total"] == sum(d[c] for c in CATEGORIES) == est.total
    assert isinstance(est, MemoryEstimate)


def test_speed_thousands_of_estimates_a_second():
    configs = []
    for zero, tp, pp, mb, ac in [
        (z, t, p, m, a)
        for z in range(4)
        for t in (1, 2)
        for p in (1, 2)
        for m in (1, 2, 4)
        for a in ("none", "selective", "full")
    ]:
        config = _config(
            world_size=8,
            zero_stage=zero,
            tp_degree=tp,
            pp_degree=pp,
            micro_batch_size=mb,
            activation_checkpointing=ac,
            overlap_enabled=not (zero == 1 and pp > 1),
            workload=dict(family="gpt", size="medium", seq_len=1024, global_batch_size=64),
        )
        try:
            config.validate()
        except ConfigError:
            continue  # e.g. a micro-batch that does not divide the batch
        configs.append(config)
    assert len(configs) > 100
    start = time.perf_counter()
    count = 0
    while count < 10_000:
        for config in configs:
            estimate_memory(config)
        count += len(configs)
    assert time.perf_counter() - start < 10.0  # ≥ 1,000 estimates/s (measured: ~50,000/s)


# ---- measured against predicted --------------------------------------------------------------
_FAST = dict(num_warmup_steps=1, num_timed_steps=1, num_profiled_steps=0, device="cpu")
MEASURED = [  # world 2 first, then world 4: the executor keeps one worker group per world size
    _config(world_size=2, micro_batch_size=1, **_FAST),
    _config(
        world_size=2,
        zero_stage=1,
        micro_batch_size=4,
        activation_checkpointing="selective",
        workload=dict(seq_len=128),
        **_FAST,
    ),
    _config(world_size=2, zero_stage=2, micro_batch_size=2, **_FAST),
    _config(
        world_size=2,
        zero_stage=3,
        micro_batch_size=1,
        activation_checkpointing="full",
        workload=dict(seq_len=128),
        **_FAST,
    ),
    _config(world_size=2, tp_degree=2, micro_batch_size=2, **_FAST),
    _config(world_size=2, pp_degree=2, micro_batch_size=1, **_FAST),
    _config(
        world_size=2,
        zero_stage=3,
        micro_batch_size=2,
        workload=dict(family="llama", dtype="bfloat16", seq_len=128),
        **_FAST,
    ),
    _config(
        world_size=4,
        zero_stage=3,
        tp_degree=2,
        micro_batch_size=2,
        activation_checkpointing="selective",
        **_FAST,
    ),
    _config(
        world_size=4,
        pp_degree=2,
        pp_schedule="gpipe",
        micro_batch_size=2,
        activation_checkpointing="full",
        workload=dict(seq_len=128),
        **_FAST,
    ),
    _config(
        world_size=4,
        zero_stage=2,
        pp_degree=2,
        pp_schedule="interleaved_1f1b",
        micro_batch_size=1,
        **_FAST,
    ),
    _config(
        world_size=4,
        zero_stage=1,
        pp_degree=2,
        overlap_enabled=False,
        micro_batch_size=2,
        activation_checkpointing="selective",
        **_FAST,
    ),
    _config(
        world_size=4,
        micro_batch_size=1,
        activation_checkpointing="full",
        attention="eager",
        workload=dict(family="llama", seq_len=128),
        **_FAST,
    ),
]


@pytest.mark.parametrize(
    "config",
    MEASURED,
    ids=lambda c: (
        f"{c.workload.family}-w{c.world_size}-z{c.zero_stage}-tp{c.tp_degree}-pp{c.pp_degree}-"
        f"mb{c.micro_batch_size}-s{c.workload.seq_len}-{c.activation_checkpointing}"
    ),
)
def test_predicted_against_measured(executor, config):
    result = executor.run(config)
    for est in estimate_all_stages(config, device_type="cpu"):
        ranks = [r.memory for r in result.ranks if r.pp_rank == est.stage]
        # Model states: exact on the worst rank of the stage (ZeRO-1's uneven split included).
        assert est.parameters == max(m.parameters for m in ranks)
        assert est.gradients == max(m.gradients for m in ranks)
        assert est.optimizer_state == max(m.optimizer_state for m in ranks)
    # Peak: never more than 10% under the measurement, at most 30% over it. On CPU the
    # measured peak can only overstate the truth (a buffer freed on a gloo thread is seen late,
    # and gloo's timing moves when prefetched buffers die), so a reading over the bound is
    # measured again, up to three runs in all, and the lowest reading per stage is judged.
    peaks = _stage_peaks(result)
    for _ in range(2):
        if all(
            est.total / peaks[est.stage] - 1 >= -0.10
            for est in estimate_all_stages(config, device_type="cpu")
        ):
            break
        peaks = {
            stage: min(peak, _stage_peaks(executor.run(config))[stage])
            for stage, peak in peaks.items()
        }
    for est in estimate_all_stages(config, device_type="cpu"):
        peak = peaks[est.stage]
        assert -0.10 <= est.total / peak - 1 <= 0.30, (est.stage, est.as_dict(), peak)


@pytest.mark.parametrize("config", MEASURED[:2], ids=["zero0-accumulating", "zero1-one-microbatch"])
def test_ddp_peak_counts_its_buckets(executor, config):
    # DDP's buckets hold a copy of the gradients from the wrapper's construction on, outside
    # any step's allocation events. Counted, DDP's peak is the model's within 3% on both sides
    # (with no FSDP units there is no gloo-thread noise: repeated runs read the same bytes).
    # Missed, the ZeRO-0 layout reads 18% and the ZeRO-1 one 8% under the prediction.
    assert config.zero_stage <= 1 and config.tp_degree == config.pp_degree == 1
    (est,) = estimate_all_stages(config, device_type="cpu")
    peak = _stage_peaks(executor.run(config))[0]
    assert est.total / peak - 1 == pytest.approx(0, abs=0.03), (est.as_dict(), peak)


def _stage_peaks(result) -> dict[int, int]:
    """The highest measured peak among each pipeline stage's ranks."""
    peaks: dict[int, int] = {}
    for r in result.ranks:
        peaks[r.pp_rank] = max(peaks.get(r.pp_rank, 0), r.memory.peak)
    return peaks


# ---- autotune estimate ---------------------------------------------------------------------------
def _run_cli(capsys, *argv: str) -> tuple[int, str]:
    parser = argparse.ArgumentParser(prog="autotune")
    add_estimate_parser(parser.add_subparsers(dest="command"))
    code = cmd_estimate(parser.parse_args(["estimate", *argv]))
    return code, capsys.readouterr().out


LLAMA_70B_ARGS = (
    "--model",
    "llama-70b",
    "--world-size",
    "512",
    "--tp",
    "8",
    "--pp",
    "8",
    "--zero",
    "1",
    "--micro-batch",
    "1",
    "--global-batch",
    "1024",
    "--seq-len",
    "4096",
    "--precision",
    "32-true",
)


def test_cli_table_for_llama_70b(capsys):
    code, out = _run_cli(capsys, *LLAMA_70B_ARGS)
    assert code == 0
    for name in (*CATEGORIES, "total"):
        assert name in out
    assert "GiB" in out and "worst pipeline stage" in out
    assert "trial engine refuses" not in out  # ZeRO-1 with TP runs (distributed optimizer)


def test_cli_json_matches_the_library(capsys):
    code, out = _run_cli(capsys, *LLAMA_70B_ARGS, "--json")
    assert code == 0
    data = json.loads(out)
    config = _config(
        world_size=512,
        tp_degree=8,
        pp_degree=8,
        zero_stage=1,
        micro_batch_size=1,
        workload=dict(family="llama", size="70b", seq_len=4096, global_batch_size=1024),
    )
    worst = estimate_memory(config, device_type="cuda")
    assert data["per_rank"] == worst.as_dict()
    assert data["stage"] == worst.stage and len(data["stages"]) == 8
    assert data["device"] == "cuda"


def test_cli_config_file_and_explicit_shape(capsys, tmp_path):
    path = tmp_path / "cfg.json"
    path.write_text(_config(world_size=2, zero_stage=2, device="cpu").to_json())
    code, out = _run_cli(capsys, "--config", str(path), "--json")
    data = json.loads(out)
    expected = estimate_memory(TrialConfig.from_file(path), device_type="cpu")
    assert code == 0 and data["per_rank"] == expected.as_dict()
    # An explicit architecture: the same numbers as the equivalent ModelShape.
    code, out = _run_cli(
        capsys,
        "--num-layers",
        "6",
        "--hidden-size",
        "256",
        "--num-heads",
        "8",
        "--seq-len",
        "128",
        "--vocab-size",
        "1000",
        "--world-size",
        "2",
        "--precision",
        "32-true",
        "--json",
    )
    shape = ModelShape("gpt", 6, 256, 8, 8, 1024, 1000, 128)
    data = json.loads(out)
    assert data["per_rank"]["parameters"] == 4 * shape.num_params()


def test_cli_params_gives_model_states_only(capsys):
    code, out = _run_cli(capsys, "--params", "7e9", "--world-size", "64", "--zero", "3", "--json")
    data = json.loads(out)["per_rank"]
    # 16Φ/N = 16 · 7e9 / 64 = 1.75e9 bytes; activations unknown without the architecture.
    assert code == 0 and data["model_states"] == 1_750_000_000
    assert data["activations"] is None and data["total"] is None
    code, out = _run_cli(capsys, "--params", "7e9", "--world-size", "64")
    assert "unknown" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (("--model", "gpt-huge"), "unknown model 'gpt-huge'"),
        (("--num-layers", "4", "--hidden-size", "64"), "needs --num-heads"),
        (
            (
                "--model",
                "gpt-small",
                "--num-layers",
                "4",
                "--hidden-size",
                "64",
                "--num-heads",
                "4",
                "--seq-len",
                "64",
                "--vocab-size",
                "100",
            ),
            "either --model or",
        ),
        (
            (
                "--num-layers",
                "4",
                "--hidden-size",
                "60",
                "--num-heads",
                "8",
                "--seq-len",
                "64",
                "--vocab-size",
                "100",
            ),
            "must divide --hidden-size",
        ),
        (("--world-size", "4", "--tp", "3"), "must divide world_size"),
        (
            (
                "--params",
                "-3",
            ),
            "positive parameter count",
        ),
        (("--params", "1e9", "--model", "gpt-small"), "drop --model"),
        (("--config", "/nonexistent/cfg.json"), "cannot read config file"),
    ],
)
def test_cli_bad_input_is_one_config_error(capsys, argv, message):
    with pytest.raises(ConfigError, match=message) as info:
        _run_cli(capsys, *argv)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "argv, message",
    [
        (("--zero", "5"), "invalid choice: 5 (choose from 0, 1, 2, 3)"),
        (("--tp", "0"), "argument --tp: must be ≥ 1, not 0"),
        (("--ac", "some"), "invalid choice: 'some'"),
    ],
)
def test_cli_flag_out_of_its_field_type_is_a_usage_error(capsys, argv, message):
    """The layout flags take their type from the config field (cli/config_flags.py): a value
    the field cannot hold is argparse's one-line usage error, exit 2."""
    with pytest.raises(SystemExit) as info:
        _run_cli(capsys, *argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err
