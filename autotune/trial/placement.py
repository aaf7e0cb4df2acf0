"""Where a trial's ranks go on a Ray cluster of several nodes.

The mesh is (pp, dp, tp) with tp fastest (``autotune.trial.parallel.mesh``): a TP group is
``tp_degree`` consecutive ranks and a pipeline stage is ``dp_degree × tp_degree`` consecutive
ranks. TP exchanges activations in every layer, so its group must sit inside one node (NVLink);
DP and PP tolerate the network, and a stage kept on one node keeps its DP traffic there too.
The performance model assumes exactly this (``perf_model``: a TP group inside a node).

How a worker group is placed (``executor.WorkerGroup``):
1. one placement-group bundle per TP group, holding its ``tp_degree`` ranks: Ray places a
   bundle on one node, so no TP group can be split, whatever Ray decides;
2. the ``PACK`` strategy, so the bundles fill as few nodes as possible;
3. once placed, ``assign_groups`` gives each pipeline stage the bundles of as few nodes as
   the placement allows (best fit: the fullest node that holds the whole stage);
4. rank r runs in the bundle of its TP group, ``r // tp_degree``;
5. on GPUs every rank sees all of its node's GPUs (Ray sets no ``CUDA_VISIBLE_DEVICES`` per
   actor: masking each rank to one GPU keeps NCCL off P2P/NVLink between them) and takes
   ``device_map``'s device: its local rank (its index among the group's ranks on its node)
   picks among the GPUs Ray gave the group's ranks there, lowest first — the local rank
   itself when the group holds the whole node.

A layout whose TP groups cannot be packed into the nodes is refused before anything starts
(``check_tp_fits``), naming the node sizes. Pure functions here, except ``read_nodes``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from autotune.errors import PlacementError


@dataclass(frozen=True)
class NodeSlots:
    """One alive Ray node and how many ranks of a trial it can hold."""

    node_id: str
    hostname: str
    address: str
    ranks: int
    """GPUs for GPU ranks; CPUs // cpus_per_rank for CPU ranks."""


def read_nodes(use_gpu: bool, cpus_per_rank: float) -> list[NodeSlots]:
    """The alive nodes of the joined Ray cluster that can hold at least one rank."""
    import ray

    nodes = []
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        resources = n.get("Resources", {})
        # A small epsilon: Ray reports fractional CPUs as floats (0.5 + 0.5 + …).
        ranks = (
            int(resources.get("GPU", 0))
            if use_gpu
            else int(resources.get("CPU", 0) / cpus_per_rank + 1e-9)
        )
        if ranks > 0:
            nodes.append(
                NodeSlots(
                    n["NodeID"],
                    n.get("NodeManagerHostname", ""),
                    n.get("NodeManagerAddress", ""),
                    ranks,
                )
            )
    return nodes


def cluster_shape(nodes: list[NodeSlots]) -> tuple[int, int]:
    """(nodes, devices per node) for a ``ClusterSpec``: the largest node sets the per-node
    count, as the performance model's nodes are all alike."""
    if not nodes:
        return 1, 0
    return len(nodes), max(n.ranks for n in nodes)


def node_sizes(nodes: list[NodeSlots]) -> str:
    """'2, 2 and 4' (ranks per node, largest last)."""
    sizes = sorted(n.ranks for n in nodes)
    text = [str(s) for s in sizes]
    return text[0] if len(text) == 1 else f"{', '.join(text[:-1])} and {text[-1]}"


def check_tp_fits(tp_degree: int, world_size: int, nodes: list[NodeSlots], unit: str) -> None:
    """Refuse, in one line naming the node sizes, a layout whose TP groups cannot each sit
    inside one node. ``unit`` says what a rank takes ('1 GPU', '0.5 CPU')."""
    if not nodes:
        return  # nothing known yet: the placement group's timeout speaks
    groups = world_size // tp_degree
    fit = sum(n.ranks // tp_degree for n in nodes)
    if fit >= groups:
        return
    largest = max(n.ranks for n in nodes)
    where = (
        f"the Ray cluster's {len(nodes)} node(s) hold {node_sizes(nodes)} ranks ({unit} per rank)"
    )
    if tp_degree > largest:
        raise PlacementError(
            f"tp_degree {tp_degree} cannot sit inside one node: {where}; "
            f"use tp_degree ≤ {largest} or nodes with more devices"
        )
    raise PlacementError(
        f"{groups} TP groups of {tp_degree} ranks do not fit inside nodes: "
        f"{where}; use a smaller tp_degree or add nodes"
    )


def assign_groups(bundle_nodes: list[str], num_stages: int, groups_per_stage: int) -> list[int]:
    """The bundle of each TP group (group g = stage × groups_per_stage + dp rank), each stage
    on as few nodes as the placed bundles allow.

    A stage goes whole onto the node with the fewest free bundles that still holds it (best
    fit leaves the big gaps to later stages); a stage no node holds takes the nodes with the
    most free bundles first. Nodes keep their order of first appearance among the bundles.
    """
    if len(bundle_nodes) != num_stages * groups_per_stage:
        raise ValueError(
            f"{len(bundle_nodes)} bundles for {num_stages} × {groups_per_stage} TP groups"
        )
    free: dict[str, list[int]] = {}
    for index, node in enumerate(bundle_nodes):
        free.setdefault(node, []).append(index)
    order = {node: i for i, node in enumerate(free)}
    assignment: list[int] = []
    for _ in range(num_stages):
        need = groups_per_stage
        whole = [n for n in free if len(free[n]) >= need]
        if whole:
            node = min(whole, key=lambda n: (len(free[n]), order[n]))
            assignment += [free[node].pop(0) for _ in range(need)]
            continue
        for node in sorted(free, key=lambda n: (-len(free[n]), order[n])):
            take = min(need, len(free[node]))
            assignment += [free[node].pop(0) for _ in range(take)]
            need -= take
            if need == 0:
                break
    return assignment


def placement_cost(rank_nodes: list[str], tp_degree: int, dp_degree: int) -> tuple[int, int]:
    """(TP groups split across nodes, Σ over stages of the nodes each stage spans): lower is
    better; (0, number of stages) is one stage per node or better."""
    tp_groups = [rank_nodes[i : i + tp_degree] for i in range(0, len(rank_nodes), tp_degree)]
    stage = dp_degree * tp_degree
    stages = [rank_nodes[i : i + stage] for i in range(0, len(rank_nodes), stage)]
    return (sum(len(set(g)) > 1 for g in tp_groups), sum(len(set(s)) for s in stages))


def best_cost(
    rank_nodes: list[str], tp_degree: int, dp_degree: int, pp_degree: int
) -> tuple[int, int] | None:
    """The cost of the best placement of this layout on the same ranks per node, or None when
    these nodes cannot hold every TP group whole."""
    counts = Counter(rank_nodes)
    if any(c % tp_degree for c in counts.values()):
        return None
    bundles = [n for n in dict.fromkeys(rank_nodes) for _ in range(counts[n] // tp_degree)]
    groups = assign_groups(bundles, pp_degree, dp_degree)
    return placement_cost(ranks_of(groups, bundles, tp_degree), tp_degree, dp_degree)


def ranks_of(groups: list[int], bundle_nodes: list[str], tp_degree: int) -> list[str]:
    """The node of every rank: rank r is in TP group r // tp_degree, placed in bundle
    ``groups[r // tp_degree]``."""
    return [bundle_nodes[groups[r // tp_degree]] for r in range(len(groups) * tp_degree)]


@dataclass(frozen=True)
class RankDevice:
    """Where one GPU rank of a worker group runs."""

    rank: int
    node_id: str
    local_rank: int
    """The rank's index among the group's ranks on its node, in rank order."""
    device_index: int
    """The CUDA device it sets (``torch.cuda.set_device``), among all of its node's GPUs."""


def device_map(rank_nodes: list[str], node_devices: dict[str, Sequence[int]]) -> list[RankDevice]:
    """The device of every rank: rank r's local rank ``k`` on its node takes the ``k``-th
    lowest of the CUDA device indices the group holds there (``node_devices``: the devices Ray
    assigned to the group's ranks on each node, ``visible_index``). Consecutive ranks, so each
    TP group, get consecutive devices. Refuses, naming the node, a node with more ranks than
    devices."""
    local: Counter[str] = Counter()
    devices = []
    for rank, node in enumerate(rank_nodes):
        held = sorted(node_devices.get(node, ()))
        if local[node] >= len(held):
            count = rank_nodes.count(node)
            raise PlacementError(
                f"Ray node {node} holds {count} ranks of this trial but "
                f"{len(held)} GPU(s) for them; give each rank one GPU "
                "(num_gpus=1) or lower world_size"
            )
        devices.append(RankDevice(rank, node, local[node], held[local[node]]))
        local[node] += 1
    return devices


def visible_index(gpu_id: int | str, cuda_visible_devices: str | None) -> int:
    """The CUDA device index, in its own process, of the GPU that Ray assigned to an actor
    (an id from ``ray.get_gpu_ids()``). Ray 2.60 with ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_
    DEVICES`` leaves the node's ``CUDA_VISIBLE_DEVICES`` as the raylet had it and returns ids
    from that list (or ``0..N-1`` when it is unset): the index is the id's position in the
    list, as Ray Train's ``get_device`` reads it."""
    if not cuda_visible_devices:
        return int(gpu_id)
    visible = [d.strip() for d in cuda_visible_devices.split(",")]
    if str(gpu_id) not in visible:
        raise PlacementError(
            f"Ray assigned GPU {gpu_id} but CUDA_VISIBLE_DEVICES is "
            f"'{cuda_visible_devices}'; start the Ray node with the GPUs it "
            "may use in CUDA_VISIBLE_DEVICES"
        )
    return visible.index(str(gpu_id))
