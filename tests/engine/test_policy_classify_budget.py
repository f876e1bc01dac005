"""RulesPolicy on a real scheduler: the classification budget.

A policy attached to a scheduler that already holds many keys classifies them over
several cycles (``classify_keys`` / ``classify_seconds``). Until a key is classified
the policy does not know whether a rule governs it, so reduce-replicas must not trim
it: a governed key could otherwise lose copies its rule wants.
"""

from __future__ import annotations

from collections import Counter

from distributed.active_memory_manager import ActiveMemoryManagerExtension
from distributed.utils_test import gen_cluster

from amm_rules.engine.policy import RulesPolicy
from tests.support.cluster import Requests, amm_config, counts
from tests.support.rulesets import X_THREE

N = 12


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(X_THREE, start=False))
async def test_budget_spreads_classification_and_spares_unclassified_keys(c, s, *workers):
    governed = await c.scatter({f"x-{i}": i for i in range(N)}, broadcast=True)
    free = await c.scatter({f"y-{i}": i for i in range(N)}, broadcast=True)
    policy = RulesPolicy(X_THREE, classify_keys=5, classify_seconds=None)
    amm = ActiveMemoryManagerExtension(s, {policy}, register=False, start=False)
    assert len(policy.index.dirty) == 2 * N  # the one scan at attach, nothing classified
    requests = Requests(s)

    classified: set[str] = set()
    cycles = 0
    while policy.index.dirty:
        before = set(policy.index.dirty)
        amm.run_once()
        cycles += 1
        assert s.handlers["amm_rules_status"]()["unclassified"] == len(policy.index.dirty)
        now = before - policy.index.dirty.keys()
        assert len(now) == 5 or not policy.index.dirty
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
    assert len(policy.index.dirty) == N
    amm.run_once()
    assert not policy.index.dirty  # fewer keys than a chunk: all of them in one cycle
