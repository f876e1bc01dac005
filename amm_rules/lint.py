"""Warnings: what is legal in a rules file but almost certainly not what was meant.

Each check reads the :class:`~amm_rules.build.Draft` (compiled entries and the
constants their expressions fold to) and reports through a
:class:`~amm_rules.located.Locator` with ``severity="warning"``. What is detected,
exactly (docs/rules.md lists the same):

``shadowed-rule``
    Every action field the rule sets is also set by an earlier rule whose match is
    always true, or whose match is the same text (ignoring spaces outside quotes).
    Such an earlier rule decides the field first for every key the later one matches.
``never-matches``
    The rule's match is always false.
``pool-avoid-conflict``
    A pool is named both in the rule's ``pool`` and its ``avoid``.
``unsatisfiable-target``
    The rule's own ``pool``/``avoid`` leave no worker that could hold its keys: every
    pool in ``pool`` is also avoided, or every pool in ``pool`` has an always-false
    expression, or a pool in ``avoid`` has an always-true expression.
``inverted-thresholds``
    In ``rebalance``: ``gap`` is 100% or more; or ``recipient-max`` is below
    ``sender-min``; or ``gap`` is at least the distance from ``sender-min`` up to
    ``recipient-max``.
"""

from __future__ import annotations

import re

from amm_rules.build import Draft, RuleDraft
from amm_rules.located import Locator
from amm_rules.units import format_fraction

_STRING_OR_SPACE = re.compile(r"\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'|\s+")


def normalize(expression: str) -> str:
    """The expression with runs of whitespace outside string literals removed."""
    return _STRING_OR_SPACE.sub(lambda m: "" if m.group().isspace() else m.group(), expression)


def lint(draft: Draft, where: Locator) -> None:
    _shadowed(draft.rules, where)
    for rule in draft.rules:
        _pool_avoid(rule, draft, where)
    _thresholds(draft, where)


def _shadowed(rules: list[RuleDraft], where: Locator) -> None:
    # For each field: the first rule that sets it and always matches; and for each
    # (match text, field): the first rule that sets it with that match. One pass, so
    # that files with many rules stay linear.
    always: dict[str, RuleDraft] = {}
    same: dict[tuple[str, str], RuleDraft] = {}
    for rule in rules:
        path = ("rules", rule.index)
        fields = rule.actions.set_fields()
        if rule.constant is False:
            where.add(
                (*path, "match"),
                f"rule '{rule.name}' never matches: its match is always false",
                "never-matches",
                severity="warning",
            )
            continue
        text = normalize(rule.match_source)
        shadows = []
        for name in fields:
            candidates = [r for r in (always.get(name), same.get((text, name))) if r]
            if not candidates:
                break
            earlier = min(candidates, key=lambda r: r.index)
            why = "always matches" if earlier.constant is True else "has the same match"
            shadows.append(f"{name} by rule '{earlier.name}' (which {why})")
        else:
            if shadows:
                where.add(
                    (*path, "name"),
                    f"rule '{rule.name}' can never decide anything: earlier rules always "
                    f"decide first: {'; '.join(shadows)}",
                    "shadowed-rule",
                    severity="warning",
                )
        for name in fields:
            if rule.constant is True:
                always.setdefault(name, rule)
            same.setdefault((text, name), rule)


def _pool_avoid(rule: RuleDraft, draft: Draft, where: Locator) -> None:
    path = ("rules", rule.index)
    pool = rule.actions.pool or ()
    avoid = rule.actions.avoid or ()
    both = [p for p in pool if p in avoid]
    if both:
        names = ", ".join(f"'{p}'" for p in both)
        where.add(
            (*path, "avoid"),
            f"avoid: {names} also named in 'pool'; avoid wins, so those workers are never used",
            "pool-avoid-conflict",
            severity="warning",
        )
    reason = None
    if pool and all(p in avoid for p in pool):
        reason = "every pool in 'pool' is also in 'avoid'"
    elif pool and all(draft.pools.get(p) is False for p in pool):
        reason = "every pool in 'pool' has an expression that is always false"
    else:
        everything = [p for p in avoid if draft.pools.get(p) is True]
        if everything:
            reason = f"pool '{everything[0]}' in 'avoid' has an expression that is always true"
    if reason:
        at = "pool" if pool else "avoid"
        where.add(
            (*path, at),
            f"no worker could hold this rule's keys: {reason}",
            "unsatisfiable-target",
            severity="warning",
        )


def _thresholds(draft: Draft, where: Locator) -> None:
    settings = draft.rebalance
    if settings is None:
        return
    given = draft.rebalance_fields
    low, high, gap = settings.sender_min, settings.recipient_max, settings.gap
    pct = format_fraction

    def at(*names: str) -> tuple[str, ...]:
        """The first of ``names`` written in the file, else the section itself."""
        written = [n for n in names if n in given]
        return ("rebalance", written[0]) if written else ("rebalance",)

    if gap >= 1:
        where.add(
            at("gap"),
            f"gap is {pct(gap)}: no worker can ever be that far from the "
            "mean, so nothing is rebalanced",
            "inverted-thresholds",
            severity="warning",
        )
    elif high < low:
        where.add(
            at("recipient-max", "sender-min"),
            f"recipient-max ({pct(high)}) is below "
            f"sender-min ({pct(low)}): the thresholds look inverted",
            "inverted-thresholds",
            severity="warning",
        )
    elif high > low and gap >= high - low:
        where.add(
            at("gap", "recipient-max", "sender-min"),
            f"gap ({pct(gap)}) is not smaller "
            f"than the distance from sender-min ({pct(low)}) to recipient-max "
            f"({pct(high)})",
            "inverted-thresholds",
            severity="warning",
        )
