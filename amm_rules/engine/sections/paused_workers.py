"""The ``paused-workers`` section: workers that stay paused are emptied by the rules,
then restarted or retired, or only reported. docs/paused-workers.md says each step,
guard, event and figure.

A worker paused by memory that is not Dask's data never unpauses, and nothing in
distributed acts on it (dask issue 5999). Each AMM cycle, :meth:`PausedWorkers.run`
learns when each worker paused (:class:`PauseClock`: the scheduler's
``worker-status-change`` events, checked against the workers' statuses), checks the
guards of a worker paused for ``after`` seconds (:meth:`PausedWorkers._hold`), copies
the keys it holds alone, or below their target elsewhere, by the rules
(:func:`~amm_rules.engine.decide.evacuate.plan_evacuation`) to workers with
:func:`room`, and once a full pass over its keys finds every one held where it should
be, retires it through ``Scheduler.retire_workers`` (then, for ``restart``, restarts it
through its nanny) in a coroutine the cycle never waits for. A key that may not go
elsewhere blocks the worker, which is looked at again ``after`` seconds later: nothing
is dropped to make room.

Neighbours: the policy runs :meth:`PausedWorkers.run` as a step of its cycle;
:mod:`amm_rules.engine.decide.evacuate` plans; :mod:`amm_rules.engine.evacuation` is
the work it shares with the retirements (:mod:`amm_rules.engine.sections.retirement`
places its workers' keys by the rules when they retire); :mod:`amm_rules.engine.handlers`
shows the status.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Generator, Hashable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import dask
from distributed.active_memory_manager import Suggestion
from distributed.diagnostics.plugin import SchedulerPlugin

from amm_rules.engine.adapters import worker_status
from amm_rules.engine.decide.evacuate import Evacuation, plan_evacuation
from amm_rules.engine.evacuation import (
    blocked_fields,
    evacuation_input,
    record_copy,
    suggest_copies,
)
from amm_rules.engine.features import RESTART_WORKERS, RETIRING, Feature
from amm_rules.engine.sections.base import Cycle, Section, spawn
from amm_rules.engine.state.leaving import Departure
from amm_rules.engine.words import counted, plural
from amm_rules.language.fields import format_fraction
from amm_rules.language.ruleset import PausedWorkersSettings, Ruleset

if TYPE_CHECKING:
    from amm_rules.engine.context import EngineContext
    from amm_rules.engine.dryrun import DryRun

logger = logging.getLogger(__name__)

#: Counter label of the copies made off paused workers (in ``cycle`` events).
SOURCE = "(paused-workers)"
#: Share of a recipient's memory limit kept free below its pause threshold.
ROOM_MARGIN = 0.10
#: Keys of a handled worker looked at per cycle (its keys are gone through in turns).
KEYS_PER_CYCLE = 10_000
#: The part of the section that restarts workers (``action: restart``).
RESTART = "paused-workers: action: restart"
#: Seconds given to ``retire_workers`` and to the nanny's restart.
RESTART_TIMEOUT = 60.0


class PauseClock(SchedulerPlugin):
    """When each worker paused, from the scheduler's ``worker-status-change`` events
    (the scheduler logs one under the worker's address for every status change)."""

    name = "amm-rules-pause-clock"

    def __init__(self) -> None:
        #: address -> monotonic time the worker was seen pausing.
        self.since: dict[str, float] = {}
        #: The restart and retirement coroutines of the section, cancelled if the
        #: scheduler closes before they end.
        self.tasks: set[asyncio.Future[Any]] = set()

    async def close(self) -> None:
        for task in list(self.tasks):
            task.cancel()

    def log_event(self, topic: str, msg: Any) -> None:
        # Runs for every event the scheduler logs: one dict lookup for the others.
        if type(msg) is not dict or msg.get("action") != "worker-status-change":
            return
        if msg.get("status") == "paused":
            self.since.setdefault(topic, time.monotonic())
        else:
            self.since.pop(topic, None)

    def remove_worker(self, scheduler: Any = None, worker: str = "", **kwargs: Any) -> None:
        self.since.pop(worker, None)

    def reconcile(self, workers: Any, now: float) -> None:
        """Agree with the workers' statuses: a worker that joined paused, or whose event
        was missed, is taken as pausing now; one that is not paused is forgotten."""
        since = self.since
        for addr, ws in workers.items():
            if worker_status(ws) == "paused":
                since.setdefault(addr, now)
            else:
                since.pop(addr, None)
        for addr in [a for a in since if a not in workers]:
            del since[addr]


@dataclass
class Handling:
    """A paused worker being emptied, then restarted or retired."""

    address: str
    name: str
    #: ``"restart"`` or ``"retire"`` (a restart without a nanny becomes a retirement).
    action: str
    #: ``evacuating``, then ``restarting`` or ``retiring``.
    state: str = "evacuating"
    #: Keys left to look at in this pass over the worker's keys.
    pending: list[Hashable] = field(default_factory=list)
    #: No key needed a copy so far in this pass.
    clean: bool = True
    copies: int = 0
    bytes: int = 0
    #: Why a restart became a retirement (no nanny), for the events.
    note: str | None = None


#: The section's figures for Prometheus (see :attr:`Section.METRICS`).
FIGURES: dict[str, tuple[str, str, str]] = {
    "paused_workers": ("paused_workers", "gauge", "Workers paused now"),
    "handling": (
        "paused_workers_handling",
        "gauge",
        "Paused workers being emptied, restarted or retired now",
    ),
    "paused": ("paused_workers_pauses", "counter", "Workers seen pausing"),
    "held": ("paused_workers_held", "counter", "Paused workers held (not acted on)"),
    "evacuations": (
        "paused_workers_evacuations",
        "counter",
        "Paused workers whose keys were copied away",
    ),
    "copies": ("paused_workers_copies", "counter", "Copies made to empty paused workers"),
    "bytes": (
        "paused_workers_copied_bytes",
        "counter",
        "Bytes copied to empty paused workers",
    ),
    "blocked": (
        "paused_workers_blocked",
        "counter",
        "Paused workers that could not be emptied (keys with nowhere to go)",
    ),
    "restarted": ("paused_workers_restarted", "counter", "Paused workers restarted"),
    "retired": ("paused_workers_retired", "counter", "Paused workers retired"),
    "failed": (
        "paused_workers_failed",
        "counter",
        "Restarts or retirements of paused workers that failed",
    ),
    "recovered": (
        "paused_workers_recovered",
        "counter",
        "Paused workers that resumed before being acted on",
    ),
    "paused_seconds": (
        "paused_workers_paused_seconds",
        "counter",
        "Time workers spent paused, the current pauses included",
    ),
}


class PausedWorkers(Section):
    """The ``paused-workers`` section at work (see the module docstring)."""

    offline = (
        "paused-workers: not simulated: the workers of a recorded cluster neither pause nor resume"
    )

    @classmethod
    def in_use(cls, ruleset: Ruleset) -> bool:
        return ruleset.paused_workers is not None

    name = "paused-workers"
    FEATURES = (
        Feature("paused-workers", RETIRING, in_use=lambda ruleset: PausedWorkers.in_use(ruleset)),
        Feature(
            RESTART,
            (RESTART_WORKERS,),
            in_use=lambda ruleset: bool(
                ruleset.paused_workers is not None and ruleset.paused_workers.action == "restart"
            ),
        ),
    )
    status_key = "paused_workers"
    explain_key = "paused_workers"
    metric_prefix = "paused_workers"
    METRICS = FIGURES

    def __init__(self, ctx: EngineContext) -> None:
        super().__init__(ctx)
        #: The section in force; None when the rules have none.
        self.settings: PausedWorkersSettings | None = None
        self.clock = PauseClock()
        #: address -> the workers being handled.
        self.handling: dict[str, Handling] = {}
        #: worker name -> monotonic time until which it is left alone (``cool-down``).
        self.cooling: dict[str, float] = {}
        #: address -> monotonic time before which a blocked worker is not tried again.
        self.retry: dict[str, float] = {}
        #: address -> {key: (why, rule)}: what blocked the worker at its last attempt.
        self.stuck: dict[str, dict[Hashable, tuple[str, str]]] = {}
        #: address -> the latest decision about a paused worker (for ``status``).
        self.notes: dict[str, dict[str, Any]] = {}
        #: Counters since the policy started (metrics); see :meth:`metrics`.
        self.counters: Counter[str] = Counter()
        #: Seconds workers spent paused in pauses that ended.
        self.paused_seconds_done = 0.0
        #: The restart and retirement coroutines running (shared with the clock, which
        #: cancels them when the scheduler closes).
        self.tasks: set[asyncio.Future[Any]] = self.clock.tasks
        self._known: dict[str, float] = {}

    # -- attach ----------------------------------------------------------------------

    def attach(self) -> None:
        self._plug()

    def _plug(self) -> None:
        """Keep the pause clock plugged in only while the rules have a section
        (:meth:`EngineContext.plug`). Pauses that began before it was plugged in are
        found by :meth:`PauseClock.reconcile` at the next cycle; restarts and
        retirements still running keep it plugged in (it cancels them if the scheduler
        closes first)."""
        if self.settings is not None or not self.tasks:
            self.ctx.plug(self.clock, PauseClock.name, self.settings is not None)

    def detach(self) -> None:
        self.ctx.remove_plugin(self.clock)

    def configure(self, ruleset: Ruleset, dry_run: DryRun) -> None:
        """The rules changed (start or reload). Workers being emptied under the old
        section stop if the new one has none; restarts already begun finish. In a file
        in dry-run the section only reports (see :meth:`DryRun.paused_settings`)."""
        settings = dry_run.paused_settings(ruleset.paused_workers)
        self.settings = settings
        self._plug()
        if settings is None:
            for addr in [a for a, h in self.handling.items() if h.state == "evacuating"]:
                self._unhandle(addr)
                self._emit(
                    "stopped", addr, reason="the rules no longer have a paused-workers section"
                )

    def _handle(self, h: Handling) -> None:
        """Handle a worker: it is on its way out (the context's leaving workers)."""
        self.handling[h.address] = h
        action = "restarted" if h.action == "restart" else "retired"
        why = f"paused for too long: emptied, then {action}"
        self.ctx.departures.leave(h.address, Departure(self.name, why))

    def _unhandle(self, address: str) -> None:
        """No longer handled (done, blocked, failed, stopped): no longer leaving."""
        self.handling.pop(address, None)
        self.ctx.departures.stay(address, self.name)

    # -- the cycle ---------------------------------------------------------------------

    def run(self, cycle: Cycle) -> Generator[Suggestion, Any, None]:
        """One cycle (see the module docstring); yields the copies."""
        now, stats = cycle.now, cycle.stats
        workers = self.ctx.scheduler.workers
        self.clock.reconcile(workers, now)
        self._account_pauses(now)
        settings = self.settings
        if settings is None:
            return
        census = _Census.of(workers)
        budget = [settings.max_bytes_per_cycle]
        for h in [h for h in self.handling.values() if h.state == "evacuating"]:
            yield from self._evacuate(h, now, census, budget, stats)
        for addr, since in sorted(self.clock.since.items(), key=lambda kv: kv[1]):
            if addr in self.handling or now - since < settings.after:
                continue
            ws = workers.get(addr)
            if ws is None:
                continue
            self._detected(ws, since, now, settings.action)
            if settings.action == "report":
                continue
            hold = self._hold(ws, census, now, starting=True)
            if hold is not None:
                self._held(ws, since, *hold)
                continue
            h = self._start(ws)
            yield from self._evacuate(h, now, census, budget, stats)

    def _account_pauses(self, now: float) -> None:
        """Forget what ended: pauses (adding up their seconds), notes, retry times."""
        since = self.clock.since
        for addr in [a for a in self._known if a not in since]:
            self.paused_seconds_done += now - self._known.pop(addr)
            self.notes.pop(addr, None)
            self.retry.pop(addr, None)
            self.stuck.pop(addr, None)
            h = self.handling.get(addr)
            if h is not None and h.state == "evacuating":
                self._unhandle(addr)
                self.counters["recovered"] += 1
                self._emit("recovered", addr, name=h.name, copies=h.copies)
        for addr, t in since.items():
            self._known.setdefault(addr, t)
        for name in [n for n, until in self.cooling.items() if until <= now]:
            del self.cooling[name]

    # -- guards ------------------------------------------------------------------------

    def _hold(
        self, ws: Any, census: _Census, now: float, *, starting: bool
    ) -> tuple[str, str] | None:
        """Why the worker is not acted on now, as (reason code, words); None: go. The
        cluster's and the worker's guards (:func:`worker_hold`), then, for a worker not
        handled yet, the section's own: cool-down, a recent block, ``max-concurrent``."""
        settings = self.settings
        assert settings is not None
        held = worker_hold(settings, ws, census)
        if held is not None:
            return held
        if not starting:
            return None
        until = self.cooling.get(str(ws.name))
        if until is not None and until > now:
            return "cooling-down", (
                f"worker {ws.name} was restarted or retired {settings.cooldown - (until - now):.0f}s "
                f"ago; cool-down {settings.cooldown:g}s"
            )
        retry = self.retry.get(ws.address)
        if retry is not None and retry > now:
            return (
                "blocked-recently",
                f"blocked at its last attempt; tried again in {retry - now:.0f}s",
            )
        if len(self.handling) >= settings.max_concurrent:
            return "max-concurrent", (
                f"{counted(len(self.handling), 'worker')} "
                f"{plural(len(self.handling), 'is', 'are')} being handled (max-concurrent "
                f"{settings.max_concurrent})"
            )
        return None

    # -- steps ---------------------------------------------------------------------------

    def _detected(self, ws: Any, since: float, now: float, action: str) -> None:
        """First cycle past ``after``: the report every ``action`` makes."""
        addr = ws.address
        note = self.notes.get(addr)
        if note is not None and note.get("since") == since:
            return
        limit = ws.memory_limit or 0
        self.counters["paused"] += 1
        state = "reported" if action == "report" else "paused"
        self.notes[addr] = {"since": since, "state": state}
        self._emit(
            "paused",
            addr,
            name=str(ws.name),
            paused_for=round(now - since, 3),
            unmanaged=round(ws.memory.unmanaged / limit, 4) if limit else None,
            process=ws.memory.process,
            keys=len(ws.has_what),
            bytes=ws.nbytes,
            then=action,
        )

    def _held(self, ws: Any, since: float, code: str, words: str) -> None:
        self.notes[ws.address] = {"since": since, "state": "held", "reason": code, "detail": words}
        if self.ctx.events.once(
            ("paused-held", ws.address, since, code),
            "paused-worker",
            step="held",
            worker=ws.address,
            name=str(ws.name),
            reason=code,
            detail=words,
        ):
            self.counters["held"] += 1
            logger.info("amm-rules: paused worker %s left alone: %s", ws.address, words)

    def _start(self, ws: Any) -> Handling:
        settings = self.settings
        assert settings is not None
        action, note = settings.action, None
        if action == "restart" and not ws.nanny:
            action, note = "retire", "it has no nanny to restart it: retired instead"
        elif action == "restart" and not self.supports(RESTART):
            action, note = "retire", f"{self.unsupported[RESTART]}: retired instead"
        h = Handling(ws.address, str(ws.name), action, note=note)
        self._handle(h)
        self.stuck.pop(ws.address, None)
        self.counters["evacuations"] += 1
        self._note(ws.address, "evacuating")
        self._emit(
            "evacuating",
            ws.address,
            name=h.name,
            keys=len(ws.has_what),
            bytes=ws.nbytes,
            then=action,
            note=note,
        )
        logger.warning(
            "amm-rules: worker %s paused for too long; copying its keys away, then %s",
            ws.address,
            "restarting it"
            if action == "restart"
            else f"retiring it ({note or 'action: retire'})",
        )
        return h

    def _evacuate(
        self,
        h: Handling,
        now: float,
        census: _Census,
        budget: list[int],
        stats: dict[str, Counter[str]],
    ) -> Generator[Suggestion, Any, None]:
        """One cycle of copying a handled worker's keys away (cases in order: the
        worker left, unpaused, a guard holds it; then a turn of its keys)."""
        ctx = self.ctx
        settings = self.settings
        assert settings is not None  # (the cycle handles workers only with the section)
        workers = ctx.scheduler.workers
        ws = workers.get(h.address)
        if ws is None or worker_status(ws) != "paused":
            return  # left or unpaused: _account_pauses forgets it next cycle
        hold = self._hold(ws, census, now, starting=False)
        if hold is not None:
            self._unhandle(h.address)
            self._held(ws, self.clock.since.get(h.address, now), *hold)
            return
        if not h.pending:
            h.pending = [ts.key for ts in ws.has_what if not ts.actor]
            h.clean = True
        batch, h.pending = h.pending[:KEYS_PER_CYCLE], h.pending[KEYS_PER_CYCLE:]
        tasks = ctx.scheduler.tasks
        has_what = ws.has_what
        todo = [ts for k in batch if (ts := tasks.get(k)) is not None and ts in has_what]
        views, cluster = evacuation_input(ctx, todo, ctx.leaving())
        space = room(workers, cluster, ctx.ledger.unseen(ctx.last_seen))
        plan = plan_evacuation(
            views,
            cluster,
            now=now,
            room=space,
            budget=max(budget[0], 0),
            first_free=budget[0] == settings.max_bytes_per_cycle,
        )
        if plan.stuck or _no_room(plan):
            self._block(h, plan, now)
            return
        by_key = {ts.key: ts for ts in todo}
        accepted = yield from suggest_copies(plan, by_key, workers, f"paused {h.address}")
        for copy, _ in accepted:
            record_copy(ctx, self.name, copy, now)
            budget[0] -= copy.nbytes
            h.copies += 1
            h.bytes += copy.nbytes
            self.counters["copies"] += 1
            self.counters["bytes"] += copy.nbytes
            stats[SOURCE]["requested"] += 1
        if plan.copies or plan.waiting:
            h.clean = False
        if not h.pending and h.clean:
            self._finish(h)

    def _block(self, h: Handling, plan: Evacuation, now: float) -> None:
        """Keys that may not go elsewhere: the worker stays; tried again ``after`` later."""
        settings = self.settings
        assert settings is not None
        self._unhandle(h.address)
        self.retry[h.address] = now + settings.after
        stuck = self.stuck[h.address] = blocked_by(plan)
        blocked = blocked_fields(stuck)
        whys = "; ".join(blocked["why"])
        self.counters["blocked"] += 1
        self._note(h.address, "blocked", whys)
        logger.warning(
            "amm-rules: not %s paused worker %s: %d keys may not go elsewhere (%s; %s)",
            "restarting" if h.action == "restart" else "retiring",
            h.address,
            len(stuck),
            whys,
            ", ".join(blocked["rules"]),
        )
        self._emit("blocked", h.address, name=h.name, **blocked, retry_in=settings.after)

    def _finish(self, h: Handling) -> None:
        """Every key is held elsewhere: retire (and restart) without blocking the cycle."""
        h.state = "restarting" if h.action == "restart" else "retiring"
        self._note(h.address, h.state)
        self._emit(h.state, h.address, name=h.name, copies=h.copies, bytes=h.bytes, note=h.note)
        spawn(self.tasks, self._restart_or_retire(h))

    async def _restart_or_retire(self, h: Handling) -> None:
        """Restart or retire the worker, then say what came of it: done (the cool-down
        starts), or failed (tried again ``after`` later)."""
        try:
            why = await restart_or_retire(self.ctx.scheduler, h.address, h.action == "restart")
        except Exception as exc:  # never let a restart take anything else down
            logger.exception("amm-rules: handling paused worker %s failed", h.address)
            why = repr(exc)
        settings = self.settings
        self._unhandle(h.address)
        if why is not None:
            self.retry[h.address] = time.monotonic() + (settings.after if settings else 0.0)
            self.counters["failed"] += 1
            self._note(h.address, "failed", why)
            logger.warning("amm-rules: paused worker %s not handled: %s", h.address, why)
            self._emit("failed", h.address, name=h.name, error=why)
            return
        if settings is not None and settings.cooldown > 0:
            self.cooling[h.name] = time.monotonic() + settings.cooldown
        step = "restarted" if h.action == "restart" else "retired"
        self.counters[step] += 1
        self.notes.pop(h.address, None)
        logger.warning("amm-rules: paused worker %s (%s) %s", h.address, h.name, step)
        self._emit(step, h.address, name=h.name, copies=h.copies, bytes=h.bytes, note=h.note)

    # -- reporting -----------------------------------------------------------------------

    def _note(self, address: str, state: str, reason: str | None = None) -> None:
        """The latest decision about a paused worker, over what was noted before."""
        self.notes[address] = {**self.notes.get(address, {}), "state": state, "reason": reason}

    def _emit(self, step: str, worker: str, **fields: Any) -> None:
        self.ctx.events.emit("paused-worker", step=step, worker=worker, **fields)

    def status(self) -> dict[str, Any]:
        """For ``amm_rules_status()["paused_workers"]``: the section, one line per paused
        worker (and per worker being restarted), cool-downs, totals."""
        settings = self.settings
        now = time.monotonic()
        lines = []
        workers = self.ctx.scheduler.workers if self.ctx.attached else {}
        for addr in sorted(set(self.clock.since) | set(self.handling)):
            since = self.clock.since.get(addr)
            h = self.handling.get(addr)
            note = self.notes.get(addr, {})
            ws = workers.get(addr)
            state = h.state if h is not None else note.get("state", "waiting")
            lines.append(
                {
                    "worker": addr,
                    "name": str(ws.name) if ws is not None else (h.name if h else None),
                    "paused_for": round(now - since, 3) if since is not None else None,
                    "state": state,
                    "reason": note.get("detail") or note.get("reason"),
                    "keys": len(ws.has_what) if ws is not None else 0,
                    "copies": h.copies if h is not None else 0,
                    "bytes": h.bytes if h is not None else 0,
                }
            )
        return {
            "settings": None if settings is None else _plain_settings(settings),
            "workers": lines,
            "cooling": {n: round(u - now, 3) for n, u in sorted(self.cooling.items())},
            "totals": dict(self.counters),
        }

    def metrics(self) -> dict[str, float]:
        """The figures of :data:`FIGURES`: the counters of :attr:`counters`, and
        ``paused_workers``, ``handling`` and ``paused_seconds`` computed now."""
        now = time.monotonic()
        out = self.counter_figures(self.counters)
        out["paused_workers"] = float(len(self.clock.since))
        out["handling"] = float(len(self.handling))
        out["paused_seconds"] = self.paused_seconds_done + sum(
            now - t for t in self._known.values()
        )
        return out

    def explain(self, ts: Any, now: float = 0.0) -> list[dict[str, Any]]:
        """For ``explain``: the paused workers holding the key, and whether the key
        keeps one of them from being restarted or retired."""
        out = []
        for ws in ts.who_has or ():
            addr = ws.address
            if addr not in self.clock.since and addr not in self.handling:
                continue
            note = self.notes.get(addr, {})
            entry: dict[str, Any] = {
                "worker": addr,
                "state": self.handling[addr].state
                if addr in self.handling
                else note.get("state", "waiting"),
            }
            stuck = self.stuck.get(addr, {}).get(ts.key)
            if stuck is not None:
                why, rule = stuck
                entry["blocks"] = f"keeps the worker from leaving: {why} ({rule})"
            out.append(entry)
        return out


@dataclass(frozen=True)
class _Census:
    """Workers that are running or paused (not leaving), and how many are paused."""

    active: int
    paused: int

    @classmethod
    def of(cls, workers: Any) -> _Census:
        active = paused = 0
        for ws in workers.values():
            status = worker_status(ws)
            if status != "closing":
                active += 1
                paused += status == "paused"
        return cls(max(active, 1), paused)


def _no_room(plan: Evacuation) -> bool:
    """Keys wait for room and nothing moves: the recipients are full."""
    return (
        not plan.copies
        and any(why.startswith("no eligible worker has room") for why in plan.waiting.values())
        and not any(why == "copy in flight" for why in plan.waiting.values())
    )


def _pause_fraction() -> float:
    """The workers' pause threshold, as the scheduler's dask config says (workers are
    normally configured alike); 95% when pausing is off."""
    value = dask.config.get("distributed.worker.memory.pause", 0.8)
    if value is False or value is None:
        return 0.95
    return float(value)


def _plain_settings(s: PausedWorkersSettings) -> dict[str, Any]:
    return {
        "after": s.after,
        "action": s.action,
        "require-unmanaged": s.require_unmanaged,
        "max-concurrent": s.max_concurrent,
        "max-paused-fraction": s.max_paused_fraction,
        "cool-down": s.cooldown,
        "max-bytes-per-cycle": s.max_bytes_per_cycle,
    }


def worker_hold(
    settings: PausedWorkersSettings, ws: Any, census: _Census
) -> tuple[str, str] | None:
    """Why a paused worker may not be acted on, whatever the section did before: every
    worker paused, too many paused, actors, no memory limit, a pause from Dask's own data
    (``require-unmanaged``). None: nothing against it."""
    if census.paused >= census.active:
        return "all-paused", "every worker is paused: there is nowhere to copy its keys"
    share = census.paused / census.active
    if share > settings.max_paused_fraction:
        return "too-many-paused", (
            f"{census.paused} of {census.active} workers are paused, more than "
            f"max-paused-fraction {format_fraction(settings.max_paused_fraction)}"
        )
    if ws.actors:
        return "actors", "it holds actors, which cannot move"
    limit = ws.memory_limit or 0
    if not limit:
        return "no-memory-limit", "it has no memory limit"
    unmanaged = ws.memory.unmanaged / limit
    if unmanaged < settings.require_unmanaged:
        return "managed-memory", (
            f"unmanaged memory is {format_fraction(round(unmanaged, 3))} of its limit, "
            f"below require-unmanaged {format_fraction(settings.require_unmanaged)}: "
            "the pause comes from Dask's data, which a restart would only move"
        )
    return None


def blocked_by(plan: Evacuation) -> dict[Hashable, tuple[str, str]]:
    """What keeps a worker's keys from going elsewhere: key -> (why, rule)."""
    if plan.stuck:
        return {s.key: (s.why, s.rule) for s in plan.stuck}
    return {k: (why, SOURCE) for k, why in plan.waiting.items() if why.startswith("no eligible")}


async def restart_or_retire(scheduler: Any, addr: str, restart: bool) -> str | None:
    """Retire the worker at ``addr`` (closing it), or restart it through its nanny; None
    once done, else why not. Through ``retire_workers`` in both cases: what landed on the
    worker since the last pass is placed by the rules (RulesRetireWorker), and a key with
    nowhere to go fails it instead of being lost."""
    stimulus_id = f"amm-rules-paused-workers-{time.time()}"
    retired = await asyncio.wait_for(
        scheduler.retire_workers(
            workers=[addr],
            close_workers=not restart,
            remove=not restart,
            stimulus_id=stimulus_id,
        ),
        RESTART_TIMEOUT,
    )
    if addr not in retired:
        return "its retirement failed: a key it holds has nowhere to go"
    if restart:
        result = await scheduler.restart_workers(
            [addr],
            timeout=RESTART_TIMEOUT,
            wait_for_workers=False,
            on_error="return",
            stimulus_id=stimulus_id,
        )
        if result.get(addr) != "OK":
            return f"the nanny did not restart it: {result.get(addr)!r}"
    return None


def room(workers: Mapping[str, Any], cluster: Any, unseen: Mapping[str, int]) -> dict[str, int]:
    """Bytes each running worker may still receive: up to its pause threshold less the
    margin, by its process memory at its last heartbeat plus the copies sent to it that
    no heartbeat has shown yet (``unseen``: the ledger's)."""
    pause = _pause_fraction()
    out = {}
    for addr in cluster.running:
        ws = workers[addr]
        limit = ws.memory_limit or 0
        if not limit:
            out[addr] = 1 << 62
            continue
        out[addr] = int((pause - ROOM_MARGIN) * limit) - ws.memory.process - unseen.get(addr, 0)
    return out
