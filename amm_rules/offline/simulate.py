"""The simulator: the engine's planning, cycle after cycle, on a recorded cluster.

:class:`Simulation` holds a :class:`~amm_rules.offline.views.SimCluster` (a dump, a
running scheduler's state or a test fixture) and runs on it what the scheduler runs each
Active Memory Manager cycle, with the engine's own parts:

- the classifier (:class:`~amm_rules.engine.classify.Classifier`, the rules' cascade)
  and pool membership (:func:`~amm_rules.engine.view.pool_membership`);
- the replication planner (:func:`~amm_rules.engine.planner.plan_key`) for governed keys,
  the rebalancer (:class:`~amm_rules.engine.rebalance.rebalancer.Rebalancer`, with the
  pure rebalance planner), and the stock reduce-replicas arithmetic
  (:func:`~amm_rules.engine.planner.reduce_replicas_excess`) for keys nobody governs;
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

from amm_rules.engine.classify import Classifier
from amm_rules.engine.dryrun import REBALANCE_LABEL, DryRun
from amm_rules.engine.planner import (
    DEFAULT_SOURCE,
    KeyPlan,
    PlanSettings,
    plan_key,
    reduce_replicas_excess,
    source_label,
    target_bounds,
)
from amm_rules.engine.rebalance.rebalancer import Rebalancer
from amm_rules.engine.view import ClusterView, stock_waiter_count
from amm_rules.language.ruleset import Desired, Rule, Ruleset, Target
from amm_rules.offline.views import SimCluster, SimTask, cluster_view, key_view, pools_of

logger = logging.getLogger(__name__)

Key = Hashable
#: The AMM's defaults (distributed's config), used when no dask config says otherwise.
DEFAULT_INTERVAL = 2.0
DEFAULT_MEASURE = "optimistic"
#: Cycles after which a run that has not settled stops (and says so).
MAX_CYCLES = 1_000


@dataclass(frozen=True)
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


@dataclass
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
        runtime: Mapping[Key, Target] | None = None,
    ):
        self.ruleset = ruleset
        self.cluster = cluster
        self.measure = measure
        self.interval = interval
        #: Runtime targets (as ``amm_rules.replicate`` sets them), by key.
        self.runtime = dict(runtime or {})
        self.warnings: list[str] = []
        self.classifier = Classifier(
            ruleset, on_rule_error=self._rule_error, on_invalid_annotation=self._bad_annotation
        )
        self.dry = DryRun(ruleset)
        self.rebalancer = Rebalancer()
        self.rebalancer.configure(ruleset.rebalance, self._rebalance_error)
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
        #: Governed keys in memory -> what they want.
        self.desired: dict[Key, Desired] = {}
        self.inflight: dict[Key, dict[str, float]] = {}
        self.backoff: dict[Key, dict[str, float]] = {}
        #: Governed keys to plan in the next cycle (None: all of them).
        self._todo: set[Key] | None = None
        self._recheck: set[Key] = set()
        self._pools: dict[str, frozenset[str]] = {}
        self._pools_stale = True
        self.actions: list[SimAction] = []
        self._held: dict[tuple[str, Key, str], SimAction] = {}
        self._cycle_actions: list[SimAction] = []
        self._reported: set[Any] = set()
        #: Keys nobody governs with more than one copy (what reduce-replicas walks).
        self._replicated_free: dict[Key, SimTask] = {}
        #: The last cycle that enacted something.
        self.last_active = 0
        self.classify(k for k in cluster.tasks)
        #: Memory (by the AMM's measure) and pools of every worker before the first cycle.
        self.initial_memory = cluster.measure(measure)
        self.initial_pools = dict(self.pools)
        #: Address -> (name, host) of every worker there was (killed ones included).
        self.names = {a: (str(ws.name), ws.host) for a, ws in cluster.workers.items()}

    # -- set-up --------------------------------------------------------------------------

    def classify(self, keys: Iterable[Key]) -> None:
        """Resolve keys (again) and file the governed ones."""
        tasks = self.cluster.tasks
        for key in keys:
            ts = tasks.get(key)
            if ts is None or ts.state != "memory" or not ts.who_has:
                self._forget(key)
                continue
            desired = self.classifier.resolve(ts, self.runtime.get(key))
            if desired.governed:
                self.desired[key] = desired
                self._replicated_free.pop(key, None)
            else:
                self._forget(key)
                if len(ts.who_has) > 1:
                    self._replicated_free[key] = ts

    def _forget(self, key: Key) -> None:
        self._replicated_free.pop(key, None)
        self.desired.pop(key, None)
        self.inflight.pop(key, None)
        self.backoff.pop(key, None)

    def kill(self, addresses: Iterable[str]) -> list[SimTask]:
        """Workers die before the next cycle. Returns the keys that lost their last copy."""
        lost = self.cluster.remove_workers(addresses)
        for ts in lost:
            self._forget(ts.key)
        self._pools_stale = True
        self._todo = None
        return lost

    @property
    def pools(self) -> dict[str, frozenset[str]]:
        """Address -> pools, as the policy computes them (again when workers changed, or
        every cycle if a pool reads worker memory)."""
        if self._pools_stale or self._volatile_pools:
            self._pools = pools_of(
                self.cluster, self.ruleset.pools, self.measure, self._pool_error
            )
            self._pools_stale = False
        return self._pools

    @property
    def _volatile_pools(self) -> bool:
        return any({"memory", "memory_fraction"} & p.depends for p in self.ruleset.pools.values())

    # -- running -------------------------------------------------------------------------

    def run(self, max_cycles: int | None = None) -> Result:
        """Cycles until settled or ``max_cycles`` (default :data:`MAX_CYCLES`)."""
        limit = MAX_CYCLES if max_cycles is None else max_cycles
        settled = False
        while self.cycle < limit:
            if not self.step():
                settled = True
                break
        if not settled and self.cycle >= limit:
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
        self.amm.run_once()
        enacted = self.cluster.enact()
        touched = self.cluster.take_touched()
        if self.classifier.replicas_sensitive:
            self.classify(touched)
        tasks = self.cluster.tasks
        for key in touched:
            ts = tasks[key]
            if key in self.desired or ts.who_has is None or len(ts.who_has) < 2:
                self._replicated_free.pop(key, None)
            else:
                self._replicated_free[key] = ts
        self._recheck |= touched
        self.actions.extend(a for a in self._cycle_actions if not a.dry_run)
        if enacted:
            self.last_active = self.cycle
        return bool(enacted) or bool(self.inflight) or bool(self.rebalancer.book.pending)

    def _at_rest(self) -> bool:
        """Nothing would happen in the next cycle (after a run stopped by its limit)."""
        return (
            not self.inflight
            and not self.rebalancer.book.pending
            and not any(s.pending for s in self.final_states().values())
        )

    # -- the policy's cycle --------------------------------------------------------------

    def _cycle(self) -> Generator[Suggestion, Any, None]:
        """What RulesPolicy yields in one cycle: replication of governed keys,
        rebalancing, reduce-replicas of the others; dry-run held back."""
        stats: defaultdict[str, Counter[str]] = defaultdict(Counter)
        yield from self.dry.replication(self._replicate(), self.desired, stats)
        if not self.rebalancer.idle:
            view: list[ClusterView] = []

            def cluster() -> ClusterView:
                if not view:
                    view.append(cluster_view(self.cluster, self.pools, None, self.measure))
                return view[0]

            moves = self.rebalancer.run(
                self.cluster,
                self.amm,
                now=self.now,
                desired=self.desired,
                inflight=self.inflight,
                cluster=cluster,
                stats=stats,
            )
            yield from self.dry.rebalancing(self._record(moves), self.desired, stats)
        if self.ruleset.reduce_replicas:
            yield from self._reduce_replicas()

    def _todo_keys(self) -> list[Key]:
        if self._todo is None:
            todo: Iterable[Key] = self.desired
        else:
            todo = self._todo | self._recheck | self.inflight.keys()
        self._todo, self._recheck = set(), set()
        return [k for k in todo if k in self.desired]

    def _replicate(self) -> Generator[Suggestion, Any, None]:
        """The policy's replication planning, for the governed keys that may need it."""
        keys = self._todo_keys()
        if self._volatile_pools:
            keys = list(self.desired)
        if not keys:
            return
        cluster = cluster_view(self.cluster, self.pools, self.amm.workers_memory, self.measure)
        settings = self.settings()
        pending = self.amm.pending
        tasks, workers = self.cluster.tasks, self.cluster.workers
        moving = self.rebalancer.moving
        for key in keys:
            ts = tasks[key]
            desired = self.desired[key]
            view = key_view(
                ts,
                desired,
                inflight=self.inflight.get(key),
                backoff=self.backoff.get(key),
                pending=pending,
            )
            plan = plan_key(view, cluster, settings)
            dry = self.dry.label(desired) is not None
            refused = False
            for action in plan.actions:
                if action.op == "drop" and key in moving:
                    plan.deferred.append(f"drop from {action.worker} waits: key mid-move")
                    continue
                accepted = (yield Suggestion(action.op, ts, {workers[action.worker]})) is not None
                self._note(
                    action.op, ts, action.worker, action.source, action.reason, dry, accepted
                )
                if not accepted:
                    refused = True
                    if action.op == "replicate":
                        plan.inflight.pop(action.worker, None)
            self._store(key, plan)
            if (
                refused
                or plan.deferred
                or plan.backoff
                or (desired.replicate is None and len(plan.good) + len(plan.misplaced) > 1)
            ):
                self._recheck.add(key)

    def _store(self, key: Key, plan: KeyPlan) -> None:
        for table, value in ((self.inflight, plan.inflight), (self.backoff, plan.backoff)):
            if value:
                table[key] = value
            else:
                table.pop(key, None)

    def _record(
        self, suggestions: Generator[Suggestion, Any, None]
    ) -> Generator[Suggestion, Any, None]:
        """Rebalancing's suggestions, passed on and noted with their answers."""
        answer = None
        try:
            while True:
                try:
                    s = suggestions.send(answer)
                except StopIteration:
                    return
                answer = yield s
                (ws,) = s.candidates
                dry = self.dry.rebalance or self.dry.label(self.desired.get(s.ts.key)) is not None
                reason = "rebalance: move" if s.op == "replicate" else "rebalance: copy landed"
                self._note(
                    s.op, s.ts, ws.address, REBALANCE_LABEL, reason, dry, answer is not None
                )
        finally:
            suggestions.close()

    def _reduce_replicas(self) -> Generator[Suggestion, Any, None]:
        """The stock ReduceReplicas for keys nobody governs (the AMM picks the worker)."""
        pending = self.amm.pending
        moving = self.rebalancer.moving
        for key, ts in list(self._replicated_free.items()):
            who_has = ts.who_has
            if who_has is None or len(who_has) < 2 or key in moving:
                continue
            excess = reduce_replicas_excess(len(who_has), stock_waiter_count(ts))
            entry = pending.get(ts)
            if entry is not None:
                excess += len(entry[0]) - len(entry[1])
            for _ in range(max(0, excess)):
                ws = yield Suggestion("drop", ts)
                if ws is not None:
                    why = f"{len(who_has)} copies, no rule governs the key"
                    self._note("drop", ts, ws.address, DEFAULT_SOURCE, why, False, True)

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
        """Each governed key planned once more, nothing enacted: its copies, whether its
        target is met, copies still misplaced, actions still due."""
        cluster = cluster_view(self.cluster, self.pools, None, self.measure)
        settings = self.settings()
        out = {}
        for key, desired in self.desired.items():
            ts = self.cluster.tasks[key]
            plan = plan_key(key_view(ts, desired), cluster, settings)
            pending = [a for a in plan.actions if self.dry.label(desired) is None]
            out[key] = KeyState(
                key=key,
                desired=desired,
                copies=len(ts.who_has or ()),
                rule=source_label(desired, "replicate"),
                unmet=plan.unmet,
                misplaced=dict(plan.misplaced),
                pending=len(pending),
            )
        return out

    def below_target(self) -> list[tuple[SimTask, Desired, int]]:
        """Governed keys with fewer copies than their target's minimum: (task, wishes,
        minimum)."""
        out = []
        for key, desired in self.desired.items():
            ts = self.cluster.tasks[key]
            if desired.move == "never":
                continue
            lo, _ = target_bounds(desired, 0, self.ruleset.reduce_replicas)
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

    def _bad_annotation(self, value: Any, exc: Exception, key: Key) -> None:
        self._once(
            ("annotation", repr(value)[:200]),
            f"ignoring invalid amm annotation {repr(value)[:200]} (key {key!s}): {exc}",
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


def amm_defaults() -> tuple[str, float]:
    """The AMM's measure and interval from the dask config (distributed's defaults)."""
    import dask
    from dask.utils import parse_timedelta

    prefix = "distributed.scheduler.active-memory-manager"
    measure = dask.config.get(f"{prefix}.measure", DEFAULT_MEASURE)
    interval = parse_timedelta(dask.config.get(f"{prefix}.interval", DEFAULT_INTERVAL))
    return str(measure), float(interval or DEFAULT_INTERVAL)
