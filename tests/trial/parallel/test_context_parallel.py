"""Context parallelism (``models/context_parallel.py``) trains the same model as one process.

CP 2 on the built-in GPT and Llama (RoPE at global positions), CP 2 × tp 2, CP 2 × dp 2 under
ZeRO-3 (FSDP2 over dp × cp), and CP 2 on a Hugging Face Llama config: every step's loss within
``test_layouts.LOSS_ATOL`` of the single-process reference. Negative control: the mask without
the chunks' causal offsets fails it. Bytes: the profiled all-gathers carry the K/V of the whole
sequence, from the formula by hand.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch
from spawn import run_ranks
from test_layouts import BASE, LOSS_ATOL, _check, _reference

from autotune.config import TrialConfig, WorkloadSpec
from autotune.layouts import short_name
from autotune.trial.models.context_parallel import chunk_positions

CP_LAYOUTS = [
    dict(world_size=2, cp_degree=2),
    dict(
        world_size=2,
        cp_degree=2,
        attention="eager",
        workload=WorkloadSpec(family="llama", size="tiny"),
    ),
    dict(world_size=4, cp_degree=2, tp_degree=2),
    dict(world_size=4, cp_degree=2, zero_stage=3, micro_batch_size=4),
]


def _layout_id(config: TrialConfig) -> str:
    return f"{config.workload.family}-{short_name(config)}"


def test_each_cp_rank_holds_two_balanced_chunks():
    """Sequence 8 on cp 2 → chunks of 2: rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2
    (Megatron's load balancing); each rank's causal pairs (Σ position + 1) are equal."""
    assert chunk_positions(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert chunk_positions(8, 2, 1).tolist() == [2, 3, 4, 5]
    held = [chunk_positions(16, 4, r) for r in range(4)]
    assert sorted(torch.cat(held).tolist()) == list(range(16))
    assert {int((p + 1).sum()) for p in held} == {34}  # (1+2+15+16) = (3+4+13+14) = …


@pytest.mark.slow
@pytest.mark.parametrize(
    "layout", CP_LAYOUTS, ids=lambda d: _layout_id(dataclasses.replace(BASE, **d))
)
def test_cp_layout_matches_single_process(executor, layout):
    _check(executor, dataclasses.replace(BASE, **layout))


def _train_without_causal_offset(rank: int, config: TrialConfig) -> list[float]:
    from autotune.trial.models import transformer
    from autotune.trial.runner import run_rank

    def offsetless(cp, device):  # the bug: each chunk's keys masked as if it began at 0
        n = cp.seq_len // cp.degree
        keys = torch.arange(cp.degree * n, device=device) % n
        return keys[None, :] <= torch.arange(n, device=device)[:, None]

    transformer.causal_mask = offsetless
    return run_rank(config).losses


@pytest.mark.slow
def test_cp_without_causal_offset_is_detected():
    config = dataclasses.replace(BASE, world_size=2, cp_degree=2)
    losses = run_ranks(2, _train_without_causal_offset, config)[0]
    expected = _reference(config.workload, config.attention)
    # measured 8.9e-4 (44× the tolerance): the tiny model's attention is near uniform at init,
    # so a wrong mask moves the loss less than a skipped gradient sync does
    assert max(abs(a - b) for a, b in zip(losses, expected)) > 10 * LOSS_ATOL


def _profiled_comm(rank: int, config: TrialConfig) -> tuple[int, set[tuple[str, str]]]:
    """The bytes of the step's all-gathers, and each collective's (name, group)."""
    from autotune.trial.runner import run_rank

    result = run_rank(config)
    comm = [s for s in result.spans if s.kind == "comm"]
    return sum(s.bytes for s in comm if s.name == "all_gather"), {(s.name, s.group) for s in comm}


@pytest.mark.slow
def test_cp_moves_the_kv_all_gather():
    """Per rank and layer, CP receives K and V of the other cp−1 ranks' tokens:
    2·b·(s/cp)·kv_heads·head_dim·4 bytes·(cp−1) (fp32), on Llama with 2 KV heads for 4 query
    heads (gathered before grouped-query attention repeats them). The profiler records an
    all-gather's whole output (cp parts), so the received bytes are its bytes × (cp−1)/cp.
    ZeRO-0's DDP only all-reduces: every all-gather of the step is attention's. Gloo's spans
    name no process group, so the all-gather and its backward's reduce-scatter are labelled
    ``cp`` by the range CP opens around them, and DDP's collectives ``dp``."""
    config = dataclasses.replace(
        BASE,
        world_size=2,
        cp_degree=2,
        num_profiled_steps=1,
        micro_batch_size=8,
        workload=WorkloadSpec(family="llama", size="tiny"),
    )
    shape = config.workload.shape
    b, s, cp = config.micro_batch_size, config.workload.seq_len, config.cp_degree
    per_layer = 2 * b * (s // cp) * shape.num_kv_heads * shape.head_dim * 4 * (cp - 1)
    for gathered, collectives in run_ranks(2, _profiled_comm, config):
        assert gathered * (cp - 1) // cp == shape.num_layers * per_layer
        cp_ones = {name for name, group in collectives if group == "cp"}
        assert cp_ones == {"all_gather", "reduce_scatter"}
        assert ("all_reduce", "dp") in collectives  # DDP's (and its buffers' broadcast)
        assert {group for name, group in collectives if name not in cp_ones} == {"dp"}


def _hf_cp_losses(rank: int, config: TrialConfig) -> list[float]:
    from autotune.trial.runner import run_rank

    return run_rank(config).losses


@pytest.mark.slow
def test_hf_llama_cp2_matches_the_hf_model(tmp_path):
    """transformers' own Llama (GQA: 2 KV heads) with attention through the registered
    ``autotune_cp`` function, against the plain HF model in one process."""
    transformers = pytest.importorskip("transformers")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/trial, for test_hf
    from test_hf import ARCHS, hf_reference

    ARCHS["llama"]().save_pretrained(tmp_path)
    spec = WorkloadSpec(hf_model=str(tmp_path), seq_len=16, global_batch_size=4)
    config = dataclasses.replace(BASE, workload=spec, world_size=2, cp_degree=2)
    assert transformers is not None
    got = run_ranks(2, _hf_cp_losses, config)[0]
    expected = hf_reference(str(tmp_path), spec, len(got))
    assert got == pytest.approx(expected, abs=LOSS_ATOL)
    assert abs(got[-1] - got[0]) > 1e-3
