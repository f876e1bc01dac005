"""The demand section: the ``demand:`` part of the rules, as status.

The :class:`~amm_rules.engine.state.demand.DemandTracker` (reads and waiters of keys) is
engine state, fed by the key index's transition hook and read by the classifier
(``task.reads``, ``task.waiters``), the planner (copies held for readers) and
reduce-replicas; the rules configure it when installed
(:meth:`~amm_rules.engine.context.EngineContext.install`). This section reports it,
and seeds ``task.reads`` of the keys already in memory when the tracker starts
following them (the policy attaches, a reload turns demand on).

Neighbours: :mod:`amm_rules.engine.state.demand` counts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from amm_rules.engine.sections.base import Section
from amm_rules.language.ruleset import Ruleset

if TYPE_CHECKING:
    from amm_rules.engine.context import EngineContext


class DemandSection(Section):
    """What the demand hold follows (see the module docstring)."""

    offline = (
        "demand: not simulated: no task reads a key in a recorded cluster, so task.reads is 0 "
        "and no copy is held for readers"
    )

    @classmethod
    def in_use(cls, ruleset: Ruleset) -> bool:
        return bool(ruleset.reads_demand or ruleset.demand.hold > 0)

    name = "demand"
    status_key = "demand"

    def __init__(self, ctx: EngineContext) -> None:
        super().__init__(ctx)
        #: Whether the tracker followed demand at the last look (seeded when it starts).
        self._following = False
        #: Keys whose reads were seeded from the scheduler (at attach or a reload).
        self.seeded = 0

    def attach(self) -> None:
        """``task.reads`` of the keys already in memory starts from what the scheduler
        knows (:meth:`DemandTracker.seed`): the policy just queued them, all of them,
        for classification."""
        ctx = self.ctx
        demand = ctx.index.demand
        self._following = demand.enabled
        if demand.enabled:
            self.seeded += demand.seed(ts for ts in ctx.index.dirty.values() if ts is not None)

    def reloaded(self, in_memory: list[Any]) -> None:
        """A reload that turned demand on seeds the keys in memory, as at attach."""
        demand = self.ctx.index.demand
        if demand.enabled and not self._following:
            self.seeded += demand.seed(in_memory)
        self._following = demand.enabled

    def status(self) -> dict[str, Any]:
        demand = self.ctx.index.demand
        settings = self.ctx.ruleset.demand
        return {
            "following": demand.enabled,
            "hold": settings.hold,
            "match": settings.match_source,
            "keys_read": len(demand.reads),
            "seeded": self.seeded,
        }
