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
    """Within each module, those layouts are permuted among the slots they held, each world's
    in its own order (the sort is stable); every other test keeps its place."""
    worlds: dict[str, list[tuple[int, int]]] = {}  # module → (slot, world size) of its layouts
    for slot, item in enumerate(items):
        world = _world_size(item)
        if world is not None:
            worlds.setdefault(str(item.path), []).append((slot, world))
    for layouts in worlds.values():
        ordered = [items[slot] for slot, _ in sorted(layouts, key=lambda layout: layout[1])]
        for (slot, _), item in zip(layouts, ordered):
            items[slot] = item
