"""Activation checkpointing: full (whole block recomputed) or selective (attention core).

Selective follows Korthikanti et al. 2022 §4: recompute only QKᵀ/softmax/·V, whose activations
(5as²b per layer) dominate at long sequences while costing few FLOPs to redo. The built-in model
does this by checkpointing its attention core; a user workload gets torch's op-level selective
checkpointing per block that keeps every matmul output and recomputes the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from autotune.trial.models.transformer import Attention

_SAVED_OPS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default}


def _save_matmuls(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in _SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def apply_ac(model: nn.Module, mode: str,
             blocks: Callable[[nn.Module], list[tuple[str, nn.Module]]] | None) -> nn.Module:
    if mode == "none":
        return model
    if mode == "selective":
        attention = [m for m in model.modules() if isinstance(m, Attention)]
        if attention:
            for m in attention:
                m.selective_checkpoint_enabled = True
            return model
    named = blocks(model) if blocks else [("", model)]
    for name, block in named:
        if mode == "selective":
            wrapped = checkpoint_wrapper(
                block, context_fn=partial(create_selective_checkpoint_contexts, _save_matmuls))
        else:
            wrapped = checkpoint_wrapper(block)
        if name == "":
            return wrapped
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, wrapped)  # also right for ModuleDict / ModuleList children
    return model
