"""engine_memory: Korthikanti et al. 2022's activation counts, torchtitan's op mode, the
published BigScience sweep and torchtitan figures, and the screens rank relies on."""

from __future__ import annotations

import dataclasses
import importlib.util
import random
import sys
from pathlib import Path

import pytest

from autotune.config import GIB, TrialConfig, WorkloadSpec
from autotune.layouts import enumerate_configs
from autotune.model.engine_memory import (
    BIGSCIENCE,
    TORCHTITAN,
    TORCHTITAN_MULTINODE,
    block_activation_bytes,
    engine_layout,
    estimate_engine_memory,
)
from autotune.model.memory import (
    MemoryTraits,
    estimate_all_stages,
    estimate_memory,
    peak_lower_bound,
)
from autotune.shapes import ModelShape

ROOT = Path(__file__).resolve().parents[2]

# A GPT block as Korthikanti et al. count it: 4h GELU MLP, dropout, explicit softmax, 16-bit.
S, B, H, A, T = 2048, 2, 1024, 16, 4
GPT = ModelShape(
    family="gpt",
    num_layers=4,
    hidden_size=H,
    num_heads=A,
    num_kv_heads=A,
    ffn_hidden_size=4 * H,
    vocab_size=51200,
    max_seq_len=S,
)
PAPER = MemoryTraits(name="paper", dropout=True, flash_attention=False, fused_norm=True)


def _block(traits: MemoryTraits, mode: str, tp: int, sp: bool = False) -> int:
    return block_activation_bytes(
        GPT, traits, seq_len=S, micro_batch=B, tp=tp, e=2, mode=mode, sp=sp
    )


@pytest.mark.parametrize(
    "mode, sp, tp, per_sbh",
    [
        # Table 2: sbh(34 + 5as/h); with TP t, sbh(10 + 24/t + 5as/(ht)); with SP, sbh(34/t + ...)
        ("none", False, 1, 34 + 5 * A * S / H),
        ("none", False, T, 10 + 24 / T + 5 * A * S / (H * T)),
        ("none", True, T, 34 / T + 5 * A * S / (H * T)),
        # selective recomputation drops the 5as/h term; full keeps the 2sbh input (÷ t with SP)
        ("selective", False, T, 10 + 24 / T),
        ("selective", True, T, 34 / T),
        ("full", False, T, 2),
        ("full", True, T, 2 / T),
    ],
)
def test_block_activations_are_korthikanti_table_2(mode, sp, tp, per_sbh):
    assert _block(PAPER, mode, tp, sp) == pytest.approx(S * B * H * per_sbh, rel=1e-12)


def test_flash_attention_keeps_no_scores():
    # Flash: the 5as²b term is gone and the fp32 log-sum-exp (4·asb/t) is kept instead.
    flash = dataclasses.replace(PAPER, flash_attention=True)
    assert _block(flash, "none", T) == S * B * H * (10 + 24 / T) + 4 * A * S * B // T


def test_torchtitan_op_mode_keeps_matmul_outputs():
    # Llama 3.1 8B: the block input, wq, wv (8 KV heads), SDPA's output, w1 and w2 outputs in
    # bf16, and the log-sum-exp in fp32 (torchtitan's policy saves every second matmul).
    llama8b = ModelShape(
        family="llama",
        num_layers=32,
        hidden_size=4096,
        num_heads=32,
        num_kv_heads=8,
        ffn_hidden_size=14336,
        vocab_size=128256,
        max_seq_len=8192,
    )
    tokens = 2 * 8192
    kept = [4096, 4096, 8 * 128, 4096, 14336, 4096]
    expected = 2 * tokens * sum(kept) + 4 * 32 * tokens
    got = block_activation_bytes(
        llama8b, TORCHTITAN, seq_len=8192, micro_batch=2, tp=1, e=2, mode="op"
    )
    assert got == expected


def _llama(layers, h, heads, kv, f):
    return ModelShape(
        family="llama",
        num_layers=layers,
        hidden_size=h,
        num_heads=heads,
        num_kv_heads=kv,
        ffn_hidden_size=f,
        vocab_size=128256,
        max_seq_len=8192,
    )


@pytest.mark.parametrize(
    "shape, world, tp, micro, ac, traits, measured_gib, autotune_gib",
    [
        # issue 24's measured torchtitan figures (H100): 8B FSDP 8, local batch 2, selective AC,
        # one node; 70B FSDP 32 × TP 8, local batch 16, full AC, 32 nodes; both at seq 8192
        (_llama(32, 4096, 32, 8, 14336), 8, 1, 2, "selective", TORCHTITAN, 82, 155),
        (_llama(80, 8192, 64, 8, 28672), 256, 8, 16, "full", TORCHTITAN_MULTINODE, 72, 371),
    ],
)
def test_torchtitan_figures_within_20_percent(
    shape, world, tp, micro, ac, traits, measured_gib, autotune_gib
):
    config = TrialConfig(
        workload=WorkloadSpec(
            workload="explicit:torchtitan", seq_len=8192, global_batch_size=micro * world // tp
        ),
        world_size=world,
        tp_degree=tp,
        zero_stage=3,
        micro_batch_size=micro,
        activation_checkpointing=ac,
        device="cuda",
        precision="bf16-mixed",
    )
    # torchtitan turns sequence parallelism on with TP (the 70B row)
    predicted = estimate_engine_memory(engine_layout(config, traits), shape, traits).total / GIB
    assert predicted == pytest.approx(measured_gib, rel=0.10)
    # autotune's own runtime keeps fp32 norms, replicated logits and whole-block activations:
    # the 155 and 371 GiB, which the engine's traits replace.
    own = estimate_memory(config, shape, device_type="cuda").total / GIB
    assert own == pytest.approx(autotune_gib, abs=0.5)


def _published_memory():
    spec = importlib.util.spec_from_file_location(
        "published_memory", ROOT / "bench" / "published_memory.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_bigscience_sweep_memory_and_verdicts():
    bench = _published_memory()
    predictions = [p for p in bench.predict_memory_rows() if p.row.table == "bigscience"]
    stated = [p for p in predictions if p.error is not None]
    assert len(stated) == 70 and sum(p.row.oom for p in predictions) == 6
    # The allocator factor was fitted on the even-numbered stated rows; judge the others.
    held_out = stated[1::2]
    assert bench.mape(held_out) <= 0.15
    within = sum(abs(p.error) <= 0.15 for p in stated)
    assert within >= 0.95 * len(stated)
    # Verdicts against the 80 GB card: every OOM row but 116 is predicted not to fit, every ok
    # row but 20 (stated 80 GB: the card full) to fit. Row 116 (82 layers of h 14,336 on 12
    # stages) is predicted as its neighbours 110 (67 GB) and 112 (59 GB), which ran.
    wrong = {p.row.index for p in predictions if p.fits == p.row.oom}
    assert wrong <= {20, 116}
    f, c = bench.fit_allocator(bench.bigscience_rows())
    assert (f, c * GIB) == pytest.approx(
        (BIGSCIENCE.fragmentation, BIGSCIENCE.context_bytes), rel=0.01
    )


def test_torchtitan_a100_rows_fit_where_they_ran():
    # torchtitan's 2024 A100 table: 8 rows ran on 64 A100 80GB, Llama 2 70B at local batch 2
    # with selective AC (layer or op) ran out of memory.
    rows = [p for p in _published_memory().predict_memory_rows() if p.row.table == "torchtitan"]
    assert len(rows) == 10 and sum(p.row.oom for p in rows) == 2
    assert all(p.fits != p.row.oom for p in rows)


def _sweep() -> list[tuple[TrialConfig, ModelShape | None]]:
    rng = random.Random(0)
    out = []
    for family, size, world, batch in [("llama", "tiny", 16, 64), ("gpt", "small", 8, 32)]:
        base = TrialConfig(
            workload=WorkloadSpec(family=family, size=size, seq_len=64, global_batch_size=batch),
            world_size=world,
        )
        grid = [c for c in enumerate_configs(base, overlap=(True, False)) if c.pp_degree > 2]
        out += [(c, None) for c in rng.sample(grid, min(60, len(grid)))]
    return out


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_worst_rank_is_among_the_candidates(device):
    # estimate_memory evaluates ranks 0, 1 and the last only (memory.worst_rank_candidates).
    for config, shape in _sweep():
        every = estimate_all_stages(config, shape, device_type=device)
        assert estimate_memory(config, shape, device_type=device) == max(
            every, key=lambda e: e.total
        )


def test_lower_bound_and_stop_above_never_exceed_the_estimate():
    for config, shape in _sweep():
        exact = estimate_memory(config, shape, device_type="cuda")
        shape = config.workload.shape
        assert peak_lower_bound(config, shape, device_type="cuda") <= exact.total
        stopped = estimate_memory(
            config, shape, device_type="cuda", checked=True, stop_above=exact.total // 2
        )
        assert exact.total // 2 < stopped.total <= exact.total


def test_layer_mode_and_context_parallel():
    # torchtitan's 'layer' mode: one block in k checkpointed whole (its input), the others
    # keep everything; context parallelism: each rank holds s / cp of every sequence.
    every3 = dataclasses.replace(PAPER, selective_mode="layer", ac_layer_every=3)
    config = TrialConfig(
        workload=WorkloadSpec(workload="explicit:gpt", seq_len=S, global_batch_size=B),
        world_size=2,
        cp_degree=2,
        micro_batch_size=B,
        activation_checkpointing="selective",
        device="cuda",
        precision="bf16-mixed",
    )
    est = estimate_engine_memory(config, GPT, every3)
    half = S * B // 2
    none = block_activation_bytes(
        GPT, every3, seq_len=S, micro_batch=B, cp=2, tp=1, e=2, mode="none"
    )
    full = block_activation_bytes(
        GPT, every3, seq_len=S, micro_batch=B, cp=2, tp=1, e=2, mode="full"
    )
    assert full == 2 * half * H
    kept = GPT.num_layers * ((full + 2 * none) // 3)
    # the blocks', the final norm's input, the loss's fp32 logits (kept) and, on top, the
    # larger of the loss's peak and one block's backward
    logits = half * GPT.vocab_size
    final = 2 * half * H
    assert est.activations - kept - final - 4 * logits == max(
        2 * logits, none + 2 * 2 * half * 4 * H + 2 * half * H
    )


def test_1f1b_first_stage_holds_a_micro_batch_per_stage():
    # 1F1B (Megatron, DeepSpeed's TrainSchedule): pipeline rank 0 holds min(M, p) micro-batches,
    # each its blocks' kept activations (full recomputation: their inputs) and its stage input.
    from autotune.model.engine_memory import _engine_stage

    pp, m = 4, 8
    config = TrialConfig(
        workload=WorkloadSpec(workload="explicit:gpt", seq_len=S, global_batch_size=m * B),
        world_size=pp,
        pp_degree=pp,
        micro_batch_size=B,
        activation_checkpointing="full",
        pp_schedule="1f1b",
        device="cuda",
        precision="bf16-mixed",
    )
    first = _engine_stage(config, GPT, PAPER, 0, "bf16-mixed")
    sbh = S * B * H
    per_micro_batch = (GPT.num_layers // pp) * 2 * sbh + 2 * sbh
    none = _block(PAPER, "none", 1)
    backward = none + 2 * 2 * S * B * 4 * H + 2 * sbh  # the block rebuilt and its gradients
    assert first.activations == pp * per_micro_batch + backward
