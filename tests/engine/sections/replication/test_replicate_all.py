"""``replicate: all`` on real clusters: in a rule with a pool, in an annotation, and with
``{min: 2, max: all}``; a worker that joins gets its copies in the first cycle after it
joined; one that leaves makes the target smaller, not unmet."""

from __future__ import annotations

from typing import Any

import pytest
from distributed import Worker
from distributed.active_memory_manager import ActiveMemoryManagerExtension
from distributed.utils_test import gen_cluster

import amm_rules
from amm_rules.engine.policy import RulesPolicy
from benchmarks.support.waiting import cycles, wait_cycles, wait_for
from tests.support.cluster import amm_config, holders, inc, no_errors, policy_of, rules

#: Run in the version matrix too (.ci/run): the floor and the newest dask/distributed.
pytestmark = pytest.mark.compat

GPU = {"resources": {"GPU": 1}}
POOLS = {"gpu": "worker.resources.GPU >= 1"}
MODELS = rules(
    {"name": "models", "match": 'task.key matches "model-*"', "replicate": "all", "pool": "gpu"},
    {
        "name": "lookups",
        "match": 'task.key matches "lookup-*"',
        "replicate": {"min": 2, "max": "all"},
    },
    pools=POOLS,
)


async def landed(s: Any, key: str, expected: set[str]) -> None:
    """Wait for copies already asked for to land (no AMM cycle runs meanwhile)."""
    await wait_for(lambda: holders(s, key) == expected, f"{key} held by {sorted(expected)}")


@gen_cluster(
    client=True,
    nthreads=[("", 1, GPU), ("", 1, GPU), ("", 1), ("", 1)],
    config=amm_config(MODELS),
)
async def test_all_with_a_pool_counts_only_that_pools_workers(c, s, g1, g2, w1, w2):
    gpus = {g1.address, g2.address}
    model = c.submit(inc, 1, key="model-1", workers=[w1.address])
    await model
    await wait_for(lambda: holders(s, "model-1") == gpus, "model-1 on both GPU workers")
    why = (await c.scheduler.amm_rules_explain(keys=["model-1"]))["model-1"]
    assert why["target"] == {"min": 2, "max": 2, "source": "models", "follows_cluster": True}
    assert why["eligible"] == 2 and why["unmet"] is None
    assert policy_of(s).last_cycle["models"]["unmet"] == 0
    no_errors(s)


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(MODELS), timeout=90)
async def test_min_two_max_all_keeps_what_lands_and_adds_to_two(c, s, a, b, w3):
    lookup = c.submit(inc, 1, key="lookup-1", workers=[a.address])
    await lookup
    await wait_for(lambda: len(holders(s, "lookup-1")) == 2, "lookup-1 at its min of 2")
    # A dependent on the worker without a copy copies it there: kept (max is all).
    (third,) = {w.address for w in (a, b, w3)} - holders(s, "lookup-1")
    reader = c.submit(inc, lookup, key="reader-1", workers=[third])
    await reader
    await wait_for(lambda: third in holders(s, "lookup-1"), "lookup-1 copied to its reader")
    del reader
    await wait_cycles(s, 10)
    assert len(holders(s, "lookup-1")) == 3
    no_errors(s)


@gen_cluster(
    client=True, nthreads=[("", 1, GPU), ("", 1)], config=amm_config(start=False), timeout=60
)
async def test_a_joining_worker_gets_its_copies_in_the_first_cycle(c, s, g1, w1):
    policy = RulesPolicy(MODELS)
    amm = ActiveMemoryManagerExtension(s, {policy}, register=False, start=False)
    model = c.submit(inc, 1, key="model-1", workers=[g1.address])
    await model
    await cycles(amm, 3)
    assert holders(s, "model-1") == {g1.address}
    async with Worker(s.address, nthreads=1, resources={"GPU": 1}) as g2:
        async with Worker(s.address, nthreads=1) as cpu:
            await cycles(amm, 1)  # one cycle, then nothing but the transfer
            await landed(s, "model-1", {g1.address, g2.address})
            assert cpu.address not in holders(s, "model-1")
            assert policy.totals["models"]["requested"] == 1
        # The GPU worker leaves: the target is one copy again, and met.
        await cycles(amm, 1)
    await wait_for(lambda: len(s.workers) == 2, "the two joined workers gone")
    await cycles(amm, 2)
    assert holders(s, "model-1") == {g1.address}
    assert policy.last_cycle["models"]["unmet"] == 0
    no_errors(s)


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(rules()), timeout=60)
async def test_all_in_an_annotation_and_a_runtime_target(c, s, a, b, w3):
    with amm_rules.annotate(replicate="all"):
        x = c.submit(inc, 1, key="x-1", workers=[a.address])
    await x
    await wait_for(lambda: len(holders(s, "x-1")) == 3, "x-1 on all 3 workers")
    y = c.submit(inc, 2, key="y-1", workers=[a.address])
    answer = await amm_rules.replicate(y, n="all", client=c)
    assert answer == {"set": 1, "missing": []}
    await wait_for(lambda: len(holders(s, "y-1")) == 3, "y-1 on all 3 workers")
    why = await amm_rules.explain([x, y], client=c)
    assert why["x-1"]["desired"] == "replicate=all from amm annotation"
    assert why["y-1"]["desired"] == "replicate=all from runtime target"
    assert why["y-1"]["fields"] == {"replicate": {"min": "all", "max": "all"}}
    no_errors(s)
