"""Attaching and detaching RulesPolicy on a real scheduler: the scheduler methods it
wraps (replica changes, workers' resources and heartbeats, ``replicate`` and
``scatter``, adaptive scaling's questions and ``retire_workers``) and the comm handlers
bound to them, its plugin and its own handlers are
put back as they were, also when several policies attach in turn."""

from __future__ import annotations

from typing import Any

import pytest
from distributed.active_memory_manager import ActiveMemoryManagerExtension
from distributed.utils_test import gen_cluster

from amm_rules.engine.policy import RulesPolicy
from tests.support.cluster import amm_config, counts
from tests.support.rulesets import X_THREE

#: Run in the version matrix too (.ci/run): the floor and the newest dask/distributed.
pytestmark = pytest.mark.compat

#: Methods whose comm handler has their name and is bound to them.
SAME_NAME = (
    "update_data",
    "heartbeat_worker",
    "replicate",
    "scatter",
    "adaptive_target",
    "workers_to_close",
    "retire_workers",
)
METHODS = ("add_replica", "remove_replica", "remove_all_replicas", "add_resources", *SAME_NAME)
#: The comm handlers bound to some of them.
HANDLERS = ("set_resources", *SAME_NAME)


def wrapped(scheduler: Any) -> dict[str, Any]:
    """The scheduler's own instance attributes for the watched methods, and the
    handlers bound to them."""
    return {
        **{name: vars(scheduler).get(name) for name in METHODS},
        **{f"handler:{name}": scheduler.handlers[name] for name in HANDLERS},
    }


@gen_cluster(client=True, nthreads=[("", 1)] * 2, config=amm_config(X_THREE, start=False))
async def test_detach_puts_back_the_scheduler_methods(c, s, a, b):
    original = wrapped(s)
    first, second = RulesPolicy(X_THREE), RulesPolicy(X_THREE)
    ActiveMemoryManagerExtension(s, {first}, register=False, start=False)
    on_first = wrapped(s)
    ActiveMemoryManagerExtension(s, {second}, register=False, start=False)
    on_second = wrapped(s)
    assert on_first != original and on_second != on_first
    # The first policy's wrappers take the keywords of the methods they wrap: the
    # second's feature check finds them (retire_workers(close_workers=, remove=)).
    assert second.unsupported == {}
    # Detached under another policy's wrappers: they stay, and pass through.
    first.detach()
    assert wrapped(s) == on_second
    await c.scatter({"y-1": 1}, broadcast=True)
    assert not first.index.dirty and set(second.index.dirty) == {"y-1"}
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
    policies = []
    for _ in range(3):  # no chain grows over re-attaching
        policy = RulesPolicy(X_THREE)
        policies.append(policy)
        ActiveMemoryManagerExtension(s, {policy}, register=False, start=False)
        assert wrapped(s) != original
        policy.detach()
        assert wrapped(s) == original
        assert s.handlers["update_data"] == handler
    # The scheduler's own methods at work again: scattered data lands, unseen.
    futures = await c.scatter({"x-1": 1}, broadcast=True)
    assert counts(s, futures) == [2]
    assert all(not p.index.dirty and not p.index.touched for p in policies)


@gen_cluster(client=True, nthreads=[("", 1)] * 2, config=amm_config(X_THREE, start=False))
async def test_detach_stops_listening(c, s, a, b):
    policy = RulesPolicy(X_THREE)
    amm = ActiveMemoryManagerExtension(s, {policy}, register=False, start=False)
    assert "amm_rules_status" in s.handlers
    assert policy.ctx.hooks in s.plugins.values()
    policy.detach()
    assert policy not in amm.policies
    assert "amm_rules_status" not in s.handlers
    # The engine's plugin left with its last member: nothing of the engine is called.
    assert not any(name.startswith("amm-rules") for name in s.plugins)
    assert len(policy.ctx.hooks) == 0
    futures = await c.scatter({"x-1": 1}, broadcast=True)
    assert counts(s, futures) == [2]
    assert not policy.index.dirty and not policy.index.touched
