"""``RulesPolicy``: the rules engine as a policy of distributed's Active Memory Manager.

Each AMM cycle (every 2 s by default, on the scheduler's event loop) the policy:

1. reloads the rules file if it changed on disk (:meth:`RulesPolicy._maybe_reload`:
   read and checked in a thread, :mod:`amm_rules.engine.rules_file`), and installs the
   new rules in every section;
2. recomputes pool membership if workers joined, left or changed status (or every
   cycle, if a pool reads worker memory): then every governed key is checked;
3. runs the steps of the cycle, in the order written in :mod:`amm_rules.engine.sections`
   (:func:`~amm_rules.engine.sections.steps`), passing on the suggestions each yields;
4. counts per rule what was done, for ``amm_rules_status`` and the ``cycle`` event (to
   which each section adds its part).

What the sections use is in one :class:`~amm_rules.engine.context.EngineContext`; a
section never sees the policy. The policy owns the rules file, the cycle's counters and
the link with the AMM (attach, detach, early cycles); it also shows its sections and the
context's state under their usual names (``policy.index``, ``policy.rebalancer``,
``policy.paused``, ...), for tests, benchmarks and the observers above the engine.

Neighbours: :mod:`amm_rules.engine.sections` (the features),
:mod:`amm_rules.engine.context` (what they share), :mod:`amm_rules.engine.handlers`
(what clients ask).
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import time
from collections import Counter
from collections.abc import Generator, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from distributed.active_memory_manager import (
    ActiveMemoryManagerExtension,
    ActiveMemoryManagerPolicy,
    ReduceReplicas,
    Suggestion,
)

from amm_rules.engine.context import EngineContext
from amm_rules.engine.decide.classify import Classifier
from amm_rules.engine.dryrun import DryRun
from amm_rules.engine.early import EarlyCycles
from amm_rules.engine.events import EventLog
from amm_rules.engine.features import ENGINE, WORKER_WATCH, Need, missing, words
from amm_rules.engine.handlers import Answers, Handlers, register, unregister
from amm_rules.engine.readonly import ReadOnly
from amm_rules.engine.rules_file import ReloadFailed, RulesFile
from amm_rules.engine.sections import OFF_CYCLE, SECTIONS, Cycle, Section, steps
from amm_rules.engine.sections.activity import RuleActivity
from amm_rules.engine.sections.audit import AuditSection
from amm_rules.engine.sections.classification import Classification
from amm_rules.engine.sections.drain import DrainSection
from amm_rules.engine.sections.legacy import LegacyCalls
from amm_rules.engine.sections.memory_pressure import MemoryPressure
from amm_rules.engine.sections.paused_workers import PausedWorkers
from amm_rules.engine.sections.rebalance import RebalanceSection
from amm_rules.engine.sections.replication import Replication
from amm_rules.engine.sections.retirement import Retirements
from amm_rules.engine.startup import check_choice, invalid_at_start, loaded_line
from amm_rules.engine.state.flow import MemoryFlow
from amm_rules.engine.state.index import KeyIndex, watch_scheduler
from amm_rules.engine.state.journal import Journal
from amm_rules.engine.state.placement import Placements
from amm_rules.engine.words import counted
from amm_rules.engine.worker_watch import holds_governed, watch_workers
from amm_rules.language.diagnostics import RulesError
from amm_rules.language.ruleset import Ruleset

# Terse, also at DEBUG level. The per-key logger is amm_rules.engine.key_logger.
logger = logging.getLogger(__name__)

S = TypeVar("S", bound=Section)

#: What observes every policy that attaches, named ``module:attribute``: the fuller
#: status and explain answers, the engine's entry in ``scheduler.extensions`` (cluster
#: dumps) and the Prometheus metrics (:mod:`amm_rules.observe.extension`). Imported by
#: name when a policy first attaches: the engine never imports what watches it
#: (``observe/`` sits above it, and imports it), and importing ``amm_rules`` turns
#: nothing on in a scheduler by itself.
OBSERVERS: tuple[str, ...] = ("amm_rules.observe.extension:OBSERVER",)


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
        Early cycles (see :mod:`amm_rules.engine.early`): when something happened that a
        cycle should repair at once (a worker leaving, a governed key below its target:
        see docs/policy.md), the policy asks the AMM for a cycle ``early_cycle_delay``
        seconds later (debounce) rather than at its next tick, at least
        ``early_cycle_gap`` seconds after the start of the previous cycle (None: no
        early cycles), and at least nine times the last cycle's duration after its end.
        Only while the AMM runs periodically.
    audit_interval:
        Seconds between the starts of two audit sweeps (None: never). The engine learns
        of changes through scheduler hooks; the audit is the safety net behind them
        (see :mod:`amm_rules.engine.sections.audit`): a sweep checks every governed key and every key
        the scheduler lists as replicated, 1,000 of each per cycle, and repairs what
        the hooks missed. A sweep that found something is reported as an ``audit``
        event and a warning.
    retire_by_rules:
        Place the keys of retiring workers (``retire_workers``, adaptive scale-down) by
        the rules (see :mod:`amm_rules.engine.sections.retirement`). False leaves distributed's own
        ``RetireWorker`` alone: each key goes to the running worker with the least
        memory, and the rules move it afterwards.
    """

    # What the context holds, under the names the observers and tests use.
    ruleset = ReadOnly[Ruleset]("ctx.ruleset")
    index = ReadOnly[KeyIndex]("ctx.index")
    events = ReadOnly[EventLog]("ctx.events")
    journal = ReadOnly[Journal]("ctx.journal")
    placements = ReadOnly[Placements]("ctx.placements")
    flow = ReadOnly[MemoryFlow]("ctx.flow")
    early = ReadOnly[EarlyCycles]("ctx.early")
    classifier = ReadOnly[Classifier]("ctx.classifier")
    dry_run = ReadOnly[DryRun]("ctx.dry_run")
    inflight_timeout = ReadOnly[float]("ctx.inflight_timeout")
    #: Counters of the last cycle: label -> {governed, requested, dropped, unmet}.
    last_cycle = ReadOnly[dict[str, dict[str, int]]]("ctx.journal.last_cycle")
    #: Copies requested and dropped since the policy started: label -> counts.
    totals = ReadOnly[Mapping[str, Counter[str]]]("ctx.journal.totals")
    #: Number of cycles run, and the duration of the last one in seconds.
    cycles = ReadOnly[int]("ctx.journal.cycles")
    last_cycle_seconds = ReadOnly[float]("ctx.journal.last_cycle_seconds")
    #: Features off on this scheduler for want of an internal, with their words
    #: (see :mod:`amm_rules.engine.features`).
    unsupported = ReadOnly[dict[str, str]]("ctx.unsupported")
    #: What the ``status`` and ``explain`` handlers answer (see :attr:`handlers`).
    answers = ReadOnly[Answers]("handlers.answers")
    #: Where the rules came from (see :class:`~amm_rules.engine.rules_file.RulesFile`).
    path = ReadOnly[str | None]("rules_file.path")
    reload = ReadOnly[bool]("rules_file.reload")
    loaded_at = ReadOnly[float]("rules_file.loaded_at")
    reload_errors = ReadOnly[list[dict[str, Any]]]("rules_file.errors")

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
        on_invalid_rules: str = "refuse",
    ):
        on_invalid = check_choice(on_invalid_rules)
        #: Where the rules came from (path, reload, loaded at, reload errors).
        self.rules_file = RulesFile(rules, reload)
        try:
            ruleset = self.rules_file.load(rules)
        except RulesError as exc:  # refuse: raised again, the scheduler does not start
            source = self.rules_file.path or "inline rules of the policy"
            ruleset = invalid_at_start(exc, self.rules_file, on_invalid, source)
        #: Everything the sections use (see :mod:`amm_rules.engine.context`).
        self.ctx = ctx = EngineContext(
            inflight_timeout=inflight_timeout,
            summary_interval=summary_interval,
            early_cycle_delay=early_cycle_delay,
            early_cycle_gap=early_cycle_gap,
            retire_by_rules=retire_by_rules,
            rules_file=self.rules_file,
        )
        options: dict[type[Section], dict[str, Any]] = {
            AuditSection: {"interval": audit_interval},
            Classification: {
                "classify_seconds": classify_seconds,
                "classify_keys": classify_keys,
            },
        }
        #: The sections, in the order they run (see :mod:`amm_rules.engine.sections`).
        self.sections: tuple[Section, ...] = tuple(
            cls(ctx, **options.get(cls, {})) for cls in SECTIONS
        )
        self._manager: ActiveMemoryManagerExtension | None = None
        #: The scheduler handlers clients call (:mod:`amm_rules.engine.handlers`); what
        #: ``status`` and ``explain`` answer is its ``answers``, the engine's own until
        #: an observer gives fuller ones.
        self.handlers = Handlers(ctx, self.sections, self.drains)
        #: Undo the wrappers of the scheduler's replica and worker methods (see detach).
        self._unwatch: list[Any] = []
        #: The plugin keeping the handlers' metadata in place, while attached.
        self._published: Any = None
        #: The sections on here, in order: all but those off for want of an internal
        #: (see :meth:`unsupported_feature`).
        self._on: tuple[Section, ...] = self.sections
        #: The steps of the cycle that run here (see _attach).
        self._steps: tuple[Section, ...] = ()
        self._install(ruleset)

    def section(self, cls: type[S]) -> S:
        """The policy's section of class ``cls`` (``LookupError`` if it has none). For
        the observers above the engine, tests and benchmarks: sections never look each
        other up."""
        for section in self.sections:
            if type(section) is cls:
                return section
        raise LookupError(f"the engine has no {cls.__name__} section")

    # The sections under the names the observers, handlers and tests use.
    @property
    def replication(self) -> Replication:
        return self.section(Replication)

    @property
    def activity(self) -> RuleActivity:
        return self.section(RuleActivity)

    @property
    def rebalancer(self) -> Any:
        return self.section(RebalanceSection).rebalancer

    @property
    def balancing(self) -> bool:
        """Rebalancing works for the adaptive section's balance (docs/adaptive.md)."""
        return self.section(RebalanceSection).balancing

    @property
    def paused(self) -> PausedWorkers:
        return self.section(PausedWorkers)

    @property
    def pressure(self) -> MemoryPressure:
        return self.section(MemoryPressure)

    @property
    def retirements(self) -> Retirements:
        return self.section(Retirements)

    @property
    def drains(self) -> DrainSection:
        return self.section(DrainSection)

    @property
    def legacy(self) -> LegacyCalls:
        return self.section(LegacyCalls)

    @property
    def auditor(self) -> Any:
        return self.section(AuditSection).auditor

    # ------------------------------------------------------------------ attach

    @property
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
        ctx = self.ctx
        ctx.manager = self._manager
        scheduler = self.scheduler
        index = ctx.index
        ctx.events.scheduler = scheduler
        # The one allowed scan of scheduler.tasks: keys already in memory when attached.
        index.attach(scheduler.tasks, scheduler.workers, self._wake, queue_in_memory=True)
        # Keys with several copies already: reduce-replicas' walk if no rule governs them.
        index.touch(ts.key for ts in scheduler.replicated_tasks)
        self._on = self._check_features(scheduler)
        if ENGINE.name not in self.unsupported:
            ctx.add_plugin(index, "amm-rules")
            self._unwatch = [watch_scheduler(scheduler, index)]
        if WORKER_WATCH.name not in self.unsupported:
            self._unwatch.append(watch_workers(scheduler, self.worker_changed))
        ctx.placements.attach(scheduler.workers)
        self._published = register(scheduler, self.handlers)
        ctx.add_plugin(self._published, self._published.name)
        ctx.early.attach(self.manager)
        ctx.amm_running.attach(self.manager, self)
        # A changed rules file is read in a thread: its rules are taken by an early cycle.
        self.rules_file.ready = lambda: ctx.early.request("rules-file-read")
        self._remove_reduce_replicas()
        self._steps = tuple(s for s in self._on if not isinstance(s, OFF_CYCLE))
        for section in self._on:
            section.attach()
        _tell("attached", scheduler, self)
        logger.info("%s", loaded_line(self.ruleset, ctx.source))
        for error in self.rules_file.errors:
            if error.get("at_start"):
                ctx.events.emit("reload-error", source=self.path, error=error["error"])

    def _check_features(self, scheduler: Any) -> tuple[Section, ...]:
        """Check what every feature needs of the scheduler's internals
        (:mod:`amm_rules.engine.features`); say each feature that is off. The sections
        that stay on: those whose own feature is on, none if the engine's is off."""
        for feature in (ENGINE, WORKER_WATCH):
            if needs := missing(feature, scheduler):
                self.unsupported_feature(feature.name, needs)
        engine_off = ENGINE.name in self.unsupported
        on = []
        for section in self.sections:
            section.unsupported = lacking = {}
            for feature in section.FEATURES:
                if needs := missing(feature, scheduler):
                    lacking[feature.name] = self.unsupported_feature(feature.name, needs)
            if not engine_off and section.name not in lacking:
                on.append(section)
        return tuple(on)

    def unsupported_feature(self, feature: str, needs: Sequence[Need]) -> str:
        """Say that ``feature`` is off here for want of ``needs``: one log line, one
        ``unsupported`` event, an entry of :attr:`unsupported` (the status shows it).
        Returns the words (``memory-pressure: off: needs dask >= 2025.1 (...)``)."""
        said = words(feature, needs)
        if self.unsupported.get(feature) != said:
            self.unsupported[feature] = said
            logger.warning("amm-rules: %s", said)
            self.ctx.events.emit(
                "unsupported", feature=feature, needs=[n.what for n in needs], message=said
            )
        return said

    def detach(self) -> None:
        """Stop listening to the scheduler (plugins, wrappers, handlers) and leave the
        manager. The policy can not be attached again."""
        manager = self._manager
        if manager is None:
            return
        ctx = self.ctx
        scheduler = manager.scheduler
        ctx.index.activate(False)
        ctx.early.close()
        ctx.amm_running.detach()
        self.rules_file.close()
        for undo in self._unwatch:
            undo()
        self._unwatch = []
        ctx.remove_plugin(ctx.index)
        if self._published is not None:
            ctx.remove_plugin(self._published)
        unregister(scheduler, self.handlers)
        for section in reversed(self._on):
            section.detach()
        _tell("detached", scheduler, self)
        manager.policies.discard(self)
        self._manager = ctx.manager = None

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
                self.ctx.events.emit("reduce-replicas-removed", reason=why)

    def __repr__(self) -> str:
        return (
            f"RulesPolicy(rules={self.ctx.source!r}, {counted(len(self.ruleset.rules), 'rule')}, "
            f"{counted(len(self.ruleset.pools), 'pool')})"
        )

    # ------------------------------------------------------------------ rules

    def _install(self, ruleset: Ruleset) -> None:
        ctx = self.ctx
        ctx.install(ruleset)
        self.rules_file.installed()
        for section in self.sections:
            section.configure(ruleset, ctx.dry_run)

    def _maybe_reload(self) -> None:
        """Reload the rules file if it changed; keep the running rules if the new file
        cannot be used (reported once per distinct file state and error)."""
        outcome = self.rules_file.poll()
        if outcome is None:
            return
        ctx = self.ctx
        ctx.journal.reloads["error" if isinstance(outcome, ReloadFailed) else "ok"] += 1
        if isinstance(outcome, ReloadFailed):
            logger.error(
                "amm-rules: cannot reload %s; keeping the running rules:\n%s",
                self.path,
                outcome.error,
            )
            ctx.events.once(
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
        ctx.index.reclassify(ts.key for ts in in_memory)
        for section in self._on:
            section.reloaded(in_memory)
        logger.info("%s", loaded_line(outcome, ctx.source, reloaded=True))
        ctx.events.emit(
            "reload", source=self.path, rules=len(outcome.rules), pools=len(outcome.pools)
        )

    # ------------------------------------------------------------------ the cycle

    def run(self) -> Generator[Suggestion, Any, None]:
        """One AMM cycle. Never raises: a failure is logged as an ``error`` event and the
        rest of the cycle is skipped, so the other policies still run."""
        ctx = self.ctx
        start = time.perf_counter()
        # The AMM measured every worker for this cycle: kept for status reports.
        ctx.journal.worker_memory = getattr(self._manager, "workers_memory", {})
        ctx.early.cycle_started()
        cycle = None
        try:
            self._remove_reduce_replicas()
            self._maybe_reload()
            # 2. of the module docstring: True if the pools were recomputed.
            changed = ctx.index.take_workers_changed()
            refreshed = ctx.placements.refresh(self.manager.measure, changed)
            cycle = Cycle(refreshed, ctx.clock(), start)
            for section in steps(ctx, cycle, self._steps):
                yield from section.run(cycle)
            # 4. of the module docstring.
            ctx.journal.counted(cycle.stats)
            ctx.events.summary(self.last_cycle, time.monotonic(), self._on)
        except Exception as exc:
            logger.exception("amm-rules: cycle failed; skipped")
            ctx.events.once(("error", repr(exc)), "error", error=repr(exc))
        finally:
            end = time.perf_counter()
            for ended in cycle.ended if cycle is not None else ():
                ended(end)
            ctx.journal.cycle(end - start)
            ctx.early.cycle_ended()

    def _wake(self, reason: str) -> None:
        """From the index's hooks: something happened that an early cycle should repair.
        A worker joining or resuming matters only to rebalancing and unmet targets."""
        if reason in ("worker-joined", "worker-resumed") and not self._room_helps():
            return
        self.ctx.early.request(reason)

    def _room_helps(self) -> bool:
        """Whether a worker that can take copies now may change what a cycle does: the
        rules rebalance, the adaptive section balances (the worker may be one adaptive
        scaling added), or some target was left unmet by the last cycle."""
        return (
            self.ruleset.rebalance.enabled
            or self.section(RebalanceSection).wants_balance(self.ctx.clock())
            or any(counts["unmet"] for counts in self.last_cycle.values())
        )

    def worker_changed(self, address: str, what: str) -> None:
        """From :mod:`amm_rules.engine.worker_watch`: a worker's resources changed
        (``what="resources"``) or it sent a heartbeat (``"memory"``). If its pools
        changed, they are all recomputed and every governed key checked at the next
        cycle, which is asked for early if a key may now be outside its pool (the worker
        holds a governed key) or a copy may now find a place (an unmet target, or
        rebalancing)."""
        ctx = self.ctx
        if self._manager is None or (what == "memory" and not ctx.placements.volatile):
            return
        try:
            if not ctx.placements.reevaluate(address, self.manager.measure):
                return
            ctx.index.note_workers_changed()
            ws = self.scheduler.workers.get(address)
            if self._room_helps() or (ws is not None and holds_governed(ws, ctx.index.desired)):
                ctx.early.request("worker-pools-changed")
        except Exception as exc:  # a scheduler handler must not fail because of us
            logger.exception("amm-rules: re-evaluating the pools of %s failed", address)
            ctx.events.once(("error", repr(exc)), "error", error=repr(exc))


class Observer(Protocol):
    """What is told when a :class:`RulesPolicy` attaches to a scheduler, and when it
    leaves it (see :data:`OBSERVERS`)."""

    def attached(self, scheduler: Any, policy: RulesPolicy) -> None: ...

    def detached(self, scheduler: Any, policy: RulesPolicy) -> None: ...


@functools.cache
def observers() -> tuple[Observer, ...]:
    """The observers of :data:`OBSERVERS`, imported once; one that cannot be is logged
    and left out (a policy attaches and runs without it)."""
    out = []
    for name in OBSERVERS:
        module, _, attribute = name.partition(":")
        try:
            out.append(getattr(importlib.import_module(module), attribute))
        except Exception:
            logger.exception("amm-rules: cannot load the observer %s", name)
    return tuple(out)


def _tell(what: str, scheduler: Any, policy: RulesPolicy) -> None:
    """Tell every observer that ``policy`` was ``attached`` or ``detached``; a failing
    observer is logged and never stops the policy."""
    for observer in observers():
        try:
            getattr(observer, what)(scheduler, policy)
        except Exception:
            logger.exception("amm-rules: observer %r failed when %s", observer, what)
