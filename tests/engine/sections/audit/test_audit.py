"""The audit: the safety net behind the engine's scheduler hooks.

Each test blinds the hooks (``index.activate(False)`` makes the replica wrappers pass
through; removing the plugin hides transitions), changes the cluster behind the
engine's back, and checks what an audit finds and repairs, and that without audits the
engine indeed did not notice (so the test can tell the audit's work from the hooks').
The last tests check the other side: an audit of what the hooks did see finds nothing,
even when it runs while the hooks' news waits for the rest of the cycle.
"""

from __future__ import annotations

from typing import Any

import pytest
from distributed.active_memory_manager import ActiveMemoryManagerExtension
from distributed.utils_test import gen_cluster

from amm_rules.engine.policy import RulesPolicy
from benchmarks.support.waiting import cycle_until, cycles, wait_cycles, wait_for
from tests.support.cluster import Requests, amm_config, copies, counts, events, keep, policy_of
from tests.support.rulesets import PAIR, rules

#: Run in the version matrix too (.ci/run): the floor and the newest dask/distributed.
pytestmark = pytest.mark.compat


def blind(s: Any, policy: Any) -> str:
    """Hide every change from the engine; return its plugin's name, for :func:`unblind`."""
    (name,) = [n for n, p in s.plugins.items() if p is policy.ctx.hooks]
    policy.index.activate(False)
    s.remove_plugin(name=name)
    return name


def unblind(s: Any, policy: Any, name: str) -> None:
    s.add_plugin(policy.ctx.hooks, name=name)
    policy.index.activate(True)
    policy.auditor.next_sweep = 0.0  # audits (if on) resume at once


def run_audited(audit_interval: float | None):
    return gen_cluster(
        client=True,
        nthreads=[("", 1)] * 3,
        # The replicate and scatter calls make extra copies here, as with stock Dask.
        config=amm_config(rules(PAIR, legacy_replicate="ignore"), audit_interval=audit_interval),
        timeout=90,
    )


async def replicate_unseen(c: Any, s: Any) -> tuple[list[Any], list[Any], str]:
    """Two governed keys held at 2 copies and two free keys at 1; then, unseen, every
    key copied to all three workers."""
    policy = policy_of(s)
    pairs = list((await c.scatter({f"pair-{i}": i for i in range(2)})).values())
    free = list((await c.scatter({f"free-{i}": i for i in range(2)})).values())
    await wait_for(lambda: counts(s, pairs) == [2, 2], "pairs at their target of 2")
    await wait_cycles(s, 2)
    # No audit while the copies are made unseen: each test looks at the first one after.
    policy.auditor.next_sweep = float("inf")
    name = blind(s, policy)
    await c.replicate(pairs + free, n=3)
    assert counts(s, pairs + free) == [3, 3, 3, 3]
    return pairs, free, name


@run_audited(None)
async def test_without_audits_copies_made_unseen_stay(c, s, *workers):
    policy = policy_of(s)
    pairs, free, name = await replicate_unseen(c, s)
    unblind(s, policy, name)
    requests = Requests(s)
    await wait_cycles(s, 10)
    # Ten cycles, and not one drop asked: the engine does not know of the copies.
    assert requests.remove == {}
    assert counts(s, pairs + free) == [3, 3, 3, 3]
    assert policy.auditor.sweeps == 0 and policy.auditor.last is None


@pytest.mark.engine_errors("audit")
@run_audited(0.2)
async def test_an_audit_trims_copies_the_hooks_missed(c, s, *workers):
    policy = policy_of(s)
    pairs, free, name = await replicate_unseen(c, s)
    unblind(s, policy, name)
    await wait_for(
        lambda: counts(s, pairs) == [2, 2] and counts(s, free) == [1, 1],
        "governed keys trimmed to 2 copies, free keys to 1",
        show=lambda: counts(s, pairs + free),
    )
    # The free keys were unknown to the engine; the governed ones were checked anyway.
    await wait_for(lambda: events(s, "audit"), "an audit event")
    (found,) = [e for e in events(s, "audit") if e["replicated_unknown"]]
    assert found["replicated_unknown"] == 2
    assert found["governed_gone"] == 0


@pytest.mark.engine_errors("audit")
@run_audited(0.2)
async def test_an_audit_forgets_governed_keys_that_left_unseen(c, s, *workers):
    policy = policy_of(s)
    pairs = list((await c.scatter({f"pair-{i}": i for i in range(3)})).values())
    await wait_for(lambda: len(policy.index) == 3, "three governed keys indexed")
    policy.auditor.chunk = 1  # a sweep of one key per cycle: three cycles for three keys
    name = blind(s, policy)
    del pairs[0]
    await wait_for(lambda: "pair-0" not in s.tasks, "pair-0 released")
    unblind(s, policy, name)
    assert "pair-0" in policy.index  # the engine did not see it go
    await wait_for(lambda: "pair-0" not in policy.index, "pair-0 forgotten by the audit")
    assert len(policy.index) == 2
    # The sweep reports once it has looked at every key, one per cycle.
    await wait_for(lambda: events(s, "audit"), "an audit event")
    (found,) = events(s, "audit")
    assert found == {"action": "audit", "governed_gone": 1, "replicated_unknown": 0}
    status = await c.scheduler.amm_rules_status()
    assert status["audit"]["sweeps"] >= 1
    # (The last sweep: the one that found the key, or a later one that found nothing.)
    assert status["audit"]["last"] in (
        {"governed_gone": 1, "replicated_unknown": 0},
        {"governed_gone": 0, "replicated_unknown": 0},
    )
    keep(pairs)


@run_audited(0.2)
async def test_an_audit_that_finds_nothing_is_silent(c, s, *workers):
    policy = policy_of(s)
    pairs = list((await c.scatter({f"pair-{i}": i for i in range(3)})).values())
    free = await c.scatter({"free-0": 0}, broadcast=True)  # copies the hooks see
    await wait_for(
        lambda: counts(s, pairs) == [2, 2, 2] and copies(s, "free-0") == 1,
        "pairs at 2 copies, the broadcast key trimmed to 1",
        show=lambda: (counts(s, pairs), copies(s, "free-0")),
    )
    sweeps = policy.auditor.sweeps
    await wait_for(lambda: policy.auditor.sweeps >= sweeps + 2, "two more audit sweeps")
    assert policy.auditor.last == {"governed_gone": 0, "replicated_unknown": 0}
    assert not events(s, "audit")
    keep(free)


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(start=False))
async def test_copies_reported_since_the_last_cycle_are_no_audit_finding(c, s, *workers):
    """Copies the hooks reported between two cycles are filed for reduce-replicas later
    in the cycle than the audit runs: an audit sweep starting in that cycle saw the key
    replicated and not yet filed, and counted it as missed (``replicated_unknown``)."""
    policy = RulesPolicy(rules(PAIR, legacy_replicate="ignore"), audit_interval=3600)
    amm = ActiveMemoryManagerExtension(s, {policy}, register=False, start=False)
    free = await c.scatter({"free-0": 0})
    amm.run_once()  # classified, with one copy: nothing to file for reduce-replicas
    await c.replicate(list(free.values()), n=3)  # seen by the hooks
    assert "free-0" in policy.index.touched
    policy.auditor.next_sweep = 0.0  # a sweep starts in the next cycle
    requests = Requests(s)
    amm.run_once()
    assert policy.auditor.last == {"governed_gone": 0, "replicated_unknown": 0}
    # The same cycle trimmed the key as any ungoverned key.
    assert sum(requests.remove.values()) == 2
    await cycle_until(amm, lambda: copies(s, "free-0") == 1, "free-0 trimmed to 1 copy")


@pytest.mark.engine_errors("audit")
@pytest.mark.parametrize("audit_interval", [None, 0.0])
@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(start=False))
async def test_a_governed_key_filed_as_ungoverned_keeps_its_copies(c, s, *workers, audit_interval):
    """A key whose entry into memory went unseen, but whose copies changed, is filed
    for reduce-replicas without being classified. Without audits it is trimmed to one
    copy although its rule wants three; an audit classifies it first."""
    held = await c.scatter({"pair-0": 0}, broadcast=True)
    three = {**PAIR, "replicate": 3}
    policy = RulesPolicy(rules(three), audit_interval=audit_interval)
    amm = ActiveMemoryManagerExtension(s, {policy}, register=False, start=False)
    # What the hooks leave behind when the transition into memory was missed (and the
    # copies' change was absorbed already: the attach notes keys with several copies).
    policy.index.unqueue("pair-0")
    policy.index.route_touched()
    assert "pair-0" in policy.index.replicated_free and not policy.index.touched
    requests = Requests(s)
    if audit_interval is None:
        # The harm the audit exists to prevent.
        await cycle_until(amm, lambda: copies(s, "pair-0") == 1, "pair-0 trimmed to 1 copy")
        assert "pair-0" not in policy.index
    else:
        await cycle_until(amm, lambda: "pair-0" in policy.index, "pair-0 classified")
        await cycles(amm, 3)
        assert requests.remove == {} and copies(s, "pair-0") == 3
        assert events(s, "audit")[0]["replicated_unknown"] == 1
    keep(held)
