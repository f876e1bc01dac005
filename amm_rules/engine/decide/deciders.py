"""The decider table: may a copy of a key go to a worker, or stay on one?

One table of small pure functions answers the question for every part of the engine that
asks it: ``explain`` prints each worker's decision with the deciders that said no or
throttled, the rebalancer checks a move's recipient, the demo and ``validate --dump``
count the workers a rule may use. Each decider looks at one thing and returns a
:class:`Decision` (``no`` or ``throttled``, its name, why), or None when it has nothing
against the worker:

=================  ==========  ==========================================================
decider            says        when
=================  ==========  ==========================================================
``holds``          no          the worker holds a copy already
``no target``      no          no rule governs the key (replication makes no copies)
``move: never``    no          the key's ``move: never``
``pool``           no          the worker is outside the key's pool
``avoid``          no          the worker is in one of the key's avoided pools
``retiring``       no          the worker is retiring or leaving (replication)
``spread``         no          ``spread: host``: a copy is on the worker's host already,
                               and another host could take one (for a move: any other
                               copy on that host)
``paused``         throttled   the worker is paused (replication)
``in flight``      throttled   a copy is on its way there
``pending``        throttled   the AMM accepted a copy there earlier in this cycle
``backoff``        throttled   a copy there timed out, or was dropped to give the
                               worker room (``spill``): not asked again for a while
``budget``         throttled   the key is not classified yet (classification budget)
``recipient-max``  no          above the rebalance ``recipient-max`` (moves, with the
                               rebalance settings given)
=================  ==========  ==========================================================

:func:`decide` runs the table for one worker, :func:`verdict` folds the answers into
``yes``, ``no`` or ``throttled``, :func:`stays` says whether a copy already there counts
(pool, avoid, retiring), and :func:`count_copies` counts a key's copies against its
target, as the planner, the rebalancer, the demo and the simulator count them.

The replication planner (:func:`amm_rules.engine.decide.plan.plan_key`) keeps its own
fast path: it runs for up to a million keys in one cycle, and a per-worker loop per key
would cost O(workers). A property test holds it to this table (the workers it copies to
are ``yes`` here, a key it leaves short has no ``yes`` worker, the copies it calls
misplaced are the ones :func:`stays` refuses). What is in flight and backing off both
read from the same view of the engine's ledger, never derived again here.

Pure: imports nothing from ``distributed``. Neighbours: :mod:`amm_rules.engine.decide.view`
(the views it reads), :mod:`amm_rules.engine.decide.plan`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal, NamedTuple, Protocol

from amm_rules.engine.decide.plan import target_bounds
from amm_rules.engine.decide.view import ClusterView, KeyView, WorkerView
from amm_rules.language.ruleset import Desired

YES, NO, THROTTLED = "yes", "no", "throttled"
#: What a copy is for: replication (the key's own target and placement), or a move
#: (rebalancing: the copy replaces one on the sender).
Purpose = Literal["copy", "move"]
COPY: Purpose = "copy"
MOVE: Purpose = "move"


class Placed(Protocol):
    """Where a key may live: a :class:`Desired`, or a rule's actions."""

    @property
    def pool(self) -> tuple[str, ...] | None: ...

    @property
    def avoid(self) -> tuple[str, ...] | None: ...


class Decision(NamedTuple):
    """One decider's answer about one worker."""

    says: str
    decider: str
    why: str

    def as_dict(self) -> dict[str, str]:
        return {"decider": self.decider, "says": self.says, "why": self.why}


@dataclass
class Question:
    """May a copy of ``key`` go to a worker of ``cluster``? What the deciders share
    about the key (computed once, asked for each worker)."""

    key: KeyView
    cluster: ClusterView
    purpose: Purpose = COPY
    #: The key waits for classification: what it wants is not known yet.
    unclassified: bool = False
    #: A move's sender: its copy is the one that leaves (``spread`` does not count it).
    sender: str | None = None
    #: Rebalancing's ``recipient-max`` (a fraction of the memory limit), for moves.
    recipient_max: float | None = None
    #: Workers' memory limits (address -> bytes), with ``recipient_max``.
    limits: dict[str, int] = field(default_factory=dict)

    @cached_property
    def desired(self) -> Desired:
        return self.key.desired

    @cached_property
    def inflight(self) -> frozenset[str]:
        """Workers a copy is on its way to (the engine's ledger, as the view has it)."""
        return frozenset(self.key.inflight)

    @cached_property
    def backoff(self) -> frozenset[str]:
        """Workers not asked again for a while (a copy there timed out, or was dropped
        to give the worker room)."""
        return frozenset(self.key.backoff)

    @cached_property
    def counted(self) -> frozenset[str]:
        """Workers whose copy counts for spread. For replication, as the planner counts
        them: copies where they count (not those being dropped in this cycle), in flight,
        or accepted by the AMM in this cycle; for a move, every other holder."""
        k = self.key
        if self.purpose == MOVE:
            return frozenset(a for a in k.holders if a != self.sender)
        placeable = self.cluster.placeable(self.desired.pool, self.desired.avoid)
        held = (k.holders - k.pending_drop) & placeable
        return frozenset(held | self.inflight | (k.pending_add & placeable))

    @cached_property
    def counted_hosts(self) -> frozenset[str]:
        cluster = self.cluster
        return frozenset(cluster.host(a) for a in self.counted if a in cluster.workers)

    @cached_property
    def new_host_open(self) -> bool:
        """Some worker on a host without a copy would take one now (every decider but
        ``spread`` says yes): replication then keeps to new hosts."""
        hosts = self.counted_hosts
        return any(
            w.host not in hosts and verdict(decide(self, w, spread=False)) == YES
            for w in self.cluster.workers.values()
        )


Decider = Callable[[Question, WorkerView], "Decision | None"]


def _holds(q: Question, w: WorkerView) -> Decision | None:
    if w.address in q.key.holders:
        return Decision(NO, "holds", "holds a copy")
    return None


def _no_target(q: Question, w: WorkerView) -> Decision | None:
    if q.purpose == COPY and not q.desired.governed and not q.unclassified:
        return Decision(
            NO, "no target", "no rule governs the key: amm-rules makes no copies of it"
        )
    return None


def _move_never(q: Question, w: WorkerView) -> Decision | None:
    d = q.desired
    if d.move == "never":
        return Decision(
            NO, "move: never", f"move: never from {d.reasons['move']}: no copy is made"
        )
    return None


class _Wants(Protocol):
    """What the stay deciders read of a question: the key's wishes."""

    @property
    def desired(self) -> Placed: ...


def _pool(q: _Wants, w: WorkerView) -> Decision | None:
    pool = q.desired.pool
    if pool is not None and w.pools.isdisjoint(pool):
        return Decision(NO, "pool", f"outside pool {','.join(pool)}")
    return None


def _avoid(q: _Wants, w: WorkerView) -> Decision | None:
    avoid = q.desired.avoid
    if avoid is not None and not w.pools.isdisjoint(avoid):
        return Decision(NO, "avoid", f"in avoided pool {','.join(sorted(w.pools & set(avoid)))}")
    return None


def _retiring(q: Question, w: WorkerView) -> Decision | None:
    if w.status == "closing":
        return Decision(NO, "retiring", "retiring or leaving: its copies do not count")
    return None


def _spread(q: Question, w: WorkerView) -> Decision | None:
    if q.desired.spread != "host" or w.host not in q.counted_hosts:
        return None
    if q.purpose == MOVE:
        return Decision(NO, "spread", "a copy is on the same host (spread: host)")
    if q.new_host_open:
        return Decision(NO, "spread", "same host as a copy, and other hosts are eligible")
    return None


def _paused(q: Question, w: WorkerView) -> Decision | None:
    if q.purpose == COPY and w.status == "paused":
        return Decision(THROTTLED, "paused", "paused: receives no copy until it resumes")
    return None


def _in_flight(q: Question, w: WorkerView) -> Decision | None:
    if w.address in q.inflight:
        return Decision(THROTTLED, "in flight", "a copy is on its way here")
    return None


def _pending(q: Question, w: WorkerView) -> Decision | None:
    if w.address in q.key.pending_add:
        return Decision(THROTTLED, "pending", "a copy here was accepted earlier in this cycle")
    return None


def _backoff(q: Question, w: WorkerView) -> Decision | None:
    if q.purpose == COPY and w.address in q.backoff:
        why = q.key.dropped.get(w.address) or "a copy here timed out"
        return Decision(THROTTLED, "backoff", f"{why}: not asked again for a while")
    return None


def _budget(q: Question, w: WorkerView) -> Decision | None:
    if q.purpose == COPY and q.unclassified:
        return Decision(
            THROTTLED, "budget", "the key is not classified yet (classification budget)"
        )
    return None


def _recipient_max(q: Question, w: WorkerView) -> Decision | None:
    if q.purpose != MOVE or q.recipient_max is None:
        return None
    limit = q.limits.get(w.address, 0)
    if limit and q.cluster.memory.get(w.address, 0) > q.recipient_max * limit:
        return Decision(NO, "recipient-max", f"above recipient-max {q.recipient_max:.0%}")
    return None


#: The table, in the order explanations list the deciders.
DECIDERS: tuple[tuple[str, Decider], ...] = (
    ("holds", _holds),
    ("no target", _no_target),
    ("move: never", _move_never),
    ("pool", _pool),
    ("avoid", _avoid),
    ("retiring", _retiring),
    ("spread", _spread),
    ("paused", _paused),
    ("in flight", _in_flight),
    ("pending", _pending),
    ("backoff", _backoff),
    ("budget", _budget),
    ("recipient-max", _recipient_max),
)


def decide(q: Question, w: WorkerView, *, spread: bool = True) -> list[Decision]:
    """What the deciders say against a new copy of the key on ``w`` (empty: yes).
    ``spread=False`` leaves the ``spread`` decider out (it asks the others itself)."""
    said = (decider(q, w) for name, decider in DECIDERS if spread or name != "spread")
    return [d for d in said if d is not None]


def first_refusal(q: Question, w: WorkerView) -> Decision | None:
    """The first decider, in table order, against a copy on ``w`` (None: yes)."""
    for _, decider in DECIDERS:
        said = decider(q, w)
        if said is not None:
            return said
    return None


def verdict(decisions: Iterable[Decision]) -> str:
    """``no`` if a decider said no, else ``throttled`` if one did, else ``yes``."""
    says = {d.says for d in decisions}
    return NO if NO in says else THROTTLED if THROTTLED in says else YES


def stays(desired: Placed, w: WorkerView) -> Decision | None:
    """Whether a copy on ``w`` counts for the key: None if it does, else why not (it is
    misplaced: outside the pool, in an avoided pool, or on a retiring worker)."""
    q = _StayQuestion(desired)
    said = _pool(q, w) or _avoid(q, w)
    if said is None and w.status == "closing":
        return Decision(NO, "retiring", "worker is retiring")
    return said


class _StayQuestion(NamedTuple):
    """The part of a :class:`Question` the stay deciders read."""

    desired: Placed


def eligible(desired: Placed, workers: Iterable[WorkerView]) -> set[str]:
    """Workers where a copy of the key counts (:func:`stays` says nothing against them):
    inside its pool, outside its avoided pools, not retiring."""
    return {w.address for w in workers if stays(desired, w) is None}


@dataclass(frozen=True)
class CopyCount:
    """A key's copies against its target, on the current workers."""

    #: The target's bounds in copies (``all`` counts the eligible workers).
    lo: int
    hi: int | None
    #: Copies where they count, and the others.
    good: frozenset[str]
    misplaced: frozenset[str]
    #: Workers where a copy would count.
    eligible: int

    @property
    def short(self) -> int:
        """Copies missing to reach ``lo`` (0 when met)."""
        return max(0, self.lo - len(self.good))

    @property
    def above(self) -> int:
        """Copies above ``hi`` (0 when within it)."""
        return 0 if self.hi is None else max(0, len(self.good) - self.hi)


def count_copies(
    desired: Desired,
    holders: Collection[str],
    placeable: Collection[str],
    waiters: int = 0,
    reduce_replicas: bool = True,
) -> CopyCount:
    """Count ``holders`` (addresses of the workers holding a copy) against the key's
    target, ``placeable`` being the workers where a copy counts (inside the pool,
    outside avoided pools, not retiring: :meth:`ClusterView.placeable`). Without
    ``replicate``, a key keeps one copy, trimmed as ReduceReplicas would (one plus what
    its waiters need) when ``reduce_replicas`` is on, never trimmed otherwise."""
    lo, hi = target_bounds(desired, waiters, reduce_replicas, len(placeable))
    good = frozenset(a for a in holders if a in placeable)
    return CopyCount(lo, hi, good, frozenset(holders) - good, len(placeable))


def worker_reasons(
    key: KeyView, cluster: ClusterView, unclassified: bool = False
) -> dict[str, str]:
    """Per worker, in a few words, whether a new copy of the key may go there: ``holds a
    copy``, ``candidate``, or the first decider's reason against it."""
    q = Question(key, cluster, unclassified=unclassified)
    out: dict[str, str] = {}
    for addr, w in sorted(cluster.workers.items()):
        said = first_refusal(q, w)
        out[addr] = "candidate" if said is None else said.why
    return out
