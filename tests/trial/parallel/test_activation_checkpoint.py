"""What each activation-checkpointing mode recomputes, counted op by op in one process.

A block of the tiny GPT runs six matmuls forward (wq, wk, wv, wo, w1, w2) and its backward two
per Linear (input and weight gradients); the output head adds one forward and two backward.
So a backward without recomputation runs 2 × (6 × 4 + 1) = 50 matmuls, and recomputation adds
the forward matmuls it redoes. torch's checkpoint stops recomputing once it has rebuilt every
tensor backward needs (early stop), and the last matmul's output (w2's, added to the residual)
is saved by nothing, so a block recomputes at most its first 5: full 5 per block; op
(torchtitan's policy keeps the 1st, 3rd and 5th matmul: wq, wv, w1) recomputes wk and wo, 2 per
block; full with ac_layers = k, 5 for each of the first k blocks of each stage. SDPA's forward
runs again in backward under full and selective checkpointing, not under op (it keeps SDPA's
output). The losses each mode trains are compared with the single-process reference in
test_layouts.py and tests/trial/test_hf.py.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from torch.utils._python_dispatch import TorchDispatchMode

from autotune.config import WorkloadSpec
from autotune.trial.models.transformer import split_for_pipeline
from autotune.trial.models.workload import build_builtin, transformer_blocks
from autotune.trial.parallel.activation_checkpoint import apply_ac

GPT = WorkloadSpec(family="gpt", size="tiny", seq_len=32, global_batch_size=2)
LAYERS = 4
MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default}
SDPA = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default


class _Count(TorchDispatchMode):
    """Counts the matmuls and SDPA forwards that run (recomputed ones included; what a
    selective-checkpoint policy serves from its cache never reaches this outer mode)."""

    def __init__(self) -> None:
        super().__init__()
        self.matmuls = self.sdpa = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.matmuls += func in MATMULS
        self.sdpa += func == SDPA
        return func(*args, **(kwargs or {}))


def _backward_counts(
    mode: str, ac_layers: int | None = None, spec: WorkloadSpec = GPT
) -> tuple[int, int]:
    workload = build_builtin(spec)
    model = apply_ac(workload.model, mode, transformer_blocks, ac_layers)
    inputs, targets = workload.batch(0)
    loss = workload.loss_fn(model(inputs), targets)
    counter = _Count()
    with counter:
        loss.backward()
    return counter.matmuls, counter.sdpa


@pytest.mark.parametrize(
    "mode, ac_layers, matmuls, sdpa",
    [
        ("none", None, 50, 0),
        ("selective", None, 50, LAYERS),  # the attention core alone: SDPA again, no matmul
        ("op", None, 50 + 2 * LAYERS, 0),
        ("full", None, 50 + 5 * LAYERS, LAYERS),
        ("full", 1, 50 + 5, 1),
        ("full", 3, 50 + 5 * 3, 3),
    ],
)
def test_each_mode_recomputes_what_it_names(mode, ac_layers, matmuls, sdpa):
    assert _backward_counts(mode, ac_layers) == (matmuls, sdpa)


def test_op_mode_recomputes_every_second_matmul_of_a_llama_block():
    """Seven matmuls (wq, wk, wv, wo, w1, w3, w2): the 2nd, 4th and 6th (wk, wo, w3) are
    recomputed."""
    llama = dataclasses.replace(GPT, family="llama")
    base = 2 * (7 * LAYERS + 1)
    assert _backward_counts("op", spec=llama) == (base + 3 * LAYERS, 0)


def test_ac_layers_counts_from_each_pipeline_stage_first_block():
    model = split_for_pipeline(build_builtin(GPT).model, 1, 2)  # layers 2 and 3
    apply_ac(model, "full", transformer_blocks, 1)
    assert [isinstance(m, CheckpointWrapper) for m in model.layers.values()] == [True, False]
