"""Rebalance decisions: which keys to move from the fullest workers to the emptiest.

This module owns the decision logic of the ``rebalance:`` section of a rules file
(:class:`~amm_rules.language.ruleset.RebalanceSettings`), and nothing else. It is pure: it imports
nothing from ``distributed``, reads a small view of the cluster (:class:`WorkerLoad`,
an iterator of candidate keys per worker, and predicates), and returns data.

Neighbours: :mod:`amm_rules.language.ruleset` holds the settings;
:mod:`amm_rules.engine.rebalance.rebalancer` builds the view each AMM cycle, supplies the
predicates that carry the rules, turns :class:`Move` into a ``replicate`` suggestion and
a settled move into a ``drop`` one, and keeps a :class:`MoveBook` between cycles.

A move is a copy onto the recipient in one cycle and a drop from the sender in a later
one, once the copy has landed (:func:`settle_moves`): until then nothing destructive has
happened, and a move the world overtook is void. docs/rebalance.md says what a cycle
does, when a move is void, and what it costs.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import (
    Callable,
    Collection,
    Container,
    Hashable,
    Iterable,
    Iterator,
    Mapping,
)
from dataclasses import dataclass, field

from amm_rules.language.ruleset import MEASURES_WITH_SPILLED, RebalanceSettings

Key = Hashable

#: ``can_move(key, sender)`` and ``can_place(key, recipient)`` return ``None`` (or
#: ``True``) when allowed, else a short reason (``False`` means "refused", no reason).
Check = Callable[[Key, str], "str | bool | None"]
#: ``target(key, sender)``: where the key's replication target stands while a move's
#: copy has landed: :data:`NEEDED`, :data:`ABOVE`, or ``None`` (within it, or no target).
Target = Callable[[Key, str], "str | None"]
#: The key's target needs the sender's copy: without it the key would hold fewer copies
#: than its ``replicate`` asks (a holder was lost mid-move). Also the void reason.
NEEDED = "sender's copy needed by the key's replication target"
#: The key holds more copies than its ``replicate`` allows (the move's own extra copy,
#: or more). A void reason when the sender's copy cannot be dropped now.
ABOVE = "sender's copy in use while the key is above its replication target"
#: ``keys_on(address, newest_first)`` yields ``(key, nbytes)`` of the keys in memory on
#: a worker, lazily, in insertion order (oldest first) or its reverse.
KeysOn = Callable[[str, bool], Iterable[tuple[Key, int]]]

#: How many candidate recipients are examined for one key before it is given up. The
#: recipients heap is ordered by distance from the mean as a fraction of each worker's
#: limit, not by free bytes, so the first one may be too small for a key that another
#: could take; a few probes find it without making the cost grow with the cluster.
RECIPIENT_PROBES = 16
#: Keys of one sender examined without being moved, per cycle, before the sender is
#: left alone until the next cycle. Bounds the degenerate case (most keys pinned by a
#: pool, read by tasks, or larger than what the sender has to lose).
SENDER_SCAN_LIMIT = 1_000
#: Keys examined without being moved, per cycle, over the whole cluster.
CYCLE_SCAN_LIMIT = 100_000
#: Keys too large for what is left of the budget, per cycle, before the budget counts
#: as spent; and keys too large for what a sender has left to lose, per sender, before
#: that sender counts as done. Hunting for ever smaller keys to fill the last bytes
#: would cost more than those bytes are worth. Keys for which no recipient has room
#: count as too large for the sender.
SIZE_MISSES = 16
NO_ROOM = "no recipient has room for it"
#: Keys smaller than this are never moved (see :func:`smallest_move`): they change no
#: worker's memory by what a heartbeat can tell apart, and a move costs the same
#: messages and bookkeeping whatever its size.
SMALLEST_MOVE = 2**20
#: ... or than this fraction of the sender's memory limit, if that is less.
SMALLEST_MOVE_FRACTION = 1 / 1000
TOO_SMALL = "too small to change any worker's memory"
#: A worker's role when it would receive but is at its spill threshold.
SPILLING = "at its spill threshold (a copy would push as much to disk)"
#: Keys skipped and kept with their reason in :attr:`RebalancePlan.examples`.
EXAMPLES = 50
#: The defaults of the timings, from the one place that states them.
_DEFAULT = RebalanceSettings()


# --- the view ---------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerLoad:
    """One worker as rebalance sees it.

    The engine leaves out workers that are retiring (``closing_gracefully``); their data
    is the retirement's business. A worker without a memory limit is reported and left
    alone: its fraction cannot be known.
    """

    address: str
    #: Bytes by the configured measure (``getattr(ws.memory, settings.measure)``).
    memory: int
    memory_limit: int
    #: Status ``running``. A paused worker may still send (it is full: that is the point)
    #: but never receives.
    running: bool = True
    #: Bytes spilled to disk (``ws.memory.spilled``). The scheduler does not know which
    #: keys they are.
    spilled: int = 0
    #: Bytes the worker can take before it starts spilling (the lesser of its managed
    #: memory's and its process memory's distance to the workers' spill thresholds);
    #: ``None`` when the thresholds are off. At or below 0 the worker does not receive:
    #: every byte sent there would push a byte to its disk.
    headroom: int | None = None


# --- moves --------------------------------------------------------------------------


@dataclass(frozen=True)
class Move:
    """Copy ``key`` from ``sender`` to ``recipient`` now; drop it from ``sender`` once the
    copy has landed."""

    key: Key
    sender: str
    recipient: str
    nbytes: int
    #: The sender's and the recipient's fraction of their limits when the move was
    #: chosen, and the cluster mean: the reason for the move, as data.
    sender_fraction: float = math.nan
    recipient_fraction: float = math.nan
    mean: float = math.nan

    @property
    def reason(self) -> str:
        # Formatted on demand: a cycle may choose tens of thousands of moves, and most
        # reasons are never read.
        return (
            f"{self.sender} at {_pct(self.sender_fraction)} and {self.recipient} at "
            f"{_pct(self.recipient_fraction)} of their limits; mean {_pct(self.mean)}"
        )

    def __repr__(self) -> str:
        return f"<Move {self.key!r} {self.sender} -> {self.recipient} ({self.nbytes} B)>"


@dataclass(frozen=True)
class PendingMove:
    """A move whose copy was requested and whose sender's copy has not yet gone."""

    key: Key
    sender: str
    recipient: str
    nbytes: int
    #: When the copy was requested (the engine's clock, seconds).
    started: float
    #: When the copy was first seen on the recipient; ``None`` until then.
    landed: float | None = None


@dataclass(frozen=True)
class Skip:
    """A key that was examined and not moved, and why."""

    key: Key
    sender: str
    reason: str


@dataclass(frozen=True)
class RebalancePlan:
    """What one cycle of rebalance decided, with the reasons for everything it did not."""

    moves: tuple[Move, ...] = ()
    #: Cluster mean fraction of memory limit (after counting moves in flight).
    mean: float = math.nan
    #: address → ``"sender"``, ``"recipient"`` or why it is neither.
    roles: dict[str, str] = field(default_factory=dict)
    #: reason → number of keys examined and not moved for it.
    skipped: dict[str, int] = field(default_factory=dict)
    #: The first few skipped keys, each with its reason.
    examples: tuple[Skip, ...] = ()
    #: Bytes this plan copies, and the budget it had.
    bytes: int = 0
    budget: int = 0
    #: Why planning ended: ``"disabled"``, ``"no senders"`` or ``"no recipients"`` (before
    #: pairing), ``"senders done"`` (every sender reached the mean or ran out of keys
    #: that can move), ``"recipients full"``, ``"budget spent"``, ``"scan limit"``.
    stopped: str = "no senders"

    @property
    def senders(self) -> frozenset[str]:
        return frozenset(a for a, r in self.roles.items() if r == "sender")

    @property
    def recipients(self) -> frozenset[str]:
        return frozenset(a for a, r in self.roles.items() if r == "recipient")

    def __repr__(self) -> str:
        return (
            f"<RebalancePlan {len(self.moves)} moves, {self.bytes}/{self.budget} B, "
            f"{len(self.senders)} senders, {len(self.recipients)} recipients, "
            f"mean {self.mean:.1%}, stopped: {self.stopped}>"
        )


# --- planning -------------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class _Side:
    """A sender or recipient while planning: its memory so far and what it may still
    send or receive (``left``, in bytes, up to the mean)."""

    #: Tie-breaker in the heaps, so that sides are never compared.
    seq: int
    address: str
    limit: int
    memory: int
    left: int
    scanned: int = 0
    misses: int = 0

    def entry(self, mean: float) -> tuple[float, int, _Side]:
        """Heap entry: the farthest from the mean (as a fraction of its limit) first."""
        return (-abs(self.memory / self.limit - mean), self.seq, self)


def _refusal(result: str | bool | None, default: str) -> str | None:
    """Normalise a predicate's answer: ``None``/``True`` allow, a string or ``False``
    refuses. (A plain boolean predicate must never be read as "no objection".)"""
    if result is None or result is True:
        return None
    if result is False or result == "":
        return default
    return str(result)


def _pct(x: float) -> str:
    return f"{x:.0%}"


def smallest_move(limit: int) -> int:
    """Bytes below which a key on a worker with this memory limit is never moved:
    :data:`SMALLEST_MOVE`, or :data:`SMALLEST_MOVE_FRACTION` of the limit if less."""
    return min(SMALLEST_MOVE, int(limit * SMALLEST_MOVE_FRACTION))


def _room(w: WorkerLoad, ceiling: float, mem: int) -> int:
    """Bytes a recipient may take: up to ``ceiling`` by the measure, and no further
    than its headroom below the spill thresholds."""
    room = int(ceiling - mem)
    return room if w.headroom is None else min(room, w.headroom)


def plan_rebalance(
    workers: Iterable[WorkerLoad],
    settings: RebalanceSettings,
    *,
    keys_on: KeysOn,
    can_move: Check,
    can_place: Check,
    pending: Iterable[PendingMove] = (),
    cooling: Container[Key] = (),
    previous: Mapping[str, str] | None = None,
    budget: int | None = None,
    sender_scan_limit: int = SENDER_SCAN_LIMIT,
    cycle_scan_limit: int = CYCLE_SCAN_LIMIT,
) -> RebalancePlan:
    """Decide this cycle's moves.

    ``workers``: every worker that may take part (see :class:`WorkerLoad`).
    ``keys_on(address, newest_first)``: the keys in memory on a worker, lazily.
    ``can_move(key, sender)``: may this key leave this sender now? The engine refuses
    ``move: never``, keys outside ``rebalance.match``, keys a task still to run is
    about to read, and keys the replication planner touched this cycle.
    ``can_place(key, recipient)``: may this worker hold a copy? The engine refuses
    workers that already hold one and those that ``pool``/``avoid``/``spread`` exclude.
    ``pending``: moves in flight (from :class:`MoveBook`); their bytes are counted as if
    already moved, and their workers keep their role until they finish.
    ``cooling``: keys moved recently, not to be moved again yet.
    ``previous``: the roles of the previous plan (:attr:`RebalancePlan.roles`). A worker
    that was a sender stays one until it is near the mean (within gap/8), a recipient
    until it reaches the mean: the band decides who starts, the mean who stops.
    ``budget``: bytes that may be copied this cycle; ``settings.max_bytes_per_cycle``
    by default.

    Fractions are of each worker's own memory limit, and the mean is total memory over
    total limit, so a worker twice as large is expected to hold twice the bytes.

    The steps, in order: (1) the workers' memory once the moves in flight are complete
    (:func:`_after_pending`), (2) each worker's role (:func:`_roles`), (3) pairing
    senders with recipients key by key (:class:`_Pairing`).
    """
    budget = settings.max_bytes_per_cycle if budget is None else max(0, budget)
    if not settings.enabled:
        return RebalancePlan(budget=budget, stopped="disabled")

    # 1. Workers, their memory as it will be once moves in flight are complete.
    roles: dict[str, str] = {}
    loads: dict[str, WorkerLoad] = {}
    for w in workers:
        if w.memory_limit > 0:
            loads[w.address] = w
        else:
            roles[w.address] = "no memory limit"
    memory, sending, receiving, in_flight = _after_pending(loads, pending)
    if not loads:
        return RebalancePlan(roles=roles, budget=budget, stopped="no senders")
    mean = sum(memory.values()) / sum(w.memory_limit for w in loads.values())

    # 2. Roles: who sends, who receives, and why every other worker does neither.
    senders, recipients = _roles(
        loads, memory, mean, settings, previous or {}, sending, receiving, roles
    )
    if not senders or not recipients:
        stopped = "no senders" if not senders else "no recipients"
        return RebalancePlan(mean=mean, roles=roles, budget=budget, stopped=stopped)

    # 3. Pair senders with recipients, one key at a time.
    pairing = _Pairing(
        senders,
        recipients,
        loads,
        mean,
        budget,
        keys_on=keys_on,
        can_move=can_move,
        can_place=can_place,
        in_flight=in_flight,
        cooling=cooling,
        sender_scan_limit=sender_scan_limit,
        cycle_scan_limit=cycle_scan_limit,
    )
    stopped = pairing.run()
    return pairing.plan(roles, stopped)


def _after_pending(
    loads: Mapping[str, WorkerLoad], pending: Iterable[PendingMove]
) -> tuple[dict[str, int], set[str], set[str], set[Key]]:
    """Step 1 of :func:`plan_rebalance`: each worker's memory as if the moves in flight
    were complete, so that bytes already on their way are not sent twice.

    Returns ``(memory, sending, receiving, in_flight)``: bytes by address, the workers
    sending and receiving a move in flight (they keep that role until it finishes),
    and the keys being moved. A recipient is counted its copy only until it has
    landed: from then on its own measure holds the bytes.
    """
    memory = {a: w.memory for a, w in loads.items()}
    sending: set[str] = set()
    receiving: set[str] = set()
    in_flight: set[Key] = set()
    for p in pending:
        in_flight.add(p.key)
        sending.add(p.sender)
        receiving.add(p.recipient)
        if p.sender in memory:
            memory[p.sender] -= p.nbytes
        if p.landed is None and p.recipient in memory:
            memory[p.recipient] += p.nbytes
    return memory, sending, receiving, in_flight


def _roles(
    loads: Mapping[str, WorkerLoad],
    memory: Mapping[str, int],
    mean: float,
    settings: RebalanceSettings,
    previous: Mapping[str, str],
    sending: Container[str],
    receiving: Container[str],
    roles: dict[str, str],
) -> tuple[list[tuple[float, int, _Side]], list[tuple[float, int, _Side]]]:
    """Step 2 of :func:`plan_rebalance`: each worker's role, written into ``roles``;
    returns the senders and the recipients, as heaps. Senders shed towards the mean and
    recipients fill towards it, never past it, so that they never trade places
    (docs/rebalance.md, "Convergence without oscillation")."""
    half_gap = settings.gap / 2
    # A sender that started stops this close to the mean: with keys of finite size the
    # exact mean is out of reach, and chasing it would keep it sending crumbs. Recipients
    # have no such tolerance: when one sender feeds many recipients, the recipients'
    # shortfalls add up on the sender, which would be left stranded outside the band.
    near = settings.gap / 8
    senders: list[tuple[float, int, _Side]] = []
    recipients: list[tuple[float, int, _Side]] = []
    reserve: list[_Side] = []
    for seq, (address, w) in enumerate(loads.items()):
        mem = memory[address]
        frac = mem / w.memory_limit
        role = previous.get(address)
        # 2a. Above the band, or a sender that has not yet reached the mean.
        if frac - mean > half_gap or (role == "sender" and frac - mean > near):
            excess = mem - mean * w.memory_limit
            if settings.measure in MEASURES_WITH_SPILLED:
                # Spilled bytes inflate this measure, but moving keys that sit on disk
                # frees no RAM: shed no more than the excess of what is in memory.
                excess = min(excess, mem - w.spilled - mean * w.memory_limit)
            if frac < settings.sender_min and role != "sender":
                roles[address] = f"below sender-min ({_pct(frac)} < {_pct(settings.sender_min)})"
            elif address in receiving:
                roles[address] = "receiving a move in flight"
            elif excess <= 0:
                roles[address] = "excess is spilled to disk"
            else:
                side = _Side(seq, address, w.memory_limit, mem, int(excess))
                senders.append(side.entry(mean))
                roles[address] = "sender"
        # 2b. Below the band, or a recipient that has not yet reached the mean.
        elif mean - frac > half_gap or (role == "recipient" and frac < mean):
            ceiling = min(mean, settings.recipient_max) * w.memory_limit
            if not w.running:
                roles[address] = "not running (paused)"
            elif frac >= settings.recipient_max or ceiling <= mem:
                roles[address] = (
                    f"above recipient-max ({_pct(frac)} >= {_pct(settings.recipient_max)})"
                )
            elif address in sending:
                roles[address] = "sending a move in flight"
            elif w.headroom is not None and w.headroom <= 0:
                roles[address] = SPILLING
            else:
                side = _Side(seq, address, w.memory_limit, mem, _room(w, ceiling, mem))
                recipients.append(side.entry(mean))
                roles[address] = "recipient"
        # 2c. Neither; but a running worker below the mean is kept in reserve (2d).
        else:
            roles[address] = "within gap"
            ceiling = min(mean, settings.recipient_max) * w.memory_limit
            room = _room(w, ceiling, mem)
            if frac < mean and w.running and address not in sending and room > 0:
                reserve.append(_Side(seq, address, w.memory_limit, mem, room))
    # 2d. Workers within the band start nothing. But when the recipients below the band
    #     cannot take all that the senders above it have to lose, the workers just under
    #     the mean top up: otherwise one worker far above the mean would stay there
    #     because everybody else sits just inside the band. They fill only up to the
    #     mean, so they cannot become senders by it: no trading places.
    if senders and reserve:
        excess = sum(e[2].left for e in senders)
        if excess > sum(e[2].left for e in recipients):
            for side in reserve:
                recipients.append(side.entry(mean))
                roles[side.address] = "recipient"
    heapq.heapify(senders)
    heapq.heapify(recipients)
    return senders, recipients


@dataclass(slots=True)
class _Pairing:
    """Step 3 of :func:`plan_rebalance`: pair the sender farthest above the mean with the
    recipient farthest below it, one key at a time, until one side runs out or the
    budget is spent.

    One object per cycle, so that the loop over the moves (:meth:`run`) and the scans
    of the senders' keys (:meth:`_offers`, which may look at thousands of keys) share
    the cycle's counters.
    """

    senders: list[tuple[float, int, _Side]]
    recipients: list[tuple[float, int, _Side]]
    loads: Mapping[str, WorkerLoad]
    mean: float
    budget: int
    keys_on: KeysOn
    can_move: Check
    can_place: Check
    in_flight: Container[Key]
    cooling: Container[Key]
    sender_scan_limit: int
    cycle_scan_limit: int
    moves: list[Move] = field(default_factory=list, init=False)
    #: Keys moved by this plan: a key with several holders moves once.
    taken: set[Key] = field(default_factory=set, init=False)
    skipped: Counter[str] = field(default_factory=Counter, init=False)
    examples: list[Skip] = field(default_factory=list, init=False)
    #: Keys examined and not moved, over the whole cluster.
    scanned: int = field(default=0, init=False)
    #: Keys too large for what is left of the budget.
    budget_misses: int = field(default=0, init=False)
    #: Bytes of the budget left.
    left: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.left = self.budget

    def run(self) -> str:
        """Choose the moves; returns why planning ended (:attr:`RebalancePlan.stopped`)."""
        senders, recipients = self.senders, self.recipients
        taken, moves, mean = self.taken, self.moves, self.mean
        # Each sender's scan, resumed at each of its turns. Kept here, not on the sender:
        # a scan refers to its sender, and the reference cycle would be left for the
        # garbage collector to free.
        offers: dict[_Side, Iterator[tuple[Key, int, _Side]]] = {}
        cycle_scan_limit = self.cycle_scan_limit
        while senders and recipients:
            if self.left <= 0 or self.budget_misses >= SIZE_MISSES:
                return "budget spent"
            if self.scanned >= cycle_scan_limit:
                return "scan limit"
            snd = senders[0][2]
            scan = offers.get(snd)
            if scan is None:
                scan = offers[snd] = self._offers(snd)
            moved = next(scan, None)
            if moved is None:
                if self.budget_misses >= SIZE_MISSES:
                    return "budget spent"
                # 3e. This sender has nothing more that can move this cycle.
                heapq.heappop(senders)
                continue
            # 3f. Record the move and update both sides; each stays while it is still far
            #     enough from the mean, and is re-sorted by its new distance.
            key, nbytes, rec = moved
            taken.add(key)
            self.left -= nbytes
            moves.append(
                Move(
                    key,
                    snd.address,
                    rec.address,
                    nbytes,
                    snd.memory / snd.limit,
                    rec.memory / rec.limit,
                    mean,
                )
            )
            snd.memory -= nbytes
            snd.left -= nbytes
            rec.memory += nbytes
            rec.left -= nbytes
            if snd.left > 0:
                heapq.heapreplace(senders, snd.entry(mean))
            else:
                heapq.heappop(senders)
            if rec.left > 0:
                heapq.heappush(recipients, rec.entry(mean))
        return "recipients full" if senders else "senders done"

    def plan(self, roles: dict[str, str], stopped: str) -> RebalancePlan:
        """The plan of this pairing, with the roles of step 2."""
        return RebalancePlan(
            moves=tuple(self.moves),
            mean=self.mean,
            roles=roles,
            skipped=dict(self.skipped),
            examples=tuple(self.examples),
            bytes=self.budget - self.left,
            budget=self.budget,
            stopped=stopped,
        )

    def _skip(self, key: Key, sender: _Side, reason: str) -> None:
        self.scanned += 1
        sender.scanned += 1
        self.skipped[reason] += 1
        if len(self.examples) < EXAMPLES:
            self.examples.append(Skip(key, sender.address, reason))

    def _offers(self, snd: _Side) -> Iterator[tuple[Key, int, _Side]]:
        """The keys of ``snd`` that can move, each with the recipient that takes it
        (popped off the heap), until this sender has nothing more to offer this cycle.
        Each key passed over is counted as skipped, with its reason.

        A generator, resumed at each of the sender's turns: after each move the sender
        farthest from the mean may be another one, and this one later resumes where it
        left off. Its set-up (the locals below) is paid once per sender, not per move.
        """
        # Spilling workers offer their newest keys first: under LRU spilling the
        # newest are the likeliest to be in RAM, so moving them brings real relief.
        # Others offer their oldest first: long-lived data, rather than intermediates
        # that their dependents are about to consume and release.
        keys = self.keys_on(snd.address, self.loads[snd.address].spilled > 0)
        smallest = smallest_move(snd.limit)
        skip = self._skip
        taken, in_flight, cooling = self.taken, self.in_flight, self.cooling
        can_move, can_place, recipients = self.can_move, self.can_place, self.recipients
        sender_scan_limit, cycle_scan_limit = self.sender_scan_limit, self.cycle_scan_limit
        for key, nbytes in keys:
            # 3a. Cheap refusals first: the key is already spoken for.
            if key in taken:
                skip(key, snd, "moved by this plan from another holder")
            elif key in in_flight:
                skip(key, snd, "move in flight")
            elif key in cooling:
                skip(key, snd, "moved recently (cool-down)")
            # 3b. Size: never past the mean, never past the budget.
            elif nbytes <= 0:
                skip(key, snd, "no bytes to move")
            elif nbytes < smallest:
                skip(key, snd, TOO_SMALL)
            elif nbytes > snd.left:
                skip(key, snd, "larger than what the sender has to lose")
                snd.misses += 1
                if snd.misses >= SIZE_MISSES:
                    return
            elif nbytes > self.left:
                skip(key, snd, "larger than the budget left this cycle")
                self.budget_misses += 1
                if self.budget_misses >= SIZE_MISSES:
                    return
            # 3c. The rules and the running computation, through the engine.
            elif (why := _refusal(can_move(key, snd.address), "may not move")) is not None:
                skip(key, snd, why)
            # 3d. A recipient with room that may hold it.
            else:
                rec, why = _find_recipient(recipients, key, nbytes, can_place)
                if rec is not None:
                    yield key, nbytes, rec
                    continue
                skip(key, snd, why)
                if why == NO_ROOM:
                    snd.misses += 1
                    if snd.misses >= SIZE_MISSES:
                        return
            if snd.scanned >= sender_scan_limit or self.scanned >= cycle_scan_limit:
                self.skipped["scan limit reached on a sender"] += 1
                return


def _find_recipient(
    recipients: list[tuple[float, int, _Side]], key: Key, nbytes: int, can_place: Check
) -> tuple[_Side | None, str]:
    """Pop the recipient farthest below the mean that has room for ``nbytes`` and may
    hold ``key``, looking at no more than :data:`RECIPIENT_PROBES` of them. The chosen
    one leaves the heap (the caller pushes it back with its new distance); the others
    are put back. Returns ``(None, reason)`` when there is none."""
    probed: list[tuple[float, int, _Side]] = []
    chosen = None
    reason = NO_ROOM
    while recipients and len(probed) < RECIPIENT_PROBES:
        entry = heapq.heappop(recipients)
        rec = entry[2]
        if nbytes <= rec.left:
            refused = _refusal(can_place(key, rec.address), "may not be placed")
            if refused is None:
                chosen = rec
                break
            reason = f"no recipient may hold it ({refused})"
        probed.append(entry)
    for entry in probed:
        heapq.heappush(recipients, entry)
    return chosen, reason


# --- after the copy: drop, or give up --------------------------------------------------


@dataclass(frozen=True)
class Settlement:
    """What :func:`settle_moves` decided about the moves in flight."""

    #: Moves whose copy has landed: drop ``key`` from ``sender`` now.
    drops: tuple[PendingMove, ...] = ()
    #: Moves that are complete: the sender no longer holds the key, the recipient does.
    done: tuple[PendingMove, ...] = ()
    #: Moves abandoned, each with its reason. Nothing was dropped for them.
    void: tuple[tuple[PendingMove, str], ...] = ()
    #: Moves still in flight (including those in ``drops``), by key.
    pending: dict[Key, PendingMove] = field(default_factory=dict)


def settle_moves(
    pending: Iterable[PendingMove],
    *,
    holders: Callable[[Key], Collection[str] | None],
    alive: Container[str],
    now: float,
    can_drop: Check | None = None,
    refused: Container[Key] = (),
    copy_timeout: float = _DEFAULT.copy_timeout,
    drop_timeout: float = _DEFAULT.drop_timeout,
    target: Target | None = None,
) -> Settlement:
    """Look at the moves in flight against the cluster as it is now.

    ``holders(key)``: addresses of the workers holding ``key`` in memory, or ``None``
    once the key is released or no longer in memory. ``alive``: addresses of the
    workers in the cluster. ``can_drop(key, sender)``: may the sender's copy go now?
    (Distributed refuses a drop on a worker where a dependent is running; asking anyway
    only costs a rejected suggestion, so ``None`` means "always ask".) ``refused``: keys
    whose copy the AMM or the recipient refused. ``target(key, sender)``: where the
    key's replication target stands with the sender's copy (``None``: no target, or
    always within it).

    A sender's copy is dropped only when the recipient is seen holding the key; a move
    never overrides the key's replication target (docs/rebalance.md, "When the world
    changes").
    """
    drops: list[PendingMove] = []
    done: list[PendingMove] = []
    void: list[tuple[PendingMove, str]] = []
    keep: dict[Key, PendingMove] = {}
    for p in pending:
        who = holders(p.key)
        # 1. The key was released or lost: nothing left to move.
        if not who:
            void.append((p, "key released"))
            continue
        landed = p.recipient in who
        sender_holds = p.sender in who and p.sender in alive
        # 2. The recipient left. If it had the copy, the key is at least as safe as
        #    before; either way, the sender keeps its copy.
        if p.recipient not in alive:
            void.append((p, "recipient left the cluster"))
        # 3. The copy landed.
        elif landed:
            landed_at = now if p.landed is None else p.landed
            if p.landed is None:
                p = PendingMove(p.key, p.sender, p.recipient, p.nbytes, p.started, landed_at)
            # 3a. ... and the sender's copy is gone (dropped, or the sender left).
            if not sender_holds:
                done.append(p)
            # 3b. ... the sender's copy has been kept too long: leave it to replication.
            elif now - landed_at > drop_timeout:
                void.append((p, f"sender's copy not dropped within {drop_timeout:g}s"))
            # 3c. ... the sender may still drop it: the key's replication target comes
            #     first (docs/rebalance.md, "The rules still hold").
            else:
                standing = target(p.key, p.sender) if target is not None else None
                if standing == NEEDED:
                    void.append((p, NEEDED))  # a holder was lost mid-move: both copies stay
                elif can_drop is None or _refusal(can_drop(p.key, p.sender), "no") is None:
                    keep[p.key] = p
                    drops.append(p)
                elif standing == ABOVE:
                    void.append((p, ABOVE))  # replication trims a copy elsewhere now
                else:
                    keep[p.key] = p  # asked again next cycle, until the drop timeout
        # 4. The copy has not landed.
        elif not sender_holds:
            void.append((p, "sender lost its copy before the copy landed"))
        elif p.key in refused:
            void.append((p, "copy refused"))
        elif now - p.started > copy_timeout:
            void.append((p, f"copy did not land within {copy_timeout:g}s"))
        else:
            keep[p.key] = p
    return Settlement(tuple(drops), tuple(done), tuple(void), keep)


# --- memory between cycles ---------------------------------------------------------------


class MoveBook:
    """The moves in flight and the keys cooling down, kept by the engine between cycles.

    Each cycle: :meth:`settle` (then yield a drop for each of its ``drops``), then
    :func:`plan_rebalance` with ``pending=book.pending.values()``,
    ``cooling=book.cooling(now)`` and ``previous=book.roles``, then :meth:`start` for
    each move the AMM accepted and :meth:`refuse` for each it rejected, and finally
    :meth:`remember` the plan.

    The timings (seconds) are the rules file's ``cool-down``, ``copy-timeout`` and
    ``drop-timeout``; :meth:`retime` changes them on a reload. ``pending`` is the table
    the moves in flight are kept in: the engine's ledger's
    (:attr:`Ledger.moves <amm_rules.engine.state.ledger.Ledger.moves>`), where the rest
    of the engine reads them; it is changed in place, never rebound.
    """

    def __init__(
        self,
        *,
        cooldown: float = _DEFAULT.cooldown,
        copy_timeout: float = _DEFAULT.copy_timeout,
        drop_timeout: float = _DEFAULT.drop_timeout,
        pending: dict[Key, PendingMove] | None = None,
    ):
        #: Seconds after a move finishes (or is abandoned) during which its key stays put.
        self.cooldown = cooldown
        #: Seconds from the copy's request after which a copy that has not landed is void.
        self.copy_timeout = copy_timeout
        #: Seconds from the copy's landing after which a sender copy not yet dropped is
        #: left in place and the move is void.
        self.drop_timeout = drop_timeout
        #: key → move in flight.
        self.pending: dict[Key, PendingMove] = {} if pending is None else pending
        #: Roles of the last plan, for ``plan_rebalance(previous=...)``.
        self.roles: dict[str, str] = {}
        # key → end of its cool-down. Insertion order is expiry order because every key
        # cools for the same time (retime shifts them all alike) and the clock is
        # monotonic, so expired keys are pruned from the front.
        self._cooling: dict[Key, float] = {}

    def __repr__(self) -> str:
        return f"<MoveBook {len(self.pending)} in flight, {len(self._cooling)} cooling>"

    def retime(self, *, cooldown: float, copy_timeout: float, drop_timeout: float) -> None:
        """New timings (a reloaded rules file). Moves in flight keep going: the timeouts
        are compared with each move's own start and landing at every :meth:`settle`, so
        the new ones apply to them at once. A new cool-down applies to the keys already
        cooling too, counted from when each started: shifting every end by the same
        amount keeps them in expiry order, which :meth:`cooling` relies on."""
        shift = cooldown - self.cooldown
        if shift:
            self._cooling = {key: until + shift for key, until in self._cooling.items()}
        self.cooldown = cooldown
        self.copy_timeout = copy_timeout
        self.drop_timeout = drop_timeout

    def cooling(self, now: float) -> Collection[Key]:
        """Keys that may not be moved yet (moves in flight are in :attr:`pending`)."""
        while self._cooling:
            key, until = next(iter(self._cooling.items()))
            if until > now:
                break
            del self._cooling[key]
        return self._cooling.keys()

    def _cool(self, key: Key, now: float) -> None:
        self._cooling.pop(key, None)
        self._cooling[key] = now + self.cooldown

    def settle(
        self,
        now: float,
        *,
        holders: Callable[[Key], Collection[str] | None],
        alive: Container[str],
        can_drop: Check | None = None,
        refused: Container[Key] = (),
        target: Target | None = None,
    ) -> Settlement:
        """:func:`settle_moves` on the moves in flight; finished and void moves leave
        :attr:`pending` and their keys start cooling down."""
        s = settle_moves(
            self.pending.values(),
            holders=holders,
            alive=alive,
            now=now,
            can_drop=can_drop,
            refused=refused,
            copy_timeout=self.copy_timeout,
            drop_timeout=self.drop_timeout,
            target=target,
        )
        self.pending.clear()
        self.pending.update(s.pending)
        for p in s.done:
            self._cool(p.key, now)
        for p, _ in s.void:
            self._cool(p.key, now)
        return s

    def start(self, move: Move, now: float) -> PendingMove:
        """The AMM accepted the copy for ``move``."""
        p = PendingMove(move.key, move.sender, move.recipient, move.nbytes, now)
        self.pending[move.key] = p
        return p

    def refuse(self, move: Move, now: float) -> None:
        """The AMM rejected the copy for ``move``: leave the key alone for a while."""
        self._cool(move.key, now)

    def remember(self, plan: RebalancePlan) -> None:
        """Keep the roles of this cycle's plan for the next one."""
        self.roles = {a: r for a, r in plan.roles.items() if r in ("sender", "recipient")}

    def forget(self, key: Key) -> None:
        """The key was released; forget it entirely."""
        self.pending.pop(key, None)
        self._cooling.pop(key, None)


def minimum_bytes_to_balance(workers: Iterable[WorkerLoad]) -> int:
    """Bytes that must move for every worker to sit exactly at the mean fraction: the sum
    of each worker's excess over its share. A yardstick for benchmarks and tests."""
    ws = [w for w in workers if w.memory_limit > 0]
    if not ws:
        return 0
    mean = sum(w.memory for w in ws) / sum(w.memory_limit for w in ws)
    return int(sum(max(0.0, w.memory - mean * w.memory_limit) for w in ws))


__all__ = [
    "ABOVE",
    "NEEDED",
    "SPILLING",
    "TOO_SMALL",
    "Move",
    "MoveBook",
    "PendingMove",
    "RebalancePlan",
    "Settlement",
    "Skip",
    "Target",
    "WorkerLoad",
    "minimum_bytes_to_balance",
    "plan_rebalance",
    "settle_moves",
    "smallest_move",
]
