"""The engine's sections: one module per feature, each a
:class:`~amm_rules.engine.sections.base.Section`.

:data:`SECTIONS` is the order in which they run in a cycle, and in which status,
explain and the metrics list them:

1. ``audit``: the safety net behind the scheduler hooks (:mod:`.audit`), first, after
   the placements are fresh and before classification;
2. ``memory-flow``: publishes what each prefix produced and freed (:mod:`.memory_flow`),
   before classification (rules may read it); ``spans``: which spans finished
   (:mod:`.spans`, ``task.span_done``), before classification too;
   ``recompute-costs``: refreshes what each key would cost to compute again and the
   work at risk per worker (:mod:`.costs`), before classification too
   (``task.recompute_seconds``);
3. ``memory-pressure``: keeps its periodic check running (:mod:`.memory_pressure`);
4. ``replication``: classification, then each governed key's target and placement
   (:mod:`.replication`); ``rule-activity``: which rules governed a key since they
   were loaded (:mod:`.activity`), right after;
5. ``paused-workers``: empties workers paused for too long (:mod:`.paused_workers`),
   after replication (its copies count) and before rebalancing (which then sees the
   loads they add);
6. ``rebalance``: moves between workers (:mod:`.rebalance`), after replication, so that
   its copies count in the loads and its keys stay put;
   ``protect``: extra copies of the dearest keys within a memory budget
   (:mod:`.protect`), after replication (a key's own target wins) and before
   reduce-replicas, which spares what it protects;
7. ``reduce-replicas``: the stock reduction for keys no rule governs
   (:mod:`.reduce_replicas`), last, sparing keys mid-move and protected copies;
8. ``retirement``, ``drain``, ``legacy-replicate``, ``demand``, ``departures``: nothing to
   do in a cycle; they act through scheduler hooks (:mod:`.retirement`, :mod:`.legacy`,
   :mod:`.departures`), through the retirements they pace (:mod:`.drain`: a drained
   worker's copies are its retirement's, recorded in flight where replication counts
   them; the AMM drops a key's extra copy from the retiring worker first, so
   reduce-replicas never trims the copy a drain made) or report (:mod:`.demand`);
   ``adaptive``: acts when adaptive scaling asks the scheduler (:mod:`.adaptive`: its
   target, and the guard of scale-down), after the retirement whose keys it lets go;
   in a cycle it only samples the workers' disk metrics, so its place is free.

Adding a feature: a module here with its ``Section`` subclass, and its class in
:data:`SECTIONS` (see docs/architecture.md).
"""

from __future__ import annotations

from amm_rules.engine.sections.activity import RuleActivity
from amm_rules.engine.sections.adaptive import AdaptiveSection
from amm_rules.engine.sections.audit import AuditSection
from amm_rules.engine.sections.base import Cycle, Section
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

#: The sections, in the order they run.
SECTIONS: tuple[type[Section], ...] = (
    AuditSection,
    MemoryFlowSection,
    SpansSection,
    RecomputeCostsSection,
    MemoryPressure,
    Replication,
    RuleActivity,
    PausedWorkers,
    RebalanceSection,
    ProtectSection,
    ReduceReplicasSection,
    Retirements,
    AdaptiveSection,
    DrainSection,
    LegacyCalls,
    DemandSection,
    WorkerDepartures,
)

__all__ = ["SECTIONS", "Cycle", "Section"]
