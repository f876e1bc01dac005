"""Helpers shared by the retirement tests (``tests/engine/sections/retirement/``) and
:mod:`benchmarks.retirement`: a log of every copy the scheduler records, so that a test
checks every worker a key was ever on, not only where it ends.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable
from typing import Any


class ReplicaLog:
    """Every worker that gained a copy of each key, in order, from the moment it is
    created: it wraps the scheduler's ``add_replica``, through which every copy the
    scheduler learns of passes (tasks finishing, transfers, scattered data)."""

    def __init__(self, scheduler: Any):
        self.added: defaultdict[Hashable, list[str]] = defaultdict(list)
        #: Every copy in the order they came: (key, worker address).
        self.order: list[tuple[Hashable, str]] = []
        inner = scheduler.add_replica

        def add_replica(ts: Any, ws: Any) -> None:
            inner(ts, ws)
            self.added[ts.key].append(ws.address)
            self.order.append((ts.key, ws.address))

        scheduler.add_replica = add_replica

    def seen(self, key: Hashable) -> set[str]:
        """Workers that held a copy of ``key`` at some point since the log started."""
        return set(self.added.get(key, ()))


def amm_measure(measure: str = "managed") -> dict[str, Any]:
    """Config: the AMM compares workers by ``measure``. In-process workers share one
    process, so only ``managed`` tells them apart by the data they hold."""
    return {"distributed.scheduler.active-memory-manager.measure": measure}
