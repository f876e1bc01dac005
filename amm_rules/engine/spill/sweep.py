"""The scheduler's part of ``spill:``: a sweep over the keys of the workers near their
memory target, in slices of a cycle.

The worker orders its own keys (:mod:`amm_rules.engine.spill.order`): by what writing
them costs, by the tasks of its own about to read them, and the consumed ones first.
The scheduler knows three things more, and sends a value per byte
(:func:`amm_rules.engine.decide.spill.value_per_byte`) only for the keys it knows one
of, which are few: tasks on other workers (or not assigned yet) about to read the key,
copies of it on other workers, and a rule's ``spill``. A key with none of these gets no
value, and one whose value was sent and no longer has any is forgotten (the worker
orders it by what it knows itself).

:class:`Sweep` visits the workers at least :data:`VALUE_AT` of the way to writing to
disk, or holding keys on disk, the fullest first, one worker's keys after another
(:class:`_Pass`), within a deadline a cycle; a pass cut short goes on at the next
cycle. Per key that has nothing to say it costs a few attribute reads and no
allocation. At the end of a worker's pass, the copies held elsewhere that the engine
may drop from it (``drop-copies``) are its candidates for the next drops, lowest value
first, and the values sent for keys no longer on it are forgotten.

Neighbours: :mod:`amm_rules.engine.sections.spill` runs it each cycle and sends what it
found; :mod:`amm_rules.engine.state.spilled` says how full each worker is.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping
from operator import itemgetter
from typing import Any

from amm_rules.engine.decide.spill import changed, value_per_byte

#: A worker's keys are valued once it is this share of the way to writing to disk
#: (:attr:`WorkerDisk.fullness <amm_rules.engine.state.spilled.WorkerDisk.fullness>`),
#: or it holds keys on disk.
VALUE_AT = 0.5
#: Keys looked at between two reads of the clock.
CHUNK = 64

#: What the sweep asks of its section: may the copy of ``ts`` on ``ws`` be dropped
#: (None: it may; else why not).
Keeps = Callable[[Any, Any], "str | None"]


class _Pass:
    """One worker's keys, looked at in turn, taken up again at the next cycle if cut
    short."""

    __slots__ = ("address", "at", "candidates", "forget", "keys", "seen", "values", "ws")

    def __init__(self, address: str, ws: Any) -> None:
        self.address = address
        self.ws = ws
        #: A snapshot: the worker's keys change between cycles.
        self.keys: list[Any] = list(ws.has_what)
        self.at = 0
        #: Keys valued in this pass (their values kept), values to send, keys whose
        #: value is to be forgotten, and the copies the engine may drop.
        self.seen: set[Hashable] = set()
        self.values: list[tuple[Hashable, float]] = []
        self.forget: list[Hashable] = []
        self.candidates: list[tuple[float, Any]] = []


class Sweep:
    """The sweep over the keys of the workers near their target (see the module
    docstring). ``rates(address)``: the seconds per byte of a write and of a read back
    measured on that worker; ``keeps``: see :data:`Keeps`."""

    def __init__(self, rates: Callable[[str], tuple[float, float]], keeps: Keeps) -> None:
        self._rates = rates
        self._keeps = keeps
        #: Worker -> key -> the value per byte last sent.
        self.sent: dict[str, dict[Hashable, float]] = {}
        #: Worker -> the copies the engine may drop from it, found at its last pass:
        #: (value per byte, task), the lowest value last (taken with ``pop``).
        self.candidates: dict[str, list[tuple[float, Any]]] = {}
        #: Workers still to visit in this round (the fullest last), and the pass under way.
        self._queue: list[str] = []
        self._pass: _Pass | None = None

    def clear(self) -> None:
        self.sent.clear()
        self.candidates.clear()
        self._queue = []
        self._pass = None

    def forget_workers(self, gone: set[str]) -> None:
        for address in gone:
            self.sent.pop(address, None)
            self.candidates.pop(address, None)
        if self._pass is not None and self._pass.address in gone:
            self._pass = None

    def run(
        self,
        workers: Mapping[str, Any],
        near: Mapping[str, float],
        desired: Mapping[Hashable, Any],
        drop_copies: bool,
        deadline: float,
        send: Callable[[str, list[tuple[Hashable, float]], list[Hashable]], None],
    ) -> None:
        """Go on with the sweep until ``deadline`` (``time.perf_counter()``), at most
        one round over the workers of ``near`` (address -> how near it is to writing to
        disk) a cycle; ``send(address, values, forget)`` what changed."""
        refilled = False
        while time.perf_counter() < deadline:
            current = self._pass
            if current is None:
                if not self._queue:
                    if refilled or not near:
                        return
                    # The fullest last: popped first.
                    self._queue = sorted(near, key=near.__getitem__)
                    refilled = True
                address = self._queue.pop()
                ws = workers.get(address)
                if ws is None:
                    continue
                current = self._pass = _Pass(address, ws)
            done = self._value_some(current, desired, drop_copies, deadline)
            send(current.address, current.values, current.forget)
            current.values, current.forget = [], []
            if not done:
                return
            self._end(current)
            self._pass = None

    def _value_some(
        self, p: _Pass, desired: Mapping[Hashable, Any], drop_copies: bool, deadline: float
    ) -> bool:
        """Value the pass's keys from where it stands, until ``deadline``; True when
        it went through them all."""
        ws = p.ws
        write, read = self._rates(p.address)
        sent = self.sent.setdefault(p.address, {})
        keys, seen, values, forget = p.keys, p.seen, p.values, p.forget
        keeps = self._keeps
        while p.at < len(keys):
            for ts in keys[p.at : p.at + CHUNK]:
                who_has = ts.who_has
                if not who_has:
                    continue  # no longer in memory
                copies = len(who_has)
                reads = 0
                on_copies = 0
                waiters = ts.waiters
                if waiters:
                    for w in waiters:
                        on = w.processing_on
                        if on is ws:
                            continue  # the worker counts the readers of its own
                        if on is not None and copies > 1 and on in who_has:
                            on_copies += 1  # reads the copy there
                        else:
                            reads += 1
                key = ts.key
                d = desired.get(key) if desired else None
                spill = d.spill if d is not None else None
                if not reads and copies == 1 and spill is None:
                    # Nothing the worker does not know: no value (one sent is forgotten).
                    if key in sent:
                        del sent[key]
                        forget.append(key)
                    continue
                # A copy the engine may not drop is valued as a sole one.
                droppable = drop_copies and copies > 1 and keeps(ts, ws) is None
                value = value_per_byte(
                    ts.nbytes,
                    reads,
                    copies,
                    write=write,
                    read=read,
                    drop_copies=droppable,
                    spill=spill,
                    # Released once those finish, unless a client holds it or more wait.
                    releasing=bool(on_copies) and not reads and not ts.who_wants,
                )
                seen.add(key)
                if droppable:
                    p.candidates.append((value, ts))
                if changed(sent.get(key), value):
                    sent[key] = value
                    values.append((key, value))
            p.at += CHUNK
            if p.at < len(keys) and time.perf_counter() >= deadline:
                return False
        return True

    def _end(self, p: _Pass) -> None:
        """A worker's pass is through: its candidates for drops replace the last ones,
        and values of keys it no longer holds are forgotten (here; the worker forgets
        them as they leave)."""
        sent = self.sent.get(p.address)
        if sent:
            for key in [k for k in sent if k not in p.seen]:
                del sent[key]
        if p.candidates:
            p.candidates.sort(key=itemgetter(0), reverse=True)
            self.candidates[p.address] = p.candidates
        else:
            self.candidates.pop(p.address, None)


__all__ = ["CHUNK", "VALUE_AT", "Sweep"]
