"""Workers and placement: which pools each worker is in, and where each class of keys may
live.

:class:`Placements` keeps, for one :class:`~amm_rules.engine.policy.RulesPolicy`:

- the pool membership of every worker, recomputed when workers join, leave or change
  status (paused, resumed, retiring), or every cycle when a pool reads worker memory;
  one worker's is evaluated again when its resources change or, if a pool reads worker
  memory, at its heartbeats (:meth:`Placements.reevaluate`, called through
  :mod:`amm_rules.engine.worker_watch`);
- per :class:`~amm_rules.engine.state.index.PlanClass` (a key's pool, avoid, spread, target
  and move), the eligible workers and how many copies and hosts they allow
  (:class:`~amm_rules.engine.state.index.Placement`), computed once per refresh;
- the planner's :class:`~amm_rules.engine.decide.view.ClusterView` of the workers.

It reads the scheduler's ``WorkerState`` objects through
:mod:`amm_rules.engine.adapters`; the planners never see them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from operator import attrgetter
from typing import Any

from amm_rules.engine.adapters import worker_facts, worker_status
from amm_rules.engine.decide.view import ClusterView, WorkerView, pool_membership
from amm_rules.engine.state.governed import Placement, PlanClass
from amm_rules.language.ruleset import Pool, Ruleset

#: Worker attributes that change while a worker runs: a pool reading one of them is
#: re-evaluated every cycle instead of when workers join or leave.
VOLATILE_WORKER_ATTRIBUTES = frozenset({"memory", "memory_fraction"})

_STATUS = attrgetter("status")


class Placements:
    """Pool membership and per-class placement (see the module docstring)."""

    #: Worker address -> names of the pools it is in, as of the last refresh.
    pools: dict[str, frozenset[str]]

    def __init__(self, on_pool_error: Callable[[Pool, Exception], None]):
        self._on_pool_error = on_pool_error
        self.pools = {}
        self._by_class: dict[PlanClass, Placement] = {}
        self._status_signature: tuple[Any, ...] = ()
        self._volatile = False
        self._ruleset: Ruleset | None = None
        #: The scheduler's live ``workers`` mapping, once attached.
        self._workers: Mapping[str, Any] = {}

    def attach(self, workers: Mapping[str, Any]) -> None:
        """Read workers from the scheduler's live ``workers`` mapping."""
        self._workers = workers

    def configure(self, ruleset: Ruleset) -> None:
        """New rules: everything is recomputed at the next refresh."""
        self._ruleset = ruleset
        self._volatile = any(
            not VOLATILE_WORKER_ATTRIBUTES.isdisjoint(p.depends) for p in ruleset.pools.values()
        )
        self.pools = {}
        self._by_class = {}
        self._status_signature = ()

    def refresh(self, measure: str, changed: bool) -> bool:
        """Recompute pools and placements if workers joined or left (``changed``, from the
        scheduler hooks), changed status, or a pool reads worker memory. True if they were
        recomputed: then every governed key is checked this cycle."""
        # A status change (paused, resumed, retiring) has no hook, hence this signature,
        # taken every cycle. The scheduler's SortedDict iterates slowly from Python: read
        # its dict in C.
        workers = self._workers
        values = dict.values(workers) if isinstance(workers, dict) else workers.values()
        signature = tuple(map(_STATUS, values))
        if not changed and not self._volatile and signature == self._status_signature:
            return False
        self._status_signature = signature
        self.pools = {a: self._membership(ws, measure) for a, ws in workers.items()}
        self._by_class = {}
        return True

    def _membership(self, ws: Any, measure: str) -> frozenset[str]:
        """The pools ``ws`` is in, its memory read by ``measure``."""
        assert self._ruleset is not None
        facts = worker_facts(ws, getattr(ws.memory, measure))
        return pool_membership(facts, self._ruleset.pools, self._on_pool_error)

    @property
    def volatile(self) -> bool:
        """True if a pool reads worker memory (membership may change at any heartbeat)."""
        return self._volatile

    def reevaluate(self, address: str, measure: str) -> bool:
        """Evaluate one worker's pools again (its resources or memory changed). True if
        its membership changed: it is then recorded, the placements are dropped, and the
        caller should have everything recomputed at the next refresh. A worker not seen
        by a refresh yet is left to that refresh."""
        ws = self._workers.get(address)
        was = self.pools.get(address)
        if ws is None or was is None or self._ruleset is None:
            return False
        now = self._membership(ws, measure)
        if now == was:
            return False
        self.pools[address] = now
        self._by_class = {}
        return True

    def include_new_workers(self, measure: str) -> None:
        """Pool membership of the workers that joined since the last refresh, without
        refreshing (the next refresh still recomputes everything): for decisions taken
        before the policy's next cycle, such as a retirement's, in which a worker missing
        here would be in no pool, and so eligible for keys that avoid one."""
        for a, ws in self._workers.items():
            if a not in self.pools:
                self.pools[a] = self._membership(ws, measure)

    def of(self, cls: PlanClass) -> Placement:
        """Where keys of ``cls`` may live: inside its pools, outside its avoided pools, on
        workers that are not closing. ``ok`` is None when every worker is eligible."""
        try:
            return self._by_class[cls]
        except KeyError:
            pass
        workers = self._workers
        want = frozenset(cls.pool) if cls.pool is not None else None
        shun = frozenset(cls.avoid or ())
        ok = []
        for a, ws in workers.items():
            pools = self.pools.get(a, frozenset())
            if want is not None and want.isdisjoint(pools):
                continue
            if not shun.isdisjoint(pools) or worker_status(ws) == "closing":
                continue
            ok.append(ws)
        restricted = len(ok) < len(workers)
        placement = Placement(
            ok=frozenset(ok) if restricted else None,
            achievable=len(ok),
            hosts=len({ws.host for ws in ok}),
        )
        self._by_class[cls] = placement
        return placement

    def class_unmet(self, cls: PlanClass) -> bool:
        """Too few eligible workers for the class's target, whatever the key."""
        if cls.move == "never":
            return False
        achievable = self.of(cls).achievable
        lo = cls.replicate.bounds(achievable)[0] if cls.replicate is not None else 1
        return lo > achievable

    def cluster_view(self, memory: Mapping[Any, int]) -> ClusterView:
        """The planner's view of the workers; ``memory`` maps each ``WorkerState`` to its
        memory by the AMM's measure."""
        pools = self.pools
        return ClusterView(
            WorkerView(a, ws.host, worker_status(ws), pools.get(a, frozenset()), memory.get(ws, 0))
            for a, ws in self._workers.items()
        )
