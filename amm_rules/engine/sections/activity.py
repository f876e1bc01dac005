"""The rule-activity section: which rules have governed a key since they were loaded.

A rule that matched no key is the commonest silent mistake of a rules file (a type, a
prefix or a resource named otherwise than the data is). Each cycle, after
classification, this section notes the rules that govern keys now (the index's counter
per rule: one look per rule, never a look at keys), and forgets it all when the rules
are reloaded. The conformance (:mod:`amm_rules.observe.conformance`) calls a rule
``idle`` when it has governed nothing since it was loaded while the cluster holds keys,
with near-miss hints from a bounded sample of keys, at status time.

Neighbours: :mod:`amm_rules.engine.state.index` counts keys per rule
(:attr:`~amm_rules.engine.state.index.KeyIndex.governed_by`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from amm_rules.engine.sections.base import Cycle, Section

if TYPE_CHECKING:
    from amm_rules.engine.context import EngineContext


class RuleActivity(Section):
    """The rules that have governed a key since they were loaded."""

    name = "rule-activity"

    def __init__(self, ctx: EngineContext) -> None:
        super().__init__(ctx)
        #: Names of the rules (and groups: ``(annotation)``...) that governed a key since
        #: the rules were loaded.
        self.matched: set[str] = set()
        #: Cycles run since the rules were loaded.
        self.cycles = 0

    def configure(self, ruleset: Any, dry_run: Any) -> None:
        self.matched = set()
        self.cycles = 0

    def run(self, cycle: Cycle) -> tuple[()]:
        ctx = self.ctx
        matched = self.matched
        for label, n in ctx.index.governed.governed_by.items():
            if n and label not in matched:
                matched.add(label)
        self.cycles += 1
        return ()
