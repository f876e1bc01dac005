"""The spill section on real workers: the order each worker gives keys up in, the
plugin on joining workers and its teardown, a foreign mapping left alone, the keys on
disk told to the scheduler, prefetch, and copies dropped rather than written.

Workers here spill only at their buffer's target (``memory.target``), not through
the memory monitor (``memory.spill: false``): the process of an in-process cluster
holds far more than any worker's limit, which the monitor would count.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from distributed import Worker
from distributed.utils_test import gen_cluster

from amm_rules.engine.decide.spill import value_per_byte
from amm_rules.engine.rebalance.rebalancer import ON_DISK
from amm_rules.engine.sections.spill import SpillSection
from amm_rules.engine.spill.order import ValueOrder
from amm_rules.engine.spill.plugin import PLUGIN_NAME, SpillPlugin, type_of_stock_order
from amm_rules.engine.spill.sweep import Sweep
from amm_rules.observe.explain import explain_keys
from amm_rules.observe.status import status_report
from amm_rules.observe.text import render_explain, render_status
from benchmarks.support.waiting import wait_for
from tests.support.cluster import amm_config, events, keep, long_interval, policy_of, skipped

pytestmark = pytest.mark.compat

MiB = 2**20
#: Seconds a test may take (the sum of its waits' deadlines is below it).
TIMEOUT = 150
#: Each worker's memory limit; its buffer's target is 60% of it (60 MiB).
LIMIT = 100 * MiB
MEMORY = {
    "distributed.worker.memory.target": 0.6,
    "distributed.worker.memory.spill": False,
    "distributed.worker.memory.pause": False,
    "distributed.worker.memory.terminate": False,
}


def blob(i: int, size: int) -> bytes:
    return i.to_bytes(8, "little") * (size // 8)


def config(spill: Any, rules: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {**amm_config({"version": 1, "spill": spill, "rules": rules or []}), **MEMORY}


LOOKUP_LAST = [{"name": "table", "match": "task.prefix == 'lookup'", "spill": "last"}]


def plugin_of(worker: Worker) -> Any:
    return worker.plugins.get(PLUGIN_NAME)


async def reported(s: Any, *workers: Worker) -> Any:
    """Wait until the plugin is on ``workers`` and each reported; return the policy."""
    await wait_for(
        lambda: all(plugin_of(w) is not None for w in workers), "the plugin on the workers"
    )
    policy = policy_of(s)
    await wait_for(
        lambda: {w.address for w in workers} <= set(policy.ctx.spilled.workers),
        "the workers reported",
    )
    return policy


async def fill(c: Any, worker: Worker, prefix: str, count: int, size: int) -> list[Any]:
    futures = [
        c.submit(blob, i, size, key=f"{prefix}-{i}", workers=[worker.address])
        for i in range(count)
    ]
    await c.gather(futures)
    return futures


async def lookup_kept(c: Any, s: Any, a: Worker, order: str) -> tuple[bool, list[Any]]:
    """A lookup table stored first, then bulk keys past the target: whether the
    lookup table is still in memory once the worker wrote keys to disk (and the
    futures, which hold the keys)."""
    await wait_for(lambda: plugin_of(a) is not None, "the plugin on the worker")
    table = c.submit(blob, 0, 10 * MiB, key="lookup-0", workers=[a.address])
    await table
    # 40 MiB of 60: the worker is valued (VALUE_AT) and its table's value arrives.
    bulk = await fill(c, a, "bulk", 3, 10 * MiB)
    if order == "value":
        await wait_for(
            lambda: plugin_of(a).values.value_of("lookup-0") == float("inf"),
            "the lookup table valued on its worker",
        )
    bulk += await fill(c, a, "more", 6, 10 * MiB)
    await wait_for(lambda: len(a.data.slow) >= 3, "keys written to disk")
    return "lookup-0" in a.data.fast, [table, *bulk]


@gen_cluster(
    client=True,
    timeout=TIMEOUT,
    nthreads=[("", 1)],
    worker_kwargs={"memory_limit": LIMIT},
    config=config({"order": "value"}, LOOKUP_LAST),
)
async def test_a_dear_key_stays_in_memory_while_cheap_ones_go_to_disk(c, s, a):
    kept, futures = await lookup_kept(c, s, a, "value")
    assert kept
    assert isinstance(a.data.fast.order, ValueOrder)
    await wait_for(lambda: policy_of(s).ctx.spilled.workers.get(a.address), "a report")
    on_disk = policy_of(s).ctx.spilled.workers[a.address].keys
    await wait_for(lambda: len(on_disk) >= 3, "the keys on disk told to the scheduler")
    assert "lookup-0" not in on_disk
    assert set(on_disk) <= set(a.data.slow)
    # What status, explain and the metrics say of it.
    policy = policy_of(s)
    spilled_key = next(iter(on_disk))
    text = render_explain(explain_keys(policy, [spilled_key, "lookup-0"]))
    assert f"spill    on {a.address}: on disk since" in text
    assert "spill    last (rule table)" in text
    by_rule = policy.section(SpillSection).by_rule
    await wait_for(  # counted in the cycles' slices, every few seconds
        lambda: by_rule.counted.get("(no rule)", 0) >= 3 * 10 * MiB, "bytes on disk by rule"
    )
    report = status_report(policy)
    assert report["spill"]["keys_on_disk"] == len(on_disk)
    assert report["spill"]["bytes_on_disk_by_rule"]["(no rule)"] >= 3 * 10 * MiB
    status = render_status(report)
    assert "spill        order value, drop-copies off, prefetch off" in status
    assert f"  {a.address}  {len(on_disk)} keys on disk" in status
    metrics = policy.section(SpillSection).metrics()
    assert metrics["written_bytes"][a.address] >= 3 * 10 * MiB
    # A task reads the table again: least-recently-used would have written it first
    # and read it back now; the order by value kept it (what the order saved).
    before = plugin_of(a).figures()
    assert await c.submit(len, futures[0], workers=[a.address], key="read-lookup") == 10 * MiB
    after = plugin_of(a).figures()
    assert after["lru_read_bytes"] - before["lru_read_bytes"] == 10 * MiB
    assert after["read_since_bytes"] == before["read_since_bytes"]
    await wait_for(
        lambda: (
            policy.section(SpillSection).metrics()["lru_read_bytes"].get(a.address, 0)
            >= after["lru_read_bytes"]
        ),
        "the reads least-recently-used would have made, reported",
    )
    text = render_status(status_report(policy))
    assert "  order by value " in text and "least-recently-used ~" in text


@gen_cluster(
    client=True,
    timeout=TIMEOUT,
    nthreads=[("", 1), ("", 1)],
    worker_kwargs={"memory_limit": LIMIT},
    config=config({"order": "value"}, [{**LOOKUP_LAST[0], "replicate": {"min": 1, "max": 2}}]),
)
async def test_a_rules_spill_reaches_an_empty_worker_and_a_new_copy(c, s, a, b):
    """The sweep values a worker's keys only once it is near its target; a rule's
    ``spill`` is sent to the key's holders in the cycle after the key is filed, however
    full they are, and to a worker that gains a copy in the cycle after it landed: a
    table made while the workers were empty is not given up first once they fill."""
    policy = await reported(s, a, b)
    table = c.submit(blob, 0, 5 * MiB, key="lookup-0", workers=[a.address])
    other = c.submit(blob, 1, 5 * MiB, key="other-0", workers=[a.address])
    await c.gather([table, other])
    await wait_for(
        lambda: plugin_of(a).values.value_of("lookup-0") == float("inf"),
        "the table valued on its worker, a tenth full",
    )
    assert policy.section(SpillSection).near.get(a.address) is None  # not swept
    assert plugin_of(a).values.sent("other-0") is None  # no rule: nothing sent
    # A task on b reads the table: b gains a copy (kept: the rule's max is 2), valued
    # there too.
    assert await c.submit(len, table, workers=[b.address], key="read-on-b") == 5 * MiB
    assert "lookup-0" in b.data
    await wait_for(
        lambda: plugin_of(b).values.value_of("lookup-0") == float("inf"),
        "the table's new copy valued on the worker that fetched it",
    )


@gen_cluster(
    client=True,
    timeout=TIMEOUT,
    nthreads=[("", 1), ("", 1)],
    worker_kwargs={"memory_limit": LIMIT},
    config={
        **long_interval(
            {
                "version": 1,
                "spill": {"order": "value"},
                "rules": [{**LOOKUP_LAST[0], "replicate": {"min": 1, "max": 2}}],
            }
        ),
        **MEMORY,
    },
)
async def test_a_filling_worker_and_a_ruled_copy_do_not_wait_for_the_next_cycle(c, s, a, b):
    """With an AMM interval longer than the test, the table's value still reaches its
    worker once that worker is half-way to writing to disk (an early cycle classifies
    what it made and sweeps it), and reaches the worker that fetched a copy (an early
    cycle for a copy of a key whose rule sets spill)."""
    policy = await reported(s, a, b)
    table = c.submit(blob, 0, 5 * MiB, key="lookup-0", workers=[a.address])
    await table
    assert plugin_of(a).values.sent("lookup-0") is None  # no cycle came to it yet
    bulk = await fill(c, a, "bulk", 3, 10 * MiB)  # 35 MiB of 60: half-way
    await wait_for(
        lambda: plugin_of(a).values.value_of("lookup-0") == float("inf"),
        "the table valued once its worker filled",
    )
    assert await c.submit(len, table, workers=[b.address], key="read-on-b") == 5 * MiB
    await wait_for(
        lambda: plugin_of(b).values.value_of("lookup-0") == float("inf"),
        "the table's new copy valued",
    )
    reasons = {r for _, rs in policy.ctx.early.history for r in rs}
    assert {"spill-worker-filling", "spill-rule-copy"} <= reasons
    keep(bulk)


@gen_cluster(
    client=True,
    timeout=TIMEOUT,
    nthreads=[("", 1)],
    worker_kwargs={"memory_limit": LIMIT},
    config=config({"order": "lru"}, LOOKUP_LAST),
)
async def test_stock_order_writes_the_least_recently_used_first(c, s, a):
    """The control of the test above: with order: lru the same keys send the lookup
    table, used least recently, to disk first."""
    kept, futures = await lookup_kept(c, s, a, "lru")
    assert not kept
    assert not isinstance(a.data.fast.order, ValueOrder)


@gen_cluster(
    client=True,
    timeout=TIMEOUT,
    nthreads=[],
    config=config({"order": "value"}, LOOKUP_LAST),
)
async def test_a_joining_worker_gets_the_plugin_and_a_foreign_mapping_is_left_alone(c, s):
    async with Worker(s.address, nthreads=1, memory_limit=LIMIT) as a:
        await wait_for(lambda: plugin_of(a) is not None, "the plugin on a joining worker")
        assert isinstance(a.data.fast.order, ValueOrder)
        async with Worker(s.address, nthreads=1, data=dict) as b:
            spilled = policy_of(s).ctx.spilled
            await wait_for(lambda: b.address in spilled.left_alone, "the dict worker said")
            assert "dict, not a SpillBuffer" in spilled.left_alone[b.address]
            said = [e for e in events(s, "spill-left-alone") if e["worker"] == b.address]
            assert len(said) == 1
            status = policy_of(s).section(SpillSection).status()
            assert b.address in status["left_alone"]
            # Left alone, it still works as stock.
            assert await c.submit(blob, 1, 1024, workers=[b.address]) == blob(1, 1024)
            assert type(b.data) is dict


@gen_cluster(
    client=True,
    timeout=TIMEOUT,
    nthreads=[("", 1)],
    worker_kwargs={"memory_limit": LIMIT},
    config={**amm_config({"version": 1}), **MEMORY},
)
async def test_keys_already_there_keep_working_and_teardown_restores_stock(c, s, a):
    """The plugin registered on a worker that holds keys in memory and on disk (here
    by the client: the rules have no spill), then removed."""
    futures = await fill(c, a, "early", 9, 10 * MiB)
    assert a.data.slow and a.data.fast
    used = list(a.data.fast.order)
    await c.register_plugin(SpillPlugin(order="value"), name=PLUGIN_NAME)
    assert isinstance(a.data.fast.order, ValueOrder)
    assert a.data.fast.order.keys_by_use() == used
    assert set(plugin_of(a).on_disk) == set(a.data.slow)
    await c.unregister_worker_plugin(PLUGIN_NAME)
    assert type(a.data.fast.order) is type_of_stock_order()
    assert list(a.data.fast.order) == used
    assert not a.data.fast_to_slow_callbacks and not a.data.slow_to_fast_callbacks
    assert await c.gather(futures) == [blob(i, 10 * MiB) for i in range(9)]


DROPS = [
    {"name": "copies", "match": "task.prefix == 'copy'", "replicate": {"min": 1, "max": 2}},
    {"name": "pinned", "match": "task.prefix == 'pinned'", "replicate": 2},
]


@gen_cluster(
    client=True,
    timeout=TIMEOUT,
    nthreads=[("", 1), ("", 1)],
    worker_kwargs={"memory_limit": LIMIT},
    config=config({"order": "value", "drop-copies": True}, DROPS),
)
async def test_copies_held_elsewhere_are_dropped_not_written_and_no_sole_copy(c, s, a, b):
    size = 5 * MiB
    copies = await fill(c, a, "copy", 4, size)
    # A task on b reads each: b fetches a copy, which the rule lets stay.
    await c.gather([c.submit(len, f, workers=[b.address]) for f in copies])
    pinned = await fill(c, a, "pinned", 2, size)
    tasks = s.tasks
    await wait_for(
        lambda: all(len(tasks[f.key].who_has) == 2 for f in copies + pinned),
        "every copy and pinned key on both workers",
    )
    # 30 MiB of copies, 25 MiB held by a alone: above 85% of its 60 MiB target.
    sole = await fill(c, a, "sole", 5, size)
    section = policy_of(s).section(SpillSection)
    await wait_for(lambda: section.drops[a.address] >= 1, "copies dropped from a")
    await wait_for(lambda: a.data.fast.total_weight <= 0.85 * a.data.fast.n, "a below 85%")
    assert not a.data.slow, "nothing was written to disk"
    assert all(len(tasks[f.key].who_has) == 2 for f in pinned), "never below a rule's min"
    assert all(tasks[f.key].who_has == {s.workers[a.address]} for f in sole)
    assert all(tasks[f.key].who_has for f in copies)
    assert section.drops[b.address] == 0
    ledger = policy_of(s).ctx.ledger
    gone = [f.key for f in copies if s.workers[a.address] not in tasks[f.key].who_has]
    assert gone and all(a.address in ledger.drops_of(k) for k in gone), "in the ledger"
    assert all(a.address in ledger.backing_off(k) for k in gone), "not copied back to a"
    assert policy_of(s).section(SpillSection).status()["drops"] == section.drops[a.address]


def wait_on(event: Any) -> int:
    event.wait()
    return 0


def read_then_wait(x: bytes, event: Any) -> int:
    event.wait()
    return len(x)


@gen_cluster(
    client=True,
    timeout=TIMEOUT,
    nthreads=[("", 1), ("", 1)],
    # No Active Memory Manager: stock's would drop a's copy, which b's task does not read.
    config={"distributed.scheduler.active-memory-manager.start": False},
)
async def test_a_copy_released_once_a_task_elsewhere_ends_is_valued_as_read_once(c, s, a, b):
    """The scheduler's sweep on its own state: a's copy of x, which a task running on b
    reads from b's copy, is released once that task ends (writing it would free memory
    that its release frees anyway): valued as a key read once; not while a client holds
    x (then nothing releases it)."""
    from distributed import Event

    x = c.submit(blob, 1, MiB, key="x", workers=[a.address])
    await x
    event = Event()
    y = c.submit(read_then_wait, x, event, key="y", workers=[b.address])
    ts = s.tasks["x"]
    await wait_for(
        lambda: len(ts.who_has) == 2 and s.tasks["y"].processing_on is s.workers[b.address],
        "x copied to b, where y runs",
    )
    rates = (2e-9, 1e-9)

    def value_on_a() -> float:
        sent: dict[Any, float] = {}
        sweep = Sweep(lambda address: rates, lambda ts, ws: None)
        sweep.run(
            s.workers,
            {a.address: 1.0},
            {},
            False,
            time.perf_counter() + 10,
            lambda address, values, forget: sent.update(values),
        )
        return sent["x"]

    held = value_on_a()
    del x
    await wait_for(lambda: not ts.who_wants, "the client let x go")
    releasing = value_on_a()
    rates_of = {"write": rates[0], "read": rates[1], "drop_copies": False}
    assert held == pytest.approx(value_per_byte(ts.nbytes, 0, 2, **rates_of))
    assert releasing == pytest.approx(value_per_byte(ts.nbytes, 1, 1, **rates_of))
    assert releasing > held
    await event.set()
    assert await y == MiB


@gen_cluster(
    client=True,
    timeout=TIMEOUT,
    nthreads=[("", 1)],
    worker_kwargs={"memory_limit": LIMIT},
    config=config({"order": "value", "prefetch": True}),
)
async def test_prefetch_reads_back_what_a_queued_task_reads(c, s, a):
    from distributed import Event

    early = policy_of(s).ctx.early
    requested: list[str] = []
    ask = early.request
    early.request = lambda reason: (requested.append(reason), ask(reason))[-1]
    futures = await fill(c, a, "early", 9, 10 * MiB)
    on_disk = [f for f in futures if f.key in a.data.slow]
    assert on_disk
    # Room again: the keys still in memory are released.
    in_memory = {f.key for f in futures if f.key in a.data.fast}
    futures = [f for f in futures if f.key not in in_memory]
    await wait_for(lambda: not (in_memory & set(a.data)), "keys released")
    event = Event()
    blocker = c.submit(wait_on, event, workers=[a.address])
    await wait_for(lambda: a.state.executing_count == 1, "the worker's thread busy")
    readers = [c.submit(len, f, workers=[a.address]) for f in on_disk]
    await wait_for(lambda: plugin_of(a).prefetched[0] >= len(on_disk), "read back ahead")
    assert all(f.key in a.data.fast for f in on_disk)
    assert a.state.executing_count == 1, "before the tasks that read them ran"
    await event.set()
    assert await c.gather(readers) == [10 * MiB] * len(on_disk)
    # The worker filled past half-way, but no rule sets spill: no early cycle for it.
    assert policy_of(s).section(SpillSection).near.get(a.address) is not None
    assert "spill-worker-filling" not in requested
    del blocker, futures


@gen_cluster(
    client=True,
    timeout=TIMEOUT,
    nthreads=[("", 1), ("", 1)],
    worker_kwargs={"memory_limit": LIMIT},
    config={
        **amm_config(
            {
                "version": 1,
                "spill": {"order": "lru"},
                # managed: what the scheduler counts of a worker's keys, on disk too.
                "rebalance": {
                    "measure": "managed",
                    "sender-min": "10%",
                    "recipient-max": "100%",
                },
            },
            summary_interval=0,
        ),
        **MEMORY,
        # The AMM starts once a wrote keys to disk (else rebalance empties it first).
        "distributed.scheduler.active-memory-manager.start": False,
    },
)
async def test_rebalance_leaves_keys_on_disk_where_they_are(c, s, a, b):
    """Moving a key its sender holds on disk reads it back and relieves no memory.
    (Most of a's keys are on disk: evening the workers out needs more than the keys
    in memory, so rebalancing comes to those on disk.)"""
    futures = await fill(c, a, "early", 16, 10 * MiB)
    spilled = policy_of(s).ctx.spilled
    # All of them told (a report may carry only part of what the worker wrote): with
    # some still untold, rebalancing could even the workers out with keys it takes for
    # in memory, and never come to one it knows is on disk.
    await wait_for(
        lambda: (
            a.address in spilled.workers
            and len(a.data.slow) >= 3
            and set(spilled.workers[a.address].keys) == set(a.data.slow)
        ),
        "every key on disk told",
    )
    on_disk = set(spilled.workers[a.address].keys)
    await c.amm.start()
    await wait_for(lambda: skipped(s)[ON_DISK] > 0, "keys on disk skipped by rebalance")
    await wait_for(lambda: len(b.data) > 0, "keys in memory moved to b")
    tasks = s.tasks
    assert all(tasks[k].who_has == {s.workers[a.address]} for k in on_disk)
    del futures
