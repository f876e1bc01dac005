"""A hold of the ``memory-pressure`` section must pay: the memory of the workers it
started for must fall over each span of twice ``min-hold`` (at least ``PAYING_SPAN``
seconds). One that does not is released, and the section cools down, twice as long
after a second such release in a row; one that pays holds on (the helpers and the
cluster are those of test_memory_pressure.py)."""

from __future__ import annotations

import asyncio
import time

import pytest
from distributed.utils_test import gen_cluster

from amm_rules.engine.sections.memory_pressure import PAYING_SPAN
from benchmarks.support.waiting import wait_for
from tests.support.cluster import events, policy_of
from tests.support.pressure import WORKERS, blob, config, pressure_on, section, slow

pytestmark = pytest.mark.compat


def releases(s: object) -> list[dict[str, object]]:
    return [e for e in events(s, "memory-pressure") if e["step"] == "release"]


@gen_cluster(client=True, config=config(section(**{"cool-down": "1s"})), **WORKERS, timeout=90)
async def test_a_hold_that_does_not_lower_memory_is_released(c, s, a, b):
    policy = policy_of(s)
    base = s.WORKER_SATURATION
    held = await pressure_on(c, s, a)  # stays: nothing the hold does lowers it
    work = c.map(slow, range(400), key=[f"work-{i}" for i in range(400)])
    await wait_for(lambda: policy.pressure.state == "holding", "holding")
    started = time.monotonic()
    await wait_for(lambda: releases(s), "a release", timeout=PAYING_SPAN + 20)
    assert time.monotonic() - started >= PAYING_SPAN - 0.5
    (first,) = releases(s)
    assert str(first["reason"]).startswith("holding did not lower memory: 40% of the limits")
    assert policy.pressure.state == "cooling" and base == s.WORKER_SATURATION
    cooling = policy.pressure.cool_until - time.monotonic()
    assert 0 < cooling <= 1.0
    # Cooled down, still under pressure: held again, and released again for the same
    # reason, with a cool-down twice as long.
    await wait_for(lambda: len(releases(s)) == 2, "a second release", timeout=PAYING_SPAN + 20)
    assert str(releases(s)[1]["reason"]).startswith("holding did not lower memory")
    assert 1.0 < policy.pressure.cool_until - time.monotonic() <= 2.0
    assert policy.pressure.metrics()["unpaid"] == 2
    await c.cancel(work)
    del held


@gen_cluster(client=True, config=config(section()), **WORKERS, timeout=90)
async def test_a_hold_that_lowers_memory_holds_on(c, s, a, b):
    policy = policy_of(s)
    # 120 MiB on a: 60% of its limit, in three parts freed one by one while held.
    parts = [c.submit(blob, i, 40, key=f"part-{i}", workers=[a.address]) for i in range(3)]
    await c.gather(parts)
    work = c.map(slow, range(400), key=[f"work-{i}" for i in range(400)])
    await wait_for(lambda: policy.pressure.state == "holding", "holding")
    for _ in range(2):
        # Memory falls within each span: the hold pays, and stays.
        await asyncio.sleep(PAYING_SPAN / 2)  # window: half a span, then a part freed
        del parts[-1]
        await asyncio.sleep(PAYING_SPAN / 2 + 0.5)  # window: the span ends
        assert policy.pressure.state == "holding", releases(s)
    # 40 MiB left (20%, at the release threshold: held on); the last part goes, and the
    # hold ends because memory is low.
    del parts[-1]
    await wait_for(lambda: policy.pressure.state == "idle", "released below release")
    (release,) = releases(s)
    assert "no worker at or above 20%" in str(release["reason"])
    assert policy.pressure.metrics()["unpaid"] == 0
    await c.cancel(work)
