"""Compiled trials in a warm worker do not inherit earlier trials' dynamo caches.

A worker group runs many layouts in one process. ``Module.compile`` compiles nn.Module's
shared ``_call_impl`` frame, so every trial's blocks add entries to one code object's cache;
without a reset, each new shape or dtype recompiles on top of the earlier trials' entries and,
past ``torch._dynamo.config.recompile_limit``, ``fullgraph=True`` raises
``FailOnRecompileLimitHit``. ``apply_compile`` resets dynamo at each compiled trial's start.

In one process, through ``apply_compile`` (the trial's compile path), more trials of distinct
shapes than the recompile limit allows; the eager backend (the graph capture and its guards
are dynamo's, whatever the backend) keeps each compile well under a second.
"""

from __future__ import annotations

import pytest
import torch

from autotune.config import WorkloadSpec
from autotune.trial.models.build import build_workload
from autotune.trial.parallel import compile as trial_compile

RECOMPILE_LIMIT = 2
"""Lowered from torch's 8, so that a few tiny trials cross it."""
TRIALS = [(1, 8), (2, 8), (2, 16), (4, 16), (1, 32)]
"""(micro-batch, sequence length) of each trial: five shapes, more than the limit's worth."""


@pytest.fixture
def eager_compile(monkeypatch):
    """``Module.compile`` with the eager backend, and a recompile limit of RECOMPILE_LIMIT."""
    compile_module = torch.nn.Module.compile

    def eager(self, *args, **kwargs):
        return compile_module(self, *args, backend="eager", **kwargs)

    monkeypatch.setattr(torch.nn.Module, "compile", eager)
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", RECOMPILE_LIMIT)
    monkeypatch.setattr(torch._dynamo.config, "automatic_dynamic_shapes", False)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _trial(batch: int, seq_len: int) -> float:
    """One warm-worker trial: a new tiny model, compiled by block, one forward and backward."""
    spec = WorkloadSpec(seq_len=seq_len, global_batch_size=batch)
    workload = build_workload(spec, attention="eager", seed=0)
    model = trial_compile.apply_compile(workload.model, workload.blocks)
    inputs, targets = workload.batch(0)
    loss = workload.loss_fn(model(inputs), targets)
    loss.backward()
    return loss.item()


def test_compiled_trials_past_the_recompile_limit_do_not_raise(eager_compile):
    losses = [_trial(b, s) for b, s in TRIALS]
    assert len(losses) == len(TRIALS)
    assert all(torch.isfinite(torch.tensor(losses)))


def test_each_compiled_trial_starts_from_a_reset_dynamo(eager_compile, monkeypatch):
    """The reset runs once per ``apply_compile``, before the blocks are compiled."""
    calls = []
    reset = torch._dynamo.reset
    monkeypatch.setattr(torch._dynamo, "reset", lambda: (calls.append("reset"), reset())[1])
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    trial_compile.apply_compile(model, lambda m: list(m.named_children()))
    trial_compile.apply_compile(model, None)
    assert calls == ["reset", "reset"]
