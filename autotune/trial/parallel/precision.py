"""Training precision (Lightning's names), the way production trains in it.

| precision   | model parameters (at rest)          | master copy | optimizer state | compute |
|-------------|-------------------------------------|-------------|-----------------|---------|
| 32-true     | fp32                                | none        | fp32            | fp32    |
| bf16-true   | bf16                                | none        | bf16            | bf16    |
| 16-true     | fp16                                | none        | fp16            | fp16    |
| bf16-mixed  | ZeRO 0/1: bf16; ZeRO 2/3: fp32 shard| fp32        | fp32            | bf16    |
| 16-mixed    | as bf16-mixed, in fp16, with a dynamic loss scale                            |

Mixed precision keeps fp32 master parameters and AdamW moments and computes in half precision
(Micikevicius et al. 2018, "Mixed Precision Training"; the ZeRO paper's 16Φ: 2Φ half
parameters + 2Φ half gradients + 12Φ fp32 master parameters, momentum and variance). Two
mechanisms give it:

- **ZeRO-2/3 (FSDP2)**: the sharded parameters stay fp32 (they are the master copy) and
  ``MixedPrecisionPolicy(param_dtype=half, reduce_dtype=fp32)`` gathers them in half precision
  for compute and reduce-scatters the gradients in fp32 (torchtitan's default).
- **ZeRO-0/1 and no data parallelism** (DeepSpeed's and Megatron's fp16/bf16 optimizers): the
  model itself is cast to half precision, so DDP all-reduces half-precision gradients, and
  :class:`MasterWeightAdamW` keeps the fp32 master copy and moments of the parameters it is
  given. Under ZeRO-1 it is ``ZeroRedundancyOptimizer``'s inner optimizer, so each rank holds
  the master copy of its partition only (4Φ + 12Φ/N) and the updated half-precision
  parameters are broadcast from their owners.

Every mixed path starts from the fp32 initialisation rounded to the compute dtype (as the
half-precision model of DeepSpeed and Megatron does, whose master copy is made from it), so
all layouts train the same model. ``16-mixed`` scales the loss (:class:`LossScaler`): fp16's
5-bit exponent flushes small gradients to zero, bf16's 8-bit exponent (fp32's) does not.
Autocast is on for every half-precision compute dtype, so normalisation and softmax run in
fp32 where torch's autocast lists say so.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn

from autotune.config import (
    MASTER_STEP_CHUNK_NUMEL,
    MIXED_PRECISIONS,
    PRECISION_COMPUTE_DTYPE,
    TrialConfig,
)
from autotune.errors import ConfigError
from autotune.trial.parallel.distributed_optimizer import local_tensor

TORCH_DTYPE = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def compute_dtype(precision: str) -> torch.dtype:
    return TORCH_DTYPE[PRECISION_COMPUTE_DTYPE[precision]]


def is_mixed(precision: str) -> bool:
    return precision in MIXED_PRECISIONS


def uses_fsdp(config: TrialConfig) -> bool:
    """Whether the data-parallel wrapper is FSDP2 (ZeRO-2/3 over more than one rank of dp × cp:
    context-parallel ranks share parameters, ``mesh.data_parallel_mesh``)."""
    return config.dp_degree * config.cp_degree > 1 and config.zero_stage >= 2


def check_precision_supported(
    precision: str, device_type: str, *, bf16_supported: bool, device_name: str
) -> None:
    """Refuse a precision the device cannot compute in.

    CUDA: bfloat16 needs compute capability ≥ 8.0 (Ampere; torch's ``is_bf16_supported``
    without emulation); fp16 runs on every CUDA device torch supports. CPU: torch 2.13 runs
    both, in autocast and in plain half-precision tensors, on any core (emulated where the
    instruction set lacks them: fp16 matmuls were 68× slower than fp32 on the AVX512
    development machine), so nothing is refused there.
    """
    if (
        device_type == "cuda"
        and compute_dtype(precision) == torch.bfloat16
        and not (bf16_supported)
    ):
        raise ConfigError(
            f"precision {precision} needs a GPU with bfloat16 (compute capability ≥ 8.0, e.g. "
            f"A100, H100); {device_name} has none: use 16-mixed or 32-true"
        )


def check_device_precision(precision: str, device: torch.device) -> None:
    """:func:`check_precision_supported` for this process's device."""
    if device.type == "cuda":
        check_precision_supported(
            precision,
            "cuda",
            bf16_supported=torch.cuda.is_bf16_supported(including_emulation=False),
            device_name=torch.cuda.get_device_name(device),
        )


def apply_precision(part: nn.Module, config: TrialConfig) -> nn.Module:
    """Put a model part's parameters in the dtype they are stored in at rest
    (``config.precision`` resolved)."""
    precision = config.precision
    if precision == "32-true":
        return part
    half = compute_dtype(precision)
    if is_mixed(precision) and uses_fsdp(config):
        # FSDP2 keeps fp32 (the master copy) and casts when it gathers; start from the same
        # rounded values as the half-precision model of the other layouts.
        with torch.no_grad():
            for p in part.parameters():
                p.copy_(p.to(half).float())
        return part
    return part.to(half)


def mp_policy(precision: str):
    """FSDP2's policy: gather in the compute dtype, reduce-scatter gradients in fp32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if not is_mixed(precision):
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=compute_dtype(precision), reduce_dtype=torch.float32)


def optimizer_class(config: TrialConfig) -> type[torch.optim.Optimizer]:
    """AdamW, holding fp32 master weights when the model itself is half precision and mixed.

    ``config.precision`` must be resolved (``TrialConfig.with_precision``)."""
    if is_mixed(config.precision) and not uses_fsdp(config):
        return MasterWeightAdamW
    return torch.optim.AdamW


class MasterWeightAdamW(torch.optim.Optimizer):
    """AdamW on fp32 master copies of half-precision parameters (Loshchilov & Hutter 2019).

    Each parameter's state holds ``master`` (fp32 copy of its local tensor), ``exp_avg``,
    ``exp_avg_sq`` (fp32) and ``step``. A step updates the masters exactly as torch's AdamW
    updates parameters, with its multi-tensor ops (``torch._foreach_*``, the arithmetic of
    ``torch.optim.adam._multi_tensor_adam``), over chunks of at most
    ``max(largest tensor, MASTER_STEP_CHUNK_NUMEL)`` elements: the half-precision gradients are
    copied into one fp32 buffer (which then holds the denominator), the masters updated, and
    written back to the parameters rounded — a fixed number of ops per chunk, so on CUDA a few
    multi-tensor kernels instead of ~10 kernels per parameter. Elementwise, so a DTensor
    parameter's local shard is updated on its own.
    """

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        for group in self.param_groups:
            for p in group["params"]:
                local = local_tensor(p.detach())
                self.state[p] = {
                    "master": local.float().clone(),
                    "exp_avg": torch.zeros_like(local, dtype=torch.float32),
                    "exp_avg_sq": torch.zeros_like(local, dtype=torch.float32),
                    "step": torch.zeros((), dtype=torch.float32),
                }

    @torch.no_grad()
    def step(self, closure=None):  # noqa: D102 - torch.optim.Optimizer.step
        for group in self.param_groups:
            live = [p for p in group["params"] if p.grad is not None]
            for chunk in step_chunks(
                [local_tensor(p).numel() for p in live], MASTER_STEP_CHUNK_NUMEL
            ):
                self._step_chunk(group, [live[i] for i in chunk])
        return None

    def _step_chunk(self, group: dict, params: list[torch.Tensor]) -> None:
        lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
        states = [self.state[p] for p in params]
        masters = [s["master"] for s in states]
        exp_avgs = [s["exp_avg"] for s in states]
        exp_avg_sqs = [s["exp_avg_sq"] for s in states]
        steps = [s["step"] for s in states]
        # One fp32 buffer for the chunk's gradients; it later holds the denominator.
        flat = torch.empty(
            sum(m.numel() for m in masters), dtype=torch.float32, device=masters[0].device
        )
        grads = [b.view_as(m) for b, m in zip(flat.split([m.numel() for m in masters]), masters)]
        torch._foreach_copy_(grads, [local_tensor(p.grad) for p in params])
        torch._foreach_add_(steps, 1.0)
        step_values = torch.stack(steps).tolist()
        if group["weight_decay"]:
            torch._foreach_mul_(masters, 1 - lr * group["weight_decay"])
        torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
        denom = grads
        torch._foreach_copy_(denom, exp_avg_sqs)
        torch._foreach_sqrt_(denom)
        torch._foreach_div_(denom, [math.sqrt(1 - beta2**s) for s in step_values])
        torch._foreach_add_(denom, eps)
        torch._foreach_addcdiv_(
            masters, exp_avgs, denom, [-lr / (1 - beta1**s) for s in step_values]
        )
        torch._foreach_copy_([local_tensor(p) for p in params], masters)


def step_chunks(numels: list[int], limit: int) -> list[list[int]]:
    """Indices of consecutive tensors of ``numels`` grouped into chunks of at most
    ``max(limit, largest)`` elements (``MasterWeightAdamW``'s passes)."""
    cap = max([limit, *numels])
    chunks: list[list[int]] = []
    size = cap
    for i, n in enumerate(numels):
        if size + n > cap:
            chunks.append([])
            size = 0
        chunks[-1].append(i)
        size += n
    return chunks


class LossScaler:
    """Dynamic loss scaling for fp16 (Micikevicius et al. 2018, §3.2; the schedule of
    DeepSpeed's and apex's dynamic scaler): multiply the loss by S before backward, divide the
    gradients by S before the step; if any rank finds a non-finite gradient, skip the step on
    every rank and halve S; after ``growth_interval`` clean steps, double S.

    Ranks hold different gradients under ZeRO-2/3 (shards), TP and PP (stages), so whether to
    skip is agreed by one all-reduce (MAX) over the whole world: it is sharding-aware where
    ``torch.amp.GradScaler`` (which also refuses fp16 gradients) is not.
    """

    def __init__(self, init_scale: float = 2.0**16, growth_interval: int = 2000) -> None:
        self.scale = init_scale
        self.growth_interval = growth_interval
        self._clean_steps = 0
        self.num_skipped = 0

    def unscale_and_check(self, params: list[nn.Parameter], device: torch.device) -> bool:
        """Divide gradients by the scale; True if the step should run on every rank."""
        found = torch.zeros((), device=device)
        inv = 1.0 / self.scale
        for p in params:
            if p.grad is None:
                continue
            g = local_tensor(p.grad)
            g.mul_(inv)
            found = torch.maximum(found, (~torch.isfinite(g)).any().to(found.dtype))
        if dist.is_initialized():
            dist.all_reduce(found, op=dist.ReduceOp.MAX)
        ok = not bool(found.item())
        if ok:
            self._clean_steps += 1
            if self._clean_steps % self.growth_interval == 0:
                self.scale *= 2.0
        else:
            self.scale /= 2.0
            self._clean_steps = 0
            self.num_skipped += 1
        return ok
