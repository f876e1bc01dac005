"""The small view of the cluster that the planner reads, and adapters that build it.

:mod:`amm_rules.engine.planner` decides from plain data: a :class:`WorkerView` per worker and a
:class:`KeyView` per key. This module defines that data and the adapters from the
scheduler's own objects (``WorkerState``, ``TaskState``), duck-typed so that nothing here
imports ``distributed``: the same view can be built from a live scheduler (by
:mod:`amm_rules.engine.policy`), from a saved cluster state, or by hand in tests.

The adapters also give the language half what it reads: :class:`TaskFactsAdapter` has the
attributes of :class:`amm_rules.language.ruleset.TaskFacts` and :func:`worker_facts` returns a
:class:`amm_rules.language.ruleset.WorkerFacts`.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Container, Hashable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Literal

from amm_rules.language.ruleset import Desired, Pool, WorkerFacts

logger = logging.getLogger(__name__)

WorkerStatus = Literal["running", "paused", "closing"]

#: Above this many waiters the stock ReduceReplicas does not look at where they run
#: (the look is costly), and neither do we: the count of waiters is used as is.
WAITERS_LOOKUP_LIMIT = 20


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
    #: Waiters as the stock ReduceReplicas counts them (see :func:`stock_waiter_count`).
    waiters: int = 0
    #: Workers where a dependent of the key is processing: the AMM will not drop there.
    busy: frozenset[str] = frozenset()
    #: Copies amm-rules asked for and has not seen land: address -> deadline.
    inflight: Mapping[str, float] = field(default_factory=dict)
    #: Workers not to ask again before a time, after a copy there timed out.
    backoff: Mapping[str, float] = field(default_factory=dict)
    #: Copies and drops other policies had accepted in this same AMM cycle.
    pending_add: frozenset[str] = frozenset()
    pending_drop: frozenset[str] = frozenset()


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
        self._allowed: dict[tuple[Any, Any], frozenset[str]] = {}
        self._derived: dict[tuple[Any, ...], Any] = {}
        self._heaps: dict[tuple[Any, ...], list[tuple[int, str]]] = {}

    def allowed(
        self, pool: tuple[str, ...] | None, avoid: tuple[str, ...] | None
    ) -> frozenset[str]:
        """Workers (any status) in one of ``pool`` (all if None) and in none of ``avoid``."""
        cache_key = (pool, avoid)
        try:
            return self._allowed[cache_key]
        except KeyError:
            pass
        want = frozenset(pool) if pool is not None else None
        shun = frozenset(avoid or ())
        out = frozenset(
            a
            for a, w in self.workers.items()
            if (want is None or not want.isdisjoint(w.pools)) and shun.isdisjoint(w.pools)
        )
        self._allowed[cache_key] = out
        return out

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


# ---------------------------------------------------------------------------------
# Adapters from scheduler objects (duck-typed: distributed is not imported here)
# ---------------------------------------------------------------------------------


def worker_status(ws: Any) -> WorkerStatus:
    """Map a ``WorkerState.status`` to the planner's three states."""
    name = getattr(ws.status, "name", ws.status)
    if name == "running":
        return "running"
    if name == "paused":
        return "paused"
    return "closing"


def worker_facts(ws: Any, memory: int) -> WorkerFacts:
    """What a pool expression sees of a ``WorkerState``; ``memory`` by the AMM measure."""
    limit = ws.memory_limit or 0
    return WorkerFacts(
        address=ws.address,
        name=str(ws.name),
        host=ws.host,
        resources=dict(ws.resources or {}),
        memory_limit=limit,
        nthreads=ws.nthreads,
        memory=memory,
        memory_fraction=memory / limit if limit else 0.0,
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


def stock_waiter_count(ts: Any) -> int:
    """Waiters of a key, counted as the stock ReduceReplicas counts them.

    Waiters already assigned to the same worker count once; unassigned waiters count
    one each. Above :data:`WAITERS_LOOKUP_LIMIT` waiters the plain count is used.
    """
    waiters = ts.waiters
    if not waiters:
        return 0
    n = len(waiters)
    if 1 < n < WAITERS_LOOKUP_LIMIT:
        n = len({w.processing_on or w for w in waiters})
    return n


def busy_workers(ts: Any) -> frozenset[str]:
    """Addresses of workers where a dependent of ``ts`` is processing."""
    return frozenset(
        w.processing_on.address for w in ts.waiters or () if w.processing_on is not None
    )


def key_string(key: Hashable) -> str:
    """The string form of a key that matches and explanations use."""
    return key if isinstance(key, str) else str(key)


def freeze(value: Any) -> Hashable:
    """A hashable, canonical stand-in for any annotation value (for memo tables)."""
    if isinstance(value, Mapping):
        items = [(str(k), freeze(v)) for k, v in value.items()]
        return ("map", tuple(sorted(items, key=lambda kv: kv[0])))
    if isinstance(value, (list, tuple)):
        return ("seq", tuple(freeze(v) for v in value))
    if isinstance(value, float):
        return ("float", repr(value))  # NaN != NaN: compare by spelling instead
    if isinstance(value, (str, int, bool, type(None))):
        return (type(value).__name__, value)
    return ("repr", type(value).__name__, repr(value))


class TaskFactsAdapter:
    """A ``TaskState`` seen through the attributes of :class:`~amm_rules.language.ruleset.TaskFacts`.

    Attributes are read from the task on access, so a match pays only for what it reads.
    """

    __slots__ = ("_ts",)

    def __init__(self, ts: Any):
        self._ts = ts

    @property
    def key(self) -> str:
        return key_string(self._ts.key)

    @property
    def prefix(self) -> str:
        return self._ts.prefix.name

    @property
    def group(self) -> str:
        return self._ts.group.name

    @property
    def type(self) -> str | None:
        return self._ts.type

    @property
    def nbytes(self) -> int:
        return max(self._ts.nbytes, 0)

    @property
    def replicas(self) -> int:
        return len(self._ts.who_has or ())

    @property
    def annotations(self) -> Mapping[str, Any]:
        return self._ts.annotations or {}


#: Where the plain class attributes live on a ``TaskState`` (for :func:`class_reader`).
_CLASS_PATHS: Mapping[str, str] = {"prefix": "prefix.name", "group": "group.name", "type": "type"}


def class_reader(attributes: Iterable[str]) -> Callable[[Any], Hashable]:
    """A function of a ``TaskState`` returning the values of the class attributes
    (``prefix``, ``group``, ``type``, ``annotations``) among ``attributes``: equal for
    every key of the same class, and hashable. It runs once per key classified, so the
    plain attributes are read by one ``attrgetter`` call (C code) and annotations are
    frozen only when a key has some."""
    names = sorted(attributes)
    paths = [_CLASS_PATHS[a] for a in names if a in _CLASS_PATHS]
    plain: Callable[[Any], Hashable] | None = attrgetter(*paths) if paths else None
    if "annotations" not in names:
        return plain if plain is not None else _no_class

    def with_annotations(ts: Any) -> Hashable:
        annotations = ts.annotations
        frozen = freeze(annotations) if annotations else None
        return frozen if plain is None else (plain(ts), frozen)

    return with_annotations


def _no_class(ts: Any) -> Hashable:
    return None
