"""The simulator: the engine's cycle, cycle after cycle, on a recorded cluster.

:class:`Simulation` holds a :class:`~amm_rules.offline.sim_cluster.SimCluster` (a dump, a
running scheduler's state or a test fixture) and runs on it the engine itself: an
:class:`~amm_rules.engine.context.EngineContext` whose scheduler is the recorded cluster,
whose clock is the simulation's and whose AMM is distributed's own
``ActiveMemoryManagerExtension`` (which validates each suggestion and keeps the memory
tally, exactly as in the scheduler), and the engine's sections that a recorded cluster
can run (:data:`SIMULATED`: classification, replication, rebalancing, the recompute
estimates and ``protect:`` from the task groups the dump recorded, reduce-replicas), in
the policy's order, on the same :class:`~amm_rules.engine.sections.base.Cycle`.

Nothing of the cycle is written twice: what the simulation did is read from the
engine's own journal (and, for reduce-replicas' drops, from the AMM's answers), its
warnings from the engine's events. The sections it cannot run (paused workers, memory
pressure, ... ) are named in the result when the rules use them
(:attr:`Result.not_simulated`).

Between two cycles every accepted copy lands and every accepted drop happens (the
transfers of a real cluster usually finish within the AMM's two seconds); the
computation is frozen (no task runs or is released). The clock advances by the AMM's
interval per cycle, so in-flight deadlines, back-offs and rebalancing's cool-down count
in simulated seconds. A run stops when a cycle enacts nothing and nothing is in flight
(settled), or after ``max_cycles`` (``cycles=1``: exactly the next cycle's suggestions).

Neighbours: :mod:`amm_rules.offline.sim_cluster` builds the cluster; :mod:`.report` renders
a :class:`Result`; :mod:`.diff` and :mod:`.ruletests` run simulations of their own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Hashable, Iterable, Mapping
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any

from distributed.active_memory_manager import (
    ActiveMemoryManagerExtension,
    ActiveMemoryManagerPolicy,
    Suggestion,
)

from amm_rules.engine.adapters import key_view
from amm_rules.engine.context import EngineContext
from amm_rules.engine.decide.plan import DEFAULT_SOURCE, plan_key, target_bounds
from amm_rules.engine.dryrun import HELD_BACK
from amm_rules.engine.events import EventLog
from amm_rules.engine.sections import SECTIONS, Cycle, steps
from amm_rules.engine.sections.classification import Classification
from amm_rules.engine.sections.costs import RecomputeCostsSection
from amm_rules.engine.sections.protect import ProtectSection
from amm_rules.engine.sections.rebalance import RebalanceSection
from amm_rules.engine.sections.reduce_replicas import ReduceReplicasSection
from amm_rules.engine.sections.replication import Replication
from amm_rules.engine.state.governed import PlanClass
from amm_rules.engine.state.journal import Journal
from amm_rules.engine.state.placement import VOLATILE_WORKER_ATTRIBUTES
from amm_rules.engine.words import counted
from amm_rules.language.ruleset import Desired, Ruleset, RuntimeTarget, Target
from amm_rules.offline.dump import ClusterState
from amm_rules.offline.sim_cluster import SimCluster, SimTask

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


@dataclass(slots=True)
class KeyState:
    """Where a governed key stands at the end of a run."""

    key: Key
    desired: Desired
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
    #: The sections of the engine the rules use that a simulation does not run, each
    #: with why (see :attr:`~amm_rules.engine.sections.base.Section.offline`).
    not_simulated: list[str] = field(default_factory=list)


def offline_context(
    ruleset: Ruleset,
    cluster: SimCluster,
    *,
    clock: Callable[[], float],
    policies: set[Any],
    measure: str = DEFAULT_MEASURE,
    interval: float = DEFAULT_INTERVAL,
    runtime: Mapping[Key, Target | RuntimeTarget] | None = None,
    events: EventLog | None = None,
    journal: Journal | None = None,
) -> EngineContext:
    """An engine context on a recorded cluster, as the policy has it once attached: the
    rules installed, the runtime targets set, distributed's own AMM over the cluster
    (running ``policies``), every key in memory classified at once (by the engine's own
    classification), keys with several copies to look at in the first cycle. ``clock``
    is the context's; ``events`` and ``journal`` replace the engine's own."""
    ctx = EngineContext(
        inflight_timeout=None,
        summary_interval=0.0,
        early_cycle_delay=0.0,
        early_cycle_gap=None,
        retire_by_rules=False,
    )
    ctx.clock = clock
    if events is not None:
        ctx.events = events
    if journal is not None:
        ctx.journal = journal
    ctx.install(ruleset)
    # The spans' states as recorded (task.span_done).
    for path, done in cluster.span_states().items():
        ctx.spans.set(path, done)
    index = ctx.index
    for k, t in (runtime or {}).items():
        index.set_runtime_target(k, t if isinstance(t, RuntimeTarget) else RuntimeTarget(t))
    ctx.placements.attach(cluster.workers)
    ctx.manager = ActiveMemoryManagerExtension(
        # A recorded cluster stands in for the scheduler, which distributed's AMM
        # types nominally (it reads only tasks, workers and their memory).
        cluster,  # type: ignore[arg-type]
        policies,
        measure=measure,
        register=False,
        start=False,
        interval=interval,
    )
    index.attach(cluster.tasks, cluster.workers)
    index.queue(ts.key for ts in cluster.in_memory())
    index.classify(ctx.classifier, cluster.tasks, index.unclassified, None, None)
    index.touch(ts.key for ts in cluster.in_memory() if len(ts.who_has or ()) > 1)
    return ctx


#: The engine's sections a recorded cluster can run.
SIMULATED = frozenset(
    {
        RecomputeCostsSection,
        Classification,
        Replication,
        RebalanceSection,
        ProtectSection,
        ReduceReplicasSection,
    }
)


class Simulation:
    """The engine's cycle on a :class:`SimCluster` (see the module docstring)."""

    #: The sections the simulation runs: the engine's own, on the recorded cluster, in
    #: the engine's order.
    SECTIONS = tuple(cls for cls in SECTIONS if cls in SIMULATED)

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
        self.cycle = 0
        self.now = 0.0
        #: The engine's context on the recorded cluster: its own index, placements,
        #: classifier and dry-run; the clock is the simulation's; events become
        #: warnings, and the journal records what the cycle did.
        self.ctx = ctx = offline_context(
            ruleset,
            cluster,
            clock=lambda: self.now,
            policies={_Cycle(self)},
            measure=measure,
            interval=interval,
            runtime=runtime,
            events=_Warnings(self.warnings),
            journal=_Record(self),
        )
        assert ctx.manager is not None
        self.amm = ctx.manager
        self.sections = tuple(
            Classification(ctx, classify_seconds=None) if cls is Classification else cls(ctx)
            for cls in self.SECTIONS
        )
        for section in self.sections:
            section.configure(ruleset, ctx.dry_run)
            section.attach()
        # The recompute estimates of the keys in memory, and who holds which alone (once
        # the sections said whether the costs keep keys per group).
        in_memory = list(cluster.in_memory())
        costs = ctx.costs
        costs.seed(in_memory, track=costs.track_keys)
        costs.refresh(cluster.task_groups)
        #: A pool reads worker memory: pools change as copies land; plan every key.
        self._volatile = any(
            not VOLATILE_WORKER_ATTRIBUTES.isdisjoint(p.depends) for p in ruleset.pools.values()
        )
        #: The last cycle that enacted something.
        self.last_active = 0
        self._full = True
        self._workers_changed = True
        self.actions: list[SimAction] = []
        self._held: dict[tuple[str, Key, str], SimAction] = {}
        self._cycle_actions: list[SimAction] = []
        self._refresh()
        #: Memory (by the AMM's measure) and pools of every worker before the first cycle.
        self.initial_memory = cluster.measure(measure)
        self.initial_pools = dict(ctx.placements.pools)
        #: Keys in memory and their bytes, and governed keys, before the first cycle.
        self.initial_keys = (len(in_memory), sum(ts.nbytes for ts in in_memory))
        self.initial_governed = len(ctx.index.desired)
        #: Address -> (name, host) of every worker there was (killed ones included).
        self.names = {a: (str(ws.name), ws.host) for a, ws in cluster.workers.items()}

    @property
    def desired(self) -> Mapping[Key, Desired]:
        """Governed keys in memory -> what they want."""
        return self.ctx.index.desired

    @classmethod
    def of(
        cls, ruleset: Ruleset, state: Any, *, measure: str, interval: float = DEFAULT_INTERVAL
    ) -> Simulation:
        """A simulation of ``ruleset`` on a recorded cluster (a
        :class:`~amm_rules.offline.dump.ClusterState`), with its runtime targets."""
        return cls(
            ruleset,
            SimCluster(state),
            measure=measure,
            interval=interval,
            runtime=runtime_targets(state),
        )

    def kill(self, addresses: Iterable[str]) -> list[SimTask]:
        """Workers die before the next cycle. Returns the keys that lost their last copy.
        Governed keys that lost a copy are given up in flight from the dead workers, as
        the engine's replica hooks have it."""
        index = self.ctx.index
        dead = {a for a in addresses if a in self.cluster.workers}
        hit = {ts.key for a in dead for ts in self.cluster.workers[a].has_what}
        lost = self.cluster.remove_workers(dead)
        gone = {ts.key for ts in lost}
        for key in gone:
            index.forget(key)
        index.departing.lost_holders(k for k in hit - gone if k in index.desired)
        self._workers_changed = self._full = True
        self._refresh()
        return lost

    def _refresh(self) -> None:
        if self.ctx.placements.refresh(self.measure, self._workers_changed):
            self._full = True
        self._workers_changed = False

    # -- running -------------------------------------------------------------------------

    def run(self, max_cycles: int | None = None) -> Result:
        """Cycles until settled or ``max_cycles`` (default :data:`MAX_CYCLES`)."""
        limit = MAX_CYCLES if max_cycles is None else max_cycles
        while self.cycle < limit:
            if not self.step():
                settled = True
                break
        else:
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
            not_simulated=self.not_simulated(),
        )

    def step(self) -> bool:
        """One AMM cycle. False if it changed nothing and nothing is in flight."""
        self.cycle += 1
        self.now = self.cycle * self.interval
        self._cycle_actions = []
        self._refresh()
        self.amm.run_once()
        enacted = self.cluster.enact()
        # What the engine's replica hooks would have seen: the next cycle routes them.
        self.ctx.index.touch(self.cluster.take_touched())
        self.actions.extend(self._cycle_actions)
        if enacted:
            self.last_active = self.cycle
        return bool(enacted) or self._in_flight()

    def _in_flight(self) -> bool:
        """Copies the engine, or rebalancing, still waits for."""
        rebalance = self.sections[self.SECTIONS.index(RebalanceSection)]
        assert isinstance(rebalance, RebalanceSection)
        return bool(self.ctx.ledger.copies) or bool(rebalance.rebalancer.book.pending)

    def _at_rest(self) -> bool:
        """Nothing would happen in the next cycle (after a run stopped by its limit)."""
        return not self._in_flight() and not any(s.pending for s in self.final_states().values())

    # -- the policy's cycle --------------------------------------------------------------

    def _cycle(self) -> Generator[Suggestion, Any, None]:
        """What RulesPolicy yields in one cycle: its sections that a recorded cluster can
        run, in the policy's order, on one :class:`~amm_rules.engine.sections.base.Cycle`."""
        cycle = Cycle(self._full or self._volatile, self.now, time.perf_counter())
        self._full = False
        for section in steps(self.ctx, cycle, self.sections):
            if isinstance(section, ReduceReplicasSection):
                # Not journalled by the engine (a drop per excess copy): noted here.
                yield from self._record(section.run(cycle))
            else:
                yield from section.run(cycle)

    def _record(self, suggestions: Iterable[Suggestion]) -> Generator[Suggestion, Any, None]:
        """reduce-replicas' drops (a generator, or ``()`` when it is off), passed on and
        noted with their answers."""
        if not isinstance(suggestions, Generator):
            yield from suggestions
            return
        with closing(suggestions):
            answer = None
            while True:
                try:
                    s = suggestions.send(answer)
                except StopIteration:
                    return
                answer = yield s
                if answer is not None and answer.address is not None:
                    why = f"{counted(len(s.ts.who_has or ()), 'copy')}; no rule governs the key"
                    self.note(s.op, s.ts.key, answer.address, DEFAULT_SOURCE, why, "accepted")

    def note(self, op: str, key: Key, worker: str, rule: str, reason: str, outcome: str) -> None:
        """One decision of the cycle, as the engine journals it (``outcome``:
        ``accepted``, ``refused`` or ``dry-run``)."""
        ts = self.cluster.tasks.get(key)
        nbytes = ts.nbytes if ts is not None else 0
        action = SimAction(op, key, worker, rule, nbytes, self.cycle, reason)
        if outcome == HELD_BACK:
            self._held.setdefault((op, key, worker), action)
        elif outcome == "accepted":
            self._cycle_actions.append(action)

    def not_simulated(self) -> list[str]:
        """Why each section of the engine that the rules use is not run here."""
        return [
            cls.offline
            for cls in SECTIONS
            if cls not in self.SECTIONS and cls.offline and cls.in_use(self.ruleset)
        ]

    # -- where things stand ----------------------------------------------------------------

    def final_states(self) -> dict[Key, KeyState]:
        """Where each governed key stands, nothing enacted: its copies, whether its
        target is met, copies still misplaced, actions still due. Keys that pass the
        index's cheap check in a class that can be met are at rest; the others are
        planned once more to say why."""
        index, placements = self.ctx.index, self.ctx.placements
        reduce = self.ruleset.reduce_replicas
        cluster = self.ctx.cluster_view()
        settings = self.ctx.settings(self.now)
        out = {}
        for cls, group in index.governed.groups.items():
            if placements.class_unmet(cls):
                look = set(group)
            else:
                look = {ts.key for ts in index.governed.suspects(cls, placements.of(cls), reduce)}
            for key, ts in group.items():
                desired = index.desired[key]
                state = KeyState(key, desired, cls.source)
                if key in look:
                    plan = plan_key(key_view(ts, desired, {}, {}), cluster, settings)
                    state.unmet = plan.unmet
                    state.misplaced = dict(plan.misplaced)
                    if self.ctx.dry_run.label(desired) is None:
                        state.pending = len(plan.actions)
                out[key] = state
        return out

    def below_target(self) -> list[tuple[SimTask, Desired, int]]:
        """Governed keys with fewer copies than their target's minimum: (task, wishes,
        minimum)."""
        out = []
        for key, desired in self.ctx.index.desired.items():
            ts = self.cluster.tasks[key]
            if desired.move == "never":
                continue
            eligible = self.ctx.placements.of(PlanClass.of(desired)).achievable  # for ``all``
            lo, _ = target_bounds(desired, 0, self.ruleset.reduce_replicas, eligible)
            if len(ts.who_has or ()) < lo:
                out.append((ts, desired, lo))
        return out


class _Warnings(EventLog):
    """The engine's events in a simulation: problems become the result's warnings (each
    once), the rest is dropped."""

    def __init__(self, warnings: list[str]):
        super().__init__()
        self.warnings = warnings

    def emit(self, action: str, **fields: Any) -> None:
        if action == "rule-error":
            where, error = str(fields.get("rule")), fields.get("error")
            if where.startswith("pools."):
                text = f"the expression of pool '{where[6:]}' raised {error}"
            elif where.endswith(".match"):
                text = f"{where} raised {error}; the key is not moved"
                if where == "demand.match":
                    text = f"{where} raised {error}; the key's reads are not followed"
            else:
                text = f"the match of rule '{where}' raised {error}; treated as no match"
        elif action == "invalid-annotation":
            text = (
                f"ignoring invalid {fields.get('name', 'amm')} annotation "
                f"{fields.get('annotation')} (key {fields.get('example_key')}): "
                f"{fields.get('error')}"
            )
        else:
            return
        self.warnings.append(text)


class _Record(Journal):
    """The engine's journal in a simulation: each decision is also noted as an action of
    the cycle (see :meth:`Simulation.note`)."""

    def __init__(self, simulation: Simulation):
        super().__init__()
        self.simulation = simulation

    def decision(
        self, key: Hashable, op: str, worker: str, outcome: str, reason: str, source: str
    ) -> None:
        super().decision(key, op, worker, outcome, reason, source)
        self.simulation.note(op, key, worker, source, reason, outcome)


class _Cycle(ActiveMemoryManagerPolicy):
    """The simulation as a policy of the AMM: its ``run`` is one cycle."""

    def __init__(self, simulation: Simulation):
        self.simulation = simulation

    def run(self) -> Generator[Suggestion, Any, None]:
        return self.simulation._cycle()

    def __repr__(self) -> str:
        return "SimulatedRulesPolicy()"


def runtime_targets(state: ClusterState) -> dict[Key, RuntimeTarget]:
    """The runtime targets a dump recorded (see :attr:`ClusterState.runtime`), as the
    engine holds them: each with its origin."""
    return {
        key: RuntimeTarget(Target(lo, hi), state.runtime_origins.get(key, "runtime"))
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
