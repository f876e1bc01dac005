"""The spill section: the ``spill:`` part of the rules (and the rules' ``spill``
action): what each worker keeps in memory, chosen by value, and what the scheduler
knows of what is on disk (docs/spill.md).

When the rules ask for it (:attr:`Ruleset.spill_settings
<amm_rules.language.ruleset.Ruleset.spill_settings>`), the section registers the worker
plugin (:class:`~amm_rules.engine.spill.plugin.SpillPlugin`) from the scheduler, and
removes it when the rules stop asking or the policy detaches. The plugin's reports
(:data:`~amm_rules.engine.spill.plugin.TO_SCHEDULER`) fill ``ctx.spilled``
(:class:`~amm_rules.engine.state.spilled.SpilledKeys`); a worker whose data is not a
``SpillBuffer`` is said once.

Each cycle, within :data:`SLICE` seconds (what it did not reach goes on at the next):

1. workers that left are forgotten (from the section's own tables);
2. with ``drop-copies``, on each worker at least :data:`DROP_AT` of the way to writing
   to disk, copies that other workers hold too are dropped, lowest value first, until
   it would be at :data:`DROP_TO` (:meth:`SpillSection.keeps` says which may not be:
   the last copy, a rule's ``min``, a claim's copies, ``spread: host``, a copy in
   flight, a task about to read it, ``move: never``...); at most :data:`MAX_DROPS` per
   worker, half the slice at most, in dry-run only counted; each drop is in the ledger,
   which asks no copy of the key of that worker for :data:`BACK_OFF` seconds;
3. the sweep (:class:`~amm_rules.engine.spill.sweep.Sweep`) goes on over the keys of
   the workers near their target, the fullest first: with ``order: value`` it sends
   each worker, in one message, the values per byte that changed; with
   ``drop-copies`` it finds the candidates for step 2;
4. with what is left of the slice, the count of bytes on disk by rule goes on
   (:class:`ByRule`, status).

Neighbours: :mod:`amm_rules.engine.spill` is the worker half;
:mod:`amm_rules.engine.decide.spill` values keys; :mod:`amm_rules.engine.state.spilled`
keeps what is on disk.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections import Counter
from collections.abc import Hashable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from distributed.active_memory_manager import Suggestion

from amm_rules.engine.features import FLOOR, Feature, Need, method
from amm_rules.engine.sections.base import Cycle, Section, spawn
from amm_rules.engine.spill.plugin import (
    DEFAULT_READ,
    DEFAULT_WRITE,
    PLUGIN_NAME,
    TO_SCHEDULER,
    TO_WORKER,
    SpillPlugin,
    ignore,
)
from amm_rules.engine.spill.sweep import CHUNK, VALUE_AT, Sweep
from amm_rules.engine.state.spilled import RuledKeys, WorkerDisk
from amm_rules.engine.words import duration
from amm_rules.language.ruleset import ALL, Ruleset, SpillSettings

if TYPE_CHECKING:
    from amm_rules.engine.context import EngineContext
    from amm_rules.engine.dryrun import DryRun

logger = logging.getLogger(__name__)

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
#: Seconds of a cycle the section spends at most: drops first (half of it at most),
#: then the sweep over the workers' keys, then the count of bytes on disk by rule.
SLICE = 0.003
#: Workers with a line of their own in status (those with the most bytes on disk).
STATUS_WORKERS = 20
#: Seconds between two counts of the bytes on disk per rule (status).
BY_RULE_EVERY = 5.0
#: A key stored without a value counts as read once more on its worker for this many
#: of the AMM's cycles at most (the sweep comes to a worker's keys once a cycle).
YOUNG_CYCLES = 2

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

#: The figures of :meth:`SpillSection.metrics` for Prometheus.
METRICS: dict[str, tuple[str, ...]] = {
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
        "Copies held elsewhere dropped from workers near their target instead of written to disk",
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
    "lru_read_bytes": (
        "spill_lru_read_bytes",
        "counter",
        "Bytes a least-recently-used order would have read back under the same accesses "
        "since the worker plugin started (an estimate; with order: value)",
        "worker",
    ),
    "read_since_bytes": (
        "spill_read_since_bytes",
        "counter",
        "Bytes read back from disk since the worker plugin started (with order: value)",
        "worker",
    ),
}


def rates(figures: Mapping[str, float]) -> tuple[float, float]:
    """Seconds per byte of writing and reading back measured on a worker (its report's
    figures), else the plugin's defaults."""
    out = []
    for name, default in (("written", DEFAULT_WRITE), ("read", DEFAULT_READ)):
        size, seconds = figures.get(f"{name}_bytes", 0.0), figures.get(f"{name}_seconds", 0.0)
        out.append(seconds / size if size >= 2**20 and seconds > 0 else default)
    return out[0], out[1]


def _send_nothing(address: str, values: list[Any], forget: list[Any]) -> None:
    """With ``order: lru`` the sweep only finds copies to drop: no value is sent."""


class ByRule:
    """Bytes on disk per rule deciding the keys' ``spill`` (else their first field),
    ``(no rule)`` for keys no rule governs: counted in slices of cycles (a walk over
    every key on disk, one worker after another), at most every :data:`BY_RULE_EVERY`
    seconds; status shows the last count through."""

    def __init__(self) -> None:
        self.counted: dict[str, int] = {}
        #: The engine's clock when the last count through started (None: none yet).
        self.at: float | None = None
        self._workers: list[str] = []
        self._keys: list[Hashable] = []
        self._disk: WorkerDisk | None = None
        self._counting: Counter[str] = Counter()
        self._labels: dict[int, str] = {}
        self._started = 0.0
        self._busy = False

    def count(self, ctx: EngineContext, deadline: float) -> None:
        """Go on with the count until ``deadline``."""
        spilled = ctx.spilled
        if not self._busy:
            now = ctx.clock()
            if self.at is not None and now - self.at < BY_RULE_EVERY:
                return
            self._busy, self._started = True, now
            self._workers = list(spilled.workers)
            self._counting, self._labels = Counter(), {}
        desired = ctx.index.desired
        while True:
            if not self._keys:
                if not self._workers:
                    self.counted = dict(sorted(self._counting.items()))
                    self.at, self._busy = self._started, False
                    return
                self._disk = spilled.workers.get(self._workers.pop())
                self._keys = list(self._disk.keys) if self._disk is not None else []
                continue
            if time.perf_counter() >= deadline:
                return
            disk = self._disk
            assert disk is not None
            keys, self._keys = self._keys[-CHUNK:], self._keys[:-CHUNK]
            for key in keys:
                entry = disk.keys.get(key)
                if entry is not None:
                    self._counting[self._label(desired.get(key))] += entry[1]

    def _label(self, d: Any) -> str:
        if d is None or not d.reasons:
            return "(no rule)"
        label = self._labels.get(id(d))
        if label is None:
            reason = d.reasons.get("spill") or next(iter(d.reasons.values()))
            label = self._labels[id(d)] = reason.rule or f"({reason.kind})"
        return label


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
    METRICS = METRICS

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
        self.sweep = Sweep(self._rates, self.keeps)
        #: Workers at least VALUE_AT of the way to writing to disk, or holding keys on
        #: disk -> how near (what the sweep visits), and those at least DROP_AT of the
        #: way (what the drops look at), as of their last reports.
        self.near: dict[str, float] = {}
        self.pressed: set[str] = set()
        #: Bytes dropped from each worker since its last report (not in its figures yet).
        self._dropped_since: Counter[str] = Counter()
        self.by_rule = ByRule()
        #: Keys whose rule sets ``spill``, their values sent at the next cycle; and
        #: whether a rule sets ``spill`` (a worker reaching half-way then asks for an
        #: early cycle: see on_report).
        self.ruled = RuledKeys()
        self.rules_spill = False
        #: Worker -> copies dropped (and their bytes), would-be drops in dry-run.
        self.drops: Counter[str] = Counter()
        self.drop_bytes: Counter[str] = Counter()
        self.would_drop = 0
        self.values_sent = 0
        self._tasks: set[asyncio.Future[Any]] = set()

    # -- rules, attach, detach -------------------------------------------------------

    def configure(self, ruleset: Ruleset, dry_run: DryRun) -> None:
        self.settings = settings = ruleset.spill_settings
        self.dry_run = dry_run.file
        by_value = settings is not None and settings.order == "value"
        self.ctx.index.governed.follow_spill_rules(self.ruled if by_value else None)
        self.rules_spill = by_value and any(r.actions.spill for r in ruleset.rules)
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
        ctx.index.governed.follow_spill_rules(None)
        self.ruled.clear()
        self.sweep.clear()
        self.near.clear()
        self.pressed.clear()

    def _sync_plugin(self) -> None:
        """Install, change or remove the worker plugin as the rules ask."""
        settings = self.settings
        wanted = None if settings is None else (settings.order, settings.prefetch)
        if wanted == self.installed or not self.ctx.attached:
            return
        scheduler = self.ctx.scheduler
        previous, self.installed = self.installed, wanted
        self.sweep.clear()

        async def sync() -> None:
            if previous is not None:
                await self._unregister(scheduler)
            if wanted is not None:
                order, prefetch = wanted
                plugin = SpillPlugin(order=order, prefetch=prefetch, young=self._young())
                await self._register(scheduler, plugin)

        self._later(sync())

    def _young(self) -> float:
        """Seconds a key stored without a value counts as read once more on its worker:
        two of the AMM's cycles, time for the sweep to come to it. (Asked once the AMM
        is set up: it attaches its policies before it sets its interval.)"""
        manager = self.ctx.manager
        return YOUNG_CYCLES * (manager.interval if manager is not None else 2.0)

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
        """Run ``coro`` on the scheduler's loop (attach and detach are not coroutines);
        without a running loop, nothing."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            coro.close()
            return
        spawn(self._tasks, coro)

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
                self._left(worker)
                if ctx.events.once(
                    ("spill-left-alone", worker), "spill-left-alone", worker=worker, why=why
                ):
                    logger.warning("amm-rules spill: worker %s left alone: %s", worker, why)
                return
            disk = ctx.spilled.report(
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
            self._dropped_since.pop(worker, None)
            fullness = disk.fullness
            if fullness >= VALUE_AT or disk.keys:
                if worker not in self.near and (self.rules_spill or self.ruled.told):
                    # The keys it made since the last cycle classified now rather than
                    # up to an interval later: a rule's spill sent before it writes them.
                    ctx.early.request("spill-worker-filling")
                self.near[worker] = fullness
            else:
                self.near.pop(worker, None)
            if fullness >= DROP_AT:
                self.pressed.add(worker)
            else:
                self.pressed.discard(worker)
        except Exception:
            logger.exception("amm-rules spill: a report of %s could not be read", worker)

    def _left(self, worker: str) -> None:
        """``worker`` left, or is left alone: forgotten."""
        self.ctx.spilled.worker_left(worker)
        self.sweep.forget_workers({worker})
        self._dropped_since.pop(worker, None)
        self.near.pop(worker, None)
        self.pressed.discard(worker)

    # -- the cycle ---------------------------------------------------------------------

    def run(self, cycle: Cycle) -> Iterable[Suggestion]:
        settings = self.settings
        if settings is None:
            return ()
        start = time.perf_counter()
        workers = self.ctx.scheduler.workers
        self._forget_workers(workers)
        if settings.order == "value":
            self._send_ruled()
        if settings.drop_copies and any(a in self.sweep.candidates for a in self.pressed):
            return self._drops_then_sweep(cycle, workers, start)
        self._sweep(workers, start + SLICE)
        return ()

    def _forget_workers(self, workers: Mapping[str, Any]) -> None:
        """Workers that left are forgotten: a look at the section's own tables, never a
        walk over the scheduler's workers (whose keys are a sorted set, slow to
        subtract from)."""
        spilled = self.ctx.spilled
        for table in (self.near, spilled.workers, spilled.left_alone, self.sweep.sent):
            gone = [a for a in table if a not in workers]
            for address in gone:
                self._left(address)
                spilled.left_alone.pop(address, None)

    def _send_ruled(self) -> None:
        """The keys whose rule sets ``spill``, filed or copied since the last cycle:
        their value is sent to their holders now, however full (see
        :class:`~amm_rules.engine.state.spilled.RuledKeys`), to the workers whose plugin
        reported (it handles the message)."""
        ctx = self.ctx
        out = self.ruled.values(ctx.index.desired, ctx.spilled.workers, self.sweep.sent)
        for address, values in out.items():
            self._send(address, values, [])

    def _sweep(self, workers: Mapping[str, Any], deadline: float) -> None:
        """The values (with ``order: value``) and the candidates for drops (with
        ``drop-copies``) of the keys of the workers near their target, then the count
        of bytes on disk by rule, until ``deadline``."""
        settings = self.settings
        assert settings is not None
        if settings.order == "value" or settings.drop_copies:
            desired = self.ctx.index.desired
            send = self._send if settings.order == "value" else _send_nothing
            self.sweep.run(workers, self.near, desired, settings.drop_copies, deadline, send)
        self.by_rule.count(self.ctx, deadline)

    def _rates(self, address: str) -> tuple[float, float]:
        disk = self.ctx.spilled.workers.get(address)
        return rates(disk.figures) if disk is not None else (DEFAULT_WRITE, DEFAULT_READ)

    def _send(self, address: str, values: list[Any], forget: list[Any]) -> None:
        """One message to the worker with the values that changed (a BatchedSend: the
        worker's stream carries it with the scheduler's own messages)."""
        if not values and not forget:
            return
        comm = self.ctx.scheduler.stream_comms.get(address)
        if comm is None:
            return
        comm.send({"op": TO_WORKER, "values": values, "forget": forget})
        self.values_sent += len(values)

    def _drops_then_sweep(
        self, cycle: Cycle, workers: Mapping[str, Any], start: float
    ) -> Iterator[Suggestion]:
        yield from self._drops(cycle, workers, start + SLICE / 2)
        self._sweep(workers, start + SLICE)

    def _drops(
        self, cycle: Cycle, workers: Mapping[str, Any], deadline: float
    ) -> Iterator[Suggestion]:
        """Copies held elsewhere dropped from the workers near their target, lowest
        value first, among the candidates their last pass found (step 2)."""
        ctx = self.ctx
        spilled = ctx.spilled
        candidates = self.sweep.candidates
        pending = ctx.amm.pending
        leaving = ctx.leaving()
        now = cycle.now
        looked = 0
        for address in [a for a in self.pressed if a in candidates]:
            ws = workers.get(address)
            disk = spilled.workers.get(address)
            if ws is None or disk is None or address in leaving:
                continue
            found = candidates[address]
            need = disk.excess(DROP_TO) - self._dropped_since[address]
            dropped = 0
            while found and need > 0 and dropped < MAX_DROPS:
                looked += 1
                if looked % CHUNK == 0 and time.perf_counter() >= deadline:
                    return
                _, ts = found.pop()
                # Drops the AMM accepted in this cycle, this section's and the others'.
                entry = pending.get(ts)
                if entry is not None and ws in entry[1]:
                    continue
                others = len(entry[1]) if entry is not None else 0
                if ts.state != "memory" or self.keeps(ts, ws, others, leaving) is not None:
                    continue
                if not self.dry_run and (yield Suggestion("drop", ts, {ws})) is None:
                    continue  # refused by the AMM
                need -= ts.nbytes
                dropped += 1
                if self.dry_run:
                    self.would_drop += 1
                    continue
                self._dropped_since[address] += ts.nbytes
                self.drops[address] += 1
                self.drop_bytes[address] += ts.nbytes
                cycle.stats["(spill)"]["dropped"] += 1
                ctx.ledger.dropped(ts.key, address, self.name, WHY, now, now + BACK_OFF)
            if not found:
                del candidates[address]

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
            if d.spill == "last":
                return f"spill: last ({d.reasons['spill']}): kept while anything else can go"
            target = d.replicate
            if target is not None and (target.min == ALL or copies - 1 < target.min):
                return f"replicate min {target.min} ({d.reasons['replicate']})"
            if d.spread == "host" and not any(w is not ws and w.host == ws.host for w in who_has):
                return "spread: host (its only copy on that host)"
        claims = ctx.claims
        if claims.held and key in claims.held:
            claim = claims.keeping(key)
            if claim is not None:
                return claim.sentence()
            kept = claims.keeps(key)
            if copies - 1 < kept:
                holder = claims.holder(key)
                return f"{kept} copies kept ({holder.sentence() if holder else 'held'})"
        if ctx.ledger.in_flight(key):
            return "a copy of it is in flight"
        for w in ts.waiters or ():
            if w.processing_on is ws:
                return "a task on that worker is about to read it"
        return None

    # -- what it shows -----------------------------------------------------------------

    def status(self) -> dict[str, Any] | None:
        settings = self.settings
        if settings is None:
            return None
        spilled = self.ctx.spilled
        by_rule = self.by_rule
        shown = heapq.nlargest(
            STATUS_WORKERS, spilled.workers.items(), key=lambda item: (item[1].bytes, item[0])
        )
        workers = {address: self._worker_status(address, disk) for address, disk in shown}
        return {
            "order": settings.order,
            "drop_copies": settings.drop_copies,
            "prefetch": settings.prefetch,
            "plugin": "installed" if self.installed is not None else "not installed",
            "plugin_error": self.plugin_error,
            "workers": workers,
            "workers_reporting": len(spilled.workers),
            "left_alone": dict(sorted(spilled.left_alone.items())),
            "bytes_on_disk_by_rule": by_rule.counted,
            "by_rule_age": None if by_rule.at is None else round(self.ctx.clock() - by_rule.at, 1),
            "keys_on_disk": len(spilled),
            "bytes_on_disk": spilled.total_bytes(),
            "written_bytes": int(spilled.figure("written_bytes")),
            "read_bytes": int(spilled.figure("read_bytes")),
            "prefetches": int(spilled.figure("prefetched_count")),
            **self._saved(spilled.workers.values()),
            "drops": sum(self.drops.values()),
            "would_drop": self.would_drop,
            "values_sent": self.values_sent,
            "near": len(self.near),
            "pressed": len(self.pressed),
        }

    def _worker_status(self, address: str, disk: WorkerDisk) -> dict[str, Any]:
        figures = disk.figures
        return {
            "keys_on_disk": len(disk.keys),
            "bytes_on_disk": disk.bytes,
            "written_bytes": int(figures.get("written_bytes", 0)),
            "read_bytes": int(figures.get("read_bytes", 0)),
            "drops": self.drops[address],
            "drop_bytes": self.drop_bytes[address],
            "prefetches": int(figures.get("prefetched_count", 0)),
            "near_spill": round(disk.fullness, 3),
            "valued": disk.valued,
            **self._saved((disk,)),
        }

    @staticmethod
    def _saved(disks: Iterable[WorkerDisk]) -> dict[str, int]:
        """What least-recently-used would have read back under the same accesses (the
        worker plugin's estimate, with ``order: value``), what was read back since the
        plugin started, and the difference: what the order saved (negative: cost)."""
        lru = since = 0.0
        shown = False
        for disk in disks:
            figures = disk.figures
            if "lru_read_bytes" in figures:
                shown = True
                lru += figures["lru_read_bytes"]
                since += figures.get("read_since_bytes", 0.0)
        if not shown:
            return {}
        return {
            "lru_read_bytes": int(lru),
            "read_since_bytes": int(since),
            "saved_read_bytes": int(lru - since),
        }

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
        lines += [
            f"dropped from {address} {duration(max(0.0, now - drop.at))} ago: {drop.why} "
            f"(no copy asked there for {duration(max(0.0, drop.until - now))})"
            for address, drop in sorted(ctx.ledger.drops_of(key).items())
        ]
        values = {
            address: sent[key] for address, sent in sorted(self.sweep.sent.items()) if key in sent
        }
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

        saving = {a: d for a, d in workers.items() if "lru_read_bytes" in d.figures}

        return {
            "keys_on_disk": float(len(spilled)),
            "bytes_on_disk": float(spilled.total_bytes()),
            "written_bytes": figure("written_bytes"),
            "read_bytes": figure("read_bytes"),
            "drops": per_worker({a: float(n) for a, n in self.drops.items()}),
            "prefetches": figure("prefetched_count"),
            "workers_left_alone": float(len(spilled.left_alone)),
            "values_sent": float(self.values_sent),
            # Only the workers ordering by value estimate what least-recently-used would
            # have read back.
            "lru_read_bytes": per_worker(
                {a: d.figures["lru_read_bytes"] for a, d in saving.items()}
            ),
            "read_since_bytes": per_worker(
                {a: d.figures.get("read_since_bytes", 0.0) for a, d in saving.items()}
            ),
        }
