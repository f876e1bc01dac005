"""The crash benchmark's workload and measures (:mod:`benchmarks.crash`), shared with its
test (``tests/test_crash_benchmark.py``).

The workload: a first stage of CPU-bound tasks with outputs of mixed sizes (``dear``:
small outputs that take long to compute; ``bulky``: large outputs that compute fast),
persisted; a second stage (``read``) whose tasks each read one first-stage key and
compute a little. Worker processes cannot import the benchmarks package as the
scheduler's process does, so :func:`ship` sends this module's functions by value.

The measures read the scheduler (the benchmark's own process holds it): the bytes of
copies beyond one of the keys in memory (:func:`extra_bytes`), and per worker the
compute seconds of the first-stage keys it holds alone (:func:`sole_work`), from which
the benchmark picks its victim.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any


def burn(seconds: float) -> int:
    """Compute for ``seconds`` of this thread's processor time (CPU-bound work, not a
    wait: a slower machine takes longer in wall time, as real work would)."""
    end = time.thread_time() + seconds
    n = 0
    while time.thread_time() < end:
        n += sum(range(1_000))
    return n


def first(name: str, seconds: float, size: int) -> bytes:
    """A first-stage task: ``seconds`` of work, an output of ``size`` bytes."""
    burn(seconds)
    return name.encode().ljust(size, b".")


def read(data: bytes, seconds: float) -> int:
    """A second-stage task: reads a first-stage key and computes a little."""
    burn(seconds)
    return len(data)


def ship() -> None:
    """Send this module's functions to worker processes by value."""
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


@dataclass(frozen=True)
class Stage:
    """The first stage: ``dear`` tasks of ``dear_seconds`` and ``dear_bytes`` each,
    ``bulky`` tasks of ``bulky_seconds`` and ``bulky_bytes``."""

    dear: int = 8
    dear_seconds: float = 1.5
    dear_bytes: int = 2**20
    bulky: int = 4
    bulky_seconds: float = 0.1
    bulky_bytes: int = 128 * 2**20

    def tasks(self) -> dict[str, tuple[float, int]]:
        """key -> (seconds of work, bytes of output)."""
        out = {f"dear-{i}": (self.dear_seconds, self.dear_bytes) for i in range(self.dear)}
        out.update(
            {f"bulky-{i}": (self.bulky_seconds, self.bulky_bytes) for i in range(self.bulky)}
        )
        return out

    @property
    def bytes(self) -> int:
        return self.dear * self.dear_bytes + self.bulky * self.bulky_bytes

    @property
    def seconds(self) -> float:
        return self.dear * self.dear_seconds + self.bulky * self.bulky_seconds


def extra_bytes(scheduler: Any) -> int:
    """Bytes of the copies beyond the first of every key in memory (what replication,
    protection and dependency transfers cost in memory)."""
    return sum(
        max(0, ts.nbytes) * (len(ts.who_has) - 1)
        for ts in scheduler.tasks.values()
        if ts.who_has and len(ts.who_has) > 1
    )


def sole_work(scheduler: Any, work: Mapping[Hashable, float]) -> dict[str, float]:
    """Per worker, the seconds of work of the keys of ``work`` of which it holds the
    only copy: what its death would make the scheduler compute again."""
    out = dict.fromkeys(scheduler.workers, 0.0)
    for key, seconds in work.items():
        ts = scheduler.tasks.get(key)
        if ts is not None and ts.who_has and len(ts.who_has) == 1:
            (ws,) = ts.who_has
            out[ws.address] = out.get(ws.address, 0.0) + seconds
    return out


def covered(scheduler: Any, work: Mapping[Hashable, float]) -> tuple[float, int]:
    """The seconds of work of the keys of ``work`` that hold two copies or more (a
    worker's death cannot cost them), and the bytes of their copies beyond one."""
    seconds = 0.0
    extra = 0
    for key, s in work.items():
        ts = scheduler.tasks.get(key)
        if ts is not None and ts.who_has and len(ts.who_has) > 1:
            seconds += s
            extra += max(0, ts.nbytes) * (len(ts.who_has) - 1)
    return seconds, extra


def protect_rules(budget: str, min_recompute: str) -> dict[str, Any]:
    return {"version": 1, "protect": {"budget": budget, "min-recompute": min_recompute}}


def replicate_rules(prefixes: tuple[str, ...] = ("dear", "bulky")) -> dict[str, Any]:
    listed = ", ".join(repr(p) for p in prefixes)
    return {
        "version": 1,
        "rules": [{"name": "first-stage", "match": f"task.prefix in [{listed}]", "replicate": 2}],
    }
