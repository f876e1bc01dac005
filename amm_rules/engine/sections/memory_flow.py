"""The memory-flow section: what each task prefix produces and frees, published once per
cycle.

The :class:`~amm_rules.engine.state.flow.MemoryFlow` itself is engine state (on the
:class:`~amm_rules.engine.context.EngineContext`): the key index's transition hook feeds
it, the classifier and the rebalancer read its published figures (``task.prefix_*``).
This section connects it to the scheduler at attach, publishes the figures that moved
at the start of each cycle (before classification, so rules reading them see this
cycle's figures), keeps the keys in memory per prefix while the rules read flow
attributes, and reports the top prefixes in ``amm_rules_status``.

Neighbours: :mod:`amm_rules.engine.state.flow` counts; :mod:`amm_rules.engine.state.index` feeds it.
"""

from __future__ import annotations

from typing import Any

from amm_rules.engine.sections.base import Cycle, Section
from amm_rules.language.ruleset import Ruleset

#: Prefixes listed per ranking in the status (top producers, top freers).
STATUS_TOP = 5


class MemoryFlowSection(Section):
    """Memory flow per task prefix (see the module docstring)."""

    offline = (
        "memory-flow: not simulated: a recorded cluster computes nothing, so rules reading "
        "task.prefix_* see no figures"
    )

    @classmethod
    def in_use(cls, ruleset: Ruleset) -> bool:
        return bool(ruleset.reads_flow)

    name = "memory-flow"
    status_key = "memory_flow"

    def attach(self) -> None:
        ctx = self.ctx
        scheduler = ctx.scheduler
        flow = ctx.flow
        flow.tasks = scheduler.tasks
        # Fed by the index's transition hook (one plugin call per transition, not two).
        ctx.index.follow_flow(flow)
        if _keys_needed(ctx.ruleset):
            self.reloaded([ts for ts in scheduler.tasks.values() if ts.state == "memory"])

    def detach(self) -> None:
        self.ctx.index.follow_flow(None)

    def reloaded(self, in_memory: list[Any]) -> None:
        """Keep (or stop keeping) the keys in memory per prefix, as the rules in force
        read flow attributes or not; ``in_memory``: the tasks in memory now."""
        ctx = self.ctx
        if _keys_needed(ctx.ruleset):
            ctx.flow.start_tracking(in_memory)
        elif ctx.flow.track_keys:
            ctx.flow.stop_tracking()

    def run(self, cycle: Cycle) -> tuple[()]:
        """Publish the flow figures that moved; while rules read them, classify again
        the keys in memory of the prefixes whose figures changed (within the cycle's
        classification budget, like every key that needs classifying)."""
        ctx = self.ctx
        flow = ctx.flow
        republished = flow.publish()
        if republished and flow.track_keys and ctx.ruleset.reads_flow:
            for prefix in republished:
                ctx.index.reclassify(flow.keys_of(prefix))
        return ()

    def status(self) -> dict[str, Any]:
        """How many prefixes are kept, the top producers (largest positive net bytes per
        task) and freers (most bytes freed by finishing), each with its figures, and the
        totals over every prefix."""
        flow = self.ctx.flow
        producers = [
            {"prefix": name, **e.as_dict()}
            for name, e in flow.top(STATUS_TOP, "net_per_task")
            if (e.net_per_task or 0) > 0
        ]
        freers = [
            {"prefix": name, **e.as_dict()}
            for name, e in flow.top(STATUS_TOP, "freed_by")
            if e.freed_by > 0
        ]
        return {
            "prefixes": len(flow.prefixes),
            "evicted": flow.evicted,
            "totals": flow.totals(),
            "top_producers": producers,
            "top_freers": freers,
        }


def _keys_needed(ruleset: Ruleset) -> bool:
    """Whether the keys in memory per prefix are kept: rules read the memory flow
    (classified again when it moves) or ``task.span_done`` (the spans section classifies
    the keys of a span's groups again when it finishes)."""
    return bool(ruleset.reads_flow or ruleset.reads_span_state)
