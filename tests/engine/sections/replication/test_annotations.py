"""``amm`` annotations on a real cluster: through ``submit`` and ``persist``, overriding
the rules field by field; an invalid annotation is an event, never an exception."""

from __future__ import annotations

import dask
import dask.array as da
import pytest
from distributed.utils_test import gen_cluster

from benchmarks.support.waiting import wait_cycles, wait_for
from tests.support.cluster import amm_config, counts, events, holders, inc, policy_of
from tests.support.rulesets import GPU_POOL, rules

#: Run in the version matrix too (.ci/run): the floor and the newest dask/distributed.
pytestmark = pytest.mark.compat

RULES = rules(
    {"name": "inc-three", "match": 'task.prefix == "inc"', "replicate": 3, "spread": "host"},
    pools=GPU_POOL,
)


@gen_cluster(client=True, nthreads=[("", 1)] * 4, config=amm_config(RULES))
async def test_annotation_through_submit_overrides_the_rules_field_by_field(c, s, *workers):
    plain = c.submit(inc, 1, key="inc-1")
    with dask.annotate(amm={"replicate": 2}):
        annotated = c.submit(inc, 2, key="inc-2")
        other = c.submit(sum, [1, 2], key="sum-1")
    await c.gather([plain, annotated, other])
    await wait_for(
        lambda: counts(s, ["inc-1", "inc-2", "sum-1"]) == [3, 2, 2],
        "3 copies by rule, 2 by annotation (also for a key no rule governs)",
        show=lambda: counts(s, ["inc-1", "inc-2", "sum-1"]),
    )
    explained = await c.scheduler.amm_rules_explain(keys=["inc-2"])
    assert explained["inc-2"]["desired"] == (
        "replicate=2 from amm annotation, spread=host from rule inc-three"
    )


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(RULES))
async def test_annotation_through_persist(c, s, *workers):
    x = dask.delayed(sum)([1, 2], dask_key_name="total")
    with dask.annotate(amm={"replicate": 3}):
        x = c.persist(x)
    await x
    await wait_for(lambda: len(holders(s, "total")) == 3, "total at its annotated 3 copies")


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(RULES), timeout=60)
async def test_invalid_annotation_is_ignored_with_one_event(c, s, *workers):
    with dask.annotate(amm={"replicate": -1}):
        bad = c.map(inc, range(3), key=["inc-11", "inc-12", "inc-13"])
    with dask.annotate(amm={"pool": "gpux"}):
        unknown_pool = c.submit(inc, 10, key="inc-14")
    await c.gather([*bad, unknown_pool])
    # Ignored: the keys follow the rules (three copies).
    await wait_for(
        lambda: counts(s, ["inc-11", "inc-12", "inc-13", "inc-14"]) == [3] * 4,
        "the four keys at their rule's 3 copies",
    )
    invalid = sorted(e["error"] for e in events(s, "invalid-annotation"))
    assert len(invalid) == 2, invalid  # once per distinct value, not per key
    assert invalid[0] == "pool: unknown pool 'gpux'; did you mean 'gpu'?"
    assert invalid[1].startswith("replicate: must be at least 1")
    explained = (await s.handlers["amm_rules_explain"](keys=["inc-11"]))["inc-11"]
    assert explained["annotation_ignored"] is True
    # Once, not once per cycle.
    await wait_cycles(s, 10)
    assert len(events(s, "invalid-annotation")) == 2
    assert policy_of(s).last_cycle["inc-three"]["governed"] == 4


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
    await wait_for(
        lambda: counts(s, keys) == [3, 2, 2, 3],
        "the shorthand's targets held",
        show=lambda: counts(s, keys),
    )
    explained = await c.scheduler.amm_rules_explain(keys=keys)
    assert explained["short-1"]["desired"] == "replicate=3 from amm annotation"
    assert explained["short-3"]["desired"] == "replicate=2 from amm annotation"
    assert explained["short-4"]["desired"] == (
        "replicate=3 from amm annotation, spread=host from amm annotation"
    )
    assert all(not explained[k]["annotation_ignored"] for k in keys)


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(RULES))
async def test_replicate_annotation_on_a_persisted_collection(c, s, *workers):
    """The chunks of a collection have tuple keys; the annotation reaches every one."""
    x = da.arange(8, chunks=2) + 1
    with dask.annotate(replicate=2):
        x = c.persist(x)
    await x
    keys = [ts.key for ts in s.tasks.values() if isinstance(ts.key, tuple) and ts.who_has]
    assert len(keys) == 4
    await wait_for(lambda: counts(s, keys) == [2] * 4, "every chunk at 2 copies")


@gen_cluster(client=True, nthreads=[("", 1)] * 4, config=amm_config(RULES))
async def test_invalid_replicate_annotation_is_an_event_never_an_exception(c, s, *workers):
    with dask.annotate(replicate="many"):
        bad = c.map(inc, range(2), key=["inc-21", "inc-22"])
    # An invalid shorthand is ignored alone: a valid amm annotation still applies.
    with dask.annotate(replicate=0, amm={"replicate": 2}):
        half = c.submit(inc, 5, key="inc-23")
    await c.gather([*bad, half])
    # Ignored: inc-21/22 follow the rules (three copies); inc-23 its amm annotation.
    await wait_for(
        lambda: counts(s, ["inc-21", "inc-22", "inc-23"]) == [3, 3, 2],
        "inc-21 and inc-22 at the rule's 3 copies, inc-23 at its annotation's 2",
    )
    invalid = sorted((e["name"], e["error"]) for e in events(s, "invalid-annotation"))
    assert [name for name, _ in invalid] == ["replicate", "replicate"]
    assert invalid[0][1].startswith("replicate: expected a whole number of copies")
    assert invalid[0][1].endswith("got 'many'")
    assert invalid[1][1] == (
        "replicate: must be at least 1 (the AMM never drops the last copy), got 0"
    )
    explained = await s.handlers["amm_rules_explain"](keys=["inc-21", "inc-23"])
    assert explained["inc-21"]["annotations_ignored"] == ["replicate"]
    assert explained["inc-23"]["annotations_ignored"] == ["replicate"]
    assert explained["inc-23"]["desired"].startswith("replicate=2 from amm annotation")
