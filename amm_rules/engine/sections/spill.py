"""The spill section: the ``spill:`` part of the rules (and the rules' ``spill``
action): what each worker keeps in memory, chosen by value, and what the scheduler
knows of what is on disk.

When the rules ask for it (:attr:`Ruleset.spill_settings
<amm_rules.language.ruleset.Ruleset.spill_settings>`), the section registers the worker
plugin (:class:`~amm_rules.engine.spill.plugin.SpillPlugin`) from the scheduler, so
that running workers and those that join run it, and removes it when the rules stop
asking or the policy detaches (each worker's order is then stock again). The plugin's
reports (:data:`~amm_rules.engine.spill.plugin.TO_SCHEDULER`) fill ``ctx.spilled``
(:class:`~amm_rules.engine.state.spilled.SpilledKeys`); a worker whose data is not a
``SpillBuffer`` is said once (a log line, a ``spill-left-alone`` event, status).

Each cycle:

1. workers that left are forgotten;
2. with ``order: value``, for the workers at least :data:`VALUE_AT` of the way to
   writing to disk (their memory buffer's share of its target, or their process's
   share of the memory monitor's spill threshold) or that hold keys on disk, the value per byte of
   each key they hold (:func:`amm_rules.engine.decide.spill.value_per_byte`: the
   key's dependents that have not run, its copies, the costs measured on that worker,
   its rule's ``spill``) is computed, at most :data:`SLICE` seconds a cycle (half with
   ``drop-copies``; a pass
   over many keys goes on at the next cycle), and the values that moved are sent to
   each worker in one message;
3. with ``drop-copies``, on each worker at least :data:`DROP_AT` of the way to
   writing to disk (as above), copies that other workers hold too are dropped
   (lowest value first) until it would be at :data:`DROP_TO`: through the AMM, never
   below a rule's ``min``, never a protected copy, never the last copy, never a key
   with a copy in flight, a task on that worker about to read it, or ``move: never``;
   at most :data:`MAX_DROPS` per worker and cycle; in dry-run only counted. The keys
   looked at are the scheduler's ``replicated_tasks`` (keys with several copies), at
   most what is left of :data:`SLICE` seconds a cycle, in turn.

Neighbours: :mod:`amm_rules.engine.spill` is the worker half;
:mod:`amm_rules.engine.decide.spill` values keys; :mod:`amm_rules.engine.state.spilled`
keeps what is on disk.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from collections.abc import Hashable, Iterator
from typing import TYPE_CHECKING, Any

from distributed.active_memory_manager import Suggestion

from amm_rules.engine.decide.spill import changed, value_per_byte
from amm_rules.engine.features import FLOOR, Feature, Need, method
from amm_rules.engine.sections.base import Cycle, Section
from amm_rules.engine.spill.plugin import (
    DEFAULT_READ,
    DEFAULT_WRITE,
    PLUGIN_NAME,
    TO_SCHEDULER,
    TO_WORKER,
    SpillPlugin,
    ignore,
)
from amm_rules.engine.words import duration
from amm_rules.language.ruleset import ALL, Ruleset, SpillSettings

if TYPE_CHECKING:
    from amm_rules.engine.context import EngineContext
    from amm_rules.engine.dryrun import DryRun

logger = logging.getLogger(__name__)

#: A worker's keys are valued once it is this share of the way to writing to disk
#: (:attr:`WorkerDisk.fullness <amm_rules.engine.state.spilled.WorkerDisk.fullness>`),
#: or it holds keys on disk.
VALUE_AT = 0.5
#: Copies are dropped from a worker this share of the way to writing to disk, down to
#: the second share.
DROP_AT = 0.85
DROP_TO = 0.7
#: Seconds a worker a copy was dropped from is not asked for a copy of that key again
#: (the ledger's back-off: its memory is short), and why, as explain says it.
BACK_OFF = 60.0
WHY = "held elsewhere, dropped rather than written to disk"
#: Most copies dropped from one worker in a cycle.
MAX_DROPS = 1_000
#: Seconds between two counts of the bytes on disk per rule (status).
BY_RULE_EVERY = 5.0
#: Seconds of a cycle the section spends valuing keys and looking for copies to drop
#: (half each with ``drop-copies``); keys looked at between two reads of the clock.
SLICE = 0.01
CHUNK = 128

#: What the section needs: registering a worker plugin from the scheduler, and the
#: scheduler's stream handlers and comms to the workers.
FEATURE = Feature(
    "spill",
    (
        Need(
            "Scheduler.register_worker_plugin(idempotent=)",
            "distributed",
            FLOOR,
            method("register_worker_plugin", "idempotent"),
        ),
        Need(
            "Scheduler.unregister_worker_plugin",
            "distributed",
            FLOOR,
            method("unregister_worker_plugin"),
        ),
        Need(
            "Scheduler.stream_handlers and stream_comms",
            "distributed",
            FLOOR,
            lambda s: s is None or (hasattr(s, "stream_handlers") and hasattr(s, "stream_comms")),
        ),
    ),
    in_use=lambda ruleset: ruleset.spill_settings is not None,
)


def rates(figures: dict[str, float]) -> tuple[float, float]:
    """Seconds per byte of writing and reading back measured on a worker (its report's
    figures), else the plugin's defaults."""
    out = []
    for name, default in (("written", DEFAULT_WRITE), ("read", DEFAULT_READ)):
        size, seconds = figures.get(f"{name}_bytes", 0.0), figures.get(f"{name}_seconds", 0.0)
        out.append(seconds / size if size >= 2**20 and seconds > 0 else default)
    return out[0], out[1]


class _Pass:
    """A pass over one worker's keys, taken up again at the next cycle if cut short."""

    __slots__ = ("address", "at", "keys", "seen")

    def __init__(self, address: str, keys: list[Any]) -> None:
        self.address = address
        self.keys = keys
        self.at = 0
        self.seen: set[Hashable] = set()


class SpillSection(Section):
    """See the module docstring."""

    name = "spill"
    status_key = "spill"
    explain_key = "spill"
    metric_prefix = "spill"
    FEATURES = (FEATURE,)
    offline = (
        "spill: not simulated: a recorded cluster has no worker plugin, and a dump does "
        "not say which keys are on disk"
    )
    METRICS = {
        "keys_on_disk": ("spill_keys_on_disk", "gauge", "Keys on disk, as workers report"),
        "bytes_on_disk": (
            "spill_bytes_on_disk",
            "gauge",
            "Bytes (in memory) of the keys on disk, as workers report",
        ),
        "written_bytes": (
            "spill_written_bytes",
            "counter",
            "Bytes workers wrote to disk",
            "worker",
        ),
        "read_bytes": (
            "spill_read_bytes",
            "counter",
            "Bytes workers read back from disk",
            "worker",
        ),
        "drops": (
            "spill_drops",
            "counter",
            "Copies held elsewhere dropped from workers near their target instead of "
            "written to disk",
            "worker",
        ),
        "prefetches": (
            "spill_prefetches",
            "counter",
            "Keys read back from disk ahead of the tasks that read them",
            "worker",
        ),
        "workers_left_alone": (
            "spill_workers_left_alone",
            "gauge",
            "Workers whose data is not a SpillBuffer (eviction left as it is)",
        ),
        "values_sent": ("spill_values_sent", "counter", "Values per byte sent to workers"),
    }

    @classmethod
    def in_use(cls, ruleset: Ruleset) -> bool:
        return ruleset.spill_settings is not None

    def __init__(self, ctx: EngineContext) -> None:
        super().__init__(ctx)
        self.settings: SpillSettings | None = None
        self.dry_run = False
        #: The plugin's settings on the workers (None: not installed), and the last
        #: error installing or removing it.
        self.installed: tuple[str, bool] | None = None
        self.plugin_error = ""
        #: Worker -> key -> the value per byte last sent.
        self.sent: dict[str, dict[Hashable, float]] = {}
        self._pass: _Pass | None = None
        self._queue: list[str] = []
        self._by_rule: tuple[float, dict[str, int]] | None = None
        #: Keys with several copies still to look at for drops (see _candidates).
        self._copies: list[Any] = []
        #: Worker -> copies dropped (and their bytes), would-be drops in dry-run.
        self.drops: Counter[str] = Counter()
        self.drop_bytes: Counter[str] = Counter()
        self.would_drop = 0
        self.values_sent = 0
        self._tasks: set[asyncio.Task[Any]] = set()

    # -- rules, attach, detach -------------------------------------------------------

    def configure(self, ruleset: Ruleset, dry_run: DryRun) -> None:
        self.settings = ruleset.spill_settings
        self.dry_run = dry_run.file
        if self.ctx.attached:
            self._sync_plugin()

    def attach(self) -> None:
        self.ctx.scheduler.stream_handlers[TO_SCHEDULER] = self.on_report
        self._sync_plugin()

    def detach(self) -> None:
        ctx = self.ctx
        scheduler = ctx.scheduler
        if scheduler.stream_handlers.get(TO_SCHEDULER) == self.on_report:
            # Reports sent before the workers heard of the teardown may still
            # arrive: an operation without a handler would end a worker's stream.
            scheduler.stream_handlers[TO_SCHEDULER] = ignore
        if self.installed is not None:
            self._later(self._unregister(scheduler))
        self.installed = None
        ctx.spilled.clear()
        self.sent.clear()

    def _sync_plugin(self) -> None:
        """Install, change or remove the worker plugin as the rules ask."""
        settings = self.settings
        wanted = None if settings is None else (settings.order, settings.prefetch)
        if wanted == self.installed or not self.ctx.attached:
            return
        scheduler = self.ctx.scheduler
        previous, self.installed = self.installed, wanted
        self.sent.clear()
        self._pass = None

        async def sync() -> None:
            if previous is not None:
                await self._unregister(scheduler)
            if wanted is not None:
                order, prefetch = wanted
                await self._register(scheduler, SpillPlugin(order=order, prefetch=prefetch))

        self._later(sync())

    async def _register(self, scheduler: Any, plugin: SpillPlugin) -> None:
        from distributed.protocol.pickle import dumps

        try:
            await scheduler.register_worker_plugin(
                None, dumps(plugin), name=PLUGIN_NAME, idempotent=False
            )
            self.plugin_error = ""
        except Exception as exc:
            self.plugin_error = f"installing the worker plugin failed: {exc!r}"
            logger.error("amm-rules spill: %s", self.plugin_error)
            self.ctx.events.emit("spill-plugin-error", error=self.plugin_error)

    async def _unregister(self, scheduler: Any) -> None:
        if PLUGIN_NAME not in getattr(scheduler, "worker_plugins", {}):
            return
        try:
            await scheduler.unregister_worker_plugin(None, PLUGIN_NAME)
        except Exception as exc:  # a worker closing: its teardown runs as it closes
            logger.info("amm-rules spill: removing the worker plugin: %r", exc)

    def _later(self, coro: Any) -> None:
        """Run ``coro`` on the scheduler's loop (attach and detach are not coroutines)."""
        try:
            task = asyncio.get_running_loop().create_task(coro)
        except RuntimeError:
            coro.close()
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- the workers' reports ----------------------------------------------------------

    def on_report(self, worker: str = "", attached: bool = True, **msg: Any) -> None:
        """A worker plugin's report (a stream handler: never raises)."""
        ctx = self.ctx
        if not ctx.attached:
            return
        try:
            if not attached:
                why = str(msg.get("why", ""))
                ctx.spilled.alone(worker, why)
                self.sent.pop(worker, None)
                if ctx.events.once(
                    ("spill-left-alone", worker), "spill-left-alone", worker=worker, why=why
                ):
                    logger.warning("amm-rules spill: worker %s left alone: %s", worker, why)
                return
            ctx.spilled.report(
                worker,
                ctx.clock(),
                msg.get("spilled", ()),
                msg.get("unspilled", ()),
                msg.get("figures"),
                msg.get("fast", 0.0),
                msg.get("target", 0.0),
                str(msg.get("order", "")),
                int(msg.get("valued", 0)),
                msg.get("process", 0.0),
                msg.get("spill_at", 0.0),
            )
        except Exception:
            logger.exception("amm-rules spill: a report of %s could not be read", worker)

    # -- the cycle ---------------------------------------------------------------------

    def run(self, cycle: Cycle) -> Iterator[Suggestion] | tuple[()]:
        ctx = self.ctx
        settings = self.settings
        if settings is None:
            return ()
        workers = ctx.scheduler.workers
        spilled = ctx.spilled
        spilled.forget_workers(workers)
        for address in [a for a in self.sent if a not in workers]:
            del self.sent[address]
        # The cycle's share of the section: half of it to values, the rest to drops.
        start = time.perf_counter()
        if settings.order == "value":
            self._value(workers, settings, start + (SLICE / 2 if settings.drop_copies else SLICE))
        if settings.drop_copies:
            return self._drops(workers, cycle, start + SLICE)
        return ()

    def _value(self, workers: Any, settings: SpillSettings, deadline: float) -> None:
        """Value the keys of the workers under pressure, send what moved (step 2)."""
        spilled = self.ctx.spilled
        while time.perf_counter() < deadline:
            current = self._pass
            if current is None:
                if not self._queue:
                    self._queue = [
                        a
                        for a, disk in spilled.workers.items()
                        if a in workers and (disk.fullness >= VALUE_AT or disk.keys)
                    ]
                    if not self._queue:
                        return
                address = self._queue.pop()
                ws = workers.get(address)
                if ws is None:
                    continue
                current = self._pass = _Pass(address, list(ws.has_what))
            done = self._value_some(current, workers, settings, deadline)
            if done:
                self._pass = None
            else:
                return

    def _value_some(
        self, current: _Pass, workers: Any, settings: SpillSettings, deadline: float
    ) -> bool:
        ctx = self.ctx
        ws = workers.get(current.address)
        disk = ctx.spilled.workers.get(current.address)
        if ws is None or disk is None:
            return True
        write, read = rates(disk.figures)
        desired = ctx.index.desired
        sent = self.sent.setdefault(current.address, {})
        out: list[tuple[Hashable, float]] = []
        keys = current.keys
        while current.at < len(keys):
            for ts in keys[current.at : current.at + CHUNK]:
                key = ts.key
                current.seen.add(key)
                d = desired.get(key)
                copies = len(ts.who_has or ())
                value = value_per_byte(
                    ts.nbytes,
                    self._reads(ts, ws),
                    copies,
                    write=write,
                    read=read,
                    # A copy the engine may not drop is written like a sole one.
                    drop_copies=settings.drop_copies and copies > 1 and self.keeps(ts, ws) is None,
                    spill=d.spill if d is not None else None,
                )
                if changed(sent.get(key), value):
                    sent[key] = value
                    out.append((key, value))
            current.at += CHUNK
            if current.at < len(keys) and time.perf_counter() >= deadline:
                self._send(current.address, out, ())
                return False
        gone = [k for k in sent if k not in current.seen]
        for key in gone:
            del sent[key]
        self._send(current.address, out, gone)
        return True

    @staticmethod
    def _reads(ts: Any, ws: Any) -> int:
        """Dependents of ``ts`` not yet run, but those on ``ws`` (the worker counts its
        own)."""
        waiters = ts.waiters
        if not waiters:
            return 0
        return sum(1 for w in waiters if w.processing_on is not ws)

    def _send(self, address: str, values: list[Any], forget: Any) -> None:
        if not values and not forget:
            return
        comm = self.ctx.scheduler.stream_comms.get(address)
        if comm is None:
            return
        comm.send({"op": TO_WORKER, "values": values, "forget": list(forget)})
        self.values_sent += len(values)

    def _drops(self, workers: Any, cycle: Cycle, deadline: float) -> Iterator[Suggestion]:
        """Copies held elsewhere dropped from workers near their target (step 3)."""
        ctx = self.ctx
        need: dict[Any, float] = {}
        leaving = ctx.leaving()
        for address, disk in ctx.spilled.workers.items():
            ws = workers.get(address)
            if ws is not None and disk.fullness >= DROP_AT and address not in leaving:
                need[ws] = disk.excess(DROP_TO)
        if not need:
            self._copies = []
            return
        now = cycle.now
        candidates = self._candidates(need, deadline)
        pending = ctx.amm.pending
        looked = 0
        for ws, found in candidates.items():
            sent = self.sent.get(ws.address, {})
            found.sort(key=lambda ts: sent.get(ts.key, math.inf))
            dropped = 0
            for ts in found:
                if need[ws] <= 0 or dropped >= MAX_DROPS:
                    break
                looked += 1
                if looked % CHUNK == 0 and time.perf_counter() >= deadline + SLICE:
                    return  # the candidates found in the slice take as long again at most
                # Drops the AMM accepted in this cycle, this section's and the others'.
                entry = pending.get(ts)
                if entry is not None and ws in entry[1]:
                    continue
                others = len(entry[1]) if entry is not None else 0
                if self.keeps(ts, ws, others, leaving) is not None:
                    continue
                if self.dry_run:
                    need[ws] -= ts.nbytes
                    dropped += 1
                    self.would_drop += 1
                    continue
                if (yield Suggestion("drop", ts, {ws})) is None:
                    continue  # refused by the AMM
                need[ws] -= ts.nbytes
                dropped += 1
                self.drops[ws.address] += 1
                self.drop_bytes[ws.address] += ts.nbytes
                cycle.stats["(spill)"]["dropped"] += 1
                ctx.ledger.dropped(ts.key, ws.address, self.name, WHY, now, now + BACK_OFF)

    def _candidates(self, need: dict[Any, float], deadline: float) -> dict[Any, list[Any]]:
        """The keys with several copies held by the workers of ``need``, per worker:
        the scheduler's ``replicated_tasks`` (never every key), walked in turn at most
        until ``deadline`` (a walk over many keys goes on at the next cycle)."""
        out: dict[Any, list[Any]] = {}
        if not self._copies:
            self._copies = list(self.ctx.scheduler.replicated_tasks)
        copies = self._copies
        while copies:
            for ts in copies[-CHUNK:]:
                if ts.state != "memory":
                    continue
                for ws in ts.who_has or ():
                    if ws in need:
                        out.setdefault(ws, []).append(ts)
            del copies[-CHUNK:]
            if time.perf_counter() >= deadline:
                break
        return out

    def keeps(self, ts: Any, ws: Any, dropping: int = 0, leaving: Any = ()) -> str | None:
        """Why the copy of ``ts`` on ``ws`` may not be dropped (None: it may);
        ``dropping``: copies of it this cycle already drops elsewhere; ``leaving``: the
        workers on their way out (their copies do not count)."""
        ctx = self.ctx
        key = ts.key
        who_has = ts.who_has or ()
        copies = len(who_has) - dropping
        if leaving:
            copies -= sum(1 for w in who_has if w.address in leaving)
        if copies <= 1:
            return "the last copy"
        if ctx.spilled.is_on_disk(key, ws.address):
            return "on disk there: dropping it frees no memory"
        d = ctx.index.desired.get(key)
        if d is not None:
            if d.move == "never":
                return f"move: never ({d.reasons['move']})"
            target = d.replicate
            if target is not None and (target.min == ALL or copies - 1 < target.min):
                return f"replicate min {target.min} ({d.reasons['replicate']})"
        claims = ctx.claims
        if claims.held and key in claims.held:
            claim = claims.keeping(key)
            if claim is not None:
                return claim.sentence()
            kept = claims.keeps(key)
            if copies - 1 < kept:
                return f"{kept} copies kept: {claims.holder(key).sentence()}"  # type: ignore[union-attr]
        if ctx.ledger.in_flight(key):
            return "a copy of it is in flight"
        if any(w.processing_on is ws for w in ts.waiters or ()):
            return "a task on that worker is about to read it"
        return None

    # -- what it shows -----------------------------------------------------------------

    def status(self) -> dict[str, Any] | None:
        ctx = self.ctx
        settings = self.settings
        if settings is None:
            return None
        spilled = ctx.spilled
        workers = {}
        for address, disk in sorted(spilled.workers.items()):
            figures = disk.figures
            workers[address] = {
                "keys_on_disk": len(disk.keys),
                "bytes_on_disk": disk.bytes,
                "written_bytes": int(figures.get("written_bytes", 0)),
                "read_bytes": int(figures.get("read_bytes", 0)),
                "drops": self.drops[address],
                "drop_bytes": self.drop_bytes[address],
                "prefetches": int(figures.get("prefetched_count", 0)),
                "near_spill": round(disk.fullness, 3),
                "valued": disk.valued,
            }
        return {
            "order": settings.order,
            "drop_copies": settings.drop_copies,
            "prefetch": settings.prefetch,
            "plugin": "installed" if self.installed is not None else "not installed",
            "plugin_error": self.plugin_error,
            "workers": workers,
            "left_alone": dict(sorted(spilled.left_alone.items())),
            "bytes_on_disk_by_rule": self.bytes_by_rule(),
            "keys_on_disk": len(spilled),
            "drops": sum(self.drops.values()),
            "would_drop": self.would_drop,
            "values_sent": self.values_sent,
        }

    def bytes_by_rule(self) -> dict[str, int]:
        """Bytes on disk per rule deciding the key's ``spill`` (else its first field),
        ``(no rule)`` for keys no rule governs; computed at most every
        :data:`BY_RULE_EVERY` seconds (a walk over every key on disk)."""
        ctx = self.ctx
        now = ctx.clock()
        if self._by_rule is not None and now - self._by_rule[0] < BY_RULE_EVERY:
            return self._by_rule[1]
        out = self._count_by_rule()
        self._by_rule = (now, out)
        return out

    def _count_by_rule(self) -> dict[str, int]:
        ctx = self.ctx
        desired = ctx.index.desired
        out: Counter[str] = Counter()
        for disk in ctx.spilled.workers.values():
            for key, (_, size) in disk.keys.items():
                d = desired.get(key)
                label = "(no rule)"
                if d is not None and d.reasons:
                    reason = d.reasons.get("spill") or next(iter(d.reasons.values()))
                    label = reason.rule or f"({reason.kind})"
                out[label] += size
        return dict(sorted(out.items()))

    def explain(self, ts: Any, now: float) -> dict[str, Any] | None:
        ctx = self.ctx
        if self.settings is None:
            return None
        key = ts.key
        on_disk = ctx.spilled.on_disk(key)
        lines = [
            f"on {address}: on disk since {duration(max(0.0, now - since))}"
            for address, since in sorted(on_disk.items())
        ]
        values = {address: sent[key] for address, sent in sorted(self.sent.items()) if key in sent}
        d = ctx.index.desired.get(key)
        spill = d.spill if d is not None else None
        return {
            "on_disk": {a: round(max(0.0, now - s), 1) for a, s in on_disk.items()},
            "lines": lines,
            "values": values,
            "spill": spill,
            "spill_from": str(d.reasons["spill"]) if spill is not None and d is not None else None,
        }

    def metrics(self) -> dict[str, Any]:
        """Served whether or not the rules ask for spilling (zeros then); the figures
        per worker also under ``worker="(total)"``."""
        spilled = self.ctx.spilled
        workers = spilled.workers

        def per_worker(values: dict[str, float]) -> dict[str, float]:
            return {**values, "(total)": float(sum(values.values()))}

        def figure(name: str) -> dict[str, float]:
            return per_worker({a: d.figures.get(name, 0.0) for a, d in workers.items()})

        return {
            "keys_on_disk": float(len(spilled)),
            "bytes_on_disk": float(spilled.total_bytes()),
            "written_bytes": figure("written_bytes"),
            "read_bytes": figure("read_bytes"),
            "drops": per_worker({a: float(n) for a, n in self.drops.items()}),
            "prefetches": figure("prefetched_count"),
            "workers_left_alone": float(len(spilled.left_alone)),
            "values_sent": float(self.values_sent),
        }
