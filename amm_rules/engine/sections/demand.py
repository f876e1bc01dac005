"""The demand section: the ``demand:`` part of the rules, as status.

The :class:`~amm_rules.engine.state.demand.DemandTracker` (reads and waiters of keys) is
engine state, fed by the key index's transition hook and read by the classifier
(``task.reads``, ``task.waiters``), the planner (copies held for readers) and
reduce-replicas; the rules configure it when installed
(:meth:`~amm_rules.engine.context.EngineContext.install`). This section reports it.

Neighbours: :mod:`amm_rules.engine.state.demand` counts.
"""

from __future__ import annotations

from typing import Any

from amm_rules.engine.sections.base import Section
from amm_rules.language.ruleset import Ruleset


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

    def status(self) -> dict[str, Any]:
        assert self.ctx is not None
        demand = self.ctx.index.demand
        settings = self.ctx.ruleset.demand
        return {
            "following": demand.enabled,
            "hold": settings.hold,
            "match": settings.match_source,
            "keys_read": len(demand.reads),
        }
