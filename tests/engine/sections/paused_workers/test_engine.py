"""The ``paused-workers`` section step by step, on in-process workers (docs/paused-workers.md).

The workers' memory monitors pause them for real, but their process memory is set by
each test (``monitor.get_process_memory``, which distributed provides to be replaced in
tests), since in-process workers share one process. The AMM runs only when a test says
so, one cycle at a time. Workers here have no nanny: a restart is a retirement, as the
events say. The leak on real processes is in ``tests/engine/sections/paused_workers/test_paused_workers.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
from distributed import Worker
from distributed.utils_test import gen_cluster

from benchmarks.support.retire import ReplicaLog
from benchmarks.support.waiting import cycle_until, cycles, wait_for
from tests.support.cluster import amm_config, events, holders, no_errors, policy_of, rules

#: Run in the version matrix too (.ci/run): the floor and the newest dask/distributed.
pytestmark = pytest.mark.compat

LIMIT = 2**30
GPU = {"resources": {"GPU": 1}, "memory_limit": LIMIT}
PLAIN = {"memory_limit": LIMIT}
POOLS = {"gpu": "worker.resources.GPU >= 1"}
SECTION = {
    "after": "100ms",
    "require-unmanaged": "50%",
    "max-paused-fraction": "50%",
    "cool-down": "1h",
}


def config(*entries: Any, section: dict[str, Any] | None = None, **fields: Any) -> dict:
    paused = {**SECTION, **fields} if section is None else section
    out = amm_config(rules(*entries, pools=POOLS, paused_workers=paused))
    return {
        **out,
        # One cycle when the test asks (AMM.run_once), never on a timer.
        "distributed.scheduler.active-memory-manager.interval": 3600,
        "distributed.worker.memory.monitor-interval": "10ms",
        "distributed.worker.memory.spill": False,
        "distributed.worker.memory.target": False,
        "distributed.worker.memory.terminate": False,
    }


def set_memory(worker: Worker, fraction: float) -> None:
    """The worker's process memory, as its monitor and heartbeats will report it."""
    worker.monitor.get_process_memory = lambda: int(fraction * LIMIT)


async def pause(s: Any, *workers: Worker) -> None:
    for w in workers:
        set_memory(w, 0.9)
    await wait_for(
        lambda: all(
            s.workers[w.address].status.name == "paused"
            and s.workers[w.address].memory.process >= 0.85 * LIMIT
            for w in workers
        ),
        "all( s.workers[w.address].status.name == 'paused' and s.workers[w.address].memory.process >= 0.85 * LIMIT for w in workers )",
    )


async def settle(s: Any, *workers: Worker, fraction: float = 0.1) -> None:
    """Workers at ``fraction`` of their limit, as the scheduler sees it."""
    for w in workers:
        set_memory(w, fraction)
    await wait_for(
        lambda: all(
            abs(s.workers[w.address].memory.process - fraction * LIMIT) < 0.01 * LIMIT
            for w in workers
        ),
        "all( abs(s.workers[w.address].memory.process - fraction * LIMIT) < 0.01 * LIMIT for w in workers )",
    )


def steps(s: Any, worker: str) -> list[str]:
    return [e["step"] for e in events(s, "paused-worker") if e["worker"] == worker]


def step(s: Any, worker: str, name: str) -> dict[str, Any]:
    (event,) = [
        e for e in events(s, "paused-worker") if e["worker"] == worker and e["step"] == name
    ]
    return event


def line(s: Any, worker: str) -> dict[str, Any]:
    (entry,) = [
        w
        for w in s.handlers["amm_rules_status"]()["paused_workers"]["workers"]
        if w["worker"] == worker
    ]
    return entry


@gen_cluster(
    client=True,
    nthreads=[("", 1, GPU), ("", 1, GPU), ("", 1, PLAIN), ("", 1, PLAIN)],
    config=config({"name": "device", "match": 'task.key matches "dev-*"', "pool": "gpu"}),
    timeout=150,
)
async def test_a_paused_worker_is_emptied_by_the_rules_then_retired_without_a_nanny(
    c, s, gpu0, gpu1, cpu0, cpu1
):
    await settle(s, gpu0, cpu0, cpu1)
    await settle(s, gpu1, fraction=0.3)  # more memory than the CPU workers, room still
    dev = await c.scatter({f"dev-{i}": i for i in range(3)}, workers=[gpu0.address])
    plain = await c.scatter({f"plain-{i}": i for i in range(3)}, workers=[gpu0.address])
    log = ReplicaLog(s)
    await pause(s, gpu0)
    await cycle_until(
        s, lambda: "retired" in steps(s, gpu0.address), "'retired' in steps(s, gpu0.address)"
    )
    assert steps(s, gpu0.address) == ["paused", "evacuating", "retiring", "retired"]
    assert step(s, gpu0.address, "evacuating")["note"] == (
        "it has no nanny to restart it: retired instead"
    )
    assert step(s, gpu0.address, "paused")["unmanaged"] > 0.85
    assert gpu0.address not in s.workers
    assert all(log.seen(k) == {gpu1.address} == holders(s, k) for k in dev)
    assert all(len(holders(s, k)) == 1 and gpu0.address not in log.seen(k) for k in plain)
    assert await c.gather(dev) == {f"dev-{i}": i for i in range(3)}
    assert await c.gather(plain) == {f"plain-{i}": i for i in range(3)}
    paused = policy_of(s).paused
    metrics = paused.metrics()
    assert metrics["retired"] == 1 and metrics["copies"] == 6 and metrics["evacuations"] == 1
    assert metrics["handling"] == 0
    assert paused.status()["cooling"].keys() == {str(gpu0.name)}
    no_errors(s)


@gen_cluster(
    client=True,
    nthreads=[("", 1, PLAIN)] * 3,
    config=config({"name": "frozen", "match": 'task.key matches "frozen-*"', "move": "never"}),
    timeout=150,
)
async def test_a_move_never_key_alone_keeps_the_worker_and_says_why(c, s, a, b, w3):
    await settle(s, a, b, w3)
    frozen = await c.scatter({"frozen-1": 1}, workers=[a.address])
    plain = await c.scatter({"plain-1": 1}, workers=[a.address])
    log = ReplicaLog(s)
    await pause(s, a)
    await cycle_until(
        s, lambda: "blocked" in steps(s, a.address), "'blocked' in steps(s, a.address)"
    )
    blocked = step(s, a.address, "blocked")
    assert blocked["keys"] == ["frozen-1"] and blocked["count"] == 1
    assert blocked["rules"] == ["frozen"] and blocked["why"] == ["move: never"]
    # Nothing is copied for a worker that cannot leave.
    assert log.seen("plain-1") == set() and holders(s, "plain-1") == {a.address}
    assert line(s, a.address)["state"] == "blocked"
    explained = (await s.handlers["amm_rules_explain"](keys=["frozen-1"]))["frozen-1"]
    assert explained["paused_workers"] == [
        {
            "worker": a.address,
            "state": "blocked",
            "blocks": "keeps the worker from leaving: move: never (frozen)",
        }
    ]
    # Tried again `after` later: still blocked, never restarted or retired.
    await cycle_until(
        s,
        lambda: steps(s, a.address).count("blocked") == 2,
        "steps(s, a.address).count('blocked') == 2",
    )
    assert "retiring" not in steps(s, a.address) and a.address in s.workers
    assert await c.gather([frozen["frozen-1"], plain["plain-1"]]) == [1, 1]
    no_errors(s)


@gen_cluster(
    client=True,
    nthreads=[("", 1, PLAIN)] * 3,
    config=config(),
    timeout=150,
)
async def test_recipients_without_room_block_the_worker(c, s, a, b, w3):
    # Room on b and w3: 80% pause - 10% margin - 69% used = 1% of 1 GiB, about 10 MiB.
    await settle(s, b, w3, fraction=0.69)
    big = await c.scatter({"big-1": b"." * 20_000_000}, workers=[a.address])
    log = ReplicaLog(s)
    await pause(s, a)
    await cycle_until(
        s, lambda: "blocked" in steps(s, a.address), "'blocked' in steps(s, a.address)"
    )
    blocked = step(s, a.address, "blocked")
    assert blocked["keys"] == ["big-1"] and blocked["why"] == [
        "no eligible worker has room for it"
    ]
    assert log.seen("big-1") == set()
    # Room appears: the next attempt copies the key, and the worker leaves.
    await settle(s, b, w3, fraction=0.1)
    await cycle_until(
        s, lambda: "retired" in steps(s, a.address), "'retired' in steps(s, a.address)"
    )
    assert len(log.seen("big-1")) == 1
    assert len(await c.gather(big["big-1"])) == 20_000_000
    no_errors(s)


@gen_cluster(
    client=True,
    nthreads=[("", 1, PLAIN)] * 3,
    config=config(**{"max-bytes-per-cycle": "1 MiB"}),
    timeout=150,
)
async def test_copies_off_a_paused_worker_keep_to_the_byte_budget(c, s, a, b, w3):
    await settle(s, b, w3)
    data = await c.scatter({f"k-{i}": b"." * 400_000 for i in range(6)}, workers=[a.address])
    await pause(s, a)
    paused = policy_of(s).paused
    await cycle_until(s, lambda: paused.counters["copies"] > 0, "paused.counters['copies'] > 0")
    per_cycle = [paused.counters["copies"]]
    while paused.counters["copies"] < 6:
        await cycles(s, 1)
        per_cycle.append(paused.counters["copies"] - sum(per_cycle))
    assert per_cycle[0] == 2 and max(per_cycle) == 2  # 2 x 400 kB fit in 1 MiB, 3 do not
    await cycle_until(
        s, lambda: "retired" in steps(s, a.address), "'retired' in steps(s, a.address)"
    )
    assert len(await c.gather(list(data.values()))) == 6
    no_errors(s)


@gen_cluster(client=True, nthreads=[("", 1, PLAIN)] * 2, config=config(), timeout=150)
async def test_every_worker_paused_is_only_reported(c, s, a, b):
    data = await c.scatter({"k-1": 1}, workers=[a.address])
    await pause(s, a, b)
    await cycle_until(
        s,
        lambda: all("held" in steps(s, w.address) for w in (a, b)),
        "all('held' in steps(s, w.address) for w in (a, b))",
    )
    for w in (a, b):
        assert steps(s, w.address) == ["paused", "held"]
        assert step(s, w.address, "held")["reason"] == "all-paused"
        assert line(s, w.address)["state"] == "held"
    await cycles(s, 10)
    assert steps(s, a.address) == ["paused", "held"] and len(s.workers) == 2
    assert holders(s, "k-1") == {a.address}
    assert await c.gather(data["k-1"]) == 1
    no_errors(s)


@gen_cluster(client=True, nthreads=[("", 1, PLAIN)] * 3, config=config(), timeout=150)
async def test_more_than_max_paused_fraction_paused_is_only_reported(c, s, a, b, w3):
    await settle(s, w3)
    await pause(s, a, b)  # 2 of 3: more than 50%
    await cycle_until(
        s,
        lambda: all("held" in steps(s, w.address) for w in (a, b)),
        "all('held' in steps(s, w.address) for w in (a, b))",
    )
    assert {step(s, w.address, "held")["reason"] for w in (a, b)} == {"too-many-paused"}
    assert "2 of 3 workers are paused" in step(s, a.address, "held")["detail"]
    # One recovers: the other is now 1 of 3, and is handled.
    await settle(s, b)
    await cycle_until(
        s, lambda: "retired" in steps(s, a.address), "'retired' in steps(s, a.address)"
    )
    no_errors(s)


@gen_cluster(
    client=True,
    nthreads=[("", 1, {"memory_limit": 100 * 2**20})] + [("", 1, PLAIN)] * 2,
    config=config(),
    timeout=150,
)
async def test_a_pause_from_dasks_own_data_is_left_alone(c, s, a, b, w3):
    """The pause comes from managed data (60 MiB of 100 MiB): restarting would only move
    the problem, so ``require-unmanaged`` keeps the section away."""
    await settle(s, b, w3)
    a.monitor.get_process_memory = lambda: 10 * 2**20  # not paused by the test's own RSS
    await wait_for(
        lambda: s.workers[a.address].status.name == "running",
        "s.workers[a.address].status.name == 'running'",
    )
    data = await c.scatter({"big-1": b"." * (60 * 2**20)}, workers=[a.address])
    a.monitor.get_process_memory = lambda: 90 * 2**20  # 60 MiB managed, 30 unmanaged
    await wait_for(
        lambda: s.workers[a.address].status.name == "paused",
        "s.workers[a.address].status.name == 'paused'",
    )
    await wait_for(
        lambda: s.workers[a.address].memory.process == 90 * 2**20,
        "s.workers[a.address].memory.process == 90 * 2**20",
    )
    await cycle_until(s, lambda: "held" in steps(s, a.address), "'held' in steps(s, a.address)")
    held = step(s, a.address, "held")
    assert held["reason"] == "managed-memory"
    assert held["detail"].startswith("unmanaged memory is 30% of its limit")
    await cycles(s, 10)
    assert steps(s, a.address) == ["paused", "held"] and holders(s, "big-1") == {a.address}
    assert len(await c.gather(data["big-1"])) == 60 * 2**20
    no_errors(s)


@gen_cluster(
    client=True,
    nthreads=[("", 1, PLAIN)] * 5,
    config=config(**{"max-concurrent": 1}),
    timeout=150,
)
async def test_max_concurrent_and_cool_down(c, s, a, b, w3, w4, w5):
    await settle(s, w3, w4, w5)
    data = await c.scatter({"a-1": 1, "b-1": 2}, workers=[a.address])
    await c.scatter({"b-2": 3}, workers=[b.address])
    await pause(s, a, b)  # 2 of 5 paused
    await cycle_until(
        s,
        lambda: all("retired" in steps(s, w.address) for w in (a, b)),
        "all('retired' in steps(s, w.address) for w in (a, b))",
    )
    ordered = [
        (e["worker"], e["step"])
        for e in events(s, "paused-worker")
        if e["step"] in ("evacuating", "retired")
    ]
    first, second = ordered[0][0], ordered[2][0]
    assert ordered == [
        (first, "evacuating"),
        (first, "retired"),
        (second, "evacuating"),
        (second, "retired"),
    ]
    assert step(s, second, "held")["reason"] == "max-concurrent"
    # A worker with the name of the first one comes back (as a nanny restarts a worker)
    # and pauses again: left alone while it cools down.
    name = next(w.name for w in (a, b) if w.address == first)
    assert policy_of(s).paused.status()["cooling"].keys() == {str(a.name), str(b.name)}
    async with Worker(s.address, nthreads=1, name=name, memory_limit=LIMIT) as again:
        await pause(s, again)
        await cycle_until(
            s, lambda: "held" in steps(s, again.address), "'held' in steps(s, again.address)"
        )
        assert step(s, again.address, "held")["reason"] == "cooling-down"
        await cycles(s, 5)
        assert steps(s, again.address) == ["paused", "held"]
    assert await c.gather(list(data.values())) == [1, 2]
    no_errors(s)


@gen_cluster(
    client=True, nthreads=[("", 1, PLAIN)] * 3, config=config(action="report"), timeout=150
)
async def test_action_report_only_reports(c, s, a, b, w3):
    await settle(s, b, w3)
    data = await c.scatter({"k-1": 1}, workers=[a.address])
    await pause(s, a)
    await cycle_until(
        s, lambda: "paused" in steps(s, a.address), "'paused' in steps(s, a.address)"
    )
    await cycles(s, 10)
    assert steps(s, a.address) == ["paused"]
    assert step(s, a.address, "paused")["then"] == "report"
    assert line(s, a.address)["state"] == "reported"
    assert holders(s, "k-1") == {a.address}
    assert policy_of(s).paused.metrics()["paused"] == 1
    assert await c.gather(data["k-1"]) == 1
    no_errors(s)


@gen_cluster(client=True, nthreads=[("", 1, PLAIN)] * 3, config=config(), timeout=150)
async def test_a_worker_that_unpauses_while_emptied_is_forgotten(c, s, a, b, w3):
    await settle(s, b, w3)
    data = await c.scatter({f"k-{i}": i for i in range(3)}, workers=[a.address])
    await pause(s, a)
    await cycle_until(
        s, lambda: "evacuating" in steps(s, a.address), "'evacuating' in steps(s, a.address)"
    )
    await settle(s, a)  # memory back below the pause threshold
    await wait_for(
        lambda: s.workers[a.address].status.name == "running",
        "s.workers[a.address].status.name == 'running'",
    )
    await cycle_until(
        s, lambda: "recovered" in steps(s, a.address), "'recovered' in steps(s, a.address)"
    )
    assert steps(s, a.address) == ["paused", "evacuating", "recovered"]
    assert policy_of(s).paused.handling == {} and a.address in s.workers
    assert s.handlers["amm_rules_status"]()["paused_workers"]["workers"] == []
    assert await c.gather(list(data.values())) == [0, 1, 2]
    no_errors(s)
