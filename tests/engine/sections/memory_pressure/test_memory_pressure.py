"""The ``memory-pressure`` section on a real scheduler (:mod:`amm_rules.engine.sections.memory_pressure`):
root tasks of producers made queueable when a graph arrives; holding (the scheduler's
worker-saturation lowered, its idle set recomputed) while a worker is above the
threshold and a producer heads the queue; release with hysteresis, after max-hold, when
the section goes; every worker keeps a task; events, status and metrics."""

from __future__ import annotations

import asyncio
import math

import pytest
from distributed.utils_test import gen_cluster

from benchmarks.support.waiting import wait_for
from tests.support.cluster import events, no_errors, policy_of
from tests.support.pressure import (
    WORKERS,
    arrived,
    config,
    consistent,
    pressure_on,
    section,
    slow,
)

#: Run in the version matrix too (.ci/run): the floor and the newest dask/distributed.
pytestmark = pytest.mark.compat


@gen_cluster(client=True, config=config(section()), **WORKERS)
async def test_small_root_groups_of_producers_are_made_queueable(c, s, a, b):
    # Four tasks on four threads: not root-ish for the scheduler, so never queued.
    futures = c.map(slow, range(4), key=[f"small-{i}" for i in range(4)])
    await arrived(s, futures)
    assert all(s.tasks[f.key].run_spec.data_producer for f in futures)
    assert all(s.is_rootish(s.tasks[f.key]) for f in futures)
    await c.gather(futures)
    # Tasks with dependencies are never flagged.
    total = c.submit(sum, futures, key="total-1")
    await arrived(s, [total])
    assert not s.tasks["total-1"].run_spec.data_producer
    await total
    assert policy_of(s).pressure.metrics()["queued_roots"] == 4


@gen_cluster(
    client=True,
    config=config(section(producers='task.prefix == "other"')),
    **WORKERS,
)
async def test_only_producers_are_made_queueable(c, s, a, b):
    futures = c.map(slow, range(4), key=[f"small-{i}" for i in range(4)])
    await arrived(s, futures)
    assert not any(s.tasks[f.key].run_spec.data_producer for f in futures)
    await c.gather(futures)


@gen_cluster(client=True, config=config(), **WORKERS)
async def test_nothing_is_flagged_or_held_without_the_section(c, s, a, b):
    futures = c.map(slow, range(4), key=[f"small-{i}" for i in range(4)])
    await arrived(s, futures)
    assert not any(s.tasks[f.key].run_spec.data_producer for f in futures)
    await c.gather(futures)
    assert policy_of(s).pressure.status() is None
    assert s.handlers["amm_rules_status"]()["memory_pressure"] is None


@gen_cluster(client=True, config=config(section()), **WORKERS, timeout=120)
async def test_holds_while_a_worker_is_under_pressure_and_releases_below_release(c, s, a, b):
    policy = policy_of(s)
    base = s.WORKER_SATURATION
    held = await pressure_on(c, s, a)
    work = c.map(slow, range(40), key=[f"work-{i}" for i in range(40)])
    await wait_for(
        lambda: policy.pressure.state == "holding", "policy.pressure.state == 'holding'"
    )
    assert s.WORKER_SATURATION == 0.5 < base
    consistent(s)
    # (held when the graph arrived; the next check says what heads the queue)
    await wait_for(
        lambda: any("the queue's head is work" in r for r in policy.pressure.reasons),
        "any('the queue's head is work' in r for r in policy.pressure.reasons)",
    )
    status = s.handlers["amm_rules_status"]()["memory_pressure"]
    assert status["state"] == "holding" and status["saturation"] == 0.5
    assert list(status["workers"]) == [a.address]
    assert status["queue_head"] == {"prefix": "work", "producer": True}
    assert any("the queue's head is work" in r for r in status["reasons"])

    # Half a slot per thread, and the floor: once the tasks sent before the hold are
    # done, each worker runs one task at a time, never none while tasks are queued.
    def one_each() -> bool:
        return all(len(ws.processing) == 1 for ws in s.workers.values())

    await wait_for(one_each, "one_each()")
    for _ in range(5):
        await asyncio.sleep(0.1)  # window: and it stays so
        assert s.queued and one_each()
    (hold,) = [e for e in events(s, "memory-pressure") if e["step"] == "hold"]
    assert hold["base"] == base and list(hold["workers"]) == [a.address]
    del held  # memory falls below release: the scheduler's own value comes back
    await wait_for(lambda: policy.pressure.state == "idle", "policy.pressure.state == 'idle'")
    assert base == s.WORKER_SATURATION
    consistent(s)
    await c.gather(work)
    release = [e for e in events(s, "memory-pressure") if e["step"] == "release"]
    assert release and "no worker at or above 20%" in release[0]["reason"]
    metrics = policy.pressure.metrics()
    assert metrics["holds"] == metrics["releases"] == 1 and metrics["held_seconds"] > 0
    no_errors(s)


@gen_cluster(client=True, config=config(section()), **WORKERS)
async def test_no_hold_without_a_producer_at_the_head_of_the_queue(c, s, a, b):
    policy = policy_of(s)
    held = await pressure_on(c, s, a)
    # Pressure, but nothing queued: nothing to hold back.
    await asyncio.sleep(0.3)  # window: and it stays so
    assert policy.pressure.state == "idle"
    assert "nothing is queued" in policy.pressure.reasons
    del held


@gen_cluster(
    client=True,
    config=config(section(producers='task.prefix != "work"')),
    **WORKERS,
)
async def test_a_consumer_at_the_head_of_the_queue_is_not_held(c, s, a, b):
    policy = policy_of(s)
    held = await pressure_on(c, s, a)
    work = c.map(slow, range(40), key=[f"work-{i}" for i in range(40)])
    await wait_for(
        lambda: s.queued and policy.pressure.head is not None,
        "s.queued and policy.pressure.head is not None",
    )
    await asyncio.sleep(0.3)  # window: and it stays so
    assert policy.pressure.state == "idle"
    assert any("work" in r and "not a producer" in r for r in policy.pressure.reasons)
    await c.gather(work)
    del held


@gen_cluster(
    client=True,
    config=config(section(**{"max-hold": "300ms", "cool-down": "30s"})),
    **WORKERS,
)
async def test_max_hold_ends_a_hold_and_cools_down(c, s, a, b):
    policy = policy_of(s)
    base = s.WORKER_SATURATION
    held = await pressure_on(c, s, a)
    work = c.map(slow, range(40), key=[f"work-{i}" for i in range(40)])
    await wait_for(
        lambda: policy.pressure.state == "cooling", "policy.pressure.state == 'cooling'"
    )
    assert base == s.WORKER_SATURATION
    consistent(s)
    await asyncio.sleep(0.3)  # window: and it stays so
    assert policy.pressure.state == "cooling"  # still under pressure, but cooling down
    assert any("cooling down" in r for r in policy.pressure.reasons)
    (release,) = [e for e in events(s, "memory-pressure") if e["step"] == "release"]
    assert "max-hold" in release["reason"]
    await c.gather(work)
    del held


@gen_cluster(client=True, config=config(section()), **WORKERS)
async def test_removing_the_section_releases_the_hold(c, s, a, b):
    from amm_rules import load_ruleset

    policy = policy_of(s)
    base = s.WORKER_SATURATION
    held = await pressure_on(c, s, a)
    work = c.map(slow, range(40), key=[f"work-{i}" for i in range(40)])
    await wait_for(
        lambda: policy.pressure.state == "holding", "policy.pressure.state == 'holding'"
    )
    policy._install(load_ruleset({"version": 1}))
    assert base == s.WORKER_SATURATION and policy.pressure.state == "idle"
    consistent(s)
    await c.gather(work)
    del held


@gen_cluster(client=True, config=config(section()), **WORKERS, timeout=60)
async def test_a_saturation_set_by_someone_else_wins(c, s, a, b):
    policy = policy_of(s)
    held = await pressure_on(c, s, a)
    work = c.map(slow, range(40), key=[f"work-{i}" for i in range(40)])
    await wait_for(
        lambda: policy.pressure.state == "holding", "policy.pressure.state == 'holding'"
    )
    s.WORKER_SATURATION = 2.0
    for ws in s.workers.values():
        s.check_idle_saturated(ws)
    await wait_for(
        lambda: policy.pressure.state != "holding", "policy.pressure.state != 'holding'"
    )
    assert s.WORKER_SATURATION == 2.0
    assert [e for e in events(s, "memory-pressure") if e["step"] == "stopped"]
    # Still under pressure: theirs stays through the cool-down all the same.
    assert policy.pressure.state == "cooling"
    for _ in range(5):
        await asyncio.sleep(0.1)  # window: two checks each
        assert s.WORKER_SATURATION == 2.0 and policy.pressure.state == "cooling"
    await c.gather(work)
    del held


@gen_cluster(
    client=True,
    config=config(section(), **{"distributed.scheduler.worker-saturation": math.inf}),
    **WORKERS,
)
async def test_without_queuing_nothing_can_be_held_and_it_says_so(c, s, a, b):
    policy = policy_of(s)
    futures = c.map(slow, range(4), key=[f"small-{i}" for i in range(4)])
    await arrived(s, futures)
    assert not any(s.tasks[f.key].run_spec.data_producer for f in futures)
    await wait_for(
        lambda: policy.pressure.state == "unavailable", "policy.pressure.state == 'unavailable'"
    )
    (event,) = [e for e in events(s, "memory-pressure") if e["step"] == "unavailable"]
    assert "worker-saturation is inf" in event["reason"]
    await c.gather(futures)


@gen_cluster(client=True, config=config(section()), **WORKERS)
async def test_a_graph_arriving_under_pressure_is_held_from_its_first_task(c, s, a, b):
    policy = policy_of(s)
    held = await pressure_on(c, s, a)
    # Four tasks on four threads: without the hold, every one would start at once.
    small = c.map(slow, range(4), delay=1.0, key=[f"small-{i}" for i in range(4)])
    await arrived(s, small)
    assert policy.pressure.state == "holding"
    assert sum(len(ws.processing) for ws in s.workers.values()) == 2  # one per worker
    assert len(s.queued) == 2
    (hold,) = [e for e in events(s, "memory-pressure") if e["step"] == "hold"]
    assert hold["prefix"] == "small"
    assert "a graph arrived with tasks of producers: small" in hold["reasons"]
    await c.gather(small)
    del held


def _three_mib(i: int) -> bytes:
    return bytes(3 * 2**20)


@gen_cluster(client=True, config=config(section()), **WORKERS)
async def test_the_queue_heads_net_bytes_are_written_as_every_size_is(c, s, a, b):
    """The reason names a prefix's net bytes per task in dask's own format, as status
    and the page write sizes (it wrote '+3.0 MiB' beside their '3.00 MiB')."""
    policy = policy_of(s)
    futures = c.map(_three_mib, range(2), key=[f"big-{i}" for i in range(2)])
    await c.gather(futures)
    await wait_for(
        lambda: (policy.flow.table().get("big") or {}).get("net_per_task"),
        "the memory flow measured big's net bytes per task",
    )
    reason = policy.pressure._head_reason(("big", True))
    assert reason == "the queue's head is big (net +3.00 MiB per task): a producer"
