"""The quantities both models derive from a layout (autotune/model/layout_quantities.py), against
hand arithmetic: every expected figure below is worked out in its comment, none read back."""

from __future__ import annotations

import dataclasses

from autotune.config import TrialConfig, WorkloadSpec
from autotune.model import memory, perf_model
from autotune.model.cluster import builtin_clusters
from autotune.model.layout_quantities import LayoutQuantities, StateBytes

LLAMA_70B = WorkloadSpec(family="llama", size="70b", seq_len=4096, global_batch_size=1024)
"""80 layers, h 8192, vocabulary 32,000."""


def _interleaved() -> TrialConfig:
    # world 512 = tp 8 × pp 4 × cp 2 × dp 8
    return TrialConfig(
        world_size=512,
        tp_degree=8,
        pp_degree=4,
        cp_degree=2,
        zero_stage=3,
        micro_batch_size=1,
        pp_schedule="interleaved_1f1b",
        virtual_stages=3,
        sequence_parallel=True,
        precision="bf16-mixed",
        workload=LLAMA_70B,
    )


def test_interleaved_sequence_parallel_fsdp_layout_by_hand():
    config = _interleaved()
    config.validate()
    q = LayoutQuantities.of(config, LLAMA_70B.shape, "bf16-mixed")
    assert q.microbatch_tokens == 2048  # b·s/cp = 1·4096/2
    assert q.sequence_shards == 8  # SP: tp
    assert q.activation_elems == 2048 * 8192 == 16_777_216
    assert q.stream_elems == 2_097_152  # ÷ tp under SP
    assert q.num_microbatches == 128  # 1024 sequences / (mb 1 × dp 8)
    assert (q.interleaved, q.chunks_per_rank) == (True, 3)
    # 80 layers over 12 stages (stage_layer_counts: 5, 7 × 10, 5), stage i on rank i mod 4:
    # rank 0 holds stages 0, 4, 8; rank 3 holds 3, 7, 11.
    assert q.chunk_layers == ((5, 7, 7), (7, 7, 7), (7, 7, 7), (7, 7, 5))
    assert sum(map(sum, q.chunk_layers)) == 80
    # bf16-mixed under FSDP2 (ZeRO-3, dp 8): fp32 shards are the master copy, bf16 compute
    assert q.fsdp
    assert q.state_bytes == StateBytes(parameter=4, gradient=4, master=0, moment=4, compute=2)
    assert q.elem_bytes == 2
    assert q.vocab == 32000


def test_plain_ddp_layout_by_hand():
    workload = dataclasses.replace(LLAMA_70B, vocab_size=50257, global_batch_size=256)
    # world 64 = tp 4 × pp 2 × dp 8, ZeRO-1 (no FSDP), 1F1B, no SP
    config = TrialConfig(
        world_size=64,
        tp_degree=4,
        pp_degree=2,
        zero_stage=1,
        micro_batch_size=2,
        precision="bf16-mixed",
        workload=workload,
    )
    config.validate()
    q = LayoutQuantities.of(config, workload.shape, "bf16-mixed")
    assert q.microbatch_tokens == 8192  # 2 · 4096
    assert q.sequence_shards == 1
    assert q.stream_elems == q.activation_elems == 8192 * 8192
    assert q.num_microbatches == 16  # 256 / (2 · 8)
    assert (q.interleaved, q.chunks_per_rank) == (False, 1)
    assert q.chunk_layers == ((40,), (40,))
    # DDP/ZeRO-1 mixed precision: bf16 parameters and gradients, fp32 master and moments
    assert not q.fsdp
    assert q.state_bytes == StateBytes(parameter=2, gradient=2, master=4, moment=4, compute=2)
    assert q.vocab == 50257  # the workload's own vocabulary wins over the shape's


def test_both_models_read_the_one_definition():
    config = _interleaved()
    shape = LLAMA_70B.shape
    expected = LayoutQuantities.of(config, shape, "bf16-mixed")
    assert memory._stage(config, shape, 0, "cuda").layout == expected
    cluster = builtin_clusters()["a100-sxm4-80gb"].with_nodes(64)
    assert (
        perf_model._setup(config, cluster, None, shape, perf_model.AUTOTUNE_ENGINE).layout
        == expected
    )


def test_chunks_go_round_robin_over_the_pipeline_ranks():
    # 31 layers over pp 4 × v 2 = 8 stages: L + 2 = 33 units, 4 each and the one left over to
    # stage 1, the first and last stages one short for the embedding and the head:
    # 3, 5, 4, 4, 4, 4, 4, 3 (shapes.stage_layer_counts). Rank r holds stages r and r + 4
    # (Narayanan et al. 2021 §2.2), not stages 2r and 2r + 1.
    shape = dataclasses.replace(LLAMA_70B.shape, num_layers=31)
    config = dataclasses.replace(_interleaved(), pp_degree=4, virtual_stages=2)
    q = LayoutQuantities.of(config, shape, "bf16-mixed")
    assert q.chunk_layers == ((3, 4), (5, 4), (4, 4), (4, 3))


def test_context_parallel_ranks_alone_are_fsdp_shards_in_both_models():
    # world 2 = cp 2 × dp 1, ZeRO-3, bf16-mixed: the trial's FSDP2 mesh is dp × cp = 2 ranks
    # (parallel/zero.py wraps whenever it is more than one), so the states are fp32 shards
    # over 2, not bf16 model states with an fp32 master copy.
    workload = WorkloadSpec(family="llama", size="tiny", seq_len=256, global_batch_size=2)
    config = TrialConfig(
        world_size=2,
        cp_degree=2,
        zero_stage=3,
        micro_batch_size=1,
        precision="bf16-mixed",
        device="cuda",
        workload=workload,
    )
    config.validate()
    assert config.dp_degree == 1
    q = LayoutQuantities.of(config, workload.shape, "bf16-mixed")
    assert q.fsdp
    assert q.state_bytes == StateBytes(parameter=4, gradient=4, master=0, moment=4, compute=2)
    # llama-tiny: 4 blocks of 2·64 (norms) + 64·64 + 2·(32·64) + 64·64 (q, k, v, o with 2 KV
    # heads of 16) + 3·176·64 (SwiGLU) = 128 + 12,288 + 33,792 = 46,208; embedding and head
    # 2·512·64 = 65,536, final norm 64: 4·46,208 + 65,600 = 250,432 parameters.
    params = 250_432
    assert workload.shape.num_params() == params
    est = memory.estimate_memory(config, device_type="cuda").as_dict()
    assert est["parameters"] == est["gradients"] == 4 * params // 2 == 500_864
    # The time model's data-parallel collectives move FSDP's element sizes: fp32 gradients
    # reduced, bf16 parameters gathered.
    moved = perf_model.data_parallel_bytes(config, "cuda")
    assert (moved.reduce, moved.gather, moved.at_rest) == (4, 2, 4)
