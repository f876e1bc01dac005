"""Helpers of the memory-pressure tests (tests/engine/sections/memory_pressure/test_memory_pressure.py and the
observe tests of the section): a cluster whose workers' memory is set by the data the
test keeps, a section reading that memory, tasks to hold back.
"""

from __future__ import annotations

import time
from typing import Any

from distributed.scheduler import _task_slots_available
from distributed.utils_test import async_poll_for

from tests.support.cluster import amm_config, rules

MiB = 2**20
LIMIT = 200 * MiB


def section(**fields: Any) -> dict[str, Any]:
    """A rules mapping with a memory-pressure section that reads managed memory (exact
    on the scheduler, unlike process memory) and needs no transfers: tests set the
    pressure by the data they keep."""
    base = {
        "measure": "managed",
        "require-transfers": False,
        "threshold": "30%",
        "release": "20%",
        "check-interval": "50ms",
        "min-hold": 0,
    }
    return rules(**{"memory-pressure": {**base, **fields}})


def blob(i: int, mib: int) -> bytes:
    return bytes(mib * MiB)


def slow(i: int, delay: float = 0.2) -> int:
    time.sleep(delay)
    return i


async def arrived(s: Any, futures: list[Any]) -> None:
    """Wait until the scheduler has the futures' tasks (a graph arrives asynchronously)."""
    await async_poll_for(lambda: all(f.key in s.tasks for f in futures), timeout=5)


def consistent(s: Any) -> None:
    """The scheduler's idle set agrees with its current worker-saturation."""
    for ws in s.workers.values():
        has_room = _task_slots_available(ws, s.WORKER_SATURATION) > 0
        assert (ws in s.idle_task_count) == (has_room and ws.status.name == "running")


WORKERS = {"nthreads": [("", 2)] * 2, "worker_kwargs": {"memory_limit": LIMIT}}
#: The workers share the test's process: its memory must not pause them or make them spill.
NO_MONITOR = {
    f"distributed.worker.memory.{name}": False
    for name in ("target", "spill", "pause", "terminate")
}


def config(rules_: Any = None, **extra: Any) -> dict[str, Any]:
    return {**amm_config(rules_), **NO_MONITOR, **extra}


async def pressure_on(c: Any, s: Any, worker: Any, mib: int = 80) -> Any:
    """Keep ``mib`` MiB on ``worker``: 40% of its limit, above the 30% threshold."""
    held = c.submit(blob, 0, mib, key="held-0", workers=[worker.address])
    await held
    return held
