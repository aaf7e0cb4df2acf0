"""The runner's CUDA measurements on a CPU machine: ``torch.cuda``'s memory figures are stubbed
and the profiler is a fake that records when it starts and stops, so the rules that need a GPU
(several, for the NCCL buffers) run here on figures worked out by hand.

What a GPU run would measure instead: the device's non-allocator bytes of each layout in a warm
worker group (``RankResult.extra["non_allocator_bytes"]``) equal to a fresh group's; the
breakdown of an offloaded trial with activations > 0; and the timed steps of a trial run right
after a profiled one as fast as those of a worker that never profiled.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from autotune.config import TrialConfig
from autotune.trial import runner
from autotune.trial.parallel.mesh import MESH_CACHE_SIZE
from profiler import capture

MIB = 2**20
GIB = 2**30
CUDA = torch.device("cuda", 0)


@pytest.fixture
def cuda_memory(monkeypatch):
    """A device of 80 GiB whose memory outside the allocator is ``state["other"]`` and whose
    allocator holds ``state["reserved"]``, as ``mem_get_info`` / ``memory_reserved`` read them."""
    state = {"other": 0, "reserved": 0}
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(
        torch.cuda,
        "mem_get_info",
        lambda device=None: (80 * GIB - state["other"] - state["reserved"], 80 * GIB),
    )
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: state["reserved"])
    return state


# ---- the memory outside the allocator does not depend on the trials before ------------------
CONTEXT = 500 * MIB
"""The CUDA context and the world group's communicator: there before any trial."""


def test_outside_allocator_bytes_are_the_layouts_own(monkeypatch, cuda_memory):
    """Four layouts whose sub-groups hold 300, 200, 100 and 50 MiB of NCCL buffers, run in a
    warm worker that keeps the last three shapes' groups (mesh.py): each trial reads the context
    and its own groups' buffers, 800 / 700 / 600 / 550 MiB, whatever ran before it. The device
    itself holds up to 500 + 300 + 200 + 100 = 1100 MiB outside the allocator."""
    tp = {8: 300 * MIB, 4: 200 * MIB, 2: 100 * MIB, 1: 50 * MIB}
    configs = {k: TrialConfig(world_size=8, tp_degree=k) for k in tp}
    held = {runner.mesh_shape(configs[k]): tp[k] for k in tp}  # by shape, for the evictions
    cache: list[tuple[int, ...]] = []  # the shapes mesh.py holds, least recently used first
    monkeypatch.setattr(runner, "cached_mesh_shapes", lambda: list(cache))
    monkeypatch.setattr(runner, "_GROUP_BYTES", {})
    cuda_memory["other"] = CONTEXT

    def trial(k: int) -> int:
        outside = runner.OutsideAllocator.start(CUDA, configs[k])
        shape = runner.mesh_shape(configs[k])
        # build_mesh: the cached mesh, or a new one; that destroys the least recently used
        # shape's groups when the cache is full, and its buffers go back to the device.
        if shape in cache:
            cache.remove(shape)
        else:
            if len(cache) == MESH_CACHE_SIZE:
                cuda_memory["other"] -= held[cache.pop(0)]
            cuda_memory["other"] += tp[k]
        cache.append(shape)
        cuda_memory["reserved"] = 6 * GIB  # the trial's own blocks: inside the allocator
        measured = outside.bytes()
        cuda_memory["reserved"] = 0  # the next trial's release_cached_blocks
        return measured

    order = [8, 4, 2, 8, 1, 8, 4, 8, 2, 1]
    measured = [trial(k) for k in order]
    assert measured == [CONTEXT + tp[k] for k in order]


# ---- under optimizer offload, host-resident states are not taken off the CUDA peak ----------
def _offloaded_trainer() -> SimpleNamespace:
    """A trainer whose parameters (512 × 512 + 512 floats), gradients and AdamW state are all in
    host memory, as FSDP2's CPUOffloadPolicy keeps them, on a CUDA device."""
    model = torch.nn.Linear(512, 512)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 512)).sum().backward()
    optimizer.step()  # AdamW's state exists from its first step on

    def step(index, on_grads=None, phase=None):
        model(torch.ones(1, 512)).sum().backward()
        if on_grads is not None:
            on_grads()

    pm = SimpleNamespace(parts=[model], dp=SimpleNamespace(optimizer=optimizer))
    return SimpleNamespace(pm=pm, device=CUDA, step=step)


def test_offloaded_states_are_not_subtracted_from_the_device_peak(monkeypatch, cuda_memory):
    # The device: 1 MiB allocated at rest (buffers), a 40 MiB peak (activations and gathered
    # parameters), 48 MiB reserved. The host holds 1 MiB of parameters, as much of gradients and
    # 2 MiB of AdamW state: more than the device's peak, so taking them off it read 0.
    figures = {"memory_allocated": MIB, "max_memory_allocated": 40 * MIB}
    for name, value in figures.items():
        monkeypatch.setattr(torch.cuda, name, lambda device=None, value=value: value)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: 48 * MIB)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)
    memory, _ = runner.measure_memory(_offloaded_trainer(), 1)
    assert (memory.parameters, memory.gradients, memory.optimizer_state) == (0, 0, 0)
    assert (memory.activations, memory.other) == (40 * MIB, MIB)
    assert (memory.peak, memory.reserved_peak, memory.source) == (
        40 * MIB,
        48 * MIB,
        "cuda_allocator",
    )


# ---- CUPTI is detached before any later timed step ------------------------------------------
class FakeProfile:
    """torch.profiler.profile as Kineto behaves on CUDA: CUPTI attaches when it starts and stays
    attached after it stops unless ``TEARDOWN_CUPTI`` reads "1" then."""

    attached = False
    log: list = []

    def __init__(self, activities, record_shapes=False):
        self.profiler = SimpleNamespace(kineto_results=SimpleNamespace(events=lambda: []))

    def __enter__(self):
        FakeProfile.attached = True
        FakeProfile.log.append("profiler start")
        return self

    def __exit__(self, *exc):
        FakeProfile.attached = os.environ.get(capture.TEARDOWN_CUPTI) != "1"
        FakeProfile.log.append("profiler stop")
        return False


@pytest.fixture
def fake_profiler(monkeypatch, cuda_memory):
    monkeypatch.setattr(capture, "profile", FakeProfile)
    monkeypatch.setattr(FakeProfile, "attached", False)
    monkeypatch.setattr(FakeProfile, "log", [])
    monkeypatch.delenv(capture.TEARDOWN_CUPTI, raising=False)
    monkeypatch.setattr(runner, "measure_offset", lambda: 0)
    monkeypatch.setattr(runner, "mesh_group_names", lambda mesh: {})
    monkeypatch.setattr(runner.dist, "get_rank", lambda *a, **k: 0)
    return FakeProfile.log


def _recording_trainer(log: list) -> SimpleNamespace:
    def step(index, on_grads=None, phase=None):
        kind = "profiled" if phase is not None else "timed"
        log.append((kind, index, "CUPTI attached" if FakeProfile.attached else "detached"))

    return SimpleNamespace(device=CUDA, step=step)


def test_timed_steps_after_a_profiled_trial_run_without_cupti(fake_profiler):
    """Two trials in one worker, each 2 timed steps then 1 profiled: every timed step, the next
    trial's included, runs with CUPTI detached."""
    config = TrialConfig(world_size=1, num_warmup_steps=1, num_timed_steps=1, num_profiled_steps=1)
    trainer = _recording_trainer(fake_profiler)
    for _ in range(2):
        times = runner.timed_steps(trainer, 2)
        runner._profiled_steps(config, trainer, None, CUDA, 2, times)
        assert len(times) == 3
    trial = [
        ("timed", 0, "detached"),
        ("timed", 1, "detached"),
        "profiler start",
        ("profiled", 2, "CUPTI attached"),
        "profiler stop",
    ]
    assert fake_profiler == trial + trial
    assert capture.TEARDOWN_CUPTI not in os.environ  # restored


def test_a_teardown_choice_already_made_is_kept(fake_profiler, monkeypatch):
    # torch sets "0" itself where teardown is unsafe (CUDA graphs before CUDA 12.6).
    monkeypatch.setenv(capture.TEARDOWN_CUPTI, "0")
    with capture.record(cuda=True):
        pass
    assert FakeProfile.attached and os.environ[capture.TEARDOWN_CUPTI] == "0"
