"""Real cluster dumps for the offline tests (``tests/offline``): a small cluster with governed keys, dumped with
``Client.dump_cluster_state``, and the real engine run on the same cluster to compare with.

The cluster (:data:`NTHREADS`): four workers on two hosts (``127.0.0.1`` and
``127.0.0.2``), the first with ``resources={"GPU": 1}``. :func:`populate` puts keys on
chosen workers with the AMM stopped, so that the dump shows what the rules
(:data:`RULES`) have still to do: ``precious-*`` keys with one copy (the rules want
three, on both hosts), ``device-*`` keys off the GPU worker (the rules want them on
it), a ``host-*`` key on it (the rules want it elsewhere), ``("part", i)`` keys nobody
governs (one copied twice), a key annotated ``amm: {replicate: 2}``, and a key whose
name needs quoting.

:func:`settle_live` runs the real :class:`~amm_rules.engine.policy.RulesPolicy` under a
real Active Memory Manager on the same cluster, waiting after each cycle until the
transfers it asked for are done (the simulator's model of a cycle), so that what the
simulator predicts can be compared with what the scheduler does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import numpy as np
from distributed.active_memory_manager import ActiveMemoryManagerExtension
from distributed.utils_test import async_poll_for

from amm_rules.engine.policy import RulesPolicy

#: gen_cluster ``nthreads``: (host, threads, worker kwargs).
NTHREADS = [
    ("127.0.0.1", 1, {"resources": {"GPU": 1}}),
    ("127.0.0.1", 1),
    ("127.0.0.2", 1),
    ("127.0.0.2", 1),
]
#: gen_cluster ``config``: the AMM does not run on its own (tests drive it), and the
#: workers' memory monitor is off (they share one process, whose memory says nothing
#: about any one of them).
CONFIG = {
    "distributed.scheduler.active-memory-manager.start": False,
    "optimization.fuse.active": False,
    **{f"distributed.worker.memory.{n}": False for n in ("target", "spill", "pause", "terminate")},
}
#: The memory measure tests use, in the simulator and in the live AMM: the bytes of the
#: keys each worker holds, exact in both (process memory is shared by the test's workers).
MEASURE = "managed"

RULES = """\
version: 1
pools:
  gpu: worker.resources.GPU >= 1
rules:
  - name: precious
    match: task.prefix == "precious"
    replicate: 3
    spread: host
  - name: device
    match: task.prefix == "device"
    pool: gpu
  - name: host-data
    match: task.prefix == "host"
    avoid: gpu
"""
#: A key whose repr needs escaping.
ODD_KEY = "odd 'quoted' \"key\" é"
KB = 1000


def array(n: int, value: float = 1.0) -> np.ndarray:
    """An array of ``n`` bytes (rounded to 8)."""
    return np.full(n // 8, value)


async def populate(c: Any, s: Any) -> dict[str, list[Any]]:
    """Put the keys on their workers (see the module docstring); returns the futures."""
    w = addresses(s)
    futures: dict[str, list[Any]] = {}
    futures["precious"] = [
        c.submit(array, 100 * KB, i, key=f"precious-{i}", workers=[w[1]]) for i in range(3)
    ]
    futures["device"] = [
        c.submit(array, 50 * KB, i, key=f"device-{i}", workers=[w[2]]) for i in range(2)
    ]
    futures["host"] = [c.submit(array, 30 * KB, key="host-0", workers=[w[0]])]
    futures["part"] = [
        c.submit(array, 200 * KB, i, key=("part", i), workers=[w[3]]) for i in range(4)
    ]
    import dask

    with dask.annotate(amm={"replicate": 2}):
        futures["annotated"] = [c.submit(array, 10 * KB, key="annotated-0", workers=[w[2]])]
    futures["odd"] = [c.submit(array, 8 * KB, key=ODD_KEY, workers=[w[3]])]
    await c.gather([f for group in futures.values() for f in group])
    await c.replicate([futures["part"][0]], n=3)
    await async_poll_for(lambda: len(s.tasks[("part", 0)].who_has) == 3, timeout=10)
    return futures


def addresses(s: Any) -> list[str]:
    """Worker addresses in the order of :data:`NTHREADS` (gen_cluster names them 0, 1...)."""
    return [ws.address for ws in sorted(s.workers.values(), key=lambda ws: ws.name)]


async def dump(c: Any, directory: Path, fmt: str) -> Path:
    """``Client.dump_cluster_state`` in ``fmt`` (msgpack or yaml); returns the file."""
    base = directory / f"cluster-{fmt}"
    await c.dump_cluster_state(str(base), format=fmt)
    return Path(f"{base}.msgpack.gz" if fmt == "msgpack" else f"{base}.yaml")


def holders(s: Any) -> dict[Hashable, set[str]]:
    """Key -> addresses holding it, for every key in memory."""
    return {
        k: {ws.address for ws in ts.who_has}
        for k, ts in s.tasks.items()
        if ts.state == "memory" and ts.who_has
    }


async def settle_live(s: Any, rules: Any, cycles: int = 20) -> RulesPolicy:
    """Run the real policy under a real AMM until a cycle asks for nothing, waiting after
    each cycle for the transfers it asked for to be done."""
    policy = RulesPolicy(rules, audit_interval=None, classify_seconds=None)
    amm = ActiveMemoryManagerExtension(
        s, {policy}, register=False, start=False, measure=MEASURE, interval=2.0
    )
    requested: list[tuple[str, str, Hashable]] = []
    acquire, remove = s.request_acquire_replicas, s.request_remove_replicas

    def acquire_watched(addr: str, keys: Any, *, stimulus_id: str) -> None:
        requested.extend(("replicate", addr, k) for k in keys)
        acquire(addr, keys, stimulus_id=stimulus_id)

    def remove_watched(addr: str, keys: Any, *, stimulus_id: str) -> None:
        requested.extend(("drop", addr, k) for k in keys)
        remove(addr, keys, stimulus_id=stimulus_id)

    def done() -> bool:
        now = holders(s)
        return all(
            (addr in now.get(key, ())) == (op == "replicate") for op, addr, key in requested
        )

    s.request_acquire_replicas, s.request_remove_replicas = acquire_watched, remove_watched
    try:
        for _ in range(cycles):
            requested.clear()
            amm.run_once()
            if not requested and not policy.ctx.ledger.copies:
                return policy
            await async_poll_for(done, timeout=10)
            await asyncio.sleep(0)
        raise AssertionError(f"the live policy did not settle in {cycles} cycles")
    finally:
        del s.request_acquire_replicas, s.request_remove_replicas
        policy.detach()
