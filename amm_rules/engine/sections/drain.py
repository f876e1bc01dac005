"""The ``drain`` section: workers that must leave before a deadline send what is worth
most first, and the engine says early what will be lost. docs/drain.md has the order
of value, the prediction, the deadline and what is shown.

A drain is a retirement with a deadline and an order of value. :meth:`DrainSection.start`
(the ``amm_rules_drain`` handler, behind :func:`amm_rules.drain`, ``amm-rules drain`` and
the worker preload :mod:`amm_rules.worker`) checks the request, says first what cannot
stay where its rules want it, with the first prediction, and retires the workers through
``Scheduler.retire_workers``, as the :class:`~amm_rules.engine.state.leaving.Pacer` of
their retirements (their departure names the drain, and keeps their copies until they
go): each cycle it ranks a worker's keys by value, lets through only the copies that fit
a window of bytes in flight (:data:`WINDOW_SECONDS` of the measured rate), so that the
recipients fetch in that order, and holds the keys still waiting for their turn
(:mod:`amm_rules.engine.state.claims`). Keys that cannot move are reported, not a reason
to refuse; the drain never drops a copy itself. Between two cycles a ticker (every
:data:`TICK` seconds while a drain runs) measures the rate, notes the copies that
landed, asks for an early cycle when the window has room, and acts at the deadline.

What each drain knows of its worker's keys, and its report, is a
:class:`~amm_rules.engine.state.drain.Drain`; the request's checks and the report's record
are shared with the client, the command line and the worker preload
(:mod:`amm_rules.engine.drain_request`).

Neighbours: :mod:`amm_rules.engine.decide.drain` ranks and predicts;
:mod:`amm_rules.engine.sections.retirement` enacts; :mod:`amm_rules.engine.handlers`
owns the handler names.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Hashable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from amm_rules.engine import words
from amm_rules.engine.decide.drain import DrainItem, Prediction
from amm_rules.engine.decide.evacuate import Evacuation, plan_evacuation
from amm_rules.engine.decide.view import ClusterView, KeyView
from amm_rules.engine.drain_request import (
    CLOSED,
    EXPIRED,
    LEFT,
    SAFE,
    deadline_seconds,
    resolve_workers,
)
from amm_rules.engine.evacuation import evacuation_input, rank_views
from amm_rules.engine.sections.base import Section, spawn
from amm_rules.engine.state.drain import Drain
from amm_rules.engine.state.leaving import Departure, retirement_owner
from amm_rules.engine.state.transfer import TransferMeter

if TYPE_CHECKING:
    from amm_rules.engine.context import EngineContext

logger = logging.getLogger(__name__)

#: Seconds between two ticks of a running drain.
TICK = 0.2
#: The window of bytes in flight: this many seconds at the measured rate (at least
#: :data:`MIN_WINDOW` bytes).
WINDOW_SECONDS = 1.5
MIN_WINDOW = 8 * 2**20
#: Drains that ended, kept for status.
RECENT = 10
#: A new prediction is an event when its loss moved by this share, at most every
#: :data:`PREDICTION_GAP` seconds per worker.
PREDICTION_CHANGE = 0.1
PREDICTION_GAP = 2.0


class DrainSection(Section):
    """Drains before a deadline (see the module docstring)."""

    name = "drain"
    status_key = "drain"
    explain_key = "drain"
    metric_prefix = "drain"
    METRICS = {
        "draining": ("draining_workers", "gauge", "Workers draining now"),
        "drains": ("drains", "counter", "Workers drained (amm-rules drain, the worker preload)"),
        "copies": ("drain_copies", "counter", "Copies asked for by drains"),
        "bytes": ("drain_moved_bytes", "counter", "Bytes of drain copies that landed"),
        "lost_keys": (
            "drain_lost_keys",
            "counter",
            "Keys not safe when their drain ended at its deadline or with its worker",
        ),
        "predicted_loss_seconds": (
            "drain_predicted_loss_seconds",
            "gauge",
            "Recompute seconds the running drains are predicted to lose",
        ),
        "seconds_left": (
            "drain_seconds_left",
            "gauge",
            "Seconds to the nearest deadline of a running drain (0: none runs)",
        ),
        "rate": ("drain_rate_bytes", "gauge", "Bytes per second the running drains send"),
    }

    def __init__(self, ctx: EngineContext) -> None:
        super().__init__(ctx)
        #: Every drain known: address -> its drain (the running ones and the last ended).
        self.drains: dict[str, Drain] = {}
        self.recent: list[Drain] = []
        self.meter = TransferMeter()
        self.counters: Counter[str] = Counter()
        #: Per drained worker, the drain's view of each of its keys, as last ranked.
        self.items: dict[str, dict[Hashable, DrainItem]] = {}
        self._ids = 0
        self._tasks: set[asyncio.Future[Any]] = set()
        self._ticker: asyncio.Future[Any] | None = None

    # -- detach ----------------------------------------------------------------------

    def detach(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for d in self.drains.values():
            self._let_go(d)

    def _let_go(self, d: Drain) -> None:
        """The drain of ``d`` no longer holds keys, paces nor keeps the worker's copies."""
        self.ctx.claims.release(d.owner)
        self.ctx.departures.stay(d.address, self.name)

    def in_flight(self, d: Drain) -> dict[Hashable, int]:
        """The drain's copies in flight (the retirement's of its worker, in the ledger):
        key -> bytes."""
        asked = self.ctx.ledger.asked_by(retirement_owner(d.address))
        return {key: copy.nbytes for key, (_, copy) in asked.items()}

    def _sample(self, d: Drain, ws: Any) -> None:
        """A heartbeat of a drained worker arrived since the last tick: what it sent.
        (Read at each tick rather than by wrapping the heartbeat handler: heartbeats
        come every 0.5 s or more, ticks every :data:`TICK`.)"""
        seen = getattr(ws, "last_seen", None)
        if seen is not None and seen != d.last_seen:
            d.last_seen = seen
            self.meter.heartbeat(d.address, seen, getattr(ws, "metrics", None))

    # -- starting --------------------------------------------------------------------

    def start(self, workers: Any, deadline: Any, close: bool = False) -> dict[str, Any]:
        """Drain ``workers`` (addresses or names) within ``deadline`` (seconds, or a
        duration such as ``"60s"``); ``ValueError`` with a sentence for a bad request.
        Returns :meth:`report` of the workers, with the first prediction."""
        ctx = self.ctx
        seconds = deadline_seconds(deadline)
        if not ctx.departures.paced:
            raise ValueError(
                "drain needs the rules' retirement: the policy runs with "
                "retire_by_rules=False, so retiring workers are placed by distributed alone"
            )
        addresses = resolve_workers(ctx.scheduler.workers, workers)
        now = time.monotonic()
        self._ids += 1
        drain_id = f"drain-{self._ids}"
        new = []
        for address in addresses:
            known = self.drains.get(address)
            if known is not None and known.active:
                continue  # already draining: its deadline stands
            ws = ctx.scheduler.workers[address]
            d = Drain(address, str(ws.name), drain_id, now, now + seconds, time.time(), close)
            # The heartbeat heard before the notice is not the drain's: the meter starts
            # from the next one (which only marks the time), not to count as the drain's
            # what the worker sent before it (the results a client gathered a moment ago).
            d.last_seen = getattr(ws, "last_seen", None)
            d.bytes_before = ctx.ledger.landings(retirement_owner(address))[1]
            self.drains[address] = d
            self.meter.watch(address)
            # Leaving (drain over or not) until it goes, keeping its copies until then.
            until = time.strftime("%H:%M:%S", time.localtime(d.started_wall + seconds))
            ctx.departures.leave(
                address, Departure(self.name, f"draining until {until}", True, self)
            )
            new.append(d)
        if new:
            self.counters["drains"] += len(new)
            leaving = set(ctx.leaving())
            for d in new:
                self._first_prediction(d, leaving, now)
            spawn(self._tasks, self._retire([d.address for d in new], close))
            self._ensure_ticker()
        return self.report(addresses)

    def _first_prediction(self, d: Drain, leaving: set[str], now: float) -> None:
        """What the drain will lose, said before it starts (step 1)."""
        ctx = self.ctx
        self._replan(d, ctx.scheduler.workers[d.address], leaving, now)
        self._pace(d, set())
        d.first = d.last
        cannot = d.cannot_stay()
        text = words.prediction_sentence(d.last) if d.last is not None else ""
        logger.warning(
            "amm-rules: draining %s within %s: %s",
            d.address,
            words.duration(d.deadline - now),
            text,
        )
        ctx.events.emit(
            "drain",
            step="started",
            worker=d.address,
            name=d.name,
            drain=d.drain_id,
            deadline=round(d.deadline - now, 3),
            close=d.close,
            prediction=text,
            cannot_stay=cannot,
        )

    def _replan(self, d: Drain, ws: Any, leaving: set[str], now: float) -> None:
        """Plan the worker's keys in the drain's order (with ``leaving`` gone), and note
        the plan (:meth:`_note`)."""
        tasks = [ts for ts in ws.has_what if not ts.actor]
        views, cluster = evacuation_input(self.ctx, tasks, leaving)
        plan = plan_evacuation(self.rank(ws, views, cluster), cluster, now=now)
        self._note(d, ws, plan, now)

    async def _retire(self, addresses: list[str], close: bool) -> None:
        """Retire the drained workers (closing them once their keys are safe, with
        ``close``); the deadline is the ticker's."""
        ctx = self.ctx
        try:
            await ctx.scheduler.retire_workers(
                workers=addresses,
                close_workers=close,
                remove=close,
                stimulus_id=f"amm-rules-drain-{time.time()}",
            )
        except Exception as exc:  # never let a drain take anything else down
            logger.exception("amm-rules: retiring drained workers %s failed", addresses)
            ctx.events.emit("drain", step="failed", workers=addresses, error=repr(exc))

    # -- the pacer of the drained workers' retirements ---------------------------------

    def rank(self, ws: Any, views: list[KeyView], cluster: ClusterView) -> list[KeyView]:
        """The worker's key views, most valuable first (see the module docstring)."""
        tasks = self.ctx.scheduler.tasks
        # Keys on disk there are read back before they leave (the spill section's table).
        spilled = self.ctx.spilled.workers.get(ws.address)
        ranked, self.items[ws.address] = rank_views(
            views, cluster, tasks, self.ctx.costs.estimate, spilled.keys if spilled else None
        )
        return ranked

    def admit(self, ws: Any, plan: Evacuation, now: float) -> Evacuation:
        """The copies of ``plan`` (in the order of value) that fit the window of bytes
        in flight; before the deadline, and after it all of them. Keys that cannot move
        are taken off the plan: they are reported, and the worker leaves anyway."""
        d = self.drains.get(ws.address)
        if d is None:
            return replace(plan, stuck=[], satisfied=[])
        self._landed(d)
        self._note(d, ws, plan, now)
        copies = plan.copies
        flying = self.in_flight(d)
        if d.active:
            room = self.window(d, now) - sum(flying.values())
            admitted: list[Any] = []
            for copy in copies:
                if copy.nbytes > room and (admitted or flying):
                    break
                admitted.append(copy)
                room -= copy.nbytes
            copies = admitted
        self._pace(d, {c.key for c in copies} | flying.keys())
        nbytes = sum(c.nbytes for c in copies)
        return replace(plan, copies=copies, stuck=[], satisfied=[], bytes=nbytes)

    def _pace(self, d: Drain, admitted: set[Hashable]) -> None:
        """Hold the keys of ``d`` still waiting for their turn, until its deadline (none
        once it no longer runs): the rest of the engine leaves them alone."""
        claims = self.ctx.claims
        owner = d.owner
        waiting = set(d.places) - admitted if d.active else set()
        held = claims.of(owner)
        done = [key for key in held if key not in waiting]
        if done:
            claims.release(owner, done)
        for key in waiting:
            if key not in held:
                claims.hold(key, owner, "copied in its turn", until=d.deadline)

    def asked(self, ws: Any, copy: Any, now: float) -> None:
        d = self.drains.get(ws.address)
        if d is None:
            return
        d.copies += 1
        self.counters["copies"] += 1
        if d.first_asked is None:
            d.first_asked = now

    def window(self, d: Drain, now: float) -> float:
        """Bytes the drain keeps in flight: :data:`WINDOW_SECONDS` at its measured rate,
        :data:`MIN_WINDOW` until it is measured (an assumed rate too high would put
        everything in flight at once, and the recipients would fetch in their order)."""
        rate, source = self.rate(d, now)
        if source == "assumed":
            return float(MIN_WINDOW)
        return max(float(MIN_WINDOW), rate * WINDOW_SECONDS)

    def rate(self, d: Drain, now: float) -> tuple[float, str]:
        """Bytes per second the worker sends, and where the figure came from."""
        measured = self.meter.rate(d.address)
        if measured is not None and measured > 0:
            return measured, "heartbeats"
        if d.moved_bytes and d.first_asked is not None and now - d.first_asked > 0.2:
            return d.moved_bytes / (now - d.first_asked), "copies landed"
        bandwidth = getattr(self.ctx.scheduler, "bandwidth", 0) if self.ctx.attached else 0
        return float(bandwidth or 100e6), "assumed"

    # -- bookkeeping -------------------------------------------------------------------

    def _note(self, d: Drain, ws: Any, plan: Evacuation, now: float) -> None:
        """The keys' standing after a plan (:meth:`Drain.note`), and the prediction."""
        d.note(plan, self.items.get(ws.address, {}), now)
        rate, source = self.rate(d, now)
        prediction = d.predict(rate, source, now)
        previous, d.last = d.last, prediction
        if (
            previous is not None
            and d.active
            and _moved(previous, prediction)
            and now - d.last_event >= PREDICTION_GAP
        ):
            d.last_event = now
            self.ctx.events.emit(
                "drain",
                step="prediction",
                worker=d.address,
                seconds_left=round(d.seconds_left(now), 3),
                prediction=words.prediction_sentence(prediction),
            )

    def _landed(self, d: Drain) -> None:
        """Bytes of the drain's copies that landed since last looked (the ledger counts
        those of the worker's retirement)."""
        _, nbytes = self.ctx.ledger.landings(retirement_owner(d.address))
        moved = nbytes - d.bytes_before
        self.counters["bytes"] += moved - d.moved_bytes
        d.moved_bytes = moved

    # -- the ticker ----------------------------------------------------------------------

    def _ensure_ticker(self) -> None:
        if self._ticker is None or self._ticker.done():
            self._ticker = spawn(self._tasks, self._tick_loop())

    async def _tick_loop(self) -> None:
        while self.ctx.attached and self.drains:
            try:
                self.tick(time.monotonic())
            except Exception as exc:  # never let a drain take anything else down
                logger.exception("amm-rules: drain tick failed")
                self.ctx.events.once(("error", repr(exc)), "error", error=repr(exc))
            await asyncio.sleep(TICK)

    def tick(self, now: float) -> None:
        """Between cycles: copies landed, early cycles, the deadline, safety, leaving."""
        ctx = self.ctx
        workers = ctx.scheduler.workers
        for d in list(self.drains.values()):
            if d.address not in workers:
                self._gone(d, now)
                continue
            if not d.active:
                continue
            self._sample(d, workers[d.address])
            self._landed(d)
            if now >= d.deadline:
                self._expire(d, now)
            elif sum(self.in_flight(d).values()) < self.window(d, now) / 2:
                ctx.early.request("drain")

    def placed(self, address: str) -> None:
        """The retirement found every key of ``address`` held where its rules want it on
        workers that stay: the drain ends, safe."""
        d = self.drains.get(address)
        if d is not None and d.active:
            self._landed(d)
            self._end(d, SAFE, time.monotonic())

    def _expire(self, d: Drain, now: float) -> None:
        """The deadline came before every key was safe."""
        self._end(d, EXPIRED, now)
        if d.close:
            spawn(self._tasks, self._remove(d.address))

    async def _remove(self, address: str) -> None:
        try:
            await self.ctx.scheduler.remove_worker(
                address, stimulus_id=f"amm-rules-drain-deadline-{time.time()}", close=True
            )
        except Exception:
            logger.exception("amm-rules: closing %s at its drain's deadline failed", address)

    def _end(self, d: Drain, state: str, now: float) -> None:
        """The drain of ``d`` ends, ``safe`` or ``expired`` (its worker still there):
        every key safe, or what the last plan left unsafe."""
        ctx = self.ctx
        d.ended = now  # the time left stops here
        self._pace(d, set())
        ws = ctx.scheduler.workers.get(d.address)
        if state == SAFE:
            d.all_safe(now)
        elif ws is not None:
            self._replan(d, ws, set(ctx.leaving()) | {d.address}, now)
        d.end(state, now)
        assert d.outcome is not None
        self.counters["lost_keys"] += d.outcome["unsafe_keys"]
        logger.warning(
            "amm-rules: drain of %s %s after %s: %s",
            d.address,
            state,
            words.duration(now - d.started),
            d.outcome["text"],
        )
        ctx.events.emit("drain", step=state, worker=d.address, drain=d.drain_id, **d.outcome)

    def _gone(self, d: Drain, now: float) -> None:
        """The worker left: after its drain ended (``closed``: by the drain, the worker
        preload or anyone), or before (``left``; ``closed`` if the drain was to close it
        and nothing was lost: the retirement may close it before it says so). What was
        not safe is counted from the keys themselves (a key with no copy left is lost):
        the count at the deadline raced with copies landing, or with a kill."""
        ctx = self.ctx
        self.meter.forget(d.address)
        self.items.pop(d.address, None)
        self._let_go(d)
        self._landed(d)
        before = d.outcome["unsafe_keys"] if d.outcome is not None else 0
        counted = d.worker_gone(ctx.scheduler.tasks, now)
        if d.active:
            d.end(CLOSED if d.close and not counted[0] else LEFT, now, counted)
        else:
            d.end(CLOSED, now, counted)
        assert d.outcome is not None
        self.counters["lost_keys"] += d.outcome["unsafe_keys"] - before
        ctx.events.emit("drain", step=d.state, worker=d.address, drain=d.drain_id, **d.outcome)
        del self.drains[d.address]
        self.recent = [*self.recent, d][-RECENT:]

    # -- showing it ------------------------------------------------------------------------

    def report(self, addresses: Iterable[str] | None = None) -> dict[str, Any]:
        """The drains of ``addresses`` (None: every drain known), as plain data."""
        now = time.monotonic()
        known = {d.address: d for d in self.recent}
        known.update(self.drains)
        wanted = list(known) if addresses is None else list(addresses)
        out = {}
        for address in wanted:
            d = known.get(address)
            if d is not None:
                rate, source = self.rate(d, now) if d.active else (0.0, "")
                flying = sum(self.in_flight(d).values())
                out[address] = d.report(now, rate, source, flying).to_dict()
        return out

    def status(self) -> dict[str, Any]:
        return {
            "drains": list(self.report().values()),
            "totals": {k: self.counters[k] for k in ("drains", "copies", "bytes", "lost_keys")},
        }

    def explain(self, ts: Any, now: float) -> dict[str, Any] | None:
        """Why the key is moved first, later or not at all by a drain of its holder."""
        for w in ts.who_has or ():
            d = self.drains.get(w.address)
            if d is not None:
                asked = retirement_owner(d.address)
                flying = self.ctx.ledger.in_flight(ts.key)
                return d.explain(ts.key, any(c.by == asked for c in flying.values()))
        return None

    def metrics(self) -> dict[str, float]:
        now = time.monotonic()
        active = [d for d in self.drains.values() if d.active]
        return {
            "draining": float(len(active)),
            **self.counter_figures(self.counters),
            "predicted_loss_seconds": sum(
                d.last.lost_seconds + d.last.cannot_move_seconds for d in active if d.last
            ),
            "seconds_left": min((d.seconds_left(now) for d in active), default=0.0),
            "rate": sum(self.rate(d, now)[0] for d in active),
        }


def _moved(old: Prediction, new: Prediction) -> bool:
    before = old.lost_keys + old.cannot_move
    after = new.lost_keys + new.cannot_move
    if before == after:
        return old.rate_source != new.rate_source
    return abs(after - before) > PREDICTION_CHANGE * max(before, after, 1)


__all__ = ["DrainSection"]
