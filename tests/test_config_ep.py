"""The expert-parallel degree's rules: one line each, naming the fix."""

from __future__ import annotations

import pytest

from autotune.config import TrialConfig, WorkloadSpec
from autotune.errors import ConfigError

MOE = WorkloadSpec(family="moe", size="tiny", seq_len=16, global_batch_size=4)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"world_size": 2, "ep_degree": 2, "workload": WorkloadSpec()}, "is a dense model"),
        ({"world_size": 4, "ep_degree": 3}, r"must divide dp_shard × cp × tp = 4"),
        ({"world_size": 4, "ep_degree": 4, "pp_degree": 2}, r"dp_shard × cp × tp = 2"),
        ({"world_size": 2, "ep_degree": 0}, "ep_degree must be a positive integer"),
    ],
)
def test_a_broken_ep_degree_is_refused_in_one_line(fields, message):
    config = TrialConfig(**({"workload": MOE} | fields))
    with pytest.raises(ConfigError, match=message) as caught:
        config.validate()
    assert "\n" not in str(caught.value)


def test_ep_must_divide_the_experts():
    # world 12 carves ep 6 from dp_shard 12, but 6 does not divide the 8 experts
    config = TrialConfig(workload=MOE, world_size=12, ep_degree=6)
    with pytest.raises(ConfigError, match=r"must divide the 8 experts .*among \[1, 2, 4, 8\]"):
        config.validate()


def test_ep_is_carved_from_shards_cp_and_tp_and_adds_no_ranks():
    config = TrialConfig(workload=MOE, world_size=8, tp_degree=2, ep_degree=4, zero_stage=3)
    config.validate()
    dims = config.dims
    assert (dims.dp_shard, dims.tp, dims.ep, dims.efsdp) == (4, 2, 4, 2)
    assert dims.expert_mesh_shape == (1, 1, 2, 4)
    assert dims.pp * dims.dp_replicate * dims.efsdp * dims.ep == config.world_size


def test_the_cli_takes_the_built_in_mixture_of_experts():
    from autotune.cli.args import builtin_workload

    workload = builtin_workload(WorkloadSpec(seq_len=16, global_batch_size=4), "moe-tiny")
    assert (workload.family, workload.size, workload.shape.moe.num_experts) == ("moe", "tiny", 8)
    TrialConfig(workload=workload, world_size=2, ep_degree=2).validate()
    with pytest.raises(ConfigError, match="choose one of .*moe-tiny"):
        builtin_workload(WorkloadSpec(), "moe-huge")
