"""Hostile input against the scheduler's event loop: requests, scrapes and annotations
that a client or a dashboard visitor can send, each of which once blocked the loop for
seconds (docs/reliability.md, promise 14). Each test sends it to a real scheduler under
the loop-lag probe (:mod:`tests.support.looplag`) and asserts through it, with bounds of
seconds: fixed, these take milliseconds (``python -m benchmarks.hostile`` measures them).
"""

from __future__ import annotations

from distributed.utils_test import gen_cluster

from amm_rules.engine.journal import DECISIONS_KEPT, Journal
from tests.support.cluster import amm_config, policy_of
from tests.support.hang import hang_bound
from tests.support.looplag import LoopLag, assert_no_stall
from tests.support.rulesets import INC_TWO

# ---------------------------------------------------------------------------------
# 1. The decision journal, indexed by key


def full_journal() -> Journal:
    journal = Journal()
    for i in range(DECISIONS_KEPT + 500):  # 500 of them already left the ring
        journal.decision(f"k-{i % 2_000}", "replicate", f"tcp://w{i % 7}", "accepted", "r", "r")
    return journal


def test_the_journal_answers_a_key_without_a_scan_of_the_ring() -> None:
    """100,000 keys looked up in a full journal: a scan of the ring per key took 40 s."""
    journal = full_journal()
    with hang_bound(3.0):
        answers = [journal.for_key(f"unknown-{i}") for i in range(100_000)]
    assert answers == [[]] * 100_000


def test_the_index_by_key_follows_the_ring() -> None:
    """What the index answers is what a scan of the ring finds, after decisions left it."""
    journal = full_journal()
    ring = list(journal.decisions)
    assert len(ring) == DECISIONS_KEPT
    for key in ("k-0", "k-499", "k-500", "k-1999"):
        mine = [d for d in ring if d.key == key]
        assert journal.for_key(key, limit=3) == mine[-3:]
        assert journal.for_key(key, limit=100) == mine
    assert journal.for_key(["unhashable"]) == []
    assert journal.for_key("k-1", limit=0) == []


@gen_cluster(client=True, nthreads=[("", 1)], config=amm_config(INC_TWO), timeout=60)
async def test_explaining_many_keys_with_a_full_journal_does_not_stall_the_loop(c, s, a):
    policy = policy_of(s)
    for i in range(DECISIONS_KEPT):
        policy.journal.decision(f"k-{i}", "replicate", a.address, "accepted", "r", "r")
    keys = [f"unknown-{i}" for i in range(20_000)]
    async with LoopLag() as lag:
        answer = await c.scheduler.amm_rules_explain(keys=keys)
    assert_no_stall(lag, "explain of 20,000 unknown keys with a full journal")
    assert len(answer) == len(keys)
