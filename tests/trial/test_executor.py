"""The Ray executor: warm worker groups are reused; failed or hung trials rebuild the group and
leave no process behind; impossible placements are refused before anything starts."""

from __future__ import annotations

import os
import time

import pytest

from autotune.config import TrialConfig, WorkloadSpec
from autotune.errors import ClusterError, ConfigError, TrialFailed, WorkloadError

CONFIG = TrialConfig(
    world_size=2, micro_batch_size=2, num_warmup_steps=1, num_timed_steps=2, device="cpu"
)


def _user(path: str) -> TrialConfig:
    return TrialConfig(
        workload=WorkloadSpec(workload=path, seq_len=16, vocab_size=128),
        world_size=2,
        micro_batch_size=4,
        num_warmup_steps=0,
        num_timed_steps=1,
        device="cpu",
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait_dead(pids: list[int], timeout: float = 60.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [p for p in pids if _alive(p)]
        if not alive:
            return []
        time.sleep(0.2)
    return alive


def test_warm_group_is_reused(executor):
    first = executor.run(CONFIG)
    pids = executor.worker_pids
    second = executor.run(CONFIG)
    assert not second.cold_start
    assert executor.worker_pids == pids
    assert second.losses == first.losses  # same seed, same data, same result
    # A warm trial costs a remote call per rank, not a process start.
    assert second.overhead_s < first.overhead_s or not first.cold_start


def test_result_metrics_are_consistent(executor):
    result = executor.run(CONFIG)
    timed = [max(r.step_times[i] for r in result.ranks) for i in (1, 2)]
    assert min(timed) <= result.step_time_s <= max(timed)
    assert result.throughput_tokens_per_s == pytest.approx(
        CONFIG.tokens_per_step / result.step_time_s
    )
    assert result.steps_s <= result.wall_s
    assert len(result.ranks) == 2 and {r.dp_rank for r in result.ranks} == {0, 1}
    assert result.env["backend"] == "gloo" and result.env["world_size"] == 2
    assert result.ranks[0].num_threads == max(1, os.cpu_count() // 2)


def test_failed_trial_rebuilds_group_and_leaves_no_process(executor):
    executor.run(CONFIG)
    old = executor.worker_pids
    with pytest.raises(TrialFailed) as info:
        executor.run(_user("user_workload:build_failing_on_rank1"))
    assert info.value.rank == 1
    assert "injected failure on rank 1" in str(info.value)
    assert _wait_dead(old) == []
    after = executor.run(CONFIG)
    assert after.cold_start and not set(executor.worker_pids) & set(old)


def test_setup_errors_keep_the_group(executor):
    """A workload that raises while building fails on every rank before any collective."""
    executor.run(CONFIG)
    pids = executor.worker_pids
    with pytest.raises(WorkloadError, match="raised while building"):
        executor.run(_user("user_workload:build_raising"))
    assert executor.worker_pids == pids
    assert not executor.run(CONFIG).cold_start


def test_world_larger_than_cluster_is_refused(executor):
    import ray

    executor.start()  # the cluster's size is read below (also when this test runs alone)
    cpus = ray.cluster_resources()["CPU"]
    world = int(cpus / executor.settings.cpus_per_rank) * 2
    config = TrialConfig(
        world_size=world,
        micro_batch_size=1,
        device="cpu",
        workload=WorkloadSpec(global_batch_size=world),
    )
    with pytest.raises(ClusterError, match=f"world_size {world} needs"):
        executor.run(config)


def test_invalid_config_is_refused_before_running(executor):
    with pytest.raises(ConfigError, match="must divide the 4 attention heads"):
        executor.run(
            TrialConfig(
                world_size=3,
                tp_degree=3,
                micro_batch_size=1,
                workload=WorkloadSpec(global_batch_size=3),
            )
        )


RAY_NODE_LATE = (
    "The current node timed out during startup. This could happen because some of the raylet "
    "failed to startup or the GCS has become overloaded."
)
"""Ray 2.5x's words (ray/_private/node.py) when its raylet does not register within 30 s."""


LATE = Exception(RAY_NODE_LATE)


@pytest.mark.parametrize(
    ("raised", "expected", "inits"),
    [
        ([LATE, LATE], ClusterError, 2),
        ([LATE, None], None, 2),
        ([Exception("something else")], Exception, 1),
    ],
    ids=["late-twice", "late-once", "other-error"],
)
def test_a_ray_node_too_late_to_start_is_retried_once_then_a_cluster_error(
    monkeypatch, raised, expected, inits
):
    """A loaded machine's late raylet gets a second start, after the first start's processes
    are shut down; late twice is a one-line ClusterError naming the way out, not an internal
    error; any other exception from ray.init is left as it is, untried again."""
    import ray

    from autotune.trial.executor import ExecutorSettings, RayExecutor

    outcomes, calls = iter(raised), []

    def init(**kwargs):
        calls.append("init")
        error = next(outcomes)
        if error is not None:
            raise error

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", lambda: calls.append("shutdown"))
    executor = RayExecutor(ExecutorSettings())
    if expected is None:
        executor.start()
    else:
        with pytest.raises(expected) as info:
            executor.start()
        assert type(info.value) is expected
    assert calls.count("init") == inits
    if inits == 2:
        assert calls[:3] == ["init", "shutdown", "init"]
    if expected is ClusterError:
        assert "did not start" in str(info.value) and "--ray-address" in str(info.value)
