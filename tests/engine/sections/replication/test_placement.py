"""RulesPolicy on a real cluster: pools, avoid and spread."""

from __future__ import annotations

import pytest
from distributed.utils_test import gen_cluster

from benchmarks.support.waiting import wait_cycles, wait_for
from tests.support.cluster import Requests, amm_config, holders, inc, keep, policy_of
from tests.support.rulesets import GPU, GPU_POOL, SPOT, SPOT_POOL, rule, rules

#: Run in the version matrix too (.ci/run): the floor and the newest dask/distributed.
pytestmark = pytest.mark.compat

POOLS = {**GPU_POOL, **SPOT_POOL}


@gen_cluster(
    client=True,
    nthreads=[("", 1, GPU), ("", 1, GPU), ("", 1), ("", 1)],
    config=amm_config(
        rules(
            rule("device", "gpu-*", pool="gpu"),
            rule("device-2", "two-*", pool="gpu", replicate=2),
            pools=POOLS,
        )
    ),
    timeout=90,
)
async def test_pool_moves_data_in_copy_first(c, s, g1, g2, w1, w2):
    gpus = {g1.address, g2.address}
    requests = Requests(s)
    one = c.submit(inc, 1, key="gpu-1", workers=[w1.address])
    two = c.submit(inc, 2, key="two-1", workers=[w2.address])
    await c.gather([one, two])
    await wait_for(
        lambda: len(holders(s, "gpu-1")) == 1 and holders(s, "gpu-1") <= gpus,
        "gpu-1 moved into the pool",
    )
    await wait_for(lambda: holders(s, "two-1") == gpus, "two-1 on both pool workers")
    # Copy first: the copy outside the pool was dropped only after one landed inside.
    (copied,) = requests.of("gpu-1")[0]
    assert copied in gpus and requests.of("gpu-1")[1] == {w1.address: 1}
    requests.clear()
    await wait_cycles(s, 10)
    assert (requests.acquire, requests.remove) == ({}, {})
    assert len(holders(s, "gpu-1")) == 1 and holders(s, "two-1") == gpus
    assert await c.gather([one, two]) == [2, 3]


@gen_cluster(
    client=True,
    nthreads=[("", 1), ("", 1)],
    config=amm_config(rules(rule("device", "gpu-*", pool="gpu", replicate=2), pools=POOLS)),
)
async def test_empty_pool_is_reported_and_data_stays(c, s, a, b):
    future = c.submit(inc, 1, key="gpu-1", workers=[a.address])
    await future
    policy = policy_of(s)
    await wait_for(
        lambda: policy.last_cycle.get("device", {}).get("unmet") == 1, "the target reported unmet"
    )
    assert holders(s, "gpu-1") == {a.address}
    assert policy.totals["device"]["requested"] == 0
    explained = (await s.handlers["amm_rules_explain"](keys=["gpu-1"]))["gpu-1"]
    assert explained["eligible"] == 0
    assert "0 eligible workers" in explained["unmet"]
    assert explained["misplaced"] == {a.address: "outside pool gpu"}


@gen_cluster(
    client=True,
    nthreads=[("", 1, SPOT), ("", 1, SPOT), ("", 1), ("", 1)],
    config=amm_config(rules(rule("safe", "x-*", avoid="spot", replicate=2), pools=POOLS)),
)
async def test_avoid_keeps_copies_off_the_avoided_pool(c, s, spot0, spot1, a, b):
    futures = await c.scatter({"x-1": 1, "x-2": 2}, workers=[spot0.address])
    await wait_for(
        lambda: all(holders(s, k) == {a.address, b.address} for k in futures),
        "both keys moved off the spot workers, to a and b",
    )


@gen_cluster(
    client=True,
    nthreads=[("127.0.0.1", 1), ("127.0.0.1", 1), ("127.0.0.2", 1)],
    config=amm_config(rules(rule("spread", "x-*", replicate=2, spread="host"))),
    timeout=60,
)
async def test_spread_host_puts_copies_on_distinct_hosts(c, s, a1, a2, b):
    assert b.address.startswith("tcp://127.0.0.2")
    futures = await c.scatter({"x-1": 1}, workers=[a1.address])
    await c.replicate(list(futures.values()), n=2, workers=[a1.address, a2.address])
    await wait_for(lambda: b.address in holders(s, "x-1"), "a copy on the other host")
    await wait_for(lambda: len(holders(s, "x-1")) == 2, "x-1 trimmed back to 2 copies")
    assert {s.workers[addr].host for addr in holders(s, "x-1")} == {"127.0.0.1", "127.0.0.2"}


@gen_cluster(
    client=True,
    nthreads=[("127.0.0.1", 1), ("127.0.0.1", 1), ("127.0.0.1", 1)],
    config=amm_config(rules(rule("spread", "x-*", replicate=3, spread="host"))),
)
async def test_spread_host_with_one_host_still_meets_the_count(c, s, *workers):
    futures = await c.scatter({"x-1": 1})
    await wait_for(lambda: len(holders(s, "x-1")) == 3, "x-1 on the three workers of one host")
    assert policy_of(s).last_cycle["spread"]["unmet"] == 0
    keep(futures)
