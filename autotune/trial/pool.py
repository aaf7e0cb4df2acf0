"""Several worker groups side by side, so a search runs as many trials at once as the cluster
has room for.

Each slot is a ``RayExecutor`` holding its own worker group (placement group, actors, process
group), so concurrent trials never share a process group. ``run`` is thread-safe: it takes an
idle slot, runs the trial on it and hands the slot back.

How many slots by default: on GPUs, the cluster's GPUs // world size (trials on disjoint devices
do not time each other). On CPUs one: CPU ranks already share the node's cores, and two trials
on the same cores would each measure the other's load. ``--parallel N`` asks for N.
"""

from __future__ import annotations

import dataclasses
import queue
import threading

import ray

from autotune.config import TrialConfig
from autotune.errors import ClusterError
from autotune.trial.executor import ExecutorSettings, RayExecutor, check_capacity
from autotune.trial.result import TrialResult


def auto_slots(world_size: int, device: str) -> int:
    """Trials the started Ray cluster can run at once without them timing each other."""
    gpus = int(ray.cluster_resources().get("GPU", 0))
    if device != "cpu" and gpus >= world_size:
        return max(1, gpus // world_size)
    return 1


class TrialPool:
    """Up to ``slots`` trials at once, each on its own worker group.

    ``slots=None`` decides when Ray is up (``auto_slots`` for ``world_size`` and ``device``).
    """

    def __init__(
        self,
        settings: ExecutorSettings | None = None,
        slots: int | None = 1,
        *,
        world_size: int = 1,
        device: str = "auto",
    ) -> None:
        if slots is not None and slots < 1:
            raise ClusterError(f"--parallel must be ≥ 1, not {slots}")
        self.settings = settings or ExecutorSettings()
        self._asked, self._world_size, self._device = slots, world_size, device
        self._ray = RayExecutor(self.settings)  # starts (or joins) Ray; owns a local one
        self._executors: list[RayExecutor] = []
        self._idle: queue.SimpleQueue[RayExecutor] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self.running = 0
        self.max_running = 0
        """The most trials seen running at once."""

    @property
    def slots(self) -> int:
        self.start()
        return len(self._executors)

    def start(self) -> None:
        """Start Ray and size the pool (idempotent)."""
        with self._lock:
            if self._executors:
                return
            self._ray.start()
            slots = self._asked or auto_slots(self._world_size, self._device)
            if slots > 1:
                use_gpu = self._device != "cpu" and ray.cluster_resources().get("GPU", 0) >= 1
                check_capacity(
                    f"{slots} concurrent trials of {self._world_size} ranks need",
                    slots * self._world_size,
                    use_gpu,
                    self.settings,
                    "lower --parallel",
                )
            # Ranks on one node share its cores: each slot's ranks get their share of threads.
            settings = dataclasses.replace(self.settings, concurrent_groups=slots)
            self._executors = [RayExecutor(settings) for _ in range(slots)]
            for executor in self._executors:
                self._idle.put(executor)

    def run(self, config: TrialConfig) -> TrialResult:
        """Run one trial on an idle slot (blocks until one is free); thread-safe."""
        self.start()
        executor = self._idle.get()
        with self._lock:
            self.running += 1
            self.max_running = max(self.max_running, self.running)
        try:
            return executor.run(config)
        finally:
            with self._lock:
                self.running -= 1
            self._idle.put(executor)

    @property
    def worker_pids(self) -> list[int]:
        return [pid for e in self._executors for pid in e.worker_pids]

    def close(self) -> None:
        for executor in self._executors:
            executor.close()  # each drops its worker group; none of them started Ray
        self._ray.close()  # Ray itself goes down last, if this pool started it

    def __enter__(self) -> TrialPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
