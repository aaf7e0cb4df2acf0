"""The per-rank trial runner: build, parallelise, warm up, time, measure memory.

Runs inside a process whose default process group is already initialised (a Ray worker, or a
test's spawned process). Every rank builds the same model from the same seed, so the trial
trains exactly the model the single-process reference trains.

Phases: ``num_warmup_steps`` untimed steps, ``num_timed_steps`` timed steps (each rank times its
own step; the trial's step time is the median over steps of the slowest rank), then one memory
step measured by the CUDA allocator or, on CPU, by the profiler's allocation events.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch._C._profiler import _ExtraFields_Allocation as _AllocationFields
from torch.profiler import ProfilerActivity, profile

from autotune.config import TrialConfig
from autotune.errors import ConfigError
from autotune.trial.models.build import build_workload
from autotune.trial.models.workload import Workload
from autotune.trial.parallel.compile import compile_seconds
from autotune.trial.parallel.expert import expert_group_names
from autotune.trial.parallel.float8 import check_float8
from autotune.trial.parallel.mesh import (
    MESH_DIM_NAMES,
    TrialMesh,
    build_mesh,
    cached_mesh_shapes,
)
from autotune.trial.parallel.parallelize import ParallelModel, check_workload_supports, parallelize
from autotune.trial.parallel.precision import check_device_precision, compute_dtype
from autotune.trial.parallel.zero import local_tensor, resident
from autotune.trial.result import MemoryBreakdown, RankResult
from autotune.trial.strict_collectives import install_from_env as strict_collectives_from_env
from profiler import Span
from profiler import record as profile_record
from profiler.clock import measure_offset


def resolve_device(config: TrialConfig) -> torch.device:
    if config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise ConfigError(
                "device 'cuda' was asked for but no CUDA device is visible; "
                "use device 'cpu' or 'auto'"
            )
        # The rank's own GPU, named by its index: every GPU of the node is visible, and the
        # executor has set this rank's (``device_map``) current before the process group. The
        # allocator figures, synchronize and the device name below all pass this device.
        return torch.device("cuda", torch.cuda.current_device())
    if config.optimizer_offload_enabled:
        raise ConfigError("optimizer_offload_enabled needs a CUDA device; none is visible")
    return torch.device("cpu")


class Trainer:
    """Runs optimizer steps of a parallelised workload on this rank."""

    def __init__(self, pm: ParallelModel, workload: Workload, device: torch.device) -> None:
        self.pm = pm
        self.workload = workload
        self.device = device
        self.config = pm.config
        dtype = compute_dtype(self.config.precision)
        self.autocast_dtype = None if dtype == torch.float32 else dtype
        self._local_losses: list[torch.Tensor] = []

    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def step(self, step: int, on_grads=None, phase=None) -> None:
        """One optimizer step. ``phase(name)`` (profiled steps only) opens a named range around
        forward / backward / optimizer / pipeline work; timed steps carry no annotation."""
        config, pm = self.config, self.pm
        phase = phase or _no_phase
        inputs, targets = self.workload.batch(step)
        rows = config.workload.global_batch_size // config.dp_degree
        lo = pm.coords.dp_rank * rows
        inputs, targets = inputs[lo : lo + rows], targets[lo : lo + rows]
        if pm.cp is not None:  # this cp rank's two chunks of every sequence
            inputs, targets = pm.cp.shard(inputs), pm.cp.shard(targets)
        inputs = inputs.to(self.device, non_blocking=True)
        targets = targets.to(self.device, non_blocking=True)
        if pm.schedule is not None:
            with phase("pipeline"):
                loss = self._pipeline_step(inputs, targets)
        else:
            loss = self._accumulation_step(inputs, targets, phase)
        if pm.dp.grad_sync is not None:
            with phase("backward"):
                pm.dp.grad_sync()
        if pm.moe_step is not None:  # the experts' gradients and balancing biases
            pm.moe_step()
        if on_grads is not None:
            on_grads()
        with phase("optimizer"):
            if pm.loss_scaler is None or pm.loss_scaler.unscale_and_check(
                [p for m in pm.parts for p in m.parameters()], self.device
            ):
                pm.dp.optimizer.step()
            pm.dp.optimizer.zero_grad(set_to_none=True)
        has_loss = loss is not None
        self._local_losses.append(
            torch.stack(
                [
                    loss.detach().float() if has_loss else torch.zeros((), device=self.device),
                    torch.tensor(float(has_loss), device=self.device),
                ]
            )
        )

    def _pipeline_step(self, inputs, targets):
        pm = self.pm
        losses: list[torch.Tensor] = []
        args = (inputs,) if pm.is_first_stage else ()
        kwargs = {"target": targets, "losses": losses} if pm.is_last_stage else {}
        kwargs["return_outputs"] = False  # else the last stage keeps every micro-batch's logits
        scale = pm.loss_scaler.scale if pm.loss_scaler is not None else 1.0
        with self._autocast():
            pm.schedule.step(*args, **kwargs)
        return torch.stack(losses).mean() / scale if pm.is_last_stage else None

    def _accumulation_step(self, inputs, targets, phase):
        pm, workload = self.pm, self.workload
        (model,) = pm.parts
        accum = self.config.grad_accum_steps
        scale = pm.loss_scaler.scale if pm.loss_scaler is not None else 1.0
        total = torch.zeros((), device=self.device)
        for i, (x, y) in enumerate(zip(inputs.chunk(accum), targets.chunk(accum))):
            with _grad_sync(model, enabled=i == accum - 1):
                with phase("forward"), self._autocast():
                    loss = workload.loss_fn(model(x), y)
                with phase("backward"):
                    (loss * (scale / accum)).backward()
            total += loss.detach()
        return total / accum

    def losses(self) -> list[float]:
        """Per-step global-batch losses: one all-reduce for all steps, after the timed ones."""
        stacked = torch.stack(self._local_losses)
        dist.all_reduce(stacked)
        return (stacked[:, 0] / stacked[:, 1]).tolist()


def _no_phase(name: str):
    return contextlib.nullcontext()


@contextlib.contextmanager
def _grad_sync(model: torch.nn.Module, enabled: bool):
    """Skip gradient synchronisation on all but the last micro-batch."""
    if enabled:
        yield
    elif isinstance(model, torch.nn.parallel.DistributedDataParallel):
        with model.no_sync():
            yield
    elif hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:
        yield


def _tensor_bytes(tensors) -> int:
    seen: set[int] = set()
    total = 0
    for t in tensors:
        if t is None or not isinstance(t, torch.Tensor):
            continue
        t = local_tensor(t)
        key = t.untyped_storage().data_ptr() if t.numel() else id(t)
        if key in seen:
            continue
        seen.add(key)
        total += t.untyped_storage().nbytes()
    return total


def _optimizer_state_tensors(optimizer: torch.optim.Optimizer):
    # ZeroRedundancyOptimizer and the distributed optimizer keep their shard in ``optim``.
    inner = getattr(optimizer, "optim", optimizer)
    for state in inner.state.values():
        yield from state.values()


def master_copy_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the fp32 master copy a mixed-precision optimizer holds (counted under the
    optimizer state too; 0 under FSDP2, whose fp32 parameter shards are the master copy)."""
    inner = getattr(optimizer, "optim", optimizer)
    return _tensor_bytes(state["master"] for state in inner.state.values() if "master" in state)


def _ddp_bucket_bytes(parts) -> int:
    """Bytes of DDP's gradient buckets: allocated when the wrapper is built and held for the
    trial (with ``gradient_as_bucket_view`` they are the gradients after each sync), so a
    step's allocation events never show them. Sizes from DDP's own record of its buckets
    (``_get_ddp_logging_data``, bytes per bucket), else the parameters the buckets cover."""
    total = 0
    for part in parts:
        if not isinstance(part, torch.nn.parallel.DistributedDataParallel):
            continue
        info = part._get_ddp_logging_data()
        sizes = info.get("rebuilt_bucket_sizes") or info.get("bucket_sizes")
        if isinstance(sizes, str) and sizes.strip():
            total += sum(int(size) for size in sizes.replace(",", " ").split())
        else:
            total += _tensor_bytes(p for p in part.parameters() if p.requires_grad)
    return total


def measure_memory(trainer: Trainer, step: int) -> tuple[MemoryBreakdown, float]:
    """Run one training step and measure this rank's memory by category, with the allocated
    peak and the allocator's reserved peak (on CPU, reserved = allocated).

    The model states counted (and subtracted from the peak) are those resident on the device
    (``zero.resident``): under optimizer offload the sharded parameters, their gradients and
    AdamW's state live in host memory, so on CUDA they read 0 and the peak is all activations,
    gathered parameters and buffers, as the memory model counts them."""
    pm, device = trainer.pm, trainer.device
    params = lambda: [p for m in pm.parts for p in m.parameters()]  # noqa: E731
    grads_bytes = 0

    def on_grads() -> None:
        nonlocal grads_bytes
        grads_bytes = _tensor_bytes(resident((p.grad for p in params()), device))

    if device.type != "cuda":
        # On CPU the profiler gives allocations relative to the step's start. Alive then: the
        # parameters, the optimizer state (none before the first step: AdamW creates it
        # lazily, inside the step) and DDP's buckets; the gradients are freed by zero_grad.
        cpu_at_rest = (
            _tensor_bytes(params())
            + _tensor_bytes(_optimizer_state_tensors(pm.dp.optimizer))
            + _ddp_bucket_bytes(pm.parts)
        )
    start = time.perf_counter()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        at_rest = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        trainer.step(step, on_grads)
        torch.cuda.synchronize(device)
        peak, source = torch.cuda.max_memory_allocated(device), "cuda_allocator"
        reserved = torch.cuda.max_memory_reserved(device)
    else:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            trainer.step(step, on_grads)
        peak = cpu_at_rest + _peak_live_delta(prof)
        source = "cpu_profiler"
        # No caching allocator on CPU: torch's CPU allocator frees a block when its tensor dies,
        # so what was held from the system at the peak is what was allocated.
        reserved = peak
    elapsed = time.perf_counter() - start
    param_bytes = _tensor_bytes(resident(params(), device))
    opt_bytes = _tensor_bytes(resident(_optimizer_state_tensors(pm.dp.optimizer), device))
    states = param_bytes + opt_bytes
    activations = max(0, peak - states - grads_bytes)
    # On CPU nothing else is held at rest: DDP's buckets are the gradients' storage after each
    # sync, so they are counted under the gradients.
    other = max(0, at_rest - states) if device.type == "cuda" else 0
    return MemoryBreakdown(
        param_bytes,
        grads_bytes,
        opt_bytes,
        activations,
        other,
        peak,
        source,
        reserved_peak=reserved,
    ), elapsed


def _peak_live_delta(prof) -> int:
    """Peak of live CPU tensor bytes above the level at the profile's start.

    Blocks are tracked by address. The profiler sees only the threads it profiles, so a block
    whose last reference is dropped on a gloo worker thread is never reported freed; when the
    allocator hands the same address out again, that block was certainly freed before, and it
    leaves the live set then instead of inflating every later reading.
    """
    allocations = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        fields = event.extra_fields
        if isinstance(fields, _AllocationFields) and fields.device.type == "cpu":
            allocations.append((event.start_time_ns, fields.ptr, fields.alloc_size))
    allocations.sort(key=lambda a: a[0])
    live: dict[int, int] = {}
    seen: set[int] = set()
    level = peak = 0
    for _, ptr, size in allocations:
        level -= live.pop(ptr, 0)  # a free, or an earlier block at this address freed unseen
        if size > 0:
            live[ptr] = size
        level += size if size > 0 or ptr not in seen else 0  # a block older than the profile
        seen.add(ptr)
        peak = max(peak, level)
    return peak


def mesh_group_of(launch: str, hsdp: bool = False) -> str:
    """The mesh dimension of a collective, from the API that launched it.

    Gloo's events name no process group, but each mechanism here talks on one mesh dim:
    DTensor (tensor parallelism) launches functional collectives on tp; pipelining sends and
    receives on pp; expert parallelism's dispatch and combine are the only all-to-alls, on ep;
    DDP, FSDP2, replicate, ZeroRedundancyOptimizer, the distributed optimizer and the bucketed
    all-reduce launch c10d collectives on dp (the experts' FSDP2 units too: on CUDA their
    records name efsdp, ``expert.expert_group_names``). Under HSDP (``hsdp``: dp_replicate
    and dp_shard both > 1) FSDP2 all-gathers and reduce-scatters on dp_shard and all-reduces the
    reduced shard on dp_replicate (torch ``_fsdp_collectives.foreach_reduce``)."""
    if launch.startswith("_c10d_functional::"):
        return "tp"
    if launch.startswith(("c10d::send", "c10d::recv")):
        return "pp"
    if launch.startswith("c10d::alltoall"):
        return "ep"
    if hsdp:
        return "dp_replicate" if launch.startswith("c10d::allreduce") else "dp_shard"
    return "dp"


def mesh_group_names(mesh) -> dict[str, str]:
    """Each mesh dimension's process-group name (``ProcessGroup.group_name``, which NCCL's
    records carry as "Process Group Name") → the dimension. A dimension as large as the world
    is the default group; of dimensions that share a group, the largest names it, and dp (the
    flattened data-parallel dims, after them) wins a tie with the DP dim it equals."""
    dims = sorted(MESH_DIM_NAMES + ("dp",), key=lambda dim: mesh[dim].size())
    return {mesh.get_group(dim).group_name: dim for dim in dims}


def _is_hsdp(config: TrialConfig) -> bool:
    return config.dp_replicate > 1 and config.dp_shard > 1


def release_cached_blocks(device: torch.device) -> None:
    """Hand the blocks earlier trials of this worker left in CUDA's caching allocator back to
    the device, so that this trial's reserved peak is its own. Without it, reserved only grew
    from trial to trial in a warm group: on the H200 (``docs/gpu-runs``, run 2) a bf16-true
    trial allocating 14.6 GiB read a reserved peak of 46.3 GiB, the largest trial's before it."""
    if device.type == "cuda":
        gc.collect()  # the previous trial's tensors caught in reference cycles
        torch.cuda.empty_cache()


def run_rank(config: TrialConfig) -> RankResult:
    """Run one trial on this rank of the (already initialised) default process group."""
    t0 = time.perf_counter()
    strict_collectives_from_env()  # AUTOTUNE_STRICT_COLLECTIVES=1: NCCL's rules on any backend
    device = resolve_device(config)
    release_cached_blocks(device)
    outside = OutsideAllocator.start(device, config)
    check_float8(config, device)
    config = config.with_precision(device.type)
    check_device_precision(config.precision, device)
    workload = build_workload(
        config.workload, attention=config.attention, seed=config.seed, device=device
    )
    check_workload_supports(config, workload)
    if dist.get_world_size() != config.world_size:
        raise ConfigError(
            f"the worker group has {dist.get_world_size()} ranks but the config "
            f"asks for world_size {config.world_size}"
        )
    mesh = build_mesh(config, device.type)
    pm = parallelize(workload, config, mesh, device)
    trainer = Trainer(pm, workload, device)
    setup_s = time.perf_counter() - t0
    num_steps = config.timed_steps.stop  # the warm-up and timed steps (config.step_schedule)
    step_times = timed_steps(trainer, num_steps)
    # Profiled steps come after the timed ones: throughput is never measured under the profiler,
    # which detaches CUPTI when it stops (``profiler.capture.record``), before any later step.
    spans, offset = _profiled_steps(config, trainer, mesh, device, num_steps, step_times)
    num_steps += config.num_profiled_steps
    memory, memory_s = measure_memory(trainer, num_steps)
    step_times.append(memory_s)
    losses = trainer.losses()
    c = pm.coords
    extra = {}
    if config.compile:  # the lazy compilation ran in the first warm-up step
        extra["compile_s"] = compile_seconds(
            step_times, config.num_warmup_steps, config.num_timed_steps
        )
    return RankResult(
        rank=dist.get_rank(),
        pp_rank=c.pp_rank,
        dp_rank=c.dp_rank,
        tp_rank=c.tp_rank,
        cp_rank=c.cp_rank,
        device=str(device),
        backend=dist.get_backend(),
        num_threads=torch.get_num_threads(),
        step_times=step_times,
        losses=losses,
        memory=memory,
        setup_s=setup_s,
        spans=spans,
        clock_offset_ns=offset,
        extra={
            "pid": os.getpid(),
            "master_copy_bytes": master_copy_bytes(pm.dp.optimizer),
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "non_allocator_bytes": outside.bytes() if outside is not None else None,
            **({"tokens_per_expert": pm.moe_step.history} if pm.moe_step is not None else {}),
            **extra,
        },
    )


def timed_steps(trainer: Trainer, num_steps: int) -> list[float]:
    """Run steps 0 … ``num_steps - 1`` unprofiled: each one's seconds, the device synchronised."""
    device, times = trainer.device, []
    for step in range(num_steps):
        start = time.perf_counter()
        trainer.step(step)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return times


def _profiled_steps(
    config: TrialConfig,
    trainer: Trainer,
    mesh: TrialMesh,
    device: torch.device,
    first: int,
    step_times: list[float],
) -> tuple[list[Span], int]:
    """Run the profiled steps after step ``first - 1`` (their times appended to
    ``step_times``): their spans and the clock offset they were recorded with."""
    if not config.num_profiled_steps:
        return [], 0
    offset = measure_offset()
    with profile_record(
        rank=dist.get_rank(),
        clock_offset_ns=offset,
        group_of=functools.partial(mesh_group_of, hsdp=_is_hsdp(config)),
        group_names={**mesh_group_names(mesh), **expert_group_names(config, device.type)},
        cuda=device.type == "cuda",
    ) as rec:
        for step in range(first, first + config.num_profiled_steps):
            start = time.perf_counter()
            with rec.step(step):
                trainer.step(step, phase=rec.phase)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
            step_times.append(time.perf_counter() - start)
    return rec.spans, offset


def non_allocator_bytes(device: torch.device) -> int | None:
    """Device memory in use outside this process's caching allocator, read after the trial's
    steps: the CUDA context, NCCL's communicator buffers (``ncclCudaCalloc`` allocates them with
    cudaMalloc, not through torch), and anything else holding the device. ``mem_get_info``
    (cudaMemGetInfo) gives the device's free and total bytes; what is neither free nor reserved
    by the allocator lies outside it. None on CPU, which has no such split."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    free, total = torch.cuda.mem_get_info(device)
    return max(0, total - free - torch.cuda.memory_reserved(device))


def mesh_shape(config: TrialConfig) -> tuple[int, ...]:
    """The shape ``build_mesh`` keys its cached meshes by (``cached_mesh_shapes``)."""
    return (
        config.pp_degree,
        config.dp_replicate,
        config.dp_shard,
        config.cp_degree,
        config.tp_degree,
    )


_GROUP_BYTES: dict[tuple[int, ...], int] = {}
"""Device bytes outside the allocator that each cached mesh shape's trials added: its
sub-groups' NCCL communicators (made when the groups are, on a device-bound world group, and
their connections' buffers when a collective first needs them). Kept per worker process, as
the meshes are."""


@dataclass(frozen=True)
class OutsideAllocator:
    """This trial's device memory outside the caching allocator, as a fresh worker would hold
    it: the device's figure (``non_allocator_bytes``) less what the other mesh shapes' cached
    sub-groups hold (``trial/parallel/mesh.py`` keeps the last ``MESH_CACHE_SIZE`` shapes'
    groups alive, each with its communicators). Without that, a trial read the communicators of
    up to two earlier layouts as its own, and whether it fit depended on what ran before it.

    Each trial's growth (end minus start, plus what the shapes its mesh build destroyed had
    held) is booked to its own shape. What a worker allocates once for all trials (the CUDA
    context, the world group's communicator) stays in every reading; what the first trial of a
    process loads lazily is booked to its shape, so a later trial of another shape reads that
    much less while the first shape stays cached."""

    device: torch.device
    shape: tuple[int, ...]
    before: int
    cached: tuple[tuple[int, ...], ...]

    @classmethod
    def start(cls, device: torch.device, config: TrialConfig) -> OutsideAllocator | None:
        """Read the device at the trial's start (before its mesh); None on CPU."""
        before = non_allocator_bytes(device)
        if before is None:
            return None
        return cls(device, mesh_shape(config), before, tuple(cached_mesh_shapes()))

    def bytes(self) -> int:
        """Read the device at the trial's end: the bytes this trial's layout holds outside the
        allocator. Books the trial's growth to its shape."""
        after = non_allocator_bytes(self.device) or 0
        cached = set(cached_mesh_shapes())
        freed = sum(_GROUP_BYTES.pop(s, 0) for s in self.cached if s not in cached)
        for gone in [s for s in _GROUP_BYTES if s not in cached]:
            del _GROUP_BYTES[gone]
        growth = after - self.before + freed
        _GROUP_BYTES[self.shape] = max(0, _GROUP_BYTES.get(self.shape, 0) + growth)
        others = sum(b for s, b in _GROUP_BYTES.items() if s != self.shape)
        return max(0, after - others)
