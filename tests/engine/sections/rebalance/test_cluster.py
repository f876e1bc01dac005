"""Rebalancing in RulesPolicy on real clusters (``gen_cluster``, AMM every 50 ms).

Workers run in one process, so process memory says nothing about any one of them: the
rules measure ``managed`` memory (the bytes of the keys each worker holds), against a
small memory limit so that a few 100 kB arrays make meaningful fractions. The worker's
own memory monitor (spill, pause, terminate) is switched off: it reads process memory.
"""

from __future__ import annotations

import os
import time
from collections.abc import Generator
from typing import Any

import numpy as np
import pytest
from distributed import Event
from distributed.active_memory_manager import ActiveMemoryManagerExtension
from distributed.utils_test import BlockedGetData, gen_cluster

from amm_rules.engine.policy import RulesPolicy
from amm_rules.engine.rebalance.plan import WorkerLoad, minimum_bytes_to_balance
from amm_rules.engine.rebalance.rebalancer import READ_SOON
from amm_rules.engine.sections.rebalance import RebalanceSection
from benchmarks.support.waiting import cycle_until, wait_cycles, wait_for
from tests.support.cluster import (
    Requests,
    TransitionCounter,
    amm_config,
    events,
    holders,
    keep,
    policy_of,
    rules,
    skipped,
)
from tests.support.rulesets import GPU, GPU_POOL

#: Run in the version matrix too (.ci/run): the floor and the newest dask/distributed.
pytestmark = pytest.mark.compat

MiB = 2**20
LIMIT = 10 * MiB
#: Bytes of one test key (a numpy array: its nbytes are exact).
KEY = 100_000
AMM = "distributed.scheduler.active-memory-manager"


def config(*entries: dict[str, Any], pools: dict[str, str] | None = None, **rebalance: Any):
    """gen_cluster config: RulesPolicy with a ``rebalance`` section measuring managed
    memory, a ``cycle`` event per busy cycle, and no worker memory monitor."""
    section = {"measure": "managed", "sender-min": "10%", **rebalance}
    out = amm_config(rules(*entries, pools=pools, rebalance=section), summary_interval=0)
    for name in ("target", "spill", "pause", "terminate"):
        out[f"distributed.worker.memory.{name}"] = False
    return out


def array(i: int) -> np.ndarray:
    return np.full(KEY // 8, float(i))


def fractions(s: Any) -> dict[str, float]:
    return {a: ws.memory.managed / ws.memory_limit for a, ws in s.workers.items()}


def spread_ratio(s: Any) -> float:
    """Fullest worker over the mean, as fractions of each worker's limit."""
    f = fractions(s)
    mean = sum(ws.memory.managed for ws in s.workers.values()) / sum(
        ws.memory_limit for ws in s.workers.values()
    )
    return max(f.values()) / mean


def minimum_to_balance(s: Any) -> int:
    return minimum_bytes_to_balance(
        WorkerLoad(a, ws.memory.managed, ws.memory_limit) for a, ws in s.workers.items()
    )


#: What the balance waits are for.
BALANCED = "the fullest worker within 15% of the mean, and the rebalancer settled"
#: The promise while tasks also move data (dependency copies, trimmed afterwards): every
#: worker within gap / 2 of the mean (the default gap, 10%), give or take one key.
IN_BAND = "every worker within gap / 2 of the mean, and the rebalancer settled"


def in_band(s: Any, gap: float = 0.10) -> bool:
    f = fractions(s)
    mean = sum(ws.memory.managed for ws in s.workers.values()) / sum(
        ws.memory_limit for ws in s.workers.values()
    )
    return settled(s) and all(abs(x - mean) <= gap / 2 + KEY / LIMIT for x in f.values())


def state(s: Any) -> Any:
    """What a balance wait shows when it fails: fractions, and the rebalancer's state."""

    def show() -> Any:
        r = policy_of(s).rebalancer
        return {"fractions": fractions(s), "in flight": len(r.book.pending), **r.totals}

    return show


def settled(s: Any) -> bool:
    """Nothing in flight and the last plan found nothing to do."""
    r = policy_of(s).rebalancer
    return r.last_plan is not None and not r.book.pending and not r.last_plan.moves


def observe_copies(policy: Any) -> list[int]:
    """Record, per AMM cycle, the bytes of the copies the AMM accepted from the policy.
    Wraps the policy's ``run`` generator and passes every suggestion and answer through."""
    per_cycle: list[int] = []
    run = policy.run

    def observed() -> Generator[Any, Any, None]:
        gen = run()
        copied = 0
        answer = None
        try:
            while True:
                suggestion = gen.send(answer)
                answer = yield suggestion
                if suggestion.op == "replicate" and answer is not None:
                    copied += suggestion.ts.nbytes
        except StopIteration:
            pass
        per_cycle.append(copied)

    policy.run = observed
    return per_cycle


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 4,
    worker_kwargs={"memory_limit": LIMIT},
    config=config({"name": "pair", "match": 'task.key matches "pair-*"', "replicate": 2}),
    timeout=60,
)
async def test_converges_from_an_imbalance(c, s, a, *others):
    pairs = await c.scatter({f"pair-{i}": array(i) for i in range(5)}, workers=[a.address])
    await wait_for(lambda: all(len(holders(s, k)) == 2 for k in pairs), "pairs at 2 copies")
    data = await c.scatter({f"x-{i}": array(i) for i in range(40)}, workers=[a.address])
    policy = policy_of(s)
    assert fractions(s)[a.address] > 0.4
    needed = minimum_to_balance(s)

    await wait_for(lambda: spread_ratio(s) <= 1.15 and settled(s), BALANCED, show=state(s))
    status = policy.section(RebalanceSection).status()
    # Bytes copied against the least that had to move (each copy is a whole key).
    assert status["totals"]["bytes"] <= 1.2 * needed + KEY
    assert status["totals"]["done"] == status["totals"]["moves"] > 0
    assert status["void_reasons"] == {}
    # A move is a copy and a drop: every key keeps its number of copies.
    assert all(len(holders(s, k)) == 1 for k in data)
    assert all(len(holders(s, k)) == 2 for k in pairs)
    assert policy.totals["pair"]["dropped"] == 0
    assert [float(x[0]) for x in await c.gather(list(data.values()))] == list(range(40))

    # Reported: counters under (rebalance), a rebalance section in the cycle event.
    assert policy.totals["(rebalance)"]["requested"] == status["totals"]["moves"]
    cycle = [e for e in events(s, "cycle") if e.get("rebalance", {}).get("moves")]
    assert cycle and cycle[0]["rebalance"]["roles"][a.address] == "sender"
    explained = await c.scheduler.amm_rules_explain(keys=["x-0", "pair-0"])
    assert explained["x-0"]["rebalance"] in (None, {"moving": False, "cooling": True})


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 3,
    worker_kwargs={"memory_limit": LIMIT},
    # The AMM starts once all the data is in place.
    config={**config(**{"sender-min": "0%", "gap": "10%"}), f"{AMM}.start": False},
)
async def test_no_movement_inside_the_gap(c, s, a, b, w):
    # 11%, 10% and 9% of the limit against a mean of 10%: all within gap / 2.
    futures = []
    for worker, n in ((a, 11), (b, 10), (w, 9)):
        size = int(LIMIT * n / 100 / 10) // 8
        data = {f"{worker.name}-{i}": np.ones(size) for i in range(10)}
        futures += (await c.scatter(data, workers=[worker.address])).values()
    before = {k: holders(s, k) for k in s.tasks}
    policy = policy_of(s)
    cycles = policy.cycles
    await c.amm.start()
    await wait_for(lambda: policy.cycles >= cycles + 10, "ten cycles")
    assert {k: holders(s, k) for k in s.tasks} == before
    assert policy.rebalancer.totals["moves"] == 0
    assert set(policy.rebalancer.last_plan.roles.values()) == {"within gap"}
    keep(futures)


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 4,
    worker_kwargs={"memory_limit": LIMIT},
    config=config(**{"max-bytes-per-cycle": 3 * KEY + KEY // 2}),
)
async def test_budget_is_respected_every_cycle(c, s, a, *others):
    per_cycle = observe_copies(policy_of(s))
    data = await c.scatter({f"x-{i}": array(i) for i in range(40)}, workers=[a.address])
    await wait_for(lambda: settled(s) and spread_ratio(s) <= 1.15, BALANCED, show=state(s))
    # 3.5 keys of budget: three whole keys per cycle, never more, over several cycles.
    assert max(per_cycle) == 3 * KEY
    assert sum(1 for b in per_cycle if b) >= 30 // 3
    assert all(len(holders(s, k)) == 1 for k in data)


@gen_cluster(
    client=True,
    nthreads=[("", 1, GPU), ("", 1, GPU), ("", 1), ("", 1)],
    worker_kwargs={"memory_limit": LIMIT},
    config=config(
        {"name": "frozen", "match": 'task.key matches "frozen-*"', "move": "never"},
        {"name": "device", "match": 'task.key matches "gpu-*"', "pool": "gpu"},
        pools=GPU_POOL,
        match='not (task.key matches "pinned-*")',
    ),
)
async def test_pools_move_never_and_match_are_respected(c, s, g1, g2, w1, w2):
    # Oldest keys are offered first: the frozen and pinned ones, then the pool's, then free.
    futures = {}
    for prefix, n in (("frozen", 8), ("pinned", 8), ("gpu", 16), ("x", 16)):
        data = {f"{prefix}-{i}": array(i) for i in range(n)}
        futures.update(await c.scatter(data, workers=[g1.address]))
    policy = policy_of(s)
    await wait_for(
        lambda: settled(s) and policy.rebalancer.totals["moves"] > 0, "moves done, then settled"
    )

    where = {k: holders(s, k) for k in s.tasks}
    assert all(where[f"frozen-{i}"] == {g1.address} for i in range(8))
    assert all(where[f"pinned-{i}"] == {g1.address} for i in range(8))
    assert all(len(where[f"gpu-{i}"]) == 1 for i in range(16))
    gpu_moved = {next(iter(where[f"gpu-{i}"])) for i in range(16)} - {g1.address}
    assert gpu_moved == {g2.address}, "pool keys move inside the pool only"
    assert any(where[f"x-{i}"] & {w1.address, w2.address} for i in range(16))

    reasons = skipped(s)
    assert reasons["move: never (rule frozen)"] > 0
    assert reasons["outside rebalance.match"] > 0
    keep(futures)


def slow_sum(x: np.ndarray) -> float:
    time.sleep(0.02)  # work: a reader that takes a while
    return float(x.sum())


def gated_sum(x: np.ndarray) -> float:
    Event("readers-go").wait()
    return float(x.sum())


def make(i: int) -> np.ndarray:
    return array(i)


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 4,
    worker_kwargs={"memory_limit": LIMIT},
    # The AMM starts once the data and its first readers are in place.
    config={**config(**{"max-bytes-per-cycle": 4 * KEY}), f"{AMM}.start": False},
    timeout=90,
)
async def test_rebalance_while_computing_erres_and_recomputes_nothing(c, s, a, *others):
    counter = TransitionCounter.on(s)
    go = Event("readers-go")
    # Readers of the first quarter are submitted with the data and held until rebalance
    # has run: the keys they read are not moved while the others are. (The data goes
    # first: a blocked reader holds the worker's only thread.)
    keys = [f"data-{i}" for i in range(40)]
    data = c.map(make, range(40), key=keys, workers=[a.address], priority=10)
    first = c.map(gated_sum, data[:10], key=[f"first-{i}" for i in range(10)])
    await wait_for(
        lambda: all(getattr(s.tasks.get(k), "state", None) == "memory" for k in keys),
        "the data computed",
    )
    requests = Requests(s)
    policy = policy_of(s)
    await c.amm.start()
    await wait_for(
        lambda: policy.rebalancer.totals["done"] >= 10 and skipped(s)[READ_SOON] > 0,
        "ten moves done, keys to be read soon skipped",
    )
    # No move of theirs started (a move starts with a copy). A reader that runs on another
    # worker fetched its key there, and reduce-replicas then kept the copy where the
    # reader runs: the stock arithmetic, not a move.
    assert not any(key in keys[:10] for _, key in requests.acquire)
    assert all(holders(s, key) for key in keys[:10])
    await go.set()
    expected = [float(KEY // 8 * i) for i in range(40)]
    assert await c.gather(first) == expected[:10]

    # Waves of readers while rebalance goes on.
    for wave in range(8):
        part = slice(wave % 4 * 10, (wave % 4 + 1) * 10)
        readers = c.map(slow_sum, data[part], key=[f"sum-{wave}-{i}" for i in range(10)])
        assert await c.gather(readers) == expected[part]
        del readers
    await wait_for(lambda: in_band(s), IN_BAND, show=state(s))

    assert not counter.erred
    assert max(counter.processing.values()) == 1, "a key was computed twice"
    assert all(len(holders(s, f.key)) == 1 for f in data)
    assert [float(x[0]) for x in await c.gather(data)] == list(range(40))


def gated_input() -> float:
    Event("input-go").wait()
    return 1.0


def add_sum(x: np.ndarray, y: float) -> float:
    return float(x.sum()) + y


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 4,
    worker_kwargs={"memory_limit": LIMIT},
    config=config(),
    timeout=90,
)
async def test_a_key_whose_dependent_still_waits_stays_put(c, s, a, *others):
    """A dependent waiting for another input will read the key wherever it is then
    scheduled: moving the key now buys nothing, while the other keys move."""
    amm = s.extensions["amm"]
    # Nothing moves before the dependent waits: else x-0 may move first, and the test
    # would see a move that was right when it was made.
    amm.stop()
    data = await c.scatter({f"x-{i}": array(i) for i in range(40)}, workers=[a.address])
    go = Event("input-go")
    other = c.submit(gated_input, key="other-input", workers=[others[0].address])
    waiting = c.submit(add_sum, data["x-0"], other, key="waits")
    await wait_for(
        lambda: "waits" in s.tasks and s.tasks["waits"].state == "waiting", "the dependent waits"
    )
    amm.start()
    policy = policy_of(s)
    await wait_for(
        lambda: policy.rebalancer.totals["done"] >= 10 and skipped(s)[READ_SOON] > 0,
        "ten moves done, the key to be read skipped",
        show=lambda: (policy.section(RebalanceSection).status()["totals"], dict(skipped(s))),
    )
    assert holders(s, "x-0") == {a.address}
    await go.set()
    assert await waiting == float(KEY // 8 * 0) + 1.0
    del waiting, other
    await wait_for(lambda: in_band(s), IN_BAND, show=state(s))
    keep(data)


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 4,
    Worker=BlockedGetData,
    worker_kwargs={"memory_limit": LIMIT},
    config=config(),
    timeout=120,
)
async def test_recipient_dying_mid_move_loses_nothing(c, s, a, b, w1, w2):
    for worker in (b, w1, w2):
        worker.block_get_data.set()
    data = await c.scatter({f"x-{i}": array(i) for i in range(40)}, workers=[a.address])
    policy = policy_of(s)
    # The sender does not answer: the copies stay in flight.
    await a.in_get_data.wait()
    await wait_for(
        lambda: any(p.recipient == b.address for p in policy.rebalancer.book.pending.values()),
        "a move to b in flight",
    )
    await b.close()
    await wait_for(lambda: b.address not in s.workers, "b gone")
    await wait_for(
        lambda: policy.rebalancer.void_reasons["recipient left the cluster"] > 0,
        "the moves to b given up",
    )
    assert all(holders(s, k) for k in data), "a key lost its last copy"

    a.block_get_data.set()
    await wait_for(lambda: settled(s) and spread_ratio(s) <= 1.15, BALANCED, show=state(s))
    assert all(len(holders(s, k)) == 1 for k in data)
    assert [float(x[0]) for x in await c.gather(list(data.values()))] == list(range(40))


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 3,
    worker_kwargs={"memory_limit": LIMIT},
    config=config(),
    timeout=90,
)
async def test_sender_dying_after_the_copy_landed_loses_nothing(c, s, a, b, w):
    """The sender dies while moves are under way: every key whose copy had landed on
    its recipient survives there (a move copies first and drops the sender's copy
    last), with its data; only keys whose single copy was still on the sender are
    lost, as they would be without rebalancing."""
    requests = Requests(s)
    data = await c.scatter({f"x-{i}": array(i) for i in range(30)}, workers=[a.address])
    policy = policy_of(s)
    await wait_for(lambda: policy.rebalancer.totals["done"] >= 5, "five moves done")
    landed = {k: holders(s, k) - {a.address} for k in data}
    landed = {k: where for k, where in landed.items() if where}
    assert landed
    await a.close()
    await wait_for(lambda: a.address not in s.workers, "the sender gone")
    await wait_cycles(s, 5)  # the engine lives through the loss
    # Every copy is one the rebalancer asked for.
    sent_to = {k: {addr for addr, key in requests.acquire if key == k} for k in data}
    assert all(where <= sent_to[k] for k, where in landed.items())
    survivors = {k for k in data if holders(s, k)}
    assert set(landed) <= survivors, "a key whose copy had landed was lost"
    assert all(holders(s, k) <= sent_to[k] for k in survivors)
    values = await c.gather([data[k] for k in sorted(survivors)])
    assert [float(v[0]) for v in values] == [float(k.split("-")[1]) for k in sorted(survivors)]


REBALANCE_FILE = """\
version: 1
rebalance:
  enabled: {enabled}
  measure: managed
  sender-min: 10%
"""


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 3,
    Worker=BlockedGetData,
    worker_kwargs={"memory_limit": LIMIT},
    config={**config(), **amm_config(None, start=False)},
    timeout=60,
)
async def test_moves_in_flight_are_finished_after_a_reload_turns_rebalance_off(
    c, s, a, b, w, tmp_path
):
    for worker in (b, w):
        worker.block_get_data.set()
    path = tmp_path / "rules.yaml"
    path.write_text(REBALANCE_FILE.format(enabled="true"))
    policy = RulesPolicy(str(path))
    amm = ActiveMemoryManagerExtension(s, {policy}, register=False, start=False)
    data = await c.scatter({f"x-{i}": array(i) for i in range(30)}, workers=[a.address])
    amm.run_once()
    started = policy.rebalancer.totals["moves"]
    assert started > 0 and len(policy.rebalancer.book.pending) == started
    await a.in_get_data.wait()  # the copies are stuck on the sender
    moving = next(iter(policy.rebalancer.book.pending.values()))
    explained = (await s.handlers["amm_rules_explain"](keys=[moving.key]))[moving.key]["rebalance"]
    assert explained["moving"] and not explained["landed"]
    assert (explained["sender"], explained["recipient"]) == (a.address, moving.recipient)
    status = s.handlers["amm_rules_status"]()["rebalance"]
    assert status["in_flight"] == started and status["in_flight_bytes"] == started * KEY

    # Atomic replace: a new inode, so the reload is seen even within the same mtime tick.
    tmp = tmp_path / "rules.tmp"
    tmp.write_text(REBALANCE_FILE.format(enabled="false"))
    os.replace(tmp, path)
    # (Read in a thread: installed by the cycle that finds it read.)
    await cycle_until(amm, lambda: not policy.ruleset.rebalance.enabled, "the reload")
    assert len(policy.rebalancer.book.pending) == started, "moves in flight are kept"

    a.block_get_data.set()
    await cycle_until(amm, lambda: not policy.rebalancer.book.pending, "the moves in flight done")
    # Each move finished: a copy landed and the sender's copy was dropped; none started.
    assert policy.rebalancer.totals["done"] == started == policy.rebalancer.totals["moves"]
    assert all(len(holders(s, k)) == 1 for k in data)
    assert sum(a.address in holders(s, k) for k in data) == 30 - started
    policy.detach()
