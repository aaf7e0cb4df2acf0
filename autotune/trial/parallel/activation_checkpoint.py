"""Activation checkpointing: full (whole blocks recomputed), op or selective.

- **selective** follows Korthikanti et al. 2022 §4: recompute only QKᵀ/softmax/·V, whose
  activations (5as²b per layer) dominate at long sequences while costing few FLOPs to redo. The
  built-in model does this by checkpointing its attention core; a user workload gets torch's
  op-level selective checkpointing per block that keeps every matmul output and recomputes the
  rest.
- **op** is torchtitan's op-level selective checkpointing (``_apply_op_sac``,
  torchtitan/distributed/activation_checkpoint.py): per block, the outputs of SDPA, of the
  collectives and of every other matmul (the 1st, 3rd, … mm/addmm of the block: wq, wv, w1, w2
  in a Llama block) are kept, everything else is recomputed in backward.
- **full** wraps whole blocks; ``ac_layers`` wraps only the first that many blocks of each
  pipeline stage (Megatron's ``--recompute-num-layers`` with ``--recompute-method block``).
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


_OP_MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default}
"""The matmuls op mode counts; every second one is recomputed (torchtitan counts aten.mm, its
Linears have no bias: addmm is the same matmul with one)."""
_OP_SAVED = {
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
    torch.ops._c10d_functional.reduce_scatter_tensor.default,
    torch.ops._c10d_functional.all_reduce.default,
    torch.ops.aten.max.default,
}
"""torchtitan's ``_save_list`` (its SDPA kernels, the reduce-scatter of sequence parallelism,
max for float8 scales), plus SDPA's CPU kernel and TP's all-reduce: a recomputed collective
would run again in backward."""


def _op_policy(counts: dict[str, int]) -> Callable[..., CheckpointPolicy]:
    """torchtitan's ``_custom_policy``: forward and recomputation count matmuls separately, so
    both keep the same ones."""

    def policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
        key = "recompute" if ctx.is_recompute else "forward"
        if op in _OP_MATMULS:
            counts[key] += 1
            return (
                CheckpointPolicy.MUST_SAVE
                if counts[key] % 2 == 1
                else CheckpointPolicy.PREFER_RECOMPUTE
            )
        return CheckpointPolicy.MUST_SAVE if op in _OP_SAVED else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def _op_context():
    return create_selective_checkpoint_contexts(_op_policy({"forward": 0, "recompute": 0}))


def _wrap(block: nn.Module, mode: str) -> nn.Module:
    if mode == "selective":
        return checkpoint_wrapper(
            block, context_fn=partial(create_selective_checkpoint_contexts, _save_matmuls)
        )
    if mode == "op":
        return checkpoint_wrapper(block, context_fn=_op_context)
    return checkpoint_wrapper(block)


def apply_ac(
    model: nn.Module,
    mode: str,
    blocks: Callable[[nn.Module], list[tuple[str, nn.Module]]] | None,
    ac_layers: int | None = None,
) -> nn.Module:
    """Checkpoint ``model``'s blocks (the whole model without ``blocks``) in ``mode``; under
    full, only the first ``ac_layers`` blocks when it is given."""
    if mode == "none":
        return model
    if mode == "selective":
        attention = [m for m in model.modules() if isinstance(m, Attention)]
        if attention:
            for m in attention:
                m.selective_checkpoint_enabled = True
            return model
    named = blocks(model) if blocks else [("", model)]
    if mode == "full" and ac_layers is not None and blocks:
        named = named[:ac_layers]
    for name, block in named:
        wrapped = _wrap(block, mode)
        if name == "":
            return wrapped
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, wrapped)  # also right for ModuleDict / ModuleList children
    return model
