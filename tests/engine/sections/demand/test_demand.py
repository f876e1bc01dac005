"""A key's demand on real clusters: ``task.waiters`` and ``task.reads`` in a ``match``,
current as dependents finish; the ``demand:`` hold, which keeps copies that dependents
read recently out of the default trimming (and only those); the stock behaviour
without it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from distributed import Event
from distributed.utils_test import gen_cluster

from amm_rules.engine.state.demand import DemandTracker
from benchmarks.support.waiting import wait_cycles, wait_for
from tests.support.cluster import amm_config, holders, inc, no_errors, policy_of, rules

HOT = rules({"name": "hot", "match": "task.waiters >= 3", "replicate": 2})
SHARED = rules({"name": "shared", "match": "task.reads >= 2", "replicate": 3})


def read(x: int, gate: str | None = None) -> int:
    if gate is not None:
        Event(gate).wait()
    return x + 1


async def explain(c: Any, key: str) -> dict[str, Any]:
    return (await c.scheduler.amm_rules_explain(keys=[key]))[key]


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(HOT), timeout=90)
async def test_waiters_follow_dependents_as_they_finish(c, s, a, b, w3):
    x = c.submit(inc, 1, key="x-1", workers=[a.address])
    await x
    await wait_cycles(s, 3)
    assert len(holders(s, "x-1")) == 1
    go = Event("go")
    # All on the holder: no dependency transfer makes copies here, the rule does.
    readers = [c.submit(read, x, "go", key=f"read-{i}", workers=[a.address]) for i in range(3)]
    await wait_for(lambda: len(holders(s, "x-1")) == 2, "x-1 at the hot rule's 2 copies")
    why = await explain(c, "x-1")
    assert why["desired"] == "replicate=2 from rule hot"
    assert why["demand"]["waiters"] == 3 and why["demand"]["reads"] == 0
    await go.set()
    assert await c.gather(readers) == [3, 3, 3]
    # No dependent waits any more: the rule lets go, reduce-replicas trims.
    await wait_for(lambda: len(holders(s, "x-1")) == 1, "x-1 trimmed to 1 copy")
    why = await explain(c, "x-1")
    assert why["desired"] == "no rule applies"
    assert why["demand"] == {"waiters": 0, "reads": 3, "held": ()}
    no_errors(s)


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(SHARED), timeout=90)
async def test_reads_count_finished_dependents(c, s, a, b, w3):
    x = c.submit(inc, 1, key="x-1", workers=[a.address])
    await x
    first = c.submit(read, x, key="read-1", workers=[a.address])
    await first
    await wait_cycles(s, 3)
    assert len(holders(s, "x-1")) == 1
    second = c.submit(read, x, key="read-2", workers=[a.address])
    await second
    await wait_for(lambda: len(holders(s, "x-1")) == 3, "x-1 at the shared rule's 3 copies")
    assert (await explain(c, "x-1"))["desired"] == "replicate=3 from rule shared"
    # A key that leaves memory and comes back starts again from no reads.
    del x, first, second
    await wait_for(lambda: "x-1" not in s.tasks, "x-1 released")
    assert "x-1" not in policy_of(s).index.demand.reads
    no_errors(s)


async def read_everywhere(c: Any, s: Any, a: Any, others: list[Any]) -> Any:
    """``x-1`` on ``a``, then read by a task on each of ``others`` (which copies it there)."""
    x = c.submit(inc, 1, key="x-1", workers=[a.address])
    await x
    readers = [c.submit(read, x, key=f"read-{w.name}", workers=[w.address]) for w in others]
    await c.gather(readers)
    return x


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 3,
    config=amm_config(rules(demand={"hold": "60s"})),
)
async def test_the_hold_keeps_copies_recently_read(c, s, a, b, w3):
    x = await read_everywhere(c, s, a, [b, w3])  # noqa: F841 - keeps the key
    await wait_cycles(s, 10)
    # The readers' copies stay; the first copy, which no dependent read, may go.
    assert {b.address, w3.address} <= holders(s, "x-1")
    why = await explain(c, "x-1")
    assert set(why["demand"]["held"]) == {b.address, w3.address}
    status = await c.scheduler.amm_rules_status()
    assert status["demand"]["following"] is True and status["demand"]["hold"] == 60
    no_errors(s)


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 3,
    config=amm_config(rules(demand={"hold": "300ms"})),
)
async def test_held_copies_go_once_the_hold_is_over(c, s, a, b, w3):
    x = await read_everywhere(c, s, a, [b, w3])  # noqa: F841 - keeps the key
    await wait_for(lambda: len(holders(s, "x-1")) == 1, "x-1 trimmed to 1 copy")
    # The copy kept is one the hold had kept: a reader's, not necessarily the first.
    assert policy_of(s).totals["(reduce-replicas)"]["dropped"] == 2
    no_errors(s)


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 3,
    config=amm_config(rules(demand={"hold": "60s", "match": "task.reads >= 5"})),
)
async def test_the_hold_applies_to_the_keys_its_match_selects(c, s, a, b, w3):
    x = await read_everywhere(c, s, a, [b, w3])  # noqa: F841 - two reads, not five
    await wait_for(lambda: len(holders(s, "x-1")) == 1, "x-1 trimmed to 1 copy")
    no_errors(s)


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 3,
    config=amm_config(rules(demand={"hold": "60s", "match": "task.prefix_tasks >= 1"})),
)
async def test_the_hold_match_reads_the_memory_flow_as_rules_do(c, s, a, b, w3):
    x = await read_everywhere(c, s, a, [b, w3])  # noqa: F841 - keeps the key
    await wait_cycles(s, 10)
    # The prefix's figures are published for the match (it read null before).
    assert {b.address, w3.address} <= holders(s, "x-1")
    assert set((await explain(c, "x-1"))["demand"]["held"]) == {b.address, w3.address}
    no_errors(s)


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(rules()))
async def test_without_demand_rules_copies_go_as_with_stock_dask(c, s, a, b, w3):
    x = await read_everywhere(c, s, a, [b, w3])  # noqa: F841 - keeps the key
    await wait_for(lambda: len(holders(s, "x-1")) == 1, "x-1 trimmed to 1 copy")
    demand = policy_of(s).index.demand
    assert demand.enabled is False and not demand.reads
    no_errors(s)


def test_the_tracker_counts_reads_per_worker_and_forgets():
    """DemandTracker alone, on stand-in tasks: what the plugin hook feeds it."""
    table = SimpleNamespace(key="table", who_has={"a"})
    gone = SimpleNamespace(key="gone", who_has=set())
    reader = SimpleNamespace(key="r-1", dependencies=[table, gone])
    tracker = DemandTracker()
    tracker.tasks = {"r-1": reader}
    tracker.transition("r-1", "released", "waiting", None)
    assert tracker.touched == {"table"} and not tracker.reads
    tracker.touched.clear()
    tracker.transition("r-1", "processing", "memory", "tcp://w1")
    assert tracker.reads == {"table": 1} and tracker.touched == {"table"}
    (when,) = tracker.last_read["table"].values()
    assert tracker.held("table", when + 1, hold=2) == {"tcp://w1"}
    # Past the hold: nothing held, and the entry is pruned.
    assert tracker.held("table", when + 3, hold=2) == frozenset()
    assert "table" not in tracker.last_read
    # A task leaving memory or erring is no read; unrelated transitions cost nothing.
    tracker.transition("r-1", "memory", "released", None)
    tracker.transition("r-1", "processing", "erred", None)
    assert tracker.reads == {"table": 1}
    tracker.forget("table")
    assert not tracker.reads and "table" not in tracker.touched


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(start=False))
async def test_reads_of_keys_in_memory_at_attach_start_from_the_scheduler(c, s, a, b, w3):
    """The policy attaches to a scheduler holding a key two of whose dependents already
    ran (their results are in memory): ``task.reads`` starts at 2, not 0, so the rule
    reading it governs the key from the first cycle."""
    from distributed.active_memory_manager import ActiveMemoryManagerExtension

    from amm_rules.engine.policy import RulesPolicy

    x = c.submit(inc, 1, key="x-1", workers=[a.address])
    readers = [c.submit(read, x, key=f"read-{i}", workers=[a.address]) for i in range(2)]
    await c.gather(readers)
    policy = RulesPolicy(SHARED)
    amm = ActiveMemoryManagerExtension(s, {policy}, register=False, start=False)
    assert policy.index.demand.reads["x-1"] == 2
    amm.run_once()
    assert policy.index.desired["x-1"].reasons["replicate"].rule == "shared"
    (row,) = [r for r in (await explain(c, "x-1"))["cascade"] if r.get("rule") == "shared"]
    assert row["matched"] is True
    status = await c.scheduler.amm_rules_status()
    assert status["demand"]["seeded"] >= 1
    no_errors(s)
