"""``cycle`` events on a real scheduler (docs/policy.md, "Events"): at most one per
``summary_interval``, each adding up what was copied and dropped since the one before,
so that together they account for everything the engine did; none while nothing is done.
"""

from __future__ import annotations

import pytest
from distributed.active_memory_manager import ActiveMemoryManagerExtension
from distributed.utils_test import gen_cluster

from amm_rules.engine.policy import RulesPolicy
from benchmarks.support.waiting import PACE, cycle_until, cycles
from tests.support.cluster import amm_config, counts, keep
from tests.support.rulesets import X_THREE

#: Run in the version matrix too (.ci/run): the floor and the newest dask/distributed.
pytestmark = pytest.mark.compat

INTERVAL = 1.0


def cycle_events(s) -> list[tuple[float, dict]]:
    return [(t, e) for t, e in s.get_events("amm-rules") if e["action"] == "cycle"]


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(start=False), timeout=90)
async def test_cycle_events_are_summaries_at_most_one_per_interval(c, s, *workers):
    policy = RulesPolicy(X_THREE, summary_interval=INTERVAL)
    amm = ActiveMemoryManagerExtension(s, {policy}, register=False, start=False)
    # A new key every cycle for two intervals or more: each asks for two copies.
    futures = []
    n = round(2 * INTERVAL / PACE)
    for i in range(n):
        futures.append(await c.scatter({f"x-{i}": i}))
        await cycles(amm, 1)
    await cycle_until(amm, lambda: counts(s, [f"x-{i}" for i in range(n)]) == [3] * n, "all at 3")
    assert policy.totals["three"]["requested"] == 2 * n
    # The last summary comes once the interval has passed; together the events account
    # for every copy asked for ...
    await cycle_until(
        amm,
        lambda: sum(e["requested"] for _, e in cycle_events(s)) == 2 * n,
        "summaries adding up to every copy asked for",
    )
    emitted = cycle_events(s)
    assert all(e["rules"]["three"]["requested"] == e["requested"] for _, e in emitted)
    assert all(e["dropped"] == 0 for _, e in emitted)
    # ... in far fewer events than cycles that asked for something, one per interval
    # at most ...
    assert 2 <= len(emitted) <= n // 2
    times = [t for t, _ in emitted]
    assert all(b - a >= 0.9 * INTERVAL for a, b in zip(times, times[1:], strict=False))
    # ... and none while nothing is done.
    await cycles(amm, round(2 * INTERVAL / PACE))
    assert cycle_events(s) == emitted
    keep(futures)
