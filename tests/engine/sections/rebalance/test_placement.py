"""Rebalancing on real clusters, where placement constrains it (docs/rebalance.md, "The
rules still hold"): ``spread: host`` keys are not moved onto a host that already holds
one of their copies, and a worker being retired takes no part while moves go on.

In-process workers, ``managed`` memory (see ``test_rebalance_cluster.py`` for why);
``tests/engine/sections/rebalance/test_processes.py`` runs the default ``optimistic`` measure on
worker processes.
"""

from __future__ import annotations

import asyncio
from typing import Any

from distributed.core import Status
from distributed.utils_test import gen_cluster

from amm_rules.engine.sections.rebalance import RebalanceSection
from benchmarks.support.retire import ReplicaLog
from benchmarks.support.waiting import wait_for
from tests.support.cluster import Requests, amm_config, holders, keep, policy_of
from tests.support.rulesets import rule, rules

MiB = 2**20
LIMIT = 10 * MiB
#: Bytes of one test key.
KEY = 100_000
SPREAD = rule("spread", "pair-*", replicate=2, spread="host")


def config(*entries: dict[str, Any], **rebalance: Any) -> dict[str, Any]:
    section = {"measure": "managed", "sender-min": "10%", **rebalance}
    out = amm_config(rules(*entries, rebalance=section), summary_interval=0)
    for name in ("target", "spill", "pause", "terminate"):
        out[f"distributed.worker.memory.{name}"] = False
    return out


def blob(i: int) -> bytes:
    return bytes([i % 256]) * KEY


def settled(s: Any) -> bool:
    r = policy_of(s).rebalancer
    return r.last_plan is not None and not r.book.pending and not r.last_plan.moves


@gen_cluster(
    client=True,
    nthreads=[("127.0.0.1", 1), ("127.0.0.1", 1), ("127.0.0.2", 1), ("127.0.0.2", 1)],
    worker_kwargs={"memory_limit": LIMIT},
    config=config(SPREAD),
    timeout=90,
)
async def test_spread_host_keys_never_move_onto_a_host_holding_a_copy(c, s, a1, a2, b1, b2):
    """Host 1 is full (a1, a2), host 2 empty (b1, b2). Pairs keep a copy on each host:
    their copies on host 1 may not go to host 2, which holds the other copy, so only
    the free keys move there."""
    assert {w.address.split(":")[1] for w in (b1, b2)} == {"//127.0.0.2"}
    pairs = await c.scatter({f"pair-{i}": blob(i) for i in range(6)}, workers=[a1.address])
    await wait_for(
        lambda: all(
            {s.workers[h].host for h in holders(s, k)} == {"127.0.0.1", "127.0.0.2"} for k in pairs
        ),
        "each pair on both hosts",
    )
    # From now on, note where every copy lands.
    log = ReplicaLog(s)
    free = {}
    for w in (a1, a2):
        data = {f"free-{w.name}-{i}": blob(i) for i in range(20)}
        free.update(await c.scatter(data, workers=[w.address]))
    policy = policy_of(s)
    await wait_for(
        lambda: policy.rebalancer.totals["done"] > 0 and settled(s), "moves done, then settled"
    )
    # Host 2 received free keys, and not one copy of a pair: each pair has one there.
    host2 = {b1.address, b2.address}
    assert {addr for key in pairs for addr in log.added[key]} & host2 == set()
    moved = [k for k in free if holders(s, k) & host2]
    assert moved and all(len(holders(s, k)) == 1 for k in free)
    for k in pairs:
        assert {s.workers[h].host for h in holders(s, k)} == {"127.0.0.1", "127.0.0.2"}, k
    keep(pairs, free)


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 4,
    worker_kwargs={"memory_limit": LIMIT},
    config=config(**{"max-bytes-per-cycle": 3 * KEY}),
    timeout=120,
)
async def test_a_worker_retiring_mid_rebalance_takes_no_part_and_loses_nothing(c, s, a, b, w3, w4):
    """While a's data is spread out a few keys per cycle, a recipient is retired: it is
    sent nothing more, its keys (moved there, or in flight) are not lost, and the rest
    balances among the workers that stay."""
    data = await c.scatter({f"x-{i}": blob(i) for i in range(40)}, workers=[a.address])
    policy = policy_of(s)
    await wait_for(
        lambda: any(b.address in holders(s, k) for k in data) and policy.rebalancer.book.pending,
        "b received keys, moves in flight",
    )
    requests = Requests(s)
    retiring = asyncio.create_task(c.retire_workers([b.address]))
    await wait_for(
        lambda: (
            s.workers.get(b.address) is None
            or s.workers[b.address].status == Status.closing_gracefully
        ),
        "b retiring",
    )
    requests.clear()  # (copies asked before the retirement began may still land)
    await retiring
    assert b.address not in s.workers
    await wait_for(
        lambda: settled(s),
        "settled",
        show=lambda: policy.section(RebalanceSection).status()["totals"],
    )
    assert not any(addr == b.address for addr, _ in requests.acquire)
    assert all(len(holders(s, k)) == 1 for k in data), "a key lost, or left with two copies"
    assert sum(a.address in holders(s, k) for k in data) < 40
    values = await c.gather(list(data.values()))
    assert values == [blob(i) for i in range(40)]
