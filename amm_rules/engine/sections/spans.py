"""The spans section: ``task.span_done`` kept current.

While some rule reads ``task.span_done``, each cycle (before classification) asks the
followed spans again whether they are done (:meth:`SpanStates.refresh
<amm_rules.engine.state.spans.SpanStates.refresh>`, within a budget of task groups), and
classifies again the keys in memory of each span whose state changed: the keys of its
task groups, found through the memory flow's keys per prefix (kept while the rules read
``task.span_done``, as for ``task.prefix_*``), never a scan of ``scheduler.tasks``.
Reports how many spans it follows and how many of them are done.

Neighbours: :mod:`amm_rules.engine.state.spans` keeps the states;
:mod:`amm_rules.engine.sections.memory_flow` keeps the keys per prefix.
"""

from __future__ import annotations

from collections.abc import Hashable

from amm_rules.engine.sections.base import Cycle, Section
from amm_rules.language.ruleset import Ruleset


class SpansSection(Section):
    """Span states for ``task.span_done`` (see the module docstring)."""

    name = "spans"
    status_key = "spans"
    offline = (
        "spans: not simulated: a recorded cluster computes nothing, so task.span_done "
        "keeps the state the recording shows"
    )

    @classmethod
    def in_use(cls, ruleset: Ruleset) -> bool:
        return ruleset.follows_spans

    def attach(self) -> None:
        ctx = self.ctx
        ctx.spans.extension = ctx.scheduler.extensions.get("spans")

    def run(self, cycle: Cycle) -> tuple[()]:
        ctx = self.ctx
        ruleset = ctx.ruleset
        if not ruleset.follows_spans:
            return ()
        if ctx.spans.extension is None:
            # The scheduler makes its extensions in turn, the AMM's before the spans'.
            ctx.spans.extension = ctx.scheduler.extensions.get("spans")
        finished = ctx.spans.refresh()
        if ruleset.reads_span_state:
            # The rules' classes read the state: classify the span's keys again. (The
            # demand and rebalance matches read it as they run.)
            for span_id in finished:
                ctx.index.reclassify(self._keys_of(span_id))
        return ()

    def _keys_of(self, span_id: Hashable) -> list[Hashable]:
        """The keys in memory of the span's task groups (through the memory flow's
        keys per prefix)."""
        ctx = self.ctx
        groups = set(ctx.spans.groups_of(span_id))
        tasks = ctx.scheduler.tasks
        out: list[Hashable] = []
        for prefix in {tg.prefix.name for tg in groups}:
            for key in ctx.flow.keys_of(prefix):
                ts = tasks.get(key)
                if ts is not None and ts.group in groups:
                    out.append(key)
        return out

    def status(self) -> dict[str, int]:
        published = self.ctx.spans.published
        return {"followed": len(published), "done": sum(published.values())}
