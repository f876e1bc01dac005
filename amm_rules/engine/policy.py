"""``RulesPolicy``: the rules engine as a policy of distributed's Active Memory Manager.

Each AMM cycle (every 2 s by default, on the scheduler's event loop) the policy:

1. reloads the rules file if it changed on disk (:meth:`RulesPolicy._maybe_reload`);
2. recomputes pool membership if workers joined, left or changed status (or every
   cycle, if a pool reads worker memory);
3. classifies the keys that entered memory since the last cycle
   (:class:`~amm_rules.engine.classify.Classifier`), filing governed ones in the
   :class:`~amm_rules.engine.index.KeyIndex`;
4. checks every governed key with one cheap comparison, and plans the few that fail
   it, or have copies in flight, with :func:`amm_rules.engine.planner.plan_key`;
5. yields a ``Suggestion`` per planned action, with the chosen worker as the only
   candidate, and remembers the copies the AMM accepted (with a deadline);
6. copies the keys of workers paused for too long away, then restarts or retires them,
   if the rules have a ``paused-workers`` section
   (:class:`~amm_rules.engine.paused.PausedWorkers`); rebalances, if the rules have a
   ``rebalance`` section or moves are still in flight
   (:class:`~amm_rules.engine.rebalance.rebalancer.Rebalancer`); keys mid-move are not trimmed;
7. applies the stock ReduceReplicas arithmetic to replicated keys nobody governs (if
   the ruleset's ``reduce-replicas`` is on), sparing copies the ``demand:`` hold keeps;
8. counts per rule what was done, for ``amm_rules_status`` and the ``cycle`` event.

Neighbours: :mod:`amm_rules.engine.planner` decides, :mod:`amm_rules.engine.view` adapts scheduler
objects, :mod:`amm_rules.engine.index` tracks keys, :mod:`amm_rules.engine.events` writes events,
:mod:`amm_rules.engine.handlers` answers clients, :mod:`amm_rules.engine.retire` makes
``retire_workers`` place keys by the rules, :mod:`amm_rules.engine.legacy` turns
distributed's ``replicate`` and ``scatter(broadcast=...)`` into runtime targets,
:mod:`amm_rules.engine.demand` follows reads. This module only wires them to the AMM.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Generator, Hashable, Iterable, Mapping
from typing import Any

from distributed.active_memory_manager import (
    ActiveMemoryManagerExtension,
    ActiveMemoryManagerPolicy,
    ReduceReplicas,
    Suggestion,
)

from amm_rules.engine import key_logger, observers
from amm_rules.engine.adapters import bounded_repr, key_view
from amm_rules.engine.audit import Auditor
from amm_rules.engine.budget import ClassifyBudget
from amm_rules.engine.classify import Classifier
from amm_rules.engine.dryrun import HELD_BACK, DryRun, dry_run_counts
from amm_rules.engine.early import EarlyCycles
from amm_rules.engine.events import COUNTERS, EventLog
from amm_rules.engine.flow import MemoryFlow
from amm_rules.engine.index import KeyIndex, PlanClass, watch_scheduler
from amm_rules.engine.journal import Journal, shortfall
from amm_rules.engine.legacy import LegacyCalls
from amm_rules.engine.paused import PausedWorkers
from amm_rules.engine.placement import Placements
from amm_rules.engine.planner import (
    PlanSettings,
    plan_key,
)
from amm_rules.engine.pressure import MemoryPressure
from amm_rules.engine.rebalance.rebalancer import Rebalancer
from amm_rules.engine.reduce_replicas import reduce_replicas
from amm_rules.engine.retire import Retirements
from amm_rules.engine.rules_file import ReloadFailed, RulesFile
from amm_rules.engine.view import ClusterView, KeyView
from amm_rules.engine.worker_watch import holds_governed, watch_workers
from amm_rules.language.ruleset import Desired, Pool, Rule, Ruleset, RuntimeTarget, Target

# Terse, also at DEBUG level. The per-key logger is amm_rules.engine.key_logger.
logger = logging.getLogger(__name__)

#: Longest text taken from a client's value into an event or a log line.
CLIP = 300


def _clip(text: str, limit: int = CLIP) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


class RulesPolicy(ActiveMemoryManagerPolicy):
    """Hold the replication targets, pools, spread and exclusions of a rules file.

    Parameters
    ----------
    rules:
        A path to a rules file, the rules as an inline mapping, or a compiled
        :class:`~amm_rules.language.ruleset.Ruleset`. Loaded here, so that a scheduler
        configured with an invalid file fails to start with the diagnostics.
    reload:
        Reload a rules *file* when it changes on disk (checked once per cycle).
    inflight_timeout:
        Seconds a requested copy counts as in flight before it is given up (and its
        worker avoided for as long again). Default: ``max(3 * AMM interval, 10)``.
    summary_interval:
        Minimum seconds between two ``cycle`` events.
    classify_seconds, classify_keys:
        The classification budget of one cycle: at most this many keys (None: no
        limit) resolved, and a cycle that classifies keys takes about this many seconds
        in all (None: no limit): the classification stops early enough for the cycle
        to file, check and plan what it classified within the budget too. Keys
        left over are classified in the next cycles, and until then are neither planned
        nor trimmed by reduce-replicas. Attaching to a scheduler that already holds a
        million keys thus costs a few cycles of ``classify_seconds`` each instead of
        one cycle of seconds on the event loop.
    early_cycle_delay, early_cycle_gap:
        Early cycles (see :mod:`amm_rules.engine.early`): when a worker leaves or
        starts retiring, a worker joins or resumes after a pause (if the rules rebalance
        or a target is unmet), a worker's pools change at run time, a governed key falls
        below its target, or a move's copy lands (see docs/policy.md), the
        policy asks the AMM for a cycle ``early_cycle_delay`` seconds later (debounce)
        rather than at its next tick, at least ``early_cycle_gap`` seconds after the
        start of the previous cycle (None: no early cycles), and at least nine times
        the last cycle's duration after its end. Only while the AMM runs periodically.
    audit_interval:
        Seconds between the starts of two audit sweeps (None: never). The engine learns
        of changes through scheduler hooks; the audit is the safety net behind them
        (see :mod:`amm_rules.engine.audit`): a sweep checks every governed key and every key
        the scheduler lists as replicated, 1,000 of each per cycle, and repairs what
        the hooks missed. A sweep that found something is reported as an ``audit``
        event and a warning.
    retire_by_rules:
        Place the keys of retiring workers (``retire_workers``, adaptive scale-down) by
        the rules (see :mod:`amm_rules.engine.retire`). False leaves distributed's own
        ``RetireWorker`` alone: each key goes to the running worker with the least
        memory, and the rules move it afterwards.
    """

    #: The rules in force.
    ruleset: Ruleset
    #: Where the rules came from (path, reload, loaded at, reload errors).
    rules_file: RulesFile
    #: Pool membership of the workers and where each class of keys may live.
    placements: Placements
    #: Governed keys and per-key engine state; also the scheduler plugin feeding them.
    index: KeyIndex
    #: The ``amm-rules`` event log.
    events: EventLog
    #: Counters of the last cycle: label -> {governed, requested, dropped, unmet}.
    last_cycle: dict[str, dict[str, int]]
    #: Copies requested and dropped since the policy started: label -> counts.
    totals: dict[str, Counter[str]]
    #: Number of cycles run, and the duration of the last one in seconds.
    cycles: int
    last_cycle_seconds: float
    #: The classification budget of a cycle (see the parameters).
    classify_seconds: float | None
    classify_keys: int | None
    #: The audit sweeps (see the parameters): ``auditor.last`` is what the last found.
    auditor: Auditor
    #: The ``paused-workers:`` section at work (see :mod:`amm_rules.engine.paused`).
    paused: PausedWorkers
    #: Retirements placed by the rules (see :mod:`amm_rules.engine.retire`).
    retirements: Retirements
    #: Whether retiring workers' keys are placed by the rules (see the parameters).
    retire_by_rules: bool
    #: Recent decisions, cycle durations, reloads by result, classification backlog,
    #: and which keys the last plans left short (read by :mod:`amm_rules.observe`).
    journal: Journal
    #: Early AMM cycles (see the parameters): counts and the last ones in ``status()``.
    early: EarlyCycles
    #: Memory flow per task prefix (see :mod:`amm_rules.engine.flow`).
    flow: MemoryFlow
    #: The ``memory-pressure:`` section at work (see :mod:`amm_rules.engine.pressure`).
    pressure: MemoryPressure

    def __init__(
        self,
        rules: str | os.PathLike[str] | Mapping[str, Any] | Ruleset,
        *,
        reload: bool = True,
        inflight_timeout: float | None = None,
        summary_interval: float = 10.0,
        classify_seconds: float | None = 0.1,
        classify_keys: int | None = None,
        audit_interval: float | None = 60.0,
        retire_by_rules: bool = True,
        early_cycle_delay: float = 0.02,
        early_cycle_gap: float | None = 0.1,
    ):
        self.rules_file = RulesFile(rules, reload)
        ruleset = self.rules_file.load(rules)  # a RulesError here fails the scheduler start
        self._inflight_timeout = inflight_timeout
        self.index = KeyIndex()
        self.events = EventLog(summary_interval=summary_interval)
        self.last_cycle = {}
        self.totals = defaultdict(Counter)
        self.cycles = 0
        self.last_cycle_seconds = 0.0
        self.classify_seconds = None if classify_seconds is None else float(classify_seconds)
        self.classify_keys = None if classify_keys is None else max(1, int(classify_keys))
        #: How much of the cycle the classification loop may take (see ClassifyBudget).
        self.classify_budget = ClassifyBudget()
        self._cycle_start = time.perf_counter()
        self.auditor = Auditor(None if audit_interval is None else float(audit_interval))
        self.journal = Journal()
        self.early = EarlyCycles(early_cycle_delay, early_cycle_gap)
        self._manager: ActiveMemoryManagerExtension | None = None
        #: Undoes the wrappers of the scheduler's replica methods (see detach).
        self._unwatch: Callable[[], None] | None = None
        self._unwatch_workers: Callable[[], None] | None = None
        #: The ``rebalance:`` section at work; kept across reloads (moves in flight).
        self.rebalancer = Rebalancer()
        self.rebalancer.reads = self.index.demand.reads
        self.placements = Placements(on_pool_error=self._pool_error)
        self.paused = PausedWorkers()
        self.retirements = Retirements()
        self.retire_by_rules = bool(retire_by_rules)
        #: distributed's replicate and scatter(broadcast=...), honoured as targets.
        self.legacy = LegacyCalls(self)
        self._unlegacy: Callable[[], None] | None = None
        self.flow = MemoryFlow()
        self.rebalancer.flow = self.flow.published
        self.pressure = MemoryPressure(self.flow)
        self._install(ruleset)

    # ------------------------------------------------------------------ attach

    @property  # type: ignore[override]
    def manager(self) -> ActiveMemoryManagerExtension:
        if self._manager is None:
            raise AttributeError("RulesPolicy is not attached to an Active Memory Manager")
        return self._manager

    @manager.setter
    def manager(self, manager: ActiveMemoryManagerExtension) -> None:
        # The AMM sets this in add_policy, right after __init__: attaching here (rather
        # than at the first cycle) registers the handlers as soon as the scheduler
        # exists, so clients can set targets before the first cycle.
        self._manager = manager
        self._attach()

    @property
    def scheduler(self) -> Any:
        return self.manager.scheduler

    def _attach(self) -> None:
        from amm_rules.engine.handlers import register

        scheduler = self.scheduler
        self.events.scheduler = scheduler
        self.index.demand.tasks = scheduler.tasks
        scheduler.add_plugin(self.index, name=f"amm-rules-{id(self)}", idempotent=True)
        self._unwatch = watch_scheduler(scheduler, self.index)
        self._unwatch_workers = watch_workers(scheduler, self.worker_changed)
        self._unlegacy = self.legacy.install(scheduler)
        self.placements.attach(scheduler.workers)
        register(scheduler, self)
        observers.attached(scheduler, self)
        # The one allowed scan of scheduler.tasks: keys already in memory when attached.
        self.index.tasks = scheduler.tasks
        self.index.dirty.update(
            (k, ts) for k, ts in scheduler.tasks.items() if ts.state == "memory"
        )
        # Keys with several copies already: reduce-replicas' walk if no rule governs them.
        self.index.touched.update(ts.key for ts in scheduler.replicated_tasks)
        self.index.workers_changed = True
        self.auditor.start_in(time.monotonic())
        self.early.attach(self.manager)
        self.index.wake = self._wake
        self._remove_reduce_replicas()
        self.paused.attach(self)
        if self.retire_by_rules:
            self.retirements.attach(self)
        self._attach_flow()
        self.pressure.attach(self)

    def detach(self) -> None:
        """Stop listening to the scheduler (plugin, replica wrappers, handlers) and leave
        the manager. The policy can not be attached again."""
        manager = self._manager
        if manager is None:
            return
        from amm_rules.engine.handlers import unregister

        scheduler = manager.scheduler
        self.index.active = False
        self.early.close()
        for undo in (self._unwatch, self._unwatch_workers, self._unlegacy):
            if undo is not None:
                undo()
        self._unwatch = self._unwatch_workers = self._unlegacy = None
        for name, plugin in list(scheduler.plugins.items()):
            if plugin is self.index:
                scheduler.remove_plugin(name=name)
        unregister(scheduler, self)
        self.index.flow = None
        self.index.on_scatter = None
        self.pressure.detach()
        self.paused.detach()
        self.retirements.detach()
        observers.detached(scheduler, self)
        manager.policies.discard(self)
        self._manager = None

    def _remove_reduce_replicas(self) -> None:
        manager = self._manager
        if manager is None:
            return
        for policy in list(manager.policies):
            if type(policy) is ReduceReplicas:
                manager.policies.discard(policy)
                why = (
                    "amm-rules removed the stock ReduceReplicas policy from the Active "
                    "Memory Manager: it drops every extra copy each cycle and would undo "
                    "every replication target. RulesPolicy applies the same reduction to "
                    "keys no rule governs (reduce-replicas in the rules file)."
                )
                logger.warning(why)
                self.events.emit("reduce-replicas-removed", reason=why)

    @property
    def inflight_timeout(self) -> float:
        """Seconds a requested copy counts as in flight (see the class docstring)."""
        if self._inflight_timeout is not None:
            return float(self._inflight_timeout)
        interval = self._manager.interval if self._manager is not None else 2.0
        return max(3.0 * interval, 10.0)

    @property
    def path(self) -> str | None:
        """The rules file's path, if the rules came from a file, else None."""
        return self.rules_file.path

    @property
    def reload(self) -> bool:
        """Whether a changed rules file is reloaded."""
        return self.rules_file.reload

    @property
    def loaded_at(self) -> float:
        """Wall-clock time (seconds since the epoch) when the rules in force were loaded."""
        return self.rules_file.loaded_at

    @property
    def reload_errors(self) -> list[dict[str, Any]]:
        """The recent reload errors, newest last: ``{"time", "error"}``."""
        return self.rules_file.errors

    def __repr__(self) -> str:
        source = self.path if self.path is not None else self.ruleset.source
        return (
            f"RulesPolicy(rules={source!r}, {len(self.ruleset.rules)} rules, "
            f"{len(self.ruleset.pools)} pools)"
        )

    # ------------------------------------------------------------------ rules

    def _install(self, ruleset: Ruleset) -> None:
        self.ruleset = ruleset
        self.rules_file.installed()
        self.classifier = Classifier(
            ruleset,
            on_rule_error=self._rule_error,
            on_invalid_annotation=self._invalid_annotation,
            reads=self.index.demand.reads,
            flow=self.flow.published,
        )
        self.index.demand.configure(ruleset.demand, ruleset.reads_demand, self._demand_match_error)
        if ruleset.legacy_replicate == "ignore":
            self.legacy.forget_targets()
        self.placements.configure(ruleset)
        self.index.workers_changed = True
        self.rebalancer.configure(ruleset.rebalance, self._rebalance_match_error)
        #: What of the rules is in dry-run (``enforcement: dry-run``): planned and
        #: reported, its suggestions held back (see amm_rules.engine.dryrun).
        self.dry_run = DryRun(ruleset)
        self.paused.configure(self.dry_run.paused_settings(ruleset.paused_workers))
        self.pressure.configure(ruleset.memory_pressure)

    def _maybe_reload(self) -> None:
        """Reload the rules file if it changed; keep the running rules if the new file
        cannot be used (reported once per distinct file state and error)."""
        outcome = self.rules_file.poll()
        if outcome is None:
            return
        self.journal.reloads["error" if isinstance(outcome, ReloadFailed) else "ok"] += 1
        if isinstance(outcome, ReloadFailed):
            logger.error(
                "amm-rules: cannot reload %s; keeping the running rules:\n%s",
                self.path,
                outcome.error,
            )
            self.events.once(
                ("reload-error", outcome.signature, outcome.error),
                "reload-error",
                source=self.path,
                error=outcome.error,
            )
            return
        self._install(outcome)
        # Re-classify every key in memory: a new rule may govern keys that were not
        # indexed. This is the one pass over scheduler.tasks a reload costs.
        in_memory = [ts for ts in self.scheduler.tasks.values() if ts.state == "memory"]
        self.index.reclassify(ts.key for ts in in_memory)
        self._track_flow_keys(in_memory)
        logger.info("amm-rules: reloaded %s", self)
        self.events.emit(
            "reload", source=self.path, rules=len(outcome.rules), pools=len(outcome.pools)
        )

    def _rule_error(self, rule: Rule, exc: Exception) -> None:
        self.events.once(("rule-error", rule.name), "rule-error", rule=rule.name, error=repr(exc))

    def _invalid_annotation(
        self, value: Any, exc: Exception, key: Hashable, name: str = "amm"
    ) -> None:
        # The value comes from a client and may be megabytes, or a few bytes standing
        # for millions of shared values: the log line, the event (kept in the
        # scheduler's memory) and the rate-limit token get a bounded repr.
        # ``name`` is the annotation: ``amm``, or ``replicate`` (its shorthand).
        shown, error = bounded_repr(value, CLIP), _clip(str(exc))
        if self.events.once(
            ("invalid-annotation", name, shown),
            "invalid-annotation",
            name=name,
            annotation=shown,
            error=error,
            example_key=_clip(str(key)),
        ):
            logger.warning("amm-rules: ignoring invalid %s annotation %s: %s", name, shown, error)

    def _rebalance_match_error(self, exc: Exception) -> None:
        self.events.once(
            ("rule-error", "rebalance.match"),
            "rule-error",
            rule="rebalance.match",
            error=repr(exc),
        )

    def _demand_match_error(self, exc: Exception) -> None:
        self.events.once(
            ("rule-error", "demand.match"), "rule-error", rule="demand.match", error=repr(exc)
        )

    def _pool_error(self, pool: Pool, exc: Exception) -> None:
        self.events.once(
            ("pool-error", pool.name), "rule-error", rule=f"pools.{pool.name}", error=repr(exc)
        )

    # ------------------------------------------------------------------ memory flow

    def _attach_flow(self) -> None:
        scheduler = self.scheduler
        self.flow.tasks = scheduler.tasks
        # Fed by the index's transition hook (one plugin call per transition, not two).
        self.index.flow = self.flow
        self.index.on_scatter = self.flow.scattered
        if self.ruleset.reads_flow:
            self._track_flow_keys([ts for ts in scheduler.tasks.values() if ts.state == "memory"])

    def _track_flow_keys(self, in_memory: list[Any]) -> None:
        """Keep (or stop keeping) the keys in memory per prefix, as the rules in force
        read flow attributes or not; ``in_memory``: the tasks in memory now."""
        if self.ruleset.reads_flow:
            self.flow.start_tracking(in_memory)
        elif self.flow.track_keys:
            self.flow.stop_tracking()

    def _publish_flow(self) -> None:
        """Publish the flow figures that moved; while rules read them, classify again
        the keys in memory of the prefixes whose figures changed (within the cycle's
        classification budget, like every key that needs classifying)."""
        republished = self.flow.publish()
        if republished and self.flow.track_keys:
            for prefix in republished:
                self.index.reclassify(self.flow.keys_of(prefix))

    # ------------------------------------------------------------------ workers

    def _refresh_workers(self) -> bool:
        """Recompute pools and placements if workers joined, left or changed status (or
        every cycle, if a pool reads worker memory). True if they were recomputed: then
        every governed key is checked this cycle."""
        changed = self.index.workers_changed
        self.index.workers_changed = False
        return self.placements.refresh(self.manager.measure, changed)

    def refresh_pools(self) -> None:
        """Bring pool membership up to date between two cycles, for a client call that
        places copies now (workers may have joined since the last cycle). The next
        cycle still checks every governed key if the workers had changed."""
        if self.placements.refresh(self.manager.measure, self.index.workers_changed):
            self.index.workers_changed = True

    def cluster_view(self) -> ClusterView:
        """The planner's view of the workers. Memory is the AMM's tally during a cycle
        (downstream of what other policies had accepted), else measured afresh."""
        manager = self.manager
        memory = getattr(manager, "workers_memory", None)
        if memory is None:
            memory = {
                ws: getattr(ws.memory, manager.measure) for ws in self.scheduler.workers.values()
            }
        return self.placements.cluster_view(memory)

    # ------------------------------------------------------------------ the cycle

    def run(self) -> Generator[Suggestion, Any, None]:
        """One AMM cycle. Never raises: a failure is logged as an ``error`` event and the
        rest of the cycle is skipped, so the other policies still run."""
        start = self._cycle_start = time.perf_counter()
        # The AMM measured every worker for this cycle: kept for status reports.
        self.journal.worker_memory = getattr(self._manager, "workers_memory", {})
        self.early.cycle_started()
        try:
            stats = yield from self._plan()
            if self.ruleset.reduce_replicas:
                # Delegated from here, not from _plan: every suggestion passes through
                # each generator between the AMM and the one yielding it, and this one
                # yields a drop per excess copy (120,000 per cycle at a million keys).
                yield from reduce_replicas(
                    self.index,
                    self.manager.pending,
                    self.rebalancer.moving,
                    stats,
                    time.monotonic(),
                )
            self._count(stats)
        except Exception as exc:
            logger.exception("amm-rules: cycle failed; skipped")
            self.events.once(("error", repr(exc)), "error", error=repr(exc))
        finally:
            self.cycles += 1
            end = time.perf_counter()
            self.last_cycle_seconds = end - start
            self.classify_budget.cycle_ended(end)
            self.journal.cycle(self.last_cycle_seconds)
            self.early.cycle_ended()

    def _wake(self, reason: str) -> None:
        """From the index's hooks: something happened that an early cycle should repair.
        A worker joining or resuming matters only to rebalancing and unmet targets."""
        if reason in ("worker-joined", "worker-resumed") and not self._room_helps():
            return
        self.early.request(reason)

    def _room_helps(self) -> bool:
        """Whether a worker that can take copies now may change what a cycle does: the
        rules rebalance, or some target was left unmet by the last cycle."""
        return self.ruleset.rebalance.enabled or any(
            counts["unmet"] for counts in self.last_cycle.values()
        )

    def worker_changed(self, address: str, what: str) -> None:
        """From :mod:`amm_rules.engine.worker_watch`: a worker's resources changed
        (``what="resources"``) or it sent a heartbeat (``"memory"``). If its pools
        changed, they are all recomputed and every governed key checked at the next
        cycle, which is asked for early if a key may now be outside its pool (the worker
        holds a governed key) or a copy may now find a place (an unmet target, or
        rebalancing)."""
        if self._manager is None or (what == "memory" and not self.placements.volatile):
            return
        try:
            if not self.placements.reevaluate(address, self.manager.measure):
                return
            self.index.workers_changed = True
            ws = self.scheduler.workers.get(address)
            if self._room_helps() or (ws is not None and holds_governed(ws, self.index.desired)):
                self.early.request("worker-pools-changed")
        except Exception as exc:  # a scheduler handler must not fail because of us
            logger.exception("amm-rules: re-evaluating the pools of %s failed", address)
            self.events.once(("error", repr(exc)), "error", error=repr(exc))

    def _plan(self) -> Generator[Suggestion, Any, dict[str, Counter[str]]]:
        """The cycle up to reduce-replicas: rules, classification, audit, replication
        planning, rebalancing. Returns the cycle's counters so far."""
        self._remove_reduce_replicas()
        self._maybe_reload()
        full = self._refresh_workers()
        self._audit_step()  # after the placements are fresh, before classification
        self._publish_flow()
        self.pressure.ensure_running()
        filed = self._classify_dirty(full)
        self._absorb_touched()
        self._give_up_orphaned_copies()

        now = time.monotonic()
        stats: dict[str, Counter[str]] = defaultdict(Counter)
        for label, n in self.index.governed_by.items():
            stats[label]["governed"] = n

        todo = self._suspects(stats, full, filed)
        if todo:
            yield from self.dry_run.replication(
                self._plan_and_suggest(todo, now, stats), self.index.desired, stats
            )
        # Paused workers: after replication planning (its copies count), before
        # rebalancing (which then sees the loads they add).
        yield from self.paused.run(now, stats)

        if not self.rebalancer.idle:
            # After replication planning, so that its copies count in the loads and its
            # keys stay put; before reduce-replicas, which must spare keys mid-move.
            moves = self.rebalancer.run(
                self.scheduler,
                self.manager,
                now=now,
                desired=self.index.desired,
                inflight=self.index.inflight,
                cluster=self.cluster_view,
                stats=stats,
                adopt=self._adopt_copy,
            )
            # Held back by dry-run before the journal: it records what the AMM was asked.
            moves = self.dry_run.rebalancing(moves, self.index.desired, stats)
            yield from self.journal.rebalancing(moves, self.rebalancer.book.pending)

        return stats

    def _adopt_copy(self, key: Hashable, worker: str) -> None:
        """A move given up after its copy landed on ``worker`` (the key's replication
        target came first): the copy is the key's own now, planned next cycle as a copy
        of the engine's that just landed, so that a trim takes it last (no drop from the
        worker a copy was just sent to)."""
        if key in self.index.desired:
            deadline = time.monotonic() + self.inflight_timeout
            self.index.inflight.setdefault(key, {})[worker] = deadline

    def _count(self, stats: dict[str, Counter[str]]) -> None:
        """Keep the cycle's counters (status, totals) and emit its summary event."""
        now = time.monotonic()
        self.last_cycle = {
            label: {**{c: counts[c] for c in COUNTERS}, **dry_run_counts(counts)}
            for label, counts in stats.items()
        }
        for label, c in stats.items():
            self.totals[label]["requested"] += c["requested"]
            self.totals[label]["dropped"] += c["dropped"]
        self.events.summary(self.last_cycle, now, rebalance=self.rebalancer.cycle_summary())

    def _audit_step(self) -> None:
        """This cycle's slice of the audit sweep; report a finished sweep that found
        state the hooks had missed (it has been repaired by then)."""
        index = self.index
        reduce_replicas = self.ruleset.reduce_replicas
        found = self.auditor.step(
            time.monotonic(),
            index,
            self.scheduler,
            resolve=self.resolve,
            suspects=lambda cls, members: index.suspects(
                cls, self.placements.of(cls), reduce_replicas, members
            ),
        )
        if found is not None and any(found.values()):
            logger.warning("amm-rules: the audit found state the hooks missed: %s", found)
            self.events.emit("audit", **found)

    def _classify_dirty(self, full: bool = False) -> dict[PlanClass, list[Any]]:
        """Resolve the keys that entered memory (or got a runtime target) since the last
        cycle, within the cycle's classification budget, and file governed ones in the
        index. Returns the tasks filed that may need action (their suspects, see
        :meth:`KeyIndex.suspects`), by plan class; all of them when ``full`` (every
        governed key is checked in this cycle anyway). The keys not reached wait for
        the next cycles (see :meth:`KeyIndex.classify
        <amm_rules.engine.index.KeyIndex.classify>`), and are neither planned nor
        reduced until then. Keys that are no longer governed join ``index.touched``, so that
        reduce-replicas finds them if they hold several copies."""
        index = self.index
        classifier = self.classifier
        if classifier.replicas_sensitive:
            # A match reading task.replicas can change its mind when copies come and go.
            index.reclassify(index.touched)
        self.journal.backlog = 0
        demand = index.demand
        if demand.touched:
            if classifier.demand_sensitive:
                # A match reading task.waiters or task.reads: dependents came or went.
                tasks = self.scheduler.tasks
                index.reclassify(k for k in demand.touched if k in tasks)
            demand.touched.clear()
        if not index.unclassified:
            return {}
        task_groups = self.scheduler.task_groups
        if classifier.groups_remembered > 2 * len(task_groups) + 1_000:
            classifier.forget_groups(task_groups)
        limit = index.unclassified if self.classify_keys is None else self.classify_keys
        check = None
        if not full:
            reduce_replicas = self.ruleset.reduce_replicas
            placement_of = self.placements.of

            def check(cls: PlanClass, members: list[Any]) -> Iterable[Any]:
                return index.suspects(cls, placement_of(cls), reduce_replicas, members)

        began = time.perf_counter()
        # The budget is the cycle's: the loop stops early enough for the rest of the
        # cycle (filing, checking, planning what it classified) to fit too.
        deadline = (
            None
            if self.classify_seconds is None
            else self.classify_budget.deadline(self._cycle_start, began, self.classify_seconds)
        )
        filed, done = index.classify(classifier, self.scheduler.tasks, limit, deadline, check)
        left = index.unclassified
        if left:
            if deadline is not None and index.loop_ended >= deadline:
                # (Learnt only from loops the deadline stopped, not the key limit.)
                self.classify_budget.stopped(began, index.loop_ended)
            logger.debug("amm-rules: classified %d keys; %d left for the next cycles", done, left)
        self.journal.backlog = left
        return filed

    def _give_up_orphaned_copies(self) -> None:
        """A key that lost a holder with its worker may be on its way to other workers
        from that dead worker, and such a fetch can hang until the comm times out
        (seconds to minutes) while the key is short. Two kinds of recipient:

        - the engine's own copies in flight: forgotten, and their workers passed over
          for a while (half an AMM interval), so that other workers are asked first;
          with no other worker, the same one is asked again later (which refreshes its
          list of holders);
        - workers running a dependent of the key that do not hold it: they are
          fetching it for that task, maybe from the dead worker. Asking one of them
          for a copy would add nothing (the worker keeps its fetch going) and the
          copy would count as in flight, the key short, for the whole in-flight
          timeout. They are passed over for the key for as long as they still fetch
          it (run a dependent without holding it): a fetch from a dead worker can
          outlast the in-flight timeout of the copy asked of another worker instead.

        The dependents are read for keys that lost a holder, and then each cycle only
        for those whose fetches go on."""
        index = self.index
        tasks = self.scheduler.tasks
        until = time.monotonic() + self.manager.interval / 2
        read: set[Hashable] = set()
        for key in index.source_lost:
            entry = index.inflight.pop(key, None)
            if entry:
                _pass_over(index, key, entry, until)
            fetching = _fetching_for_dependents(tasks.get(key))
            read.add(key)
            if fetching:
                index.fetching.setdefault(key, set()).update(fetching)
        index.source_lost.clear()
        for key, workers in list(index.fetching.items()):
            if key not in read:  # (just read above: still fetching)
                workers.intersection_update(_fetching_for_dependents(tasks.get(key)))
            if not workers:
                del index.fetching[key]
                continue
            _pass_over(index, key, workers, until)

    def _absorb_touched(self) -> None:
        """Route keys whose copies changed: governed ones are checked this cycle, the
        others join reduce-replicas' walk if they hold more than one copy."""
        index = self.index
        tasks = self.scheduler.tasks
        touched, index.touched = index.touched, set()
        for key in touched:
            if key in index.desired:
                index.recheck.add(key)
                index.replicated_free.pop(key, None)
                continue
            ts = tasks.get(key)
            if ts is not None and ts.state == "memory" and len(ts.who_has or ()) > 1:
                index.replicated_free[key] = ts

    def _suspects(
        self,
        stats: dict[str, Counter[str]],
        full: bool,
        filed: Mapping[PlanClass, list[Any]],
    ) -> dict[Hashable, Any]:
        """Governed keys that may need action this cycle (see KeyIndex.suspects): all
        of them after workers changed, else only those just filed (``filed``, by plan
        class: the suspects among them, see _classify_dirty), those whose copies
        changed, those with copies in flight and those left to look at again."""
        index = self.index
        reduce_replicas = self.ruleset.reduce_replicas
        for cls, group in index.groups.items():
            if self.placements.class_unmet(cls):
                # Held as far as possible; every key of the class is unmet.
                stats[cls.source]["unmet"] += len(group)
        recheck, index.recheck = index.recheck, set()
        todo: dict[Hashable, Any] = {}
        if full:
            for cls in index.groups:
                for ts in index.suspects(cls, self.placements.of(cls), reduce_replicas):
                    todo[ts.key] = ts
        else:
            for ts in index.suspects_among(recheck, self.placements.of, reduce_replicas):
                todo[ts.key] = ts
            for members in filed.values():  # checked as they were filed
                for ts in members:
                    todo[ts.key] = ts
        tasks = self.scheduler.tasks
        for key in index.inflight:
            ts = tasks.get(key)
            if ts is not None:
                todo[key] = ts
        if index.shortfall:
            # Checked this cycle and not to be planned: they hold their target now.
            checked = index.shortfall.keys() if full else recheck & index.shortfall.keys()
            for key in [k for k in checked if k not in todo]:
                del index.shortfall[key]
        if index.dirty:
            # Left over by the classification budget: what they want is not known yet
            # (a reload or a runtime target may have changed it). Planned once classified.
            # (Keys that entered memory wait in the backlog too, but none of those is
            # governed before its turn.)
            unclassified = index.dirty
            todo = {key: ts for key, ts in todo.items() if key not in unclassified}
        return todo

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
            index.demand.held_copies(ts, time.monotonic() if now is None else now)
            if desired.replicate is None
            else frozenset()
        )
        return key_view(
            ts, desired, index.inflight.get(key, {}), index.backoff.get(key, {}), pending, held
        )

    def resolve(self, ts: Any) -> Desired:
        """What the rules, the key's annotation and its runtime target want for a key."""
        return self.classifier.resolve(ts, self.index.runtime.get(ts.key))

    def set_runtime_target(
        self, key: Hashable, target: Target | None, origin: str = "runtime"
    ) -> None:
        """Set (None: remove) a lasting replication target on a key in memory; it takes
        effect when the key is classified again, at the next cycle. ``origin`` (one of
        :data:`~amm_rules.language.ruleset.RUNTIME_ORIGINS`) is what explanations and
        counters name as its source."""
        if target is None:
            self.index.runtime.pop(key, None)
        else:
            self.index.runtime[key] = RuntimeTarget(target, origin)
        self.index.reclassify((key,))

    def settings(self, now: float) -> PlanSettings:
        timeout = self.inflight_timeout
        return PlanSettings(
            now=now,
            inflight_timeout=timeout,
            backoff=timeout,
            reduce_replicas=self.ruleset.reduce_replicas,
        )

    def _plan_and_suggest(
        self, todo: dict[Hashable, Any], now: float, stats: dict[str, Counter[str]]
    ) -> Generator[Suggestion, Any, None]:
        index = self.index
        cluster = self.cluster_view()
        settings = self.settings(now)
        pending = self.manager.pending
        workers = self.scheduler.workers
        moving = self.rebalancer.moving
        journal = self.journal
        copying = self.legacy.copying
        for key, ts in todo.items():
            desired = index.desired.get(key)
            if desired is None or ts.state != "memory":
                index.inflight.pop(key, None)
                continue
            if key in copying:
                continue  # a replicate or scatter call is copying it: looked at after
            plan = plan_key(self.key_view(ts, desired, pending, now), cluster, settings)
            if plan.unmet and not self.placements.class_unmet(PlanClass.of(desired)):
                stats[plan.source]["unmet"] += 1
            refused = False
            # In dry-run the AMM never sees these suggestions (amm_rules.engine.dryrun).
            held_back = HELD_BACK if self.dry_run.label(desired) is not None else None
            for action in plan.actions:
                ws = workers.get(action.worker)
                if ws is None:  # pragma: no cover - the view was built from these workers
                    continue
                if action.op == "drop" and key in moving:
                    # Mid-move the key holds one extra copy until the move's own drop;
                    # trimming now could drop the new copy and undo the move.
                    plan.deferred.append(f"drop from {action.worker} waits: key mid-move")
                    continue
                choice = yield Suggestion(action.op, ts, {ws})
                accepted = choice is not None
                refused |= not accepted
                journal.decision(
                    key,
                    action.op,
                    action.worker,
                    "accepted" if accepted else held_back or "refused",
                    action.reason,
                    action.source,
                )
                key_logger.debug(
                    "(%s, %s, %s) %s: %s",
                    action.op,
                    key,
                    action.worker,
                    "accepted" if accepted else "refused",
                    action.reason,
                )
                if action.op == "replicate":
                    if accepted:
                        stats[action.source]["requested"] += 1
                    else:
                        plan.inflight.pop(action.worker, None)
                elif accepted:
                    stats[action.source]["dropped"] += 1
            self.index.store_plan(key, plan)
            if plan.misplaced and (plan.deferred or refused):
                index.trim_waits.add(key)  # a dependent finishing wakes a cycle
            else:
                index.trim_waits.discard(key)
            short = self.dry_run.shortfall(desired, plan, shortfall(plan, refused))
            if short is None:
                index.shortfall.pop(key, None)
            else:
                index.shortfall[key] = short
            if (
                refused
                or plan.deferred
                or plan.backoff
                or (desired.replicate is None and len(plan.good) + len(plan.misplaced) > 1)
            ):
                # Nothing else may touch the key before this is worth another look:
                # a refused or deferred action, a back-off ending, copies held for
                # waiters that may finish.
                index.recheck.add(key)


def _pass_over(index: KeyIndex, key: Hashable, workers: Iterable[str], until: float) -> None:
    """Ask none of ``workers`` for a copy of ``key`` before ``until`` (or later, if
    they were passed over for longer already)."""
    backoff = index.backoff.setdefault(key, {})
    for addr in workers:
        backoff[addr] = max(backoff.get(addr, until), until)


def _fetching_for_dependents(ts: Any) -> list[str]:
    """Workers running a task that depends on ``ts`` and not holding it: they fetch it
    (or are about to). Empty for a key gone from memory or without dependents."""
    if ts is None or not ts.waiters:
        return []
    holders = ts.who_has or ()
    return [
        ws.address
        for dts in ts.waiters
        if (ws := dts.processing_on) is not None and ws not in holders
    ]
