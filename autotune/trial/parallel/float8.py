"""Float8 linears: torchao's float8 training (``torchao.float8.convert_to_float8_training``)
with its default recipe, dynamic tensor-wise scaling (e4m3 for inputs and weights, e5m2 for
output gradients), the rest of the model in bf16. Applied to the whole (stage) model before
tensor parallelism, as torchtitan converts its model before ``parallelize`` (its
``Float8LinearConverter``, ``torchtitan/components/quantization/float8.py``).

It runs only where float8 matmuls exist: a CUDA GPU of compute capability ≥ 8.9 (Ada, Hopper,
Blackwell: ``torch._scaled_mm``), with the optional extra ``autotune[float8]`` installed. Linear
layers whose dimensions are not multiples of 16 stay in bf16 (the matmul's alignment rule,
torchao's ``_auto_filter_for_recipe`` and torchtitan's filter).
"""

from __future__ import annotations

import importlib.util

import torch
from torch import nn

from autotune.config import TrialConfig
from autotune.errors import ConfigError

MIN_CAPABILITY = (8, 9)
"""The first NVIDIA architecture with float8 tensor cores: Ada (sm_89); Hopper is 9.0."""


def check_float8(config: TrialConfig, device: torch.device) -> None:
    """Refuse float8 at trial start, in one line naming why, where it cannot run."""
    if not config.float8:
        return
    if device.type != "cuda":
        raise ConfigError(
            f"float8 needs a CUDA GPU of compute capability ≥ 8.9, but this trial "
            f"runs on {device.type} (device {config.device!r}, no GPU visible); "
            "turn float8 off or run on an H100/L40S-class GPU"
        )
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_CAPABILITY:
        raise ConfigError(
            f"float8 needs compute capability ≥ 8.9, but {torch.cuda.get_device_name(device)} "
            f"is {capability[0]}.{capability[1]} (no float8 matmul); turn float8 off"
        )
    if importlib.util.find_spec("torchao") is None:
        raise ConfigError(
            "float8 trains with torchao, which is not installed; "
            "pip install 'autotune[float8]' or turn float8 off"
        )
    if config.tp_degree > 1:
        raise ConfigError(
            f"float8 with tp_degree {config.tp_degree} needs torchao's float8 "
            "tensor-parallel styles, which trials do not apply yet; use "
            "tp_degree 1 or turn float8 off"
        )


def _float8_aligned(module: nn.Module, fqn: str) -> bool:
    return (
        isinstance(module, nn.Linear)
        and module.in_features % 16 == 0
        and module.out_features % 16 == 0
    )


def apply_float8(model: nn.Module) -> nn.Module:
    """Swap every aligned ``nn.Linear`` for torchao's ``Float8Linear`` in place."""
    from torchao.float8 import convert_to_float8_training

    return convert_to_float8_training(model, module_filter_fn=_float8_aligned)
