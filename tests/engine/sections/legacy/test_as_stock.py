"""distributed's ``Client.replicate`` and ``scatter(broadcast=...)`` under RulesPolicy
answer as the stock calls do where the stock calls succeed: during retirements, which
hold the scheduler's replica lock while the call waits for it, and while the Active
Memory Manager runs no cycle (stopped, or configured with ``start: false``), when the
calls are the stock ones, deletions included.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from distributed import wait
from distributed.utils_test import BlockedGetData, gen_cluster

from benchmarks.support.waiting import wait_for
from tests.support.cluster import amm_config, holders, inc, no_errors, policy_of, rules

#: Run in the version matrix too (.ci/run): the floor and the newest dask/distributed.
pytestmark = pytest.mark.compat

AMM = "distributed.scheduler.active-memory-manager"
#: The stock AMM: ReduceReplicas only (distributed's default policies).
STOCK = {
    f"{AMM}.start": True,
    f"{AMM}.interval": 0.05,
    f"{AMM}.policies": [{"class": "distributed.active_memory_manager.ReduceReplicas"}],
}
#: RulesPolicy configured, the AMM not started (how several of Dask's own tests run).
NOT_STARTED = {**amm_config(rules()), f"{AMM}.start": False}


def lock_waiters(s: Any) -> int:
    """Calls waiting for the scheduler's replica lock (replicate, rebalance and
    retire_workers share it)."""
    return len(s._replica_lock._lock._waiters or ())


async def replicate_between_two_retirements(c: Any, s: Any, workers: list[Any]) -> list[Any]:
    """``c.replicate(n=2)`` waits for the replica lock that a retirement holds; a second
    retirement, reentrant, goes first; both remove their workers before the call gets
    the lock. The call must then copy among the workers left, as the stock call does."""
    w0, w1, w2, w3 = workers
    for w in (w0, w2, w3):
        w.block_get_data.set()  # only w1 holds its data back: its retirement waits
    futures = [c.submit(inc, i, key=f"x-{i}", workers=[workers[i % 4].address]) for i in range(16)]
    await wait(futures)
    retire1 = asyncio.create_task(c.retire_workers([w1.address]))
    await w1.in_get_data.wait()  # the retirement holds the lock, copying w1's keys
    call = asyncio.create_task(c.replicate(futures, n=2))
    await wait_for(lambda: lock_waiters(s) == 1, "replicate waiting for the replica lock")
    await c.retire_workers([w0.address])  # reentrant: done before the call gets the lock
    assert w0.address not in s.workers
    w1.block_get_data.set()
    await retire1
    await call  # stock: ok; it raised KeyError(w0) when resolved before the lock
    assert set(s.workers) == {w2.address, w3.address}
    return futures


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 4,
    Worker=BlockedGetData,
    config=amm_config(rules()),
    timeout=90,
)
async def test_replicate_waits_for_the_lock_and_copies_among_the_workers_left(c, s, *workers):
    futures = await replicate_between_two_retirements(c, s, list(workers))
    left = set(s.workers)
    assert all(holders(s, f.key) == left for f in futures)  # (stock trims them again)
    no_errors(s)


@gen_cluster(client=True, nthreads=[("", 1)] * 4, Worker=BlockedGetData, config=STOCK, timeout=90)
async def test_the_same_calls_succeed_with_the_stock_policy(c, s, *workers):
    await replicate_between_two_retirements(c, s, list(workers))


@gen_cluster(client=True, nthreads=[("", 1)] * 4, config=amm_config(rules()), timeout=60)
async def test_a_broadcast_waits_for_the_lock_too(c, s, a, b, w3, w4):
    """The broadcast's copies are placed once the call holds the lock: a worker that
    left while it waited is no recipient (stock's scatter names the workers of its
    start, and fails then)."""
    async with s._replica_lock("retire-workers"):  # what a retirement holds
        call = asyncio.create_task(c.scatter([1], broadcast=True))
        await wait_for(lambda: lock_waiters(s) == 1, "the broadcast waiting for the lock")
        (key,) = s.tasks  # scattered to one worker: remove another
        gone = next(w for w in (a, b, w3, w4) if w.address not in holders(s, key))
        await s.remove_worker(gone.address, stimulus_id="test")
    (y,) = await call
    assert holders(s, y.key) == set(s.workers) and len(s.workers) == 3
    no_errors(s)


async def more_then_fewer(c: Any, s: Any, policy: Any = None) -> None:
    """``replicate(n=5)`` then ``n=3``: the stock call deletes two copies itself."""
    x = c.submit(inc, 1, key="x-1")
    await x
    await c.replicate([x], n=5)
    assert len(holders(s, "x-1")) == 5
    await c.replicate([x], n=3)
    assert len(holders(s, "x-1")) == 3  # at once, as stock
    (y,) = await c.scatter([2], broadcast=2)
    assert len(holders(s, y.key)) == 2
    runtime = (policy or policy_of(s)).index.runtime  # no target waits for a cycle
    assert "x-1" not in runtime and y.key not in runtime


@gen_cluster(client=True, nthreads=[("", 1)] * 5, config=amm_config(rules()), timeout=60)
async def test_with_the_amm_stopped_the_calls_are_stock(c, s, *workers):
    x = c.submit(inc, 0, key="x-0")
    await x
    await c.replicate([x], n=4)  # honoured: a lasting target
    assert policy_of(s).index.runtime["x-0"].origin == "client.replicate"
    await c.amm.stop()
    assert not await c.amm.running()
    await more_then_fewer(c, s)
    await c.replicate([x], n=2)  # stock: deletes two; the earlier call's target goes
    assert len(holders(s, "x-0")) == 2 and "x-0" not in policy_of(s).index.runtime
    assert policy_of(s).legacy.calls == {"client.replicate": 1}
    await c.amm.start()
    await c.replicate([x], n=4)  # honoured again
    assert policy_of(s).index.runtime["x-0"].origin == "client.replicate"
    no_errors(s)


@gen_cluster(client=True, nthreads=[("", 1)] * 5, config=NOT_STARTED, timeout=60)
async def test_with_the_amm_not_started_the_calls_are_stock(c, s, *workers):
    assert not await c.amm.running()
    await more_then_fewer(c, s)
    assert policy_of(s).legacy.calls == {}
    no_errors(s)


@gen_cluster(client=True, nthreads=[("", 1)] * 5, config=amm_config(rules()), timeout=60)
async def test_with_the_policy_out_of_the_amm_the_calls_are_stock(c, s, *workers):
    """(Some of Dask's own tests clear the AMM's policies: then no cycle of RulesPolicy
    runs, though the AMM does.)"""
    policy = policy_of(s)
    s.extensions["amm"].policies.clear()
    assert await c.amm.running()
    await more_then_fewer(c, s, policy)
    assert policy.legacy.calls == {}
    no_errors(s)
