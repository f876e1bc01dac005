"""The classification step: the keys that entered memory (or must be classified again)
since the last cycle, resolved by the rules within the cycle's classification budget.

One cycle of it classifies the keys waiting
(:class:`~amm_rules.engine.decide.classify.Classifier`,
:class:`~amm_rules.engine.decide.classify_budget.ClassifyBudget`), files governed ones
in the :class:`~amm_rules.engine.state.index.KeyIndex` and leaves on the cycle
(:attr:`Cycle.filed <amm_rules.engine.sections.base.Cycle.filed>`) those of them that
may need action, for the replication step to plan. Keys a match reads the copies or the
dependents of are classified again when those change. It is the last step before the
cycle's planning time: classifying may take the cycle's budget.

Neighbours: :mod:`amm_rules.engine.sections.replication` plans what it filed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from amm_rules.engine.decide.classify_budget import ClassifyBudget
from amm_rules.engine.sections.base import Cycle, Section
from amm_rules.engine.state.governed import PlanClass

if TYPE_CHECKING:
    from amm_rules.engine.context import EngineContext

logger = logging.getLogger(__name__)


class Classification(Section):
    """The classification of the keys waiting (see the module docstring).

    ``classify_seconds``, ``classify_keys``: the classification budget of one cycle (see
    :class:`~amm_rules.engine.policy.RulesPolicy`)."""

    name = "classification"

    def __init__(
        self,
        ctx: EngineContext,
        classify_seconds: float | None = 0.1,
        classify_keys: int | None = None,
    ):
        super().__init__(ctx)
        #: The classification budget of a cycle: seconds (of the whole cycle) and keys.
        self.classify_seconds = None if classify_seconds is None else float(classify_seconds)
        self.classify_keys = None if classify_keys is None else max(1, int(classify_keys))
        #: How much of the cycle the classification loop may take (see ClassifyBudget).
        self.classify_budget = ClassifyBudget()

    def run(self, cycle: Cycle) -> tuple[()]:
        cycle.ended.append(self.classify_budget.cycle_ended)
        cycle.filed = self._classify_dirty(cycle)
        return ()

    def _classify_dirty(self, cycle: Cycle) -> dict[PlanClass, list[Any]]:
        """Resolve the keys that entered memory (or got a runtime target) since the last
        cycle, within the cycle's classification budget, and file governed ones in the
        index. Returns the tasks filed that may need action (their suspects, see
        :meth:`KeyIndex.suspects`), by plan class; all of them when the cycle is full
        (every governed key is checked in this cycle anyway). The keys not reached wait
        for the next cycles (see :meth:`KeyIndex.classify
        <amm_rules.engine.state.index.KeyIndex.classify>`), and are neither planned nor
        reduced until then. Keys that are no longer governed are touched, so that
        reduce-replicas finds them if they hold several copies."""
        ctx = self.ctx
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
                return index.governed.suspects(cls, placement_of(cls), reduce_replicas, members)

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
