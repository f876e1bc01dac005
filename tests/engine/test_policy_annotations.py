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


# -- the top-level `replicate` annotation: shorthand for amm={"replicate": ...} ---------


@gen_cluster(client=True, nthreads=[("", 1)] * 4, config=amm_config(RULES))
async def test_replicate_annotation_is_shorthand_for_amm(c, s, *workers):
    with dask.annotate(replicate=3):
        exact = c.submit(sum, [1, 2], key="short-1")
    with dask.annotate(replicate={"min": 2, "max": 2}):
        ranged = c.submit(sum, [1, 3], key="short-2")
    # Both set: amm's own replicate wins; its other fields combine with the shorthand.
    with dask.annotate(replicate=4, amm={"replicate": 2}):
        amm_wins = c.submit(sum, [1, 4], key="short-3")
    with dask.annotate(replicate=3, amm={"spread": "host"}):
        combined = c.submit(sum, [1, 5], key="short-4")
    await c.gather([exact, ranged, amm_wins, combined])
    keys = ["short-1", "short-2", "short-3", "short-4"]
    await async_poll_for(lambda: [len(holders(s, k)) for k in keys] == [3, 2, 2, 3], timeout=10)
    explained = await c.scheduler.amm_rules_explain(keys=keys)
    assert explained["short-1"]["desired"] == "replicate=3 from amm annotation"
    assert explained["short-3"]["desired"] == "replicate=2 from amm annotation"
    assert explained["short-4"]["desired"] == (
        "replicate=3 from amm annotation, spread=host from amm annotation"
    )
    assert all(not explained[k]["annotation_ignored"] for k in keys)
    no_errors(s)


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(RULES))
async def test_replicate_annotation_on_a_persisted_collection(c, s, *workers):
    """The chunks of a collection have tuple keys; the annotation reaches every one."""
    import dask.array as da

    x = da.arange(8, chunks=2) + 1
    with dask.annotate(replicate=2):
        x = c.persist(x)
    await x
    keys = [ts.key for ts in s.tasks.values() if isinstance(ts.key, tuple) and ts.who_has]
    assert len(keys) == 4
    await async_poll_for(lambda: all(len(holders(s, k)) == 2 for k in keys), timeout=10)
    no_errors(s)


@gen_cluster(client=True, nthreads=[("", 1)] * 4, config=amm_config(RULES))
async def test_invalid_replicate_annotation_is_an_event_never_an_exception(c, s, *workers):
    with dask.annotate(replicate="many"):
        bad = c.map(inc, range(2), key=["inc-21", "inc-22"])
    # An invalid shorthand is ignored alone: a valid amm annotation still applies.
    with dask.annotate(replicate=0, amm={"replicate": 2}):
        half = c.submit(inc, 5, key="inc-23")
    await c.gather([*bad, half])
    # Ignored: inc-21/22 follow the rules (three copies); inc-23 its amm annotation.
    await async_poll_for(
        lambda: [len(holders(s, k)) for k in ("inc-21", "inc-22", "inc-23")] == [3, 3, 2],
        timeout=10,
    )
    invalid = sorted((e["name"], e["error"]) for e in events(s, "invalid-annotation"))
    assert [name for name, _ in invalid] == ["replicate", "replicate"]
    assert invalid[0][1].startswith("replicate: expected a whole number of copies")
    assert invalid[0][1].endswith("got 'many'")
    assert invalid[1][1] == (
        "replicate: must be at least 1 (the AMM never drops the last copy), got 0"
    )
    explained = s.handlers["amm_rules_explain"](keys=["inc-21", "inc-23"])
    assert explained["inc-21"]["annotations_ignored"] == ["replicate"]
    assert explained["inc-23"]["annotations_ignored"] == ["replicate"]
    assert explained["inc-23"]["desired"].startswith("replicate=2 from amm annotation")
    no_errors(s)
