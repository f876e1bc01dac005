"""Early cycles when a worker's pools change at run time, on real clusters
(:mod:`amm_rules.engine.worker_watch`).

As in ``test_policy_early.py`` the AMM's interval is a minute: a key copied into its
pool after a worker moved out of it can only have been copied by an early cycle. What
must hold:

- a worker whose resources change (``Worker.set_resources``) leaves or enters the pools
  that read them at once; governed keys it held outside their pool then are copied
  into the pool by an early cycle;
- a worker whose memory grows past what a pool allows (a pool reading
  ``worker.memory``) leaves it at its next heartbeat, with the same early cycle;
- a resources change that moves no worker in or out of a pool wakes nothing;
- a move's drop follows its copy at once (the engine's copy landing above the target
  wakes a cycle), and a drop held up by a dependent processing where the copy is goes
  through as soon as the dependent finishes.
"""

from __future__ import annotations

import operator
from typing import Any

import pytest
from distributed.utils_test import gen_cluster

from benchmarks.support.retire import amm_measure
from benchmarks.support.waiting import wait_for
from tests.support.cluster import holders, long_interval, no_errors, policy_of
from tests.support.rulesets import GPU, rule, rules

#: Run in the version matrix too (.ci/run): the floor and the newest dask/distributed.
pytestmark = pytest.mark.compat

KEYS = [f"held-{i}" for i in range(8)]


def pool_rules(pool: str) -> dict[str, Any]:
    return rules(rule("held", "held-*", replicate=1, pool="inside"), pools={"inside": pool})


async def held_on(c: Any, s: Any, address: str) -> list[Any]:
    """The held keys, computed on one worker (inside the pool), and one cycle run by
    hand so that they are governed."""
    futures = [c.submit(operator.mul, k.encode(), 100, key=k, workers=[address]) for k in KEYS]
    await c.gather(futures)
    s.extensions["amm"].run_once()
    assert all(holders(s, k) == {address} for k in KEYS)
    return futures


#: One worker with a GPU (in the pool of the GPU tests), two without.
GPU_WORKERS = [("", 1, GPU), ("", 1), ("", 1)]
#: The held keys live on workers with a GPU.
IN_GPU_POOL = long_interval(pool_rules("worker.resources.GPU >= 1"))


@gen_cluster(
    client=True,
    nthreads=GPU_WORKERS,
    config=IN_GPU_POOL,
    timeout=60,
)
async def test_a_worker_losing_a_resource_has_its_keys_copied_into_the_pool(c, s, a, b, d):
    policy = policy_of(s)
    futures = await held_on(c, s, a.address)  # noqa: F841 - keeps the keys
    assert policy.placements.pools[b.address] == frozenset()
    early = policy.early.counts["ran"]
    # b enters the pool, then a leaves it: a's keys are outside their pool.
    await b.set_resources(GPU=1)
    await a.set_resources(GPU=0)
    # Copied to b, then (the copy landed: a move's second half) dropped from a.
    await wait_for(lambda: all(holders(s, k) == {b.address} for k in KEYS), "every key moved")
    assert policy.early.counts["ran"] > early
    reasons = {r for _, rs in policy.early.history for r in rs}
    assert {"worker-pools-changed", "copy-landed"} <= reasons
    no_errors(s)


def _read(x: bytes, event: str) -> int:
    from distributed import Event

    Event(event).wait(30)  # the dependent is processing where the copy is
    return len(x)


@gen_cluster(
    client=True,
    nthreads=GPU_WORKERS,
    config=IN_GPU_POOL,
    timeout=120,
)
async def test_a_misplaced_copy_held_by_a_dependent_is_dropped_when_it_finishes(c, s, a, b, d):
    """The drop of a copy outside its pool waits while a dependent processes there;
    the dependent finishing wakes the cycle that drops it."""
    from distributed import Event

    policy = policy_of(s)
    futures = await held_on(c, s, a.address)  # noqa: F841 - keeps the keys
    key = KEYS[0]
    event = Event("release-reader")
    reader = c.submit(_read, futures[0], "release-reader", key="reader", workers=[a.address])
    await wait_for(
        lambda: getattr(s.tasks.get("reader"), "state", None) == "processing", "reader running"
    )
    await b.set_resources(GPU=1)
    await a.set_resources(GPU=0)
    await wait_for(lambda: b.address in holders(s, key), f"{key} copied to b")
    others = KEYS[1:]
    await wait_for(lambda: all(holders(s, k) == {b.address} for k in others), "others moved")
    assert holders(s, key) == {a.address, b.address}  # the reader holds up the drop
    assert key in policy.index.trim_waits
    await event.set()
    assert await reader == 100 * len(key)
    await wait_for(lambda: holders(s, key) == {b.address}, f"{key} dropped from a")
    assert any("dependent-finished" in rs for _, rs in policy.early.history)
    no_errors(s)


@gen_cluster(
    client=True,
    nthreads=GPU_WORKERS,
    config=IN_GPU_POOL,
    timeout=60,
)
async def test_a_resources_change_that_moves_no_worker_wakes_nothing(c, s, a, b, d):
    policy = policy_of(s)
    futures = await held_on(c, s, a.address)  # noqa: F841 - keeps the keys
    await wait_for(lambda: not policy.early.pending, "no early cycle pending")
    requested = policy.early.counts["requested"]
    await a.set_resources(GPU=2)  # still in the pool
    await b.set_resources(FPGA=1)  # still out of it
    assert s.workers[a.address].resources["GPU"] == 2
    assert s.workers[b.address].resources["FPGA"] == 1
    assert not policy.early.pending
    assert policy.early.counts["requested"] == requested
    assert policy.placements.pools[a.address] == frozenset({"inside"})
    no_errors(s)


def _ballast(n: int) -> bytes:
    return b"x" * n


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 2,
    config={
        **long_interval(pool_rules("worker.memory < 4 MiB")),
        # Memory by the bytes of keys a worker holds: in-process workers share a process.
        **amm_measure(),
    },
    timeout=60,
)
async def test_a_worker_whose_memory_grows_out_of_a_pool_has_its_keys_copied(c, s, a, b):
    policy = policy_of(s)
    futures = await held_on(c, s, a.address)  # noqa: F841 - keeps the keys
    assert policy.placements.pools[a.address] == frozenset({"inside"})
    early = policy.early.counts["ran"]
    # 8 MiB that no rule governs, on a: a is out of the pool from its next heartbeat.
    ballast = c.submit(_ballast, 8 << 20, key="ballast", workers=[a.address])
    await ballast
    await wait_for(
        lambda: all(b.address in holders(s, k) for k in KEYS), "every held key copied to b"
    )
    assert policy.placements.pools[a.address] == frozenset()
    assert policy.early.counts["ran"] > early
    assert any("worker-pools-changed" in reasons for _, reasons in policy.early.history)
    no_errors(s)
