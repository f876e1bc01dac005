"""The ledger: what the engine asked of the workers and has not seen land.

The AMM forgets what it was asked between two cycles; the engine must not, or a slow
transfer is asked for again, elsewhere, then trimmed. Whoever asks writes here, and
whoever must not ask twice reads here: one record, never a copy of it.

- **copies**: key -> {recipient: :class:`Copy` (who asked, deadline, bytes)}, accepted by
  the AMM and not seen on the recipient (:meth:`Ledger.record`,
  :meth:`Ledger.in_flight`): the planner counts them toward a key's target, protect
  toward its copies, an evacuation toward a leaving worker's keys;
- **back-offs**: key -> {worker: until}: a copy there timed out, or its source died
  (:meth:`Ledger.back_off`, :meth:`Ledger.backing_off`);
- **moves**: key -> rebalancing's :class:`~amm_rules.engine.rebalance.plan.PendingMove`
  (a copy, then a drop once it landed), settled by its
  :class:`~amm_rules.engine.rebalance.plan.MoveBook`; a move's copy is not among the
  copies the planner counts;
- **landings**: the copies that landed since the last cycle (:meth:`Ledger.just_landed`:
  the planner drops them last), per asker since the start (:meth:`Ledger.landings`:
  what a drain moved), and per recipient until its next heartbeat
  (:meth:`Ledger.unseen`: the memory a worker reports does not show them yet, and the
  paused-workers section must not send a worker past its pause threshold).

A drop needs no entry to be counted: the scheduler forgets a copy when the AMM asks for
its drop. A drop made to give a worker room (the ``spill`` section's, a copy held
elsewhere dropped rather than written to disk) is recorded all the same
(:meth:`Ledger.dropped`, :meth:`Ledger.drops_of`): its worker is backed off from for the
key, so that no section copies the key back to the worker short of memory, and explain
says why.

Who writes and reads it, and when: docs/architecture.md (``ctx.ledger``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from amm_rules.engine.rebalance.plan import PendingMove


class Copy(NamedTuple):
    """One copy asked for and not seen landing."""

    #: Who asked: a section (``replication``, ``protect``) or an owner in one
    #: (``retirement of tcp://...``).
    by: str
    #: The engine's clock when it is given up (and its worker backed off from).
    deadline: float
    nbytes: int = 0


class Drop(NamedTuple):
    """A copy dropped to give its worker room, and not to be copied back before
    ``until``."""

    #: Who dropped it (``spill``), and why, in a few words.
    by: str
    why: str
    #: The engine's clock when the drop was asked, and when its back-off ends.
    at: float
    until: float


_NONE: Mapping[str, Any] = {}
_NOTHING: frozenset[str] = frozenset()


class Ledger:
    """What the engine asked and has not seen land (see the module docstring). The hot
    paths read :attr:`copies`, :attr:`backoffs` and :attr:`moves` directly; only this
    class (and the move book, :attr:`moves`) writes them, and never rebinds them."""

    def __init__(self) -> None:
        self.copies: dict[Hashable, dict[str, Copy]] = {}
        self.backoffs: dict[Hashable, dict[str, float]] = {}
        self.moves: dict[Hashable, PendingMove] = {}
        #: key -> {worker: Drop}: copies dropped to give a worker room (their workers
        #: are backed off from in :attr:`backoffs` until the same time).
        self.drops: dict[Hashable, dict[str, Drop]] = {}
        #: Landings since the last expire, and as of it (what plans read).
        self._landing: dict[Hashable, set[str]] = {}
        self._landed: dict[Hashable, set[str]] = {}
        #: Keys whose copies settled as of the last expire, and those forgotten since.
        self._settled: set[Hashable] = set()
        self._settling: set[Hashable] = set()
        #: Per asker, since the start: copies and bytes landed.
        self._count: Counter[str] = Counter()
        self._bytes: Counter[str] = Counter()
        #: Per recipient, the copies landed that its heartbeats may not show yet:
        #: key -> (bytes, the recipient's last heartbeat when it landed).
        self._unseen: dict[str, dict[Hashable, tuple[int, float | None]]] = {}

    def __repr__(self) -> str:
        return f"<Ledger {len(self)} copies in flight, {len(self.moves)} moves>"

    def __len__(self) -> int:
        """Copies in flight."""
        return sum(len(entry) for entry in self.copies.values())

    # ------------------------------------------------------------------ writing

    def record(
        self, key: Hashable, worker: str, by: str, deadline: float, nbytes: int = 0
    ) -> None:
        """The AMM accepted a copy of ``key`` to ``worker``, asked by ``by``."""
        self.copies.setdefault(key, {})[worker] = Copy(by, deadline, nbytes)

    def landed(self, key: Hashable, worker: str, seen: float | None = None) -> Copy | None:
        """``worker`` now holds ``key``: the copy asked there, if any, is done (returned).
        ``seen``: the worker's last heartbeat (the copy counts in :meth:`unseen` until a
        later one)."""
        entry = self.copies.get(key)
        copy = entry.pop(worker, None) if entry is not None else None
        if copy is not None:
            if not entry:
                del self.copies[key]
            self._land(self._landing, key, worker, copy, seen)
        return copy

    def _land(
        self,
        table: dict[Hashable, set[str]],
        key: Hashable,
        worker: str,
        copy: Copy,
        seen: float | None,
    ) -> None:
        table.setdefault(key, set()).add(worker)
        self._count[copy.by] += 1
        self._bytes[copy.by] += copy.nbytes
        if copy.nbytes:
            self._unseen.setdefault(worker, {})[key] = (copy.nbytes, seen)

    def give_up(self, key: Hashable, until: float) -> None:
        """Forget the copies of ``key`` in flight and back off from their workers until
        ``until`` (their source died: a fetch from a dead worker can hang)."""
        entry = self.copies.pop(key, None)
        if entry:
            self.back_off(key, entry, until)

    def back_off(self, key: Hashable, workers: Iterable[str], until: float) -> None:
        """Ask none of ``workers`` for a copy of ``key`` before ``until`` (or later)."""
        for worker in workers:
            table = self.backoffs.setdefault(key, {})
            table[worker] = max(table.get(worker, until), until)

    def dropped(
        self, key: Hashable, worker: str, by: str, why: str, at: float, until: float
    ) -> None:
        """``by`` had the copy of ``key`` on ``worker`` dropped to give it room: no copy
        of ``key`` is asked of ``worker`` before ``until`` (a back-off, which says why)."""
        self.drops.setdefault(key, {})[worker] = Drop(by, why, at, until)
        self.back_off(key, (worker,), until)

    def forget(self, key: Hashable) -> None:
        """The key left memory: nothing of it is in flight any more."""
        tables: tuple[dict[Hashable, Any], ...] = (
            self.copies,
            self.backoffs,
            self._landing,
            self.drops,
        )
        for table in tables:
            if table:
                table.pop(key, None)
        if self._settling:
            self._settling.discard(key)

    def worker_left(self, worker: str) -> None:
        """``worker`` left: copies asked of it never land, backing off from it is moot."""
        self._unseen.pop(worker, None)
        tables: tuple[dict[Hashable, Any], ...] = (self.copies, self.backoffs, self.drops)
        for table in tables:
            for key in [k for k, entry in table.items() if worker in entry]:
                del table[key][worker]
                if not table[key]:
                    del table[key]
                if table is self.copies:
                    self._settling.add(key)

    def expire(
        self,
        now: float,
        backoff: float,
        holders: Callable[[Hashable], Collection[str] | None],
        staying: Callable[[str], bool],
        seen: Callable[[str], float | None] = lambda worker: None,
    ) -> None:
        """Bring the ledger to ``now``, once per cycle: a copy on its recipient
        (``holders(key)``, None once the key left memory) landed; one to a key no longer
        in memory, or a worker gone or retiring (``staying`` false), is forgotten; one
        past its deadline is given up and its worker backed off from for ``backoff``
        seconds. Back-offs that ended, or from workers gone, are dropped; so are the
        landings a heartbeat has shown since (``seen(worker)``: its last heartbeat).
        The landings since the last call become :meth:`just_landed`'s, the keys whose
        copies settled :meth:`settled_keys`'."""
        self._landed, self._landing = self._landing, {}
        settled = self._settled = set(self._landed) | self._settling
        self._settling = set()
        for key, entry in list(self.copies.items()):
            held = holders(key)
            for worker, copy in list(entry.items()):
                if held is not None and worker in held:
                    self._land(self._landed, key, worker, copy, seen(worker))
                elif held is not None and staying(worker) and copy.deadline > now:
                    continue
                elif held is not None and staying(worker):
                    self.back_off(key, (worker,), now + backoff)
                del entry[worker]
                settled.add(key)
            if not entry:
                del self.copies[key]
        for key, table in list(self.backoffs.items()):
            for worker in [w for w, until in table.items() if until <= now or not staying(w)]:
                del table[worker]
            if not table:
                del self.backoffs[key]
        for key, drops in list(self.drops.items()):
            for worker in [w for w, drop in drops.items() if w not in self.backoffs.get(key, ())]:
                del drops[worker]
            if not drops:
                del self.drops[key]
        self._forget_seen(seen)

    # ------------------------------------------------------------------ reading

    def in_flight(self, key: Hashable) -> Mapping[str, Copy]:
        """The copies of ``key`` asked for and not seen landing: recipient -> Copy."""
        return self.copies.get(key, _NONE)

    def backing_off(self, key: Hashable) -> Mapping[str, float]:
        """Workers not asked for a copy of ``key`` before a time: address -> until."""
        return self.backoffs.get(key, _NONE)

    def drops_of(self, key: Hashable) -> Mapping[str, Drop]:
        """Copies of ``key`` dropped to give their workers room, still backed off from:
        worker -> Drop."""
        return self.drops.get(key, _NONE)

    def just_landed(self, key: Hashable) -> frozenset[str]:
        """Recipients of copies of ``key`` that landed between the last two cycles (and
        since the last one, for a look between cycles)."""
        out = self._landed.get(key) if self._landed else None
        more = self._landing.get(key) if self._landing else None
        if out is None and more is None:
            return _NOTHING
        return frozenset(out or ()) | frozenset(more or ())

    def settled_keys(self) -> Collection[Hashable]:
        """Keys whose copies settled (landed, given up, forgotten) as of the last
        :meth:`expire`: their plans look again (a copy given up leaves a key short)."""
        return self._settled

    def asked_by(self, by: str) -> dict[Hashable, tuple[str, Copy]]:
        """The copies in flight ``by`` asked for: key -> (recipient, Copy). A walk over
        every copy in flight: for status and a drain's window, never a cycle's loop."""
        return {
            key: (worker, copy)
            for key, entry in self.copies.items()
            for worker, copy in entry.items()
            if copy.by == by
        }

    def landings(self, by: str) -> tuple[int, int]:
        """Copies and bytes asked by ``by`` that landed, since the start."""
        return self._count[by], self._bytes[by]

    def unseen(self, seen: Callable[[str], float | None]) -> dict[str, int]:
        """Bytes per recipient its heartbeats may not show yet: the copies in flight to
        it, and those that landed since its last heartbeat (``seen(worker)``; the
        others are forgotten here). A walk over every copy in flight."""
        self._forget_seen(seen)
        out: Counter[str] = Counter()
        for worker, landed in self._unseen.items():
            out[worker] += sum(nbytes for nbytes, _ in landed.values())
        for entry in self.copies.values():
            for worker, copy in entry.items():
                if copy.nbytes:
                    out[worker] += copy.nbytes
        return dict(out)

    def _forget_seen(self, seen: Callable[[str], float | None]) -> None:
        """Forget the landings a heartbeat of their recipient came after (or whose
        recipient says no heartbeat at all: a simulation's)."""
        for worker, landed in list(self._unseen.items()):
            now = seen(worker)
            for key in [k for k, (_, then) in landed.items() if now is None or then != now]:
                del landed[key]
            if not landed:
                del self._unseen[worker]


__all__ = ["Copy", "Drop", "Ledger"]
