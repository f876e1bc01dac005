"""Adapters from the scheduler's own objects (``WorkerState``, ``TaskState``) to what the
engine's pure parts read.

- :func:`key_view`, :func:`worker_status`: the planner's views (:mod:`amm_rules.engine.decide.view`);
- :class:`TaskFactsAdapter`, :func:`worker_facts`: what rule and pool expressions read
  (:class:`~amm_rules.language.ruleset.TaskFacts`,
  :class:`~amm_rules.language.ruleset.WorkerFacts`);
- :func:`class_reader`, :func:`freeze`: the class of a key for the classifier's memo,
  walking a bounded part of an annotation (a shared reference counts each time it is
  reached: a pickled value of a few bytes may stand for millions); :func:`bounded_repr`
  likewise shows any value in a few hundred characters;
- :func:`stock_waiter_count`, :func:`busy_workers`: waiters as the stock ReduceReplicas
  counts them, and where dependents run;
- :func:`kept_copies`: which of a protected key's copies trimming spares;
- :func:`headroom`: how many bytes a worker can take before it spills (rebalance and
  protect send nothing past it; the thresholds come from
  :func:`amm_rules.engine.rebalance.rebalancer.spill_thresholds`).

Duck-typed: nothing here imports ``distributed``, so the classifier and the planners stay
pure and tests can pass stand-ins.
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable, Container, Hashable, Iterable, Mapping
from operator import attrgetter
from typing import Any

from amm_rules.engine.decide.view import KeyView, WorkerStatus, key_string
from amm_rules.language.ruleset import (
    FLOW_ATTRIBUTES,
    SPAN_STATE_ATTRIBUTES,
    Desired,
    WorkerFacts,
)

#: Above this many waiters the stock ReduceReplicas does not look at where they run
#: (the look is costly), and neither do we: the count of waiters is used as is.
WAITERS_LOOKUP_LIMIT = 20


def worker_status(ws: Any) -> WorkerStatus:
    """Map a ``WorkerState.status`` to the planner's three states."""
    name = getattr(ws.status, "name", ws.status)
    return name if name in ("running", "paused") else "closing"


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


#: Most values :func:`freeze` visits in one annotation (a shared value counts each time
#: it is reached), and most characters of its texts: real annotations have a few.
MAX_ANNOTATION_NODES = 10_000
MAX_ANNOTATION_CHARS = 1_000_000
#: Containers found too large lately (by identity; see :func:`freeze`).
_TOO_LARGE_KEPT = 256
_too_large: dict[int, Any] = {}


class AnnotationTooLarge(ValueError):
    """An annotation value larger than :func:`freeze` walks."""


class _Walk:
    __slots__ = ("nodes", "chars")

    def __init__(self) -> None:
        self.nodes = MAX_ANNOTATION_NODES
        self.chars = MAX_ANNOTATION_CHARS


def freeze(value: Any) -> Hashable:
    """A hashable, canonical stand-in for any annotation value (for memo tables).

    Raises :class:`AnnotationTooLarge` past :data:`MAX_ANNOTATION_NODES` values or
    :data:`MAX_ANNOTATION_CHARS` characters. The containers on the way to where the
    walk stopped are remembered (by identity, a few hundred at most), so that the next
    key sharing the same value is refused at once instead of walked again."""
    return _freeze(value, _Walk())


def _freeze(value: Any, walk: _Walk) -> Hashable:
    walk.nodes -= 1
    if walk.nodes < 0:
        raise AnnotationTooLarge(
            f"annotation too large: more than {MAX_ANNOTATION_NODES:,} values "
            "(shared values counted each time they are reached)"
        )
    if isinstance(value, (Mapping, list, tuple)):
        if _too_large.get(id(value)) is value:
            raise AnnotationTooLarge("annotation too large (seen before)")
        try:
            if isinstance(value, Mapping):
                items = [(str(k), _freeze(v, walk)) for k, v in value.items()]
                return ("map", tuple(sorted(items, key=lambda kv: kv[0])))
            return ("seq", tuple(_freeze(v, walk) for v in value))
        except AnnotationTooLarge:
            if len(_too_large) >= _TOO_LARGE_KEPT:
                _too_large.clear()
            _too_large[id(value)] = value
            raise
    if isinstance(value, float):
        return ("float", repr(value))  # NaN != NaN: compare by spelling instead
    if isinstance(value, (str, bytes)):
        walk.chars -= len(value)
        if walk.chars < 0:
            raise AnnotationTooLarge(
                f"annotation too large: more than {MAX_ANNOTATION_CHARS:,} characters of text"
            )
        return (type(value).__name__, value)
    if isinstance(value, (int, bool, type(None))):
        return (type(value).__name__, value)
    return ("repr", type(value).__name__, bounded_repr(value, MAX_ANNOTATION_CHARS))


#: What :func:`bounded_repr` shows of containers: 6 entries each, 3 levels deep.
_REPR = reprlib.Repr()
_REPR.maxlevel = 3
for _name in ("maxdict", "maxlist", "maxtuple", "maxset", "maxfrozenset", "maxdeque", "maxarray"):
    setattr(_REPR, _name, 6)
_REPR.maxstring = _REPR.maxother = 200
_REPR.maxlong = 100


def bounded_repr(value: Any, limit: int = 300) -> str:
    """``repr(value)`` in at most ``limit`` characters, made without walking more than a
    few hundred of its values (``repr`` of a shared structure walks its expansion)."""
    try:
        text = _REPR.repr(value)
    except Exception as exc:  # a broken __repr__ from a client's class
        text = f"<{type(value).__name__}: repr raised {type(exc).__name__}>"
    return text if len(text) <= limit else f"{text[:limit]}..."


#: The span of a key submitted outside any span (distributed's name for it).
DEFAULT_SPAN = "default"


def span_path(ts: Any) -> str:
    """The key's span as a path: its names joined by ``/`` (``"etl/load"``), as the
    scheduler's spans extension records them in the ``span`` annotation of each task of
    a span (distributed's ``observe_tasks``; the default span has none); ``"default"``
    outside any span."""
    annotations = ts.annotations
    if annotations:
        span = annotations.get("span")
        if isinstance(span, Mapping):
            name = span.get("name")
            if isinstance(name, (tuple, list)) and name:
                return "/".join(map(str, name))
    return DEFAULT_SPAN


def span_id(ts: Any) -> Any:
    """The id of the key's span (``TaskGroup.span_id``; None where the group has none)."""
    return getattr(ts.group, "span_id", None)


def resource_restrictions(ts: Any) -> Mapping[str, float]:
    """What the task that made the key asked for (``resources=``); empty when nothing."""
    return getattr(ts, "resource_restrictions", None) or {}


class TaskFactsAdapter:
    """A ``TaskState`` seen through the attributes of :class:`~amm_rules.language.ruleset.TaskFacts`.

    Attributes are read from the task on access, so a match pays only for what it reads.
    ``reads`` maps keys to the number of dependents that finished reading them (see
    :class:`~amm_rules.engine.state.demand.DemandTracker`); without it ``task.reads`` is 0.
    The ``task.prefix_*`` attributes come from ``flow``: prefix name -> the published
    figures of :class:`~amm_rules.engine.state.flow.PrefixFacts` (null when absent).
    ``task.span_done`` comes from ``spans`` (``spans.done_of(ts)``, see
    :class:`~amm_rules.engine.state.spans.SpanStates`); false without it.
    ``task.recompute_seconds`` from ``costs``: task group -> its published estimate
    (:class:`~amm_rules.engine.state.costs.RecomputeCosts`; null when absent).
    """

    __slots__ = ("_ts", "_reads", "_flow", "_spans", "_costs")

    def __init__(
        self,
        ts: Any,
        reads: Mapping[Hashable, int] | None = None,
        flow: Mapping[str, Any] | None = None,
        spans: Any = None,
        costs: Mapping[Any, float] | None = None,
    ):
        self._ts = ts
        self._reads = reads
        self._flow = flow
        self._spans = spans
        self._costs = costs

    @property
    def resources(self) -> Mapping[str, float]:
        return resource_restrictions(self._ts)

    @property
    def span(self) -> str:
        return span_path(self._ts)

    @property
    def span_done(self) -> bool:
        spans = self._spans
        return bool(spans.done_of(self._ts)) if spans is not None else False

    @property
    def recompute_seconds(self) -> float | None:
        costs = self._costs
        return costs.get(self._ts.group) if costs else None

    def _figure(self, name: str) -> Any:
        flow = self._flow
        facts = flow.get(self._ts.prefix.name) if flow else None
        return None if facts is None else getattr(facts, name)

    @property
    def prefix_tasks(self) -> int | None:
        return self._figure("tasks")

    @property
    def prefix_produced_per_task(self) -> float | None:
        return self._figure("produced_per_task")

    @property
    def prefix_freed_by_per_task(self) -> float | None:
        return self._figure("freed_by_per_task")

    @property
    def prefix_net_per_task(self) -> float | None:
        return self._figure("net_per_task")

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
    def waiters(self) -> int:
        return len(self._ts.waiters or ())

    @property
    def reads(self) -> int:
        return self._reads.get(self._ts.key, 0) if self._reads is not None else 0

    @property
    def annotations(self) -> Mapping[str, Any]:
        return self._ts.annotations or {}


#: Where the plain class attributes live on a ``TaskState`` (for :func:`class_reader`).
_CLASS_PATHS: Mapping[str, str] = {"prefix": "prefix.name", "group": "group.name", "type": "type"}


def class_reader(
    attributes: Iterable[str], flow: Mapping[str, Any] | None = None, spans: Any = None
) -> Callable[[Any], Hashable]:
    """A function of a ``TaskState`` returning the values of the class attributes
    (``prefix``, ``group``, ``type``, ``annotations``, ``resources``, ``span``,
    ``span_done``, the ``prefix_*`` flow figures) among ``attributes``: equal for every
    key of the same class, and hashable. It runs once per key classified, so the plain
    attributes are read by one ``attrgetter`` call (C code), annotations are frozen only
    when a key has some, and the flow figures are the prefix's published snapshot in
    ``flow`` (a tuple, or None)."""
    names = sorted(attributes)
    reader = _with_restrictions_and_spans(_plain_reader(names), names, spans)
    if flow is None or FLOW_ATTRIBUTES.isdisjoint(names):
        return reader
    prefix_of = attrgetter("prefix.name")

    def with_flow(ts: Any) -> Hashable:
        return (reader(ts), flow.get(prefix_of(ts)))

    return with_flow


def _plain_reader(names: list[str]) -> Callable[[Any], Hashable]:
    paths = [_CLASS_PATHS[a] for a in names if a in _CLASS_PATHS]
    plain: Callable[[Any], Hashable] | None = attrgetter(*paths) if paths else None
    if "annotations" not in names:
        return plain if plain is not None else _no_class

    def with_annotations(ts: Any) -> Hashable:
        annotations = ts.annotations
        try:
            frozen = freeze(annotations) if annotations else None
        except AnnotationTooLarge:
            # A class of its own (the rules still read the annotations as they are);
            # the classifier reports the ``amm`` annotation itself if it is the cause.
            frozen = ("too-large", id(annotations))
        return frozen if plain is None else (plain(ts), frozen)

    return with_annotations


def _with_restrictions_and_spans(
    reader: Callable[[Any], Hashable], names: list[str], spans: Any
) -> Callable[[Any], Hashable]:
    """``reader`` with the resource restriction, the span path and the span's state
    added, where the rules read them."""
    extra: list[Callable[[Any], Hashable]] = []
    if "resources" in names:
        extra.append(_restriction_class)
    if "span" in names:
        extra.append(span_path)
    if spans is not None and not SPAN_STATE_ATTRIBUTES.isdisjoint(names):
        extra.append(spans.done_of)
    if not extra:
        return reader
    parts = (reader, *extra)
    return lambda ts: tuple(part(ts) for part in parts)


def _restriction_class(ts: Any) -> Hashable:
    return tuple(sorted((str(k), v) for k, v in resource_restrictions(ts).items()))


def _no_class(ts: Any) -> Hashable:
    return None


def kept_copies(who_has: Iterable[Any], n: int, away: Container[str] = ()) -> frozenset[str]:
    """The ``n`` copies of a key held to keep ``n`` copies that trimming spares (see
    :mod:`amm_rules.engine.state.claims`): all of them when it holds no more; else those
    on workers that stay first (not retiring, not in ``away``: the workers the sections
    send away), one per host first, in address order, so that what is kept is spread."""
    holders = sorted(
        who_has, key=lambda ws: (ws.address in away or worker_status(ws) == "closing", ws.address)
    )
    if len(holders) <= n:
        return frozenset(ws.address for ws in holders)
    kept: list[str] = []
    hosts: set[str] = set()
    for ws in holders:
        if ws.host not in hosts:
            hosts.add(ws.host)
            kept.append(ws.address)
    for ws in holders:
        if ws.address not in kept:
            kept.append(ws.address)
    return frozenset(kept[:n])


def key_view(
    ts: Any,
    desired: Desired,
    inflight: Mapping[str, float],
    backoff: Mapping[str, float],
    pending: Mapping[Any, Any] | None = None,
    held: frozenset[str] = frozenset(),
    landed: frozenset[str] = frozenset(),
    dropped: Mapping[str, str] | None = None,
) -> KeyView:
    """The planner's view of one scheduler task (:class:`KeyView` says each part), with
    what other policies had the AMM accept for it in this cycle (``pending``: the AMM's
    ``manager.pending``)."""
    add: frozenset[str] = frozenset()
    drop: frozenset[str] = frozenset()
    if pending:
        entry = pending.get(ts)
        if entry is not None:
            add = frozenset(ws.address for ws in entry[0])
            drop = frozenset(ws.address for ws in entry[1])
    return KeyView(
        key=ts.key,
        desired=desired,
        holders=frozenset(ws.address for ws in ts.who_has or ()),
        nbytes=max(ts.nbytes, 0),
        waiters=stock_waiter_count(ts) if desired.replicate is None else 0,
        busy=busy_workers(ts),
        inflight=inflight,
        backoff=backoff,
        pending_add=add,
        pending_drop=drop,
        held=held,
        landed=landed,
        dropped=dropped or {},
    )


def headroom(
    memory: Any, limit: int, thresholds: tuple[float | None, float | None], delta: int = 0
) -> int | None:
    """Bytes a worker can take before it starts spilling: the lesser of its managed
    memory's distance to the ``target`` threshold and its process memory's to the
    ``spill`` threshold, less what the AMM accepted for it this cycle (``delta``).
    None without a limit or with both thresholds off: then nothing is known."""
    target, spill = thresholds
    if not limit:
        return None
    rooms = []
    if target is not None:
        rooms.append(int(target * limit) - memory.managed)
    if spill is not None:
        rooms.append(int(spill * limit) - memory.process)
    return min(rooms) - max(0, delta) if rooms else None
