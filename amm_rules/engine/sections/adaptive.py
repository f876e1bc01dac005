"""Adaptive scaling that sees memory and the rules: the ``adaptive:`` section, and the one
guard of adaptive scale-down (docs/adaptive.md says what each part does and shows).

Every adaptive deployment of Dask asks the scheduler ``adaptive_target()`` and, to scale
down, ``workers_to_close(target=...)``, then ``retire_workers(names=...)``, and closes
the workers it named whether or not their retirement succeeded. While the policy is
attached, this section wraps the three (method and comm handler, restored at detach)
and adds a scheduler plugin whose ``valid_workers_downscaling`` hook is the guard:

- **the guard** (always): the candidates whose leaving the rules allow
  (:func:`~amm_rules.engine.decide.adaptive.hold`; keys in dry-run keep no worker);
- **the order** (with the section): of the workers the guard lets go, distributed's
  count, cheapest to move first (:func:`~amm_rules.engine.decide.adaptive.cheapest_first`);
- **the target** (with ``memory: true``): the larger of distributed's and
  :func:`~amm_rules.engine.decide.adaptive.memory_target`; when adaptive scaling asks
  (with its target duration), the time is kept in ``ctx.adapting_at``, which the
  rebalance section follows for ``adaptive: balance``.

``workers_to_close`` also answers reads (``adaptive_target``, every ``/metrics`` scrape
and the dashboard call it): its decision is shown in the status at once, and acted on
(counted, and said in a ``retirement`` event with ``step: kept``) only when adaptive
scaling made it, or when a retirement of a worker it let through follows within
:data:`FOLLOW_SECONDS`; a decision that keeps the same workers for the same reasons as
the last one acted on is not counted again.

Neighbours: :mod:`amm_rules.engine.decide.adaptive` computes; :mod:`amm_rules.engine.words`
words it; the retirement section places the keys of the workers that leave.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict
from operator import attrgetter
from typing import TYPE_CHECKING, Any, NamedTuple

import dask
from distributed.diagnostics.plugin import SchedulerPlugin

from amm_rules.engine.adapters import worker_status
from amm_rules.engine.decide.adaptive import (
    DISK,
    TO_RUN,
    DiskMeter,
    HeldClass,
    Hold,
    Kept,
    LeavingCost,
    MemoryDemand,
    MemoryTarget,
    Slot,
    cheapest_first,
    hold,
    holder_index,
    memory_target,
)
from amm_rules.engine.decide.evacuate import Copy, Evacuation
from amm_rules.engine.decide.view import ClusterView, KeyView
from amm_rules.engine.evacuation import rank_views
from amm_rules.engine.features import ADAPTIVE_READS, ADAPTIVE_SCALING, DOWNSCALING, Feature
from amm_rules.engine.sections.base import Section
from amm_rules.engine.state.leaving import Departure
from amm_rules.engine.words import kept_sentence, kept_why, target_sentence
from amm_rules.engine.wrapping import wrap_methods
from amm_rules.language.ruleset import AdaptiveSettings, Ruleset

if TYPE_CHECKING:
    from amm_rules.engine.context import EngineContext
    from amm_rules.engine.dryrun import DryRun

logger = logging.getLogger(__name__)

#: Seconds within which a retirement must follow a decision of ``workers_to_close`` for
#: the decision to count: adaptive retires the workers it chose right after choosing
#: them.
FOLLOW_SECONDS = 10.0
#: Seconds between two samples of the workers' disk metrics.
SAMPLE_EVERY = 0.5
#: Reads a worker's address.
_ADDRESS = attrgetter("address")
#: The scheduler's methods this section wraps, each also a comm handler of that name.
WRAPPED = ("adaptive_target", "workers_to_close", "retire_workers")


class Held(NamedTuple):
    """The holders of a class's keys that must stay put, as read when the governed keys
    had changed ``changes`` times, and their index by holder."""

    changes: int
    holders: list[frozenset[str]]
    by_holder: dict[str, list[frozenset[str]]]


class Decision(NamedTuple):
    """One answer of ``workers_to_close``: when, the workers it let go, and the workers
    kept that adaptive would have closed, with why."""

    at: float
    passed: frozenset[str]
    kept: Mapping[str, list[Kept]]


# -- what the scheduler knows, as the pure half's views ----------------------------------


def disk_totals(scheduler: Any) -> tuple[int, int, float]:
    """Bytes the workers' spilling wrote to disk and read back, and the seconds reading
    took, since the scheduler started (its cumulative fine performance metrics;
    transfers of P2P shuffles to their own disk files are not spilling)."""
    written = read = 0
    seconds = 0.0
    for k, v in scheduler.cumulative_worker_metrics.items():
        if not isinstance(k, tuple) or len(k) < 2 or any("p2p" in str(p) for p in k):
            continue
        activity, unit = k[-2], k[-1]
        if activity == "disk-write" and unit == "bytes":
            written += int(v)
        elif activity == "disk-read":
            if unit == "bytes":
                read += int(v)
            elif unit == "seconds":
                seconds += float(v)
    return written, read, seconds


def memory_demand(ctx: EngineContext, meter: DiskMeter, rose: bool = False) -> MemoryDemand:
    """The memory view of the scheduler (see the module docstring); ``rose``: the last
    target rose on disk traffic."""
    scheduler = ctx.scheduler
    workers = [ws for ws in scheduler.workers.values() if worker_status(ws) != "closing"]
    in_memory = on_disk = 0
    for ws in workers:
        memory = ws.memory
        in_memory += memory.managed
        on_disk += memory.spilled
    flow = ctx.flow.prefixes
    to_run, per_task = {}, {}
    for name, tp in scheduler.task_prefixes.items():
        states = tp.states
        n = sum(states.get(s, 0) for s in TO_RUN)
        if not n:
            continue
        to_run[name] = n
        entry = flow.get(name)
        net = entry.net_per_task if entry is not None else None
        if net is not None:
            per_task[name] = net
    base = dask.config.get("distributed.scheduler.worker-saturation", 1.1)
    try:
        held_back = bool(scheduler.queued) and float(base) > scheduler.WORKER_SATURATION
    except (TypeError, ValueError):
        held_back = False
    return MemoryDemand(
        limits=tuple(int(ws.memory_limit or 0) for ws in workers),
        in_memory=in_memory,
        on_disk=on_disk,
        to_run=to_run,
        per_task=per_task,
        disk_rate=meter.rate(),
        held_back=held_back,
        rose=rose,
    )


def slots(ctx: EngineContext) -> dict[str, Slot]:
    """Every worker, with its host and pools; running unless it is on its way out (a
    worker retiring or drained holds copies that count for no rule)."""
    pools = ctx.placements.pools
    leaving = ctx.leaving()
    return {
        a: Slot(
            a,
            ws.host,
            pools.get(a, frozenset()),
            worker_status(ws) == "running" and a not in leaving,
        )
        for a, ws in ctx.scheduler.workers.items()
    }


class ValueOrder:
    """The pacer of a retirement adaptive scale-down asked for: the worker's keys in the
    drain's order of value (:func:`~amm_rules.engine.evacuation.rank_views`: below a
    rule's minimum first, then the recompute seconds saved per byte, then the rest), and
    every copy let through at once (there is no deadline to pace for)."""

    def __init__(self, ctx: EngineContext):
        self.ctx = ctx

    def rank(self, ws: Any, views: list[KeyView], cluster: ClusterView) -> list[KeyView]:
        ranked, _ = rank_views(views, cluster, self.ctx.scheduler.tasks, self.ctx.costs.estimate)
        return ranked

    def admit(self, ws: Any, plan: Evacuation, now: float) -> Evacuation:
        return plan

    def asked(self, ws: Any, copy: Copy, now: float) -> None:
        """Nothing to pace."""

    def placed(self, address: str) -> None:
        """Nothing to pace."""


def held_classes(
    ctx: EngineContext,
    workers: Mapping[str, Slot],
    known: dict[Any, Held] | None = None,
) -> list[HeldClass]:
    """The governed classes of keys whose rules act (not in dry-run), with the holders
    of their keys where they must stay put (``move: never``; a pool or avoid that no
    running worker meets). Cost: one pass over the classes, plus the keys of those (and
    of every class while rules are in dry-run: which of its keys act). ``known``:
    holders read before, per class, with the governed keys' change count then; reused
    while it is the same, and updated."""
    index = ctx.index
    changes = index.governed.changes
    desired = index.desired
    dry_run = ctx.dry_run
    out = []
    for cls, group in index.governed.groups.items():
        tasks: Iterable[Any] = group.values()
        if dry_run.keys_active:
            tasks = [ts for k, ts in group.items() if dry_run.label(desired.get(k)) is None]
        n = len(tasks)  # type: ignore[arg-type]
        if not n:
            continue
        example = desired.get(next(iter(tasks)).key)
        sources = {f: str(r) for f, r in example.reasons.items()} if example is not None else {}
        restricted = cls.pool is not None or cls.avoid is not None
        stay_put = cls.move == "never" or (restricted and not _any_eligible(cls, workers))
        holders: list[frozenset[str]] = []
        by_holder = None
        if stay_put:
            seen = known.get(cls) if known is not None else None
            if seen is not None and seen.changes == changes and not dry_run.keys_active:
                holders, by_holder = seen.holders, seen.by_holder
            else:
                holders = [frozenset(map(_ADDRESS, ts.who_has or ())) for ts in tasks]
                by_holder = holder_index(holders)
                if known is not None:
                    known[cls] = Held(changes, holders, by_holder)
        out.append(
            HeldClass(
                keys=n,
                target=cls.replicate,
                pool=cls.pool,
                avoid=cls.avoid,
                spread=cls.spread,
                move=cls.move,
                sources=sources,
                holders=holders,
                index=by_holder,
            )
        )
    return out


def _any_eligible(cls: Any, workers: Mapping[str, Slot]) -> bool:
    want = set(cls.pool) if cls.pool is not None else None
    shun = set(cls.avoid or ())
    return any(
        s.running and (want is None or not want.isdisjoint(s.pools)) and shun.isdisjoint(s.pools)
        for s in workers.values()
    )


def leaving_costs(ctx: EngineContext, candidates: Iterable[Any]) -> list[LeavingCost]:
    at_risk = ctx.costs.at_risk
    return [
        LeavingCost(
            ws.address,
            busy=bool(ws.processing),
            nbytes=max(0, ws.nbytes),
            on_disk=max(0, ws.memory.spilled),
            at_risk=max(0.0, at_risk.get(ws.address, 0.0)),
        )
        for ws in candidates
    ]


# -- the guard ---------------------------------------------------------------------------


class ScaleDownGuard(SchedulerPlugin):
    """The candidates of ``workers_to_close`` that the rules let go, in the order they
    should go (see the module docstring)."""

    name = "amm-rules-scale-down"

    def __init__(self, section: AdaptiveSection):
        self.section = section
        #: The last answer of the hook within the call being made: (the candidates in
        #: order, what the hold decided), or None.
        self.verdict: tuple[list[str], Hold] | None = None
        #: Let every candidate through (while distributed's own choice is asked).
        self.bypass = False

    def remove_worker(self, scheduler: Any = None, worker: str = "", **kwargs: Any) -> None:
        self.section.kept.pop(worker, None)
        self.section.chosen_at.pop(worker, None)
        self.section.ctx.departures.stay(worker, AdaptiveSection.name)

    def valid_workers_downscaling(self, scheduler: Any, workers: list[Any]) -> list[Any]:
        section = self.section
        if not section.ctx.attached or not workers or self.bypass:
            return workers
        try:
            order, decided = section.decide(workers)
        except Exception:  # never break adaptive scaling
            logger.exception("amm-rules: the scale-down guard failed; not filtering")
            return workers
        self.verdict = (order, decided)
        by_address = {ws.address: ws for ws in workers}
        return [by_address[a] for a in decided.allowed]


# -- the section -------------------------------------------------------------------------


class AdaptiveSection(Section):
    """Adaptive scaling under the rules (see the module docstring)."""

    name = "adaptive"
    status_key = "adaptive"
    metric_prefix = "adaptive"
    offline = (
        "adaptive: not simulated as a cycle; amm-rules simulate says how many workers the "
        "rules and the headroom need for the dump"
    )
    FEATURES = (
        Feature("adaptive scale-down guard", (DOWNSCALING, *ADAPTIVE_SCALING)),
        Feature(
            "adaptive: memory",
            ADAPTIVE_READS,
            in_use=lambda ruleset: ruleset.adaptive is not None and ruleset.adaptive.memory,
        ),
    )
    METRICS = {
        "target": (
            "adaptive_target_workers",
            "gauge",
            "Workers the adaptive target asked for at its last call",
        ),
        "memory_target": (
            "adaptive_memory_target_workers",
            "gauge",
            "Workers memory asked for at the last call of the adaptive target",
        ),
        "needed_bytes": (
            "adaptive_memory_needed_bytes",
            "gauge",
            "Bytes to hold: in memory, on disk and expected from the tasks to run",
        ),
        "disk_bytes_per_second": (
            "adaptive_disk_bytes_per_second",
            "gauge",
            "Bytes the workers wrote to disk and read back per second, lately",
        ),
        "kept": ("adaptive_kept_workers", "gauge", "Workers the last scale-down decision kept"),
        "raised": (
            "adaptive_target_raised",
            "counter",
            "Calls of the adaptive target where memory asked for more than distributed",
        ),
        "downscaling_kept": (
            "retirement_downscaling_kept",
            "counter",
            "Workers kept out of adaptive scale-down by the rules",
        ),
    }

    @classmethod
    def in_use(cls, ruleset: Ruleset) -> bool:
        return ruleset.adaptive is not None

    def __init__(self, ctx: EngineContext) -> None:
        super().__init__(ctx)
        #: The ``adaptive:`` section in force (None: the file has none).
        self.settings: AdaptiveSettings | None = None
        self.guard = ScaleDownGuard(self)
        self.meter = DiskMeter()
        #: The last target computed: its figures, the stock target and when.
        self.target: MemoryTarget | None = None
        self.stock: int | None = None
        self.target_at: float | None = None
        #: Workers the last decision kept that adaptive would have closed: address ->
        #: (why, since when: ``time.time()``).
        self.kept: dict[str, tuple[list[Kept], float]] = {}
        #: Counters since the policy started: ``downscaling_kept``, ``raised``,
        #: ``decisions``.
        self.counters: Counter[str] = Counter()
        self._pending: Decision | None = None
        self._acted: frozenset[tuple[str, tuple[Kept, ...]]] = frozenset()
        #: Workers a choice named (with ``n`` or ``target``) -> when: their retirement,
        #: if one follows, orders their keys by value.
        self.chosen_at: dict[str, float] = {}
        self._sampled = 0.0
        self._adapting = False
        #: The last target rose on disk traffic, or kept the worker such a rise added.
        self._rose = False
        #: Holders of the keys that must stay put, per class, as last read (see
        #: :func:`held_classes`).
        self._holders: dict[Any, Held] = {}
        self._unwrap: Callable[[], None] | None = None

    def configure(self, ruleset: Ruleset, dry_run: DryRun) -> None:
        self.settings = ruleset.adaptive

    def attach(self) -> None:
        ctx = self.ctx
        if not self.supports("adaptive scale-down guard"):
            return
        ctx.add_plugin(self.guard, ScaleDownGuard.name)
        scheduler = ctx.scheduler
        self._unwrap = wrap_methods(
            scheduler,
            {
                "adaptive_target": self._target_ruled(scheduler.adaptive_target),
                "workers_to_close": self._close_ruled(scheduler, scheduler.workers_to_close),
                "retire_workers": self._retire_ruled(scheduler.retire_workers),
            },
            {name: name for name in WRAPPED},
        )

    def detach(self) -> None:
        if self._unwrap is not None:
            self._unwrap()
            self._unwrap = None
        self.ctx.remove_plugin(self.guard)

    # -- the wrappers ------------------------------------------------------------------

    def _target_ruled(self, adaptive_target: Callable[..., int]) -> Callable[..., int]:
        def adaptive_target_ruled(target_duration: Any = None) -> int:
            # Adaptive passes its target duration; a /metrics scrape, the dashboard and
            # the HTTP API ask without one: their choice of workers is a read.
            self._adapting = target_duration is not None
            if self._adapting:
                self.ctx.adapting_at = self.ctx.clock()
            try:
                stock = adaptive_target(target_duration=target_duration)
            finally:
                self._adapting = False
            if not self.ctx.attached:
                return stock
            try:
                return self.answer_target(stock)
            except Exception:  # never break adaptive scaling
                logger.exception("amm-rules: the adaptive target failed; distributed's own")
                return stock

        return adaptive_target_ruled

    def _close_ruled(
        self, scheduler: Any, workers_to_close: Callable[..., list[Any]]
    ) -> Callable[..., list[Any]]:
        def workers_to_close_ruled(
            memory_ratio: Any = None,
            n: Any = None,
            key: Any = None,
            minimum: Any = None,
            target: Any = None,
            attribute: str = "address",
        ) -> list[Any]:
            self.guard.verdict = None
            chosen = workers_to_close(
                memory_ratio=memory_ratio, n=n, key=key, minimum=minimum, target=target
            )
            verdict, self.guard.verdict = self.guard.verdict, None
            if self.ctx.attached and verdict is not None:
                # How many distributed closes: n, or down to target (None: as many as
                # memory_ratio allows, idle workers only).
                count = n if n is not None or target is None else len(scheduler.workers) - target
                wanted = count
                if wanted is None and verdict[1].kept:
                    # A read (adaptive_target's own call): how many distributed alone
                    # would close tells which of the workers kept it wanted.
                    self.guard.bypass = True
                    try:
                        wanted = len(workers_to_close(memory_ratio=memory_ratio, minimum=minimum))
                    finally:
                        self.guard.bypass = False
                adapting = self._adapting or target is not None
                try:
                    chosen = self.chosen(chosen, verdict, count, key, wanted, adapting)
                except Exception:  # never break adaptive scaling
                    logger.exception("amm-rules: the scale-down choice failed")
            workers = scheduler.workers
            return [getattr(workers[a], attribute) for a in chosen if a in workers]

        return workers_to_close_ruled

    def _retire_ruled(self, retire_workers: Callable[..., Any]) -> Callable[..., Any]:
        async def retire_workers_ruled(
            workers: Any = None,
            *,
            names: Any = None,
            close_workers: bool = False,
            remove: bool = True,
            stimulus_id: str | None = None,
            **kwargs: Any,
        ) -> Any:
            # (The keywords of distributed's own, by name: what the feature check of
            # another policy attaching over this wrapper looks for.)
            sent: list[str] = []
            if self.ctx.attached:
                sent = self.retiring(workers, names)
            try:
                result = await retire_workers(
                    workers=workers,
                    names=names,
                    close_workers=close_workers,
                    remove=remove,
                    stimulus_id=stimulus_id,
                    **kwargs,
                )
            finally:
                for address in sent:
                    self.ctx.departures.stay(address, self.name)
            if self.ctx.attached and workers is None and names is None and result:
                self.retiring(list(result), None, started=False)  # it chose them (n=...)
            return result

        return retire_workers_ruled

    # -- up ----------------------------------------------------------------------------

    def answer_target(self, stock: int) -> int:
        """The larger of distributed's target and memory's (see the module docstring);
        the workers' disk metrics are sampled at most every :data:`SAMPLE_EVERY`."""
        settings = self.settings
        ctx = self.ctx
        if settings is None or not settings.memory or not ctx.attached:
            return stock
        if not self.supports("adaptive: memory"):
            return stock
        now = time.monotonic()
        if now - self._sampled >= SAMPLE_EVERY:
            self._sampled = now
            self.meter.sample(now, *disk_totals(ctx.scheduler))
        demand = memory_demand(ctx, self.meter, rose=self._rose)
        found = memory_target(demand, settings.headroom, settings.disk_rate)
        self._rose = DISK in found.rising or found.keeps_rise
        self.target, self.stock, self.target_at = found, stock, time.time()
        if found.workers > stock:
            self.counters["raised"] += 1
        return max(stock, found.workers)

    # -- down --------------------------------------------------------------------------

    def decide(self, candidates: list[Any]) -> tuple[list[str], Hold]:
        """The candidates in the order they should go, and which of them the rules let
        go (the guard's hook)."""
        ctx = self.ctx
        assert ctx.manager is not None
        ctx.placements.include_new_workers(ctx.manager.measure)
        scheduler = ctx.scheduler
        disk_read = self.meter.read_speed() or scheduler.bandwidth
        order = cheapest_first(leaving_costs(ctx, candidates), scheduler.bandwidth, disk_read)
        if self.settings is None:
            # distributed's own order (the fewest bytes first): the guard keeps the
            # workers with the most data, which distributed would close last anyway.
            nbytes = {ws.address: ws.nbytes for ws in candidates}
            order.sort(key=lambda a: (nbytes[a], a))
        workers = slots(ctx)
        minimums = self.settings is not None and self.settings.hold_rules
        if len(self._holders) > len(ctx.index.governed.groups):
            self._holders.clear()  # classes gone
        classes = held_classes(ctx, workers, self._holders)
        return order, hold(workers, classes, order, minimums=minimums)

    def chosen(
        self,
        stock: list[str],
        verdict: tuple[list[str], Hold],
        n: Any,
        key: Any,
        wanted: int | None,
        adapting: bool,
    ) -> list[str]:
        """The workers to close, among those the guard let go: with a ``key``,
        distributed's groups as they are; else as many as distributed closes (``n``; or,
        by ``memory_ratio`` (``n`` None), as many idle workers as it would close without
        the guard: on the workers the guard let go alone, it would count the memory of
        those it kept as leaving too), cheapest first with the section, the fewest bytes
        first without. Records the decision: acted on at once when adaptive scaling
        asked (``adapting``: the guard's hold is then what it decides), else when a
        retirement follows (see the module docstring)."""
        order, decided = verdict
        workers = self.ctx.scheduler.workers
        chosen = list(stock)
        if key is None and (self.settings is not None or n is None):
            idle_only = n is None
            pick = [a for a in decided.allowed if not (idle_only and workers[a].processing)]
            count = len(stock) if n is not None or wanted is None else max(len(stock), wanted)
            chosen = pick[:count]
        kept = [a for a in order if a in decided.kept]
        if wanted is not None:
            kept = kept[: max(0, int(wanted) - len(chosen))]
        now = time.time()
        self.kept = {
            a: (decided.kept[a], self.kept[a][1] if a in self.kept else now) for a in kept
        }
        at = time.monotonic()
        decision = Decision(at, frozenset(chosen), {a: decided.kept[a] for a in kept})
        if n is not None:  # a choice (a read asks by memory ratio): a retirement may follow
            self.chosen_at.update(dict.fromkeys(chosen, at))
        if adapting and decision.kept:
            self._act(decision)
        else:
            self._pending = decision if decision.kept else None
        return chosen

    def retiring(self, workers: Any, names: Any, started: bool = True) -> list[str]:
        """A retirement starts (``started``; or, chosen by itself, ended): a decision it
        follows is acted on, and the workers a decision chose leave with their keys in
        the order of value (with the section). Returns those workers."""
        if names is not None:
            wanted = {str(x) for x in names}
            scheduler = self.ctx.scheduler
            addresses = {a for a, ws in scheduler.workers.items() if str(ws.name) in wanted}
        else:
            addresses = set(workers or ())
        now = time.monotonic()
        sent = []
        if started and self.settings is not None:
            order = ValueOrder(self.ctx)
            for address in sorted(addresses):
                if now - self.chosen_at.get(address, -FOLLOW_SECONDS) <= FOLLOW_SECONDS:
                    departure = Departure(self.name, "scaled down by adaptive", False, order)
                    self.ctx.departures.leave(address, departure)
                    sent.append(address)
        pending = self._pending
        if pending is None:
            return sent
        if now - pending.at > FOLLOW_SECONDS:
            self._pending = None
        elif addresses & pending.passed:
            self._pending = None
            self._act(pending)
        return sent

    def _act(self, decision: Decision) -> None:
        """Count a decision and say what it kept, unless the last one acted on kept the
        same workers for the same reasons."""
        said = frozenset((a, tuple(r)) for a, r in decision.kept.items())
        if said == self._acted:
            return
        self._acted = said
        self.counters["downscaling_kept"] += len(decision.kept)
        ctx = self.ctx
        for address, reasons in decision.kept.items():
            ws = ctx.scheduler.workers.get(address)
            text = kept_sentence(address, reasons)
            logger.info("amm-rules: adaptive scale-down %s", text)
            ctx.events.emit(
                "retirement",
                step="kept",
                worker=address,
                name=str(ws.name) if ws is not None else None,
                why=text,
                reasons=[kept_why(r) for r in reasons],
            )

    # -- status ------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        settings = self.settings
        out: dict[str, Any] = {
            "enabled": settings is not None,
            "settings": None if settings is None else asdict(settings),
            "kept": {
                a: {
                    "why": kept_sentence(a, reasons),
                    "reasons": [kept_why(r) for r in reasons],
                    "since": since,
                }
                for a, (reasons, since) in self.kept.items()
            },
            "totals": dict(self.counters),
        }
        t = self.target
        if t is not None:
            out["target"] = {
                "workers": max(t.workers, self.stock or 0),
                "stock": self.stock,
                "memory": t.workers,
                "needed": t.needed,
                "expected": t.expected,
                "per_worker": t.per_worker,
                "running": t.running,
                "rising": list(t.rising),
                "keeps_rise": t.keeps_rise,
                "disk_rate": t.disk_rate,
                "text": target_sentence(t),
                "at": self.target_at,
            }
        return out

    def metrics(self) -> dict[str, float]:
        """The last target's figures (0 until memory was asked: an ``adaptive:``
        section with ``memory: true``, and a call of ``adaptive_target``), the workers
        kept now, and the counters."""
        t = self.target
        return {
            "target": float(max(t.workers, self.stock or 0)) if t is not None else 0.0,
            "memory_target": float(t.workers) if t is not None else 0.0,
            "needed_bytes": float(t.needed) if t is not None else 0.0,
            "disk_bytes_per_second": float(self.meter.rate() or 0.0),
            "kept": float(len(self.kept)),
            **self.counter_figures(self.counters),
        }


__all__ = ["AdaptiveSection", "ScaleDownGuard", "disk_totals", "memory_demand"]
