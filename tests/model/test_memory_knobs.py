"""The newer knobs in autotune's own memory model (``memory.estimate_memory``): sequence and
context parallelism, HSDP, virtual stages, a number of recomputed blocks, torchtitan's op mode,
compile and float8. Every expected figure is counted by hand here, tensor by tensor, from what
the block keeps (see ``memory.layer_activation_bytes``), not from the model's code."""

from __future__ import annotations

import dataclasses

from autotune.config import TrialConfig, WorkloadSpec
from autotune.model.memory import (
    LayoutKnobs,
    block_backward_bytes,
    estimate_memory,
    layer_activation_bytes,
    microbatches_in_flight,
    peak_lower_bound,
)
from autotune.shapes import ModelShape

# A small Llama block: h 256, 8 heads of 32 (2 KV heads), SwiGLU width 512; bf16 (2 bytes).
LLAMA = ModelShape("llama", 4, 256, 8, 2, 512, 1000, 4096)
S, B, TP, E = 128, 2, 4, 2
H, A, F, HD, KV = 256, 8, 512, 32, 64  # KV = kv heads × head dim
T = S * B  # tokens


def _layer(mode: str = "none", tp: int = TP, **knobs) -> int:
    return layer_activation_bytes(
        LLAMA,
        seq_len=S,
        micro_batch=B,
        tp=tp,
        checkpointing=mode,
        attention="sdpa",
        dtype="bfloat16",
        knobs=LayoutKnobs(**knobs),
    )


def _by_hand(
    t: int, sp: int = 1, keys: int = T, compiled: bool = False, tp: int = TP, b: int = B
) -> int:
    """One Llama block's saved bytes for t tokens on the rank attending over ``keys`` tokens:
    per RMSNorm its fp32 input and normalised input (8·th) and rstd (4·t), ÷ sp, and the bf16
    output the next Linears keep (whole: DTensor gathers it before them); rotary cos and sin
    (2e·s·hd, s the rank's positions); q and the attention output (2e·th/tp), k and v repeated
    to all heads for every key (2e·keys·h/tp); SDPA's fp32 log-sum-exp (4·a·t/tp); SwiGLU's
    w1, w3, silu and product (4e·tf/tp). Compiled: each norm keeps its bf16 input and rstd
    (the output too under SP), the MLP w1's and w3's outputs only."""
    if compiled:
        norm = (E * t * H + 4 * t) // sp + (E * t * H if sp > 1 else 0)
        mlp = 2 * E * t * F // tp
    else:
        norm = (8 * t * H + 4 * t) // sp + E * t * H
        mlp = 4 * E * t * F // tp
    rotary = 2 * E * (t // b) * HD
    attention = (2 * E * t * H + 2 * E * keys * H) // tp + 4 * A * t // tp
    return 2 * norm + rotary + attention + mlp


def test_no_knob_is_the_recounted_block():
    assert _layer() == _by_hand(T)


def test_sequence_parallelism_shards_the_norms():
    # Korthikanti et al. 2022 §4.2.2: the norms run on s/t of the sequence; the Linears'
    # gathered input stays whole (what DTensor's ColwiseParallel saves).
    assert _layer(sequence_parallel=True) == _by_hand(T, sp=TP)
    # full recomputation keeps the block input, sequence-sharded: e·sbh/t
    assert _layer("full", sequence_parallel=True) == E * T * H // TP


def test_context_parallelism_keeps_the_gathered_keys_and_values():
    # cp 2: half the queries on the rank, the whole sequence's K and V gathered and kept.
    assert _layer(cp=2) == _by_hand(T // 2, keys=T)
    assert _layer("full", cp=2) == E * (T // 2) * H
    # backward adds the gathered K/V's gradients before their reduce-scatter: 2e·sbh/t
    kw = dict(
        seq_len=S, micro_batch=B, tp=TP, checkpointing="none", attention="sdpa", dtype="bfloat16"
    )
    grads = 2 * E * (T // 2) * F // TP  # SwiGLU's two widest gradients
    assert block_backward_bytes(LLAMA, knobs=LayoutKnobs(cp=2), **kw) == (
        grads + 2 * E * T * H // TP
    )


def test_compile_recomputes_the_pointwise_tensors():
    assert _layer(compiled=True) == _by_hand(T, compiled=True)
    assert _layer(compiled=True, sequence_parallel=True) == _by_hand(T, sp=TP, compiled=True)


def test_float8_keeps_the_bf16_inputs_and_adds_its_casts_in_backward():
    # torchao's matmul_with_hp_or_float8_args saves input_hp and weight_hp_t: nothing kept
    # changes; backward casts w1's weight, input and output gradient to 1-byte float8.
    assert _layer(float8=True) == _by_hand(T)
    kw = dict(
        seq_len=S, micro_batch=B, tp=TP, checkpointing="none", attention="sdpa", dtype="bfloat16"
    )
    plain = block_backward_bytes(LLAMA, **kw)
    assert plain == 2 * E * T * F // TP
    assert block_backward_bytes(LLAMA, knobs=LayoutKnobs(float8=True), **kw) == (
        plain + F * H // TP + T * H + T * F // TP
    )


def test_op_mode_keeps_the_policys_matmul_outputs():
    # torchtitan's op policy saves every second mm from the first: wq (h/t), wv (kv/t),
    # w1 (f/t) and w2 (the whole partial sum, h); SDPA's output (h/t) and log-sum-exp; and
    # the block input (h).
    expected = (
        E * T * H + E * T * (H + KV + F) // TP + E * T * H + E * T * H // TP + 4 * A * T // TP
    )
    assert _layer("op") == expected
    # Under SP the block input and w2's reduce-scattered output are sequence shards.
    assert _layer("op", sequence_parallel=True) == (
        2 * E * T * H // TP + E * T * (H + KV + F) // TP + E * T * H // TP + 4 * A * T // TP
    )


def _config(**kw) -> TrialConfig:
    wl = WorkloadSpec(workload="explicit:llama", seq_len=S, global_batch_size=kw.pop("batch", 8))
    return TrialConfig(workload=wl, device="cuda", precision="bf16-mixed", **kw)


def test_hsdp_shards_over_the_replica_group_only():
    # dp 4 as 2 replicas × 2 shards: FSDP2's fp32 shards hold half the parameters, not a
    # quarter. Every tensor's rows here are even, so no padding: 4 bytes × Φ / 2.
    phi = LLAMA.num_params()
    hsdp = estimate_memory(
        _config(world_size=4, zero_stage=3, dp_replicate=2), LLAMA, device_type="cuda"
    )
    assert hsdp.parameters == 4 * phi // 2 and hsdp.gradients == 4 * phi // 2
    plain = estimate_memory(_config(world_size=4, zero_stage=3), LLAMA, device_type="cuda")
    assert plain.parameters == 4 * phi // 4


def _tiny_gpt_shard_numel(n: int) -> int:
    """Tiny GPT's (h 64, FFN 256, vocab 512, 256 positions, 4 layers, untied head) parameter
    elements on one FSDP2 rank of n: every tensor's rows split into n (all divide here)."""
    h, f, v, s = 64, 256, 512, 256
    layer = 4 * h // n + 4 * (h // n) * h + (f // n) * h + (h // n) * f  # 2 LayerNorms, 6 Linears
    roots = (v // n) * h + (s // n) * h + 2 * h // n + (v // n) * h  # embeddings, norm, head
    return 4 * layer + roots


def test_context_parallel_ranks_share_the_zero_shards():
    # The trial engine shards FSDP2 over dp_shard × cp (parallel/mesh.py, torchtitan's
    # dp_shard_cp): cp 2 × dp 2 at ZeRO-3 holds a quarter of tiny GPT in fp32 (measured on CPU
    # by bench/new_knob_memory.py: 0.267 MiB of parameters), not a half.
    wl = WorkloadSpec(family="gpt", size="tiny", seq_len=64, global_batch_size=8)
    cp = TrialConfig(
        workload=wl, world_size=4, cp_degree=2, zero_stage=3, micro_batch_size=2, device="cpu"
    )
    est = estimate_memory(cp, device_type="cpu")
    quarter = _tiny_gpt_shard_numel(4)
    assert quarter == 69_920
    assert est.parameters == est.gradients == 4 * quarter
    # fp32 moments (8 bytes an element) and one 4-byte step per tensor (10 a layer, 5 roots)
    assert est.optimizer_state == 8 * quarter + 4 * (4 * 10 + 5)
    # HSDP × cp: 2 replicas, each sharded over its dp_shard 1 × cp 2 ranks: a half.
    hsdp = dataclasses.replace(cp, dp_replicate=2)
    assert estimate_memory(hsdp, device_type="cpu").parameters == 4 * _tiny_gpt_shard_numel(2)
    # cp alone (dp 1) at ZeRO-0 shards nothing; at ZeRO-3 FSDP2 shards over its 2 cp ranks.
    alone = dataclasses.replace(cp, world_size=2, zero_stage=0)
    assert estimate_memory(alone, device_type="cpu").parameters == 4 * _tiny_gpt_shard_numel(1)
    alone3 = dataclasses.replace(alone, zero_stage=3)
    assert estimate_memory(alone3, device_type="cpu").parameters == 4 * _tiny_gpt_shard_numel(2)


def test_context_parallel_ranks_sync_gradients_at_dp_1():
    # cp 2 × tp 2 at dp 1: the cp ranks average gradients with replicate (parallel/zero.py;
    # DDP cannot hold TP's DTensors), which while 4 micro-batches accumulate keeps a second copy
    # of the TP-local gradients: tiny GPT at tp 2 holds per layer 2 LayerNorms (4 × 64), wq/wk/wv
    # (3 × 32 × 64), wo (64 × 32), w1 (128 × 64), w2 (64 × 128); embeddings 512 × 64, positions
    # 256 × 64, final norm 2 × 64, head 512 × 64 — fp32. Measured on CPU: 4.65–4.71 MiB in all
    # (bench/new_knob_memory.py), 3.99 predicted without the copy.
    wl = WorkloadSpec(family="gpt", size="tiny", seq_len=64, global_batch_size=8)
    config = TrialConfig(
        workload=wl, world_size=4, cp_degree=2, tp_degree=2, micro_batch_size=2, device="cpu"
    )
    layer = 4 * 64 + 3 * 32 * 64 + 64 * 32 + 128 * 64 + 64 * 128
    numel = 4 * layer + 512 * 64 + 256 * 64 + 2 * 64 + 512 * 64
    est = estimate_memory(config, device_type="cpu")
    assert est.gradients == 4 * numel == 725_504
    assert est.comm_buffers == 4 * numel
    # tp 2 alone (no cp, no dp): nothing syncs gradients, no copy.
    tp = dataclasses.replace(config, world_size=2, cp_degree=1)
    assert estimate_memory(tp, device_type="cpu").comm_buffers == 0


def test_ac_layers_recomputes_that_many_blocks_per_stage():
    # 4 blocks, 1 recomputed whole: the other 3 keep everything. The backward temporary (a
    # recomputed block's) is the same in both, so the difference is 3 × (whole − input).
    mb = 16  # activations, not the optimizer step, make the peak
    config = _config(
        world_size=1, activation_checkpointing="full", ac_layers=1, micro_batch_size=mb, batch=mb
    )
    one = estimate_memory(config, LLAMA, device_type="cuda")
    every = estimate_memory(dataclasses.replace(config, ac_layers=None), LLAMA, device_type="cuda")
    assert one.phase == every.phase == "forward/backward"
    t = S * mb
    assert one.activations - every.activations == 3 * (_by_hand(t, keys=t, tp=1, b=mb) - E * t * H)
    assert peak_lower_bound(config, LLAMA, device_type="cuda") <= one.total


def test_virtual_stages_set_the_interleaved_replay():
    # pp 2, 4 micro-batches, 4 virtual stages (torch's ScheduleInterleaved1F1B order): rank 0
    # runs (4 − 1) × 2 + 2 = 8 warm-up forwards, two per local stage, then a forward on stage 0
    # before its first backward: (3, 2, 2, 2) at the peak.
    assert microbatches_in_flight("interleaved_1f1b", 2, 0, 4, 4) == (3, 2, 2, 2)
    # the config's virtual_stages reaches the estimate: 8 layers on 2 × 4 stages, one each
    eight = dataclasses.replace(LLAMA, num_layers=8)
    config = _config(world_size=2, pp_degree=2, pp_schedule="interleaved_1f1b", virtual_stages=4)
    first = estimate_memory(config, eight, device_type="cuda")
    assert first.total >= peak_lower_bound(config, eight, device_type="cuda")
