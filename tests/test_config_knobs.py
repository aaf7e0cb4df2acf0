"""The newer knobs' rules (sequence and context parallelism, HSDP, virtual stages, AC layer
count, float8), their short names and their place in the search space."""

from __future__ import annotations

import dataclasses

import pytest

from autotune.config import TrialConfig, WorkloadSpec
from autotune.errors import ConfigError
from autotune.layouts import enumerate_configs, short_name
from autotune.search.space import SearchSpace

TINY = WorkloadSpec(family="gpt", size="tiny", seq_len=64, global_batch_size=8)


def _config(**kw) -> TrialConfig:
    return TrialConfig(workload=kw.pop("workload", TINY), **{"world_size": 8, **kw})


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(sequence_parallel=True), "needs tp_degree > 1"),
        (dict(cp_degree=3, world_size=6), "seq_len divisible by 2 × cp_degree = 6"),
        (dict(cp_degree=4, tp_degree=4), "tp_degree × pp_degree × cp_degree = 16 must divide"),
        (dict(dp_replicate=3, zero_stage=3), "dp_replicate 3 must divide dp_degree 8"),
        (dict(dp_replicate=2, zero_stage=1), "it needs zero_stage 2 or 3"),
        (
            dict(pp_degree=2, pp_schedule="interleaved_1f1b", virtual_stages=1),
            "needs virtual_stages ≥ 2",
        ),
        (dict(pp_degree=2, virtual_stages=4), "applies to pp_schedule interleaved_1f1b"),
        (dict(ac_layers=1), "counts blocks under full checkpointing"),
        (dict(ac_layers=9, activation_checkpointing="full"), "exceeds the 4 layers"),
        (dict(float8=True, device="cpu"), "CPUs have no float8 matmul"),
        (dict(float8=True, precision="32-true"), "needs precision bf16-mixed or bf16-true"),
    ],
)
def test_each_rule_names_its_fix(kwargs, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _config(**kwargs).validate()


def test_context_parallelism_takes_its_ranks_from_data_parallelism():
    c = _config(cp_degree=2, tp_degree=2, dp_replicate=2, zero_stage=3)
    c.validate()
    assert (c.dp_degree, c.dp_shard) == (2, 1)  # 8 / (2 × 2); two replicas of one rank
    assert c.grad_accum_steps == 8 // (1 * 2)


def test_virtual_stages_set_the_interleaved_stage_count():
    c = TrialConfig(
        workload=WorkloadSpec(family="llama", size="7b", seq_len=64, global_batch_size=16),
        world_size=4,
        pp_degree=4,
        pp_schedule="interleaved_1f1b",
        virtual_stages=4,
    )
    c.validate()
    assert c.num_pp_stages == 16


def test_short_names_mark_the_newer_knobs_and_keep_old_names():
    old = _config(tp_degree=2, zero_stage=3)
    assert short_name(old) == "w8-tp2-pp1-dp4-z3-mb1x2-ac_none"
    new = _config(
        tp_degree=2,
        zero_stage=3,
        sequence_parallel=True,
        cp_degree=2,
        dp_replicate=2,
        compile=True,
        activation_checkpointing="full",
        ac_layers=1,
    )
    assert short_name(new) == "w8-tp2-pp1-dp2-z3-mb1x4-ac_full-l1-sp-cp2-hsdp2-compile"


def test_the_default_space_holds_the_newer_knobs_trials_run():
    """Sequence parallelism (every TP layout with and without it), HSDP (dp_replicate 2,
    tests/trial/parallel/test_hsdp_vpp.py), cp 2 (tests/trial/parallel/test_context_parallel.py),
    op-level recomputation and 4 virtual stages, which trials run, where the layout allows
    them; compile and float8 stay off (minutes of compilation; float8 needs a GPU)."""
    base = _config(world_size=4)
    configs = list(enumerate_configs(base))
    with_sp = [c for c in configs if c.sequence_parallel]
    without = [c for c in configs if not c.sequence_parallel]
    assert {c.tp_degree for c in with_sp} == {2, 4}
    assert {c.tp_degree for c in without} == {1, 2, 4}
    assert {short_name(c).replace("-sp", "") for c in with_sp} == {
        short_name(c) for c in without if c.tp_degree > 1
    }
    assert "op" in {c.activation_checkpointing for c in configs}
    assert {c.cp_degree for c in configs} == {1, 2}
    hsdp = [c for c in configs if c.dp_replicate == 2]
    assert hsdp and all(c.zero_stage >= 2 and c.dp_degree % 2 == 0 for c in hsdp)
    assert not any(c.compile or c.float8 for c in configs)
    # The tiny model's 4 layers hold no 8 stages; GPT-2 small's 12 do.
    assert all(c.virtual_stages == 2 for c in configs)
    small = dataclasses.replace(base.workload, size="small")
    deep = list(enumerate_configs(dataclasses.replace(base, workload=small)))
    assert {
        c.virtual_stages for c in deep if c.pp_degree == 2 and c.pp_schedule == "interleaved_1f1b"
    } == {2, 4}


def test_fixing_a_newer_knob_narrows_the_space_to_it():
    base = TrialConfig(
        workload=WorkloadSpec(family="gpt", size="tiny", seq_len=128, global_batch_size=8),
        world_size=4,
    )
    space = SearchSpace(base, fixed={"cp_degree": 2})
    assert len(space) > 0 and {c.cp_degree for c in space.configs} == {2}
    assert {c.dp_degree * c.tp_degree * c.pp_degree for c in space.configs} == {2}
    sp = SearchSpace(base)
    with_sp = [c for c in sp.configs if c.sequence_parallel]
    assert with_sp and all(c.tp_degree > 1 for c in with_sp)
    without = SearchSpace(base, fixed={"sequence_parallel": False})
    assert len(sp) == len(without) + len(with_sp)
    assert not any(c.sequence_parallel for c in without.configs)
