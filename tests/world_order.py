"""Run the layouts that share the session's executor grouped by world size.

The executor keeps one warm worker group; each change of world size starts a new one, whose
ranks each import torch (7 s for 4 ranks on 2 cores). A module's parametrized layouts of 2 and 4
ranks, in several test functions, changed world size up to 9 times a module."""

from __future__ import annotations

import pytest


def _world_size(item) -> int | None:
    """The world size of a test's ``TrialConfig`` parameter run on the session's executor."""
    from autotune.config import TrialConfig

    params = getattr(item, "callspec", None)
    if params is None or "executor" not in item.fixturenames:
        return None
    worlds = [p.world_size for p in params.params.values() if isinstance(p, TrialConfig)]
    return worlds[0] if worlds else None


@pytest.hookimpl(trylast=True)  # after pytest's own reordering and -m's deselection
def pytest_collection_modifyitems(items) -> None:
    """Within each module, the layouts that run on the session's executor are run grouped by
    world size (in the slots they held, each world's in their own order): the executor keeps
    one warm worker group, and each change of world size starts a new one (7 s for 4 ranks on
    2 cores, for the imports of torch in each rank)."""
    by_module: dict[str, list[int]] = {}
    for index, item in enumerate(items):
        if _world_size(item) is not None:
            by_module.setdefault(str(item.path), []).append(index)
    for slots in by_module.values():
        ordered = sorted((items[i] for i in slots), key=_world_size)  # stable: each world's order
        for slot, item in zip(slots, ordered):
            items[slot] = item
