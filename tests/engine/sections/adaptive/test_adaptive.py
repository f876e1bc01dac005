"""The adaptive section on real schedulers and workers (docs/adaptive.md): the target
with and without memory (bytes held, bytes expected from tasks still to run, disk
traffic), a worker kept by a rule's minimum with its reason in status and in an event
while ``LocalCluster.adapt`` scales down, and the order in which workers leave.
Mechanisms only: no timing is asserted."""

from __future__ import annotations

import math
from typing import Any

import dask
import numpy as np
import pytest
from distributed import Client, Event, LocalCluster, Scheduler, wait
from distributed.utils_test import gen_cluster, gen_test

from amm_rules.engine.sections.adaptive import AdaptiveSection
from amm_rules.engine.sections.rebalance import ADAPTING_SECONDS, RebalanceSection
from amm_rules.observe.text import render_status
from benchmarks.support.waiting import wait_cycles, wait_for
from tests.observe.test_metrics import scrape, value
from tests.support.cluster import (
    CopiesFloor,
    Requests,
    amm_config,
    events,
    holders,
    no_errors,
    policy_of,
    rules,
)
from tests.support.pressure import slow

MiB = 2**20
#: In-process workers share the test process's memory: spilling and pausing by process
#: memory are off; a worker's data still goes to disk above 60% of its limit.
MEMORY = {
    "distributed.worker.memory.target": 0.6,
    "distributed.worker.memory.spill": False,
    "distributed.worker.memory.pause": False,
    "distributed.worker.memory.terminate": False,
}
LIMIT = {"memory_limit": 100 * MiB}


def adaptive_rules(**section: Any) -> dict[str, Any]:
    return {**rules(), "adaptive": section}


def section_of(s: Any) -> AdaptiveSection:
    return policy_of(s).section(AdaptiveSection)


def make(i: int, nbytes: int, gate: Any = None) -> np.ndarray:
    return np.full(nbytes // 8, i, dtype="float64")


def wait_on(event: Event) -> None:
    event.wait()


# -- up ----------------------------------------------------------------------------------


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 2,
    worker_kwargs=LIMIT,
    config={**amm_config(adaptive_rules(headroom="90%")), **MEMORY},
)
async def test_the_target_holds_the_data_and_what_queued_tasks_will_produce(c, s, a, b):
    """10 MiB each under a 90% headroom of 100 MiB limits: 25 MiB held asks for 3 workers;
    20 tasks still to run of a kind that added 1 MiB each ask for 2 more."""
    section = section_of(s)
    held = await c.scatter({"held": b"x" * (25 * MiB)}, workers=[a.address])
    assert Scheduler.adaptive_target(s) <= 2  # distributed's own
    assert s.adaptive_target() == 3
    target = section.status()["target"]
    assert target["memory"] == 3 and target["running"] == 2 and target["expected"] == 0
    assert target["per_worker"] == int(100 * MiB * 0.1)

    first = c.map(make, range(2), nbytes=MiB, pure=False)
    await c.gather(first)  # the kind's bytes per task are measured
    event = Event()
    gate = c.submit(wait_on, event, pure=False)
    rest = [c.submit(make, i, MiB, gate, pure=False) for i in range(20)]
    await wait_for(lambda: s.task_prefixes["make"].states["waiting"] == 20, "20 tasks waiting")
    workers = s.adaptive_target()
    target = section.status()["target"]
    assert 20 * MiB <= target["expected"] <= 21 * MiB
    assert workers == target["memory"] == math.ceil(target["needed"] / (10 * MiB)) == 5
    assert "expected from the tasks to run: make" in target["text"]
    await event.set()
    await c.gather(rest)
    del held, first, rest
    no_errors(s)


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 2,
    worker_kwargs=LIMIT,
    config={**amm_config(adaptive_rules(headroom="90%", memory=False)), **MEMORY},
)
async def test_without_memory_the_target_is_distributeds(c, s, a, b):
    held = await c.scatter({"held": b"x" * (25 * MiB)}, workers=[a.address])
    assert s.adaptive_target() == Scheduler.adaptive_target(s) <= 2
    assert "target" not in section_of(s).status()
    del held


@gen_cluster(
    client=True,
    nthreads=[("", 1)],
    worker_kwargs=LIMIT,
    config={**amm_config(adaptive_rules(headroom="0%", **{"disk-rate": "1 B/s"})), **MEMORY},
)
async def test_the_target_rises_while_workers_write_to_disk(c, s, a):
    """80 MiB computed on one worker of 100 MiB (60 MiB in memory): the rest goes to disk;
    the data alone asks for one worker, the disk traffic for one more."""
    section = section_of(s)
    assert s.adaptive_target() == 0  # nothing held; the disk meter's first sample
    futures = c.map(make, range(8), nbytes=10 * MiB, pure=False)
    await wait(futures)
    assert a.data.slow
    # (The scheduler learns what was written with the worker's next heartbeat, and the
    # target samples it at most every half second.)
    await wait_for(
        lambda: s.adaptive_target() == 2 and section.status()["target"]["rising"] == ["disk"],
        "the target rising by one while the worker writes to disk",
        show=lambda: section.status().get("target"),
    )
    assert "write to disk or read back" in section.status()["target"]["text"]
    del futures


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 2,
    worker_kwargs=LIMIT,
    config={
        **amm_config(adaptive_rules(headroom="90%")),
        **MEMORY,
        "distributed.scheduler.worker-saturation": 1.0,
    },
)
async def test_the_target_rises_while_producers_are_held_back(c, s, a, b):
    """15 MiB held by two workers of 10 MiB each under the headroom: both needed, and a
    third asked while producers are held back."""
    held = await c.scatter({"held": b"x" * (15 * MiB)}, workers=[a.address])
    event = Event()
    futures = [c.submit(wait_on, event, key=f"root-{i}") for i in range(20)]
    await wait_for(lambda: s.queued, "root tasks queued")
    assert s.adaptive_target() == Scheduler.adaptive_target(s)
    s.WORKER_SATURATION = 0.5  # what the memory-pressure section does while it holds
    try:
        assert s.adaptive_target() == 3
        assert section_of(s).status()["target"]["rising"] == ["held-back"]
    finally:
        s.WORKER_SATURATION = 1.0
        await event.set()
    await c.gather(futures)
    del held


# -- balance -----------------------------------------------------------------------------


def balance_of(s: Any) -> RebalanceSection:
    return policy_of(s).section(RebalanceSection)


async def fill_one(c: Client, s: Any, worker: Any) -> dict[str, Any]:
    """50 MiB on ``worker``, in ten keys: above its 40 MiB share under the default
    headroom of 60% (100 MiB limits), below dask's spill threshold of 60 MiB."""
    data = {f"x-{i}": np.full(5 * MiB // 8, i, dtype="float64") for i in range(10)}
    return await c.scatter(data, workers=[worker.address])


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 2,
    worker_kwargs=LIMIT,
    config={**amm_config(adaptive_rules()), **MEMORY},
    scheduler_kwargs={"dashboard": True, "dashboard_address": "127.0.0.1:0"},
    timeout=120,
)
async def test_while_adaptive_scaling_asks_a_full_worker_gives_keys_to_an_empty_one(c, s, a, b):
    futures = await fill_one(c, s, a)
    balance = balance_of(s)
    await wait_cycles(s, 3)
    # Nothing moves while adaptive scaling does not ask (a read without a target duration,
    # as a /metrics scrape makes, is not adaptive scaling).
    s.adaptive_target()
    await wait_cycles(s, 3)
    assert not b.data and not balance.balancing

    s.adaptive_target(target_duration="5s")  # what Adaptive asks every second
    await wait_for(
        lambda: (
            s.workers[a.address].nbytes <= 40 * MiB
            and all(len(holders(s, k)) == 1 for k in futures)
        ),
        "the full worker down to its share, every key with one copy",
        show=lambda: {w: ws.nbytes / MiB for w, ws in s.workers.items()},
    )
    assert b.data and s.workers[b.address].nbytes <= 40 * MiB
    report = await c.scheduler.amm_rules_status()
    rebalance = report["rebalance"]
    assert rebalance["balancing"] and rebalance["measure"] == "managed"
    assert rebalance["sender_min"] == rebalance["recipient_max"] == pytest.approx(0.4)
    assert rebalance["totals"]["moves"] >= 1
    assert "rebalance    on for adaptive's balance (managed" in render_status(report)
    assert events(s, "balance") == [{"action": "balance", "balancing": True, "room": 0.4}]
    here = {"scheduler": s.address}
    assert value(await scrape(s), "dask_amm_rules_rebalance_balancing", **here) == 1
    values = await c.gather(list(futures.values()))
    assert [int(v[0]) for v in values] == list(range(10))

    # The rules installed again (a reload): still balancing, and not said again.
    policy = policy_of(s)
    policy._install(policy.ruleset)
    assert balance.balancing and balance.rebalancer.settings.measure == "managed"
    assert len(events(s, "balance")) == 1

    # Adaptive scaling stopped asking (as long ago as the balance waits): the file's
    # settings again, and it says so.
    ctx = policy_of(s).ctx
    ctx.adapting_at = ctx.clock() - ADAPTING_SECONDS - 1
    await wait_for(lambda: not balance.balancing, "the balance off")
    assert events(s, "balance")[-1] == {"action": "balance", "balancing": False, "room": 0.4}
    assert not balance.rebalancer.settings.enabled
    assert value(await scrape(s), "dask_amm_rules_rebalance_balancing", **here) == 0
    no_errors(s)


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 2,
    worker_kwargs=LIMIT,
    config={**amm_config(adaptive_rules(balance=False)), **MEMORY},
)
async def test_without_balance_the_full_worker_keeps_its_keys(c, s, a, b):
    futures = await fill_one(c, s, a)
    s.adaptive_target(target_duration="5s")
    await wait_cycles(s, 5)
    assert not b.data and not balance_of(s).balancing and not events(s, "balance")
    assert all(holders(s, k) == {a.address} for k in futures)
    text = render_status(await c.scheduler.amm_rules_status())
    assert "adaptive     on (headroom 60%, hold-rules, balance off)" in text
    assert "rebalance    off" in text


@gen_test(timeout=90)
async def test_the_worker_adapt_adds_for_memory_takes_data_from_the_full_one():
    """The whole loop: one worker above its share asks for a second, LocalCluster.adapt
    starts it, and keys move to it until neither holds more than its share."""
    with dask.config.set({**amm_config(adaptive_rules()), **MEMORY}):
        async with (
            LocalCluster(
                n_workers=1,
                threads_per_worker=1,
                processes=False,
                asynchronous=True,
                dashboard_address=":0",
                memory_limit=LIMIT["memory_limit"],
            ) as lc,
            Client(lc, asynchronous=True) as c,
        ):
            s = lc.scheduler
            (first,) = lc.workers.values()
            futures = await fill_one(c, s, first)
            lc.adapt(minimum=1, maximum=2, interval="100ms")
            await wait_for(
                lambda: (
                    len(s.workers) == 2
                    and all(ws.nbytes <= 40 * MiB for ws in s.workers.values())
                    and all(len(holders(s, k)) == 1 for k in futures)
                ),
                "a second worker, and each worker at most its share",
                timeout=60,
                show=lambda: {w: ws.nbytes / MiB for w, ws in s.workers.items()},
            )
            assert not first.data.slow  # nothing written to disk on the way
            assert events(s, "balance")[0]["balancing"]
            values = await c.gather(list(futures.values()))
            assert [int(v[0]) for v in values] == list(range(10))
            no_errors(s)


# -- down --------------------------------------------------------------------------------

PRECIOUS = rules({"name": "precious", "match": 'task.key matches "precious-*"', "replicate": 2})


def scale_down_config(section: dict[str, Any] | None) -> dict[str, Any]:
    rules_ = dict(PRECIOUS) if section is None else {**PRECIOUS, "adaptive": section}
    return {**amm_config(rules_), **MEMORY}


async def precious_at_two(c: Client, s: Any) -> dict[str, Any]:
    futures = await c.scatter({f"precious-{i}": i for i in range(12)})
    await wait_for(lambda: all(len(holders(s, k)) == 2 for k in futures), "12 keys at two copies")
    return futures


def cluster(n: int) -> LocalCluster:
    return LocalCluster(
        n_workers=n,
        threads_per_worker=1,
        processes=False,
        asynchronous=True,
        dashboard_address=":0",
    )


@gen_test(timeout=90)
async def test_adapt_keeps_the_workers_a_rules_minimum_needs_and_says_why():
    with dask.config.set(scale_down_config({})):
        async with cluster(4) as lc, Client(lc, asynchronous=True) as c:
            s = lc.scheduler
            futures = await precious_at_two(c, s)
            floor = CopiesFloor(s, futures)
            adaptive = lc.adapt(minimum=1, maximum=4, interval="100ms", wait_count=1)
            await wait_for(lambda: len(s.workers) == 2, "scaled down to two", timeout=40)
            await wait_cycles(s, 10)
            adaptive.stop()
            assert len(s.workers) == 2
            assert floor.stop() == 2  # no key fell below its minimum on the way
            kept = [e for e in events(s, "retirement") if e["step"] == "kept"]
            assert kept, events(s, "retirement")
            assert {e["worker"] for e in kept} <= set(s.workers)
            for e in kept:
                assert e["why"] == (
                    f"kept {e['worker']}: 12 keys of rule precious would fall below min 2"
                )
            # distributed alone would close one of the two: that one was kept.
            report = await c.scheduler.amm_rules_status()
            status = report["adaptive"]
            assert len(status["kept"]) == 1 and set(status["kept"]) <= set(s.workers)
            text = render_status(report)
            assert "adaptive     on (headroom 60%, hold-rules, balance)" in text
            assert next(iter(status["kept"].values()))["why"] in text
            assert all(
                k["why"].endswith("12 keys of rule precious would fall below min 2")
                for k in status["kept"].values()
            )
            assert section_of(s).counters["downscaling_kept"] == len(kept)
            assert await c.gather(list(futures.values())) == list(range(12))
            no_errors(s)


@gen_test(timeout=90)
async def test_without_the_section_adapt_closes_what_the_rule_needs():
    """The issue this section answers: distributed's choice alone leaves one worker, and
    the rule's keys one copy each."""
    with dask.config.set(scale_down_config(None)):
        async with cluster(4) as lc, Client(lc, asynchronous=True) as c:
            s = lc.scheduler
            futures = await precious_at_two(c, s)
            adaptive = lc.adapt(minimum=1, maximum=4, interval="100ms", wait_count=1)
            await wait_for(lambda: len(s.workers) == 1, "scaled down to one", timeout=40)
            adaptive.stop()
            assert all(len(holders(s, k)) == 1 for k in futures)


@pytest.mark.parametrize("with_section", [True, False])
def test_the_order_of_leaving(with_section: bool) -> None:
    """Three workers: z holds nothing, y a 5 MB blob that was scattered (no recompute
    estimate), x ten small keys of 0.2 s of compute each, of which it holds the only
    copies. distributed closes the fewest bytes first (z, x); the section the cheapest
    to move (z, y): x's recompute at risk weighs more than y's bytes."""
    section: dict[str, Any] | None = {} if with_section else None

    @gen_cluster(client=True, nthreads=[("", 1)] * 3, config=scale_down_config(section))
    async def run(c: Client, s: Any, x: Any, y: Any, z: Any) -> None:
        dear = c.map(slow, range(10), workers=[x.address], pure=False)
        await c.gather(dear)
        blob = await c.scatter({"blob": b"." * 5_000_000}, workers=[y.address])
        costs = policy_of(s).ctx.costs
        await wait_for(lambda: costs.at_risk.get(x.address, 0) > 1, "x's work at risk")
        expected = {z.address, y.address} if with_section else {z.address, x.address}
        assert set(s.workers_to_close(n=2)) == expected
        retired = await s.retire_workers(n=2)
        assert set(retired) == expected
        assert await c.gather(dear) == list(range(10))
        del blob

    run()


def double(x: Any) -> Any:
    return 2 * x


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 3,
    config=amm_config(
        rules({"name": "frozen", "match": 'task.key matches "frozen-*"', "move": "never"})
    ),
    timeout=60,
)
async def test_the_guard_follows_the_copies_of_keys_that_may_not_move(c, s, a, b, d):
    """A key that may not move keeps its only holder; once a dependent fetched a copy
    to another worker, the first may go (what the guard read of its holders is read
    again after a copy changed)."""
    frozen = await c.scatter({"frozen-1": 1}, workers=[a.address])
    await wait_for(lambda: "frozen-1" in policy_of(s).index.desired, "frozen-1 governed")
    assert a.address not in s.workers_to_close(n=3)
    assert section_of(s).kept[a.address][0][0].kind == "never"
    await c.submit(double, frozen["frozen-1"], workers=[b.address])
    await wait_for(lambda: len(holders(s, "frozen-1")) == 2, "a second copy, on b")
    chosen = s.workers_to_close(n=3)
    assert a.address in chosen and b.address not in chosen


@pytest.mark.parametrize("with_section", [True, False])
def test_the_retirement_of_a_worker_it_chose_moves_its_keys_in_order_of_value(
    with_section: bool,
) -> None:
    """Worker c holds plain keys (scattered first: the first of its keys) and dear ones
    (0.2 s of compute each, no copy elsewhere); a is busy, so scale-down chooses c. With
    the section its retirement asks for the dear keys' copies first, as a drain orders
    them; without, in the order c got its keys."""
    section: dict[str, Any] | None = {} if with_section else None

    @gen_cluster(client=True, nthreads=[("", 1)] * 2, config=scale_down_config(section))
    async def run(c: Client, s: Any, a: Any, d: Any) -> None:
        plain = await c.scatter({f"plain-{i}": i for i in range(4)}, workers=[d.address])
        dear = c.map(slow, range(4), workers=[d.address], pure=False)
        await c.gather(dear)
        group = s.tasks[dear[0].key].group
        costs = policy_of(s).ctx.costs
        await wait_for(lambda: (costs.estimate(group) or 0) > 0, "the dear keys' estimate")
        event = Event()
        busy = c.submit(wait_on, event, workers=[a.address], pure=False)
        await wait_for(lambda: s.workers[a.address].processing, "a busy")
        assert s.workers_to_close(n=1) == [d.address]
        requests = Requests(s)
        await s.retire_workers(workers=[d.address])
        asked = [str(k) for _, op, _, k in requests.log if op == "acquire"]
        requests.stop()
        await event.set()
        await busy
        dear_keys = {f.key for f in dear}
        order = ["dear" if k in dear_keys else "plain" for k in asked]
        assert sorted(order) == ["dear"] * 4 + ["plain"] * 4
        expected = ["dear"] * 4 + ["plain"] * 4 if with_section else ["plain"] * 4 + ["dear"] * 4
        assert order == expected
        assert await c.gather(dear) == list(range(4)) and len(plain) == 4

    run()
