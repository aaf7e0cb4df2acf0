"""``profiler.record`` around a plain user training loop (no autotune): a two-rank DDP loop's
all-reduce payload per step equals its gradient bytes, and every step is marked."""

from __future__ import annotations

import torch


def _ddp_loop(rank: int) -> list:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import profiler

    torch.manual_seed(0)
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 32)
    for _ in range(2):  # DDP rebuilds its buckets in its second iteration; profile after
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
    with profiler.record(rank=dist.get_rank()) as rec:
        for i in range(3):
            with rec.step(i):
                with rec.phase("forward"):
                    loss = model(x).sum()
                with rec.phase("backward"):
                    loss.backward()
                opt.step()
                opt.zero_grad()
    return rec.spans


def test_record_around_a_user_ddp_loop():
    from spawn import run_ranks

    from profiler import COMM, STEP, breakdown, bytes_per_step

    spans_by_rank = run_ranks(2, _ddp_loop)
    grad_bytes = 4 * (32 * 64 + 64 + 64 * 8 + 8)
    for rank, spans in enumerate(spans_by_rank):
        assert {s.rank for s in spans} == {rank}
        assert sorted(s.step for s in spans if s.kind == STEP) == [0, 1, 2]
        assert bytes_per_step(spans)[rank] == {("comm", "all_reduce", ""): grad_bytes}
        assert all(s.step in (0, 1, 2) for s in spans if s.kind == COMM)
        (b,) = breakdown(spans)
        assert b.compute_ns > 0 and b.comm_ns > 0 and b.num_steps == 3
        categories = {s.category for s in spans if s.kind == "compute"}
        assert {"forward", "backward"} <= categories
