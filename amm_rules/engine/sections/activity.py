"""The rule-activity section: which rules have governed a key since they were loaded.

A rule that matched no key is the commonest silent mistake of a rules file (a type, a
prefix or a resource named otherwise than the data is). Each cycle, after
classification, this section notes the rules that govern keys now (the index's counter
per rule: one look per rule, never a look at keys), and forgets it all when the rules
are reloaded. The conformance (:mod:`amm_rules.observe.conformance`) calls a rule that
governed nothing ``idle`` or ``shadowed``, from the keys of a sample it matches, as
:func:`rule_matches` tells (``simulate`` and ``diff`` ask it of every key of a dump).

Neighbours: :mod:`amm_rules.engine.state.index` counts keys per rule
(:attr:`~amm_rules.engine.state.index.KeyIndex.governed_by`).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import TYPE_CHECKING, Any

from amm_rules.engine.adapters import resource_restrictions, span_path
from amm_rules.engine.decide.shadows import Shadow
from amm_rules.engine.sections.base import Cycle, Section
from amm_rules.language.near_miss import Census
from amm_rules.language.ruleset import CLASS_ATTRIBUTES, Rule

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
        self.matched.update(label for label, n in self.ctx.index.governed.governed_by.items() if n)
        self.cycles += 1
        return ()


def rule_matches(
    ctx: Any, rules: Iterable[Rule], tasks: Iterable[Any], budget: int | None = None
) -> dict[str, Shadow]:
    """Per rule, the keys of ``tasks`` (scheduler tasks, or a simulation's) it matches
    and who decided its fields for them (see :mod:`amm_rules.engine.decide.shadows`),
    as the classifier sees the keys (demand, memory flow, spans, costs). What a class of
    keys shares (prefix, group, type, annotations, resources...) is evaluated once per
    class, as the classifier does: a match reading only that, or the operands of a
    match ``a and b`` that do (the others then only for the keys of the classes that
    passed). At most ``budget`` evaluations in all (None: no bound): a rule past it is
    left out of the answer, and so are those after it."""
    index = ctx.index
    classes: dict[Hashable, list[Any]] = {}
    for ts in tasks:
        classes.setdefault(_class_of(ts), []).append(ts)
    left = budget
    out: dict[str, Shadow] = {}
    for rule in rules:
        matched, spent = _matching(ctx, rule, classes, left)
        if matched is None:
            break
        if left is not None:
            left -= spent
        shadow = out[rule.name] = Shadow()
        for ts in matched:
            desired = index.desired.get(ts.key)
            shadow.add(rule, desired if desired is not None else ctx.resolve(ts))
    return out


def _matching(
    ctx: Any, rule: Rule, classes: dict[Hashable, list[Any]], budget: int | None
) -> tuple[list[Any] | None, int]:
    """The tasks of ``classes`` ``rule`` matches, and the evaluations it took; None
    once more than ``budget`` would be needed."""

    facts = ctx.facts
    whole = rule.depends <= CLASS_ATTRIBUTES
    shared = [] if whole else [fn for fn, deps in rule.conjuncts if deps <= CLASS_ATTRIBUTES]
    spent = 0
    out: list[Any] = []
    for members in classes.values():
        if whole or shared:
            spent += 1
            head = facts(members[0])
            if not all(_true(fn, head) for fn in ([rule.match] if whole else shared)):
                continue
            if whole:
                out += members
                continue
        spent += len(members)
        if budget is not None and spent > budget:
            return None, spent
        out += [ts for ts in members if _true(rule.match, facts(ts))]
    if budget is not None and spent > budget:
        return None, spent
    return out, spent


def _true(predicate: Any, facts: Any) -> bool:
    try:
        return bool(predicate(facts))
    except Exception:  # as in the engine: an error is "no match"
        return False


def _class_of(ts: Any) -> Hashable:
    """What keys of one class share (their task group fixes prefix and span), or the
    task itself where its annotations cannot be compared."""
    annotations = ts.annotations or {}
    try:
        frozen = tuple(sorted(annotations.items()))
        hash(frozen)
    except TypeError:
        return ts.key
    resources = tuple(sorted(resource_restrictions(ts).items()))
    return (id(ts.group), ts.type, frozen, resources)


def census_of(tasks: Iterable[Any], sampled: bool = True) -> Census:
    """A census of keys (scheduler tasks, or a simulation's) for the near-miss hints of
    the rules that match none of them (:mod:`amm_rules.language.near_miss`)."""
    census = Census(sampled=sampled)
    for ts in tasks:
        census.add(
            ts.type,
            ts.prefix.name,
            span_path(ts),
            resource_restrictions(ts),
            ts.annotations or (),
        )
    return census
