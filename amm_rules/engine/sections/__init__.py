"""The engine's sections: one module per feature, each a
:class:`~amm_rules.engine.sections.base.Section`, and the order of the cycle.

The order is written here once: :data:`PREPARING` then :data:`PLANNING` are the steps of
one AMM cycle, in order, each with the reason it stands where it does. Between the two
the cycle takes its planning time (:attr:`Cycle.now
<amm_rules.engine.sections.base.Cycle.now>`): classification may take the cycle's
budget, and every planning step plans at that one time; the context's ledger and claims
are brought to it first (:meth:`~amm_rules.engine.context.EngineContext.settle`), so that
no step sees a copy landed, given up or held past its time. The sections of
:data:`OFF_CYCLE` are not steps of the cycle.

Adding a feature: a module here with its ``Section`` subclass, and its class in one of
the lists, at the place where it belongs, with its reason (see docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from amm_rules.engine.sections.activity import RuleActivity
from amm_rules.engine.sections.adaptive import AdaptiveSection
from amm_rules.engine.sections.audit import AuditSection
from amm_rules.engine.sections.base import Cycle, Section
from amm_rules.engine.sections.classification import Classification
from amm_rules.engine.sections.costs import RecomputeCostsSection
from amm_rules.engine.sections.demand import DemandSection
from amm_rules.engine.sections.departures import WorkerDepartures
from amm_rules.engine.sections.drain import DrainSection
from amm_rules.engine.sections.legacy import LegacyCalls
from amm_rules.engine.sections.memory_flow import MemoryFlowSection
from amm_rules.engine.sections.memory_pressure import MemoryPressure
from amm_rules.engine.sections.paused_workers import PausedWorkers
from amm_rules.engine.sections.protect import ProtectSection
from amm_rules.engine.sections.rebalance import RebalanceSection
from amm_rules.engine.sections.reduce_replicas import ReduceReplicasSection
from amm_rules.engine.sections.replication import Replication
from amm_rules.engine.sections.retirement import Retirements
from amm_rules.engine.sections.spans import SpansSection
from amm_rules.engine.sections.spill import SpillSection

if TYPE_CHECKING:
    from amm_rules.engine.context import EngineContext

#: The steps before planning, in order.
PREPARING: tuple[type[Section], ...] = (
    # The safety net behind the scheduler hooks: first, once the placements are fresh,
    # so that what it repairs is classified and planned in this cycle.
    AuditSection,
    # What each prefix produced and freed: before classification, which rules read it.
    MemoryFlowSection,
    # Which spans finished (task.span_done): before classification too.
    SpansSection,
    # What each key would cost to compute again, the work at risk per worker
    # (task.recompute_seconds): before classification too.
    RecomputeCostsSection,
    # Its periodic check of the workers' memory: before planning, independent of it.
    MemoryPressure,
    # The keys that entered memory (or must be classified again), within the cycle's
    # budget: last before planning, after everything the rules read is published.
    Classification,
)
#: The steps of planning, in order, at the cycle's planning time.
PLANNING: tuple[type[Section], ...] = (
    # Each governed key's target and placement: first, the other steps work around it.
    Replication,
    # Which rules governed a key since they were loaded: right after replication.
    RuleActivity,
    # Empties workers paused for too long: after replication (its copies count), before
    # rebalancing (which then sees the loads they add).
    PausedWorkers,
    # Moves between workers: after replication, so that its copies count in the loads
    # and its keys stay put.
    RebalanceSection,
    # Extra copies of the dearest keys within a memory budget: after replication (a
    # key's own target wins), before reduce-replicas (which keeps what it holds).
    ProtectSection,
    # Values sent to the workers' eviction order, and copies held elsewhere dropped
    # from workers near their memory target: after replication and protect (their
    # targets and held copies count: it never drops below them), before reduce-replicas
    # (so that the copy trimmed is the one on the worker short of memory).
    SpillSection,
    # The stock reduction for keys no rule governs: last, keeping the copies the others
    # hold (a move, protect's) and the keys they leave alone.
    ReduceReplicasSection,
)
#: Sections that never run in the cycle: they act through the scheduler's hooks and
#: handlers (retirements placed by the rules, drains pacing them, adaptive scaling's
#: questions, the replicate and scatter calls, demand followed, workers leaving), and
#: report. They are not steps (a step that does nothing would still be called every
#: cycle, and the lists would no longer say what a cycle does).
OFF_CYCLE: tuple[type[Section], ...] = (
    Retirements,
    # Adaptive scaling's target and the guard of scale-down, when adaptive asks: after
    # the retirement that places the keys of the workers it lets go.
    AdaptiveSection,
    DrainSection,
    LegacyCalls,
    DemandSection,
    WorkerDepartures,
)
#: Every section, steps first: the order in which the policy builds, attaches and
#: configures them, and status, explain and the metrics list them.
SECTIONS: tuple[type[Section], ...] = PREPARING + PLANNING + OFF_CYCLE

_PLANNING = frozenset(PLANNING)


def steps(ctx: EngineContext, cycle: Cycle, sections: Iterable[Section]) -> Iterator[Section]:
    """The steps of one cycle among ``sections`` (those of :data:`OFF_CYCLE` left out),
    in the order given (:data:`SECTIONS`' for the policy; a simulation runs some). Before
    the first planning step, the cycle's planning time is taken and the context settled
    at it. The caller runs each step (``yield from section.run(cycle)``): no generator
    stands between the AMM and the suggestions."""
    planning = False
    for section in sections:
        kind = type(section)
        if kind in OFF_CYCLE:
            continue
        if not planning and kind in _PLANNING:
            planning = True
            cycle.now = ctx.clock()
            ctx.settle(cycle.now)
        yield section


__all__ = ["OFF_CYCLE", "PLANNING", "PREPARING", "SECTIONS", "Cycle", "Section", "steps"]
