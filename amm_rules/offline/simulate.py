"""The simulator: the engine's planning, cycle after cycle, on a recorded cluster.

:class:`Simulation` holds a :class:`~amm_rules.offline.views.SimCluster` (a dump, a
running scheduler's state or a test fixture) and runs on it what the scheduler runs each
Active Memory Manager cycle, with the engine's own parts:

- the classifier (:class:`~amm_rules.engine.classify.Classifier`, the rules' cascade),
  the key index (:class:`~amm_rules.engine.index.KeyIndex`: governed keys, copies in
  flight, back-offs) and pool membership
  (:class:`~amm_rules.engine.placement.Placements`);
- the replication planner (:func:`~amm_rules.engine.planner.plan_key`, on
  :func:`~amm_rules.engine.adapters.key_view`) for governed keys, the rebalancer
  (:class:`~amm_rules.engine.rebalance.rebalancer.Rebalancer`, with the pure rebalance
  planner), and reduce-replicas
  (:func:`~amm_rules.engine.reduce_replicas.reduce_replicas`) for keys nobody governs;
- the dry-run filter (:class:`~amm_rules.engine.dryrun.DryRun`);
- distributed's own ``ActiveMemoryManagerExtension``, which validates each suggestion
  and keeps the memory tally, exactly as in the scheduler.

Between two cycles every accepted copy lands and every accepted drop happens (the
transfers of a real cluster usually finish within the AMM's two seconds); the
computation is frozen (no task runs or is released). The clock advances by the AMM's
interval per cycle, so in-flight deadlines, back-offs and rebalancing's cool-down count
in simulated seconds. A run stops when a cycle enacts nothing and nothing is in flight
(settled), or after ``max_cycles`` (``cycles=1``: exactly the next cycle's suggestions).

Neighbours: :mod:`amm_rules.offline.views` builds the cluster; :mod:`.report` renders
a :class:`Result`; :mod:`.diff` and :mod:`.ruletests` run simulations of their own.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Generator, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from distributed.active_memory_manager import (
    ActiveMemoryManagerExtension,
    ActiveMemoryManagerPolicy,
    Suggestion,
)

from amm_rules.engine.adapters import bounded_repr, key_view
from amm_rules.engine.classify import Classifier
from amm_rules.engine.dryrun import REBALANCE_LABEL, DryRun
from amm_rules.engine.index import KeyIndex, PlanClass
from amm_rules.engine.placement import VOLATILE_WORKER_ATTRIBUTES, Placements
from amm_rules.engine.planner import (
    DEFAULT_SOURCE,
    PlanSettings,
    plan_key,
    target_bounds,
)
from amm_rules.engine.rebalance.rebalancer import Rebalancer
from amm_rules.engine.reduce_replicas import reduce_replicas
from amm_rules.engine.view import ClusterView
from amm_rules.language.ruleset import Desired, Rule, Ruleset, RuntimeTarget, Target
from amm_rules.offline.views import SimCluster, SimTask

logger = logging.getLogger(__name__)

Key = Hashable
#: The AMM's defaults (distributed's config), used when no dask config says otherwise.
DEFAULT_INTERVAL = 2.0
DEFAULT_MEASURE = "optimistic"
#: Cycles after which a run that has not settled stops (and says so).
MAX_CYCLES = 1_000


@dataclass(frozen=True, slots=True)
class SimAction:
    """One copy made or dropped (or, in dry-run, held back) in a simulated cycle."""

    op: str
    key: Key
    worker: str
    #: Counter label: the rule, ``(annotation)``, ``(runtime)``, ``(rebalance)`` or
    #: ``(reduce-replicas)``.
    rule: str
    nbytes: int
    cycle: int
    reason: str = ""
    #: Held back by dry-run: what enforcing would do.
    dry_run: bool = False


@dataclass(slots=True)
class KeyState:
    """Where a governed key stands at the end of a run."""

    key: Key
    desired: Desired
    copies: int
    #: The label of its replication target.
    rule: str
    unmet: str | None = None
    #: Copies that are where they should not be: address -> why.
    misplaced: dict[str, str] = field(default_factory=dict)
    #: Actions the engine would still take (the run stopped before they were made).
    pending: int = 0


@dataclass
class Result:
    """What a run did and where it left the cluster."""

    cycles: int
    settled: bool
    actions: list[SimAction]
    #: Actions held back by dry-run, each once.
    dry_run: list[SimAction]
    #: Governed keys at the end (see :class:`KeyState`).
    keys: dict[Key, KeyState]
    #: Address -> memory by the AMM's measure, at the start and at the end.
    before: dict[str, int]
    after: dict[str, int]
    #: Address -> pools, at the start.
    pools: dict[str, frozenset[str]]
    #: Problems met while running (a match that raised, an invalid annotation).
    warnings: list[str] = field(default_factory=list)


class Simulation:
    """The engine's cycle on a :class:`SimCluster` (see the module docstring)."""

    def __init__(
        self,
        ruleset: Ruleset,
        cluster: SimCluster,
        *,
        measure: str = DEFAULT_MEASURE,
        interval: float = DEFAULT_INTERVAL,
        runtime: Mapping[Key, Target | RuntimeTarget] | None = None,
    ):
        self.ruleset = ruleset
        self.cluster = cluster
        self.measure = measure
        self.interval = interval
        self.warnings: list[str] = []
        self._reported: set[Any] = set()
        self.classifier = Classifier(
            ruleset, on_rule_error=self._rule_error, on_invalid_annotation=self._bad_annotation
        )
        self.dry = DryRun(ruleset)
        self.rebalancer = Rebalancer()
        self.rebalancer.configure(ruleset.rebalance, self._rebalance_error)
        self.placements = Placements(self._pool_error)
        self.placements.attach(cluster.workers)
        self.placements.configure(ruleset)
        #: A pool reads worker memory: pools change as copies land; plan every key.
        self._volatile = any(
            not VOLATILE_WORKER_ATTRIBUTES.isdisjoint(p.depends) for p in ruleset.pools.values()
        )
        #: The engine's own key index, not attached to anything: governed keys and what
        #: they want, copies in flight, back-offs, keys nobody governs with copies to trim.
        self.index = KeyIndex()
        self.index.runtime.update(
            (k, t if isinstance(t, RuntimeTarget) else RuntimeTarget(t))
            for k, t in (runtime or {}).items()
        )
        self.amm = ActiveMemoryManagerExtension(
            cluster,  # type: ignore[arg-type]
            {_Cycle(self)},
            measure=measure,
            register=False,
            start=False,
            interval=interval,
        )
        self.cycle = 0
        self.now = 0.0
        #: The last cycle that enacted something.
        self.last_active = 0
        self._full = True
        self._workers_changed = True
        self.actions: list[SimAction] = []
        self._held: dict[tuple[str, Key, str], SimAction] = {}
        self._cycle_actions: list[SimAction] = []
        self.classify(list(cluster.tasks))
        self._refresh()
        #: Memory (by the AMM's measure) and pools of every worker before the first cycle.
        self.initial_memory = cluster.measure(measure)
        self.initial_pools = dict(self.placements.pools)
        in_memory = list(cluster.in_memory())
        #: Keys in memory and their bytes, and governed keys, before the first cycle.
        self.initial_keys = (len(in_memory), sum(ts.nbytes for ts in in_memory))
        self.initial_governed = len(self.index.desired)
        #: Address -> (name, host) of every worker there was (killed ones included).
        self.names = {a: (str(ws.name), ws.host) for a, ws in cluster.workers.items()}

    @property
    def desired(self) -> dict[Key, Desired]:
        """Governed keys in memory -> what they want."""
        return self.index.desired

    # -- set-up --------------------------------------------------------------------------

    def classify(self, keys: Iterable[Key]) -> None:
        """Resolve keys (again) and file them: governed ones in the index, the others
        among the keys reduce-replicas walks if they hold several copies."""
        tasks = self.cluster.tasks
        index = self.index
        for key in keys:
            ts = tasks.get(key)
            if ts is None or ts.state != "memory" or not ts.who_has:
                index.forget(key)
                continue
            desired = self.classifier.resolve(ts, index.runtime.get(key))
            if desired.governed:
                index.put(key, ts, desired)
            else:
                index.unindex(key)
                if len(ts.who_has) > 1:
                    index.replicated_free[key] = ts
                else:
                    index.replicated_free.pop(key, None)

    def kill(self, addresses: Iterable[str]) -> list[SimTask]:
        """Workers die before the next cycle. Returns the keys that lost their last copy."""
        lost = self.cluster.remove_workers(addresses)
        for ts in lost:
            self.index.forget(ts.key)
        self._workers_changed = self._full = True
        self._refresh()
        return lost

    def _refresh(self) -> None:
        if self.placements.refresh(self.measure, self._workers_changed):
            self._full = True
        self._workers_changed = False

    # -- running -------------------------------------------------------------------------

    def run(self, max_cycles: int | None = None) -> Result:
        """Cycles until settled or ``max_cycles`` (default :data:`MAX_CYCLES`)."""
        limit = MAX_CYCLES if max_cycles is None else max_cycles
        settled = False
        while self.cycle < limit:
            if not self.step():
                settled = True
                break
        if not settled:
            settled = self._at_rest()
        return Result(
            cycles=self.cycle,
            settled=settled,
            actions=list(self.actions),
            dry_run=list(self._held.values()),
            keys=self.final_states(),
            before=dict(self.initial_memory),
            after=self.cluster.measure(self.measure),
            pools=dict(self.initial_pools),
            warnings=list(self.warnings),
        )

    def step(self) -> bool:
        """One AMM cycle. False if it changed nothing and nothing is in flight."""
        self.cycle += 1
        self.now = self.cycle * self.interval
        self._cycle_actions = []
        self._refresh()
        self.amm.run_once()
        enacted = self.cluster.enact()
        touched = self.cluster.take_touched()
        if self.classifier.replicas_sensitive:
            self.classify(touched)
        self._absorb(touched)
        self.actions.extend(self._cycle_actions)
        if enacted:
            self.last_active = self.cycle
        return bool(enacted) or bool(self.index.inflight) or bool(self.rebalancer.book.pending)

    def _absorb(self, touched: set[Key]) -> None:
        """Keys whose copies changed: governed ones are planned next cycle, the others
        join (or leave) reduce-replicas' walk (as the policy routes them)."""
        index, tasks = self.index, self.cluster.tasks
        for key in touched:
            if key in index.desired:
                index.recheck.add(key)
                continue
            ts = tasks[key]
            if ts.who_has is not None and len(ts.who_has) > 1:
                index.replicated_free[key] = ts
            else:
                index.replicated_free.pop(key, None)

    def _at_rest(self) -> bool:
        """Nothing would happen in the next cycle (after a run stopped by its limit)."""
        return (
            not self.index.inflight
            and not self.rebalancer.book.pending
            and not any(s.pending for s in self.final_states().values())
        )

    # -- the policy's cycle --------------------------------------------------------------

    def _cycle(self) -> Generator[Suggestion, Any, None]:
        """What RulesPolicy yields in one cycle: replication of governed keys,
        rebalancing, reduce-replicas of the others; dry-run held back."""
        stats: defaultdict[str, Counter[str]] = defaultdict(Counter)
        index = self.index
        yield from self.dry.replication(self._replicate(), index.desired, stats)
        if not self.rebalancer.idle:
            moves = self.rebalancer.run(
                self.cluster,
                self.amm,
                now=self.now,
                desired=index.desired,
                inflight=index.inflight,
                cluster=self.cluster_view,
                stats=stats,
            )
            recorded = self._record(moves, REBALANCE_LABEL)
            yield from self.dry.rebalancing(recorded, index.desired, stats)
        if self.ruleset.reduce_replicas:
            drops = reduce_replicas(index, self.amm.pending, self.rebalancer.moving, stats)
            yield from self._record(drops, DEFAULT_SOURCE)

    def cluster_view(self) -> ClusterView:
        """The planner's view of the workers: memory is the AMM's tally during a cycle,
        else each worker's measure."""
        memory = getattr(self.amm, "workers_memory", None)
        if memory is None:
            memory = {ws: getattr(ws.memory, self.measure) for ws in self.cluster.workers.values()}
        return self.placements.cluster_view(memory)

    def _todo(self) -> list[Key]:
        """Governed keys to plan, as the policy picks them: after workers changed (or when
        a pool reads worker memory) every key that fails the index's cheap check, else
        those of the keys whose copies changed or were left to look at again, plus the
        keys with copies in flight."""
        index, placements = self.index, self.placements
        reduce = self.ruleset.reduce_replicas
        recheck, index.recheck = index.recheck, set()
        todo: dict[Key, None] = {}
        if self._full or self._volatile:
            for cls in index.groups:
                todo.update(
                    (ts.key, None) for ts in index.suspects(cls, placements.of(cls), reduce)
                )
        else:
            found = index.suspects_among(recheck, placements.of, reduce)
            todo.update((ts.key, None) for ts in found)
        self._full = False
        todo.update(dict.fromkeys(index.inflight))
        return [k for k in todo if k in index.desired]

    def _replicate(self) -> Generator[Suggestion, Any, None]:
        """The policy's replication planning, for the governed keys that may need it."""
        keys = self._todo()
        if not keys:
            return
        index = self.index
        cluster = self.cluster_view()
        settings = self.settings()
        pending = self.amm.pending
        tasks, workers = self.cluster.tasks, self.cluster.workers
        moving = self.rebalancer.moving
        for key in keys:
            ts = tasks[key]
            desired = index.desired[key]
            view = key_view(
                ts, desired, index.inflight.get(key, {}), index.backoff.get(key, {}), pending
            )
            plan = plan_key(view, cluster, settings)
            dry = self.dry.label(desired) is not None
            refused = False
            for action in plan.actions:
                if action.op == "drop" and key in moving:
                    plan.deferred.append(f"drop from {action.worker} waits: key mid-move")
                    continue
                suggestion = Suggestion(action.op, ts, {workers[action.worker]})
                accepted = (yield suggestion) is not None
                self._note(
                    action.op, ts, action.worker, action.source, action.reason, dry, accepted
                )
                if not accepted:
                    refused = True
                    if action.op == "replicate":
                        plan.inflight.pop(action.worker, None)
            self.index.store_plan(key, plan)
            if (
                refused
                or plan.deferred
                or plan.backoff
                or (desired.replicate is None and len(plan.good) + len(plan.misplaced) > 1)
            ):
                index.recheck.add(key)

    def _record(
        self, suggestions: Generator[Suggestion, Any, Any], label: str
    ) -> Generator[Suggestion, Any, None]:
        """Suggestions of rebalancing or reduce-replicas, passed on and noted with their
        answers (the worker the AMM chose, or None)."""
        answer = None
        try:
            while True:
                try:
                    s = suggestions.send(answer)
                except StopIteration:
                    return
                answer = yield s
                ts = s.ts
                worker = answer.address if answer is not None else None
                if worker is None and s.candidates:
                    worker = next(iter(s.candidates)).address
                if worker is None:
                    continue
                if label == REBALANCE_LABEL:
                    dry = self.dry.rebalance or self.dry.label(self.index.desired.get(ts.key))
                    why = "rebalance: move" if s.op == "replicate" else "rebalance: copy landed"
                else:
                    dry = False
                    why = f"{len(ts.who_has or ())} copies; no rule governs the key"
                self._note(s.op, ts, worker, label, why, bool(dry), answer is not None)
        finally:
            suggestions.close()

    def _note(
        self, op: str, ts: SimTask, worker: str, rule: str, reason: str, dry: bool, accepted: bool
    ) -> None:
        action = SimAction(op, ts.key, worker, rule, ts.nbytes, self.cycle, reason, dry)
        if dry and not accepted:
            self._held.setdefault((op, ts.key, worker), action)
        elif accepted:
            self._cycle_actions.append(action)

    def settings(self) -> PlanSettings:
        timeout = max(3.0 * self.interval, 10.0)
        return PlanSettings(
            now=self.now,
            inflight_timeout=timeout,
            backoff=timeout,
            reduce_replicas=self.ruleset.reduce_replicas,
        )

    # -- where things stand ----------------------------------------------------------------

    def final_states(self) -> dict[Key, KeyState]:
        """Where each governed key stands, nothing enacted: its copies, whether its
        target is met, copies still misplaced, actions still due. Keys that pass the
        index's cheap check in a class that can be met are at rest; the others are
        planned once more to say why."""
        index, placements = self.index, self.placements
        reduce = self.ruleset.reduce_replicas
        cluster = self.cluster_view()
        settings = self.settings()
        tasks = self.cluster.tasks
        out = {}
        for cls, group in index.groups.items():
            if placements.class_unmet(cls):
                look = set(group)
            else:
                look = {ts.key for ts in index.suspects(cls, placements.of(cls), reduce)}
            for key, ts in group.items():
                desired = index.desired[key]
                state = KeyState(key, desired, len(ts.who_has or ()), cls.source)
                if key in look:
                    plan = plan_key(key_view(tasks[key], desired, {}, {}), cluster, settings)
                    state.unmet = plan.unmet
                    state.misplaced = dict(plan.misplaced)
                    if self.dry.label(desired) is None:
                        state.pending = len(plan.actions)
                out[key] = state
        return out

    def below_target(self) -> list[tuple[SimTask, Desired, int]]:
        """Governed keys with fewer copies than their target's minimum: (task, wishes,
        minimum)."""
        out = []
        for key, desired in self.index.desired.items():
            ts = self.cluster.tasks[key]
            if desired.move == "never":
                continue
            eligible = self.placements.of(PlanClass.of(desired)).achievable  # for ``all``
            lo, _ = target_bounds(desired, 0, self.ruleset.reduce_replicas, eligible)
            if len(ts.who_has or ()) < lo:
                out.append((ts, desired, lo))
        return out

    # -- problems ------------------------------------------------------------------------

    def _once(self, token: Any, message: str) -> None:
        if token not in self._reported:
            self._reported.add(token)
            self.warnings.append(message)

    def _rule_error(self, rule: Rule, exc: Exception) -> None:
        self._once(
            ("rule", rule.name),
            f"the match of rule '{rule.name}' raised {exc!r}; treated as no match",
        )

    def _bad_annotation(self, value: Any, exc: Exception, key: Key, name: str = "amm") -> None:
        # ``name``: ``amm``, or ``replicate`` (its shorthand), as the classifier says.
        shown = bounded_repr(value, 200)
        self._once(
            ("annotation", name, shown),
            f"ignoring invalid {name} annotation {shown} (key {key!s}): {exc}",
        )

    def _rebalance_error(self, exc: Exception) -> None:
        self._once("rebalance.match", f"rebalance.match raised {exc!r}; the key is not moved")

    def _pool_error(self, pool: Any, exc: Exception) -> None:
        self._once(("pool", pool.name), f"the expression of pool '{pool.name}' raised {exc!r}")


class _Cycle(ActiveMemoryManagerPolicy):
    """The simulation as a policy of the AMM: its ``run`` is one cycle."""

    def __init__(self, simulation: Simulation):
        self.simulation = simulation

    def run(self) -> Generator[Suggestion, Any, None]:
        return self.simulation._cycle()

    def __repr__(self) -> str:
        return "SimulatedRulesPolicy()"


def runtime_targets(state: Any) -> dict[Key, RuntimeTarget]:
    """The runtime targets a dump recorded (see :attr:`ClusterState.runtime`), as the
    engine holds them: each with its origin."""
    origins = getattr(state, "runtime_origins", {})
    return {
        key: RuntimeTarget(Target(lo, hi), origins.get(key, "runtime"))
        for key, (lo, hi) in state.runtime.items()
    }


def amm_defaults() -> tuple[str, float]:
    """The AMM's measure and interval from the dask config (distributed's defaults)."""
    import dask
    from dask.utils import parse_timedelta

    prefix = "distributed.scheduler.active-memory-manager"
    measure = dask.config.get(f"{prefix}.measure", DEFAULT_MEASURE)
    interval = parse_timedelta(dask.config.get(f"{prefix}.interval", DEFAULT_INTERVAL))
    return str(measure), float(interval or DEFAULT_INTERVAL)
