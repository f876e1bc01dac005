"""The replication section: each governed key's target, pool, avoid, spread and
``move: never``, held every cycle.

One cycle of it, at the cycle's planning time (after the classification step):

1. routes keys whose copies changed (governed ones are checked, the others join
   reduce-replicas' walk) and gives up copies in flight from workers that died;
2. checks every governed key with one cheap comparison (all of them after workers
   changed, else those that changed or were just classified), and plans the few that
   fail it, or have copies in flight or just landed, with
   :func:`amm_rules.engine.decide.plan.plan_key`;
3. yields a ``Suggestion`` per planned action, with the chosen worker as the only
   candidate (held back for keys in dry-run), records the copies the AMM accepted in the
   ledger (with a deadline) and remembers what each plan left short.

Keys another section holds (:mod:`amm_rules.engine.state.claims`) are left alone (a
``replicate`` call copying them, a drain copying them in its order of value) or keep
their copies (a move in flight); a worker leaving that keeps its copies until it goes (a
drain's) is dropped from by nobody (:meth:`~amm_rules.engine.context.EngineContext.leaving`).

Neighbours: :mod:`amm_rules.engine.decide.plan` decides;
:mod:`amm_rules.engine.sections.classification` files what this plans.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Generator, Hashable, Mapping
from typing import TYPE_CHECKING, Any

from distributed.active_memory_manager import Suggestion

from amm_rules.engine import key_logger
from amm_rules.engine.decide.plan import plan_key
from amm_rules.engine.dryrun import HELD_BACK
from amm_rules.engine.sections.base import Cycle, Section
from amm_rules.engine.state.governed import PlanClass
from amm_rules.engine.state.journal import shortfall

if TYPE_CHECKING:
    from amm_rules.engine.context import EngineContext

logger = logging.getLogger(__name__)


#: The owner of the copies the planner asks for (in the ledger).
OWNER = "replication"


class Replication(Section):
    """Replication targets and placement of the governed keys (see the module docstring)."""

    name = "replication"

    def run(self, cycle: Cycle) -> Generator[Suggestion, Any, None]:
        ctx = self.ctx
        index = ctx.index
        # Keys whose copies changed: governed ones are checked this cycle, the others
        # join reduce-replicas' walk if they hold more than one copy.
        index.route_touched()
        # Copies in flight from workers that died are given up, workers fetching such
        # keys passed over for half an interval (see Departures.give_up_orphaned_copies).
        until = ctx.clock() + ctx.amm.interval / 2
        index.departing.give_up_orphaned_copies(ctx.ledger, ctx.scheduler.tasks, until)
        stats = cycle.stats
        for label, n in index.governed.governed_by.items():
            stats[label]["governed"] = n

        todo = self._suspects(ctx, stats, cycle.full, cycle.filed)
        if todo:
            yield from ctx.dry_run.replication(
                self._plan_and_suggest(ctx, todo, cycle.now, stats), index.desired, stats
            )

    @staticmethod
    def _suspects(
        ctx: EngineContext,
        stats: dict[str, Counter[str]],
        full: bool,
        filed: Mapping[PlanClass, list[Any]],
    ) -> dict[Hashable, Any]:
        """Governed keys that may need action this cycle (see KeyIndex.suspects): all
        of them after workers changed, else only those just filed (``filed``, by plan
        class: the suspects among them, see the classification step), those whose copies
        changed, those with copies in flight or just landed and those left to look at
        again."""
        index = ctx.index
        placements = ctx.placements
        reduce_replicas = ctx.ruleset.reduce_replicas
        for cls, group in index.governed.groups.items():
            if placements.class_unmet(cls):
                # Held as far as possible; every key of the class is unmet.
                stats[cls.source]["unmet"] += len(group)
        recheck = index.take_recheck()
        todo: dict[Hashable, Any] = {}
        if full:
            for cls in index.governed.groups:
                for ts in index.governed.suspects(cls, placements.of(cls), reduce_replicas):
                    todo[ts.key] = ts
        else:
            for ts in index.governed.suspects_among(recheck, placements.of, reduce_replicas):
                todo[ts.key] = ts
            for members in filed.values():  # checked as they were filed
                for ts in members:
                    todo[ts.key] = ts
        tasks = ctx.scheduler.tasks
        desired = index.desired
        ledger = ctx.ledger
        for keys in (ledger.copies, ledger.settled_keys()):
            for key in keys:
                if key in desired and (ts := tasks.get(key)) is not None:
                    todo[key] = ts
        if index.shortfall:
            # Checked this cycle and not to be planned: they hold their target now.
            checked = index.shortfall.keys() if full else recheck & index.shortfall.keys()
            index.clear_shortfall([k for k in checked if k not in todo])
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
        ledger = ctx.ledger
        cluster = ctx.cluster_view()
        settings = ctx.settings(now)
        deadline = now + settings.inflight_timeout
        pending = ctx.amm.pending
        workers = ctx.scheduler.workers
        journal = ctx.journal
        claims = ctx.claims
        held = claims.held
        keeping = {a for a, d in ctx.departures.workers.items() if d.keeps_copies}
        placements = ctx.placements
        dry_run = ctx.dry_run
        for key, ts in todo.items():
            desired = index.desired.get(key)
            if desired is None:
                continue
            if ts.state != "memory":
                ledger.forget(key)
                continue
            if held and key in held and claims.alone(key) is not None:
                # Another section's (a replicate call copying it, a drain copying it in
                # its turn): looked at again once it lets go.
                index.look_again((key,))
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
                if action.op == "drop" and (
                    why := self._drop_waits(key, action.worker, keeping, now)
                ):
                    plan.deferred.append(why)
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
                        ledger.record(key, action.worker, OWNER, deadline, max(0, ts.nbytes))
                    else:
                        plan.inflight.pop(action.worker, None)
                elif accepted:
                    stats[action.source]["dropped"] += 1
            # A drop of a misplaced copy that waits: a dependent finishing wakes a cycle.
            trim_waits = bool(plan.misplaced and (plan.deferred or refused))
            short = dry_run.shortfall(desired, plan, shortfall(plan, refused))
            index.note_plan(key, short, trim_waits)
            if (
                refused
                or plan.deferred
                or plan.backoff
                or (desired.replicate is None and len(plan.good) + len(plan.misplaced) > 1)
            ):
                # Nothing else may touch the key before this is worth another look:
                # a refused or deferred action, a back-off ending, copies held for
                # waiters that may finish.
                index.look_again((key,))

    def _drop_waits(self, key: Hashable, worker: str, keeping: set[str], now: float) -> str:
        """Why a planned drop of ``key`` from ``worker`` waits ("" if it does not): a
        claim keeps every copy (mid-move the key holds one extra copy until the move's
        own drop: trimming now could drop the new copy and undo the move), or the worker
        keeps its copies until it leaves (``keeping``: a drain's; if it outlives its
        deadline, nothing was lost)."""
        claims = self.ctx.claims
        if claims.held and (claim := claims.keeping(key)) is not None:
            return f"drop from {worker} waits: {claim.sentence(now)}"
        if worker in keeping:
            return f"drop from {worker} waits: it keeps its copies until it leaves"
        return ""
