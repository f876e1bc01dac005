"""The ``paused-workers`` section on real worker processes with nannies
(docs/paused-workers.md).

A task leaks memory outside Dask's data (:mod:`benchmarks.support.leak`) until its worker pauses.
Without the section the workload stalls; with it, the worker's keys are copied away,
it is restarted through its nanny, the workload completes, no persisted key is lost and
nothing held elsewhere is recomputed.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import dask
import pytest
from distributed import Client, LocalCluster
from distributed.utils_test import gen_test

from benchmarks.support import leak
from benchmarks.support.leak import held, leaky, rss, worker_config
from benchmarks.support.retire import ReplicaLog
from benchmarks.support.waiting import wait_for
from tests.support.cluster import (
    TransitionCounter,
    amm_config,
    events,
    holders,
    no_errors,
    policy_of,
    process_cluster,
)
from tests.support.rules_files import write_atomically

#: Run in the version matrix too (.ci/run): the floor and the newest dask/distributed.
pytestmark = pytest.mark.compat

leak.ship()

LIMIT = 400 * 2**20
#: Workers pause at this fraction of LIMIT.
PAUSE = 0.5
#: Each leaky task lasts this long: well past the memory monitor's 50 ms, so a worker
#: pauses right after the task that crossed its threshold.
PACE = 0.25
HELD = [f"held-{i}" for i in range(9)]
SIZE = 100_000
SECTION = """\
paused-workers:
  after: 1s
  action: restart
  require-unmanaged: 40%
  max-paused-fraction: 50%
"""


async def add_leaky_worker(
    cluster: LocalCluster, client: Client, name: str = "leaky", resource: str = "LEAKY"
) -> str:
    """One more worker like the others, with the resource ``resource``: the leaky tasks
    run there only, and nothing steals them away. Its nanny restarts it with the same
    name and resource. Returns its address."""
    ((_, spec),) = cluster.new_worker_spec().items()
    options = {**spec["options"], "resources": {resource: 1}, "name": name}
    cluster.worker_spec[name] = {**spec, "options": options}
    await cluster._correct_state()
    await client.wait_for_workers(len(cluster.worker_spec))
    (address,) = [a for a, ws in cluster.scheduler.workers.items() if ws.name == name]
    return address


def rules_and_config(tmp_path: Any, text: str) -> tuple[Any, dict[str, Any]]:
    """A rules file holding ``text``, and the dask config of these tests: the scheduler's
    AMM reading that file every 0.1 s, workers pausing at PAUSE of their limit."""
    rules_file = tmp_path / "rules.yaml"
    write_atomically(rules_file, text)
    config = {
        **amm_config(str(rules_file)),
        "distributed.scheduler.active-memory-manager.interval": 0.1,
        **worker_config(pause=PAUSE),
    }
    return rules_file, config


async def leak_mib(client: Client, address: str, leaks: int = 5) -> int:
    """MiB for each leaky task to leak so that the worker at ``address`` pauses after
    ``leaks`` of them: what is left below its pause threshold, measured, split in
    ``leaks``. A fresh worker's own memory differs by release (about 63 MiB on the newest
    dask, 127 MiB on the floor), so a fixed figure would pause one after three tasks and
    the other after six; after a restart the tasks left over (fewer than ``leaks``) must
    not pause the new worker at once."""
    (used,) = (await client.run(rss, workers=[address])).values()
    return math.ceil((PAUSE * LIMIT - used) / leaks / 2**20) + 1


async def stalled(futures: list[Any], quiet: float = 3.0, limit: float = 30.0) -> bool:
    """True once no future has finished for ``quiet`` seconds with some still pending
    (a task running when its worker paused may still finish); False if they all finish.
    Fails after ``limit`` seconds: a bounded wait, not a sleep before an assert."""
    loop = asyncio.get_running_loop()
    start = last = loop.time()
    done = sum(f.done() for f in futures)
    while loop.time() - start < limit:
        now_done = sum(f.done() for f in futures)
        if now_done == len(futures):
            return False
        if now_done != done:
            done, last = now_done, loop.time()
        elif loop.time() - last >= quiet:
            return True
        await asyncio.sleep(0.1)  # window: a stall is no progress for `quiet` seconds
    raise AssertionError(f"neither finished nor stalled after {limit}s")


def address_of(s: Any, name: str) -> str:
    (address,) = [a for a, ws in s.workers.items() if str(ws.name) == name]
    return address


def held_event(s: Any, worker: str) -> dict[str, Any]:
    (event,) = [
        e for e in events(s, "paused-worker") if e["worker"] == worker and e["step"] == "held"
    ]
    return event


def steps(s: Any, worker: str | None = None) -> list[str]:
    return [
        e["step"] for e in events(s, "paused-worker") if worker is None or e["worker"] == worker
    ]


@gen_test(timeout=120)
async def test_a_leaking_worker_stalls_the_workload_until_the_section_restarts_it(tmp_path):
    rules_file, config = rules_and_config(tmp_path, "version: 1\n")
    with dask.config.set(config):
        async with (
            process_cluster(memory_limit=LIMIT) as cluster,
            Client(cluster, asynchronous=True) as c,
        ):
            s = cluster.scheduler
            leaker = await add_leaky_worker(cluster, c)
            executions = TransitionCounter()
            s.add_plugin(executions, name="executions")
            addr = {str(ws.name): a for a, ws in s.workers.items()}
            # Persisted keys, three on each worker, each held there alone.
            names = ["0", "1", "leaky"]
            persisted = {
                k: c.submit(held, k, SIZE, key=k, workers=[addr[names[i % 3]]])
                for i, k in enumerate(HELD)
            }
            await c.gather(list(persisted.values()))
            on_leaker = {k for k in HELD if holders(s, k) == {leaker}}
            assert len(on_leaker) == 3
            # The workload: eight leaky tasks; their worker pauses after five.
            mib = await leak_mib(c, leaker)
            work = [c.submit(leaky, i, mib, pace=PACE, resources={"LEAKY": 1}) for i in range(8)]
            await wait_for(
                lambda: s.workers[leaker].status.name == "paused",
                "s.workers[leaker].status.name == 'paused'",
                timeout=30,
            )

            # 1. Without the section: stalled, the worker staying paused.
            assert await stalled(work)
            assert s.workers[leaker].status.name == "paused"
            assert steps(s) == []

            # 2. With it (the rules file is reloaded): the worker is emptied, restarted
            #    and the workload completes.
            log = ReplicaLog(s)
            write_atomically(rules_file, "version: 1\n" + SECTION)
            assert await asyncio.wait_for(c.gather(work), 60) == list(range(8))
            await wait_for(lambda: "restarted" in steps(s), "'restarted' in steps(s)", timeout=30)
            assert steps(s, leaker) == ["paused", "evacuating", "restarting", "restarted"]
            # The restart went through a retirement by the rules, which found the keys
            # already copied.
            retirement = [e for e in events(s, "retirement") if e["worker"] == leaker]
            assert [e["step"] for e in retirement] == ["placing", "placed"]
            assert retirement[0]["copies"] == 0
            assert leaker not in s.workers
            await wait_for(lambda: len(s.workers) == 3, "len(s.workers) == 3", timeout=30)
            assert "leaky" in {str(ws.name) for ws in s.workers.values()}

            # The leaker's keys were copied before the restart; nothing was lost or
            # recomputed.
            for k in on_leaker:
                assert log.seen(k) and log.seen(k) <= {addr["0"], addr["1"]}
            values = await c.gather([persisted[k] for k in HELD])
            assert values == [held(k, SIZE) for k in HELD]
            assert {k: executions.processing[k] for k in HELD} == dict.fromkeys(HELD, 1)

            policy = policy_of(s)
            metrics = policy.paused.metrics()
            assert metrics["restarted"] == 1 and metrics["copies"] >= 3
            assert metrics["paused_seconds"] > 1
            assert policy.paused.status()["cooling"].keys() == {"leaky"}
            no_errors(s)


def rules_text(**fields: Any) -> str:
    lines = ["version: 1", "rules:", "  - name: frozen", '    match: task.key matches "frozen-*"']
    lines += ["    move: never", "paused-workers:", "  after: 1s", "  require-unmanaged: 40%"]
    lines += ["  max-paused-fraction: 50%"] + [f"  {k}: {v}" for k, v in fields.items()]
    return "\n".join(lines) + "\n"


@gen_test(timeout=120)
async def test_a_pause_from_dasks_data_and_a_move_never_key_alone_are_left_alone(tmp_path):
    """Real memory: worker "managed" pauses under 160 MiB of persisted data (unmanaged
    memory stays low: ``require-unmanaged`` keeps the section away); worker "leaky" leaks
    until it pauses but holds the only copy of a ``move: never`` key (blocked, named)."""
    _, config = rules_and_config(tmp_path, rules_text())
    with dask.config.set(config):
        async with (
            process_cluster(memory_limit=LIMIT) as cluster,
            Client(cluster, asynchronous=True) as c,
        ):
            s = cluster.scheduler
            managed = await add_leaky_worker(cluster, c, "managed", "MANAGED")
            leaker = await add_leaky_worker(cluster, c, "leaky", "LEAKY")
            big = c.submit(held, "big-1", 160 * 2**20, key="big-1", resources={"MANAGED": 1})
            frozen = c.submit(held, "frozen-1", SIZE, key="frozen-1", resources={"LEAKY": 1})
            plain = c.submit(held, "plain-1", SIZE, key="plain-1", resources={"LEAKY": 1})
            await c.gather([big, frozen, plain])
            mib = await leak_mib(c, leaker)
            work = [c.submit(leaky, i, mib, pace=PACE, resources={"LEAKY": 1}) for i in range(10)]
            await wait_for(
                lambda: (
                    s.workers[managed].status.name == s.workers[leaker].status.name == "paused"
                ),
                "s.workers[managed].status.name == s.workers[leaker].status.name == 'paused'",
                timeout=30,
            )
            # The leaker is tried again `after` later: a second "blocked" event.
            await wait_for(
                lambda: steps(s, leaker).count("blocked") >= 2,
                "steps(s, leaker).count('blocked') >= 2",
                timeout=30,
            )
            assert set(steps(s, leaker)) == {"paused", "evacuating", "blocked", "held"}
            (blocked, *_) = [e for e in events(s, "paused-worker") if e["step"] == "blocked"]
            assert blocked["keys"] == ["frozen-1"] and blocked["rules"] == ["frozen"]
            assert held_event(s, leaker)["reason"] == "blocked-recently"
            assert steps(s, managed) == ["paused", "held"]
            assert held_event(s, managed)["reason"] == "managed-memory"
            assert managed in s.workers and leaker in s.workers
            assert holders(s, "frozen-1") == {leaker} and holders(s, "big-1") == {managed}
            assert holders(s, "plain-1") == {leaker}  # nothing copied for a blocked worker
            assert sum(f.done() for f in work) < len(work)  # still stalled, as it must be
            assert await c.gather([frozen, plain]) == [
                held("frozen-1", SIZE),
                held("plain-1", SIZE),
            ]
            assert len(await c.gather(big)) == 160 * 2**20
            no_errors(s)


@gen_test(timeout=180)
async def test_two_leaking_workers_are_restarted_one_at_a_time_then_cool_down(tmp_path):
    _, config = rules_and_config(tmp_path, rules_text(**{"max-concurrent": 1, "cool-down": "1h"}))
    with dask.config.set(config):
        async with (
            process_cluster(memory_limit=LIMIT) as cluster,
            Client(cluster, asynchronous=True) as c,
        ):
            s = cluster.scheduler
            first = await add_leaky_worker(cluster, c, "leaky-a", "LEAKY_A")
            second = await add_leaky_worker(cluster, c, "leaky-b", "LEAKY_B")
            mib = {r: await leak_mib(c, w) for r, w in (("LEAKY_A", first), ("LEAKY_B", second))}
            # Both workers paused for longer than `after` before the section's first look:
            # under load one could reach `after` only once the other was restarted, with
            # nothing left to hold.
            await c.amm.stop()
            work = [
                c.submit(leaky, i, mib[r], pace=PACE, resources={r: 1}, pure=False)
                for r in ("LEAKY_A", "LEAKY_B")
                for i in range(7)
            ]
            since = policy_of(s).paused.clock.since
            await wait_for(
                lambda: all(
                    time.monotonic() - since.get(a, math.inf) > 1.5 for a in (first, second)
                ),
                "both leaky workers paused for more than 1.5 s",
                timeout=30,
            )
            await c.amm.start()
            assert await asyncio.wait_for(c.gather(work), 90) == list(range(7)) * 2
            await wait_for(
                lambda: steps(s).count("restarted") == 2,
                "steps(s).count('restarted') == 2",
                timeout=60,
            )
            order = [
                (e["name"], e["step"])
                for e in events(s, "paused-worker")
                if e["step"] in ("evacuating", "restarted")
            ]
            a, b = order[0][0], order[2][0]
            assert {a, b} == {"leaky-a", "leaky-b"}
            assert order == [
                (a, "evacuating"),
                (a, "restarted"),
                (b, "evacuating"),
                (b, "restarted"),
            ]
            later = first if a == "leaky-b" else second
            assert held_event(s, later)["reason"] == "max-concurrent"
            # The first one restarted leaks again: left alone during its cool-down.
            await wait_for(lambda: len(s.workers) == 4, "len(s.workers) == 4", timeout=30)
            again = address_of(s, a)
            resource = "LEAKY_A" if a == "leaky-a" else "LEAKY_B"
            more = [
                c.submit(leaky, i, mib[resource], pace=PACE, resources={resource: 1}, pure=False)
                for i in range(10)
            ]
            await wait_for(
                lambda: "held" in steps(s, again), "'held' in steps(s, again)", timeout=30
            )
            assert held_event(s, again)["reason"] == "cooling-down"
            assert await stalled(more)
            assert steps(s, again) == ["paused", "held"]
            assert policy_of(s).paused.metrics()["restarted"] == 2
            no_errors(s)
