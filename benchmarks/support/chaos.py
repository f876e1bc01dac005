"""Chaos on a real cluster, shared by ``tests/engine/policy/test_chaos.py`` (short rounds in CI) and
``benchmarks/soak.py`` (minutes of rounds); cluster helpers from :mod:`tests.support.cluster`.

The data are *held keys*: each computed by :func:`produce` under its own key, which
counts its executions in :data:`EXECUTIONS` (workers run in this process), so a key
computed twice, that is, recomputed after its copies were lost, shows. A computation
of :func:`combine` tasks over them runs while workers die, pause, retire or join.

:func:`kill_round` is one round: kill the busiest holders without warning, check that
no held key lost its data, wait until the targets hold again (to what the surviving
workers allow) and count the AMM cycles that took.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from amm_rules.engine.sections.rebalance import RebalanceSection
from benchmarks.support.cluster import copies, policy_of
from benchmarks.support.waiting import BUDGET, wait_for

#: Seconds :func:`wait_for_targets` waits at most, whatever its cycle bound: the cycle
#: bound is what the test asserts; this only ends a wait on an AMM that stopped cycling.
TARGETS_TIMEOUT = 30.0
#: Seconds for a step of a round (the computation starting, the victims gone).
STEP_TIMEOUT = 10.0

#: key -> number of times its task ran, for every key computed by produce().
EXECUTIONS: Counter[str] = Counter()
_LOCK = threading.Lock()


def produce(name: str, size: int = 1_000) -> bytes:
    """The data of a held key; counts the call under the key's own name."""
    with _LOCK:
        EXECUTIONS[name] += 1
    return name.encode().ljust(size, b".")


def combine(a: bytes, b: bytes, delay: float = 0.02) -> int:
    """A dependent of two held keys: a little work, so that the computation overlaps
    the chaos, and an answer that is easy to check."""
    time.sleep(delay)
    return len(a) + len(b) + a[:8].count(b"h")


def expected_combine(a: str, b: str, size: int) -> int:
    return 2 * size + a.encode()[:8].count(b"h")


def held_rules(n: int, prefix: str = "held-") -> dict[str, Any]:
    return {
        "version": 1,
        "rules": [{"name": "held", "match": f'task.key matches "{prefix}*"', "replicate": n}],
    }


#: Worker statuses whose copies do not count toward a target.
LEAVING = frozenset({"closing", "closing_gracefully", "closed"})


def lost(s: Any, keys: Iterable[Hashable]) -> list[Hashable]:
    """Held keys that are no longer in memory anywhere."""
    return [k for k in keys if copies(s, k) == 0]


def busiest_holders(s: Any, keys: Sequence[Hashable], n: int = 1) -> list[str]:
    """Addresses of the ``n`` workers holding the most held keys."""
    wanted = set(keys)
    load = {a: sum(ts.key in wanted for ts in ws.has_what) for a, ws in s.workers.items()}
    return sorted(load, key=lambda a: (-load[a], a))[:n]


async def wait_for_targets(
    s: Any,
    keys: Sequence[Hashable],
    n: int,
    max_cycles: int,
    pause: float = 0.01,
    since: int | None = None,
    timeout: float = TARGETS_TIMEOUT,
    repaired: list[int] | None = None,
) -> int:
    """Wait until every key holds ``min(n, workers not leaving)`` copies; return the AMM
    cycles that took, counted from now or from the policy's cycle count ``since``.
    Fails after ``max_cycles`` cycles, or ``timeout`` seconds. With ``repaired``, also
    append the cycles until no key was below that goal any more (extra copies, such as
    those a computation fetched, may take longer to trim)."""
    policy = policy_of(s)
    start = policy.cycles if since is None else since
    BUDGET.charge(timeout)
    deadline = time.monotonic() + timeout
    while True:
        # (A worker that just joined may still be "init"; one retiring does not count.)
        goal = min(n, sum(ws.status.name not in LEAVING for ws in s.workers.values()))
        held = [copies(s, k) for k in keys]
        if repaired is not None and len(repaired) == 0 and min(held, default=goal) >= goal:
            repaired.append(policy.cycles - start)
        if all(count == goal for count in held):
            return policy.cycles - start
        if policy.cycles - start > max_cycles or time.monotonic() > deadline:
            counts = Counter(copies(s, k) for k in keys)
            short = {
                k: (
                    copies(s, k),
                    policy.ctx.ledger.copies.get(k),
                    policy.ctx.ledger.backoffs.get(k),
                    policy.section(RebalanceSection).explain(s.tasks[k], time.monotonic()),
                )
                for k in keys
                if copies(s, k) != goal
            }
            raise AssertionError(
                f"targets not restored after {policy.cycles - start} cycles (bound "
                f"{max_cycles}, or {timeout} s): copies {dict(counts)}, "
                f"goal {goal}; (copies, in flight, backing off, rebalancing): {short}"
            )
        await asyncio.sleep(pause)


def _abort_comms(w: Any) -> None:
    comms = list(getattr(w, "_comms", ()))
    pool = getattr(w, "rpc", None)
    for group in (getattr(pool, "available", {}), getattr(pool, "occupied", {})):
        for open_comms in list(group.values()):
            comms.extend(open_comms)
    stream = getattr(w, "batched_stream", None)
    if stream is not None and stream.comm is not None:
        comms.append(stream.comm)
    for comm in comms:
        comm.abort()


async def kill(w: Any) -> None:
    """Kill an in-process worker without warning, as a crashed process dies: its
    connections are cut at once (the OS does that for a dead process; a plain
    ``Worker.close()`` in-process can leave a peer waiting on a half-open
    connection), then it stops. The scheduler is not told first: no retirement."""
    _abort_comms(w)
    await w.close()
    _abort_comms(w)


@dataclass
class ChaosStats:
    rounds: int = 0
    kills: int = 0
    keys: int = 0
    lost: list[Hashable] = field(default_factory=list)
    cycles_to_restore: list[int] = field(default_factory=list)
    #: Cycles until no key was below its target, per round (at most cycles_to_restore).
    cycles_to_repair: list[int] = field(default_factory=list)
    #: Seconds from seeing the lost workers gone (polled every 10 ms) to every target
    #: restored, per round.
    seconds_to_restore: list[float] = field(default_factory=list)
    recomputed: list[str] = field(default_factory=list)
    wrong_results: int = 0
    results_checked: int = 0


async def kill_round(
    c: Any,
    s: Any,
    workers: list[Any],
    held: dict[str, Any],
    n: int,
    stats: ChaosStats,
    kills: int = 1,
    max_cycles: int = 40,
    size: int = 1_000,
) -> None:
    """Start a computation over the held keys, kill the ``kills`` busiest holders
    without warning while it runs, check nothing held was lost, wait for the targets
    and for the computation, and check its results."""
    keys = list(held)
    pairs = [(keys[i], keys[(i * 7 + 3) % len(keys)]) for i in range(len(keys))]
    futures = [
        c.submit(combine, held[a], held[b], key=f"combine-{stats.rounds}-{i}")
        for i, (a, b) in enumerate(pairs)
    ]
    await wait_for(lambda: _started(s, futures), "the computation running", STEP_TIMEOUT)
    victims = [w for w in workers if w.address in busiest_holders(s, keys, kills)]
    # Cycles are counted from the kill: an early cycle may repair before the loop
    # below sees the workers gone.
    since = policy_of(s).cycles
    for w in victims:
        workers.remove(w)
    # No retirement, no warning: the scheduler learns that the copies are gone.
    await asyncio.gather(*(kill(w) for w in victims))
    stats.kills += len(victims)
    await wait_for(
        lambda: not any(w.address in s.workers for w in victims), "the victims gone", STEP_TIMEOUT
    )
    gone = time.monotonic()
    stats.lost += lost(s, keys)
    repaired: list[int] = []
    stats.cycles_to_restore.append(
        await wait_for_targets(s, keys, n, max_cycles, since=since, repaired=repaired)
    )
    stats.cycles_to_repair += repaired
    stats.seconds_to_restore.append(time.monotonic() - gone)
    results = await c.gather(futures)
    stats.results_checked += len(results)
    stats.wrong_results += sum(
        r != expected_combine(a, b, size) for r, (a, b) in zip(results, pairs, strict=True)
    )
    stats.rounds += 1


def _started(s: Any, futures: Iterable[Any]) -> bool:
    """Some task of the computation is processing, or already done."""
    states = (getattr(s.tasks.get(f.key), "state", None) for f in futures)
    return any(state in ("processing", "memory") for state in states)


def recomputed(keys: Iterable[str]) -> list[str]:
    """Held keys whose task ran more than once."""
    with _LOCK:
        return [k for k in keys if EXECUTIONS[k] > 1]


async def make_held(
    c: Any, s: Any, names: Sequence[str], n: int, size: int = 1_000
) -> dict[str, Any]:
    """Compute the held keys and wait until each holds ``n`` copies (or what the
    running workers allow). Returns key -> future (keep it: it keeps the key alive)."""
    with _LOCK:  # a fresh count for this cluster (tests reuse the key names)
        for k in names:
            EXECUTIONS.pop(k, None)
    futures = {k: c.submit(produce, k, size, key=k) for k in names}
    await c.gather(list(futures.values()))
    await wait_for_targets(s, names, n, max_cycles=200)
    return futures
