"""Regional compilation: ``torch.compile`` of each transformer block, as torchtitan's
``apply_compile`` does (``torchtitan/distributed/compile.py``: ``block.compile(fullgraph=True)``
for each of ``model.layers``).

Compiling the repeated block instead of the whole model compiles one graph that every block
reuses (parameters are graph inputs), keeps the module tree and its parameter names as they are
(``Module.compile`` compiles in place, unlike ``torch.compile(module)``'s ``_orig_mod`` wrapper),
and leaves the collectives of FSDP and DDP, which act around the blocks, out of the graph. It
runs after tensor parallelism and activation checkpointing (the block compiled is the
checkpoint wrapper, so recomputation replays the compiled code) and before ZeRO, torchtitan's
order.

A warm worker group runs many trials in one process, and ``Module.compile`` compiles the
``_call_impl`` frame that every module shares: each trial's new shapes, dtypes and wrappers
would add cache entries on top of the earlier trials' ones, until ``fullgraph=True`` raises
``FailOnRecompileLimitHit`` past ``torch._dynamo.config.recompile_limit`` (8), and a trial's
compile time would depend on the trials before it. So :func:`apply_compile` resets dynamo
first: every compiled trial compiles from an empty cache, as in a fresh process.

Compilation is lazy: the first forward and backward of a block trace and compile it. The runner
therefore takes the first warm-up step's excess over the timed steps as the compile time
(``compile_seconds``), the trial's setup cost, never part of its step time.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch
from torch import nn

from autotune.config import TrialConfig
from autotune.errors import ConfigError


def check_compile(config: TrialConfig) -> None:
    """The first step compiles: it must be a warm-up step, so that no timed step does."""
    if config.compile and config.num_warmup_steps < 1:
        raise ConfigError(
            "compile needs num_warmup_steps ≥ 1: the first step compiles the "
            "blocks and must not be timed; raise num_warmup_steps"
        )


def apply_compile(
    model: nn.Module, blocks: Callable[[nn.Module], list[tuple[str, nn.Module]]] | None
) -> nn.Module:
    """Compile each block in place with ``fullgraph=True``; a workload that names no blocks is
    compiled whole, graph breaks allowed (its forward is not known to be one graph). Dynamo's
    caches are reset first (the earlier trials' compiled code; compilation is lazy, so a
    part compiled earlier in the same trial has compiled nothing yet)."""
    torch._dynamo.reset()
    if blocks is None:
        model.compile()
        return model
    for _, block in blocks(model):
        block.compile(fullgraph=True)
    return model


def compile_seconds(step_times: list[float], num_warmup: int, num_timed: int) -> float:
    """Seconds the first (warm-up) step took beyond a timed step: the compilation it ran."""
    timed = step_times[num_warmup : num_warmup + num_timed]
    return max(0.0, step_times[0] - statistics.median(timed)) if timed else step_times[0]
