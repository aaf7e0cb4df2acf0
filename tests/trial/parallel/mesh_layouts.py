"""Trial configurations by mesh shape, for the mesh tests."""

from __future__ import annotations

DEGREES = ("pp_degree", "dp_replicate", None, "cp_degree", "tp_degree")
"""The config field of each dim of a (pp, dp_replicate, dp_shard, cp, tp) shape; dp_shard is
what the world leaves."""


def layout(shape: tuple[int, ...], world: int):
    """A ZeRO-2 (FSDP2, so HSDP shapes run too) CPU configuration of mesh ``shape``."""
    from autotune.config import TrialConfig

    degrees = {field: size for field, size in zip(DEGREES, shape) if field is not None}
    return TrialConfig(world_size=world, zero_stage=2, device="cpu", **degrees)
