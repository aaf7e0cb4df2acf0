"""What a trial trains: a model, its batches, its loss, and how it may be parallelised.

A user workload is a function ``build(spec: WorkloadSpec) -> Workload`` named on the command line
as ``--workload pkg.module:build`` (or ``"workload"`` in the config). Only ``model`` and
``batch`` are required; ``tp_plan`` enables tensor parallelism, ``pipeline_split`` pipeline
parallelism, and ``blocks`` per-block activation checkpointing and ZeRO wrapping.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from autotune.config import WorkloadSpec
from autotune.trial.models.transformer import Transformer, split_for_pipeline

Batch = tuple[torch.Tensor, torch.Tensor]


def cross_entropy_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean token-level cross-entropy; inputs are (batch, seq, vocab) logits and (batch, seq)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))


@dataclass(kw_only=True)
class Workload:
    """A model with its data, built identically (same seed) on every rank."""

    model: nn.Module
    """The full model, on the CPU (in float32 unless the builder chose a dtype; parallelize puts
    it in the trial's precision)."""
    batch: Callable[[int], Batch]
    """batch(step) -> (inputs, targets) of the whole global batch of that step."""
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = cross_entropy_loss
    """loss_fn(model_output, targets) -> scalar mean loss of a micro-batch."""
    tp_plan: dict | None = None
    """{submodule path: ParallelStyle} for torch's parallelize_module; None: no TP."""
    pipeline_split: Callable[[nn.Module, int, int], nn.Module] | None = None
    """pipeline_split(model, stage_index, num_stages) keeps one stage's part; None: no PP."""
    blocks: Callable[[nn.Module], list[tuple[str, nn.Module]]] | None = None
    """Named repeated blocks of a (possibly split) model, for checkpointing and ZeRO wrapping."""
    tokens_per_sample: int | None = None
    """Tokens in one sequence (for throughput); None takes spec.seq_len."""
    num_heads: int | None = None
    """Attention heads, for validating tp_degree (optional)."""
    num_layers: int | None = None
    """Blocks, for validating pp_degree (optional)."""


def builtin_tp_plan(num_layers: int) -> dict:
    """Megatron-style TP (Shoeybi et al. 2019, §3): QKV and MLP-in column-wise, outputs row-wise."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan: dict = {}
    for i in range(num_layers):
        plan.update({
            f"layers.{i}.attention.wq": ColwiseParallel(),
            f"layers.{i}.attention.wk": ColwiseParallel(),
            f"layers.{i}.attention.wv": ColwiseParallel(),
            f"layers.{i}.attention.wo": RowwiseParallel(),
            f"layers.{i}.feed_forward.w1": ColwiseParallel(),
            f"layers.{i}.feed_forward.w3": ColwiseParallel(),
            f"layers.{i}.feed_forward.w2": RowwiseParallel(),
        })
    return plan


def synthetic_batch(step: int, *, seed: int, batch_size: int, seq_len: int,
                    vocab_size: int) -> Batch:
    """A deterministic, learnable batch: each sequence is an arithmetic progression mod vocab.

    Start token and stride are drawn per sequence from a generator seeded by (seed, step), so
    every rank and the single-process reference see the same batch for the same step.
    """
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    start = torch.randint(0, vocab_size, (batch_size, 1), generator=g)
    stride = torch.randint(1, 8, (batch_size, 1), generator=g)
    tokens = (start + stride * torch.arange(seq_len + 1)) % vocab_size
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def transformer_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(f"layers.{k}", m) for k, m in model.layers.items()]


def build_builtin(spec: WorkloadSpec, *, attention: str = "sdpa", seed: int = 0,
                  device: torch.device | str = "cpu") -> Workload:
    """The built-in model, its parameters initialised on ``device``: on a GPU the
    initialisation runs there (a 1.5B model's fp32 normal draws take 20 s on one CPU thread,
    milliseconds on an H200); every rank of a trial uses the same device type and seed, so
    every rank, and the single-process reference on that device, builds the same weights."""
    shape = spec.shape
    assert shape is not None  # internal: callers pass built-in specs only
    vocab = spec.resolved_vocab_size
    torch.manual_seed(seed)
    with torch.device(device):
        model = Transformer(shape, vocab_size=vocab, attention=attention)  # fp32: precision.py

    def batch(step: int) -> Batch:
        return synthetic_batch(step, seed=seed, batch_size=spec.global_batch_size,
                               seq_len=spec.seq_len, vocab_size=vocab)

    def split(m: nn.Module, stage: int, num_stages: int) -> nn.Module:
        return split_for_pipeline(m, stage, num_stages)

    return Workload(model=model, batch=batch, tp_plan=builtin_tp_plan(shape.num_layers),
                    pipeline_split=split, blocks=transformer_blocks,
                    num_heads=shape.num_heads, num_layers=shape.num_layers)
