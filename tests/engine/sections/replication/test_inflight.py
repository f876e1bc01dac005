"""Copies in flight on a real scheduler (docs/policy.md, "In-flight copies are
remembered"): the default ``inflight_timeout`` is ``max(3 x interval, 10 s)``; past it
the engine gives the copy up and does not ask that worker again for the same key for as
long again; a suggestion the AMM refused is suggested again at the next cycle, once per
cycle.

The AMM is driven by the test (``start=False``), so that each cycle is one
``run_once``; a worker whose transfers hang is ``distributed.utils_test``'s
``BlockedGatherDep``.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from distributed.active_memory_manager import ActiveMemoryManagerExtension
from distributed.utils_test import BlockedGatherDep, gen_cluster, inc

from amm_rules.engine.policy import RulesPolicy
from benchmarks.support.waiting import cycle_until, cycles, wait_for
from tests.support.cluster import Requests, amm_config, counts, holders, keep
from tests.support.rulesets import X_THREE, rule, rules

#: Run in the version matrix too (.ci/run): the floor and the newest dask/distributed.
pytestmark = pytest.mark.compat

RECV = {"resources": {"RECV": 1}}
#: x-* keys live on the workers with the RECV resource.
INTO_RECV = rules(rule("into", "x-*", pool="recv"), pools={"recv": "worker.resources.RECV >= 1"})


def asked(requests: Requests, key: str) -> list[float]:
    """When each copy of ``key`` was asked for (``time.monotonic()``), in order."""
    return [t for t, op, _, k in requests.log if op == "acquire" and k == key]


@gen_cluster(client=True, nthreads=[("", 1)], config=amm_config(start=False), timeout=90)
async def test_the_default_inflight_timeout_is_three_intervals_at_least_ten_seconds(c, s, a):
    slow_amm = RulesPolicy(X_THREE)
    ActiveMemoryManagerExtension(s, {slow_amm}, register=False, start=False, interval=5.0)
    assert slow_amm.inflight_timeout == 15.0  # 3 x 5 s
    slow_amm.detach()
    assert RulesPolicy(X_THREE, inflight_timeout=2.5).inflight_timeout == 2.5
    async with BlockedGatherDep(s.address, nthreads=1, resources={"RECV": 1}) as slow:
        await wait_for(lambda: len(s.workers) == 2, "the slow worker joined")
        policy = RulesPolicy(INTO_RECV)
        amm = ActiveMemoryManagerExtension(s, {policy}, register=False, start=False, interval=0.05)
        assert policy.inflight_timeout == 10.0  # 3 x 0.05 s is less than 10 s
        requests = Requests(s)
        x = c.submit(inc, 1, key="x-1", workers=[a.address])
        await x
        await cycle_until(amm, lambda: asked(requests, "x-1"), "a copy of x-1 asked of slow")
        # The copy counts as in flight for those 10 s.
        ((deadline, by),) = (
            (c.deadline, c.by) for c in policy.ctx.ledger.in_flight("x-1").values()
        )
        assert by == "replication"
        (first,) = asked(requests, "x-1")
        assert first < deadline <= first + 10.0
        await cycles(amm, 5)
        assert requests.of("x-1") == ({slow.address: 1}, {})
        assert list(policy.ctx.ledger.in_flight("x-1")) == [slow.address]
        slow.block_gather_dep.set()
        await cycle_until(amm, lambda: holders(s, "x-1") == {slow.address}, "x-1 moved")
        keep(x)


@gen_cluster(client=True, nthreads=[("", 1)], config=amm_config(start=False), timeout=120)
async def test_a_copy_that_does_not_land_is_given_up_and_its_worker_backed_off(c, s, a):
    """The only worker a key may go to hangs on the transfer: the copy counts as in
    flight until its deadline, is then given up, and that worker is asked again only
    once the back-off, as long again, is over."""
    async with BlockedGatherDep(s.address, nthreads=1, resources={"RECV": 1}) as slow:
        await wait_for(lambda: len(s.workers) == 2, "the slow worker joined")
        timeout = 1.0
        policy = RulesPolicy(INTO_RECV, inflight_timeout=timeout)
        amm = ActiveMemoryManagerExtension(s, {policy}, register=False, start=False)
        requests = Requests(s)
        x = c.submit(inc, 1, key="x-1", workers=[a.address])
        await x
        await cycle_until(amm, lambda: asked(requests, "x-1"), "a copy of x-1 asked of slow")
        await slow.in_gather_dep.wait()
        ledger = policy.ctx.ledger
        (deadline,) = (c.deadline for c in ledger.in_flight("x-1").values())
        # Given up once the deadline passed; the slow worker backed off for as long again.
        await cycle_until(amm, lambda: "x-1" in ledger.backoffs, "the copy given up")
        gave_up = time.monotonic()
        (until,) = ledger.backing_off("x-1").values()
        assert "x-1" not in ledger.copies and gave_up >= deadline
        assert deadline + timeout <= until <= gave_up + timeout
        # No other worker may hold it: nothing is asked until the back-off ends ...
        await cycle_until(amm, lambda: len(asked(requests, "x-1")) == 2, "asked again")
        assert asked(requests, "x-1")[1] >= until
        assert requests.of("x-1") == ({slow.address: 2}, {})
        assert holders(s, "x-1") == {a.address}  # never dropped before a copy landed
        # ... and when the transfer is let through, the key moves.
        slow.block_gather_dep.set()
        await cycle_until(amm, lambda: holders(s, "x-1") == {slow.address}, "x-1 moved")
        keep(x)


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(start=False), timeout=60)
async def test_a_refused_suggestion_is_suggested_again_once_per_cycle(c, s, *workers):
    policy = RulesPolicy(X_THREE)
    amm = ActiveMemoryManagerExtension(s, {policy}, register=False, start=False)
    x = await c.scatter({"x-1": 1})
    # The AMM refuses every copy for five cycles (as it does when its own checks say no).
    per_cycle: list[int] = []
    find_recipient = amm._find_recipient

    def refusing(ts: Any, candidates: Any, pending_repl: Any) -> Any:
        per_cycle[-1] += 1
        return None if len(per_cycle) <= 5 else find_recipient(ts, candidates, pending_repl)

    amm._find_recipient = refusing  # type: ignore[method-assign]
    for _ in range(5):
        per_cycle.append(0)
        amm.run_once()
    # Two copies missing: each cycle suggests them once, not more, not fewer.
    assert per_cycle == [2, 2, 2, 2, 2]
    assert "x-1" not in policy.ctx.ledger.copies and counts(s, ["x-1"]) == [1]
    per_cycle.append(0)
    amm.run_once()
    assert per_cycle[-1] == 2 and len(policy.ctx.ledger.in_flight("x-1")) == 2
    per_cycle.append(0)
    await cycles(amm, 1)
    assert per_cycle[-1] == 0  # in flight: nothing suggested again
    await cycle_until(amm, lambda: counts(s, ["x-1"]) == [3], "x-1 at 3 copies")
    keep(x)
