"""The replication section: each governed key's target, pool, avoid, spread and
``move: never``, held every cycle.

One cycle of it:

1. classifies the keys that entered memory (or got a runtime target) since the last
   cycle, within the cycle's classification budget
   (:class:`~amm_rules.engine.decide.classify.Classifier`, :class:`~amm_rules.engine.decide.classify_budget.ClassifyBudget`),
   filing governed ones in the :class:`~amm_rules.engine.state.index.KeyIndex`;
2. routes keys whose copies changed (governed ones are checked, the others join
   reduce-replicas' walk) and gives up copies in flight from workers that died;
3. checks every governed key with one cheap comparison (all of them after workers
   changed, else those that changed), and plans the few that fail it, or have copies in
   flight, with :func:`amm_rules.engine.decide.plan.plan_key`;
4. yields a ``Suggestion`` per planned action, with the chosen worker as the only
   candidate (held back for keys in dry-run), and remembers the copies the AMM accepted
   (with a deadline) and what each plan left short.

Neighbours: :mod:`amm_rules.engine.decide.plan` decides; the rebalance section's moves
(:attr:`~amm_rules.engine.sections.rebalance.RebalanceSection.moving`) and the legacy
calls' copies (:attr:`~amm_rules.engine.sections.legacy.LegacyCalls.copying`) are
left alone here, and so are the keys a drain will copy in its order of value
(:attr:`~amm_rules.engine.sections.drain.DrainSection.paced`).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Generator, Hashable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from distributed.active_memory_manager import Suggestion

from amm_rules.engine import key_logger
from amm_rules.engine.decide.classify_budget import ClassifyBudget
from amm_rules.engine.decide.plan import plan_key
from amm_rules.engine.dryrun import HELD_BACK
from amm_rules.engine.sections.base import Cycle, Section
from amm_rules.engine.sections.drain import DrainSection
from amm_rules.engine.sections.legacy import LegacyCalls
from amm_rules.engine.sections.rebalance import RebalanceSection
from amm_rules.engine.state.governed import PlanClass
from amm_rules.engine.state.index import KeyIndex
from amm_rules.engine.state.journal import shortfall

if TYPE_CHECKING:
    from amm_rules.engine.context import EngineContext

logger = logging.getLogger(__name__)


class Replication(Section):
    """Replication targets and placement of the governed keys (see the module docstring).

    ``classify_seconds``, ``classify_keys``: the classification budget of one cycle (see
    :class:`~amm_rules.engine.policy.RulesPolicy`)."""

    name = "replication"

    def __init__(self, classify_seconds: float | None = 0.1, classify_keys: int | None = None):
        #: The classification budget of a cycle: seconds (of the whole cycle) and keys.
        self.classify_seconds = None if classify_seconds is None else float(classify_seconds)
        self.classify_keys = None if classify_keys is None else max(1, int(classify_keys))
        #: How much of the cycle the classification loop may take (see ClassifyBudget).
        self.classify_budget = ClassifyBudget()

    # ------------------------------------------------------------------ the cycle

    def run(self, cycle: Cycle) -> Generator[Suggestion, Any, None]:
        ctx = self.ctx
        assert ctx is not None
        cycle.ended.append(self.classify_budget.cycle_ended)
        filed = self._classify_dirty(ctx, cycle)
        self._absorb_touched(ctx.index, ctx.scheduler.tasks)
        self._give_up_orphaned_copies(ctx)

        now = cycle.now = ctx.clock()
        stats = cycle.stats
        for label, n in ctx.index.governed.governed_by.items():
            stats[label]["governed"] = n

        todo = self._suspects(ctx, stats, cycle.full, filed)
        if todo:
            yield from ctx.dry_run.replication(
                self._plan_and_suggest(ctx, todo, now, stats), ctx.index.desired, stats
            )

    def _classify_dirty(self, ctx: EngineContext, cycle: Cycle) -> dict[PlanClass, list[Any]]:
        """Resolve the keys that entered memory (or got a runtime target) since the last
        cycle, within the cycle's classification budget, and file governed ones in the
        index. Returns the tasks filed that may need action (their suspects, see
        :meth:`KeyIndex.suspects`), by plan class; all of them when the cycle is full
        (every governed key is checked in this cycle anyway). The keys not reached wait
        for the next cycles (see :meth:`KeyIndex.classify
        <amm_rules.engine.state.index.KeyIndex.classify>`), and are neither planned nor
        reduced until then. Keys that are no longer governed join ``index.touched``, so
        that reduce-replicas finds them if they hold several copies."""
        index = ctx.index
        classifier = ctx.classifier
        scheduler = ctx.scheduler
        if classifier.replicas_sensitive:
            # A match reading task.replicas can change its mind when copies come and go.
            index.reclassify(index.touched)
        ctx.journal.backlog = 0
        demand = index.demand
        if demand.touched:
            if classifier.demand_sensitive:
                # A match reading task.waiters or task.reads: dependents came or went.
                tasks = scheduler.tasks
                index.reclassify(k for k in demand.touched if k in tasks)
            demand.touched.clear()
        if not index.unclassified:
            return {}
        task_groups = scheduler.task_groups
        if classifier.groups_remembered > 2 * len(task_groups) + 1_000:
            classifier.forget_groups(task_groups)
        limit = index.unclassified if self.classify_keys is None else self.classify_keys
        check = None
        if not cycle.full:
            reduce_replicas = ctx.ruleset.reduce_replicas
            placement_of = ctx.placements.of

            def check(cls: PlanClass, members: list[Any]) -> Iterable[Any]:
                return index.suspects(cls, placement_of(cls), reduce_replicas, members)

        began = time.perf_counter()
        # The budget is the cycle's: the loop stops early enough for the rest of the
        # cycle (filing, checking, planning what it classified) to fit too.
        budget = self.classify_budget
        deadline = (
            None
            if self.classify_seconds is None
            else budget.deadline(cycle.started, began, self.classify_seconds)
        )
        filed, done = index.classify(classifier, scheduler.tasks, limit, deadline, check)
        left = index.unclassified
        if left:
            if deadline is not None and index.loop_ended >= deadline:
                # (Learnt only from loops the deadline stopped, not the key limit.)
                budget.stopped(began, index.loop_ended)
            logger.debug("amm-rules: classified %d keys; %d left for the next cycles", done, left)
        ctx.journal.backlog = left
        return filed

    @staticmethod
    def _absorb_touched(index: KeyIndex, tasks: Mapping[Hashable, Any]) -> None:
        """Route keys whose copies changed: governed ones are checked this cycle, the
        others join reduce-replicas' walk if they hold more than one copy."""
        touched, index.touched = index.touched, set()
        for key in touched:
            if key in index.desired:
                index.recheck.add(key)
                index.replicated_free.pop(key, None)
                continue
            ts = tasks.get(key)
            if ts is not None and ts.state == "memory" and len(ts.who_has or ()) > 1:
                index.replicated_free[key] = ts

    @staticmethod
    def _give_up_orphaned_copies(ctx: EngineContext) -> None:
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
        index = ctx.index
        tasks = ctx.scheduler.tasks
        assert ctx.manager is not None
        until = ctx.clock() + ctx.manager.interval / 2
        read: set[Hashable] = set()
        for key in index.source_lost:
            entry = index.inflight.pop(key, None)
            if entry:
                pass_over(index, key, entry, until)
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
            pass_over(index, key, workers, until)

    @staticmethod
    def _suspects(
        ctx: EngineContext,
        stats: dict[str, Counter[str]],
        full: bool,
        filed: Mapping[PlanClass, list[Any]],
    ) -> dict[Hashable, Any]:
        """Governed keys that may need action this cycle (see KeyIndex.suspects): all
        of them after workers changed, else only those just filed (``filed``, by plan
        class: the suspects among them, see _classify_dirty), those whose copies
        changed, those with copies in flight and those left to look at again."""
        index = ctx.index
        placements = ctx.placements
        reduce_replicas = ctx.ruleset.reduce_replicas
        for cls, group in index.governed.groups.items():
            if placements.class_unmet(cls):
                # Held as far as possible; every key of the class is unmet.
                stats[cls.source]["unmet"] += len(group)
        recheck, index.recheck = index.recheck, set()
        todo: dict[Hashable, Any] = {}
        if full:
            for cls in index.governed.groups:
                for ts in index.suspects(cls, placements.of(cls), reduce_replicas):
                    todo[ts.key] = ts
        else:
            for ts in index.suspects_among(recheck, placements.of, reduce_replicas):
                todo[ts.key] = ts
            for members in filed.values():  # checked as they were filed
                for ts in members:
                    todo[ts.key] = ts
        tasks = ctx.scheduler.tasks
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

    def _plan_and_suggest(
        self,
        ctx: EngineContext,
        todo: dict[Hashable, Any],
        now: float,
        stats: dict[str, Counter[str]],
    ) -> Generator[Suggestion, Any, None]:
        index = ctx.index
        cluster = ctx.cluster_view()
        settings = ctx.settings(now)
        assert ctx.manager is not None
        pending = ctx.manager.pending
        workers = ctx.scheduler.workers
        rebalance = ctx.find(RebalanceSection)
        moving = rebalance.moving if rebalance is not None else ()
        journal = ctx.journal
        legacy = ctx.find(LegacyCalls)
        copying = legacy.copying if legacy is not None else ()
        drain = ctx.find(DrainSection)
        paced = drain.paced if drain is not None else ()
        draining = drain.emptying() if drain is not None else ()
        placements = ctx.placements
        dry_run = ctx.dry_run
        for key, ts in todo.items():
            desired = index.desired.get(key)
            if desired is None or ts.state != "memory":
                index.inflight.pop(key, None)
                continue
            if key in copying:
                continue  # a replicate or scatter call is copying it: looked at after
            if paced and key in paced:
                index.recheck.add(key)  # a drain copies it in its turn: looked at then
                continue
            plan = plan_key(ctx.key_view(ts, desired, pending, now), cluster, settings)
            if plan.unmet and not placements.class_unmet(PlanClass.of(desired)):
                stats[plan.source]["unmet"] += 1
            refused = False
            # In dry-run the AMM never sees these suggestions (amm_rules.engine.dryrun).
            held_back = HELD_BACK if dry_run.label(desired) is not None else None
            for action in plan.actions:
                ws = workers.get(action.worker)
                if ws is None:  # pragma: no cover - the view was built from these workers
                    continue
                if action.op == "drop" and key in moving:
                    # Mid-move the key holds one extra copy until the move's own drop;
                    # trimming now could drop the new copy and undo the move.
                    plan.deferred.append(f"drop from {action.worker} waits: key mid-move")
                    continue
                if action.op == "drop" and action.worker in draining:
                    # A draining worker keeps its copies until it leaves: if it
                    # outlives its deadline, nothing was lost.
                    plan.deferred.append(f"drop from {action.worker} waits: it is draining")
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
            index.store_plan(key, plan)
            if plan.misplaced and (plan.deferred or refused):
                index.trim_waits.add(key)  # a dependent finishing wakes a cycle
            else:
                index.trim_waits.discard(key)
            short = dry_run.shortfall(desired, plan, shortfall(plan, refused))
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


def pass_over(index: KeyIndex, key: Hashable, workers: Iterable[str], until: float) -> None:
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
