"""What tests and benchmarks read of a real scheduler running RulesPolicy: :func:`copies`
of a key, the :func:`policy_of` a scheduler, and a :class:`TransitionCounter` of keys
computed (twice: recomputed) or erred; and the cluster the memory benchmarks run
(:func:`spilling_config`, :func:`spilling_cluster`). Imported by ``tests.support.cluster``
(which the tests use) and by the benchmarks; nothing here imports ``tests``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from typing import Any

from distributed import LocalCluster
from distributed.diagnostics.plugin import SchedulerPlugin

from amm_rules.engine.policy import RulesPolicy


def copies(scheduler: Any, key: Hashable) -> int:
    """Copies of ``key`` in memory (0 once it is released or lost)."""
    ts = scheduler.tasks.get(key)
    return len(ts.who_has or ()) if ts is not None and ts.state == "memory" else 0


def policy_of(scheduler: Any) -> RulesPolicy:
    (policy,) = [p for p in scheduler.extensions["amm"].policies if isinstance(p, RulesPolicy)]
    return policy


class TransitionCounter(SchedulerPlugin):
    """Counts, per key, how often it started processing and how often it erred (a key
    computed twice was recomputed)."""

    name = "transition-counter"

    def __init__(self) -> None:
        self.processing: Counter[Hashable] = Counter()
        self.erred: Counter[Hashable] = Counter()

    def transition(self, key: Hashable, start: str, finish: str, *args: Any, **kw: Any) -> None:
        if finish == "processing":
            self.processing[key] += 1
        elif finish == "erred":
            self.erred[key] += 1

    @property
    def recomputed(self) -> int:
        """Keys that started processing more than once."""
        return sum(1 for n in self.processing.values() if n > 1)

    @classmethod
    def on(cls, scheduler: Any) -> TransitionCounter:
        counter = cls()
        scheduler.add_plugin(counter, name=cls.name)
        return counter


def spilling_config(rules: Any) -> dict[str, Any]:
    """dask config: the AMM runs RulesPolicy with ``rules``; workers spill and pause at
    distributed's default thresholds (target 60%, spill 70%, pause 80% of their limit)
    and never terminate, so that a run is never cut short by a restart."""
    prefix = "distributed.scheduler.active-memory-manager"
    return {
        f"{prefix}.start": True,
        f"{prefix}.policies": [{"class": "amm_rules.RulesPolicy", "rules": rules}],
        "distributed.worker.memory.target": 0.6,
        "distributed.worker.memory.spill": 0.7,
        "distributed.worker.memory.pause": 0.8,
        "distributed.worker.memory.terminate": False,
    }


def spilling_cluster(n_workers: int, threads: int, memory_limit: int) -> LocalCluster:
    """An asynchronous LocalCluster of worker processes with ``memory_limit`` each, their
    numeric libraries on one thread (a benchmark's tasks, not BLAS, use the cores)."""
    env = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return LocalCluster(
        n_workers=n_workers,
        threads_per_worker=threads,
        processes=True,
        asynchronous=True,
        dashboard_address=":0",
        memory_limit=memory_limit,
        env=env,
    )
