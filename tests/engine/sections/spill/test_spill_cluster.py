"""The spill section on real workers: the order each worker gives keys up in, the
plugin on joining workers and its teardown, a foreign mapping left alone, the keys on
disk told to the scheduler, prefetch, and copies dropped rather than written.

Workers here spill only at their buffer's target (``memory.target``), not through
the memory monitor (``memory.spill: false``): the process of an in-process cluster
holds far more than any worker's limit, which the monitor would count.
"""

from __future__ import annotations

from typing import Any

import pytest
from distributed import Worker
from distributed.utils_test import gen_cluster

from amm_rules.engine.spill.order import ValueOrder
from amm_rules.engine.spill.plugin import PLUGIN_NAME
from benchmarks.support.waiting import wait_for
from tests.support.cluster import amm_config, events, policy_of

pytestmark = pytest.mark.compat

MiB = 2**20
#: Seconds a test may take (the sum of its waits' deadlines is below it).
TIMEOUT = 150
#: Each worker's memory limit; its buffer's target is 60% of it (60 MiB).
LIMIT = 100 * MiB
MEMORY = {
    "distributed.worker.memory.target": 0.6,
    "distributed.worker.memory.spill": False,
    "distributed.worker.memory.pause": False,
    "distributed.worker.memory.terminate": False,
}


def blob(i: int, size: int) -> bytes:
    return i.to_bytes(8, "little") * (size // 8)


def config(spill: Any, rules: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {**amm_config({"version": 1, "spill": spill, "rules": rules or []}), **MEMORY}


LOOKUP_LAST = [{"name": "table", "match": "task.prefix == 'lookup'", "spill": "last"}]


def plugin_of(worker: Worker) -> Any:
    return worker.plugins.get(PLUGIN_NAME)


async def fill(c: Any, worker: Worker, prefix: str, count: int, size: int) -> list[Any]:
    futures = [
        c.submit(blob, i, size, key=f"{prefix}-{i}", workers=[worker.address])
        for i in range(count)
    ]
    await c.gather(futures)
    return futures


async def lookup_kept(c: Any, s: Any, a: Worker, order: str) -> bool:
    """A lookup table stored first, then bulk keys past the target: whether the
    lookup table is still in memory once the worker wrote keys to disk."""
    await wait_for(lambda: plugin_of(a) is not None, "the plugin on the worker")
    table = c.submit(blob, 0, 10 * MiB, key="lookup-0", workers=[a.address])
    await table
    # 40 MiB of 60: the worker is valued (VALUE_AT) and its table's value arrives.
    bulk = await fill(c, a, "bulk", 3, 10 * MiB)
    if order == "value":
        await wait_for(
            lambda: plugin_of(a).values.value_of("lookup-0") == float("inf"),
            "the lookup table valued on its worker",
        )
    bulk += await fill(c, a, "more", 6, 10 * MiB)
    await wait_for(lambda: len(a.data.slow) >= 3, "keys written to disk")
    kept = "lookup-0" in a.data.fast
    del table, bulk
    return kept


@gen_cluster(
    client=True,
    timeout=TIMEOUT,
    nthreads=[("", 1)],
    worker_kwargs={"memory_limit": LIMIT},
    config=config({"order": "value"}, LOOKUP_LAST),
)
async def test_a_dear_key_stays_in_memory_while_cheap_ones_go_to_disk(c, s, a):
    assert await lookup_kept(c, s, a, "value")
    assert isinstance(a.data.fast.order, ValueOrder)
    await wait_for(lambda: policy_of(s).ctx.spilled.workers.get(a.address), "a report")
    on_disk = policy_of(s).ctx.spilled.workers[a.address].keys
    await wait_for(lambda: len(on_disk) >= 3, "the keys on disk told to the scheduler")
    assert "lookup-0" not in on_disk
    assert set(on_disk) <= set(a.data.slow)


@gen_cluster(
    client=True,
    timeout=TIMEOUT,
    nthreads=[("", 1)],
    worker_kwargs={"memory_limit": LIMIT},
    config=config({"order": "lru"}, LOOKUP_LAST),
)
async def test_stock_order_writes_the_least_recently_used_first(c, s, a):
    """The control of the test above: with order: lru the same keys send the lookup
    table, used least recently, to disk first."""
    assert not await lookup_kept(c, s, a, "lru")
    assert not isinstance(a.data.fast.order, ValueOrder)
