"""A rebalancing move against the moved key's replication target, on real clusters.

A move copies a key to a recipient and drops the sender's copy once the copy landed, so
mid-move the key holds one copy more than before. Two things can come between the copy
and the drop (docs/rebalance.md, "The rules still hold"):

- the sender's copy is in use (a dependent of the key processing there: the drop
  waits) while the key holds more copies than its ``replicate`` allows: the move gives
  way at once and replication trims another copy, never the one that just landed;
- a holder of the key is lost mid-move: dropping the sender's copy would take the key
  below its ``replicate``, so the move gives way and both copies stay.

Each test drives its own Active Memory Manager cycle by cycle (``run_once``), so that
the copy lands, and the world changes, between two chosen cycles.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from distributed import Event
from distributed.active_memory_manager import ActiveMemoryManagerExtension
from distributed.utils_test import gen_cluster

from amm_rules.engine.policy import RulesPolicy
from amm_rules.engine.sections.rebalance import RebalanceSection
from benchmarks.support.waiting import cycle_until, wait_for
from tests.support.cluster import Requests, amm_config, holders, keep, rules
from tests.support.rulesets import PAIR

MiB = 2**20
LIMIT = 10 * MiB
#: Bytes of one key (a numpy array: its nbytes are exact).
KEY = 100_000
#: ``pair-*`` keys at two copies; a rebalance section that moves one key per cycle.
RULES = rules(
    PAIR,
    rebalance={"measure": "managed", "sender-min": "10%", "max-bytes-per-cycle": KEY},
)
CONFIG = {
    **amm_config(None, start=False),
    # The worker's memory monitor reads process memory, shared by in-process workers.
    **{f"distributed.worker.memory.{name}": False for name in ("target", "spill", "pause")},
}


def array(i: int) -> np.ndarray:
    return np.full(KEY // 8, float(i))


def read(x: np.ndarray, name: str) -> float:
    """A dependent of ``x`` that runs until the event ``name`` is set."""
    Event(name).wait()
    return float(x[0])


#: The clusters of these tests: four one-thread workers with a small memory limit.
four_workers = gen_cluster(
    client=True,
    nthreads=[("", 1)] * 4,
    worker_kwargs={"memory_limit": LIMIT},
    config=CONFIG,
    timeout=120,
)


async def _moving_pair(c: Any, s: Any, a: Any) -> tuple[RulesPolicy, Any, Any, Any, str, Any]:
    """``pair-0`` at its two copies, one on ``a``; then ballast on ``a`` makes it the
    sender, and a cycle starts moving ``pair-0`` (``a``'s oldest key). Returns the policy,
    its manager, the key's future, the move in flight, the key's other holder and the
    ballast's futures."""
    policy = RulesPolicy(RULES)
    amm = ActiveMemoryManagerExtension(s, {policy}, register=False, start=False)
    pair = (await c.scatter({"pair-0": array(0)}, workers=[a.address]))["pair-0"]
    await cycle_until(amm, lambda: len(holders(s, "pair-0")) == 2, "pair-0 at two copies")
    (other,) = holders(s, "pair-0") - {a.address}
    ballast = await c.scatter({f"ballast-{i}": array(i) for i in range(20)}, workers=[a.address])
    await cycle_until(amm, lambda: "pair-0" in policy.rebalancer.book.pending, "pair-0 moving")
    move = policy.rebalancer.book.pending["pair-0"]
    assert move.sender == a.address
    assert move.recipient != other
    return policy, amm, pair, move, other, ballast


@four_workers
async def test_a_move_whose_sender_copy_is_in_use_gives_way_to_the_max(c, s, a, b, w1, w2):
    """The copy lands while a dependent of the key runs on the sender: the sender's copy
    cannot go, and the key holds three copies against ``replicate: 2``. The move is
    given up and replication trims the third copy at once, neither on the busy sender
    nor the copy that just landed; the key is not moved again while it cools down."""
    policy, amm, pair, move, other, ballast = await _moving_pair(c, s, a)
    requests = Requests(s)
    done = Event("reader-done")
    reader = c.submit(read, pair, "reader-done", key="reader", workers=[a.address])
    await wait_for(
        lambda: getattr(a.state.tasks.get("reader"), "state", None) == "executing",
        "the reader running on the sender",
    )
    await wait_for(lambda: move.recipient in holders(s, "pair-0"), "the copy landed")
    assert len(holders(s, "pair-0")) == 3

    await cycle_until(
        amm,
        lambda: holders(s, "pair-0") == {a.address, move.recipient},
        "pair-0 back at two copies: the sender's (in use) and the new one",
        timeout=10,
        show=lambda: (
            holders(s, "pair-0"),
            policy.section(RebalanceSection).explain(s.tasks["pair-0"], time.monotonic()),
        ),
    )
    assert requests.of("pair-0") == ({}, {other: 1})
    assert policy.rebalancer.void_reasons == {
        "sender's copy in use while the key is above its replication target": 1
    }
    assert policy.section(RebalanceSection).explain(s.tasks["pair-0"], time.monotonic()) == {
        "moving": False,
        "cooling": True,
    }

    await done.set()
    assert await reader == 0.0
    for _ in range(10):
        amm.run_once()
    assert requests.of("pair-0") == ({}, {other: 1})
    assert holders(s, "pair-0") == {a.address, move.recipient}
    keep(ballast)
    policy.detach()


@four_workers
async def test_a_move_that_would_leave_the_key_below_its_target_gives_way(c, s, a, b, w1, w2):
    """The copy lands, then the key's other holder dies before the next cycle: the key
    holds its two copies, the sender's and the new one. Dropping the sender's copy would
    leave one, below ``replicate: 2``: the move is given up, both copies stay, and
    nothing is copied again."""
    policy, amm, pair, move, other, ballast = await _moving_pair(c, s, a)
    victim = next(w for w in (b, w1, w2) if w.address == other)
    await wait_for(lambda: move.recipient in holders(s, "pair-0"), "the copy landed")
    requests = Requests(s)
    await victim.close()
    await wait_for(lambda: other not in s.workers, "the other holder gone")
    assert holders(s, "pair-0") == {a.address, move.recipient}

    for _ in range(10):
        amm.run_once()
        assert len(holders(s, "pair-0")) >= 2, "the key went below its target"
    assert requests.of("pair-0") == ({}, {})
    assert holders(s, "pair-0") == {a.address, move.recipient}
    assert policy.rebalancer.void_reasons == {
        "sender's copy needed by the key's replication target": 1
    }
    assert float((await pair)[0]) == 0.0
    keep(ballast)
    policy.detach()
