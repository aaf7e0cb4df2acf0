"""What a trial trains: a model, its batches, its loss, and how it may be parallelised.

A user workload is a function ``build(spec: WorkloadSpec) -> Workload`` named on the command line
as ``--workload pkg.module:build`` (or ``"workload"`` in the config). Only ``model`` and
``batch`` are required; ``tp_plan`` enables tensor parallelism (``sp_plan`` sequence
parallelism with it), ``pipeline_split`` pipeline
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
    sp_plan: dict | None = None
    """The tp_plan with sequence parallelism (``plan_styles(sequence_parallel=True)``), used
    when a trial sets sequence_parallel; None: no sequence parallelism."""
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


def plan_styles(
    names: dict[str, str],
    *,
    sequence_parallel: bool = False,
    norms: tuple[str, ...] = (),
    regions: dict[str, str | None] | None = None,
) -> dict:
    """torch ParallelStyles for ``{path: 'colwise' | 'rowwise'}`` (Megatron's TP, Shoeybi et al.
    2019, §3).

    With ``sequence_parallel`` (Korthikanti et al. 2022, §4.2.2), as torchtitan's ``apply_tp``
    for Llama (torchtitan/models/llama3/infra/parallelize.py): the ``norms`` run on sequence
    shards (``SequenceParallel``), each TP region (``regions``: path → the keyword its input
    is passed by, None for positional) all-gathers its sequence-sharded input
    (``PrepareModuleInput``, kept a DTensor so the colwise Linears' input gradients add up as
    one Partial and leave as one reduce-scatter), and the rowwise outputs reduce-scatter onto
    the sequence (``output_layouts=Shard(1)``) instead of all-reducing. The residual stream
    between regions is the local sequence shard; ``tensor_parallel.apply_tp`` shards it at a
    stage's first block and gathers it after its last.
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    if not sequence_parallel:
        styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
        return {path: styles[style]() for path, style in names.items()}
    seq = Shard(1)
    plan: dict = {path: SequenceParallel() for path in norms}
    for path, kwarg in (regions or {}).items():
        plan[path] = (
            PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),))
            if kwarg is None
            else PrepareModuleInput(
                input_kwarg_layouts={kwarg: seq}, desired_input_kwarg_layouts={kwarg: Replicate()}
            )
        )
    for path, style in names.items():
        plan[path] = (
            ColwiseParallel() if style == "colwise" else RowwiseParallel(output_layouts=seq)
        )
    return plan


def builtin_tp_plan(
    num_layers: int, *, sequence_parallel: bool = False, moe_layers: frozenset[int] = frozenset()
) -> dict:
    """Megatron-style TP of the built-in model: QKV and MLP-in column-wise, outputs row-wise;
    with sequence parallelism the two norms of each block on sequence shards (plan_styles).
    The MLP of a layer in ``moe_layers`` (a mixture of experts') is left whole on every TP rank:
    its experts are split by expert parallelism instead (torchtitan removed expert TP)."""
    names: dict[str, str] = {}
    norms, regions = [], {}
    for i in range(num_layers):
        block = f"layers.{i}"
        names.update({f"{block}.attention.{w}": "colwise" for w in ("wq", "wk", "wv")})
        names[f"{block}.attention.wo"] = "rowwise"
        if i not in moe_layers:
            names.update({f"{block}.feed_forward.{w}": "colwise" for w in ("w1", "w3")})
            names[f"{block}.feed_forward.w2"] = "rowwise"
        norms += [f"{block}.attention_norm", f"{block}.ffn_norm"]
        regions.update({f"{block}.attention": None, f"{block}.feed_forward": None})
    return plan_styles(
        names, sequence_parallel=sequence_parallel, norms=tuple(norms), regions=regions
    )


def synthetic_batch(
    step: int, *, seed: int, batch_size: int, seq_len: int, vocab_size: int
) -> Batch:
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


def build_builtin(
    spec: WorkloadSpec,
    *,
    attention: str = "sdpa",
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> Workload:
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
        return synthetic_batch(
            step,
            seed=seed,
            batch_size=spec.global_batch_size,
            seq_len=spec.seq_len,
            vocab_size=vocab,
        )

    def split(m: nn.Module, stage: int, num_stages: int) -> nn.Module:
        return split_for_pipeline(m, stage, num_stages)

    moe = frozenset(
        i for i in range(shape.num_layers) if shape.moe is not None and shape.moe.is_moe_layer(i)
    )
    return Workload(
        model=model,
        batch=batch,
        tp_plan=builtin_tp_plan(shape.num_layers, moe_layers=moe),
        sp_plan=None if moe else builtin_tp_plan(shape.num_layers, sequence_parallel=True),
        pipeline_split=split,
        blocks=transformer_blocks,
        num_heads=shape.num_heads,
        num_layers=shape.num_layers,
    )
