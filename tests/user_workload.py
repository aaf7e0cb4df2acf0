"""A user workload defined outside autotune, as a user would write one (used by the tests).

A residual MLP language model: embedding, blocks of (LayerNorm, Linear up, GELU, Linear down),
a head. It brings its own TP plan, pipeline split and block list.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from autotune.config import WorkloadSpec
from autotune.trial.models.workload import Workload

HIDDEN, LAYERS = 32, 4


class MLPBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(HIDDEN)
        self.up = nn.Linear(HIDDEN, 4 * HIDDEN)
        self.down = nn.Linear(4 * HIDDEN, HIDDEN)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class MLPLanguageModel(nn.Module):
    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, HIDDEN)
        self.blocks = nn.ModuleList(MLPBlock() for _ in range(LAYERS))
        self.head = nn.Linear(HIDDEN, vocab)

    def forward(self, x):
        if self.embed is not None:
            x = self.embed(x)
        for block in self.blocks:
            if block is not None:
                x = block(x)
        return self.head(x) if self.head is not None else x


def split(model: MLPLanguageModel, stage: int, num_stages: int) -> MLPLanguageModel:
    per = LAYERS // num_stages
    for i in range(LAYERS):
        if not stage * per <= i < (stage + 1) * per:
            model.blocks[i] = None
    if stage > 0:
        model.embed = None
    if stage < num_stages - 1:
        model.head = None
    return model


def build(spec: WorkloadSpec) -> Workload:
    vocab = spec.vocab_size or 128
    model = MLPLanguageModel(vocab)

    def batch(step: int):
        g = torch.Generator().manual_seed(step)
        tokens = torch.randint(0, vocab, (spec.global_batch_size, spec.seq_len + 1), generator=g)
        return tokens[:, :-1], tokens[:, 1:]

    plan = {}
    for i in range(LAYERS):
        plan[f"blocks.{i}.up"] = ColwiseParallel()
        plan[f"blocks.{i}.down"] = RowwiseParallel()
    return Workload(
        model=model,
        batch=batch,
        tp_plan=plan,
        pipeline_split=split,
        blocks=lambda m: [(f"blocks.{i}", b) for i, b in enumerate(m.blocks) if b is not None],
        num_layers=LAYERS,
    )


def build_failing_on_rank1(spec: WorkloadSpec) -> Workload:
    """Raises in rank 1's forward pass of the first step (a fault mid-trial)."""
    workload = build(spec)
    original = workload.model.forward

    def forward(x):
        if dist.get_rank() == 1:
            raise RuntimeError("injected failure on rank 1")
        return original(x)

    workload.model.forward = forward
    return workload


def build_raising(spec: WorkloadSpec) -> Workload:
    raise ValueError("this workload cannot be built")
