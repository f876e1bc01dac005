"""Where the keys of a leaving worker go: the pure planner shared by retirement
(:mod:`amm_rules.engine.sections.retirement`) and the ``paused-workers`` section
(:mod:`amm_rules.engine.sections.paused_workers`).

A worker *leaves* when it is retired (``client.retire_workers``, adaptive scale-down) or
restarted; its copies then vanish. :func:`plan_evacuation` decides, for the keys it
holds, which copies must exist elsewhere first and on which workers, by the same rules
as every other copy the engine makes (see :func:`amm_rules.engine.decide.plan.plan_key`):

- a key needs ``min(lo, reachable)`` copies on workers that stay and are *eligible* for
  it (inside its ``pool``, outside its ``avoid``), where ``lo`` is its replication target
  (1 without one) and ``reachable`` counts the eligible workers that could hold one;
- new copies go to eligible running workers that are not leaving, the least loaded
  first, on a host that holds no copy yet first (``spread: host``), and, when a ``room``
  is given, only where the copy fits (see :mod:`amm_rules.engine.sections.paused_workers`);
- a key held on leaving workers only that may not be copied (``move: never``) or that has
  no eligible worker to go to is *stuck*: its worker must not leave (the callers refuse
  or postpone the departure, and name the key and the rule);
- a key whose only copies elsewhere are outside its pool, when its pool has no worker to
  go to, is not stuck: it is not lost, and the rules move it once they can.

Nothing here reads the scheduler: the callers build :class:`~amm_rules.engine.decide.view.KeyView`
and :class:`~amm_rules.engine.decide.view.ClusterView` objects (:func:`leaving_view` marks the
leaving workers), so that tests run it on views made by hand.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, MutableMapping
from dataclasses import dataclass, field, replace

from amm_rules.engine.decide.plan import needed_copies, placement_source, source_label
from amm_rules.engine.decide.view import ClusterView, KeyView, WorkerView
from amm_rules.language.ruleset import Desired


@dataclass(frozen=True)
class Copy:
    """A copy to make before a worker leaves."""

    key: Hashable
    worker: str
    nbytes: int
    #: Human words: ``"held only on leaving workers"``, ``"below replicate=3 ..."``.
    reason: str
    #: Counter label of the field that decided the recipient's eligibility.
    source: str


@dataclass(frozen=True)
class Stuck:
    """A key that keeps its worker from leaving: no copy elsewhere, and none may be made."""

    key: Hashable
    #: ``"move: never"`` or ``"no eligible worker: ..."``.
    why: str
    #: The rule (counter label) whose field leaves the key nowhere to go.
    rule: str


@dataclass
class Evacuation:
    """The answer of :func:`plan_evacuation` for a batch of keys."""

    copies: list[Copy] = field(default_factory=list)
    stuck: list[Stuck] = field(default_factory=list)
    #: Keys that need a copy that cannot be made this cycle: key -> why (in flight,
    #: no recipient with room, budget spent, recipients backing off).
    waiting: dict[Hashable, str] = field(default_factory=dict)
    #: Keys held where the rules want them on workers that stay (landed copies only).
    satisfied: list[Hashable] = field(default_factory=list)
    #: Bytes of :attr:`copies`.
    bytes: int = 0
    #: True when the byte budget stopped the plan before every key was looked at.
    budget_spent: bool = False

    @property
    def settled(self) -> bool:
        """Every key is held where it should be: the workers may leave."""
        return not self.copies and not self.stuck and not self.waiting


def leaving_view(workers: Iterable[WorkerView], leaving: Iterable[str]) -> ClusterView:
    """A cluster view in which the ``leaving`` workers are retiring: they receive
    nothing and their copies do not count."""
    gone = frozenset(leaving)
    return ClusterView(
        replace(w, status="closing") if w.address in gone and w.status != "closing" else w
        for w in workers
    )


def plan_evacuation(
    keys: Iterable[KeyView],
    cluster: ClusterView,
    *,
    now: float,
    room: MutableMapping[str, int] | None = None,
    budget: int | None = None,
    first_free: bool = True,
) -> Evacuation:
    """Plan the copies that must exist before the workers marked ``closing`` in
    ``cluster`` (see :func:`leaving_view`) leave.

    ``room``: bytes each recipient may still receive (updated as copies are planned);
    None places copies regardless of room, as distributed's retirement does. ``budget``:
    most bytes to plan (None: no limit); with ``first_free``, the first copy is allowed
    whatever its size, so that a key larger than the budget still moves, alone.

    The cases, for each key:

    1. ``move: never``: satisfied if a copy is held on a worker that stays, else stuck.
    2. No eligible worker stays or can receive: satisfied if a copy survives on a worker
       that stays (outside the pool), else stuck.
    3. Enough landed eligible copies stay: satisfied.
    4. Enough, counting copies in flight: waiting for them.
    5. Otherwise copies are planned, within the budget and the room; a key for which
       none can be found waits.
    """
    out = Evacuation()
    leaving = cluster.closing
    for key in keys:
        d = key.desired
        staying = frozenset(a for a in key.holders if a in cluster.workers) - leaving
        # Case 1: move: never.
        if d.move == "never":
            if staying:
                out.satisfied.append(key.key)
            else:
                out.stuck.append(Stuck(key.key, "move: never", source_label(d, "move")))
            continue
        placeable = cluster.placeable(d.pool, d.avoid)
        recipients = cluster.recipients(d.pool, d.avoid)
        good = staying & placeable
        want = min(needed_copies(d.replicate, len(placeable)), len(good | recipients))
        # Case 2: nowhere eligible.
        if want == 0:
            if staying:
                out.satisfied.append(key.key)
            else:
                source = placement_source(d, source_label(d, "replicate"))
                out.stuck.append(Stuck(key.key, _nowhere(d, cluster), source))
            continue
        # Case 3: enough landed copies stay.
        if len(good) >= want:
            out.satisfied.append(key.key)
            continue
        # Case 4: copies in flight (asked for earlier, or by another policy this cycle).
        coming = {
            a for a, deadline in key.inflight.items() if deadline > now and a in recipients
        } | (key.pending_add & recipients)
        counted = set(good) | coming
        if len(counted) >= want:
            out.waiting[key.key] = "copy in flight"
            continue
        # Case 5: plan copies.
        _plan_copies(key, want, counted, cluster, now, room, budget, first_free, out)
    return out


def _plan_copies(
    key: KeyView,
    want: int,
    counted: set[str],
    cluster: ClusterView,
    now: float,
    room: MutableMapping[str, int] | None,
    budget: int | None,
    first_free: bool,
    out: Evacuation,
) -> None:
    d = key.desired
    nbytes = key.nbytes
    backoff = {a for a, until in key.backoff.items() if until > now}
    exclude = set(key.holders) | counted | backoff
    hosts = {cluster.host(a) for a in counted | (key.holders - cluster.closing)}
    reason = (
        f"below replicate={want} on the workers that stay"
        if d.replicate is not None and d.replicate.min != 1
        else "held only on leaving workers"
    )
    source = source_label(d, "replicate")

    def fits(addr: str) -> bool:
        return room is None or room.get(addr, 0) >= nbytes

    while len(counted) < want:
        if budget is not None and out.bytes + nbytes > budget and (out.bytes or not first_free):
            out.budget_spent = True
            out.waiting[key.key] = "budget spent this cycle"
            return
        choice = None
        if d.spread == "host":
            choice = cluster.least_loaded(
                d.pool, d.avoid, exclude, lambda a: fits(a) and cluster.host(a) not in hosts
            )
        if choice is None:
            choice = cluster.least_loaded(d.pool, d.avoid, exclude, fits)
        if choice is None:
            out.waiting[key.key] = (
                "eligible workers are backing off after a timed-out copy"
                if room is None
                else "no eligible worker has room for it"
            )
            return
        out.copies.append(Copy(key.key, choice, nbytes, reason, source))
        out.bytes += nbytes
        cluster.add_memory(choice, nbytes)
        if room is not None:
            room[choice] = room.get(choice, 0) - nbytes
        counted.add(choice)
        exclude.add(choice)
        hosts.add(cluster.host(choice))


def _nowhere(d: Desired, cluster: ClusterView) -> str:
    """``"no eligible worker: pool gpu has no worker that stays (1 paused)"``."""
    placeable = cluster.placeable(d.pool, d.avoid)
    paused = sum(1 for a in placeable if cluster.workers[a].status == "paused")
    if d.pool is not None:
        where = f"pool {','.join(d.pool)}"
    elif d.avoid is not None:
        where = f"outside {','.join(d.avoid)}"
    else:
        where = "the cluster"
    detail = f" ({paused} paused)" if paused else ""
    return f"no eligible worker: {where} has no running worker that stays{detail}"
