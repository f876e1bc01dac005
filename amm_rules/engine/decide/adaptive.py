"""What adaptive scaling should ask for, and which workers it may take away: the pure
half of the ``adaptive`` section (:mod:`amm_rules.engine.sections.adaptive`).

Every adaptive deployment of Dask (``LocalCluster.adapt``, dask-kubernetes,
dask-jobqueue) asks the scheduler two questions: how many workers
(``adaptive_target``) and, when that is fewer than it has, which ones to close
(``workers_to_close``). distributed answers the first from CPU occupancy, and doubles
the workers once their data passes 60% of their memory, whatever is queued; it answers
the second with the idle workers holding the fewest bytes, whatever the rules hold on
them. Three computations here, on small views of the cluster:

- **Up**: :func:`memory_target`, the workers needed to hold the data under the
  headroom (bytes in memory, on disk, and what the tasks still to run are expected to
  produce: the memory flow's net bytes per task of each prefix), one more while the
  workers write to disk or read back faster than a threshold, or while producers are
  held back (:class:`MemoryDemand` in, :class:`MemoryTarget` out);
- **Down, which may go**: :func:`hold`, over the governed classes of keys
  (:class:`HeldClass`), the candidates in order: each is let go unless its leaving,
  with those let go before it, would put a class's keys below their rule's ``min``,
  empty a pool a rule needs, leave ``spread: host`` keys on one host, or strand keys
  that may not move or have nowhere to go; every worker kept says why
  (:class:`Kept`);
- **Down, which first**: :func:`cheapest_first`, the workers whose data is cheapest to
  move (:class:`LeavingCost`: bytes to send, bytes to read back from disk first, and
  the recompute its sole copies stand for).

Figures only: the sentences ("kept tcp://...:4567: 12 keys of rule precious would fall
below min 2") are made by :mod:`amm_rules.engine.words`. Nothing here reads the
scheduler (the layout test keeps dask and distributed out of ``engine/decide/``).
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from amm_rules.engine.decide.plan import needed_copies
from amm_rules.engine.decide.view import in_pools
from amm_rules.language.ruleset import Target

#: Task states whose tasks have not produced their result yet: what the target
#: expects of them.
TO_RUN = ("waiting", "queued", "no-worker", "processing")

#: The share of a worker's recompute at risk counted in its cost of leaving: a
#: retirement cut short (the worker killed before its keys left) loses its sole copies.
#: A chosen weight, not a measured probability: it orders workers whose bytes are alike.
RISK_WEIGHT = 0.1

# -- up ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryDemand:
    """What the scheduler knows of memory, for :func:`memory_target`."""

    #: Memory limit of each running worker, bytes (0: the worker has none).
    limits: tuple[int, ...]
    #: Managed bytes in memory, and on disk, over the workers.
    in_memory: int = 0
    on_disk: int = 0
    #: Tasks still to run, per prefix (see :data:`TO_RUN`).
    to_run: Mapping[str, int] = field(default_factory=dict)
    #: Bytes one more task of a prefix adds to the cluster's memory: the memory flow's
    #: net per task. A prefix not here (none of its tasks finished yet) counts 0.
    per_task: Mapping[str, float] = field(default_factory=dict)
    #: Bytes per second the workers wrote to disk and read back lately (None: not
    #: measured yet).
    disk_rate: float | None = None
    #: Producers are held back (the ``memory-pressure`` section holds).
    held_back: bool = False
    #: The last target rose on disk traffic, or kept the worker such a rise added (see
    #: :func:`memory_target`, cases 3 and 4).
    rose: bool = False


#: Why a target rose by a worker: the workers write to disk or read back faster than
#: the threshold; producers are held back.
DISK, HELD_BACK = "disk", "held-back"


@dataclass(frozen=True)
class MemoryTarget:
    """What :func:`memory_target` found."""

    #: Workers memory asks for (0: none, and nothing to say: no data, no memory limit).
    workers: int
    #: Bytes to hold: in memory, on disk and expected from the tasks still to run.
    needed: int = 0
    #: Of which expected from the tasks still to run.
    expected: int = 0
    #: Bytes one worker holds under the headroom (its limit's share left free of it).
    per_worker: int = 0
    #: Workers running when it was computed.
    running: int = 0
    #: Why it rose above the workers running (:data:`DISK`, :data:`HELD_BACK`).
    rising: tuple[str, ...] = ()
    #: Bytes per second written and read back, as measured (None: not yet).
    disk_rate: float | None = None
    #: Prefixes expected to produce the most: (prefix, tasks to run, bytes expected).
    top: tuple[tuple[str, int, int], ...] = ()
    #: It keeps the worker an earlier rise on disk traffic added (case 4).
    keeps_rise: bool = False


#: Prefixes named in a target (the largest expected producers).
TOP_PREFIXES = 3


def expected_bytes(to_run: Mapping[str, int], per_task: Mapping[str, float]) -> dict[str, int]:
    """Bytes each prefix's tasks still to run are expected to add to memory (prefixes
    whose tasks free more than they produce, or not measured yet, add nothing: what a
    reduction frees comes after what it reads was produced)."""
    out = {}
    for prefix, n in to_run.items():
        each = per_task.get(prefix)
        if n > 0 and each is not None and each > 0:
            out[prefix] = int(n * each)
    return out


def memory_target(demand: MemoryDemand, headroom: float, disk_rate: float) -> MemoryTarget:
    """The workers needed to hold the data under ``headroom`` (a share of each worker's
    memory limit kept free of managed data), and one more than are running while the
    workers write to disk or read back faster than ``disk_rate`` (bytes per second) with
    data still on disk, or producers are held back.

    The cases:

    1. no running worker, or one without a memory limit: memory asks for nothing (the
       data's room is unknown, or unbounded);
    2. else ``ceil(needed / per_worker)``, ``per_worker`` being the mean limit's share
       left free of the headroom;
    3. and, rising, at least the running workers plus one: while producers are held
       back; while the workers spill with bytes on disk (traffic measured over a window
       goes on a little after the data read back was released: then nothing is on disk
       any more), as long as the data needs every running worker (case 2 asks for that
       many). When the data needs fewer, what spills is data being released, or data
       on one worker that another would not relieve;
    4. once the target rose on disk traffic (``rose``), at least the running workers
       while the workers still spill and the data needs all of them but the one the
       rise added: that worker is kept, not let go at once, and no further one is asked
       for on its account (asking for one more again, as each rise's worker joined,
       climbed a worker at a time and then let two go at once).
    """
    limits = demand.limits
    running = len(limits)
    expected = expected_bytes(demand.to_run, demand.per_task)
    total_expected = sum(expected.values())
    needed = max(0, demand.in_memory) + max(0, demand.on_disk) + total_expected
    top = tuple(
        (p, demand.to_run[p], b) for p, b in sorted(expected.items(), key=lambda kv: -kv[1])
    )[:TOP_PREFIXES]
    spilling = demand.disk_rate is not None and demand.disk_rate > disk_rate
    spilling = spilling and demand.on_disk > 0
    base = MemoryTarget(0, needed, total_expected, 0, running, (), demand.disk_rate, top)
    if not running or min(limits) <= 0:
        return base  # 1.
    room = sum(limits) / running * (1.0 - headroom)
    per_worker = round(room)
    if per_worker <= 0:
        return base
    # (A hair below a whole number of workers is that number: 4 GiB under 40% of 1 GiB
    # is 10 workers, whatever 0.4's last bit.)
    workers = math.ceil(needed / room - 1e-9) if needed > 0 else 0  # 2.
    signals = []
    if spilling and workers >= running:
        signals.append(DISK)
    if demand.held_back:
        signals.append(HELD_BACK)
    rising = tuple(signals)
    keeps_rise = not rising and spilling and demand.rose and workers >= running - 1
    if rising:
        workers = max(workers, running + 1)  # 3.
    elif keeps_rise:
        workers = max(workers, running)  # 4.
    return replace(
        base, workers=workers, per_worker=per_worker, rising=rising, keeps_rise=keeps_rise
    )


#: Seconds of samples :class:`DiskMeter` measures a rate over.
DISK_WINDOW = 10.0


class DiskMeter:
    """Bytes the workers write to disk and read back per second, lately, from their
    running totals sampled now and then (the scheduler sums the workers' metrics as
    their heartbeats arrive)."""

    def __init__(self, window: float = DISK_WINDOW):
        self.window = window
        #: (time, bytes written, bytes read back, seconds reading), oldest first; one
        #: sample older than the window marks where its time starts.
        self.samples: deque[tuple[float, int, int, float]] = deque()

    def sample(self, now: float, written: int, read: int, read_seconds: float) -> None:
        samples = self.samples
        if samples and (written < samples[-1][1] or read < samples[-1][2]):
            samples.clear()  # the totals went back (a new scheduler): start again
        samples.append((now, written, read, read_seconds))
        while len(samples) > 2 and samples[1][0] < now - self.window:
            samples.popleft()

    def rate(self) -> float | None:
        """Bytes written and read back per second over the window (None: fewer than two
        samples yet)."""
        if len(self.samples) < 2:
            return None
        t0, w0, r0, _ = self.samples[0]
        t1, w1, r1, _ = self.samples[-1]
        if t1 <= t0:
            return None
        return ((w1 - w0) + (r1 - r0)) / (t1 - t0)

    def read_speed(self) -> float | None:
        """Bytes read back per second of reading, over everything read so far (None:
        nothing read yet)."""
        if not self.samples:
            return None
        _, _, read, seconds = self.samples[-1]
        return read / seconds if read > 0 and seconds > 0 else None


# -- down: which may go ----------------------------------------------------------------


@dataclass(frozen=True)
class Slot:
    """A worker, as scale-down sees it."""

    address: str
    host: str = ""
    #: Names of the pools it belongs to.
    pools: frozenset[str] = frozenset()
    #: Running (may receive copies); a paused worker holds data and receives none.
    running: bool = True


@dataclass(frozen=True)
class HeldClass:
    """A class of governed keys (one plan class of the engine: the same target, pool,
    avoid, spread and move), as scale-down must keep it."""

    #: How many keys the class has in memory.
    keys: int
    target: Target | None = None
    pool: tuple[str, ...] | None = None
    avoid: tuple[str, ...] | None = None
    spread: str | None = None
    move: str | None = None
    #: What set each field, in words (``rule precious``, ``amm annotation``): field
    #: name -> source.
    sources: Mapping[str, str] = field(default_factory=dict)
    #: The holders of each key: needed for ``move: never`` classes and for classes with
    #: a pool or avoid (their keys stay where they are while no worker is eligible).
    holders: Sequence[frozenset[str]] = ()
    #: :func:`holder_index` of ``holders``, when the caller keeps one (None: built).
    index: Mapping[str, Sequence[frozenset[str]]] | None = None

    def source(self, name: str) -> str:
        return self.sources.get(name) or self.sources.get("replicate") or "the rules"


#: What kept a worker: a rule's minimum; a pool emptied; ``spread: host`` on one host;
#: keys that may not move (``move: never``) held only on leaving workers; keys with no
#: eligible worker at all held only on leaving workers.
MIN, POOL, SPREAD, NEVER, NOWHERE = "min", "pool", "spread", "never", "nowhere"


class Kept(NamedTuple):
    """Why one worker was kept: ``keys`` keys of ``source`` would break ``kind``."""

    kind: str
    keys: int
    source: str
    #: The minimum that would break (:data:`MIN`), or the hosts left (:data:`SPREAD`).
    #: (Not ``count``: a tuple's method of that name.)
    bound: int = 0
    #: The pools (:data:`POOL`, :data:`NOWHERE`).
    pools: tuple[str, ...] = ()


@dataclass
class Hold:
    """What :func:`hold` decided: the candidates that may close together, in their
    order, and the others with why."""

    allowed: list[str] = field(default_factory=list)
    kept: dict[str, list[Kept]] = field(default_factory=dict)


class _Placement:
    """Workers eligible for one (pool, avoid), and how many of them (and of their
    hosts) stay as candidates are let go."""

    __slots__ = ("eligible", "hosts", "staying")

    def __init__(self, eligible: frozenset[str], host_of: Mapping[str, str]):
        self.eligible = eligible
        self.staying = len(eligible)
        self.hosts: Counter[str] = Counter(host_of[a] for a in eligible)

    def hosts_without(self, host: str) -> int:
        """Distinct hosts left if a worker on ``host`` goes too."""
        return len(self.hosts) - (1 if self.hosts.get(host) == 1 else 0)

    def let_go(self, address: str, host: str) -> None:
        if address in self.eligible:
            self.staying -= 1
            self.hosts[host] -= 1
            if not self.hosts[host]:
                del self.hosts[host]


def holder_index(holders: Iterable[frozenset[str]]) -> dict[str, list[frozenset[str]]]:
    """Each holder's address -> the holder sets of the keys it holds."""
    out: dict[str, list[frozenset[str]]] = {}
    for held in holders:
        for address in held:
            out.setdefault(address, []).append(held)
    return out


def hold(
    slots: Mapping[str, Slot],
    classes: Iterable[HeldClass],
    candidates: Sequence[str],
    *,
    minimums: bool = True,
) -> Hold:
    """Which of ``candidates`` (in order of preference) may leave together.

    Each candidate is let go unless its leaving, with those let go before it, would:

    1. strand keys of a ``move: never`` class: every holder leaving (:data:`NEVER`);
    2. for a class with a pool or avoid and no eligible running worker at all: leave
       its keys nowhere, every holder leaving (:data:`NOWHERE`);
    3. empty the eligible workers of a class with a pool or avoid (:data:`POOL`);

    and, with ``minimums`` (``hold-rules``):

    4. leave fewer eligible workers than the class's ``min`` (its target's lower bound
       on the workers that stay: ``all`` follows them), where there were more
       (:data:`MIN`);
    5. leave a ``spread: host`` class on fewer hosts than it needs (its ``min``, and no
       more than the hosts it had) (:data:`SPREAD`).

    Closing any part of the answer's ``allowed`` is as safe as closing all of it (each
    check can only fail when more workers leave). Cost: per candidate, one test per
    class, plus one per key of the classes whose keys must stay where they are.
    """
    host_of = {a: s.host for a, s in slots.items()}
    placements: dict[tuple[tuple[str, ...] | None, tuple[str, ...] | None], _Placement] = {}
    checked: list[tuple[HeldClass, _Placement, Mapping[str, Sequence[frozenset[str]]]]] = []
    for cls in classes:
        if cls.keys <= 0:
            continue
        where = (cls.pool, cls.avoid)
        placement = placements.get(where)
        if placement is None:
            running = ((a, s.pools) for a, s in slots.items() if s.running)
            placement = placements[where] = _Placement(
                in_pools(running, cls.pool, cls.avoid), host_of
            )
        stay_put = cls.move == "never" or (
            (cls.pool is not None or cls.avoid is not None) and not placement.eligible
        )
        by_holder: Mapping[str, Sequence[frozenset[str]]] = {}
        if stay_put:
            by_holder = cls.index if cls.index is not None else holder_index(cls.holders)
        checked.append((cls, placement, by_holder))
    out = Hold()
    leaving: set[str] = set()  # the candidates let go so far
    for address in candidates:
        host = host_of.get(address, "")
        reasons: list[Kept] = []
        for cls, placement, by_holder in checked:
            if address not in placement.eligible and address not in by_holder:
                continue  # neither holds its keys nor may: nothing to break
            why = _check(cls, placement, by_holder, address, host, leaving, minimums)
            if why is not None:
                reasons.append(why)
        if reasons:
            out.kept[address] = _merged(reasons)
            continue
        leaving.add(address)
        out.allowed.append(address)
        for placement in placements.values():
            placement.let_go(address, host)
    return out


def _stranded(holder_sets: Sequence[frozenset[str]], address: str, leaving: set[str]) -> int:
    """Keys held by ``address`` whose every other holder is ``leaving`` too."""
    return sum(1 for held in holder_sets if all(a == address or a in leaving for a in held))


def _check(
    cls: HeldClass,
    placement: _Placement,
    by_holder: Mapping[str, Sequence[frozenset[str]]],
    address: str,
    host: str,
    leaving: set[str],
    minimums: bool,
) -> Kept | None:
    """The first of :func:`hold`'s cases that ``address`` leaving (with ``leaving``, let
    go before it) breaks for ``cls``."""
    if by_holder:
        stranded = _stranded(by_holder.get(address, ()), address, leaving)
        if stranded:
            if cls.move == "never":
                return Kept(NEVER, stranded, cls.source("move"))  # 1.
            pools = cls.pool or cls.avoid or ()
            return Kept(
                NOWHERE, stranded, cls.source("pool" if cls.pool else "avoid"), 0, pools
            )  # 2.
    if address not in placement.eligible:
        return None
    after = placement.staying - 1
    if after <= 0 and (cls.pool is not None or cls.avoid is not None):
        field_name = "pool" if cls.pool is not None else "avoid"
        return Kept(POOL, cls.keys, cls.source(field_name), 0, cls.pool or cls.avoid or ())  # 3.
    if not minimums:
        return None
    lo = needed_copies(cls.target, after)
    if after < lo:
        return Kept(MIN, cls.keys, cls.source("replicate"), lo)  # 4.
    if cls.spread == "host":
        hosts_after = placement.hosts_without(host)
        if hosts_after < min(lo, len(placement.hosts)):
            return Kept(SPREAD, cls.keys, cls.source("spread"), hosts_after)  # 5.
    return None


def _merged(reasons: list[Kept]) -> list[Kept]:
    """Reasons of one kind from one source added up (a rule's keys may fall in several
    classes), in the order first seen."""
    out: dict[tuple[str, str, int, tuple[str, ...]], Kept] = {}
    for r in reasons:
        k = (r.kind, r.source, r.bound, r.pools)
        seen = out.get(k)
        out[k] = r if seen is None else Kept(r.kind, seen.keys + r.keys, *k[1:])
    return list(out.values())


# -- down: which first -------------------------------------------------------------------


@dataclass(frozen=True)
class LeavingCost:
    """What it costs to empty one worker."""

    address: str
    #: It is running tasks (the stock choice closes idle workers first; so does this).
    busy: bool = False
    #: Managed bytes it holds (to send), and of them those on disk (read back first).
    nbytes: int = 0
    on_disk: int = 0
    #: Recompute seconds of the keys of which it holds the only copy.
    at_risk: float = 0.0

    def seconds(self, bandwidth: float, disk_read: float) -> float:
        """Seconds to send its data at ``bandwidth`` (bytes per second), reading what is
        on disk first at ``disk_read``, plus :data:`RISK_WEIGHT` of its recompute at
        risk."""
        send = max(0, self.nbytes) / max(bandwidth, 1.0)
        read = max(0, self.on_disk) / max(disk_read, 1.0)
        return send + read + RISK_WEIGHT * max(0.0, self.at_risk)


def cheapest_first(costs: Iterable[LeavingCost], bandwidth: float, disk_read: float) -> list[str]:
    """Addresses, idle workers first, then by :meth:`LeavingCost.seconds`, cheapest first
    (ties by address, so that two schedulers answer alike)."""
    return [
        c.address
        for c in sorted(costs, key=lambda c: (c.busy, c.seconds(bandwidth, disk_read), c.address))
    ]


__all__ = [
    "DISK",
    "DiskMeter",
    "HELD_BACK",
    "MIN",
    "NEVER",
    "NOWHERE",
    "POOL",
    "SPREAD",
    "HeldClass",
    "Hold",
    "Kept",
    "LeavingCost",
    "MemoryDemand",
    "MemoryTarget",
    "Slot",
    "cheapest_first",
    "expected_bytes",
    "hold",
    "holder_index",
    "memory_target",
]
