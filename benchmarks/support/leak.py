"""A leaking workload for the paused-workers tests (``tests/engine/sections/paused_workers/``)
and :mod:`benchmarks.paused_workers`.

:func:`leaky` leaks memory outside Dask's data, as a library with a leak does: it keeps
a ``bytearray`` in a list of a module of the worker process, where no Dask measure of
managed memory sees it, so the worker's *unmanaged* memory grows until it pauses.
:func:`held` makes the data of a persisted key. Worker processes receive these functions
by value (:func:`ship`), so they need not import this module.

:func:`worker_config` is the dask config that makes the cycle short: a low pause
threshold and a fast memory monitor, spilling off (the leak is not Dask's data anyway),
and no termination by the nanny.
"""

from __future__ import annotations

import sys
import types
from typing import Any

#: Module of the worker process that holds what :func:`leaky` leaked.
LEAK_MODULE = "amm_rules_test_leak"


def leaky(i: int, mib: int, only: str | None = None, pace: float = 0.0) -> int:
    """Leak ``mib`` MiB in this process (if its worker's name is ``only``, or always),
    wait ``pace`` seconds and return ``i``. A pace longer than the memory monitor's
    interval lets the worker see each step and pause before its next task starts;
    without one, a fast machine runs several tasks past the threshold between two
    checks."""
    if only is not None:
        from distributed import get_worker

        if str(get_worker().name) != only:
            return i
    module = sys.modules.get(LEAK_MODULE)
    if module is None:
        module = sys.modules[LEAK_MODULE] = types.ModuleType(LEAK_MODULE)
        module.held = []  # type: ignore[attr-defined]
    # Written byte by byte: the pages are resident, as a real leak's are.
    module.held.append(bytearray(b"\x01") * (mib * 2**20))  # type: ignore[attr-defined]
    if pace:
        import time

        time.sleep(pace)  # a task's own duration, not a wait for a condition
    return i


def leaked_mib() -> float:
    """What :func:`leaky` leaked in this process so far."""
    module = sys.modules.get(LEAK_MODULE)
    return sum(len(b) for b in getattr(module, "held", ())) / 2**20


def rss() -> int:
    """This process's resident memory, in bytes (what a worker's memory monitor reads)."""
    import psutil

    return int(psutil.Process().memory_info().rss)


def held(name: str, size: int) -> bytes:
    """The data of a persisted key: its name, padded to ``size`` bytes."""
    return name.encode().ljust(size, b".")


def ship() -> None:
    """Send this module's functions to worker processes by value (they cannot import the
    tests)."""
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def worker_config(pause: float = 0.5) -> dict[str, Any]:
    """Worker memory settings for a short test: pause at ``pause`` of the limit, check
    memory every 50 ms, never spill, never terminate."""
    return {
        "distributed.worker.memory.pause": pause,
        "distributed.worker.memory.spill": False,
        "distributed.worker.memory.target": False,
        "distributed.worker.memory.terminate": False,
        "distributed.worker.memory.monitor-interval": "50ms",
    }
