"""The exports' own loaders, as the tests call them: Accelerate's ParallelismConfig read from the
environment its launcher prepares, and torchtitan's ConfigManager loading a written module."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def accelerate_parallelism_config(env: dict[str, str]):
    """Accelerate's ``ParallelismConfig()`` as a launched process builds it: from the
    ``PARALLELISM_CONFIG_*`` variables of ``prepare_multi_gpu_env``'s ``env``, set only while
    it reads them."""
    from accelerate.parallelism_config import ParallelismConfig

    saved = {k: os.environ.get(k) for k in env if k.startswith("PARALLELISM_CONFIG")}
    os.environ.update({k: env[k] for k in saved})
    try:
        return ParallelismConfig()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def load_torchtitan_module(folder: Path):
    """torchtitan's ConfigManager on ``folder``'s ``torchtitan_config.py``, config
    ``autotune_best``, as ``torchtitan.train --module torchtitan_config`` loads it."""
    from torchtitan.config.manager import ConfigManager

    sys.path.insert(0, str(folder))
    try:
        return ConfigManager().parse_args(
            ["--module", "torchtitan_config", "--config", "autotune_best"]
        )
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("torchtitan_config", None)
