"""What one drain knows of its worker's keys, and the report it makes of them.

A :class:`Drain` puts each key of the drained worker it looked at in exactly one place:
**safe** (held where its rules want it on workers that stay; :attr:`Drain.moved` those
of them the drain copied), **left** (still to move, ranked in the drain's order:
:attr:`Drain.places`), or **unable to move** (:attr:`Drain.cannot`). Every plan of the
worker's keys updates them (:meth:`Drain.note`); the end of the drain settles them once
more (:meth:`Drain.all_safe` when the retirement found every key placed,
:meth:`Drain.worker_gone` with the keys' copies once the worker left), so that the
report (:meth:`Drain.report`, a :class:`~amm_rules.engine.drain_request.DrainReport`)
counts each key once and its outcome agrees with the counts.

The drain's view of each key and its order of value
(:func:`~amm_rules.engine.evacuation.rank_views`) are shared with the retirements and
``amm-rules simulate --drain``.

Neighbours: :mod:`amm_rules.engine.sections.drain` keeps the drains and paces them;
:mod:`amm_rules.engine.decide.drain` ranks and predicts.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from amm_rules.engine import words
from amm_rules.engine.decide.drain import TIER_NAMES, DrainItem, Prediction, predict
from amm_rules.engine.decide.evacuate import Evacuation
from amm_rules.engine.decide.view import key_string
from amm_rules.engine.drain_request import DRAINING, SAFE, DrainReport

#: Keys whose time to safety is kept per drain.
SAFETY_KEPT = 100_000
#: Keys named per reason a key cannot move.
KEYS_SHOWN = 10


@dataclass
class Drain:
    """One worker's drain (see the module docstring)."""

    address: str
    name: str
    #: Workers drained together share an id (``drain-<n>``).
    drain_id: str
    #: ``time.monotonic()`` at the notice and at the deadline; wall-clock of the notice.
    started: float
    deadline: float
    started_wall: float
    close: bool
    #: ``draining``, then ``safe`` or ``expired``, then ``closed`` or ``left``
    #: (:mod:`amm_rules.engine.drain_request`).
    state: str = DRAINING
    #: Keys left to move, in the drain's order: key -> (place, item).
    places: dict[Hashable, tuple[int, DrainItem]] = field(default_factory=dict)
    #: Keys that cannot move: key -> (item, why).
    cannot: dict[Hashable, tuple[DrainItem, str]] = field(default_factory=dict)
    #: Keys safe, and those of them the drain copied (they were left to move).
    safe: set[Hashable] = field(default_factory=set)
    moved: set[Hashable] = field(default_factory=set)
    #: Seconds from the notice to each key's safety (at most :data:`SAFETY_KEPT`).
    safe_after: dict[Hashable, float] = field(default_factory=dict)
    #: The bytes of the worker's retirement's copies landed before the drain (the ledger
    #: counts them since the start), and the bytes its copies moved since.
    bytes_before: int = 0
    moved_bytes: int = 0
    copies: int = 0
    first_asked: float | None = None
    #: The prediction made at the notice, and the latest.
    first: Prediction | None = None
    last: Prediction | None = None
    last_event: float = 0.0
    #: The scheduler's time of the last heartbeat of the worker read.
    last_seen: float | None = None
    #: What the drain found when it ended, and when (``time.monotonic()``).
    outcome: dict[str, Any] | None = None
    ended: float | None = None

    @property
    def active(self) -> bool:
        return self.state == DRAINING

    @property
    def owner(self) -> str:
        """Who holds the keys waiting for their turn (the claims)."""
        return f"the drain of {self.address}"

    def seconds_left(self, now: float) -> float:
        """Seconds to the deadline, now or when the drain ended (never below 0)."""
        return max(0.0, self.deadline - (now if self.ended is None else self.ended))

    # -- the keys' standing ------------------------------------------------------------

    def note(self, plan: Evacuation, items: Mapping[Hashable, DrainItem], now: float) -> None:
        """The standing of the keys after a plan of the worker's keys (``items``: the
        drain's view of each, as last ranked): safe, left to move (ranked), unable to
        move."""
        for key in plan.satisfied:
            self._safe(key, now)
        self.cannot = {s.key: (items.get(s.key) or DrainItem(s.key, 0), s.why) for s in plan.stuck}
        todo = dict.fromkeys([c.key for c in plan.copies] + list(plan.waiting))
        ranked = [items[k] for k in todo if k in items]
        self.places = {item.key: (i, item) for i, item in enumerate(ranked)}
        for key in (*self.places, *self.cannot):  # no longer safe (a holder left)
            if key in self.safe:
                self.safe.discard(key)
                self.moved.discard(key)

    def _safe(self, key: Hashable, now: float) -> None:
        if key in self.safe:
            return
        self.safe.add(key)
        if key in self.places:
            self.moved.add(key)
        if len(self.safe_after) < SAFETY_KEPT:
            self.safe_after[key] = now - self.started

    def predict(self, rate: float, source: str, now: float) -> Prediction:
        """The prediction for the keys left, at ``rate`` with the seconds left."""
        ranked = [item for _, item in self.places.values()]  # kept in the drain's order
        cannot = [item for item, _ in self.cannot.values()]
        return predict(ranked, rate, self.seconds_left(now), source, cannot)

    def all_safe(self, now: float) -> None:
        """The retirement found every key held where its rules want it: none is left."""
        for key in self.places:
            self._safe(key, now)
        self.places = {}

    def worker_gone(self, tasks: Mapping[Hashable, Any], now: float) -> tuple[int, float, int]:
        """The worker left: each key left or unable to move is safe if its copies
        elsewhere hold its minimum, else left (lost without a copy, or below its
        minimum). Returns the keys lost, their recompute seconds, and the keys below
        their minimum."""
        lost, seconds, below = 0, 0.0, 0
        left: dict[Hashable, tuple[int, DrainItem]] = {}
        cannot: dict[Hashable, tuple[DrainItem, str]] = {}
        for key, place, item, why in [
            *((k, p, i, "") for k, (p, i) in self.places.items()),
            *((k, -1, i, w) for k, (i, w) in self.cannot.items()),
        ]:
            ts = tasks.get(key)
            held = len(ts.who_has or ()) if ts is not None and ts.state == "memory" else 0
            if held and held >= (item.minimum or 1):
                self._safe(key, now)
                continue
            if not held:
                lost += 1
                seconds += item.seconds or 0.0
            else:
                below += 1
            if place < 0:
                cannot[key] = (item, why)
            else:
                left[key] = (place, item)
        self.places, self.cannot = left, cannot
        return lost, seconds, below

    def end(self, state: str, now: float, counted: tuple[int, float, int] | None = None) -> None:
        """The drain ends in ``state``: what it left unsafe, as ``counted`` (keys lost,
        their recompute seconds, keys below their minimum: once the worker left), or as
        the last prediction found it (nothing once every key is safe)."""
        self.state = state
        if self.ended is None:
            self.ended = now
        last = self.last
        if counted is not None:
            unsafe, seconds, below = counted
        elif state == SAFE or last is None:
            unsafe, seconds, below = 0, 0.0, 0
        else:
            unsafe = last.lost_keys + last.cannot_move
            seconds = last.lost_seconds + last.cannot_move_seconds
            below = last.below_min
        moved = words.counted(len(self.moved), "key")
        text = f"{moved} moved ({words.size(self.moved_bytes)}), " + (
            f"{words.counted(unsafe, 'key')} not safe (≈ {words.duration(seconds)} of "
            f"recompute), {below:,} below their minimum"
            if unsafe or below
            else "every key safe"
        )
        self.outcome = {
            "elapsed": round(self.ended - self.started, 3),
            "moved_keys": len(self.moved),
            "moved_bytes": self.moved_bytes,
            "copies": self.copies,
            "unsafe_keys": unsafe,
            "unsafe_seconds": round(seconds, 3),
            "below_min": below,
            "text": text,
        }

    # -- what it says ------------------------------------------------------------------

    def cannot_stay(self) -> list[dict[str, Any]]:
        """What cannot stay where its rules want it, by reason: keys, bytes, rules."""
        by_why: dict[str, dict[str, Any]] = {}
        for key, (item, why) in self.cannot.items():
            entry = by_why.setdefault(why, {"why": why, "keys": 0, "bytes": 0, "shown": []})
            entry["keys"] += 1
            entry["bytes"] += max(0, item.nbytes)
            if len(entry["shown"]) < KEYS_SHOWN:
                entry["shown"].append(key_string(key))
        return sorted(by_why.values(), key=lambda e: -e["keys"])

    def report(self, now: float, rate: float, source: str, in_flight_bytes: int) -> DrainReport:
        """The drain's report (rate: the transfer rate, and where it came from)."""
        times = sorted(self.safe_after.values())
        last = self.last
        return DrainReport(
            worker=self.address,
            name=self.name,
            drain=self.drain_id,
            state=self.state,
            close=self.close,
            started=self.started_wall,
            elapsed=round((now if self.ended is None else self.ended) - self.started, 3),
            seconds_left=round(self.seconds_left(now), 3),
            deadline=round(self.deadline - self.started, 3),
            moved_keys=len(self.moved),
            moved_bytes=self.moved_bytes,
            copies=self.copies,
            in_flight_bytes=in_flight_bytes,
            keys_left=len(self.places),
            bytes_left=sum(item.bytes_needed for _, item in self.places.values()),
            safe_keys=len(self.safe),
            rate={"bytes_per_second": round(rate, 1), "source": source},
            prediction=words.prediction_record(last) if last is not None else None,
            first_prediction=(
                words.prediction_record(self.first) if self.first is not None else None
            ),
            cannot_stay=self.cannot_stay(),
            time_to_safety={
                "keys": len(times),
                "median": round(times[len(times) // 2], 3) if times else None,
                "max": round(times[-1], 3) if times else None,
            },
            outcome=self.outcome,
        )

    def explain(self, key: Hashable, in_flight: bool) -> dict[str, Any]:
        """Where ``key`` stands in the drain: its place in the order and why, why it
        cannot move, or safe."""
        out: dict[str, Any] = {"worker": self.address, "drain": self.drain_id, "state": self.state}
        if key in self.cannot:
            return {**out, "standing": "cannot move", "why": self.cannot[key][1]}
        if key in self.places:
            place, item = self.places[key]
            cutoff = self.last.cutoff if self.last is not None else None
            in_time = cutoff is None or place < cutoff
            why = words.drain_item_why(item)
            return {
                **out,
                "standing": "in flight" if in_flight else "waiting",
                "place": place + 1,
                "of": len(self.places),
                "tier": TIER_NAMES[item.tier],
                "why": why,
                "in_time": in_time,
                "text": f"moved {_ordinal(place + 1)} of {len(self.places)} ({why}); "
                + ("expected to leave in time" if in_time else "not expected to leave in time"),
            }
        return {**out, "standing": "safe", "why": "held where its rules want it elsewhere"}


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


__all__ = ["Drain"]
