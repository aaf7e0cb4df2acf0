"""Expert parallelism: each rank holds ``E / ep`` of a layer's experts, and the tokens travel to
their experts' ranks and back by all-to-all.

The experts' mesh is torchtitan's (``torchtitan/distributed/parallel_dims.py`` at b5bcd76):
``[pp, dp_replicate, efsdp, ep]`` over the same ranks as the dense mesh, ep fastest, with
efsdp = dp_shard × cp × tp / ep, so EP borrows its ranks from FSDP, CP and TP
(``parallel_dims.EXPERT_MESH_ORDER``). An ep group is ``ep`` consecutive ranks; the ranks that
hold the same experts (the expert-data group) are the dp_replicate × efsdp ranks of a stage
with the same ep coordinate.

Dispatch (:class:`ExpertParallel`): the (token, slot) pairs, sorted by global expert, are split
by the rank their expert lives on; the counts per expert go first (one all-to-all of E
integers), then the tokens (``all_to_all_single`` with uneven splits, which gloo runs on CPU);
the received tokens are regrouped by local expert, run, put back in arrival order and combined
by the reverse all-to-all. Backward is the same two exchanges with the splits swapped.

Gradients: DDP, replicate and FSDP2 leave the experts alone (``local_params``); before the
optimizer step :func:`moe_step` sums each expert's gradient over its expert-data group and
divides by the ranks of a stage (dp_replicate × efsdp × ep = dp × cp × tp): every data slice's
tokens reach each expert once from each of its tp ranks, which hold the same tokens. Then each
balancing bias is stepped from the step's token counts summed over the data-parallel ranks
(``models/moe.update_expert_bias``).

Under ZeRO-2/3 (FSDP2) the experts are sharded over their data ranks instead, as torchtitan
shards them (``torchtitan/distributed/fsdp.py`` at b5bcd76, ``apply_fsdp``: the routed experts
of an MoE block on the ``efsdp`` mesh, ``dp_replicate`` outer under HSDP, ``Shard(1)`` when
efsdp × ep exceeds the experts): :func:`shard_experts` makes each layer's experts an FSDP unit
of their own on efsdp (under HSDP on the whole expert-data group, ``_shard_mesh``), whose
reduce-scatter sums the gradient over the expert-data group and divides it by the stage's
ranks (``set_gradient_divide_factor``, a SUM then the division; torchtitan divides by its
global token count instead), so parameters, gradients and AdamW's state of the experts are
1/efsdp per rank (1/(dp_replicate × efsdp) under HSDP), and ZeRO-2 keeps the gathered experts
through backward as it keeps the rest. ``moe_step`` then leaves those experts alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import Shard

from autotune.config import TrialConfig, ep_trial_refusal
from autotune.errors import ConfigError
from autotune.trial.models.moe import MoE, moe_layers, update_expert_bias
from autotune.trial.parallel.mesh import TrialMesh, group_of_dim, group_timeout
from profiler.capture import group_range

LOCAL_PARAMS = "_autotune_local_params"
"""The attribute of a model part naming the parameters data parallelism must not sync."""


@dataclass
class ExpertGroups:
    """This rank's groups of the experts' mesh."""

    ep: dist.ProcessGroup
    data: dist.ProcessGroup | None
    """The expert-data group, dp_replicate × efsdp (None where it is one rank)."""
    shard_mesh: DeviceMesh | None = None
    """FSDP2's mesh for the experts: efsdp, or the expert-data group under HSDP; made by the
    first ZeRO-2/3 layout that needs it (``shard_experts``), so DDP's make no group for it."""


_GROUPS: dict[tuple, ExpertGroups] = {}


def check_ep(config: TrialConfig) -> None:
    """Refuse, in one line, what the trial runtime does not run with ep > 1
    (``config.ep_trial_refusal``)."""
    rule = ep_trial_refusal(config)
    if rule is not None:
        raise ConfigError(
            f"ep_degree {config.ep_degree} runs in trials with {rule} only; change that "
            "knob or set ep_degree to 1"
        )


def expert_groups(config: TrialConfig, device_type: str) -> ExpertGroups:
    """This rank's groups of the experts' mesh. Collective: every rank creates every group, in
    the same order; kept per world group, shape and device type."""
    dims = config.dims
    key = (id(dist.group.WORLD), dims.expert_mesh_shape, device_type)
    if key not in _GROUPS:
        ranks = torch.arange(dist.get_world_size()).reshape(dims.expert_mesh_shape)
        data = dims.dp_replicate * dims.efsdp
        _GROUPS[key] = ExpertGroups(
            _mine(ranks.reshape(-1, dims.ep), "ep"),
            _mine(ranks.movedim(3, 1).reshape(-1, data), "edp") if data > 1 else None,
        )
    return _GROUPS[key]


def _shard_mesh(ranks: torch.Tensor, device_type: str, data: dist.ProcessGroup) -> DeviceMesh:
    """This rank's efsdp slice of the experts' mesh ``ranks`` as FSDP2 takes it (the group by
    ``mesh.group_of_dim``). Under HSDP (dp_replicate > 1) the expert-data group ``data`` itself,
    1-D, replicate-major: the experts sharded over dp_replicate × efsdp, where torchtitan
    replicates them over dp_replicate (FSDP2 given the 2-D (dp_replicate, efsdp) mesh summed
    the experts' gradients short on gloo: tests/trial/parallel/test_moe_ep.py)."""
    rank = dist.get_rank()
    pp, _, _, ep = (int(i) for i in (ranks == rank).nonzero()[0])
    mine = ranks[pp, :, :, ep].to(torch.int)
    if mine.shape[0] > 1:
        return DeviceMesh.from_group(
            data, device_type, mesh=mine.flatten(), mesh_dim_names=("edp",)
        )
    group = group_of_dim(ranks, 2, "efsdp")[0]
    return DeviceMesh.from_group(group, device_type, mesh=mine[0], mesh_dim_names=("efsdp",))


def expert_group_names(config: TrialConfig, device_type: str) -> dict[str, str]:
    """The experts' process groups by name (``group_name``) → the dimension the profiler labels
    their collectives with: "ep" (dispatch and combine), "edp" (the expert-data group of
    ``moe_step``'s gradient sum), "efsdp" and "dp_replicate" (FSDP2's on the experts); {} with
    ep 1. Creates nothing: the groups are ``apply_ep``'s."""
    key = (id(dist.group.WORLD), config.dims.expert_mesh_shape, device_type)
    if config.ep_degree == 1 or key not in _GROUPS:
        return {}
    groups = _GROUPS[key]
    names = {groups.ep.group_name: "ep"}
    if groups.data is not None:
        names[groups.data.group_name] = "edp"
    for dim in groups.shard_mesh.mesh_dim_names if groups.shard_mesh is not None else ():
        names[groups.shard_mesh.get_group(dim).group_name] = dim
    return names


def _mine(rows: torch.Tensor, dim: str) -> dist.ProcessGroup:
    """This rank's group among ``rows`` (one group each), described as ``mesh_<dim>``, which
    the profiler reads as its dimension where no name maps it (``profiler.capture``)."""
    rank, mine = dist.get_rank(), None
    for members in rows.tolist():
        group = dist.new_group(members, timeout=group_timeout(), group_desc=f"mesh_{dim}")
        mine = group if rank in members else mine
    return mine


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` of rows with uneven splits; backward sends the gradients back."""

    @staticmethod
    def forward(ctx, x, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        dist.all_to_all_single(
            out,
            x.contiguous(),
            output_split_sizes=out_splits,
            input_split_sizes=in_splits,
            group=group,
        )
        return out

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        return _AllToAll.apply(grad, in_splits, out_splits, ctx.group), None, None, None


class ExpertParallel:
    """Dispatch to the experts' ranks, run the local experts, combine back."""

    def __init__(self, group: dist.ProcessGroup, ep: int, combine_order=None) -> None:
        self.group, self.ep = group, ep
        self.combine_order = combine_order
        """A permutation of the returned rows, for tests' negative control only."""

    def __call__(self, routed: torch.Tensor, counts: torch.Tensor, experts) -> torch.Tensor:
        local = experts.num_local
        send = counts.reshape(self.ep, local).contiguous()  # tokens for rank r's expert j
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=self.group)
        send_splits, recv_splits = send.sum(1).tolist(), recv.sum(1).tolist()
        arrived = _AllToAll.apply(routed, recv_splits, send_splits, self.group)
        order, per_expert = _by_local_expert(recv)
        out = torch.empty_like(arrived).index_copy(0, order, experts(arrived[order], per_expert))
        back = _AllToAll.apply(out, send_splits, recv_splits, self.group)
        return back if self.combine_order is None else back[self.combine_order(back)]


def _by_local_expert(recv: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    """Rows arrived source-rank-major (rank r's tokens for local experts 0 … L−1, then r+1's):
    the permutation that orders them by local expert, and the count per local expert."""
    counts = recv.tolist()
    starts, offset = [], 0
    for row in counts:
        starts.append([])
        for n in row:
            starts[-1].append(offset)
            offset += n
    index = [
        i
        for j in range(recv.shape[1])
        for r in range(recv.shape[0])
        for i in range(starts[r][j], starts[r][j] + counts[r][j])
    ]
    return torch.tensor(index, dtype=torch.long), recv.sum(0).tolist()


def apply_ep(part: nn.Module, config: TrialConfig) -> None:
    """Keep this rank's experts of each MoE layer and hand the layer its dispatch; mark the
    experts (and every MoE buffer: DDP would broadcast rank 0's token counts) as data
    parallelism's to leave alone."""
    moes = moe_layers(part)
    local: set[nn.Parameter] = set()
    if config.ep_degree > 1:
        groups = expert_groups(config, next(part.parameters()).device.type)
        rank = dist.get_rank(groups.ep)
        for moe in moes:
            _keep_local_experts(moe, rank, config.ep_degree)
            moe.ep = ExpertParallel(groups.ep, config.ep_degree)
            local |= set(moe.experts.parameters())
    setattr(part, LOCAL_PARAMS, local)
    names = [n for n, p in part.named_parameters() if p in local]
    names += [
        n for n, b in part.named_buffers() if n.endswith(("expert_bias", "tokens_per_expert"))
    ]
    nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(part, names)


@torch.no_grad()
def _keep_local_experts(moe: MoE, rank: int, ep: int) -> None:
    experts = moe.experts
    num = experts.num_local // ep
    experts.first = rank * num
    for name in ("w1", "w2", "w3"):
        full = getattr(experts, name)
        setattr(experts, name, nn.Parameter(full[rank * num : (rank + 1) * num].clone()))


def local_params(part: nn.Module) -> set[nn.Parameter]:
    """The parameters of ``part`` data parallelism leaves alone (``apply_ep``)."""
    return getattr(part, LOCAL_PARAMS, set())


def shard_experts(part: nn.Module, config: TrialConfig, **fsdp) -> None:
    """ZeRO-2/3 under ep: each MoE layer's experts one FSDP2 unit on the expert-data mesh
    (``fsdp``: ``fully_shard``'s reshard, offload and precision arguments), the gradient
    divided by the stage's ranks; call it before the blocks' ``fully_shard``, which then leaves
    the experts to their own unit. Nothing where the expert-data group is one rank.
    Collective: the first layout of a shape makes the mesh's groups (``_shard_mesh``)."""
    if config.ep_degree == 1 or not moe_layers(part):
        return
    device_type = next(part.parameters()).device.type
    groups = expert_groups(config, device_type)
    if groups.data is None:
        return
    if groups.shard_mesh is None:
        ranks = torch.arange(dist.get_world_size()).reshape(config.dims.expert_mesh_shape)
        groups.shard_mesh = _shard_mesh(ranks, device_type, groups.data)
    mesh = groups.shard_mesh
    for moe in moe_layers(part):
        placement = None
        if mesh.size() * config.ep_degree > moe.spec.num_experts:
            placement = _shard_dim_1  # fewer local experts than shards: torchtitan's Shard(1)
        fully_shard(moe.experts, mesh=mesh, shard_placement_fn=placement, **fsdp)
        moe.experts.set_gradient_divide_factor(float(config.world_size // config.pp_degree))
        # a SUM, then the division: the factor is not the group's size, and PREMUL_SUM's
        # op would differ by rank (gloo has none)
        moe.experts.set_force_sum_reduction_for_comms(True)
    setattr(part, LOCAL_PARAMS, set())


def _shard_dim_1(param: nn.Parameter) -> Shard:
    return Shard(1)


class MoEStep:
    """What runs before each optimizer step of a mixture of experts: ``run()``; ``history``:
    per step, this rank's (token, slot) pairs routed to each expert of each of its MoE layers
    ([layers][E], summed over the step's micro-batches; twice each under full recomputation,
    which runs the router again), the measured routing a trial stores."""

    def __init__(self, run: Callable[[], None]) -> None:
        self.history: list[list[list[float]]] = []
        self._run = run

    def __call__(self) -> None:
        self._run(self.history)


def moe_step(parts: list[nn.Module], config: TrialConfig, mesh: TrialMesh) -> MoEStep | None:
    """What runs before each optimizer step of a mixture of experts (None for a dense model):
    the step's token counts recorded, the experts' gradient sync under ep, then the balancing
    biases' update."""
    moes = [m for p in parts for m in moe_layers(p)]
    if not moes:
        return None
    experts = [
        p for m in moes if not isinstance(m.experts, FSDPModule) for p in m.experts.parameters()
    ]
    device_type = next(parts[0].parameters()).device.type
    expert_dp = expert_groups(config, device_type).data if config.ep_degree > 1 else None
    stage_ranks = config.world_size // config.pp_degree
    grads = mesh.grads

    def reduce(counts: torch.Tensor) -> None:
        if grads.size() > 1:
            for name in grads.mesh_dim_names:
                dist.all_reduce(counts, group=grads.get_group(name))

    def step(history: list) -> None:
        history.append([m.tokens_per_expert.tolist() for m in moes])
        if config.ep_degree > 1:
            for p in experts:
                if p.grad is None:
                    continue
                if expert_dp is not None:
                    with group_range("edp"):  # gloo's spans name no group
                        dist.all_reduce(p.grad, group=expert_dp)
                p.grad.div_(stage_ranks)
        update_expert_bias(moes, reduce)
        for m in moes:  # a layer without a bias keeps no count across steps either
            m.tokens_per_expert.zero_()

    return MoEStep(step)
