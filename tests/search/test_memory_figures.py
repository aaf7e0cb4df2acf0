"""Memory figures (issue 23, defect 8): the allocator's reserved peak is measured beside the
allocated peak and stored per rank, with the memory outside the allocator a rank reports; the
search judges a measured trial on reserved + outside, not on the allocated bytes alone; and the
screen's margin on CUDA follows from the allowances ``screen.ALLOWANCES`` documents.

No GPU here: the CUDA path of ``measure_memory`` runs on stand-ins for ``torch.cuda``'s
allocator statistics; the search runs on an executor that returns a hand-built result."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from autotune.config import GIB, TrialConfig
from autotune.search import screen
from autotune.search.search import Search, SearchSpec
from autotune.study.leaderboard import build_leaderboard
from autotune.study.store import to_record
from autotune.trial import runner
from autotune.trial.result import MemoryBreakdown, RankResult, TrialResult
from db import Database

MIB = 2**20


def _trainer(device: str, step):
    """What ``measure_memory`` reads of a Trainer: its model parts, optimizer, device, step."""
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(2, 64)).sum().backward()
    optimizer.step()  # the AdamW state exists, as after the timed steps
    return SimpleNamespace(
        pm=SimpleNamespace(parts=[model], dp=SimpleNamespace(optimizer=optimizer)),
        device=torch.device(device),
        step=step,
    )


def test_cuda_memory_step_keeps_the_reserved_peak_beside_the_allocated(monkeypatch):
    # torch.cuda's allocator statistics, as a step that allocated up to 300 MiB out of a
    # reserve that grew to 420 MiB would leave them.
    allocated, reserved = 300 * MIB, 420 * MIB
    calls = []
    for name, value in (
        ("synchronize", None),
        ("memory_allocated", 100 * MIB),
        ("reset_peak_memory_stats", None),
        ("max_memory_allocated", allocated),
        ("max_memory_reserved", reserved),
    ):
        monkeypatch.setattr(torch.cuda, name, lambda *a, _n=name, _v=value: calls.append(_n) or _v)
    memory, _ = runner.measure_memory(_trainer("cuda", lambda step, on_grads: on_grads()), 0)
    assert (memory.peak, memory.reserved_peak, memory.source) == (
        allocated,
        reserved,
        "cuda_allocator",
    )
    # Both peaks are read after the step, from statistics reset before it.
    assert calls.index("reset_peak_memory_stats") < calls.index("max_memory_reserved")


def test_cpu_memory_step_stores_reserved_equal_to_allocated():
    def step(step, on_grads):
        on_grads()
        held = torch.ones(1 << 18)  # 1 MiB alive at the step's peak
        return held.sum()

    memory, _ = runner.measure_memory(_trainer("cpu", step), 0)
    assert memory.source == "cpu_profiler" and memory.peak >= 1 * MIB
    assert memory.reserved_peak == memory.peak


# ---- a hand-built trial --------------------------------------------------------------------
CONFIG = TrialConfig(
    world_size=2, num_warmup_steps=1, num_timed_steps=2, num_profiled_steps=0, device="cpu"
).with_precision("cpu")


def _result(config: TrialConfig, peaks: list[tuple[int, int | None, int | None]]) -> TrialResult:
    """A measured trial whose rank r has (allocated, reserved, outside-the-allocator) peaks[r]."""
    steps = config.num_warmup_steps + config.num_timed_steps + config.num_profiled_steps + 1
    ranks = [
        RankResult(
            rank=r,
            pp_rank=0,
            dp_rank=r,
            tp_rank=0,
            device="cuda",
            backend="nccl",
            num_threads=1,
            step_times=[0.5] * steps,
            losses=[1.0] * steps,
            memory=MemoryBreakdown(
                10, 20, 30, 40, 0, allocated, "cuda_allocator", reserved_peak=reserved
            ),
            setup_s=0.0,
            extra={} if outside is None else {"non_allocator_bytes": outside},
        )
        for r, (allocated, reserved, outside) in enumerate(peaks)
    ]
    return TrialResult(
        config=config.resolved(),
        step_time_s=0.5,
        throughput_tokens_per_s=config.tokens_per_step / 0.5,
        losses=[1.0] * steps,
        ranks=ranks,
        wall_s=3.0,
        steps_s=2.0,
        cold_start=False,
    )


def test_stored_trial_keeps_both_peaks_per_rank(db_url):
    result = _result(CONFIG, [(3 * GIB, 4 * GIB, GIB // 2), (5 * GIB, 6 * GIB, GIB)])
    database = Database.open(db_url)
    try:
        record, spans = to_record(result)
        stored = database.get_trial(database.add_trial(record, spans))
    finally:
        database.close()
    measured = {(m.rank, m.category): m.measured_bytes for m in stored.memory}
    for rank, (allocated, reserved, outside) in enumerate([(3, 4, 0.5), (5, 6, 1)]):
        assert measured[(rank, "peak")] == allocated * GIB
        assert measured[(rank, "peak_reserved")] == reserved * GIB
        assert measured[(rank, "outside_allocator")] == int(outside * GIB)
    assert stored.metrics["peak_memory_bytes"] == 5 * GIB
    assert stored.metrics["peak_reserved_bytes"] == 6 * GIB
    assert stored.metrics["device_peak_bytes"] == 7 * GIB  # rank 1: 6 reserved + 1 outside


def test_a_figure_not_measured_gets_no_row_and_old_trials_read_back(tmp_path):
    # CPU: nothing reported outside the allocator, so no row for it.
    result = _result(CONFIG, [(3 * GIB, 3 * GIB, None), (2 * GIB, 2 * GIB, None)])
    record, _ = to_record(result, study_id=None)
    assert {m.category for m in record.memory} >= {"peak", "peak_reserved"}
    assert "outside_allocator" not in {m.category for m in record.memory}
    assert record.metrics["device_peak_bytes"] == 3 * GIB
    # A trial stored before reserved peaks were kept: no such rows, no such metrics. The
    # leaderboard reads it with no device peak; the allocated one stands.
    database = Database.open(f"sqlite:///{tmp_path / 'old.db'}")
    study = database.create_study("old", {})
    old = dataclasses.replace(
        record,
        study_id=study.id,
        number=0,
        memory=tuple(m for m in record.memory if m.category != "peak_reserved"),
        metrics={
            k: v
            for k, v in record.metrics.items()
            if k not in ("peak_reserved_bytes", "device_peak_bytes")
        },
    )
    database.add_trial(old)
    (entry,) = build_leaderboard(database.list_trials(study.id))
    database.close()
    assert (entry.measured_peak, entry.device_peak) == (3 * GIB, None)


# ---- the measured verdict ------------------------------------------------------------------
class FixedExecutor:
    """Returns the same hand-built result for every configuration it is given."""

    def __init__(self, peaks) -> None:
        self.peaks, self.runs = peaks, []

    def run(self, config: TrialConfig) -> TrialResult:
        self.runs.append(config)
        return _result(config, self.peaks)


def _search(tmp_path, limit_gib: float, peaks) -> list:
    """The trials of a one-configuration search under ``limit_gib`` whose every run measures
    ``peaks`` (as ``_result``)."""
    spec = SearchSpec(
        world_size=2,
        n_trials=1,
        patience=None,
        device="cpu",
        num_warmup_steps=1,
        num_timed_steps=2,
        num_profiled_steps=0,
        top_k=1,
        remeasure_repeats=1,
        remeasure_max_repeats=1,
        study_name="verdict",
        memory_limit_gib=limit_gib,
        fixed={
            "tp_degree": 1,
            "pp_degree": 1,
            "zero_stage": 0,
            "overlap_enabled": True,
            "bucket_mb": 25.0,
            "activation_checkpointing": "none",
            "micro_batch_size": 1,
        },
    )
    database = Database.open(f"sqlite:///{tmp_path / 'search.db'}")
    try:
        outcome = Search.open(spec, database, FixedExecutor(peaks), out=None).run()
        return database.list_trials(outcome.study_id)
    finally:
        database.close()


def test_allocated_fits_but_reserved_plus_outside_does_not_is_infeasible(tmp_path):
    # The limit: 10 GiB. Every rank's tensors fit (8 GiB allocated), but the allocator holds
    # 9.5 GiB from the device and 1 GiB lies outside it on rank 1: 10.5 GiB > 10 GiB.
    (trial,) = _search(tmp_path, 10, [(8 * GIB, 9 * GIB, GIB // 2), (8 * GIB, 19 * GIB // 2, GIB)])
    assert trial.status == "infeasible_measured"
    assert trial.error == (
        "measured peak 10.5 GiB > limit 10 GiB (rank 1: allocated 8, "
        "reserved 9.5, outside the allocator 1 GiB)"
    )


def test_reserved_plus_outside_within_the_limit_is_complete(tmp_path):
    (trial,) = _search(tmp_path, 10, [(8 * GIB, 9 * GIB, GIB // 2), (8 * GIB, 9 * GIB, GIB)])
    assert trial.status == "complete" and trial.error is None
    assert trial.metrics["device_peak_bytes"] == 10 * GIB


# ---- the screen ----------------------------------------------------------------------------
def test_cpu_screen_is_todays_rule():
    """On CPU the screen is what it was: predicted × 1.15 within the limit, nothing added."""
    for predicted in (1, 12_345_678, 7 * GIB):
        assert screen.required_bytes(predicted, "cpu") == int(predicted * 1.15)
    limit = 10 * GIB
    at_the_edge = int(limit / 1.15)
    assert screen.predicted_to_fit(at_the_edge, limit, "cpu")
    assert not screen.predicted_to_fit(at_the_edge + 2, limit, "cpu")


def test_cuda_screen_adds_the_allocator_reserve_and_whats_outside_it():
    cuda = screen.ALLOWANCES["cuda"]
    predicted = 40 * GIB
    expected = predicted * (1 + cuda.model_margin) * cuda.fragmentation + cuda.outside_allocator
    assert screen.required_bytes(predicted, "cuda") == int(expected)
    # A prediction the CPU rule (× 1.15 alone) would run is screened out on CUDA when the
    # reserve and the memory outside the allocator take it over the limit.
    limit = int(predicted * 1.15) + 1
    assert screen.predicted_to_fit(predicted, limit, "cpu")
    assert not screen.predicted_to_fit(predicted, limit, "cuda")
    assert screen.predicted_to_fit(predicted, int(expected), "cuda")
    # The message names every allowance it added.
    words = cuda.describe()
    assert f"+{cuda.model_margin:.0%} margin" in words
    assert f"×{cuda.fragmentation:g} allocator reserve" in words
    assert f"+{cuda.outside_allocator / GIB:g} GiB outside the allocator" in words
    with pytest.raises(ValueError, match="no memory allowances for device type 'tpu'"):
        screen.allowance("tpu")


def test_an_engines_measured_allocator_is_not_counted_twice():
    """An engine estimate that already counts the allocator's reserve or the context
    (``MemoryTraits.fragmentation``, ``context_bytes``) gets the model margin alone for it;
    one that does not (None) gets the device's, as autotune's runtime's estimate does."""
    from autotune.model.engine_memory import DEEPSPEED, MEGATRON, TORCHTITAN

    cuda = screen.ALLOWANCES["cuda"]
    predicted = 60 * GIB
    margin = predicted * (1 + cuda.model_margin)
    # Megatron's allocator is unmeasured: its estimate is of the allocated bytes.
    assert screen.allowance("cuda", MEGATRON) == cuda
    # torchtitan runs with expandable segments (no reserve) and reports max reserved (no
    # context): the context is added, the reserve is not.
    assert screen.allowance("cuda", TORCHTITAN).required_bytes(predicted) == int(
        margin + cuda.outside_allocator
    )
    # DeepSpeed's figure is nvidia-smi's, measured on BigScience's sweep: reserve and context.
    assert DEEPSPEED.fragmentation > 1 and DEEPSPEED.context_bytes > 0
    rule = screen.allowance("cuda", DEEPSPEED)
    assert rule.required_bytes(predicted) == int(margin)
    assert rule.describe() == f"+{cuda.model_margin:.0%} margin"
    # 60 GiB × 1.15 = 69 GiB fits 70 GiB; with the device's reserve and context added again
    # it would need 77.4 GiB.
    assert screen.predicted_to_fit(predicted, 70 * GIB, "cuda", DEEPSPEED)
    assert not screen.predicted_to_fit(predicted, 70 * GIB, "cuda")


def test_the_dashboards_memory_figure_names_the_reserve_and_whats_outside(tmp_path):
    from dashboards.data import load_study
    from dashboards.figures import memory_spec

    _search(tmp_path, 10, [(8 * GIB, 9 * GIB, GIB // 2), (8 * GIB, 19 * GIB // 2, GIB)])
    database = Database.open(f"sqlite:///{tmp_path / 'search.db'}")
    try:
        study = load_study(database)
    finally:
        database.close()
    (trial,) = study.trials
    note = memory_spec(study, trial)["layout"]["title"]["subtitle"]["text"]
    # Both ranks peak at 8 GiB allocated; the figure shows rank 0 (ties: the lowest rank).
    assert f"reserved {9 * 1024:,.1f} MiB + outside the allocator {512:,.1f} MiB" in note


def test_a_trial_starts_from_an_emptied_cuda_cache(monkeypatch):
    # A warm worker's allocator keeps the blocks of the trials before: the reserved peak of a
    # small trial after a large one read the large one's (H200, docs/gpu-runs run 2). Each
    # trial hands them back before it builds anything.
    calls = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    runner.release_cached_blocks(torch.device("cuda", 0))
    assert calls == ["empty_cache"]
    runner.release_cached_blocks(torch.device("cpu"))
    assert calls == ["empty_cache"]


def test_run_rank_releases_the_cache_before_it_builds(monkeypatch):
    order = []
    monkeypatch.setattr(runner, "release_cached_blocks", lambda device: order.append("release"))

    def build(*args, **kwargs):
        order.append("build")
        raise RuntimeError("stop here")

    monkeypatch.setattr(runner, "build_workload", build)
    with pytest.raises(RuntimeError, match="stop here"):
        runner.run_rank(TrialConfig(world_size=1, device="cpu"))
    assert order == ["release", "build"]
