"""Early AMM cycles on real clusters (:mod:`amm_rules.engine.early`).

The AMM's interval is set to a minute in these tests, longer than any of them runs: a
copy re-created after a worker dies, or a target met after a worker joins, can only come
from an early cycle. What must hold:

- a worker killed without warning (in-process, and a worker process killed with
  SIGKILL under a nanny) has its governed keys copied again by an early cycle;
- a worker joining lets an unmet target be met by an early cycle, and takes data from
  a full worker by one while the adaptive section balances;
- early cycles are debounced (a worker's removal asks for one cycle per lost copy, and
  gets one cycle) and rate-limited under churn (never two cycles closer than
  ``early_cycle_gap``), and a cycle that starts in between answers the request;
- there are none while the AMM does not run periodically, and none with
  ``early_cycle_gap: null``; bad parameters are refused with a clear message.
"""

from __future__ import annotations

import asyncio
import operator
import os
import signal
import sys
from typing import Any

import dask
import pytest
from distributed import Client, Event, Worker
from distributed.active_memory_manager import ActiveMemoryManagerExtension
from distributed.core import Status
from distributed.utils_test import BlockedGatherDep, gen_cluster, gen_test

from amm_rules.engine.policy import RulesPolicy
from benchmarks.support.chaos import busiest_holders, held_rules, kill
from benchmarks.support.retire import amm_measure
from benchmarks.support.waiting import cycle_until, wait_for
from tests.support.cluster import (
    LONG_INTERVAL,
    Requests,
    amm_config,
    copies,
    holders,
    keep,
    long_interval,
    no_errors,
    policy_of,
    process_cluster,
)

#: Run in the version matrix too (.ci/run): the floor and the newest dask/distributed.
pytestmark = pytest.mark.compat

KEYS = [f"held-{i}" for i in range(12)]
MiB = 2**20


async def held(c: Any, s: Any, n: int) -> dict[str, Any]:
    """Compute the held keys and run one cycle by hand (the periodic ones are a minute
    apart), then wait for every key to hold ``n`` copies."""
    futures = {k: c.submit(operator.mul, k.encode(), 100, key=k) for k in KEYS}
    await c.gather(list(futures.values()))
    s.extensions["amm"].run_once()
    await wait_for(lambda: all(copies(s, k) == n for k in KEYS), f"every held key at {n} copies")
    return futures


@gen_cluster(client=True, nthreads=[("", 1)] * 4, config=long_interval(held_rules(2)), timeout=60)
async def test_a_killed_worker_is_repaired_by_an_early_cycle(c, s, *workers):
    policy = policy_of(s)
    futures = await held(c, s, 2)
    cycles, early = policy.cycles, policy.early.counts["ran"]
    (victim,) = [w for w in workers if w.address in busiest_holders(s, KEYS, 1)]
    lost = [k for k in KEYS if victim.address in {ws.address for ws in s.tasks[k].who_has}]
    assert lost
    await kill(victim)  # no retirement, no warning
    # Copies again, with the next periodic cycle a minute away.
    await wait_for(lambda: all(copies(s, k) == 2 for k in KEYS), "every held key at 2 again")
    assert policy.early.counts["ran"] > early
    # Every cycle since the kill was an early one ...
    assert policy.cycles - cycles == policy.early.counts["ran"] - early
    # ... and the first was asked for by the lost copies and the worker's removal,
    # one cycle for the whole burst of requests.
    _, reasons = policy.early.history[-(policy.early.counts["ran"] - early)]
    assert set(reasons) == {"copy-lost", "worker-left"}
    assert policy.early.counts["requested"] - policy.early.counts["superseded"] >= 1
    assert policy.totals["held"]["requested"] >= len(lost)
    assert await c.gather(list(futures.values())) == [k.encode() * 100 for k in KEYS]
    no_errors(s)


def _fetch(x: bytes) -> int:
    return len(x)


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 3,
    config={
        **long_interval(held_rules(2), inflight_timeout=LONG_INTERVAL),
        # Recipients ranked by the bytes of keys they hold, not by process memory:
        # in-process workers share one process.
        **amm_measure(),
    },
    timeout=90,
)
async def test_a_worker_fetching_a_lost_key_for_a_dependent_is_not_asked_for_the_copy(
    c, s, a, b, d
):
    """Worker ``slow`` runs a task that needs ``held-0`` and is fetching it, and the
    fetch hangs (as one from a worker that died does, until the comm times out). A
    holder of ``held-0`` dies: asking ``slow`` for the copy would add nothing, and the
    copy would count as in flight, the key short, for the whole in-flight timeout (a
    minute here). The early cycle asks another worker, although ``slow`` is the least
    loaded."""
    policy = policy_of(s)
    key = "held-0"
    # d holds a big ungoverned key: the least loaded recipient is b, then slow.
    ballast = await c.scatter({"ballast": b"x" * 10_000_000}, workers=[d.address])
    x = c.submit(operator.mul, b"x", 100, key=key, workers=[a.address])
    await x
    s.extensions["amm"].run_once()
    await wait_for(lambda: copies(s, key) == 2, f"{key} at 2 copies")
    assert holders(s, key) == {a.address, b.address}
    async with BlockedGatherDep(s.address, nthreads=1) as slow:
        await wait_for(lambda: slow.address in s.workers, "slow registered")
        dependent = c.submit(_fetch, x, key="fetch-held-0", workers=[slow.address])
        await slow.in_gather_dep.wait()  # slow is fetching held-0 and hangs there
        cycles = policy.cycles
        await kill(a)
        await wait_for(lambda: copies(s, key) == 2, f"{key} copied again")
        assert holders(s, key) == {b.address, d.address}
        assert slow.address not in policy.ctx.ledger.in_flight(key)
        # One early cycle asked for the copy; at most one more saw it land.
        assert policy.cycles - cycles <= 2
        slow.block_gather_dep.set()
        assert await dependent == 100
    assert list(ballast) == ["ballast"]
    no_errors(s)


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 3,
    config={**amm_config(held_rules(2), start=False), **amm_measure()},
    timeout=150,
)
async def test_a_worker_fetching_a_lost_key_is_passed_over_while_its_fetch_lasts(c, s, a, b, d):
    """As above, and the worker first asked for the copy hangs too: its copy times out
    (half a second here), and the next worker asked must not be ``slow``, although it
    is then the least loaded: its fetch still hangs, as one from a dead worker does
    until the comm times out, which can take longer than the in-flight timeout."""
    key = "held-0"
    policy = RulesPolicy(held_rules(2), inflight_timeout=0.5)
    amm = ActiveMemoryManagerExtension(s, {policy}, register=False, start=False)
    # d holds a big ungoverned key: it is the last choice for a copy.
    ballast = await c.scatter({"ballast": b"x" * 10_000_000}, workers=[d.address])
    x = c.submit(operator.mul, b"x", 100, key=key, workers=[a.address])
    await x
    await cycle_until(amm, lambda: copies(s, key) == 2, f"{key} at 2 copies")
    assert holders(s, key) == {a.address, b.address}
    async with (
        BlockedGatherDep(s.address, nthreads=1) as slow,
        BlockedGatherDep(s.address, nthreads=1) as hung,
    ):
        await wait_for(lambda: len(s.workers) == 5, "slow and hung registered")
        dependent = c.submit(_fetch, x, key="fetch-held-0", workers=[slow.address])
        await slow.in_gather_dep.wait()  # slow is fetching held-0 and hangs there
        requests = Requests(s)
        await kill(a)
        await wait_for(lambda: a.address not in s.workers, "a gone")
        # The first copy goes to hung (slow is passed over), and hangs.
        await cycle_until(amm, lambda: requests.of(key)[0], f"a copy of {key} asked")
        assert requests.of(key) == ({hung.address: 1}, {})
        await hung.in_gather_dep.wait()
        # Once it timed out, d is asked, never slow.
        await cycle_until(
            amm,
            lambda: holders(s, key) == {b.address, d.address},
            f"{key} copied to d",
            show=lambda: (requests.of(key), policy.ctx.ledger.backoffs.get(key)),
        )
        assert requests.of(key) == ({hung.address: 1, d.address: 1}, {})
        slow.block_gather_dep.set()
        hung.block_gather_dep.set()
        assert await dependent == 100
        # slow's copy (fetched for its task) and hung's late copy are trimmed.
        await cycle_until(amm, lambda: copies(s, key) == 2, f"{key} back at 2 copies")
    keep(ballast)
    policy.detach()


def _wait_then_make(event_name: str) -> bytes:
    Event(event_name).wait()
    return b"made while retiring"


@gen_cluster(client=True, nthreads=[("", 1)] * 2, config=long_interval(held_rules(2)), timeout=120)
async def test_a_task_finishing_on_a_retiring_worker_does_not_hold_its_retirement(c, s, a, b):
    """A task that was running on a worker when its retirement started finishes there
    while the retirement waits for copies: its key must be placed before the worker
    may leave, and the retirement waits for a cycle that plans it. With the next
    periodic cycle a minute away, that cycle is an early one, woken by the key
    entering memory on the retiring worker."""
    policy = policy_of(s)
    futures = await held(c, s, 2)  # noqa: F841 - keeps the keys, on a and b
    async with BlockedGatherDep(s.address, nthreads=1) as slow:
        await wait_for(lambda: slow.address in s.workers, "slow registered")
        release = Event("release-late-task")
        late = c.submit(_wait_then_make, "release-late-task", key="late-1", workers=[a.address])
        await wait_for(lambda: a.state.executing_count == 1, "late-1 running on a")
        # The held keys must reach slow before a may leave: the retirement waits.
        retiring = asyncio.create_task(c.retire_workers([a.address]))
        await slow.in_gather_dep.wait()
        await release.set()  # late-1 enters memory on a, still retiring
        await wait_for(lambda: s.tasks["late-1"].state == "memory", "late-1 in memory on a")
        slow.block_gather_dep.set()
        # Without an early cycle, a would wait here for the next periodic one.
        await wait_for(lambda: a.address not in s.workers, "a retired")
        assert list(await retiring) == [a.address]
        assert any("key-on-retiring-worker" in r for _, r in policy.early.history)
        assert await late == b"made while retiring"  # kept on a worker that stays
        assert all(copies(s, k) == 2 for k in KEYS)
    no_errors(s)


@gen_cluster(
    client=True, nthreads=[("", 1)] * 3, config=long_interval(held_rules("all")), timeout=60
)
async def test_a_copy_dropped_under_replicate_all_is_repaired_by_an_early_cycle(c, s, *workers):
    """Under ``replicate: all`` every copy counts: one dropped by someone else (here the
    scheduler, as another policy would) wakes an early cycle that copies it back."""
    policy = policy_of(s)
    futures = await held(c, s, 3)  # noqa: F841 - keeps the keys
    early = policy.early.counts["ran"]
    key = KEYS[0]
    holder = sorted(ws.address for ws in s.tasks[key].who_has)[0]
    s.request_remove_replicas(holder, [key], stimulus_id="test-drop")
    assert copies(s, key) == 2
    await wait_for(lambda: copies(s, key) == 3, f"{key} copied back to 3")
    assert policy.early.counts["ran"] > early
    assert any("copy-lost" in reasons for _, reasons in policy.early.history)
    no_errors(s)


@gen_cluster(client=True, nthreads=[("", 1)] * 2, config=long_interval(held_rules(3)), timeout=60)
async def test_a_joining_worker_meets_an_unmet_target_at_once(c, s, *workers):
    policy = policy_of(s)
    # Three copies wanted, two workers.
    futures = await held(c, s, 2)  # noqa: F841 - keeps the keys
    s.extensions["amm"].run_once()  # a cycle that counts the unmet keys
    assert policy.last_cycle["held"]["unmet"] == len(KEYS)
    async with Worker(s.address, nthreads=1):
        await wait_for(lambda: all(copies(s, k) == 3 for k in KEYS), "every held key at 3")
    assert any("worker-joined" in reasons for _, reasons in policy.early.history)
    no_errors(s)


@gen_cluster(
    client=True,
    nthreads=[("", 1)],
    worker_kwargs={"memory_limit": 100 * MiB},
    config={
        **long_interval({"version": 1, "adaptive": {}}),
        # In-process workers: data goes to disk above 60% of the limit, nothing else.
        "distributed.worker.memory.spill": False,
        "distributed.worker.memory.pause": False,
    },
    timeout=60,
)
async def test_a_worker_joining_while_adaptive_scaling_balances_takes_data_at_once(c, s, a):
    """50 MiB on one worker of 100 MiB (its share under the default headroom: 40 MiB);
    adaptive scaling asks the target, and the worker it would add joins: an early cycle
    starts moving keys to it, a minute before the periodic one."""
    policy = policy_of(s)
    data = {f"x-{i}": b"x" * (5 * MiB) for i in range(10)}
    futures = await c.scatter(data, workers=[a.address])  # noqa: F841 - keeps the keys
    s.adaptive_target(target_duration="5s")
    async with Worker(s.address, nthreads=1, memory_limit=100 * MiB) as newcomer:
        await wait_for(lambda: len(newcomer.data) > 0, "keys copied to the newcomer")
    assert any("worker-joined" in reasons for _, reasons in policy.early.history)
    assert policy.balancing
    no_errors(s)


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=long_interval(held_rules(2)), timeout=90)
async def test_a_joining_worker_wakes_nothing_when_targets_are_met(c, s, *workers):
    policy = policy_of(s)
    futures = await held(c, s, 2)  # noqa: F841 - keeps the keys
    s.extensions["amm"].run_once()
    requested = policy.early.counts["requested"]
    async with Worker(s.address, nthreads=1) as newcomer:
        await wait_for(lambda: newcomer.address in s.workers, "the newcomer registered")
        await wait_for(
            lambda: s.workers[newcomer.address].status.name == "running", "the newcomer running"
        )
        assert not policy.early.pending
        assert policy.early.counts["requested"] == requested


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 4,
    config={
        **long_interval(held_rules(5), early_cycle_gap=0.3, early_cycle_delay=0.0),
        "distributed.worker.memory.pause": False,  # workers are paused by hand
    },
    timeout=60,
)
async def test_early_cycles_are_rate_limited_under_churn(c, s, *workers):
    """Workers pause and resume every few milliseconds while targets are unmet (five
    copies wanted, four workers): each resumed worker asks for an early cycle, and
    they run at most one per ``early_cycle_gap`` after any other cycle."""
    policy = policy_of(s)
    futures = await held(c, s, 4)  # noqa: F841 - keeps the keys
    s.extensions["amm"].run_once()  # a cycle that counts the unmet keys
    changes = 0
    for i in range(120):
        w = workers[i % len(workers)]
        w.status = Status.paused if w.status == Status.running else Status.running
        changes += 1
        await asyncio.sleep(0.01)  # window: the churn, a change every 10 ms
    for w in workers:
        w.status = Status.running
    await wait_for(lambda: not policy.early.pending, "no early cycle pending")
    starts = [t for t, _ in policy.early.history]
    assert len(starts) >= 2, policy.early.status()
    # Requests far outnumber cycles: a request while one is pending costs nothing.
    assert len(starts) < changes / 8
    assert all(b - a >= 0.3 for a, b in zip(starts, starts[1:], strict=False))
    assert all("worker-resumed" in reasons for _, reasons in policy.early.history)
    no_errors(s)


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 2,
    config=long_interval(held_rules(2), early_cycle_delay=30.0),
    timeout=60,
)
async def test_a_cycle_in_between_answers_the_request(c, s, *workers):
    policy = policy_of(s)
    futures = await held(c, s, 2)  # noqa: F841 - keeps the keys
    await wait_for(lambda: not policy.early.pending, "no early cycle pending")
    before = dict(policy.early.counts)
    policy.early.request("test")
    assert policy.early.pending
    s.extensions["amm"].run_once()  # before the early cycle's time: it answers it
    assert not policy.early.pending
    assert policy.early.counts["superseded"] == before.get("superseded", 0) + 1
    assert policy.early.counts["ran"] == before.get("ran", 0)


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(start=False), timeout=90)
async def test_no_early_cycle_when_the_amm_does_not_run_periodically(c, s, a, b, d):
    """An ad-hoc manager (``start=False``) runs when asked: early cycles stay out."""
    policy = RulesPolicy(held_rules(2), early_cycle_delay=0.0)
    amm = ActiveMemoryManagerExtension(s, {policy}, register=False, start=False)
    futures = {k: c.submit(operator.mul, k.encode(), 100, key=k) for k in KEYS}
    await c.gather(list(futures.values()))
    amm.run_once()
    await wait_for(lambda: all(copies(s, k) == 2 for k in KEYS), "every held key at 2")
    cycles = policy.cycles
    await kill(b)
    await wait_for(lambda: b.address not in s.workers, "the killed worker gone")
    # The request was made, and dropped when its time came.
    await wait_for(lambda: not policy.early.pending, "the early request dropped")
    assert policy.early.counts["requested"] >= 1
    assert policy.early.counts["ran"] == 0 and policy.cycles == cycles


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 3,
    config=long_interval(held_rules(2), early_cycle_gap=None),
    timeout=60,
)
async def test_no_early_cycle_when_turned_off(c, s, a, b, d):
    policy = policy_of(s)
    futures = await held(c, s, 2)  # noqa: F841 - keeps the keys
    await kill(b)
    await wait_for(lambda: b.address not in s.workers, "the killed worker gone")
    assert not policy.early.pending
    assert policy.early.status()["enabled"] is False
    assert policy.early.counts["requested"] == 0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"early_cycle_gap": 0}, "early_cycle_gap: expected a number of seconds (more than 0), got 0"),
        ({"early_cycle_gap": "1s"}, "early_cycle_gap: expected a number of seconds"),
        ({"early_cycle_delay": -1}, "early_cycle_delay: expected a number of seconds (at least 0)"),
        ({"early_cycle_delay": float("nan")}, "early_cycle_delay: expected a number"),
        ({"early_cycle_gap": True}, "early_cycle_gap: expected a number"),
    ],
)  # fmt: skip
def test_bad_early_cycle_parameters_are_refused(kwargs, message):
    with pytest.raises(ValueError) as info:
        RulesPolicy(held_rules(2), **kwargs)
    assert message in str(info.value)


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
@gen_test(timeout=180)
async def test_sigkill_of_a_worker_process_is_repaired_by_an_early_cycle() -> None:
    """A worker process killed by the operating system, under a nanny: its copies are
    requested again before any periodic cycle (a minute away)."""
    with dask.config.set(long_interval(held_rules(2))):
        async with (
            process_cluster(3) as cluster,
            Client(cluster, asynchronous=True) as c,
        ):
            s = cluster.scheduler
            policy = policy_of(s)
            futures = await held(c, s, 2)  # noqa: F841 - keeps the keys
            early = policy.early.counts["ran"]
            (victim,) = busiest_holders(s, KEYS, 1)
            pids = await c.run(os.getpid, workers=[victim])
            os.kill(pids[victim], signal.SIGKILL)
            await wait_for(lambda: victim not in s.workers, "the killed process gone", 60)
            await wait_for(
                lambda: all(
                    copies(s, k) == 2 and victim not in {ws.address for ws in s.tasks[k].who_has}
                    for k in KEYS
                ),
                "every held key at 2 copies, none on the killed worker",
                60,
            )
            assert policy.early.counts["ran"] > early
            assert any("worker-left" in reasons for _, reasons in policy.early.history)
            no_errors(s)
