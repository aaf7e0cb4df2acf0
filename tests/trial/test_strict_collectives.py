"""The strict collective checker (``autotune/trial/strict_collectives.py``): each rule fires on
a planted violation that gloo alone runs (or hangs on) without a word, and the right call of
the same shape passes.

Two gloo ranks (``spawn.run_ranks``), the checker installed in each; one spawn runs the
collective and group scenarios, one the point-to-point ones (each on a group of its own, so
that a scenario's unmatched side messages cannot reach the next). Every scenario reports what
each rank raised (the message's start) or "ok".
"""

from __future__ import annotations

import os

import pytest
from spawn import run_ranks

STRICT_P2P_TIMEOUT_S = "3"


def _outcome(fn) -> str:
    from autotune.trial.strict_collectives import StrictCollectiveError

    try:
        fn()
    except StrictCollectiveError as e:
        return f"raised: {e}"
    return "ok"


def _collective_scenarios(rank: int) -> dict[str, str]:
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch.distributed import distributed_c10d as c10d

    from autotune.trial import strict_collectives

    strict_collectives.install()
    world = dist.group.WORLD
    strided = torch.arange(8.0).reshape(2, 4).t()  # (4, 2), not contiguous
    out = {}
    out["contiguous_reduce_scatter"] = _outcome(
        lambda: dist.reduce_scatter_tensor(torch.empty(4), strided.contiguous().flatten())
    )
    out["strided_reduce_scatter"] = _outcome(
        lambda: dist.reduce_scatter_tensor(torch.empty(2, 2), strided)
    )
    dtype = torch.float32 if rank == 0 else torch.float64
    out["dtype_all_reduce"] = _outcome(lambda: dist.all_reduce(torch.ones(4, dtype=dtype)))
    n = 3 if rank == 0 else 4
    out["shape_all_gather"] = _outcome(
        lambda: dist.all_gather_into_tensor(torch.empty(2 * n), torch.ones(n))
    )
    out["same_all_gather"] = _outcome(
        lambda: dist.all_gather_into_tensor(torch.empty(8), torch.ones(4))
    )
    # rank 1 expects both rows from rank 0, which sends it one
    outs = [1, 1] if rank == 0 else [2, 0]
    out["splits_all_to_all"] = _outcome(
        lambda: dist.all_to_all_single(torch.empty(2), torch.ones(2), outs, [1, 1])
    )
    # expert parallelism's dispatch: uneven splits that agree pass; a strided input or a
    # dtype that differs across the ranks does not
    sends, gets = ([3, 1], [3, 2]) if rank == 0 else ([2, 2], [1, 2])
    out["uneven_all_to_all"] = _outcome(
        lambda: dist.all_to_all_single(torch.empty(sum(gets), 2), torch.ones(4, 2), gets, sends)
    )
    out["strided_all_to_all"] = _outcome(
        lambda: dist.all_to_all_single(torch.empty(4, 2), strided, [2, 2], [2, 2])
    )
    out["dtype_all_to_all"] = _outcome(
        lambda: dist.all_to_all_single(torch.empty(2, dtype=dtype), torch.ones(2, dtype=dtype))
    )
    out["functional_strided"] = _outcome(lambda: funcol.all_reduce(strided, "sum", world))
    shape = (2, 2) if rank == 0 else (2, 3)
    out["functional_shape"] = _outcome(
        lambda: funcol.all_gather_single(torch.ones(shape), 0, world).wait()
    )
    out["object_on_trial_group"] = _outcome(lambda: dist.all_gather_object([None, None], rank))
    side = dist.new_group(backend="gloo")
    out["object_on_gloo_side_group"] = _outcome(
        lambda: dist.all_gather_object([None, None], rank, group=side)
    )
    out["group_on_some_ranks"] = _outcome(lambda: dist.new_group([0] if rank == 0 else [0, 1]))
    out["cp_backward_at_micro_batch_1"] = _outcome(lambda: _cp_backward(rank, out))
    if rank == 0:  # as if rank 0 had made a group the others did not (a group name spent)
        c10d._world.group_count += 1
    out["group_name_differs"] = _outcome(lambda: dist.new_group([0, 1]))
    return out


def _cp_backward(rank: int, out: dict) -> None:
    """Context parallelism's K/V all-gather and its backward's reduce-scatter at micro-batch 1
    with 2 heads (``models/context_parallel.py``), each rank weighting the gathered sequence by
    (rank + 1) · w: rank r's gradient is (1 + 2) · w over its own sequence block."""
    import torch
    import torch.distributed as dist

    from autotune.trial.models.context_parallel import ContextParallel, gather_sequence

    b, h, s, d = 1, 2, 4, 3
    cp = ContextParallel(group=dist.group.WORLD, degree=2, rank=rank, seq_len=2 * s)
    x = torch.randn(b, h, s, d, requires_grad=True)
    w = torch.arange(b * h * 2 * s * d, dtype=torch.float32).reshape(b, h, 2 * s, d)
    (gather_sequence(x, cp) * (rank + 1) * w).sum().backward()
    expected = 3 * w[:, :, rank * s : (rank + 1) * s]
    out["cp_gradient_error"] = str(float((x.grad - expected).abs().max()))


@pytest.fixture(scope="module")
def collective_outcomes() -> list[dict[str, str]]:
    return run_ranks(2, _collective_scenarios)


@pytest.mark.slow
@pytest.mark.parametrize(
    "scenario, message",
    [
        ("strided_reduce_scatter", "non-contiguous tensor"),
        ("dtype_all_reduce", "all_reduce on group"),
        ("shape_all_gather", "all_gather_into_tensor on group"),
        ("splits_all_to_all", "expects 2 elements from rank 0, which sends it 1"),
        ("strided_all_to_all", "non-contiguous tensor"),
        ("dtype_all_to_all", "all_to_all_single on group"),
        ("functional_strided", "functional all_reduce on group"),
        ("functional_shape", "functional all_gather_single on group"),
        ("object_on_trial_group", "all_gather_object on group"),
        ("group_on_some_ranks", "new_group #"),
        ("group_name_differs", "would be named"),
    ],
)
def test_rule_fires_on_its_planted_violation(collective_outcomes, scenario, message):
    """Every rank raises, before the call reaches gloo (so the group stays usable)."""
    outcomes = [ranks[scenario] for ranks in collective_outcomes]
    if scenario == "splits_all_to_all":  # both ranks see the table; rank 1's row is wrong
        assert all(o.startswith("raised") for o in outcomes), outcomes
        assert message in outcomes[0] and message in outcomes[1]
        return
    local = ("strided_reduce_scatter", "strided_all_to_all", "functional_strided")
    if scenario in (*local, "object_on_trial_group"):
        assert all(message in o for o in outcomes), outcomes  # a local rule: each rank
        return
    assert all(o.startswith("raised") and message in o for o in outcomes), outcomes


@pytest.mark.slow
@pytest.mark.parametrize(
    "scenario",
    [
        "contiguous_reduce_scatter",
        "same_all_gather",
        "uneven_all_to_all",
        "object_on_gloo_side_group",
    ],
)
def test_right_call_passes(collective_outcomes, scenario):
    assert [ranks[scenario] for ranks in collective_outcomes] == ["ok", "ok"]


@pytest.mark.slow
def test_cp_backward_reduce_scatters_a_contiguous_buffer(collective_outcomes):
    """At micro-batch 1 CP's backward once handed reduce_scatter_tensor a strided view (gloo
    sums it right, NCCL wrong): the strict checker passes it now, and the gradient is the sum
    over the cp ranks computed by hand."""
    assert [r["cp_backward_at_micro_batch_1"] for r in collective_outcomes] == ["ok", "ok"]
    assert [float(r["cp_gradient_error"]) for r in collective_outcomes] == [0.0, 0.0]


def _p2p_scenarios(rank: int) -> dict[str, str]:
    import torch
    import torch.distributed as dist

    from autotune.trial import strict_collectives

    os.environ[strict_collectives.P2P_TIMEOUT_ENV_VAR] = STRICT_P2P_TIMEOUT_S
    strict_collectives.install()
    peer = 1 - rank
    out = {}
    group = dist.new_group([0, 1])

    def ordered():  # rank 0 sends first, rank 1 receives first: NCCL runs it
        x = torch.ones(4)
        for step in ("send", "recv") if rank == 0 else ("recv", "send"):
            getattr(dist, step)(x, peer, group=group)

    out["ordered_send_recv"] = _outcome(ordered)

    def batched():  # both send first, but grouped: NCCL runs it
        ops = [
            dist.P2POp(dist.isend, torch.ones(4), peer, group),
            dist.P2POp(dist.irecv, torch.empty(4), peer, group),
        ]
        for work in dist.batch_isend_irecv(ops):
            work.wait()

    out["batched_both_send_first"] = _outcome(batched)
    out["recv_without_src"] = _outcome(lambda: dist.recv(torch.empty(4), group=group))
    group = dist.new_group([0, 1])

    def both_send_first():  # NCCL: each send kernel waits for a recv that never starts
        dist.send(torch.ones(4), peer, group=group)
        dist.recv(torch.empty(4), peer, group=group)

    out["both_send_first"] = _outcome(both_send_first)
    group = dist.new_group([0, 1])

    def wrong_dtype():  # the same 16 bytes: gloo delivers them, reinterpreted
        if rank == 0:
            dist.isend(torch.ones(4), 1, group=group)
        else:
            dist.irecv(torch.empty(4, dtype=torch.int32), 0, group=group).wait()

    out["recv_of_another_dtype"] = _outcome(wrong_dtype)
    return out


@pytest.fixture(scope="module")
def p2p_outcomes() -> list[dict[str, str]]:
    return run_ranks(2, _p2p_scenarios)


@pytest.mark.slow
def test_point_to_point_rules(p2p_outcomes):
    r0, r1 = p2p_outcomes
    assert r0["ordered_send_recv"] == r1["ordered_send_recv"] == "ok"
    assert r0["batched_both_send_first"] == r1["batched_both_send_first"] == "ok"
    assert "no any-source receive" in r0["recv_without_src"]
    assert "no any-source receive" in r1["recv_without_src"]
    for outcome in (r0["both_send_first"], r1["both_send_first"]):
        assert "did not reach the matching recv within 3 s; NCCL deadlocks" in outcome
    assert r0["recv_of_another_dtype"] == "ok"  # the sender cannot tell; its peer raises
    assert "expects 4 elements of torch.int32" in r1["recv_of_another_dtype"]
