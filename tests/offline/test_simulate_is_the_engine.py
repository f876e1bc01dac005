"""One cycle of the simulator is one cycle of the engine, on random clusters.

Each example (hypothesis) draws workers (hosts, a GPU resource or not), keys (prefix,
size, which workers hold them) and rules (``replicate`` exact, ``{min, max}`` or ``all``,
``pool``/``avoid`` on two pools, ``spread: host``, ``move: never``, reduce-replicas on or
off, rebalancing on or off), starts a real scheduler and workers with that state, dumps
it with ``Client.dump_cluster_state``, and runs one cycle twice: the real
:class:`~amm_rules.engine.policy.RulesPolicy` under a real Active Memory Manager on the
scheduler, and the :class:`~amm_rules.offline.simulate.Simulation` of the dump. What
each asked the workers for (copies and drops, by worker and key) must be the same.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections import Counter
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import dask
from distributed import Client, Scheduler, Worker
from distributed.active_memory_manager import ActiveMemoryManagerExtension
from hypothesis import event, given, settings
from hypothesis import strategies as st

from amm_rules.engine.policy import RulesPolicy
from amm_rules.language.loader import load_ruleset
from amm_rules.offline.dump import read_dump
from amm_rules.offline.sim_cluster import SimCluster
from amm_rules.offline.simulate import Simulation
from benchmarks.support.waiting import wait_for
from tests.support.dumps import CONFIG, KB, MEASURE, array

HOSTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
PREFIXES = ("a", "b", "c")
INTERVAL = 2.0
#: Bytes of each worker's own key, per worker (more than all the drawn keys together).
BALLAST = 1_000 * KB
#: Workers' memory limit: their keys are percents of it (rebalancing's thresholds).
LIMIT = 50_000 * KB

#: (host index, GPU or not) per worker.
workers_ = st.lists(st.tuples(st.integers(0, 2), st.booleans()), min_size=2, max_size=5)
#: (prefix index, holders as a bit mask of the workers, size in KB) per key.
keys_ = st.lists(
    st.tuples(st.integers(0, 2), st.integers(1, 31), st.integers(1, 40)), min_size=2, max_size=8
)
#: (prefix index, replicate kind, n, pool, avoid, spread, move) per rule.
rules_ = st.lists(
    st.tuples(
        st.integers(0, 2),
        st.integers(0, 3),
        st.integers(1, 3),
        st.sampled_from([None, "gpu", "edge"]),
        st.sampled_from([None, "gpu", "edge"]),
        st.booleans(),
        st.sampled_from([None, None, None, "never"]),
    ),
    min_size=2,
    max_size=3,
)


def rules_of(specs: list[tuple[Any, ...]], reduce: bool, rebalance: bool) -> dict[str, Any]:
    rules = []
    for i, (prefix, kind, n, pool, avoid, spread, move) in enumerate(specs):
        rule: dict[str, Any] = {"name": f"r{i}", "match": f'task.prefix == "{PREFIXES[prefix]}"'}
        if kind == 1:
            rule["replicate"] = n
        elif kind == 2:
            rule["replicate"] = {"min": n, "max": n + 1}
        elif kind == 3:
            rule["replicate"] = "all"
        if pool is not None:
            rule["pool"] = pool
        if avoid is not None and avoid != pool:
            rule["avoid"] = avoid
        if spread:
            rule["spread"] = "host"
        if move is not None:
            rule["move"] = move
        if len(rule) == 2:
            rule["replicate"] = n  # a rule sets something
        rules.append(rule)
    out: dict[str, Any] = {
        "version": 1,
        "pools": {"gpu": "worker.resources.GPU >= 1", "edge": f'worker.host == "{HOSTS[2]}"'},
        "reduce-replicas": reduce,
        "rules": rules,
    }
    if rebalance:
        out["rebalance"] = {"measure": MEASURE, "sender-min": "0%", "gap": "1%"}
    return out


async def one_cycle(
    workers: list[tuple[int, bool]],
    keys: list[tuple[int, int, int]],
    rules: dict[str, Any],
    directory: Path,
) -> tuple[Counter[tuple[str, str, Hashable]], Path]:
    """The real scheduler's cycle on the drawn state, and a dump of that state taken
    before it."""
    with dask.config.set(CONFIG):
        async with Scheduler(port=0, dashboard_address=":0", validate=True) as s:
            started = [
                Worker(
                    s.address,
                    host=HOSTS[h],
                    nthreads=1,
                    resources={"GPU": 1} if gpu else {},
                    memory_limit=LIMIT,
                )
                for h, gpu in workers
            ]
            await asyncio.gather(*started)
            try:
                async with Client(s.address, asynchronous=True) as c:
                    await place(c, s, [w.address for w in started], keys)
                    base = directory / "cluster"
                    await c.dump_cluster_state(str(base), format="msgpack")
                    return live_cycle(s, rules), Path(f"{base}.msgpack.gz")
            finally:
                await asyncio.gather(*(w.close() for w in started))


async def place(c: Any, s: Any, addresses: list[str], keys: list[tuple[int, int, int]]) -> None:
    """Each key on exactly the workers its mask names (at least one); and on each worker a
    key of its own, of a size no other worker's memory comes near: the AMM breaks ties
    between workers of equal memory by the order of a set, which two processes need not
    share."""
    futures = [
        c.submit(array, (j + 1) * BALLAST, key=f"z-{j}", workers=[a], pure=False)
        for j, a in enumerate(addresses)
    ]
    await c.gather(futures)
    placed: dict[str, set[str]] = {}
    for i, (prefix, mask, size) in enumerate(keys):
        holders = [a for j, a in enumerate(addresses) if mask >> j & 1] or addresses[:1]
        key = f"{PREFIXES[prefix]}-{i}"
        placed[key] = set(holders)
        future = c.submit(array, size * KB, i, key=key, workers=holders[:1], pure=False)
        await future
        if len(holders) > 1:
            await c.replicate([future], n=len(holders), workers=holders)
        futures.append(future)
    # One wait per example: the test's poll budget is the sum of its deadlines.
    await wait_for(
        lambda: all({ws.address for ws in s.tasks[k].who_has} == h for k, h in placed.items()),
        "every key on exactly its workers",
        timeout=5,
    )
    c.held = futures  # kept until the cycle ran


def live_cycle(s: Any, rules: dict[str, Any]) -> Counter[tuple[str, str, Hashable]]:
    policy = RulesPolicy(rules, audit_interval=None, classify_seconds=None)
    amm = ActiveMemoryManagerExtension(
        s, {policy}, register=False, start=False, measure=MEASURE, interval=INTERVAL
    )
    asked: Counter[tuple[str, str, Hashable]] = Counter()
    s.request_acquire_replicas = lambda addr, keys, stimulus_id: asked.update(
        ("replicate", addr, k) for k in keys
    )
    s.request_remove_replicas = lambda addr, keys, stimulus_id: asked.update(
        ("drop", addr, k) for k in keys
    )
    try:
        amm.run_once()
    finally:
        del s.request_acquire_replicas, s.request_remove_replicas
        policy.detach()
    return asked


def simulated_cycle(rules: dict[str, Any], dump: Path) -> Counter[tuple[str, str, Hashable]]:
    sim = Simulation(
        load_ruleset(rules), SimCluster(read_dump(dump)), measure=MEASURE, interval=INTERVAL
    )
    sim.amm.run_once()
    return Counter(sim.cluster.requested)


@settings(max_examples=40)
@given(workers_, keys_, rules_, st.booleans(), st.booleans())
def test_one_cycle_of_the_simulator_is_one_cycle_of_the_engine(
    workers, keys, specs, reduce, rebalance
) -> None:
    rules = rules_of(specs, reduce, rebalance)
    with tempfile.TemporaryDirectory() as directory:
        live, dump = asyncio.run(one_cycle(workers, keys, rules, Path(directory)))
        predicted = simulated_cycle(rules, dump)
    event("the cycle asked for something" if live else "the cycle asked for nothing")
    assert predicted == live, f"rules: {rules}\nlive: {live}\nsimulated: {predicted}"
