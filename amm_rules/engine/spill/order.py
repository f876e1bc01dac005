"""The order in which a worker's memory gives up keys: lowest value per byte first.

A worker's data is a ``SpillBuffer`` (``distributed/spill.py``), a ``zict.Buffer``
whose ``fast`` mapping is a ``zict.LRU``. Whatever asks for room (the buffer's own
target, when a value is stored or read back; the worker's memory monitor, through
``evict()``), the LRU evicts ``next(iter(heavy or order))``: a key heavier than the
whole target first, else the first key of ``order``, the least recently used.

:class:`ValueOrder` takes the place of ``order``. It keeps what the LRU keeps (every
key of the fast mapping, in the order of use: a read moves a key to the end) and
iterates the keys by *band* of value per byte, lowest first, least recently used first
within a band. So the LRU's own eviction, along all its paths, evicts the cheapest key
to give up; nothing else of the LRU or the buffer changes, and putting a plain
``InsertionSortedSet`` back (:meth:`ValueOrder.keys_by_use`) restores stock behaviour.

A key's value per byte is what the scheduler sent for it (:meth:`ValueOrder.set_values`),
or :attr:`ValueOrder.neutral` when it sent none, plus, for each task on the worker about
to read it (:meth:`ValueOrder.set_readers`), the seconds per byte of reading it back.
Bands are :data:`RATIO` wide (values within about 19% are a tie, the least recently used
going first): an exact order would cost a heap operation on every read of every key, a
band a dictionary operation. A key whose last reader on the worker finished, with no
other reader known, is *consumed* once it stayed in memory :data:`CONSUMED_AFTER` since:
it goes half a band lower, the last consumed first. A key stored (or read back) is
*young* until the scheduler sent a value for it, or for :attr:`ValueOrder.young` seconds
at most: meanwhile, with no reader on the worker and not consumed, it counts
:attr:`ValueOrder.young_value` more. docs/spill.md ("The model") says why.

Pure (no distributed, no zict): :mod:`amm_rules.engine.spill.plugin` installs it on a
worker; tests drive it alone.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left, insort
from collections.abc import Callable, Container, Hashable, Iterable, Iterator, Mapping
from operator import itemgetter
from typing import TypeVar

_T = TypeVar("_T")

#: Width of a band: values within this ratio of each other are a tie (2 ** 0.25).
RATIO = 2**0.25
_LOG_RATIO = math.log(RATIO)
#: The band of a value of 0 (``spill: first``: given up before anything else) and of
#: an infinite value (``spill: last``: kept while anything else can go).
FIRST_BAND = -(10**6)
LAST_BAND = 10**6
#: Seconds a key stays in memory after its last reader finished before it counts as
#: consumed (a scheduler releases an intermediate result well within it, under load too).
CONSUMED_AFTER = 0.5


def band(value: float) -> int:
    """The band of a value per byte (0 and below: :data:`FIRST_BAND`; infinite:
    :data:`LAST_BAND`)."""
    if value <= 0.0:
        return FIRST_BAND
    if math.isinf(value):
        return LAST_BAND
    return max(FIRST_BAND + 1, min(LAST_BAND - 1, math.floor(math.log(value) / _LOG_RATIO)))


class ValueOrder:
    """The keys of an LRU's fast mapping, iterated lowest band of value per byte first
    (see the module docstring). Supports what ``zict.LRU`` asks of its ``order``:
    ``add``, ``remove``, ``discard``, ``in``, ``len`` and iteration."""

    __slots__ = (
        "_band",
        "_bands",
        "_by_use",
        "_consumed",
        "_nonempty",
        "_pending",
        "_readers",
        "_values",
        "_young",
        "clock",
        "disk",
        "grace",
        "neutral",
        "shadow",
        "weights",
        "young",
        "young_value",
    )

    def __init__(
        self,
        keys: Iterable[Hashable] = (),
        neutral: float = 1e-9,
        weights: Mapping[Hashable, float] | None = None,
        shadow: ShadowLRU | None = None,
        grace: float = CONSUMED_AFTER,
        clock: Callable[[], float] = time.monotonic,
        young: float = 0.0,
        young_value: float = 1.0,
        disk: Container[Hashable] = (),
    ) -> None:
        #: The value per byte of a key the scheduler did not value.
        self.neutral = neutral
        #: The LRU's weights, and the shadow told of each read of a key in memory (a
        #: store is told by the buffer's weight function: see the plugin).
        self.weights = weights
        self.shadow = shadow
        #: Every key, least recently used first.
        self._by_use: dict[Hashable, None] = {}
        #: Band -> its keys, least recently used first; the bands with keys, sorted.
        self._bands: dict[float, dict[Hashable, None]] = {}
        self._nonempty: list[float] = []
        #: Key -> its band, for the keys present.
        self._band: dict[Hashable, float] = {}
        #: Values sent by the scheduler (present keys or not: a key on disk may come
        #: back), and tasks of the worker about to read each key.
        self._values: dict[Hashable, float] = {}
        self._readers: dict[Hashable, float] = {}
        #: Keys whose last reader on the worker finished ``grace`` ago or more, none
        #: other known: given up before the other keys of their band, the last
        #: consumed first.
        self._consumed: set[Hashable] = set()
        #: Keys whose last reader finished less than ``grace`` ago -> when, in that
        #: order: consumed if still present once ``grace`` passed.
        self._pending: dict[Hashable, float] = {}
        self.grace = grace
        self.clock = clock
        #: Keys stored less than ``young`` seconds ago without a value sent -> (when,
        #: whether new rather than read back), in that order; while young (and without
        #: a reader, and not consumed) a key counts ``young_value`` more: one read, in
        #: writes (0 seconds: none is young).
        self._young: dict[Hashable, tuple[float, bool]] = {}
        self.young = young
        self.young_value = young_value
        #: The keys on disk (the buffer's ``slow``): a key stored while still there is
        #: read back, not new.
        self.disk = disk
        for key in keys:
            self.add(key)

    # -- what the LRU asks -----------------------------------------------------------

    def __contains__(self, key: object) -> bool:
        return key in self._by_use

    def __len__(self) -> int:
        return len(self._by_use)

    def __iter__(self) -> Iterator[Hashable]:
        """Keys from the first to give up to the last (the LRU takes the first)."""
        # As a stock ``order`` does, the keys are not copied: the LRU takes the first
        # and stops (the bands, few, are).
        if self._pending:
            self._ripen()
        if self._young:
            self._age()
        for b in list(self._nonempty):
            keys = self._bands.get(b, {})
            yield from (reversed(keys) if b != int(b) else keys)

    def add(self, key: Hashable) -> None:
        """A key stored or read (the LRU removed it first when it was present): last
        used, in the band of its value. A key present already keeps its place."""
        if key in self._by_use:
            return
        # A read in memory: the LRU removed the key and adds it back, its weight kept;
        # a store's weight is not set yet (the weight function told the shadow).
        weight = self.weights.get(key) if self.weights is not None else None
        if weight is not None:
            if self.shadow is not None:
                self.shadow.touch(key, weight)
        elif self.young > 0 and key not in self._values:
            self._young.pop(key, None)
            self._young[key] = (self.clock(), key not in self.disk)
        self._by_use[key] = None
        self._unconsume(key)  # stored or read again
        self._place(key, self.band_of(key))

    def remove(self, key: Hashable) -> None:
        # Not its youth: a read in memory removes the key and adds it back (a key gone
        # for good leaves the young ones as it ages, or when it is forgotten).
        del self._by_use[key]
        self._pending.pop(key, None)
        self._unplace(key)

    def discard(self, key: Hashable) -> None:
        if key in self._by_use:
            self.remove(key)

    # -- what the plugin tells -------------------------------------------------------

    def sent(self, key: Hashable) -> float | None:
        """The value per byte the scheduler sent for the key (None: none)."""
        return self._values.get(key)

    def value_of(self, key: Hashable) -> float:
        """The key's value per byte as the order sees it: the scheduler's (else
        :attr:`neutral`) and its readers' (else, while it is young and not consumed,
        :attr:`young_value`)."""
        extra = self._readers.get(key, 0.0)
        if not extra and key in self._young and key not in self._consumed:
            extra = self.young_value
        return self._values.get(key, self.neutral) + extra

    def band_of(self, key: Hashable) -> float:
        """The key's band; a consumed key's is half a band below its value's."""
        b = band(self.value_of(key))
        return b - 0.5 if key in self._consumed else b

    def set_values(self, values: Mapping[Hashable, float | None]) -> int:
        """Values per byte sent by the scheduler (None: forget the key's value, ordered
        as stock again). Returns how many present keys changed band."""
        stored, young = self._values, self._young
        for key, value in values.items():
            if value is None:
                stored.pop(key, None)
            else:
                stored[key] = value
            if young:
                young.pop(key, None)  # the scheduler came to it: what it knows is sent
        return self._rebands(values)

    def set_young_value(self, value: float) -> int:
        """What a young key counts more (a read back, in writes, as last measured).
        Returns how many present keys changed band."""
        if value == self.young_value:
            return 0
        self.young_value = value
        return self._rebands(list(self._young))

    def set_readers(self, readers: Mapping[Hashable, float]) -> int:
        """Seconds per byte that the worker's own tasks about to read each key would
        spend reading it back (replaces the previous readers: a key not in
        ``readers`` has none). Returns how many present keys changed band."""
        changed = set(self._readers).symmetric_difference(readers)
        changed.update(k for k, v in readers.items() if self._readers.get(k) != v)
        now = self.clock()
        for key in self._readers:
            if key not in readers:
                self._consume(key, now)
        for key in readers:
            self._unconsume(key)
        self._readers = dict(readers)
        return self._rebands(changed)

    def update_readers(self, readers: Mapping[Hashable, float]) -> int:
        """Readers of some keys changed (0: none left); the others keep theirs.
        Returns how many present keys changed band."""
        now = self.clock()
        for key, value in readers.items():
            if value:
                self._readers[key] = value
                self._unconsume(key)
            elif self._readers.pop(key, None) is not None:
                self._consume(key, now)
        return self._rebands(readers)

    def forget(self, keys: Iterable[Hashable]) -> None:
        """Keys that left the worker: their values and readers are dropped."""
        for key in keys:
            self._values.pop(key, None)
            self._readers.pop(key, None)
            self._young.pop(key, None)
            self._unconsume(key)

    def keys_by_use(self) -> list[Hashable]:
        """Every key, least recently used first (what a stock ``order`` holds)."""
        return list(self._by_use)

    @property
    def valued(self) -> int:
        """How many keys have a value sent (present or not)."""
        return len(self._values)

    # -- consumption -------------------------------------------------------------------

    def _consume(self, key: Hashable, now: float) -> None:
        """The key's last reader finished: consumed once ``grace`` has passed; read back
        from disk, it is young no more (a new key stays young through the grace)."""
        young = self._young.get(key)
        if young is not None and not young[1]:
            del self._young[key]  # read back, then read: as a pass over a dataset reads
        if key in self._consumed:
            return
        if self.grace <= 0:
            self._consumed.add(key)  # the caller rebands it
            return
        self._pending[key] = now  # not pending already: a reader came in between

    def _unconsume(self, key: Hashable) -> None:
        """The key is read or stored again, or gone: neither consumed nor on its way."""
        self._consumed.discard(key)
        self._pending.pop(key, None)

    def _ripen(self) -> None:
        """Keys consumed ``grace`` ago or more and still present go half a band down,
        in the order they were consumed (the last consumed is given up first)."""
        ripe = _take_due(self._pending, self.clock() - self.grace, _stamp)
        self._consumed.update(ripe)
        self._rebands(ripe)

    def _age(self) -> None:
        """Keys stored ``young`` ago or more that the scheduler did not come to are young
        no longer (ordered by what the worker knows of them)."""
        # (Those no longer present are skipped by the rebanding.)
        self._rebands(_take_due(self._young, self.clock() - self.young, itemgetter(0)))

    # -- bands -------------------------------------------------------------------------

    def _rebands(self, keys: Iterable[Hashable]) -> int:
        moved = 0
        for key in keys:
            old = self._band.get(key)
            if old is None:
                continue
            new = self.band_of(key)
            if new != old:
                # A change of value is no use: the key keeps its age in its new band
                # (it goes to the end of it: bands are ordered by use, not by age).
                self._unplace(key)
                self._place(key, new)
                moved += 1
        return moved

    def _place(self, key: Hashable, b: float) -> None:
        keys = self._bands.get(b)
        if keys is None:
            keys = self._bands[b] = {}
            insort(self._nonempty, b)
        keys[key] = None
        self._band[key] = b

    def _unplace(self, key: Hashable) -> None:
        b = self._band.pop(key)
        keys = self._bands[b]
        del keys[key]
        if not keys:
            del self._bands[b]
            del self._nonempty[bisect_left(self._nonempty, b)]


def _take_due(
    table: dict[Hashable, _T], due: float, when: Callable[[_T], float]
) -> list[Hashable]:
    """Remove from ``table`` (key -> an entry whose ``when`` is a time, kept in the
    order of those times) the keys whose time is ``due`` or earlier, and return them."""
    out = []
    for key, entry in table.items():
        if when(entry) > due:
            break  # in the order of time: the rest are later
        out.append(key)
    for key in out:
        del table[key]
    return out


def _stamp(since: float) -> float:
    return since


class ShadowLRU:
    """What least-recently-used would have read back from disk under the same accesses:
    the keys a stock buffer of the same size would hold in memory, and those it would
    have written, kept by name and weight only (no data).

    Each use of a key (stored, read back, read in memory: :meth:`touch`) makes it the
    most recently used; a key the stock buffer would have on disk counts as a read back
    of its weight. Whenever the real buffer gives room up (:meth:`fit`, with what it
    will hold), the shadow gives up its least recently used keys down to the same
    weight. Keys released are forgotten (:meth:`forget`). An estimate, not a
    measurement (docs/spill.md, "What the order saved", says why).
    """

    __slots__ = ("disk", "memory", "paused", "read_bytes", "reads", "total")

    def __init__(self) -> None:
        #: Keys in the shadow's memory, least recently used first -> weight; on its disk.
        self.memory: dict[Hashable, float] = {}
        self.disk: dict[Hashable, float] = {}
        self.total = 0.0
        #: Bytes and keys the stock buffer would have read back.
        self.read_bytes = 0.0
        self.reads = 0
        #: Uses not counted (a read back ahead: a stock buffer would not have made it).
        self.paused = False

    def touch(self, key: Hashable, weight: float) -> None:
        if self.paused:
            return
        old = self.memory.pop(key, None)
        if old is not None:
            self.total -= old
        elif self.disk.pop(key, None) is not None:
            self.read_bytes += weight
            self.reads += 1
        self.memory[key] = weight
        self.total += weight

    def fit(self, limit: float) -> None:
        """Give up the least recently used keys until at most ``limit`` is held."""
        memory, disk = self.memory, self.disk
        while self.total > limit and memory:
            key = next(iter(memory))
            weight = memory.pop(key)
            self.total -= weight
            disk[key] = weight

    def forget(self, key: Hashable) -> None:
        weight = self.memory.pop(key, None)
        if weight is not None:
            self.total -= weight
        else:
            self.disk.pop(key, None)
