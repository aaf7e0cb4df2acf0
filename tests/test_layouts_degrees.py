"""The one layout enumerator (``layouts.layout_degrees``): its degrees by hand, and the search
space's grid and ``rank``'s screened layouts both walking exactly its degrees in its order."""

from __future__ import annotations

import dataclasses

import pytest

from autotune.config import TrialConfig, WorkloadSpec
from autotune.errors import ConfigError
from autotune.layouts import layout_degrees
from autotune.ranking.space import screened_layouts
from autotune.search.space import SearchSpace


def _walk(dims) -> list[tuple[int, int, int, int]]:
    return [(d.tp, d.pp, d.cp, d.dp) for d in dims]


def test_degrees_by_hand():
    # world 8, global batch 4: tp ∈ {1, 2}, pp every divisor of 8, cp ∈ {1, 2}; kept where
    # tp·pp·cp divides 8 and dp = 8 / (tp·pp·cp) divides 4 (so dp 8 is not), tp outermost.
    got = _walk(layout_degrees(8, 4, {"tp_degree": (1, 2), "cp_degree": (1, 2)}))
    assert got == [
        (1, 1, 2, 4),
        (1, 2, 1, 4),
        (1, 2, 2, 2),
        (1, 4, 1, 2),
        (1, 4, 2, 1),
        (1, 8, 1, 1),
        (2, 1, 1, 4),
        (2, 1, 2, 2),
        (2, 2, 1, 2),
        (2, 2, 2, 1),
        (2, 4, 1, 1),
    ]
    # No batch: every tiling of the world; dp_replicate 1 (HSDP is chosen per layout after).
    everything = list(layout_degrees(4, None, {"cp_degree": (1,)}))
    assert _walk(everything) == [
        (1, 1, 1, 4),
        (1, 2, 1, 2),
        (1, 4, 1, 1),
        (2, 1, 1, 2),
        (2, 2, 1, 1),
        (4, 1, 1, 1),
    ]
    assert {d.dp_replicate for d in everything} == {1}


def _first_seen(configs) -> list[tuple[int, int, int, int]]:
    seen: dict[tuple[int, int, int, int], None] = {}
    for c in configs:
        seen.setdefault((c.tp_degree, c.pp_degree, c.cp_degree, c.dp_degree), None)
    return list(seen)


def test_the_search_space_and_rank_walk_its_degrees_in_its_order():
    workload = WorkloadSpec(family="llama", size="tiny", seq_len=256, global_batch_size=8)
    base = TrialConfig(world_size=8, workload=workload, device="cuda", precision="bf16-mixed")
    cps = (1, 2)
    walked = _walk(layout_degrees(8, 8, {"tp_degree": (1, 2), "cp_degree": cps}))
    expected = [d for d in walked if d[1] <= 4]  # pp ≤ llama-tiny's 4 layers (validate)
    grid = SearchSpace(
        base, narrowed={"tp_degree": [1, 2], "cp_degree": list(cps)}
    ).configs  # the search space (layouts.enumerate_configs)
    assert _first_seen(grid) == expected
    choices = {
        "sequence_parallel": (True,),
        "cp_degree": cps,
        "dp_replicate": None,
        "virtual_stages": (2,),
        "compile": (False,),
        "float8": (False,),
    }
    screened = screened_layouts(
        base, workload.shape, choices, tp_degrees=[1, 2], fits=lambda b: True
    )  # rank's, nothing dropped
    assert _first_seen(screened.layouts) == expected


def test_ep_is_carved_from_the_shards_cp_and_tp_not_added_to_the_world():
    # world 8, global batch 8, pp ∈ {1, 2}, ep ∈ {1, 2, 4}: ep must divide dp_shard·cp·tp =
    # 8 / pp, and it leaves dp as it was (dp = 8 / (tp·pp·cp)).
    dims = layout_degrees(
        8, 8, {"tp_degree": (1,), "pp_degree": (1, 2), "cp_degree": (1,), "ep_degree": (1, 2, 4)}
    )
    got = [(d.pp, d.ep, d.dp, d.efsdp) for d in dims]
    pp1 = [(1, 1, 8, 8), (1, 2, 8, 4), (1, 4, 8, 2)]
    assert got == pp1 + [(2, 1, 4, 4), (2, 2, 4, 2), (2, 4, 4, 1)]
    # world 4 with pp 4 leaves one shard: only ep 1 divides it
    assert [d.ep for d in layout_degrees(4, None, {"pp_degree": (4,), "ep_degree": (1, 2)})] == [1]


def test_the_search_space_holds_ep_for_a_mixture_of_experts_only():
    moe = WorkloadSpec(family="moe", size="tiny", seq_len=16, global_batch_size=4)
    moe_eps = {c.ep_degree for c in SearchSpace(TrialConfig(workload=moe, world_size=2)).configs}
    dense = TrialConfig(workload=WorkloadSpec(seq_len=16, global_batch_size=4), world_size=2)
    assert moe_eps == {1, 2}
    assert {c.ep_degree for c in SearchSpace(dense).configs} == {1}
    # an omitted ep bound is 1: callers that do not name it (rank) list the layouts as before
    assert {d.ep for d in layout_degrees(4, None, {})} == {1}


class _Answers:
    """An Optuna trial that answers each question from ``params`` (``suggest``'s names)."""

    def __init__(self, params: dict) -> None:
        self.params = params

    def suggest_categorical(self, name, values):
        assert self.params[name] in values, (name, values)
        return self.params[name]


def test_the_search_asks_ep_and_proposes_ep_2_for_a_mixture_of_experts_at_world_2_and_4():
    moe = WorkloadSpec(family="moe", size="tiny", seq_len=16, global_batch_size=4)
    for world in (2, 4):
        space = SearchSpace(TrialConfig(workload=moe, world_size=world))
        for ep2 in [c for c in space.configs if c.ep_degree == 2][:: len(space.configs) // 20]:
            params = space.params_for(ep2)
            assert params["ep_degree"] == 2  # asked by the knob's own name, last
            assert list(params)[-1] == "ep_degree"
            assert space.suggest(_Answers(params)) == ep2
    dense = SearchSpace(TrialConfig(workload=WorkloadSpec(), world_size=4))
    assert not any("ep_degree" in space for space in dense.params_for(dense.configs[-1]))


def test_the_search_space_holds_only_the_ep_layouts_the_trials_run():
    moe = WorkloadSpec(family="moe", size="tiny", seq_len=16, global_batch_size=4)
    configs = SearchSpace(TrialConfig(workload=moe, world_size=4)).configs
    ep2 = [c for c in configs if c.ep_degree == 2]
    assert ep2 and all(c.pp_degree == c.cp_degree == 1 and c.zero_stage != 1 for c in ep2)
    ep1 = [c for c in configs if c.ep_degree == 1]  # ep 1 keeps the pipeline, cp and ZeRO-1
    assert {(c.pp_degree > 1, c.cp_degree > 1, c.zero_stage == 1) for c in ep1} >= {
        (True, False, False),
        (False, True, False),
        (False, False, True),
    }
    assert any(c.tp_degree > 1 for c in configs)
    assert not any(c.sequence_parallel for c in configs)  # its trial model has no SP plan


@pytest.mark.parametrize(
    "change,rule",
    [
        ({"pp_degree": 2}, "pp_degree 1"),
        ({"cp_degree": 2}, "cp_degree 1"),
        ({"zero_stage": 1}, "zero_stage 0, 2 or 3"),
    ],
)
def test_the_trial_refuses_in_one_line_what_the_space_leaves_out(change, rule):
    from autotune.trial.parallel.expert import check_ep

    moe = WorkloadSpec(family="moe", size="tiny", seq_len=16, global_batch_size=8)
    config = dataclasses.replace(TrialConfig(workload=moe, world_size=8, ep_degree=2), **change)
    with pytest.raises(ConfigError, match=f"ep_degree 2 runs in trials with {rule}"):
        check_ep(config)
