"""Rebalancing stays out of the way where a move relieves nothing: a worker at its spill
threshold receives nothing (it would push as much to its disk), and keys too small to
change any worker's memory never move (the planner's side is in
tests/engine/rebalance/test_plan.py). And where a move relieves a worker, the relief
comes at once: the sender's copy is dropped by an early cycle when the copy lands.

The thresholds are the scheduler's ``distributed.worker.memory.target`` and ``.spill``;
here the workers keep their data in a plain dict (``worker_kwargs``: nothing a memory
monitor can spill), so that the scheduler's view alone decides: in-process workers share
the test process's memory, hundreds of MiB, so each is far above 70% of a 10 MiB limit
by process memory.
"""

from __future__ import annotations

import dask
import numpy as np
from distributed.scheduler import MemoryState
from distributed.utils_test import gen_cluster

from amm_rules.engine.adapters import headroom
from amm_rules.engine.rebalance.plan import SPILLING, TOO_SMALL
from amm_rules.engine.rebalance.rebalancer import spill_thresholds
from benchmarks.support.waiting import wait_cycles, wait_for
from tests.support.cluster import LONG_INTERVAL, amm_config, holders, keep, policy_of, rules

MiB = 2**20
LIMIT = 10 * MiB
KEY = 100_000
WORKERS = {"memory_limit": LIMIT, "data": dict}


def config(**entries: float | bool) -> dict[str, object]:
    section = {"measure": "managed", "sender-min": "10%"}
    out = amm_config(rules(rebalance=section), summary_interval=0)
    out.update({f"distributed.worker.memory.{k}": v for k, v in entries.items()})
    out["distributed.worker.memory.terminate"] = False
    return out


def test_headroom_is_the_nearer_threshold() -> None:
    mem = MemoryState(process=500 * MiB, unmanaged_old=100 * MiB, managed=300 * MiB, spilled=0)
    limit = 1000 * MiB
    # target: 600 - 300 MiB of managed memory; spill: 700 - 500 MiB of process memory.
    assert headroom(mem, limit, (0.6, 0.7)) == 200 * MiB
    assert headroom(mem, limit, (0.6, None)) == 300 * MiB
    assert headroom(mem, limit, (0.6, 0.7), delta=50 * MiB) == 150 * MiB
    assert headroom(mem, limit, (None, None)) is None
    assert headroom(mem, 0, (0.6, 0.7)) is None
    with dask.config.set({"distributed.worker.memory.target": False}):
        assert spill_thresholds() == (None, dask.config.get("distributed.worker.memory.spill"))


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 3,
    worker_kwargs=WORKERS,
    config=config(target=False, spill=0.7, pause=False),
    timeout=60,
)
async def test_nothing_moves_to_workers_at_their_spill_threshold(c, s, a, *others):
    data = await c.scatter(
        {f"x-{i}": np.full(KEY // 8, float(i)) for i in range(40)}, workers=[a.address]
    )
    policy = policy_of(s)
    await wait_cycles(s, 10)
    plan = policy.rebalancer.last_plan
    assert plan is not None and plan.roles[a.address] == "sender"
    assert {plan.roles[w.address] for w in others} == {SPILLING}
    assert policy.rebalancer.totals["moves"] == 0
    # The same cluster with the thresholds off: the data moves.
    with dask.config.set({"distributed.worker.memory.spill": False}):
        await wait_for(lambda: policy.rebalancer.totals["done"] >= 5, "moves once nobody spills")
    keep(data)


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 2,
    worker_kwargs=WORKERS,
    config=config(target=False, spill=False, pause=False),
    timeout=60,
)
async def test_tiny_keys_never_move(c, s, a, b):
    # 10,485 B is a thousandth of the limit: nothing smaller moves, not even 17% of the
    # limit in keys of 9,000 B.
    tiny = await c.scatter({f"t-{i}": np.ones(1125) for i in range(200)}, workers=[a.address])
    policy = policy_of(s)
    await wait_cycles(s, 10)
    plan = policy.rebalancer.last_plan
    assert plan is not None and plan.roles[a.address] == "sender"
    assert plan.skipped.get(TOO_SMALL, 0) == 200 and plan.moves == ()
    assert policy.rebalancer.totals["moves"] == 0
    keep(tiny)


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 2,
    worker_kwargs=WORKERS,
    # The periodic cycles a minute apart: only early cycles can finish a move.
    config={
        **config(target=False, spill=False, pause=False),
        "distributed.scheduler.active-memory-manager.interval": LONG_INTERVAL,
    },
    timeout=60,
)
async def test_a_move_whose_copy_landed_drops_the_senders_copy_at_once(c, s, a, b):
    data = await c.scatter(
        {f"x-{i}": np.full(KEY // 8, float(i)) for i in range(40)}, workers=[a.address]
    )
    policy = policy_of(s)
    await c.amm.run_once()  # the moves' copies are asked for here ...
    assert policy.rebalancer.totals["moves"] > 0
    moved = policy.rebalancer.totals["moves"]
    # ... and their drops follow in early cycles, long before the next periodic one.
    await wait_for(
        lambda: (
            policy.rebalancer.totals["drops"] == moved
            and sum(b.address in holders(s, k) for k in data) == moved
            and all(len(holders(s, k)) == 1 for k in data)
        ),
        "every move's drop made: each key once, the moved ones on b",
        show=lambda: dict(policy.rebalancer.totals),
    )
    reasons = {r for _, rs in policy.early.history for r in rs}
    assert "move-landed" in reasons
    keep(data)
