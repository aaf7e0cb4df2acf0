"""Sequence parallelism moves the bytes tensor parallelism's all-reduces moved (Korthikanti et
al. 2022, §4.2.2: an all-reduce is a reduce-scatter followed by an all-gather).

Every collective each rank issues in one forward and one backward of the tiny GPT (4 blocks) at
tp 4 is recorded by a dispatch mode, with its input's bytes; the wire bytes follow the ring
algorithms (nccl-tests' "algorithm bandwidth" accounting, per rank): all-reduce 2(t−1)/t · S,
all-gather (t−1) · S_in (S_in the local shard), reduce-scatter (t−1)/t · S_in. With S the
activation b·s·h·4 bytes:

- TP forward: one all-reduce after each block's attention and MLP, 2 per block;
- SP forward: a reduce-scatter and an all-gather in their place (4 per block), plus the
  all-gather of the sequence after each stage's last block (``tensor_parallel.apply_tp``);
- SP backward: the same again (the gradient of an all-gather is a reduce-scatter and vice
  versa; the first block's sequence slice gathers its gradient);
- TP backward all-reduces each column-parallel input's gradient on its own: q, k, v and the MLP
  input, 4 per GPT block (Megatron fuses QKV: 2; ``perf_model``'s ``backward_inputs``), so
  with SP this engine's backward moves half of what its TP moves.
The losses SP trains are compared with the single-process reference in test_layouts.py
(and its negative control, a missing reduce-scatter, there).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from spawn import run_ranks
from torch.utils._python_dispatch import TorchDispatchMode

from autotune.config import TrialConfig, WorkloadSpec

TP = 4
LAYERS = 4
SPEC = WorkloadSpec(family="gpt", size="tiny", seq_len=64, global_batch_size=8)
S = 8 * 64 * 64 * 4  # b·s·h fp32 bytes of the tiny GPT's activation (hidden 64)
KINDS = {"all_reduce": "AR", "all_gather_into_tensor": "AG", "reduce_scatter_tensor": "RS"}


class _Collectives(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kind = KINDS.get(func.__name__.split(".")[0])
        if func.namespace == "_c10d_functional" and kind:
            self.calls.append((kind, args[0].numel() * args[0].element_size()))
        return func(*args, **(kwargs or {}))


def _record(rank: int, configs: list[TrialConfig]) -> list[dict[str, list]]:
    from autotune.trial.models.build import build_workload
    from autotune.trial.parallel.mesh import build_mesh
    from autotune.trial.parallel.parallelize import parallelize

    out = []
    for config in configs:
        workload = build_workload(config.workload)
        pm = parallelize(workload, config, build_mesh(config, "cpu"), torch.device("cpu"))
        inputs, targets = workload.batch(0)
        forward, backward = _Collectives(), _Collectives()
        with forward:
            loss = workload.loss_fn(pm.parts[0](inputs), targets)
        with backward:
            loss.backward()
        out.append({"forward": forward.calls, "backward": backward.calls})
    return out


def _wire(calls: list[tuple[str, int]]) -> float:
    per_rank = {"AR": 2 * (TP - 1) / TP, "AG": TP - 1, "RS": (TP - 1) / TP}
    return sum(per_rank[kind] * size for kind, size in calls)


@pytest.fixture(scope="module")
def recorded():
    base = TrialConfig(
        workload=SPEC,
        world_size=TP,
        tp_degree=TP,
        micro_batch_size=8,
        device="cpu",
        precision="32-true",
    )
    tp, sp = run_ranks(TP, _record, [base, dataclasses.replace(base, sequence_parallel=True)])[0]
    return tp, sp


@pytest.mark.slow
def test_sequence_parallel_moves_the_bytes_of_the_all_reduces(recorded):
    tp, sp = recorded
    gather = (TP - 1) / TP * S  # the sequence gathered after the last block (or its gradient)
    assert tp["forward"] == [("AR", S)] * (2 * LAYERS)
    assert sorted(sp["forward"]) == sorted(
        [("AG", S // TP)] * (2 * LAYERS + 1) + [("RS", S)] * (2 * LAYERS)
    )
    assert _wire(sp["forward"]) - gather == _wire(tp["forward"]) == 2 * LAYERS * 1.5 * S
    assert sorted(sp["backward"]) == sorted(sp["forward"])
    assert sorted(tp["backward"]) == [("AR", S)] * (4 * LAYERS)  # q, k, v, w1 apart
    assert _wire(sp["backward"]) - gather == _wire(tp["backward"]) / 2


def test_a_workload_without_a_sequence_parallel_plan_is_refused_in_one_line():
    from autotune.errors import ConfigError
    from autotune.trial.models.build import build_workload
    from autotune.trial.parallel.parallelize import check_workload_supports

    spec = WorkloadSpec(workload="user_workload:build", seq_len=16, global_batch_size=4)
    config = TrialConfig(
        workload=spec,
        world_size=2,
        tp_degree=2,
        sequence_parallel=True,
        micro_batch_size=4,
        device="cpu",
    )
    workload = build_workload(spec)
    assert workload.tp_plan and workload.sp_plan is None  # TP, but no SP plan
    with pytest.raises(ConfigError, match="provides no sp_plan .*turn sequence_parallel off"):
        check_workload_supports(config, workload)
