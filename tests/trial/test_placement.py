"""Placement on several nodes, as pure functions: every TP group inside one node, each pipeline
stage on as few nodes as the placed bundles allow (checked against a brute force over every
assignment), and layouts the nodes cannot hold refused in one line naming the node sizes."""

from __future__ import annotations

import itertools

import pytest

from autotune.errors import PlacementError
from autotune.trial.placement import (
    NodeSlots,
    assign_groups,
    best_cost,
    check_tp_fits,
    node_sizes,
    placement_cost,
    ranks_of,
)


def _nodes(*sizes: int) -> list[NodeSlots]:
    return [NodeSlots(f"n{i}", f"host{i}", "127.0.0.1", s) for i, s in enumerate(sizes)]


def _brute_force(bundle_nodes: list[str], stages: int, per_stage: int) -> int:
    """The fewest (stage, node) pairs over every assignment of groups to bundles."""
    best = None
    for perm in itertools.permutations(range(len(bundle_nodes))):
        pairs = sum(
            len({bundle_nodes[b] for b in perm[s * per_stage : (s + 1) * per_stage]})
            for s in range(stages)
        )
        best = pairs if best is None else min(best, pairs)
    return best


@pytest.mark.parametrize(
    "bundle_nodes,stages,per_stage",
    [
        (["a", "b", "a", "b"], 2, 2),  # PACK interleaved the bundles across two nodes
        (["a", "a", "a", "b", "b", "b"], 2, 3),  # one stage per node
        (["a", "a", "a", "b", "b", "c"], 3, 2),  # uneven nodes: best fit keeps stages whole
        (["a", "b", "c", "a", "b", "c"], 2, 3),  # no node holds a stage: fewest nodes each
        (["a", "a", "b", "b", "b", "b"], 3, 2),
        (["a", "b"], 1, 2),
    ],
)
def test_stages_span_as_few_nodes_as_a_brute_force_finds(bundle_nodes, stages, per_stage):
    groups = assign_groups(bundle_nodes, stages, per_stage)
    assert sorted(groups) == list(range(len(bundle_nodes)))  # each bundle used once
    pairs = sum(
        len({bundle_nodes[g] for g in groups[s * per_stage : (s + 1) * per_stage]})
        for s in range(stages)
    )
    assert pairs == _brute_force(bundle_nodes, stages, per_stage)


def test_ranks_follow_their_tp_group_bundle():
    # tp 2, dp 2, pp 2: bundles (TP groups) alternate between the nodes as placed.
    bundle_nodes = ["a", "b", "a", "b"]
    groups = assign_groups(bundle_nodes, num_stages=2, groups_per_stage=2)
    nodes = ranks_of(groups, bundle_nodes, tp_degree=2)
    assert nodes == ["a", "a", "a", "a", "b", "b", "b", "b"]
    assert placement_cost(nodes, tp_degree=2, dp_degree=2) == (0, 2)


def test_a_group_is_reused_only_when_placed_as_well_as_a_new_one():
    # Two nodes of two ranks: the pairs (0, 1) and (2, 3) share a node.
    nodes = ["a", "a", "b", "b"]
    for tp, dp, pp in ((2, 2, 1), (1, 2, 2), (2, 1, 2), (1, 4, 1)):
        assert placement_cost(nodes, tp, dp) == best_cost(nodes, tp, dp, pp)
    interleaved = ["a", "b", "a", "b"]
    assert placement_cost(interleaved, 2, 2) == (2, 2)  # both TP pairs split
    assert best_cost(interleaved, 2, 2, 1) == (0, 2)
    assert best_cost(["a", "a", "a", "b"], 2, 2, 1) is None  # no whole pair on b


def test_a_tp_group_wider_than_every_node_is_refused_naming_the_sizes():
    with pytest.raises(PlacementError) as e:
        check_tp_fits(4, 4, _nodes(2, 2), "1 CPU")
    message = str(e.value)
    assert "\n" not in message
    assert "tp_degree 4 cannot sit inside one node" in message
    assert "2 node(s) hold 2 and 2 ranks (1 CPU per rank)" in message
    assert "tp_degree ≤ 2" in message
    assert e.value.kind == "invalid"


def test_tp_groups_that_do_not_pack_are_refused_and_fitting_ones_pass():
    # Three ranks per node hold one pair each: two pairs of four ranks need two nodes.
    with pytest.raises(
        PlacementError,
        match="2 TP groups of 2 ranks do not fit inside nodes: "
        r"the Ray cluster's 1 node\(s\) hold 3 ranks",
    ):
        check_tp_fits(2, 4, _nodes(3), "0.5 CPU")
    check_tp_fits(2, 4, _nodes(3, 3), "0.5 CPU")
    check_tp_fits(4, 8, _nodes(4, 4), "1 GPU")
    check_tp_fits(8, 8, [], "1 GPU")  # nothing known: Ray's placement timeout decides
    assert node_sizes(_nodes(4, 2, 8)) == "2, 4 and 8"
