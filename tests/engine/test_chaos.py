"""Chaos on real clusters: workers die, pause, retire and join while replication
targets hold and a computation runs; a recipient hangs.

What must hold (docs/reliability.md):

- no held key loses its data while fewer holders than its target die between two
  AMM cycles;
- targets are restored, to what the surviving workers allow, within a few cycles;
- results stay correct, and no held key is recomputed (each is computed by a task
  under its own key that counts its runs: see ``tests.support.chaos.produce``);
- a paused worker keeps its copies (they count) and receives none;
- a hung recipient is not asked again, nor replaced by another worker, every cycle;
  the engine recovers when it unblocks.

Workers are in-process (``gen_cluster``); "killed without warning" is
``tests.support.chaos.kill``: the worker's connections are cut, as a crashed process's are,
and it stops, with no retirement: the scheduler just loses the worker's copies.
The soak variants (``@pytest.mark.slow``, ``--run-slow``) and ``benchmarks/soak.py``
run many more rounds.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from distributed import Worker
from distributed.core import Status
from distributed.utils_test import BlockedGatherDep, async_poll_for, gen_cluster

from tests.support.chaos import (
    ChaosStats,
    busiest_holders,
    combine,
    copies,
    expected_combine,
    held_rules,
    kill,
    kill_round,
    lost,
    make_held,
    policy_of,
    recomputed,
    wait_for_targets,
)
from tests.support.cluster import INTERVAL, amm_config, events, holders, no_errors, rules

#: Copies each held key keeps.
N = 3
#: Held keys per test: enough that every worker holds many.
KEYS = [f"held-{i}" for i in range(24)]
#: Seconds a requested copy counts as in flight. A copy whose transfer hangs (its
#: source died mid-transfer: the fetch waits for the comm to time out) is given up
#: after this, and another worker is asked.
INFLIGHT_TIMEOUT = 1.0
#: "Within a few cycles" (a cycle is 50 ms here): the in-flight timeout, for a
#: transfer that hung on a dead source, plus a few cycles; generous, as transfers
#: are real.
MAX_CYCLES = 60
#: Cycles of one in-flight timeout. Each worker killed at once can hang one more
#: transfer (measured on two of three holders killed: 1 to 3 cycles, or about 21 with
#: one hung transfer; once, on a loaded machine, more than 60, with two).
HUNG_CYCLES = round(INFLIGHT_TIMEOUT / INTERVAL)


def _held_config() -> dict[str, Any]:
    return amm_config(held_rules(N), inflight_timeout=INFLIGHT_TIMEOUT)


def _check(stats: ChaosStats, keys: list[str]) -> None:
    assert stats.lost == [], f"held keys lost: {stats.lost}"
    assert stats.wrong_results == 0
    assert recomputed(keys) == []


async def _rounds(c: Any, s: Any, workers: list[Any], rounds: int, kills: int = 1) -> ChaosStats:
    held = await make_held(c, s, KEYS, N)
    stats = ChaosStats(keys=len(KEYS))
    max_cycles = MAX_CYCLES + (kills - 1) * HUNG_CYCLES
    for _ in range(rounds):
        await kill_round(c, s, workers, held, N, stats, kills=kills, max_cycles=max_cycles)
    _check(stats, KEYS)
    assert await c.gather(list(held.values())) == [k.encode().ljust(1_000, b".") for k in KEYS]
    return stats


@gen_cluster(client=True, nthreads=[("", 1)] * 7, config=_held_config(), timeout=60)
async def test_kill_busiest_holder_each_round(c, s, *workers):
    stats = await _rounds(c, s, list(workers), rounds=3)
    assert stats.kills == 3 and len(s.workers) == 4
    assert max(stats.cycles_to_restore) <= MAX_CYCLES
    no_errors(s)


def _rebalancing_config() -> dict[str, Any]:
    """Held keys plus a rebalance section that moves data on these small workers:
    any worker above the mean sends, a small budget keeps moves in flight across
    cycles, so that kills land mid-move."""
    held = held_rules(N)
    held["rebalance"] = {
        "measure": "managed",
        "sender-min": 0,
        "recipient-max": 1,
        "gap": 0,
        "max-bytes-per-cycle": 300_000,
    }
    return amm_config(held, inflight_timeout=INFLIGHT_TIMEOUT)


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 7,
    config=_rebalancing_config(),
    worker_kwargs={"memory_limit": "1 GiB"},
    timeout=60,
)
async def test_kill_busiest_holder_each_round_while_rebalancing(c, s, *workers):
    # Ballast on one worker keeps the rebalancer busy for the whole run.
    ballast = await c.scatter(
        {f"ballast-{i}": b"x" * 100_000 for i in range(40)}, workers=[workers[0].address]
    )
    stats = await _rounds(c, s, list(workers), rounds=3)
    assert stats.kills == 3
    totals = policy_of(s).rebalancer.status()["totals"]
    assert totals["moves"] > 0 and totals["done"] > 0, totals  # it really moved data
    del ballast
    no_errors(s)


@gen_cluster(client=True, nthreads=[("", 1)] * 8, config=_held_config(), timeout=60)
async def test_kill_two_of_three_holders_at_once(c, s, *workers):
    """Two of a key's three holders die between two cycles: one copy survives, and
    the target is rebuilt from it. (At least one worker more than the target stays:
    with none to spare, a copy whose transfer hung on a dead worker can only wait
    for the transfer layer to give up.)"""
    stats = await _rounds(c, s, list(workers), rounds=2, kills=2)
    assert stats.kills == 4 and len(s.workers) == 4
    no_errors(s)


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 5,
    # The memory monitor would resume the worker paused by hand.
    config={**_held_config(), "distributed.worker.memory.pause": False},
    timeout=60,
)
async def test_paused_worker_keeps_its_copies_and_receives_none(c, s, *workers):
    held = await make_held(c, s, KEYS, N)
    paused = next(w for w in workers if w.address == busiest_holders(s, KEYS)[0])
    before = {k for k in KEYS if paused.address in holders(s, k)}
    paused.status = Status.paused
    await async_poll_for(lambda: s.workers[paused.address].status == Status.paused, timeout=5)
    # Its copies still count: nothing is added elsewhere, nothing dropped.
    await asyncio.sleep(0.3)
    assert all(copies(s, k) == N for k in KEYS)
    # Kill another holder while it is paused: new copies avoid the paused worker.
    others = [w for w in workers if w is not paused]
    victim = next(w for w in others if w.address == busiest_holders(s, KEYS, 5)[1])
    stats = ChaosStats(keys=len(KEYS))
    await kill(victim)
    await async_poll_for(lambda: victim.address not in s.workers, timeout=5)
    stats.lost += lost(s, KEYS)
    await async_poll_for(lambda: all(copies(s, k) == N for k in KEYS), timeout=10)
    assert {k for k in KEYS if paused.address in holders(s, k)} <= before
    paused.status = Status.running
    await async_poll_for(lambda: s.workers[paused.address].status == Status.running, timeout=5)
    await asyncio.sleep(0.2)
    assert all(copies(s, k) == N for k in KEYS)
    _check(stats, KEYS)
    assert len(held) == len(KEYS)
    no_errors(s)


@gen_cluster(client=True, nthreads=[("", 1)] * 6, config=_held_config(), timeout=60)
async def test_retiring_the_busiest_holders_while_computing(c, s, *workers):
    held = await make_held(c, s, KEYS, N)
    futures = [c.submit(combine, held[k], held[KEYS[0]], key=f"combine-r-{k}") for k in KEYS]
    leaving = busiest_holders(s, KEYS, 2)
    await c.retire_workers(leaving)
    assert not set(leaving) & set(s.workers)
    assert lost(s, KEYS) == []
    await wait_for_targets(s, KEYS, N, MAX_CYCLES)
    assert await c.gather(futures) == [expected_combine(k, KEYS[0], 1_000) for k in KEYS]
    assert recomputed(KEYS) == []
    no_errors(s)


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=_held_config(), timeout=60)
async def test_workers_joining_mid_run_take_copies_up_to_the_target(c, s, a, b, w3):
    """Target 3 on 3 workers; one dies (held as far as possible: 2), a new worker
    joins mid-computation and the target is met again, on it."""
    held = await make_held(c, s, KEYS, N)
    futures = [c.submit(combine, held[k], held[k], key=f"combine-j-{k}") for k in KEYS]
    await kill(w3)
    await async_poll_for(lambda: all(copies(s, k) == 2 for k in KEYS), timeout=10)
    async with Worker(s.address, nthreads=1) as newcomer:
        await async_poll_for(lambda: newcomer.address in s.workers, timeout=5)
        cycles = await wait_for_targets(s, KEYS, N, MAX_CYCLES)
        assert all(newcomer.address in holders(s, k) for k in KEYS), (
            newcomer.address,
            list(s.workers),
            {k: holders(s, k) for k in KEYS[:3]},
        )
        assert cycles <= MAX_CYCLES
        await c.gather(futures)
        # A second newcomer adds nothing: the target is met.
        async with Worker(s.address, nthreads=1) as idle:
            await async_poll_for(lambda: idle.address in s.workers, timeout=5)
            await asyncio.sleep(0.3)
            assert not any(idle.address in holders(s, k) for k in KEYS)
            assert all(copies(s, k) == N for k in KEYS)
    assert lost(s, KEYS) == [] and recomputed(KEYS) == []
    no_errors(s)


# ---------------------------------------------------------------------------------
# A hung recipient

POOL_RULES = rules(
    {"name": "into-pool", "match": 'task.key matches "move-*"', "pool": "recv"},
    pools={"recv": "worker.resources.RECV >= 1"},
)
RECV = {"resources": {"RECV": 1}}


def _hung_config(inflight_timeout: float) -> dict[str, Any]:
    # Memory by managed bytes only: in-process workers share one process, so its
    # unmanaged memory would blur which worker is the least loaded.
    return {
        **amm_config(POOL_RULES, inflight_timeout=inflight_timeout),
        "distributed.scheduler.active-memory-manager.measure": "managed",
    }


def _count_requests(s: Any) -> Counter[tuple[str, str]]:
    """Count ``request_acquire_replicas`` per (worker, key), by wrapping the method on
    this scheduler instance (the AMM calls it for every accepted replicate)."""
    calls: Counter[tuple[str, str]] = Counter()
    original = s.request_acquire_replicas

    def counting(addr: str, keys: Any, *, stimulus_id: str) -> None:
        for key in keys:
            calls[addr, key] += 1
        original(addr, keys, stimulus_id=stimulus_id)

    s.request_acquire_replicas = counting
    return calls


@gen_cluster(
    client=True,
    nthreads=[("", 1), ("", 1, RECV)],
    config=_hung_config(inflight_timeout=30),
    timeout=60,
)
async def test_a_hung_recipient_is_not_asked_again_every_cycle(c, s, a, d):
    """The key moves into the pool {slow, d}; the least loaded pool worker, ``slow``,
    hangs on the transfer. Within the in-flight timeout the engine neither asks it
    again nor asks ``d``; the outside copy is never dropped before a copy landed;
    when the transfer unblocks, the move completes."""
    # d holds a big ungoverned key, so the hung worker is the least loaded recipient.
    ballast = await c.scatter({"ballast": b"x" * 10_000_000}, workers=[d.address])
    async with BlockedGatherDep(s.address, nthreads=1, resources={"RECV": 1}) as slow:
        await async_poll_for(lambda: len(s.workers) == 3, timeout=5)
        calls = _count_requests(s)
        policy = policy_of(s)
        x = c.submit(lambda: b"data", key="move-1", workers=[a.address])
        await x
        await slow.in_gather_dep.wait()
        start = policy.cycles
        await async_poll_for(lambda: policy.cycles - start >= 20, timeout=10)
        assert calls == {(slow.address, "move-1"): 1}, calls
        assert holders(s, "move-1") == {a.address}  # not dropped before a copy landed
        assert policy.index.inflight["move-1"].keys() == {slow.address}

        slow.block_gather_dep.set()
        await async_poll_for(lambda: holders(s, "move-1") == {slow.address}, timeout=10)
        await asyncio.sleep(0.3)
        assert holders(s, "move-1") == {slow.address}
        assert calls == {(slow.address, "move-1"): 1}, calls
        assert await x == b"data"
    assert list(ballast) == ["ballast"]
    no_errors(s)


@gen_cluster(
    client=True,
    nthreads=[("", 1), ("", 1, RECV)],
    config=_hung_config(inflight_timeout=0.5),
    timeout=60,
)
async def test_a_hung_recipient_times_out_once_then_another_worker_is_asked(c, s, a, d):
    """Past the in-flight timeout the engine backs off the hung worker and asks one
    other worker, once; when the hung transfer finally lands, the extra copy is
    trimmed and the key settles with one copy in the pool."""
    ballast = await c.scatter({"ballast": b"x" * 10_000_000}, workers=[d.address])
    async with BlockedGatherDep(s.address, nthreads=1, resources={"RECV": 1}) as slow:
        await async_poll_for(lambda: len(s.workers) == 3, timeout=5)
        calls = _count_requests(s)
        x = c.submit(lambda: b"data", key="move-1", workers=[a.address])
        await x
        await slow.in_gather_dep.wait()
        await async_poll_for(lambda: holders(s, "move-1") == {d.address}, timeout=10)
        policy = policy_of(s)
        start = policy.cycles
        await async_poll_for(lambda: policy.cycles - start >= 20, timeout=10)
        assert calls == {(slow.address, "move-1"): 1, (d.address, "move-1"): 1}, calls
        slow.block_gather_dep.set()
        await asyncio.sleep(0.5)
        assert len(holders(s, "move-1")) == 1
        assert holders(s, "move-1") <= {slow.address, d.address}
        assert sum(calls.values()) == 2, calls
        assert await x == b"data"
    assert list(ballast) == ["ballast"]
    no_errors(s)


# ---------------------------------------------------------------------------------
# Soak variants (--run-slow)


@pytest.mark.slow
@gen_cluster(client=True, nthreads=[("", 1)] * 14, config=_held_config(), timeout=600)
async def test_soak_many_rounds_of_kills(c, s, *workers):
    stats = await _rounds(c, s, list(workers), rounds=10)
    assert stats.kills == 10
    assert not [e for e in events(s) if e["action"] == "error"]
