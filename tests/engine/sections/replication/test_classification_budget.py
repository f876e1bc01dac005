"""RulesPolicy on a real scheduler: the classification budget.

A policy attached to a scheduler that already holds many keys classifies them over
several cycles (``classify_keys`` / ``classify_seconds``). Until a key is classified
the policy does not know whether a rule governs it, so reduce-replicas must not trim
it: a governed key could otherwise lose copies its rule wants.
"""

from __future__ import annotations

from collections import Counter

import pytest
from distributed.active_memory_manager import ActiveMemoryManagerExtension
from distributed.utils_test import gen_cluster

from amm_rules.engine.evacuation import desired_of
from amm_rules.engine.policy import RulesPolicy
from amm_rules.observe.explain import explain_keys
from benchmarks.support.waiting import wait_for
from tests.support.cluster import Requests, amm_config, counts
from tests.support.rulesets import X_THREE

#: Run in the version matrix too (.ci/run): the floor and the newest dask/distributed.
pytestmark = pytest.mark.compat

N = 12


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(X_THREE, start=False))
async def test_budget_spreads_classification_and_spares_unclassified_keys(c, s, *workers):
    governed = await c.scatter({f"x-{i}": i for i in range(N)}, broadcast=True)
    free = await c.scatter({f"y-{i}": i for i in range(N)}, broadcast=True)
    policy = RulesPolicy(X_THREE, classify_keys=5, classify_seconds=None)
    amm = ActiveMemoryManagerExtension(s, {policy}, register=False, start=False)
    index = policy.index
    assert index.unclassified == 2 * N  # the one scan at attach, nothing classified
    requests = Requests(s)

    classified: set[str] = set()
    cycles = 0
    while index.unclassified:
        before = set(index.unclassified_keys())
        amm.run_once()
        cycles += 1
        assert s.handlers["amm_rules_status"]()["unclassified"] == index.unclassified
        waiting = index.unclassified_keys()
        assert len(waiting) == index.unclassified
        now = before - set(waiting)
        assert len(now) == 5 or not index.unclassified
        classified |= now
        # Only keys already classified may lose copies, and never a governed one.
        dropped = {key for _, key in requests.remove}
        assert dropped <= classified
        assert not any(key.startswith("x-") for key in dropped)
    assert cycles == -(-2 * N // 5)
    assert set(policy.index.desired) == set(governed)
    amm.run_once()  # every key classified: the last ones are reduced too
    assert Counter(key for _, key in requests.remove.elements()) == dict.fromkeys(free, 2)
    assert counts(s, governed) == [3] * N


@gen_cluster(client=True, nthreads=[("", 1)] * 2, config=amm_config(X_THREE, start=False))
async def test_time_budget_classifies_at_least_one_chunk(c, s, a, b):
    await c.scatter({f"y-{i}": i for i in range(N)}, broadcast=True)
    policy = RulesPolicy(X_THREE, classify_seconds=0.0)
    amm = ActiveMemoryManagerExtension(s, {policy}, register=False, start=False)
    assert policy.index.unclassified == N
    amm.run_once()
    assert not policy.index.unclassified  # fewer keys than a chunk: all in one cycle


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(X_THREE, start=False))
async def test_keys_left_over_wait_in_a_backlog_and_are_counted_once(c, s, *workers):
    """Keys a cycle's budget left over wait in a backlog (the cycle's table of keys to
    classify, kept whole, with the place it reached). Meanwhile one of them leaves
    memory, one is scattered again, one is classified on its own (as a retirement
    does): each is filed once, and explain tells the waiting ones from the others."""
    futures = await c.scatter({f"x-{i}": i for i in range(N)}, broadcast=True)
    policy = RulesPolicy(X_THREE, classify_keys=5, classify_seconds=None)
    amm = ActiveMemoryManagerExtension(s, {policy}, register=False, start=False)
    index = policy.index
    amm.run_once()
    assert len(index.desired) == 5
    assert len(index.backlog) == N and index.unclassified == N - 5
    waiting = index.unclassified_keys()
    assert set(waiting) == {f"x-{i}" for i in range(N)} - set(index.desired)
    first, gone, again, alone = waiting[0], waiting[1], waiting[2], waiting[3]
    done = next(iter(index.desired))
    explained = explain_keys(policy, [first, done])
    assert explained[first]["unclassified"] is True
    assert explained[done]["unclassified"] is False

    del futures[gone]
    await wait_for(lambda: gone not in s.tasks, "the released key forgotten")
    await c.scatter({again: -1})
    assert again in index.dirty
    desired_of(policy.ctx, s.tasks[alone])  # classified now, marked in the backlog
    assert alone in index.desired and not index.may_be_unclassified(alone)

    while index.unclassified:
        amm.run_once()
    assert not index.backlog
    in_memory = [k for k in (f"x-{i}" for i in range(N)) if k in s.tasks]
    assert sorted(index.desired) == sorted(in_memory) and gone not in in_memory
    assert index.governed.governed_by == {"three": N - 1}
    assert index.governed.copies_by == {"three": sum(len(s.tasks[k].who_has) for k in in_memory)}
