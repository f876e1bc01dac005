"""Failures inside the engine never break the scheduler (docs/policy.md, "Never breaks
the scheduler"), provoked on a real cluster:

- an exception inside a cycle becomes one ``error`` event (an identical error is
  logged once), the rest of that cycle is skipped, and the other policies of the AMM
  still run; the next good cycle carries on;
- a match that raises counts as "no match" for the key and gives one ``rule-error``
  event for its rule (here: an annotation value whose comparison raises);
- a pool expression that raises leaves the worker out of the pool and gives one
  ``rule-error`` event for the pool.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Generator
from typing import Any

import dask
import pytest
from distributed.active_memory_manager import (
    ActiveMemoryManagerExtension,
    ActiveMemoryManagerPolicy,
    Suggestion,
)
from distributed.utils_test import gen_cluster, inc

from amm_rules.engine.policy import RulesPolicy
from amm_rules.engine.state import placement
from benchmarks.support.waiting import cycle_until, cycles, wait_cycles, wait_for
from tests.support.cluster import Requests, amm_config, counts, events, holders, keep, policy_of
from tests.support.rulesets import GPU, GPU_POOL, X_THREE, rule, rules

#: Run in the version matrix too (.ci/run): the floor and the newest dask/distributed.
pytestmark = pytest.mark.compat


class CopyToAll(ActiveMemoryManagerPolicy):
    """Another policy in the same AMM: copies one key to every worker, and counts its
    cycles."""

    def __init__(self, key: str):
        self.key = key
        self.runs = 0

    def run(self) -> Generator[Suggestion, Any, None]:
        self.runs += 1
        ts = self.manager.scheduler.tasks.get(self.key)
        if ts is None or ts.state != "memory":
            return
        for _ in range(len(self.manager.scheduler.workers) - len(ts.who_has)):
            yield Suggestion("replicate", ts)


@pytest.mark.engine_errors("error")
@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(start=False), timeout=90)
async def test_an_exception_in_a_cycle_is_one_event_and_other_policies_run(c, s, *workers):
    policy = RulesPolicy(X_THREE)
    other = CopyToAll("y-1")
    amm = ActiveMemoryManagerExtension(s, {policy, other}, register=False, start=False)
    x = await c.scatter({"x-1": 1})
    y = await c.scatter({"y-1": 1})

    def broken(*args: Any, **kwargs: Any) -> bool:
        raise RuntimeError("injected fault")

    # A fault at the start of every cycle of RulesPolicy (the pools' refresh).
    policy.placements.refresh = broken  # type: ignore[method-assign]
    requests = Requests(s)
    await cycle_until(amm, lambda: counts(s, ["y-1"]) == [3], "y-1 copied by the other policy")
    await cycles(amm, 5)
    assert other.runs >= 6 and policy.cycles == other.runs
    # One event for the identical error of every cycle; the rest of each cycle skipped:
    # RulesPolicy asked nothing for x-1, nor trimmed y-1 (reduce-replicas).
    assert events(s, "error") == [{"action": "error", "error": "RuntimeError('injected fault')"}]
    assert requests.of("x-1") == ({}, {}) and requests.remove == {}
    assert counts(s, ["x-1", "y-1"]) == [1, 3]

    # Fixed: the next cycle does what the rules say.
    del policy.placements.refresh
    amm.policies.discard(other)
    await cycle_until(amm, lambda: counts(s, ["x-1", "y-1"]) == [3, 1], "the rules held again")
    assert len(events(s, "error")) == 1
    keep(x, y)


class Tier(str):
    """An annotation value (a client may annotate with any object) whose comparison
    raises."""

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("a tier that cannot be compared")

    __hash__ = str.__hash__


@pytest.mark.engine_errors("rule-error")
@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 3,
    config=amm_config(
        rules({"name": "gold", "match": 'task.annotations.tier == "gold"', "replicate": 2})
    ),
    timeout=60,
)
async def test_a_match_that_raises_is_no_match_and_one_rule_error(c, s, *workers):
    with dask.annotate(tier=Tier("gold")):
        odd = c.map(inc, range(3), key=["odd-1", "odd-2", "odd-3"])
    with dask.annotate(tier="gold"):
        gold = c.submit(inc, 10, key="gold-1")
    assert await c.gather([*odd, gold]) == [1, 2, 3, 11]
    await wait_for(lambda: counts(s, [gold]) == [2], "gold-1 at its rule's 2 copies")
    await wait_cycles(s, 5)
    assert counts(s, odd) == [1, 1, 1]  # "no match": no rule governs them
    assert events(s, "rule-error") == [
        {
            "action": "rule-error",
            "rule": "gold",
            "error": "RuntimeError('a tier that cannot be compared')",
        }
    ]


class Angry(float):
    """A resource amount whose comparison raises."""

    def __ge__(self, other: object) -> bool:
        raise RuntimeError("a resource that cannot be compared")


@pytest.mark.engine_errors("rule-error")
@gen_cluster(
    client=True,
    nthreads=[("", 1, GPU), ("", 1, GPU), ("", 1)],
    config=amm_config(rules(rule("device", "x-*", pool="gpu", replicate=2), pools=GPU_POOL)),
    timeout=90,
)
async def test_a_pool_that_raises_leaves_the_worker_out_and_is_one_rule_error(
    c, s, g1, g2, cpu, monkeypatch
):
    # g2's resources, as the pool expression sees them, cannot be compared.
    facts_of = placement.worker_facts

    def angry_facts(ws: Any, memory: int) -> Any:
        facts = facts_of(ws, memory)
        if ws.address != g2.address:
            return facts
        return dataclasses.replace(
            facts, resources={k: Angry(v) for k, v in facts.resources.items()}
        )

    monkeypatch.setattr(placement, "worker_facts", angry_facts)
    # Pools are evaluated when workers change: as if one had just joined.
    policy_of(s).index.note_workers_changed()
    x = c.submit(inc, 1, key="x-1", workers=[cpu.address])
    await x
    # Only g1 is in the pool: the key moves there, unmet (2 wanted, 1 eligible).
    await wait_for(lambda: holders(s, "x-1") == {g1.address}, "x-1 moved to g1 only")
    await wait_cycles(s, 5)
    assert holders(s, "x-1") == {g1.address}
    explained = (await c.scheduler.amm_rules_explain(keys=["x-1"]))["x-1"]
    assert explained["eligible"] == 1
    (error,) = events(s, "rule-error")
    assert error == {
        "action": "rule-error",
        "rule": "pools.gpu",
        "error": "RuntimeError('a resource that cannot be compared')",
    }
