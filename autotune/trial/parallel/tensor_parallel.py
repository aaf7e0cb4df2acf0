"""Tensor parallelism: torch's ``parallelize_module`` with the workload's plan on the tp dim.

With sequence parallelism (the workload's ``sp_plan``, ``workload.plan_styles``) the residual
stream between the TP regions is each rank's shard of the sequence. A stage's first block
takes its shard of the (replicated) stage input, a local slice; its last block all-gathers
the sequence again, so the embeddings, the final norm, the output head, the loss and the
pipeline's send/recv see the same full tensors as without SP. (torchtitan also shards the
final norm and the vocabulary-parallel head, and Megatron sends sequence-sharded activations
between pipeline stages; the head is not tensor-parallel here, so it needs the whole sequence.)
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    PrepareModuleInput,
    PrepareModuleOutput,
    parallelize_module,
)


def apply_tp(
    model: nn.Module,
    tp_mesh: DeviceMesh,
    plan: dict,
    sequence_blocks: Callable[[nn.Module], list[tuple[str, nn.Module]]] | None = None,
) -> nn.Module:
    """Shard the plan's submodules that exist in ``model`` (a pipeline stage holds only some).
    ``sequence_blocks`` (the workload's ``blocks``, given with a sequence-parallel plan) names
    the blocks whose residual stream is sequence-sharded."""
    present = {}
    for path, style in plan.items():
        try:
            model.get_submodule(path)
        except AttributeError:
            continue
        present[path] = style
    model = parallelize_module(model, tp_mesh, present)
    blocks = sequence_blocks(model) if sequence_blocks is not None else []
    if blocks:
        seq = Shard(1)
        parallelize_module(
            blocks[0][1],
            tp_mesh,
            PrepareModuleInput(
                input_layouts=(Replicate(),), desired_input_layouts=(seq,), use_local_output=True
            ),
        )
        parallelize_module(
            blocks[-1][1],
            tp_mesh,
            PrepareModuleOutput(
                output_layouts=(seq,), desired_output_layouts=(Replicate(),), use_local_output=True
            ),
        )
    return model
