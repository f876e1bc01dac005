"""The small view of the cluster that the planners read.

:mod:`amm_rules.engine.decide.plan` decides from plain data: a :class:`WorkerView` per worker
and a :class:`KeyView` per key, gathered in a :class:`ClusterView`. Nothing here reads a
scheduler object: :mod:`amm_rules.engine.adapters` builds these views from a live
scheduler, and the same views can be built from a saved cluster state or by hand in
tests. :func:`pool_membership` evaluates the rules' pool expressions on a worker's facts.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Container, Hashable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Literal

from amm_rules.language.ruleset import Desired, Pool, WorkerFacts

WorkerStatus = Literal["running", "paused", "closing"]


@dataclass(frozen=True)
class WorkerView:
    """What the planner knows of one worker."""

    address: str
    host: str = ""
    #: ``"running"`` (may receive copies), ``"paused"`` (holds data, receives nothing)
    #: or ``"closing"`` (retiring or going away: its copies do not count).
    status: WorkerStatus = "running"
    #: Names of the pools the worker belongs to.
    pools: frozenset[str] = frozenset()
    #: Memory in bytes, by the AMM's measure, at the start of the cycle.
    memory: int = 0


@dataclass(frozen=True)
class KeyView:
    """What the planner knows of one key in memory."""

    key: Hashable
    desired: Desired
    #: Addresses of the workers holding a copy.
    holders: frozenset[str]
    nbytes: int = 0
    #: Waiters as the stock ReduceReplicas counts them (see :func:`amm_rules.engine.adapters.stock_waiter_count`).
    waiters: int = 0
    #: Workers where a dependent of the key is processing: the AMM will not drop there.
    busy: frozenset[str] = frozenset()
    #: Copies amm-rules asked for and has not seen land: address -> deadline (the
    #: engine's ledger, brought to the cycle's time: landed, given up and gone ones out).
    inflight: Mapping[str, float] = field(default_factory=dict)
    #: Workers not to ask again before a time, after a copy there timed out, or was
    #: dropped to give the worker room (likewise).
    backoff: Mapping[str, float] = field(default_factory=dict)
    #: Of those, the workers whose copy was dropped to give them room: address -> why.
    dropped: Mapping[str, str] = field(default_factory=dict)
    #: Copies and drops other policies had accepted in this same AMM cycle.
    pending_add: frozenset[str] = frozenset()
    pending_drop: frozenset[str] = frozenset()
    #: Workers whose copy the ``demand:`` hold keeps (a dependent read the key there
    #: recently), or a claim (``protect:``'s copies); heeded for keys without a
    #: replication target only.
    held: frozenset[str] = frozenset()
    #: Copies of the engine's that landed since the key was last planned.
    landed: frozenset[str] = frozenset()


class ClusterView:
    """The workers, with memoized pool arithmetic for one cycle.

    ``memory`` is a running tally: the planner adds a key's size to a worker it sends
    a copy to and takes it from a worker it drops from, as the AMM does, so that
    later choices in the same cycle see earlier ones.
    """

    def __init__(self, workers: Iterable[WorkerView]):
        #: address -> worker
        self.workers: dict[str, WorkerView] = {w.address: w for w in workers}
        #: address -> bytes, updated as the planner decides.
        self.memory: MutableMapping[str, int] = {a: w.memory for a, w in self.workers.items()}
        #: address of every running worker
        self.running: frozenset[str] = frozenset(
            a for a, w in self.workers.items() if w.status == "running"
        )
        #: address of every worker that is retiring or going away
        self.closing: frozenset[str] = frozenset(
            a for a, w in self.workers.items() if w.status == "closing"
        )
        self._derived: dict[tuple[Any, ...], Any] = {}
        self._heaps: dict[tuple[Any, ...], list[tuple[int, str]]] = {}

    def allowed(
        self, pool: tuple[str, ...] | None, avoid: tuple[str, ...] | None
    ) -> frozenset[str]:
        """Workers (any status) in one of ``pool`` (all if None) and in none of ``avoid``."""
        return self._memo(
            ("allowed", pool, avoid),
            lambda: in_pools(((a, w.pools) for a, w in self.workers.items()), pool, avoid),
        )

    def placeable(
        self, pool: tuple[str, ...] | None, avoid: tuple[str, ...] | None
    ) -> frozenset[str]:
        """Allowed workers that are not retiring: where a copy counts toward a target."""
        return self._memo(
            ("placeable", pool, avoid), lambda: self.allowed(pool, avoid) - self.closing
        )

    def recipients(
        self, pool: tuple[str, ...] | None, avoid: tuple[str, ...] | None
    ) -> frozenset[str]:
        """Allowed running workers: where a new copy may be sent."""
        return self._memo(
            ("recipients", pool, avoid), lambda: self.allowed(pool, avoid) & self.running
        )

    def recipient_hosts(
        self, pool: tuple[str, ...] | None, avoid: tuple[str, ...] | None
    ) -> frozenset[str]:
        """Hosts of :meth:`recipients`."""
        return self._memo(
            ("hosts", pool, avoid),
            lambda: frozenset(self.workers[a].host for a in self.recipients(pool, avoid)),
        )

    def least_loaded(
        self,
        pool: tuple[str, ...] | None,
        avoid: tuple[str, ...] | None,
        exclude: Container[str],
        accept: Callable[[str], bool] | None = None,
    ) -> str | None:
        """The recipient (see :meth:`recipients`) with the least memory, ties broken by
        address, that is not in ``exclude`` and passes ``accept``; None if there is none.

        Equivalent to ``min(candidates, key=(memory, address))`` but O(log workers) per
        pick instead of O(workers): one heap per (pool, avoid), with stale entries
        discarded when they surface (every memory change pushes a fresh entry).
        """
        heap = self._heap(pool, avoid)
        memory = self.memory
        skipped = []
        choice = None
        while heap:
            mem, addr = heap[0]
            if mem != memory[addr]:
                heapq.heappop(heap)  # stale: a fresher entry was pushed
            elif addr in exclude or (accept is not None and not accept(addr)):
                skipped.append(heapq.heappop(heap))
            else:
                choice = addr
                break
        for item in skipped:
            heapq.heappush(heap, item)
        return choice

    def add_memory(self, address: str, delta: int) -> None:
        """Change a worker's memory tally (as the AMM does for each accepted action)."""
        value = self.memory[address] = max(0, self.memory[address] + delta)
        for (_, pool, avoid), heap in self._heaps.items():
            if address in self.recipients(pool, avoid):
                heapq.heappush(heap, (value, address))

    def _heap(
        self, pool: tuple[str, ...] | None, avoid: tuple[str, ...] | None
    ) -> list[tuple[int, str]]:
        key = ("heap", pool, avoid)
        heap = self._heaps.get(key)
        if heap is None:
            heap = self._heaps[key] = [(self.memory[a], a) for a in self.recipients(pool, avoid)]
            heapq.heapify(heap)
        return heap

    def _memo(self, key: tuple[Any, ...], compute: Any) -> Any:
        try:
            return self._derived[key]
        except KeyError:
            value = self._derived[key] = compute()
            return value

    def host(self, address: str) -> str:
        return self.workers[address].host

    def __repr__(self) -> str:
        return f"<ClusterView: {len(self.workers)} workers, {len(self.running)} running>"


def in_pools(
    members: Iterable[tuple[str, frozenset[str]]],
    pool: tuple[str, ...] | None,
    avoid: tuple[str, ...] | None,
) -> frozenset[str]:
    """The addresses of ``members`` (address, its pools) in one of ``pool`` (all if
    None) and in none of ``avoid``."""
    want = frozenset(pool) if pool is not None else None
    shun = frozenset(avoid or ())
    return frozenset(
        a
        for a, pools in members
        if (want is None or not want.isdisjoint(pools)) and shun.isdisjoint(pools)
    )


def pool_membership(
    facts: WorkerFacts, pools: Mapping[str, Pool], on_error: Any = None
) -> frozenset[str]:
    """Names of the pools whose expression holds for a worker.

    An expression that raises counts as "not in the pool"; ``on_error(pool, exc)`` is
    called so that the caller can report it (once).
    """
    out = []
    for name, pool in pools.items():
        try:
            inside = bool(pool.predicate(facts))
        except Exception as exc:
            inside = False
            if on_error is not None:
                on_error(pool, exc)
        if inside:
            out.append(name)
    return frozenset(out)


def key_string(key: Hashable) -> str:
    """The string form of a key that matches and explanations use."""
    return key if isinstance(key, str) else str(key)
