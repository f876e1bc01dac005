"""RulesPolicy on a real cluster: pools, avoid and spread."""

from __future__ import annotations

import asyncio

from distributed.utils_test import async_poll_for, gen_cluster

from tests.support.cluster import amm_config, holders, inc, no_errors, policy_of, rules

GPU = {"resources": {"GPU": 1}}
POOLS = {"gpu": "worker.resources.GPU >= 1", "spot": "worker.resources.SPOT >= 1"}
SPOT = {"resources": {"SPOT": 1}}


@gen_cluster(
    client=True,
    nthreads=[("", 1, GPU), ("", 1, GPU), ("", 1), ("", 1)],
    config=amm_config(
        rules(
            {"name": "device", "match": 'task.key matches "gpu-*"', "pool": "gpu"},
            {
                "name": "device-2",
                "match": 'task.key matches "two-*"',
                "pool": "gpu",
                "replicate": 2,
            },
            pools=POOLS,
        )
    ),
)
async def test_pool_moves_data_in_copy_first(c, s, g1, g2, w1, w2):
    gpus = {g1.address, g2.address}
    one = c.submit(inc, 1, key="gpu-1", workers=[w1.address])
    two = c.submit(inc, 2, key="two-1", workers=[w2.address])
    await c.gather([one, two])
    await async_poll_for(lambda: holders(s, "gpu-1") <= gpus and holders(s, "gpu-1"), timeout=5)
    await async_poll_for(lambda: holders(s, "two-1") == gpus, timeout=5)
    assert len(holders(s, "gpu-1")) == 1
    await asyncio.sleep(0.2)
    assert len(holders(s, "gpu-1")) == 1 and holders(s, "two-1") == gpus
    assert await c.gather([one, two]) == [2, 3]
    no_errors(s)


@gen_cluster(
    client=True,
    nthreads=[("", 1), ("", 1)],
    config=amm_config(
        rules(
            {"name": "device", "match": 'task.key matches "gpu-*"', "pool": "gpu", "replicate": 2},
            pools=POOLS,
        )
    ),
)
async def test_empty_pool_is_reported_and_data_stays(c, s, a, b):
    future = c.submit(inc, 1, key="gpu-1", workers=[a.address])
    await future
    policy = policy_of(s)
    await async_poll_for(lambda: policy.last_cycle.get("device", {}).get("unmet") == 1, timeout=5)
    assert holders(s, "gpu-1") == {a.address}
    assert policy.totals["device"]["requested"] == 0
    explained = s.handlers["amm_rules_explain"](keys=["gpu-1"])["gpu-1"]
    assert explained["eligible"] == 0
    assert "0 eligible workers" in explained["unmet"]
    assert explained["misplaced"] == {a.address: "outside pool gpu"}
    no_errors(s)


@gen_cluster(
    client=True,
    nthreads=[("", 1, SPOT), ("", 1, SPOT), ("", 1), ("", 1)],
    config=amm_config(
        rules(
            {"name": "safe", "match": 'task.key matches "x-*"', "avoid": "spot", "replicate": 2},
            pools=POOLS,
        )
    ),
)
async def test_avoid_keeps_copies_off_the_avoided_pool(c, s, spot0, spot1, a, b):
    futures = await c.scatter({"x-1": 1, "x-2": 2}, workers=[spot0.address])
    await async_poll_for(
        lambda: all(holders(s, k) == {a.address, b.address} for k in futures), timeout=5
    )
    no_errors(s)


@gen_cluster(
    client=True,
    nthreads=[("127.0.0.1", 1), ("127.0.0.1", 1), ("127.0.0.2", 1)],
    config=amm_config(
        rules(
            {"name": "spread", "match": 'task.key matches "x-*"', "replicate": 2, "spread": "host"}
        )
    ),
)
async def test_spread_host_puts_copies_on_distinct_hosts(c, s, a1, a2, b):
    assert b.address.startswith("tcp://127.0.0.2")
    futures = await c.scatter({"x-1": 1}, workers=[a1.address])
    await c.replicate(list(futures.values()), n=2, workers=[a1.address, a2.address])
    await async_poll_for(lambda: b.address in holders(s, "x-1"), timeout=5)
    await async_poll_for(lambda: len(holders(s, "x-1")) == 2, timeout=5)
    assert {s.workers[addr].host for addr in holders(s, "x-1")} == {"127.0.0.1", "127.0.0.2"}
    no_errors(s)


@gen_cluster(
    client=True,
    nthreads=[("127.0.0.1", 1), ("127.0.0.1", 1), ("127.0.0.1", 1)],
    config=amm_config(
        rules(
            {"name": "spread", "match": 'task.key matches "x-*"', "replicate": 3, "spread": "host"}
        )
    ),
)
async def test_spread_host_with_one_host_still_meets_the_count(c, s, *workers):
    futures = await c.scatter({"x-1": 1})
    await async_poll_for(lambda: len(holders(s, "x-1")) == 3, timeout=5)
    assert list(futures) == ["x-1"]
    assert policy_of(s).last_cycle["spread"]["unmet"] == 0
    no_errors(s)
