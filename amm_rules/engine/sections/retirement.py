"""Retirement that keeps the rules: where a retiring worker's keys go while
RulesPolicy is attached (docs/retirement.md: the guarantee, events, cost).

``client.retire_workers``, adaptive scale-down and the restarts of
:mod:`amm_rules.engine.sections.paused_workers` all go through ``Scheduler.retire_workers``,
which adds one ``RetireWorker`` policy per worker to the AMM and waits for its
``done()``. The stock policy places each key held only there ignoring pools, ``avoid``,
``spread`` and ``move: never``, and the rules undo it a cycle later. Here:

- :class:`Retirements` wraps the manager's ``add_policy`` (and converts the instances
  already there) so that every ``RetireWorker`` becomes a :class:`RulesRetireWorker`
  *before* it runs once: the object ``retire_workers`` polls is the same, only its
  class changes (same slots, no new state);
- :meth:`RulesRetireWorker.run` plans the copies that must exist first and where
  (:func:`~amm_rules.engine.decide.evacuate.plan_evacuation`), suggests them, and drops
  the retiring worker's copy of a key once it is held where the rules want it; a key
  that may not get a copy fails the retirement as distributed fails it when no worker
  can receive a key (``no_recipients``);
- :meth:`RulesRetireWorker.done` waits until every key is held where the rules want it
  on the workers that stay;
- a departure with a pacer (a drain's, or adaptive scale-down's: see
  :mod:`amm_rules.engine.state.leaving`) orders the keys by value before they are
  planned and lets through the copies it admits; a departure that keeps its copies
  until it goes (a drain's) has none dropped.

The copies a retirement asks for are in the engine's ledger (asked by
:func:`~amm_rules.engine.state.leaving.retirement_owner`), where the planner counts them.

Neighbours: the policy runs :class:`Retirements` as a section off the cycle (attach,
detach, status); :mod:`amm_rules.engine.evacuation` is the work it shares with the
paused-workers section and the drains.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections import Counter
from collections.abc import Callable, Generator, Hashable
from typing import TYPE_CHECKING, Any

from distributed.active_memory_manager import RetireWorker, Suggestion
from distributed.diagnostics.plugin import SchedulerPlugin

from amm_rules.engine.decide.evacuate import Evacuation, plan_evacuation
from amm_rules.engine.decide.plan import needed_copies
from amm_rules.engine.decide.view import ClusterView, KeyView
from amm_rules.engine.evacuation import (
    blocked_fields,
    dry_run_keys,
    evacuation_input,
    record_copy,
    shown_keys,
    suggest_copies,
)
from amm_rules.engine.features import RETIRING, Feature
from amm_rules.engine.sections.base import Section
from amm_rules.engine.state.leaving import retirement_owner

if TYPE_CHECKING:
    from amm_rules.engine.context import EngineContext

logger = logging.getLogger(__name__)

#: The Retirements of the RulesPolicy attached to each manager.
_ENGINES: weakref.WeakKeyDictionary[Any, Retirements] = weakref.WeakKeyDictionary()


# --------------------------------------------------------------------------------------
# The policy
# --------------------------------------------------------------------------------------


class RulesRetireWorker(RetireWorker):
    """A ``RetireWorker`` whose keys are placed by the rules (see the module docstring).

    Instances are never created: :class:`Retirements` changes the class of the
    ``RetireWorker`` objects the scheduler adds. Without an attached RulesPolicy (it was
    detached meanwhile) it behaves exactly as ``RetireWorker``.
    """

    __slots__ = ()

    def run(self) -> Generator[Suggestion, Any, None]:
        engine = _ENGINES.get(self.manager)
        ws = self.manager.scheduler.workers.get(self.address)
        if engine is None or ws is None or ws.actors:
            # Stock behaviour: no rules, or nothing to place (gone), or actors (which
            # cannot move: the stock policy refuses the retirement).
            yield from RetireWorker.run(self)
            return
        yield from engine.run_for(self, ws)

    def done(self) -> bool:
        engine = _ENGINES.get(self.manager)
        if engine is None or self not in self.manager.policies:
            return RetireWorker.done(self)
        return engine.placed(self.address)


class Retirements(Section):
    """Retirements under the rules, for one RulesPolicy (see the module docstring)."""

    offline = (
        "retirement: not simulated: no worker retires in a simulation (--kill removes workers)"
    )
    name = "retirement"
    FEATURES = (Feature("retirement", RETIRING),)
    status_key = "retirements"
    metric_prefix = "retirement"
    METRICS = {
        "retiring": ("retiring_workers", "gauge", "Workers retiring now"),
        "retirements": ("retirements", "counter", "Retirements placed by the rules"),
        "copies": ("retirement_copies", "counter", "Copies made for retirements"),
        "bytes": ("retirement_copied_bytes", "counter", "Bytes copied for retirements"),
        "drops": ("retirement_drops", "counter", "Copies dropped for retirements"),
        "placed": (
            "retirement_placed",
            "counter",
            "Retirements whose keys all found their place",
        ),
        "blocked": (
            "retirement_blocked",
            "counter",
            "Retirements refused: keys with nowhere to go",
        ),
        "dry_run_keys": (
            "retirement_dry_run_keys",
            "counter",
            "Keys of retiring workers placed without their rules, which are in dry-run",
        ),
    }

    def __init__(self, ctx: EngineContext) -> None:
        super().__init__(ctx)
        #: Per retiring worker: what its keys need (key -> (copies, eligible workers or
        #: None for any worker that stays)), as of its policy's last run.
        self.needs: dict[str, dict[Hashable, tuple[int, frozenset[str] | None]]] = {}
        #: Per retiring worker, until it leaves, for ``status``: ``state`` (``placing``,
        #: ``placed``), keys, copies asked, start time.
        self.active: dict[str, dict[str, Any]] = {}
        #: Counters since the policy started (metrics): ``retirements``, ``copies``,
        #: ``bytes``, ``drops``, ``blocked``, ``placed``, ``dry_run_keys``.
        self.counters: Counter[str] = Counter()
        self._unwrap: Callable[[], None] | None = None
        self._departed = _Departed(self)

    # -- attach ----------------------------------------------------------------------

    def attach(self) -> None:
        """Place retirements by the rules, unless the policy was told not to
        (``retire_by_rules=False``: distributed's own ``RetireWorker`` is left alone)."""
        ctx = self.ctx
        if not ctx.retire_by_rules:
            return
        manager = ctx.manager
        _ENGINES[manager] = self
        # Leaving workers' pacers are followed (a drain may start).
        ctx.departures.paced = True
        ctx.add_plugin(self._departed, _Departed.name)
        self._unwrap = _wrap_add_policy(manager)

    def detach(self) -> None:
        ctx = self.ctx
        ctx.departures.paced = False
        manager = ctx.manager
        if manager is not None and _ENGINES.get(manager) is self:
            del _ENGINES[manager]
        if self._unwrap is not None:
            self._unwrap()
            self._unwrap = None
        ctx.remove_plugin(self._departed)

    # -- one retiring worker, one cycle ----------------------------------------------

    def run_for(self, rw: RulesRetireWorker, ws: Any) -> Generator[Suggestion, Any, None]:
        ctx = self.ctx
        now = time.monotonic()
        tasks = [ts for ts in ws.has_what if not ts.actor]
        leaving = ctx.leaving()
        views, cluster = evacuation_input(ctx, tasks, leaving)
        departure = leaving.get(ws.address)
        pacer = departure.pacer if departure is not None else None
        if pacer is not None:
            views = pacer.rank(ws, views, cluster)
        plan = plan_evacuation(views, cluster, now=now)
        self._remember_needs(ws.address, views, cluster)
        dry = dry_run_keys(ctx, views)
        if pacer is not None:
            plan = pacer.admit(ws, plan, now)
        first = ws.address not in self.active
        if first:
            self.counters["retirements"] += 1
            self.counters["dry_run_keys"] += len(dry)
            self.active[ws.address] = {
                "state": "placing",
                "keys": len(tasks),
                "copies": 0,
                "since": time.time(),
                "dry_run_keys": len(dry),
            }
        if plan.stuck:
            self._refuse(rw, ws, plan)
            return
        if first:
            ctx.events.emit(
                "retirement",
                step="placing",
                worker=ws.address,
                keys=len(tasks),
                copies=len(plan.copies),
                held_elsewhere=len(plan.satisfied),
                dry_run=len(dry),
                dry_run_keys=shown_keys(dry),
            )
        by_key = {ts.key: ts for ts in tasks}
        workers = rw.manager.scheduler.workers
        accepted = yield from suggest_copies(plan, by_key, workers, f"retiring {ws.address}")
        owner = retirement_owner(ws.address)
        for copy, _ in accepted:
            record_copy(ctx, owner, copy, now)
            if pacer is not None:
                pacer.asked(ws, copy, now)
            self.counters["copies"] += 1
            self.counters["bytes"] += copy.nbytes
            self.active[ws.address]["copies"] += 1
        if departure is None or not departure.keeps_copies:
            yield from self._drop_placed(ws, plan, by_key, set(dry))

    def _drop_placed(
        self, ws: Any, plan: Evacuation, by_key: dict[Hashable, Any], dry: set[Hashable]
    ) -> Generator[Suggestion, Any, None]:
        """Drop the retiring worker's copy of keys held where the rules want them
        elsewhere: its memory is freed early, as the stock policy does (a spilled worker
        reads its keys back from disk to send them). ``dry``: keys in dry-run, dropped
        as the stock policy drops them."""
        index = self.ctx.index
        for key in plan.satisfied:
            desired = index.desired.get(key)
            if desired is not None and desired.move == "never" and key not in dry:
                continue  # never dropped by amm-rules; it vanishes with the worker
            if (yield Suggestion("drop", by_key[key], {ws})) is not None:
                self.counters["drops"] += 1

    def _refuse(self, rw: RulesRetireWorker, ws: Any, plan: Evacuation) -> None:
        """Fail the retirement as distributed does when no worker can receive a key."""
        ctx = self.ctx
        rw.no_recipients = True
        rw.manager.policies.discard(rw)
        self.counters["blocked"] += 1
        self.forget(ws.address)
        blocked = blocked_fields({s.key: (s.why, s.rule) for s in plan.stuck})
        logger.warning(
            "amm-rules: not retiring %s: %d keys held only there may not go elsewhere "
            "(%s; rules %s), e.g. %s",
            ws.address,
            blocked["count"],
            "; ".join(blocked["why"]),
            ", ".join(blocked["rules"]),
            blocked["keys"][:3],
        )
        ctx.events.emit("retirement", step="blocked", worker=ws.address, **blocked)

    def _remember_needs(self, address: str, views: list[KeyView], cluster: ClusterView) -> None:
        needs: dict[Hashable, tuple[int, frozenset[str] | None]] = {}
        for view in views:
            d = view.desired
            if d.move == "never":
                needs[view.key] = (1, None)
                continue
            eligible = cluster.placeable(d.pool, d.avoid)
            reachable = eligible & (cluster.running | view.holders)
            want = min(needed_copies(d.replicate, len(eligible)), len(reachable))
            needs[view.key] = (want, eligible) if want else (1, None)
        self.needs[address] = needs

    def placed(self, address: str) -> bool:
        """``done()`` of the retirement of ``address``: every key it holds is held where
        the rules want it on workers that stay. Cheap (it runs every few tens of ms
        while a retirement waits): it checks what the last run found each key needs."""
        ctx = self.ctx
        ws = ctx.scheduler.workers.get(address)
        if ws is None:
            return True
        needs = self.needs.get(address)
        if needs is None:
            return False
        leaving = ctx.leaving().keys()
        for ts in ws.has_what:
            if ts.actor:
                continue
            need = needs.get(ts.key)
            if need is None:
                return False  # arrived since the last run: wait for it to be planned
            want, eligible = need
            staying = {w.address for w in ts.who_has or ()} - leaving
            if eligible is not None:
                staying &= eligible
            if len(staying) < want:
                return False
        departure = ctx.departures.workers.get(address)
        if departure is not None and departure.pacer is not None:
            departure.pacer.placed(address)
        info = self.active.get(address)
        if info is not None and info["state"] != "placed":
            # The worker leaves now (or, for a restart, is about to be killed); the policy
            # keeps running for it until it is gone, as the stock one does.
            info["state"] = "placed"
            self.counters["placed"] += 1
            ctx.events.emit(
                "retirement",
                step="placed",
                worker=address,
                keys=info["keys"],
                copies=info["copies"],
            )
        return True

    def forget(self, address: str) -> None:
        """The worker left: its retirement is over."""
        self.active.pop(address, None)
        self.needs.pop(address, None)

    # -- status ------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return {
            "retiring": {a: dict(info) for a, info in self.active.items()},
            "totals": dict(self.counters),
        }

    def metrics(self) -> dict[str, float]:
        """The counters of :attr:`counters` and ``retiring`` (now)."""
        out = self.counter_figures(self.counters)
        out["retiring"] = float(len(self.active))
        return out


def _wrap_add_policy(manager: Any) -> Callable[[], None]:
    """Make every ``RetireWorker`` added to ``manager`` (and those already there) a
    :class:`RulesRetireWorker`. Returns the function that undoes the wrapper."""
    before = vars(manager).get("add_policy")
    add_policy = manager.add_policy

    def add_policy_ruled(policy: Any) -> None:
        if type(policy) is RetireWorker:
            policy.__class__ = RulesRetireWorker
        add_policy(policy)

    manager.add_policy = add_policy_ruled
    for policy in manager.policies:
        if type(policy) is RetireWorker:
            policy.__class__ = RulesRetireWorker

    def unwrap() -> None:
        if vars(manager).get("add_policy") is add_policy_ruled:
            if before is None:
                del manager.add_policy
            else:
                manager.add_policy = before

    return unwrap


class _Departed(SchedulerPlugin):
    """Tells the retirements when a worker left: its retirement is over."""

    name = "amm-rules-retirements"

    def __init__(self, retirements: Retirements):
        self.retirements = retirements

    def remove_worker(self, scheduler: Any = None, worker: str = "", **kwargs: Any) -> None:
        self.retirements.forget(worker)
