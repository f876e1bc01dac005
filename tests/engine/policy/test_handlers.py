"""The scheduler handlers, called from a real client: set_target, explain, status."""

from __future__ import annotations

import pytest
from distributed.utils_test import gen_cluster

from amm_rules.engine.handlers import refused
from benchmarks.support.waiting import wait_cycles, wait_for
from tests.support.cluster import amm_config, counts, holders, inc, policy_of
from tests.support.rulesets import INC_TWO as RULES

#: Run in the version matrix too (.ci/run): the floor and the newest dask/distributed.
pytestmark = pytest.mark.compat


@gen_cluster(client=True, nthreads=[("", 1)] * 4, config=amm_config(RULES), timeout=150)
async def test_set_target_holds_until_removed_and_is_forgotten_on_release(c, s, *workers):
    x = c.submit(sum, [1, 2], key="x-1")
    y = c.submit(inc, 1, key="inc-1")
    await c.gather([x, y])
    answer = await c.scheduler.amm_rules_set_target(keys=["x-1", "inc-1", "nope"], target=4)
    # (msgpack hands lists back as tuples)
    assert answer["set"] == 2 and list(answer["missing"]) == ["nope"]
    await wait_for(lambda: counts(s, ["x-1", "inc-1"]) == [4, 4], "both keys at 4 copies")
    # A runtime target overrides the rules' replicate; None gives the key back to them.
    await c.scheduler.amm_rules_set_target(keys=["inc-1", "x-1"], target={"min": 1, "max": 3})
    await wait_for(lambda: counts(s, ["x-1", "inc-1"]) == [3, 3], "both keys at max 3")
    await c.scheduler.amm_rules_set_target(keys=["inc-1", "x-1"], target=None)
    await wait_for(lambda: counts(s, ["inc-1"]) == [2], "inc-1 back at its rule's 2")
    await wait_for(lambda: counts(s, ["x-1"]) == [1], "x-1 reduced to 1 (no rule)")
    # Forgotten when the key is released.
    await c.scheduler.amm_rules_set_target(keys=["x-1"], target=3)
    assert "x-1" in policy_of(s).index.runtime
    del x
    await wait_for(lambda: "x-1" not in s.tasks, "x-1 released")
    assert "x-1" not in policy_of(s).index.runtime


@pytest.mark.parametrize(
    "target, message",
    [
        (0, "target: must be at least 1"),
        ("three", "target: expected a whole number of copies"),
        ({"min": 3, "max": 2}, r"target: max \(2\) is below min \(3\)"),
        ({"most": 2}, "target: unknown key 'most'"),
    ],
)
def test_set_target_rejects_bad_targets(target, message):
    @gen_cluster(client=True, nthreads=[("", 1)], config=amm_config(RULES))
    async def run(c, s, a):
        with pytest.raises(ValueError, match=message):
            refused(await c.scheduler.amm_rules_set_target(keys=["x"], target=target))
        with pytest.raises(ValueError, match="keys: expected a list of keys"):
            refused(await c.scheduler.amm_rules_set_target(keys="x", target=2))
        # The scheduler carries on.
        assert await c.submit(inc, 1) == 2

    run()


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(RULES))
async def test_explain_says_why_a_key_is_where_it_is(c, s, a, b, w3):
    y = c.submit(inc, 1, key="inc-1", workers=[a.address])
    z = c.submit(sum, [1, 2], key="z-1")
    await c.gather([y, z])
    await wait_for(lambda: len(holders(s, "inc-1")) == 2, "inc-1 at 2 copies")
    explained = await c.scheduler.amm_rules_explain(keys=["inc-1", "z-1", ("tuple", 0)])
    inc1 = explained["inc-1"]
    assert list(inc1["holders"]) == sorted(holders(s, "inc-1"))
    assert inc1["desired"] == "replicate=2 from rule two"
    assert inc1["fields"] == {"replicate": {"min": 2, "max": 2}}
    assert inc1["target"] == {"min": 2, "max": 2, "source": "two", "follows_cluster": False}
    assert inc1["demand"] == {"waiters": 0, "reads": 0, "held": ()}  # lists arrive as tuples
    assert inc1["copying"] is False
    assert inc1["eligible"] == 3
    assert inc1["unmet"] is None and not inc1["would"]
    assert sorted(inc1["workers"].values()) == ["candidate", "holds a copy", "holds a copy"]
    assert explained["z-1"]["governed"] is False
    assert explained["z-1"]["desired"] == "no rule applies"
    assert explained["('tuple', 0)"]["state"] == "unknown"


@gen_cluster(client=True, nthreads=[("", 1)] * 2, config=amm_config(RULES), timeout=60)
async def test_status_reports_rules_and_counters(c, s, a, b):
    futures = c.map(inc, range(3))
    await c.gather(futures)
    await wait_for(lambda: counts(s, futures) == [2, 2, 2], "inc keys at 2 copies")
    await wait_cycles(s, 1)  # a cycle that saw them held
    status = await c.scheduler.amm_rules_status()
    assert status["source"] == "<rules>"
    assert list(status["rules"]) == ["two"] and list(status["pools"]) == ["gpu"]
    assert status["governed"] == 3
    assert status["last_cycle"]["two"]["governed"] == 3
    assert status["totals"]["two"] == {"requested": 3, "dropped": 0}
    assert not status["reload_errors"]
    assert status["cycles"] > 0
