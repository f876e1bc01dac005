"""The ``paused-workers`` section on real worker processes with nannies
(docs/paused-workers.md).

A task leaks memory outside Dask's data (:mod:`leak_support`) until its worker pauses.
Without the section the workload stalls; with it, the worker's keys are copied away,
it is restarted through its nanny, the workload completes, no persisted key is lost and
nothing held elsewhere is recomputed.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from typing import Any

import dask
import leak_support
from amm_policy_support import amm_config, events, holders, no_errors, policy_of
from distributed import Client, LocalCluster
from distributed.diagnostics.plugin import SchedulerPlugin
from distributed.utils_test import async_poll_for, gen_test
from leak_support import held, leaky, worker_config
from retire_support import ReplicaLog

leak_support.ship()

LIMIT = 400 * 2**20
#: Each leaky task leaks this much; its worker pauses (at 50% of 400 MiB) after five.
LEAK_MIB = 30
HELD = [f"held-{i}" for i in range(9)]
SIZE = 100_000
SECTION = """\
paused-workers:
  after: 1s
  action: restart
  require-unmanaged: 40%
  max-paused-fraction: 50%
"""


class Executions(SchedulerPlugin):
    """How often each key started processing, counted on the scheduler."""

    def __init__(self) -> None:
        self.processing: Counter[str] = Counter()

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kw: Any) -> None:
        if finish == "processing":
            self.processing[key] += 1


def process_cluster(n_workers: int = 2) -> LocalCluster:
    """Worker processes with nannies, named 0, 1, ...; see :func:`add_leaky_worker`."""
    return LocalCluster(
        n_workers=n_workers,
        threads_per_worker=1,
        processes=True,
        asynchronous=True,
        dashboard_address=":0",
        memory_limit=LIMIT,
    )


async def add_leaky_worker(cluster: LocalCluster, client: Client, name: str = "leaky") -> str:
    """One more worker like the others, with the resource ``LEAKY``: the leaky tasks run
    there only, and nothing steals them away. Its nanny restarts it with the same name
    and resource. Returns its address."""
    ((_, spec),) = cluster.new_worker_spec().items()
    options = {**spec["options"], "resources": {"LEAKY": 1}, "name": name}
    cluster.worker_spec[name] = {**spec, "options": options}
    await cluster._correct_state()
    await client.wait_for_workers(len(cluster.worker_spec))
    (address,) = [a for a, ws in cluster.scheduler.workers.items() if ws.name == name]
    return address


def write_rules(path: Any, text: str) -> None:
    """Replace the rules file atomically, as docs/policy.md asks."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


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
        await asyncio.sleep(0.1)
    raise AssertionError(f"neither finished nor stalled after {limit}s")


def steps(s: Any, worker: str | None = None) -> list[str]:
    return [
        e["step"] for e in events(s, "paused-worker") if worker is None or e["worker"] == worker
    ]


@gen_test(timeout=120)
async def test_a_leaking_worker_stalls_the_workload_until_the_section_restarts_it(tmp_path):
    rules_file = tmp_path / "rules.yaml"
    write_rules(rules_file, "version: 1\n")
    config = {
        **amm_config(str(rules_file)),
        "distributed.scheduler.active-memory-manager.interval": 0.1,
        **worker_config(pause=0.5),
    }
    with dask.config.set(config):
        async with process_cluster() as cluster, Client(cluster, asynchronous=True) as c:
            s = cluster.scheduler
            leaker = await add_leaky_worker(cluster, c)
            executions = Executions()
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
            work = [c.submit(leaky, i, LEAK_MIB, resources={"LEAKY": 1}) for i in range(8)]
            await async_poll_for(lambda: s.workers[leaker].status.name == "paused", 30)

            # 1. Without the section: stalled, the worker staying paused.
            assert await stalled(work)
            assert s.workers[leaker].status.name == "paused"
            assert steps(s) == []

            # 2. With it (the rules file is reloaded): the worker is emptied, restarted
            #    and the workload completes.
            log = ReplicaLog(s)
            write_rules(rules_file, "version: 1\n" + SECTION)
            assert await asyncio.wait_for(c.gather(work), 60) == list(range(8))
            await async_poll_for(lambda: "restarted" in steps(s), timeout=30)
            assert steps(s, leaker) == ["paused", "evacuating", "restarting", "restarted"]
            assert leaker not in s.workers
            await async_poll_for(lambda: len(s.workers) == 3, timeout=30)
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
