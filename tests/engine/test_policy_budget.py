"""RulesPolicy on a real scheduler: the classification budget, and detaching.

A policy attached to a scheduler that already holds many keys classifies them over
several cycles (``classify_keys`` / ``classify_seconds``). Until a key is classified
the policy does not know whether a rule governs it, so reduce-replicas must not trim
it: a governed key could otherwise lose copies its rule wants.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from distributed.active_memory_manager import ActiveMemoryManagerExtension
from distributed.utils_test import gen_cluster

from amm_rules.engine.policy import RulesPolicy
from tests.support.cluster import amm_config, rules

X_THREE = rules({"name": "three", "match": 'task.key matches "x-*"', "replicate": 3})
N = 12


def record_drops(scheduler: Any) -> Counter[str]:
    """Count, per key, the drops the AMM sends (the drops still happen)."""
    drops: Counter[str] = Counter()
    original = scheduler.request_remove_replicas

    def request_remove_replicas(addr: str, keys: list[Any], *, stimulus_id: str) -> None:
        drops.update(keys)
        original(addr, keys, stimulus_id=stimulus_id)

    scheduler.request_remove_replicas = request_remove_replicas
    return drops


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(X_THREE, start=False))
async def test_budget_spreads_classification_and_spares_unclassified_keys(c, s, *workers):
    governed = await c.scatter({f"x-{i}": i for i in range(N)}, broadcast=True)
    free = await c.scatter({f"y-{i}": i for i in range(N)}, broadcast=True)
    policy = RulesPolicy(X_THREE, classify_keys=5, classify_seconds=None)
    amm = ActiveMemoryManagerExtension(s, {policy}, register=False, start=False)
    assert len(policy.index.dirty) == 2 * N  # the one scan at attach, nothing classified
    drops = record_drops(s)

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
        assert set(drops) <= classified
        assert not any(key.startswith("x-") for key in drops)
    assert cycles == -(-2 * N // 5)
    assert set(policy.index.desired) == set(governed)
    amm.run_once()  # every key classified: the last ones are reduced too
    assert drops == Counter({key: 2 for key in free})
    assert all(len(s.tasks[key].who_has) == 3 for key in governed)


@gen_cluster(client=True, nthreads=[("", 1)] * 2, config=amm_config(X_THREE, start=False))
async def test_time_budget_classifies_at_least_one_chunk(c, s, a, b):
    await c.scatter({f"y-{i}": i for i in range(N)}, broadcast=True)
    policy = RulesPolicy(X_THREE, classify_seconds=0.0)
    amm = ActiveMemoryManagerExtension(s, {policy}, register=False, start=False)
    amm.run_once()
    assert not policy.index.dirty  # fewer keys than a chunk: all of them in one cycle


METHODS = ("add_replica", "remove_replica", "update_data")


def wrapped(scheduler: Any) -> dict[str, Any]:
    """The scheduler's own instance attributes for the watched methods."""
    return {name: vars(scheduler).get(name) for name in METHODS}


@gen_cluster(client=True, nthreads=[("", 1)] * 2, config=amm_config(X_THREE, start=False))
async def test_detach_puts_back_the_scheduler_methods(c, s, a, b):
    original = wrapped(s)
    first, second = RulesPolicy(X_THREE), RulesPolicy(X_THREE)
    ActiveMemoryManagerExtension(s, {first}, register=False, start=False)
    on_first = wrapped(s)
    ActiveMemoryManagerExtension(s, {second}, register=False, start=False)
    on_second = wrapped(s)
    assert on_first != original and on_second != on_first
    # Detached under another policy's wrappers: they stay, and pass through.
    first.detach()
    assert wrapped(s) == on_second
    await c.scatter({"y-1": 1}, broadcast=True)
    assert not first.index.dirty and second.index.dirty
    second.detach()
    assert wrapped(s) == on_first  # the first policy's, inactive

    # Attaching again wraps what is there, and detaching puts exactly that back.
    third = RulesPolicy(X_THREE)
    ActiveMemoryManagerExtension(s, {third}, register=False, start=False)
    third.detach()
    assert wrapped(s) == on_first


@gen_cluster(client=True, nthreads=[("", 1)] * 2, config=amm_config(X_THREE, start=False))
async def test_detach_alone_restores_the_originals(c, s, a, b):
    original, handler = wrapped(s), s.handlers["update_data"]
    for _ in range(3):  # no chain grows over re-attaching
        policy = RulesPolicy(X_THREE)
        ActiveMemoryManagerExtension(s, {policy}, register=False, start=False)
        assert wrapped(s) != original
        policy.detach()
        assert wrapped(s) == original
        assert s.handlers["update_data"] == handler
    futures = await c.scatter({"x-1": 1}, broadcast=True)
    assert list(futures) == ["x-1"]


def test_the_fast_drop_suggestion_is_the_stock_suggestion():
    from distributed.active_memory_manager import Suggestion

    from amm_rules.engine.reduce_replicas import _drop_suggestion

    ts = object()
    made = _drop_suggestion(ts)
    assert made == Suggestion("drop", ts) and type(made) is Suggestion
    assert (made.op, made.ts, made.candidates) == ("drop", ts, None)
