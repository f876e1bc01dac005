"""Adaptive scale-down keeps the rules (docs/retirement.md): distributed's ``Adaptive``
on a ``LocalCluster`` retires the workers it chose through ``retire_workers`` and then
closes them; every copy made on the way is where the rules allow.
"""

from __future__ import annotations

import dask
import pytest
from distributed import Client, LocalCluster
from distributed.utils_test import gen_test

from benchmarks.support.retire import ReplicaLog, amm_measure
from benchmarks.support.waiting import wait_for
from tests.support.cluster import amm_config, events, holders, no_errors, policy_of, rules

#: Run in the version matrix too (.ci/run): the floor and the newest dask/distributed.
pytestmark = pytest.mark.compat

POOLS = {"a": 'worker.name in ["0", "1"]', "b": 'worker.name in ["2", "3"]'}
RULES = rules(
    {"name": "in-a", "match": 'task.key matches "a-*"', "pool": "a"},
    {"name": "two", "match": 'task.key matches "r-*"', "replicate": 2},
    pools=POOLS,
)


@gen_test(timeout=60)
async def test_adaptive_scale_down_places_the_keys_of_the_closed_workers_by_the_rules():
    with dask.config.set({**amm_config(RULES), **amm_measure()}):
        async with (
            LocalCluster(
                n_workers=4,
                threads_per_worker=1,
                processes=False,
                asynchronous=True,
                dashboard_address=":0",
            ) as cluster,
            Client(cluster, asynchronous=True) as c,
        ):
            s = cluster.scheduler
            by_name = {str(ws.name): ws.address for ws in s.workers.values()}
            # Data decides which workers adaptive closes (the least first): "0" and "3".
            # Worker "2" holds less than "1", so distributed alone would send a-1 there.
            data = [
                await c.scatter({"a-1": 1}, workers=[by_name["0"]]),
                await c.scatter({"big-1": b"." * 2_000_000}, workers=[by_name["1"]]),
                await c.scatter({"big-2": b"." * 1_000_000}, workers=[by_name["2"]]),
                await c.scatter({"small-3": b"." * 10_000}, workers=[by_name["3"]]),
                await c.scatter({"r-1": 1}, workers=[by_name["3"]]),
            ]
            policy = policy_of(s)
            await wait_for(lambda: len(holders(s, "r-1")) == 2, "len(holders(s, 'r-1')) == 2")
            assert {"a-1", "r-1"} <= policy.index.desired.keys()
            log = ReplicaLog(s)
            adaptive = cluster.adapt(minimum=2, maximum=4, interval="100ms", wait_count=1)
            await wait_for(lambda: len(s.workers) == 2, "len(s.workers) == 2", timeout=30)
            adaptive.stop()
            assert {str(ws.name) for ws in s.workers.values()} == {"1", "2"}
            # a-1 went to the only worker of pool a that stays, and nowhere else first.
            assert log.seen("a-1") == {by_name["1"]} == holders(s, "a-1")
            # r-1 kept two copies: the one of worker 3 was replaced before it left.
            assert holders(s, "r-1") == {by_name["1"], by_name["2"]}
            steps = [e["step"] for e in events(s, "retirement")]
            assert steps.count("placed") == 2 and "blocked" not in steps
            values = await c.gather([f for d in data for f in d.values()])
            assert values[0] == 1 and values[-1] == 1
            no_errors(s)
