"""The ``memory-pressure`` section: hold memory producers back while workers are short
of memory and data is moving between them. docs/memory-flow.md ("Holding producers
back") has the levers a scheduler has in distributed 2026.8, the steps, the floors and
the measurements.

The lever is the scheduler's ``worker-saturation`` (one number for the cluster):
:meth:`MemoryPressure.hold` lowers it to ``saturation``, :meth:`MemoryPressure.release`
puts back the scheduler's own value (:func:`_set_saturation`). It queues root-ish tasks
only, so when a graph arrives (:meth:`MemoryPressure.update_graph`, before its tasks are
scheduled) the tasks without dependencies of producer prefixes are flagged as data
producers, so that they queue too, and the hold starts at once if a worker is under
pressure. Each ``check-interval`` (a periodic callback on the scheduler's event loop,
one pass over the workers) :meth:`MemoryPressure.check` holds or releases;
:class:`HoldJudge` releases a hold that does not pay.

Neighbours: the policy runs it as a section (attach, reloads, a cycle starts its check);
:mod:`amm_rules.engine.state.flow` says which prefixes produce memory.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from distributed.diagnostics.plugin import SchedulerPlugin
from tornado.ioloop import PeriodicCallback

from amm_rules.engine.features import DATA_PRODUCER, QUEUEING, Feature
from amm_rules.engine.sections.base import Cycle, Section
from amm_rules.engine.state.flow import PrefixFacts, PrefixFlow
from amm_rules.engine.words import counted, signed_size
from amm_rules.language.fields import format_fraction
from amm_rules.language.ruleset import MemoryPressureSettings, Ruleset, TaskFacts

if TYPE_CHECKING:
    from amm_rules.engine.context import EngineContext
    from amm_rules.engine.dryrun import DryRun

logger = logging.getLogger(__name__)

#: Name of the periodic callback in ``scheduler.periodic_callbacks`` (with the id of
#: the section's object, should two policies share a scheduler).
CALLBACK = "amm-rules-memory-pressure"
#: Workers named in an event or the status (the worst first).
SHOWN_WORKERS = 10
#: Whether a hold pays: the share of their limits by which the workers' memory must
#: fall, the shortest span it is judged over, and the most the cool-down after holds
#: that did not pay is multiplied by (see :class:`HoldJudge`).
PAYING = 0.01
PAYING_SPAN = 5.0
UNPAID_COOL_DOWN_MAX = 8


class MemoryPressure(Section, SchedulerPlugin):
    """The ``memory-pressure`` section at work (see the module docstring); also the
    scheduler plugin that sees graphs arrive."""

    offline = (
        "memory-pressure: not simulated: it holds back tasks as graphs arrive, and a recorded "
        "cluster computes nothing"
    )

    @classmethod
    def in_use(cls, ruleset: Ruleset) -> bool:
        return bool(ruleset.memory_pressure is not None and ruleset.memory_pressure.enabled)

    name = "memory-pressure"
    FEATURES = (
        Feature(
            "memory-pressure",
            (DATA_PRODUCER, *QUEUEING),
            in_use=lambda ruleset: MemoryPressure.in_use(ruleset),
        ),
    )
    status_key = "memory_pressure"
    explain_key = "memory_pressure"
    metric_prefix = "memory_pressure"
    METRICS = {
        "holding": (
            "memory_pressure_holding",
            "gauge",
            "1 while memory producers are held back (worker-saturation lowered)",
        ),
        "holds": ("memory_pressure_holds", "counter", "Holds started"),
        "releases": ("memory_pressure_releases", "counter", "Holds ended"),
        "unpaid": (
            "memory_pressure_unpaid",
            "counter",
            "Holds released because the memory they were for did not fall",
        ),
        "held_seconds": (
            "memory_pressure_held_seconds",
            "counter",
            "Time producers were held back, the current hold included",
        ),
        "queued_roots": (
            "memory_pressure_queued_roots",
            "counter",
            "Tasks without dependencies of producer kinds made queueable",
        ),
    }

    def __init__(self, ctx: EngineContext) -> None:
        super().__init__(ctx)
        #: What the prefixes produce and free (the engine's).
        self.flow = ctx.flow
        #: The section in force; None when the rules have none.
        self.settings: MemoryPressureSettings | None = None
        #: ``idle``, ``holding``, ``cooling`` (after max-hold, or after someone else
        #: changed worker-saturation during a hold) or ``unavailable``.
        self.state = "idle"
        #: The scheduler's own worker-saturation, put back at release.
        self.base: float | None = None
        #: The saturation set by the hold in force (to notice someone else changing it).
        self.held_at: float | None = None
        #: Monotonic time the hold (or the cool-down) started, and when cooling ends.
        self.since: float | None = None
        self.cool_until = 0.0
        #: Whether the hold in force pays (see :class:`HoldJudge`).
        self.judge = HoldJudge()
        #: Why the engine holds or does not, as sentences (the latest check).
        self.reasons: list[str] = []
        #: Workers under pressure at the latest check: address -> (fraction, transfers).
        self.pressured: dict[str, tuple[float, int]] = {}
        #: The prefix at the head of the queue at the latest check, and whether it counts
        #: as a producer.
        self.head: tuple[str, bool] | None = None
        #: Counters since the policy started (see :meth:`metrics`).
        self.counters: Counter[str] = Counter()
        self.held_seconds_done = 0.0
        self._callback: PeriodicCallback | None = None
        self._interval: float | None = None

    # -- attach ----------------------------------------------------------------------

    def attach(self) -> None:
        self._plug()
        self.base = float(self.ctx.scheduler.WORKER_SATURATION)

    def _plug(self) -> None:
        """Hear graphs arrive only while the rules have a section."""
        self.ctx.plug(self, CALLBACK, self.settings is not None)

    def detach(self) -> None:
        """Put the scheduler's saturation back and stop looking."""
        ctx = self.ctx
        if not ctx.attached:
            return
        if self.state == "holding":
            self.release(time.monotonic(), "the policy detached")
        self._stop_callback()
        ctx.remove_plugin(self)

    def configure(self, ruleset: Ruleset, dry_run: DryRun) -> None:
        """The rules changed (start or reload). A hold in force ends if the new rules
        have no section, or a disabled one; the new timings apply from the next check."""
        settings = ruleset.memory_pressure
        self.settings = settings if settings is not None and settings.enabled else None
        if self.settings is None:
            if self.state == "holding":
                self.release(time.monotonic(), "the rules no longer hold producers back")
            self._stop_callback()
            self.state = "idle" if self.state != "unavailable" else self.state
        self._plug()

    def run(self, cycle: Cycle) -> tuple[()]:
        self.ensure_running()
        return ()

    def ensure_running(self) -> None:
        """Start (or re-time) the periodic check; called from the AMM cycle, which runs on
        the scheduler's event loop once the scheduler started."""
        settings, ctx = self.settings, self.ctx
        if settings is None:
            return
        if self._callback is not None and self._interval == settings.check_interval:
            return
        self._stop_callback()
        self._callback = PeriodicCallback(self.check, settings.check_interval * 1000)
        self._interval = settings.check_interval
        ctx.scheduler.periodic_callbacks[f"{CALLBACK}-{id(self)}"] = self._callback
        self._callback.start()

    def _stop_callback(self) -> None:
        if self._callback is None:
            return
        self._callback.stop()
        ctx = self.ctx
        if ctx.attached:
            callbacks = ctx.scheduler.periodic_callbacks
            name = f"{CALLBACK}-{id(self)}"
            if callbacks.get(name) is self._callback:
                del callbacks[name]
        self._callback = None
        self._interval = None

    # -- graphs arriving -----------------------------------------------------------------

    def update_graph(self, scheduler: Any, *, tasks: Any = (), **kwargs: Any) -> None:
        """Flag the new tasks without dependencies of producer prefixes as data
        producers, so that the scheduler queues them (see the module docstring). Runs
        before the graph's tasks are scheduled; cost: one look per new task, one
        evaluation of ``producers`` per prefix."""
        settings = self.settings
        if settings is None or math.isinf(scheduler.WORKER_SATURATION):
            return
        verdicts: dict[str, bool] = {}
        flagged = 0
        for key in tasks:
            ts = scheduler.tasks.get(key)
            if ts is None or ts.dependencies or ts.actor or ts.state != "released":
                continue
            spec = ts.run_spec
            already = getattr(spec, "_data_producer", None)
            if already is None:  # not a dask Task (data, an alias): nothing to flag
                continue
            prefix = ts.prefix.name
            verdict = verdicts.get(prefix)
            if verdict is None:
                verdict = verdicts[prefix] = self._is_producer(prefix)
            if verdict and not already:
                spec._data_producer = True
                flagged += 1
        producers = sorted(p for p, v in verdicts.items() if v)
        if flagged:
            self.counters["queued_roots"] += flagged
            logger.debug("amm-rules: %d root tasks of %s made queueable", flagged, producers)
        self.ensure_running()
        if producers and self.state in ("idle", "cooling"):
            self._hold_at_arrival(settings, scheduler, producers)

    def _hold_at_arrival(
        self, settings: MemoryPressureSettings, scheduler: Any, producers: list[str]
    ) -> None:
        """A graph with producer roots arrives while workers are under pressure: hold
        now, before its tasks are scheduled, or its first wave (a slot's worth on every
        worker) would go out before the next check."""
        now = time.monotonic()
        if self.state == "cooling" and now < self.cool_until:
            return
        self._look(settings, scheduler)
        if not self.pressured:
            return
        self.head = (producers[0], True)
        reasons = self._pressure_reasons(settings)
        reasons.append(f"a graph arrived with tasks of producers: {', '.join(producers[:5])}")
        self.reasons = reasons
        self.hold(settings, scheduler, now)

    def _is_producer(self, prefix: str) -> bool:
        """Whether the tasks of ``prefix`` are producers, by the ``producers`` expression
        on its memory flow (the default counts a prefix never measured as one: such a
        task frees nothing)."""
        settings = self.settings
        if settings is None or settings.producers is None:
            return False
        try:
            return bool(settings.producers(_facts(prefix, self.flow.prefixes.get(prefix))))
        except Exception:  # the expression is checked; never fail the scheduler for it
            logger.exception("amm-rules: memory-pressure producers failed on %r", prefix)
            return False

    # -- the check ---------------------------------------------------------------------

    def check(self) -> None:
        """One look at the workers and the queue (see the module docstring)."""
        settings, ctx = self.settings, self.ctx
        if settings is None or not ctx.attached:
            return
        try:
            self._check(settings, ctx.scheduler, time.monotonic())
        except Exception:
            logger.exception("amm-rules: memory-pressure check failed")

    def _check(self, settings: MemoryPressureSettings, scheduler: Any, now: float) -> None:
        if math.isinf(scheduler.WORKER_SATURATION) and self.state != "holding":
            self._unavailable()
            return
        if self.state == "unavailable":
            self.state = "idle"
        if self.state == "holding" and self.held_at != scheduler.WORKER_SATURATION:
            # Someone else set the saturation: theirs wins, ours is forgotten, and no
            # hold overrides it before a cool-down.
            why = "worker-saturation was changed by someone else"
            self._end_hold(now, f"stopped holding: {why}")
            self._emit("stopped", reason=why)
            self._cool(now + settings.cooldown)
            return
        above_release = self._look(settings, scheduler)
        head = self._head(scheduler)
        reasons = [*self._pressure_reasons(settings), self._head_reason(head)]
        if self.state == "holding":
            self._while_holding(settings, scheduler, now, above_release, head, reasons)
        else:
            self._while_idle(settings, scheduler, now, head, reasons)

    def _look(self, settings: MemoryPressureSettings, scheduler: Any) -> bool:
        """Fill :attr:`pressured`; return whether some worker is at or above release."""
        measure = settings.measure
        threshold, release = settings.threshold, settings.release
        pressured: dict[str, tuple[float, int]] = {}
        above_release = False
        for addr, ws in scheduler.workers.items():
            limit = ws.memory_limit
            if not limit:
                continue
            fraction = getattr(ws.memory, measure) / limit
            if fraction < release:
                continue
            above_release = True
            if fraction < threshold:
                continue
            moving = _transfers(ws)
            if moving or not settings.require_transfers:
                pressured[addr] = (fraction, moving)
        self.pressured = pressured
        return above_release

    def _head(self, scheduler: Any) -> tuple[str, bool] | None:
        queued = scheduler.queued
        if not queued:
            self.head = None
            return None
        prefix = queued.peek().prefix.name
        self.head = (prefix, self._is_producer(prefix))
        return self.head

    def _pressure_reasons(self, settings: MemoryPressureSettings) -> list[str]:
        if not self.pressured:
            what = " with transfers in flight" if settings.require_transfers else ""
            return [f"no worker at or above {format_fraction(settings.threshold)}{what}"]
        worst = sorted(self.pressured.items(), key=lambda kv: -kv[1][0])[:SHOWN_WORKERS]
        shown = ", ".join(f"{a} at {f:.0%} ({counted(n, 'transfer')})" for a, (f, n) in worst)
        return [
            f"{counted(len(self.pressured), 'worker')} at or above "
            f"{format_fraction(settings.threshold)} "
            f"of their memory limit ({settings.measure}): {shown}"
        ]

    def _head_reason(self, head: tuple[str, bool] | None) -> str:
        if head is None:
            return "nothing is queued"
        prefix, producer = head
        entry = self.flow.prefixes.get(prefix)
        net = entry.net_per_task if entry is not None else None
        figure = "not measured yet" if net is None else f"net {signed_size(net)} per task"
        verdict = "a producer" if producer else "not a producer"
        return f"the queue's head is {prefix} ({figure}): {verdict}"

    def _while_idle(
        self,
        settings: MemoryPressureSettings,
        scheduler: Any,
        now: float,
        head: tuple[str, bool] | None,
        reasons: list[str],
    ) -> None:
        if self.state == "cooling":
            if now < self.cool_until:
                reasons.append(f"cooling down for {self.cool_until - now:.0f}s")
                self.reasons = reasons
                return
            self.state = "idle"
        if self.pressured and head is not None and head[1]:
            self.reasons = reasons
            self.hold(settings, scheduler, now)
            return
        self.reasons = [*reasons, "not holding"]

    def _while_holding(
        self,
        settings: MemoryPressureSettings,
        scheduler: Any,
        now: float,
        above_release: bool,
        head: tuple[str, bool] | None,
        reasons: list[str],
    ) -> None:
        held_for = now - (self.since or now)
        self.reasons = [*reasons, f"holding for {held_for:.0f}s"]
        if held_for >= settings.max_hold:
            self.release(now, f"held for max-hold ({settings.max_hold:g}s)")
            self._cool(now + settings.cooldown)
            return
        if held_for < settings.min_hold:
            return
        if not above_release:
            self.judge.paid()
            self.release(now, f"no worker at or above {format_fraction(settings.release)}")
        elif head is not None and not head[1]:
            self.release(now, self._head_reason(head))
        else:
            self._judge(settings, scheduler, now)

    def _judge(self, settings: MemoryPressureSettings, scheduler: Any, now: float) -> None:
        """Release a hold that stopped paying (:class:`HoldJudge`), and cool down."""
        why = self.judge.unpaid(scheduler, settings, now)
        if why is None:
            return
        self.counters["unpaid"] += 1
        self.release(now, why)
        self._cool(now + self.judge.cool_down(settings))

    def _unavailable(self) -> None:
        if self.state != "unavailable":
            why = (
                "worker-saturation is inf (the scheduler queues no task): nothing can be held back"
            )
            self._emit("unavailable", reason=why)
            logger.warning("amm-rules: memory-pressure: %s", why)
        self.state = "unavailable"
        self.reasons = ["worker-saturation is inf: the scheduler queues nothing to hold back"]

    # -- the lever ---------------------------------------------------------------------

    def hold(self, settings: MemoryPressureSettings, scheduler: Any, now: float) -> None:
        """Lower the scheduler's worker-saturation to ``saturation``."""
        base = float(scheduler.WORKER_SATURATION)
        target = min(settings.saturation, base)
        self.base = base
        self.state = "holding"
        self.since = now
        self.held_at = target
        self.counters["holds"] += 1
        self.judge.start(scheduler, frozenset(self.pressured), settings.measure, now)
        _set_saturation(scheduler, target)
        self._emit(
            "hold",
            saturation=target,
            base=base,
            workers={a: round(f, 3) for a, (f, _) in self.pressured.items()},
            prefix=self.head[0] if self.head else None,
            reasons=list(self.reasons),
        )

    def release(self, now: float, why: str) -> None:
        """Put the scheduler's own worker-saturation back."""
        ctx = self.ctx
        held_for = self._end_hold(now, f"released: {why}")
        self.counters["releases"] += 1
        if ctx.attached and self.base is not None:
            _set_saturation(ctx.scheduler, self.base, opened=True)
        self._emit("release", reason=why, held_seconds=round(held_for, 3), saturation=self.base)

    def _end_hold(self, now: float, reason: str) -> float:
        """The hold in force ends (its seconds counted); returns how long it held."""
        held_for = now - (self.since or now)
        self.held_seconds_done += held_for
        self.state = "idle"
        self.since = None
        self.held_at = None
        self.judge.stop()
        self.reasons = [reason]
        return held_for

    def _cool(self, until: float) -> None:
        self.state = "cooling"
        self.cool_until = until

    def _emit(self, step: str, **fields: Any) -> None:
        self.ctx.events.emit("memory-pressure", step=step, **fields)

    # -- reading -----------------------------------------------------------------------

    def status(self) -> dict[str, Any] | None:
        """The section's state for ``amm_rules_status``; None without a section."""
        settings = self.settings
        if settings is None and self.state == "idle":
            return None
        now = time.monotonic()
        return {
            "state": self.state,
            "settings": None if settings is None else _settings_dict(settings),
            "saturation": self.held_at if self.state == "holding" else self.base,
            "scheduler_saturation": self.base,
            "held_for": round(now - self.since, 3)
            if self.state == "holding" and self.since
            else 0,
            "workers": {
                a: {"fraction": round(f, 3), "transfers": n}
                for a, (f, n) in sorted(self.pressured.items(), key=lambda kv: -kv[1][0])[
                    :SHOWN_WORKERS
                ]
            },
            "queue_head": None
            if self.head is None
            else {"prefix": self.head[0], "producer": self.head[1]},
            "reasons": list(self.reasons),
            "totals": self.metrics(now),
        }

    def explain(self, ts: Any, now: float = 0.0) -> dict[str, Any] | None:
        """For ``explain`` of a task waiting in the scheduler's queue: whether the
        section holds it back, and why. None for any other task, or without a section."""
        if self.settings is None or ts is None or ts.state != "queued":
            return None
        prefix = ts.prefix.name
        producer = self._is_producer(prefix)
        held = self.state == "holding" and producer
        if held:
            why = f"held back: worker-saturation is {self.held_at:g} while memory is short"
        elif self.state == "holding":
            why = f"not held back: {prefix} is not a producer"
        else:
            why = f"queued by the scheduler; memory-pressure is {self.state}"
        return {"held": held, "producer": producer, "summary": why, "reasons": list(self.reasons)}

    def metrics(self, now: float | None = None) -> dict[str, float]:
        """Counters for a collector: holds, releases, seconds held, root tasks made
        queueable, and whether a hold is in force."""
        now = time.monotonic() if now is None else now
        holding = self.state == "holding"
        held = self.held_seconds_done + (now - self.since if holding and self.since else 0.0)
        return {
            "holding": float(holding),
            **self.counter_figures(self.counters),
            "held_seconds": round(held, 3),
        }


class HoldJudge:
    """Whether a hold pays: the memory of the workers it started for must fall, by
    :data:`PAYING` of their limits, over each span of twice ``min-hold`` (at least
    :data:`PAYING_SPAN`). A hold that does not has stopped paying (a shuffle, whose
    pieces stay in memory until every input is read, only waits on the producers held
    back): it is released, and the section cools down for ``cool-down``, doubled with
    each such release in a row (at most :data:`UNPAID_COOL_DOWN_MAX` times); a hold
    that paid resets it."""

    def __init__(self) -> None:
        #: The span being judged: the workers, when it started, their memory (bytes by
        #: the section's measure) and their limits then; None without a hold.
        self.span: tuple[frozenset[str], float, int, int] | None = None
        self.measure = "process"
        #: Holds released in a row for not paying.
        self.unpaid_in_a_row = 0

    def start(self, scheduler: Any, workers: frozenset[str], measure: str, now: float) -> None:
        self.measure = measure
        memory, limits = _memory_of(scheduler, workers, measure)
        self.span = (workers, now, memory, limits) if limits else None

    def stop(self) -> None:
        self.span = None

    def paid(self) -> None:
        self.unpaid_in_a_row = 0

    def unpaid(self, scheduler: Any, settings: MemoryPressureSettings, now: float) -> str | None:
        """Why the hold stopped paying, or None (it pays, or its span is not over)."""
        if self.span is None:
            return None
        workers, start, before, limits = self.span
        if now - start < max(2 * settings.min_hold, PAYING_SPAN):
            return None
        memory, limits_now = _memory_of(scheduler, workers, self.measure)
        if not limits_now:
            return None
        if before / limits - memory / limits_now >= PAYING:
            self.paid()
            self.span = (workers, now, memory, limits_now)
            return None
        self.unpaid_in_a_row += 1
        return (
            f"holding did not lower memory: {before / limits:.0%} of the limits of the "
            f"workers it was for {now - start:.0f}s ago, {memory / limits_now:.0%} now"
        )

    def cool_down(self, settings: MemoryPressureSettings) -> float:
        return settings.cooldown * min(2 ** (self.unpaid_in_a_row - 1), UNPAID_COOL_DOWN_MAX)


def _memory_of(scheduler: Any, workers: frozenset[str], measure: str) -> tuple[int, int]:
    """Bytes by ``measure`` and memory limits, summed over those of ``workers`` still in
    the cluster (with a limit)."""
    memory = limits = 0
    for addr in workers:
        ws = scheduler.workers.get(addr)
        if ws is not None and ws.memory_limit:
            memory += getattr(ws.memory, measure)
            limits += ws.memory_limit
    return memory, limits


def _transfers(ws: Any) -> int:
    """Data moving to or from a worker: the keys the scheduler knows it must fetch for
    the tasks it was given (``needs_what``, up to date at every transition), and the
    transfers its last heartbeat reported (those the scheduler cannot see: data sent to
    other workers, fetches for other reasons)."""
    transfer = (ws.metrics or {}).get("transfer") or {}
    reported = int(transfer.get("incoming_count", 0)) + int(transfer.get("outgoing_count", 0))
    return len(ws.needs_what) + reported


def _set_saturation(scheduler: Any, value: float, opened: bool = False) -> None:
    """Set ``worker-saturation`` on a running scheduler. Its idle set is recomputed at
    once for every worker (the scheduler asserts, under validation, that the workers it
    picks from that set have room by the current value); when slots may have opened, the
    queue is offered them, as after a task finishes."""
    scheduler.WORKER_SATURATION = value
    for ws in scheduler.workers.values():
        scheduler.check_idle_saturated(ws)
    if opened:
        scheduler.stimulus_queue_slots_maybe_opened(
            stimulus_id=f"amm-rules-memory-pressure-{time.time()}"
        )


def _facts(prefix: str, entry: PrefixFlow | None) -> TaskFacts:
    """What a ``producers`` expression sees of a prefix: its live memory flow."""
    if entry is None or not entry.tasks:
        return TaskFacts(key="", prefix=prefix)
    facts = PrefixFacts.of(entry)
    return TaskFacts(
        key="",
        prefix=prefix,
        prefix_tasks=facts.tasks,
        prefix_produced_per_task=facts.produced_per_task,
        prefix_freed_by_per_task=facts.freed_by_per_task,
        prefix_net_per_task=facts.net_per_task,
    )


def _settings_dict(settings: MemoryPressureSettings) -> dict[str, Any]:
    return {
        "measure": settings.measure,
        "threshold": settings.threshold,
        "require_transfers": settings.require_transfers,
        "release": settings.release,
        "saturation": settings.saturation,
        "producers": settings.producers_source,
        "check_interval": settings.check_interval,
        "min_hold": settings.min_hold,
        "max_hold": settings.max_hold,
        "cooldown": settings.cooldown,
    }


__all__ = ["MemoryPressure"]
