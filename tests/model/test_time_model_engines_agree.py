"""autotune's own runtime and torchtitan run FSDP2 ZeRO-3, HSDP, CP and TP with SP the same way
(``fully_shard`` per block, or per bucket of blocks, on the dp_shard × cp mesh: autotune
``trial/parallel/zero.py`` ``_apply_fsdp``; torchtitan 0.3.0
``models/llama3/infra/parallelize.py`` ``apply_fsdp``), so their predicted steps agree within
5% but for the traits in which their code differs:

- ``roofline``: torchtitan's kernels are timed per GEMM by the roofline, with its eager
  element-wise ops (``engines.TORCHTITAN_EAGER_ELEMENTWISE``, torchtitan
  ``models/llama3/model.py``), autotune's by the size curve its CPU trials fit. Switching that
  one trait to autotune's makes the two agree within 5% on every layout here.
- ``vocab_parallel`` (TP only): torchtitan shards the head and loss over TP (``loss_parallel``),
  autotune keeps the whole vocabulary on every TP rank (``trial/models/transformer.py``): a
  term under 5% of the step here.

Neither re-gathers the parameters for full AC's recomputed forward (torch 2.13
``distributed/fsdp/_fully_shard/_fsdp_state.py`` ``_pre_forward``) nor gathers per submodule:
switching either trait to DeepSpeed's moves torchtitan's step by more than 5% on the 70B case.

ZeRO-3's cross-node ring steps are counted for the own runtime too (they were for roofline
engines only).

Model states per rank agree within 5% (TP: the unsharded vocabulary above). The peaks do not
yet (own / torchtitan GiB: 19.98 / 25.80, 5.17 / 6.68, 16.15 / 17.66, 16.28 / 5.31,
10.78 / 4.37): autotune's runtime keeps unsharded gradients across micro-batches
(``set_requires_gradient_sync(False)``, ``memory._comm_buffers``: 13.9 GiB under cp 2), which
the engine model does not count for torchtitan, and the two count FSDP's staging buffers
differently (0.98 against 2.37 GiB at fsdp 64); that test is a strict xfail until the two
memory models agree.
"""

from __future__ import annotations

import dataclasses

import pytest

from autotune.config import TrialConfig, WorkloadSpec
from autotune.model.cluster import load_cluster
from autotune.model.engine_memory import estimate_engine_memory
from autotune.model.engines import AUTOTUNE_ENGINE, TORCHTITAN_ENGINE
from autotune.model.perf_model import Calibration, predict_step_time

W70 = WorkloadSpec(family="llama", size="70b", seq_len=4096, global_batch_size=1024)
W7 = WorkloadSpec(family="llama", size="7b", seq_len=4096, global_batch_size=64)
BASE = dict(zero_stage=3, micro_batch_size=1, activation_checkpointing="full")
LAYOUTS = {
    "70b-fsdp-512": TrialConfig(workload=W70, world_size=512, **{**BASE, "micro_batch_size": 2}),
    "7b-fsdp-64": TrialConfig(workload=W7, world_size=64, **BASE),
    "7b-hsdp-8x8": TrialConfig(workload=W7, world_size=64, dp_replicate=8, **BASE),
    "7b-cp2": TrialConfig(workload=W7, world_size=64, cp_degree=2, **BASE),
    "7b-tp2-sp": TrialConfig(
        workload=W7, world_size=64, tp_degree=2, sequence_parallel=True, **BASE
    ),
}


def _step(config: TrialConfig, engine) -> float:
    cluster = load_cluster("h100-sxm", nodes=config.world_size // 8)
    return predict_step_time(config, cluster, engine=engine).step_time_s


def _like_autotune(**traits):
    return dataclasses.replace(TORCHTITAN_ENGINE, **traits)


@pytest.mark.parametrize("name", LAYOUTS)
def test_torchtitan_agrees_with_the_own_runtime_once_roofline_is_switched(name):
    config = LAYOUTS[name]
    own = _step(config, AUTOTUNE_ENGINE)
    titan = _step(config, _like_autotune(roofline=AUTOTUNE_ENGINE.roofline))
    assert titan == pytest.approx(own, rel=0.05)


def test_the_roofline_is_the_difference_where_they_differ():
    config = LAYOUTS["7b-fsdp-64"]
    own, titan = _step(config, AUTOTUNE_ENGINE), _step(config, TORCHTITAN_ENGINE)
    assert abs(titan / own - 1) > 0.05  # the trait is a real term here


def test_deepspeeds_gathers_would_not_agree_on_the_70b_case():
    """Per-submodule units pay 4× the cross-node ring steps; the re-gather for the recomputed
    forward adds a third pass of them on top (each > 5% of the step here)."""
    config = LAYOUTS["70b-fsdp-512"]
    own = _step(config, AUTOTUNE_ENGINE)
    submodule = _step(config, _like_autotune(roofline=False, fsdp_unit="submodule"))
    both = _step(config, _like_autotune(roofline=False, fsdp_unit="submodule", ac_regather=True))
    assert submodule > 1.05 * own
    assert both > 1.05 * submodule


def test_the_own_runtime_pays_zero3_ring_steps_across_nodes():
    config = LAYOUTS["70b-fsdp-512"]
    cluster = load_cluster("h100-sxm", nodes=64)
    cal = Calibration.for_cluster(cluster)
    assert cal.ring_step_latency_s > 0
    no_ring = dataclasses.replace(cal, ring_step_latency_s=0.0)
    with_ring = predict_step_time(config, cluster, cal, engine=AUTOTUNE_ENGINE)
    without = predict_step_time(config, cluster, no_ring, engine=AUTOTUNE_ENGINE)
    assert with_ring.breakdown["dp_comm"] > without.breakdown["dp_comm"]


def _states(config: TrialConfig, engine) -> int:
    est = estimate_engine_memory(config, None, engine.memory)
    return est.parameters + est.gradients + est.optimizer_state


@pytest.mark.parametrize("name", LAYOUTS)
def test_model_states_per_rank_agree(name):
    config = LAYOUTS[name]
    own, titan = _states(config, AUTOTUNE_ENGINE), _states(config, TORCHTITAN_ENGINE)
    assert titan == pytest.approx(own, rel=0.05)


@pytest.mark.xfail(strict=True, reason="the own and the engine memory models' buffers differ")
@pytest.mark.parametrize("name", LAYOUTS)
def test_peaks_agree(name):
    config = LAYOUTS[name]
    own = estimate_engine_memory(config, None, AUTOTUNE_ENGINE.memory).total
    titan = estimate_engine_memory(config, None, TORCHTITAN_ENGINE.memory).total
    assert titan == pytest.approx(own, rel=0.05)
