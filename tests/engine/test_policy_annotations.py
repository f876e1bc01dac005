"""``amm`` annotations on a real cluster: through ``submit`` and ``persist``, overriding
the rules field by field; an invalid annotation is an event, never an exception."""

from __future__ import annotations

import asyncio

import dask
from distributed.utils_test import async_poll_for, gen_cluster

from tests.support.cluster import amm_config, events, holders, inc, no_errors, policy_of, rules

RULES = rules(
    {"name": "inc-three", "match": 'task.prefix == "inc"', "replicate": 3, "spread": "host"},
    pools={"gpu": "worker.resources.GPU >= 1"},
)


@gen_cluster(client=True, nthreads=[("", 1)] * 4, config=amm_config(RULES))
async def test_annotation_through_submit_overrides_the_rules_field_by_field(c, s, *workers):
    plain = c.submit(inc, 1, key="inc-1")
    with dask.annotate(amm={"replicate": 2}):
        annotated = c.submit(inc, 2, key="inc-2")
        other = c.submit(sum, [1, 2], key="sum-1")
    await c.gather([plain, annotated, other])
    await async_poll_for(
        lambda: [len(holders(s, k)) for k in ("inc-1", "inc-2", "sum-1")] == [3, 2, 2], timeout=5
    )
    explained = await c.scheduler.amm_rules_explain(keys=["inc-2"])
    assert explained["inc-2"]["desired"] == (
        "replicate=2 from amm annotation, spread=host from rule inc-three"
    )
    no_errors(s)


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(RULES))
async def test_annotation_through_persist(c, s, *workers):
    x = dask.delayed(sum)([1, 2], dask_key_name="total")
    with dask.annotate(amm={"replicate": 3}):
        x = c.persist(x)
    await x
    await async_poll_for(lambda: len(holders(s, "total")) == 3, timeout=5)
    no_errors(s)


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(RULES))
async def test_invalid_annotation_is_ignored_with_one_event(c, s, *workers):
    with dask.annotate(amm={"replicate": -1}):
        bad = c.map(inc, range(3), key=["inc-11", "inc-12", "inc-13"])
    with dask.annotate(amm={"pool": "gpux"}):
        unknown_pool = c.submit(inc, 10, key="inc-14")
    await c.gather([*bad, unknown_pool])
    # Ignored: the keys follow the rules (three copies).
    await async_poll_for(
        lambda: all(len(holders(s, k)) == 3 for k in ("inc-11", "inc-12", "inc-13", "inc-14")),
        timeout=5,
    )
    invalid = sorted(e["error"] for e in events(s, "invalid-annotation"))
    assert len(invalid) == 2, invalid  # once per distinct value, not per key
    assert invalid[0] == "pool: unknown pool 'gpux'; did you mean 'gpu'?"
    assert invalid[1].startswith("replicate: must be at least 1")
    explained = s.handlers["amm_rules_explain"](keys=["inc-11"])["inc-11"]
    assert explained["annotation_ignored"] is True
    await asyncio.sleep(0.2)
    assert len(events(s, "invalid-annotation")) == 2
    assert policy_of(s).last_cycle["inc-three"]["governed"] == 4
    no_errors(s)
