"""``ParallelDims``: one object owns a layout's degrees, their rules and mesh order, and
``TrialConfig`` reads its degrees' rules from it; ``TrialConfig``'s fields are grouped by job."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from autotune.config import JOBS, TrialConfig, WorkloadSpec
from autotune.errors import ConfigError
from autotune.parallel_dims import MESH_ORDER, ParallelDims


def _config(**fields) -> TrialConfig:
    wl = WorkloadSpec(family="llama", size="tiny", seq_len=64, global_batch_size=64)
    return TrialConfig(workload=wl, device="cuda", **fields)


def test_dims_of_a_config_are_its_degrees_and_multiply_to_the_world():
    for world, tp, pp, cp in itertools.product((8, 16), (1, 2), (1, 2), (1, 2)):
        dp = world // (tp * pp * cp)
        for rep in (r for r in (1, 2, 4) if dp % r == 0):
            c = _config(world_size=world, tp_degree=tp, pp_degree=pp, cp_degree=cp)
            c = dataclasses.replace(c, dp_replicate=rep, zero_stage=3)
            d = c.dims
            assert (d.pp, d.dp_replicate, d.dp_shard, d.cp, d.tp, d.ep) == (
                pp,
                rep,
                dp // rep,
                cp,
                tp,
                1,
            )
            assert d.dp == c.dp_degree and d.dp_shard == c.dp_shard
            assert d.pp * d.dp_replicate * d.dp_shard * d.cp * d.tp == world
            assert d.mesh_shape == (pp, rep, dp // rep, cp, tp)
            assert d.dp_shard_cp == dp // rep * cp and d.dp_cp == dp * cp
            assert d.non_data_parallel_size == world // dp


def test_mesh_order_and_what_is_enabled():
    assert MESH_ORDER == ("pp", "dp_replicate", "dp_shard", "cp", "tp")
    d = ParallelDims.of(32, tp=2, pp=1, cp=2, dp_replicate=2)  # dp 8: 2 replicas of 4 shards
    assert d.mesh_shape == (1, 2, 4, 2, 2)
    assert (d.pp_enabled, d.dp_replicate_enabled, d.dp_shard_enabled) == (False, True, True)
    assert (d.cp_enabled, d.tp_enabled, d.ep_enabled, d.dp_cp_enabled) == (True, True, False, True)
    assert d.seq_len_divisor == 2 * 2 * 2
    alone = ParallelDims.of(1)
    assert not any(
        (
            alone.dp_enabled,
            alone.cp_enabled,
            alone.tp_enabled,
            alone.pp_enabled,
            alone.dp_cp_enabled,
        )
    )


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"tp_degree": 0}, "tp_degree must be a positive integer, not 0"),
        ({"world_size": 6, "tp_degree": 4}, "tp_degree × pp_degree = 4 must divide world_size 6"),
        (
            {"world_size": 8, "tp_degree": 2, "cp_degree": 3},
            "tp_degree × pp_degree × cp_degree = 6 must divide world_size 8",
        ),
        ({"world_size": 8, "dp_replicate": 3, "zero_stage": 3}, "dp_replicate 3 must divide"),
        ({"world_size": 8, "dp_replicate": 2, "zero_stage": 1}, "it needs zero_stage 2 or 3"),
        ({"world_size": 64, "cp_degree": 64}, "cp_degree 64 needs seq_len divisible by 2 × cp"),
    ],
)
def test_the_degrees_rules_are_the_dims_and_validate_says_them(fields, message):
    config = _config(**fields)
    with pytest.raises(ConfigError, match=message.replace("×", ".")):
        config.validate()
    degrees = dict(
        tp=config.tp_degree,
        pp=config.pp_degree,
        cp=config.cp_degree,
        dp_replicate=config.dp_replicate,
    )
    with pytest.raises(ConfigError, match=message.replace("×", ".")):
        ParallelDims.check(config.world_size, **degrees)
        config.dims.check_combination(seq_len=64, zero_stage=config.zero_stage)


def test_expert_parallelism_is_carved_from_shards_cp_and_tp():
    d = ParallelDims(world_size=16, dp_shard=4, tp=2, pp=2, ep=8)
    d.check_combination(seq_len=64, zero_stage=3)  # 4 × 1 × 2 = 8 ranks to carve from
    with pytest.raises(ConfigError, match="ep_degree 16 must divide dp_shard × cp × tp = 8"):
        dataclasses.replace(d, ep=16).check_combination(seq_len=64, zero_stage=3)


def test_every_field_is_declared_for_one_job():
    by_job = {job: TrialConfig.fields_of(job) for job in JOBS}
    assert by_job == {
        "workload": ("workload",),
        "parallelism": (
            "world_size",
            "tp_degree",
            "pp_degree",
            "zero_stage",
            "micro_batch_size",
            "bucket_mb",
            "overlap_enabled",
            "pp_schedule",
            "virtual_stages",
            "sequence_parallel",
            "cp_degree",
            "dp_replicate",
            "ep_degree",
        ),
        "memory": ("activation_checkpointing", "ac_layers", "optimizer_offload_enabled"),
        "kernels": ("attention", "compile", "float8", "device"),
        "precision": ("precision",),
        "measurement": ("num_warmup_steps", "num_timed_steps", "num_profiled_steps", "seed"),
    }
    assert sorted(sum(by_job.values(), ())) == sorted(
        f.name for f in dataclasses.fields(TrialConfig)
    )
    with pytest.raises(ConfigError, match="unknown field group 'speed'"):
        TrialConfig.fields_of("speed")
