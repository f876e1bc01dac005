"""The engine's context: everything a section may use, in one object.

:class:`EngineContext` is built by :class:`~amm_rules.engine.policy.RulesPolicy` before
its sections, and each section is built with it (:mod:`amm_rules.engine.sections.base`).
It holds the engine's shared state (its attributes say what each is), the rules in force
with their classifier and dry-run, and the scheduler and AMM once attached; and it answers
the questions every feature asks: what the rules want for a key, the planner's views and
settings, how to add and remove a scheduler plugin.

Sections never look each other up: what they must agree on is here, typed (the
:attr:`~EngineContext.ledger`, the :attr:`~EngineContext.claims`, the workers
:meth:`~EngineContext.leaving`).

Neighbours: :mod:`amm_rules.engine.policy` owns it; :mod:`amm_rules.engine.sections.base`
is the contract of what receives it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Mapping
from typing import TYPE_CHECKING, Any

from amm_rules.engine.adapters import TaskFactsAdapter, kept_copies, key_view, worker_status
from amm_rules.engine.decide.classify import Classifier
from amm_rules.engine.decide.plan import PlanSettings
from amm_rules.engine.decide.view import ClusterView, KeyView
from amm_rules.engine.dryrun import DryRun
from amm_rules.engine.early import EarlyCycles
from amm_rules.engine.events import EventLog
from amm_rules.engine.hooks import EngineHooks
from amm_rules.engine.rules_file import RulesFile
from amm_rules.engine.running import AmmRunning
from amm_rules.engine.state.claims import Claims
from amm_rules.engine.state.costs import RecomputeCosts
from amm_rules.engine.state.flow import MemoryFlow
from amm_rules.engine.state.index import KeyIndex
from amm_rules.engine.state.journal import Journal
from amm_rules.engine.state.leaving import RETIRING, Departure, Leaving
from amm_rules.engine.state.ledger import Ledger
from amm_rules.engine.state.placement import Placements
from amm_rules.engine.state.spans import SpanStates
from amm_rules.engine.state.spilled import SpilledKeys
from amm_rules.language.ruleset import Actions, Desired, Ruleset, RuntimeTarget, Target

if TYPE_CHECKING:
    from distributed.active_memory_manager import ActiveMemoryManagerExtension

logger = logging.getLogger(__name__)


class EngineContext:
    """What a section may use (see the module docstring)."""

    #: The rules in force, their classifier and their dry-run parts (see :meth:`install`).
    ruleset: Ruleset
    classifier: Classifier
    dry_run: DryRun
    #: A task as a rule's match sees it (:meth:`Classifier.facts
    #: <amm_rules.engine.decide.classify.Classifier.facts>`).
    facts: Callable[[Any], TaskFactsAdapter]

    def __init__(
        self,
        *,
        inflight_timeout: float | None,
        summary_interval: float,
        early_cycle_delay: float,
        early_cycle_gap: float | None,
        retire_by_rules: bool,
        rules_file: RulesFile | None = None,
    ):
        self._inflight_timeout = inflight_timeout
        #: Whether retiring workers' keys are placed by the rules.
        self.retire_by_rules = bool(retire_by_rules)
        #: The ``amm-rules`` event log.
        self.events = EventLog(summary_interval=summary_interval)
        #: Recent decisions, cycle durations, reloads by result, classification backlog.
        self.journal = Journal()
        #: Pool membership of the workers and where each class of keys may live.
        self.placements = Placements(
            on_pool_error=lambda pool, exc: self.events.rule_error(f"pools.{pool.name}", exc)
        )
        #: Memory flow per task prefix (fed by the index's transition hook).
        self.flow = MemoryFlow()
        #: Whether each span is done (``task.span_done``; the spans section refreshes it).
        self.spans = SpanStates()
        #: Recompute estimates per task group and work at risk per worker (fed likewise).
        self.costs = RecomputeCosts()
        #: What the engine asked of the workers and has not seen land.
        self.ledger = Ledger()
        #: Governed keys and per-key engine state; also the scheduler plugin feeding them.
        self.index = KeyIndex(self.ledger)
        #: Keys a section holds, which the others leave alone.
        self.claims = Claims()
        #: The engine's one scheduler plugin: the parts that hear the scheduler are its
        #: members (:meth:`add_plugin`).
        self.hooks = EngineHooks()
        #: The workers the sections send away (read through :meth:`leaving`).
        self.departures = Leaving()
        #: Which keys each worker holds on disk, as the ``spill`` section's worker plugin
        #: reports them (empty without ``spill:`` in the rules).
        self.spilled = SpilledKeys()
        #: When adaptive scaling last asked the scheduler its target (:attr:`clock`;
        #: recorded by the adaptive section; None: never): ``adaptive:
        #: balance`` rebalances while this is recent.
        self.adapting_at: float | None = None
        self.early = EarlyCycles(early_cycle_delay, early_cycle_gap)
        #: The AMM, once attached (None before and after).
        self.manager: ActiveMemoryManagerExtension | None = None
        #: Whether the AMM runs its cycles periodically, and since when (followed while
        #: the policy is attached; a simulation's never runs).
        self.amm_running = AmmRunning()
        #: Where the rules came from (path, reload, loaded at, reload errors).
        self.rules_file = RulesFile({}, reload=False) if rules_file is None else rules_file
        #: Features off on this scheduler for want of an internal of dask or distributed,
        #: with their words (:mod:`amm_rules.engine.features`; the policy checks at attach).
        self.unsupported: dict[str, str] = {}
        #: The engine's clock (``time.monotonic`` in a scheduler; a simulation's own).
        self.clock: Callable[[], float] = time.monotonic

    def __repr__(self) -> str:
        return (
            f"<EngineContext {len(self.index)} governed, {len(self.ledger)} copies in flight, "
            f"{len(self.claims)} keys held>"
        )

    # ------------------------------------------------------------------ attach

    @property
    def attached(self) -> bool:
        """Whether the policy is attached to an AMM (and so to a scheduler)."""
        return self.manager is not None

    @property
    def scheduler(self) -> Any:
        """The scheduler, valid once attached (``AttributeError`` before and after)."""
        return self.amm.scheduler

    def settle(self, now: float) -> None:
        """Bring the ledger and the claims to ``now``, the cycle's planning time (see
        :meth:`Ledger.expire <amm_rules.engine.state.ledger.Ledger.expire>`)."""
        self.claims.expire(now)
        scheduler = self.scheduler
        tasks = scheduler.tasks
        workers = scheduler.workers

        def holders(key: Hashable) -> set[str] | None:
            ts = tasks.get(key)
            if ts is None or ts.state != "memory":
                return None
            return {ws.address for ws in ts.who_has or ()}

        def staying(address: str) -> bool:
            ws = workers.get(address)
            return ws is not None and worker_status(ws) != "closing"

        self.ledger.expire(now, self.inflight_timeout, holders, staying, self.last_seen)

    def last_seen(self, address: str) -> float | None:
        """The scheduler's time of the last heartbeat of a worker (None: unknown)."""
        return getattr(self.scheduler.workers.get(address), "last_seen", None)

    @property
    def amm(self) -> ActiveMemoryManagerExtension:
        """The AMM, valid once attached (``AttributeError`` before and after)."""
        if self.manager is None:
            raise AttributeError("the rules engine is not attached to an Active Memory Manager")
        return self.manager

    def leaving(self) -> dict[str, Departure]:
        """The workers on their way out, and why: those the sections send away (drains,
        the paused-workers section) and those the scheduler retires or closes (their
        status, which the index follows: no scan of the workers)."""
        out = dict(self.departures.workers)
        for address in self.index.closing:
            out.setdefault(address, RETIRING)
        return out

    def add_plugin(self, plugin: Any, name: str) -> None:
        """Let ``plugin`` (any object with some of ``SchedulerPlugin``'s hooks) hear the
        scheduler, as a member of the engine's one scheduler plugin (:attr:`hooks`),
        which joins the scheduler's plugins with its first member."""
        hooks = self.hooks
        hooks.add(plugin, name)
        scheduler = self.scheduler
        if all(p is not hooks for p in scheduler.plugins.values()):
            scheduler.add_plugin(hooks, name=f"amm-rules-{id(hooks)}", idempotent=True)

    def plug(self, plugin: Any, name: str, wanted: bool) -> None:
        """Make ``plugin`` a member of the engine's scheduler plugin (:meth:`add_plugin`)
        while ``wanted`` (a section's part that hears the scheduler only while the rules
        have the section: the scheduler calls its plugins on every transition), and
        remove it when not; nothing before attach."""
        if not self.attached:
            return
        plugged = plugin in self.hooks
        if wanted and not plugged:
            self.add_plugin(plugin, name)
        elif not wanted and plugged:
            self.remove_plugin(plugin)

    def remove_plugin(self, plugin: Any) -> None:
        """Stop ``plugin`` hearing the scheduler (nothing if it does not); the engine's
        plugin leaves the scheduler's with its last member."""
        hooks = self.hooks
        hooks.remove(plugin)
        if len(hooks) or self.manager is None:
            return
        scheduler = self.manager.scheduler
        for name, added in list(scheduler.plugins.items()):
            if added is hooks:
                scheduler.remove_plugin(name=name)

    # ------------------------------------------------------------------ the rules

    @property
    def source(self) -> str:
        """Where the rules in force came from: the rules file's path, else the ruleset's
        own source (inline rules, a compiled ruleset)."""
        path = self.rules_file.path
        return path if path is not None else self.ruleset.source

    def install(self, ruleset: Ruleset) -> None:
        """Make ``ruleset`` the rules in force: its classifier, demand and placements."""
        self.ruleset = ruleset
        events = self.events
        index = self.index
        self.classifier = Classifier(
            ruleset,
            on_rule_error=lambda rule, exc: events.rule_error(rule.name, exc),
            on_invalid_annotation=events.invalid_annotation,
            reads=index.demand.reads,
            flow=self.flow.published,
            spans=self.spans,
            costs=self.costs.published,
        )
        self.facts = self.classifier.facts
        index.demand.configure(
            ruleset.demand,
            ruleset.reads_demand,
            lambda exc: events.rule_error("demand.match", exc),
            self.facts,
        )
        self.placements.configure(ruleset)
        index.note_workers_changed()
        #: What of the rules is in dry-run (``enforcement: dry-run``): planned and
        #: reported, its suggestions held back (see amm_rules.engine.dryrun).
        self.dry_run = DryRun(ruleset)

    def resolve(self, ts: Any) -> Desired:
        """What the rules, the key's annotation and its runtime target want for a key."""
        return self.classifier.resolve(ts, self.index.runtime.get(ts.key))

    def set_runtime_target(
        self,
        key: Hashable,
        target: Target | None,
        origin: str = "runtime",
        actions: Actions | None = None,
    ) -> None:
        """Set (None, without ``actions``: remove) a lasting replication target, and
        other action fields, on a key in memory or still to compute; it takes effect
        when the key is classified (again), at the next cycle. ``origin`` (one of
        :data:`~amm_rules.language.ruleset.RUNTIME_ORIGINS`) is what explanations and
        counters name as its source. The index forgets it when the key leaves memory
        or, never computed, is forgotten."""
        runtime = (
            None if target is None and actions is None else RuntimeTarget(target, origin, actions)
        )
        self.index.set_runtime_target(key, runtime)

    # ------------------------------------------------------------------ the planner

    @property
    def inflight_timeout(self) -> float:
        """Seconds a requested copy counts as in flight before it is given up (and its
        worker avoided for as long again). Default: ``max(3 * AMM interval, 10)``."""
        if self._inflight_timeout is not None:
            return float(self._inflight_timeout)
        interval = self.manager.interval if self.manager is not None else 2.0
        return max(3.0 * interval, 10.0)

    def settings(self, now: float) -> PlanSettings:
        """The planner's settings at ``now``."""
        return PlanSettings(
            now=now,
            inflight_timeout=self.inflight_timeout,
            reduce_replicas=self.ruleset.reduce_replicas,
        )

    def cluster_view(self) -> ClusterView:
        """The planner's view of the workers. Memory is the AMM's tally during a cycle
        (downstream of what other policies had accepted), else measured afresh."""
        manager = self.manager
        assert manager is not None
        memory = getattr(manager, "workers_memory", None)
        if memory is None:
            memory = {
                ws: getattr(ws.memory, manager.measure) for ws in self.scheduler.workers.values()
            }
        return self.placements.cluster_view(memory)

    def key_view(
        self,
        ts: Any,
        desired: Any,
        pending: Mapping[Any, Any] | None = None,
        now: float | None = None,
    ) -> KeyView:
        """The planner's view of one scheduler task, with the engine's copies in flight
        and back-offs for it, and the copies the demand hold keeps at ``now`` (see
        :func:`amm_rules.engine.adapters.key_view`)."""
        key = ts.key
        index = self.index
        held = (
            index.demand.held_copies(ts, self.clock() if now is None else now)
            if desired.replicate is None
            else frozenset()
        )
        claims = self.claims.held
        if desired.replicate is None and claims and key in claims:
            kept = self.claims.keeps(key)
            if kept:
                held = held | kept_copies(ts.who_has or (), kept, self.departures.workers)
        ledger = self.ledger
        inflight = ledger.copies.get(key)
        drops = ledger.drops.get(key) if ledger.drops else None
        return key_view(
            ts,
            desired,
            {a: c.deadline for a, c in inflight.items()} if inflight else {},
            ledger.backing_off(key),
            pending,
            held,
            ledger.just_landed(key),
            {a: f"dropped by {d.by}: {d.why}" for a, d in drops.items()} if drops else None,
        )

    def refresh_pools(self) -> None:
        """Bring pool membership up to date between two cycles, for a client call that
        places copies now (workers may have joined since the last cycle). The next
        cycle still checks every governed key if the workers had changed."""
        assert self.manager is not None
        if self.placements.refresh(self.manager.measure, self.index.workers_changed):
            self.index.note_workers_changed()
