"""The audit: the safety net behind the engine's scheduler hooks.

Each test blinds the hooks (``index.active = False`` makes the replica wrappers pass
through; removing the plugin hides transitions), changes the cluster behind the
engine's back, and checks what an audit finds and repairs, and that without audits the
engine indeed did not notice (so the test can tell the audit's work from the hooks').
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from distributed.active_memory_manager import ActiveMemoryManagerExtension
from distributed.utils_test import gen_cluster

from amm_rules.engine.policy import RulesPolicy
from tests.support.cluster import (
    amm_config,
    copies,
    events,
    more_cycles,
    no_errors,
    policy_of,
    rules,
)

PAIR = {"name": "pair", "match": 'task.key matches "pair-*"', "replicate": 2}


def blind(s: Any, policy: Any) -> str:
    """Hide every change from the engine; return the plugin's name, for :func:`unblind`."""
    (name,) = [n for n, p in s.plugins.items() if p is policy.index]
    policy.index.active = False
    s.remove_plugin(name=name)
    return name


def unblind(s: Any, policy: Any, name: str) -> None:
    s.add_plugin(policy.index, name=name)
    policy.index.active = True


def run_audited(audit_interval: float | None):
    return gen_cluster(
        client=True,
        nthreads=[("", 1)] * 3,
        # The replicate and scatter calls make extra copies here, as with stock Dask.
        config=amm_config(rules(PAIR, legacy_replicate="ignore"), audit_interval=audit_interval),
    )


async def replicate_unseen(c: Any, s: Any) -> tuple[list[Any], list[Any], str]:
    """Two governed keys held at 2 copies and two free keys at 1; then, unseen, every
    key copied to all three workers."""
    policy = policy_of(s)
    pairs = list((await c.scatter({f"pair-{i}": i for i in range(2)})).values())
    free = list((await c.scatter({f"free-{i}": i for i in range(2)})).values())
    for _ in range(100):
        if all(copies(s, f.key) == 2 for f in pairs):
            break
        await asyncio.sleep(0.02)
    await more_cycles(s, 2)
    name = blind(s, policy)
    await c.replicate(pairs + free, n=3)
    assert all(copies(s, f.key) == 3 for f in pairs + free)
    return pairs, free, name


@run_audited(None)
async def test_without_audits_copies_made_unseen_stay(c, s, *workers):
    policy = policy_of(s)
    pairs, free, name = await replicate_unseen(c, s)
    unblind(s, policy, name)
    await more_cycles(s, 10)
    assert all(copies(s, f.key) == 3 for f in pairs + free)
    assert policy.auditor.sweeps == 0 and policy.auditor.last is None
    no_errors(s)


@run_audited(0.2)
async def test_an_audit_trims_copies_the_hooks_missed(c, s, *workers):
    policy = policy_of(s)
    pairs, free, name = await replicate_unseen(c, s)
    unblind(s, policy, name)
    for _ in range(200):
        if all(copies(s, f.key) == 2 for f in pairs) and all(copies(s, f.key) == 1 for f in free):
            break
        await asyncio.sleep(0.02)
    assert [copies(s, f.key) for f in pairs] == [2, 2]
    assert [copies(s, f.key) for f in free] == [1, 1]
    # The free keys were unknown to the engine; the governed ones were checked anyway.
    (found,) = [e for e in events(s, "audit") if e["replicated_unknown"]]
    assert found["replicated_unknown"] == 2
    assert found["governed_gone"] == 0
    no_errors(s)


@run_audited(0.2)
async def test_an_audit_forgets_governed_keys_that_left_unseen(c, s, *workers):
    policy = policy_of(s)
    pairs = list((await c.scatter({f"pair-{i}": i for i in range(3)})).values())
    for _ in range(100):
        if len(policy.index) == 3:
            break
        await asyncio.sleep(0.02)
    assert len(policy.index) == 3
    policy.auditor.chunk = 1  # a sweep of one key per cycle: three cycles for three keys
    name = blind(s, policy)
    del pairs[0]
    for _ in range(100):
        if "pair-0" not in s.tasks:
            break
        await asyncio.sleep(0.02)
    assert "pair-0" not in s.tasks
    unblind(s, policy, name)
    assert "pair-0" in policy.index  # the engine did not see it go
    for _ in range(100):
        if "pair-0" not in policy.index:
            break
        await asyncio.sleep(0.02)
    assert "pair-0" not in policy.index and len(policy.index) == 2
    # The sweep reports once it has looked at every key, one per cycle.
    for _ in range(100):
        if events(s, "audit"):
            break
        await asyncio.sleep(0.02)
    (found,) = events(s, "audit")
    assert found["governed_gone"] == 1
    status = await c.scheduler.amm_rules_status()
    assert status["audit"]["sweeps"] >= 1
    assert set(status["audit"]["last"]) == {"governed_gone", "replicated_unknown"}
    no_errors(s)


@run_audited(0.2)
async def test_an_audit_that_finds_nothing_is_silent(c, s, *workers):
    policy = policy_of(s)
    pairs = list((await c.scatter({f"pair-{i}": i for i in range(3)})).values())
    free = await c.scatter({"free-0": 0}, broadcast=True)  # copies the hooks see
    for _ in range(100):
        if policy.auditor.sweeps >= 2:
            break
        await asyncio.sleep(0.02)
    assert [copies(s, f.key) for f in pairs] == [2, 2, 2]
    assert copies(s, "free-0") == 1
    del free
    assert policy.auditor.last == {"governed_gone": 0, "replicated_unknown": 0}
    assert not events(s, "audit")
    no_errors(s)


@pytest.mark.parametrize("audit_interval", [None, 0.0])
@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(start=False))
async def test_a_governed_key_filed_as_ungoverned_keeps_its_copies(c, s, *workers, audit_interval):
    """A key whose entry into memory went unseen, but whose copies changed, is filed
    for reduce-replicas without being classified. Without audits it is trimmed to one
    copy although its rule wants three; an audit classifies it first."""
    held = await c.scatter({"pair-0": 0}, broadcast=True)  # noqa: F841 - keeps the key
    three = {**PAIR, "replicate": 3}
    policy = RulesPolicy(rules(three), audit_interval=audit_interval)
    amm = ActiveMemoryManagerExtension(s, {policy}, register=False, start=False)
    # What the hooks leave behind when the transition into memory was missed (and the
    # copies' change was absorbed already: the attach notes keys with several copies).
    policy.index.dirty.pop("pair-0", None)
    policy.index.touched.discard("pair-0")
    policy.index.replicated_free["pair-0"] = s.tasks["pair-0"]
    for _ in range(3):
        amm.run_once()
        await asyncio.sleep(0.1)
    if audit_interval is None:
        assert copies(s, "pair-0") == 1  # the harm the audit exists to prevent
        assert "pair-0" not in policy.index
    else:
        assert copies(s, "pair-0") == 3
        assert "pair-0" in policy.index
        assert events(s, "audit")[0]["replicated_unknown"] == 1
    no_errors(s)
