"""Warnings: what is legal in a rules file but almost certainly not what was meant.

Each check reads the :class:`~amm_rules.language.build.Draft` (compiled entries and the
constants their expressions fold to) and reports through a
:class:`~amm_rules.language.locator.Locator` as warnings. What each code detects, and
why only that, is the table of docs/rules.md ("Warnings"); the expression checker
(:mod:`amm_rules.language.expr.checker`) finds ``type-name``, ``resources-annotation``
and ``regex-pattern``.
"""

from __future__ import annotations

import math
import re

from amm_rules.language.build import Draft, RuleDraft
from amm_rules.language.expr.errors import WARNING_CODES as EXPRESSION_WARNING_CODES
from amm_rules.language.fields import format_fraction
from amm_rules.language.locator import Locator
from amm_rules.language.ruleset import MEASURES_WITH_SPILLED

#: Every code a warning of a rules file can carry (those of expressions, such as
#: ``type-name``, are found by the expression checker).
WARNING_CODES: frozenset[str] = EXPRESSION_WARNING_CODES | frozenset(
    {
        "shadowed-rule",
        "never-matches",
        "pool-avoid-conflict",
        "unsatisfiable-target",
        "inverted-thresholds",
        "never-acts",
        "replicate-move-never",
        "unused-pool",
    }
)
#: The warnings ``validate --dump`` adds about a recorded cluster
#: (:mod:`amm_rules.offline.checks`).
CLUSTER_WARNING_CODES: frozenset[str] = frozenset(
    {
        "empty-pool",
        "min-exceeds-eligible",
        "spread-one-host",
        "matches-no-key",
        "shadowed-in-cluster",
    }
)
#: What ``# amm-rules: disable=CODE`` and ``validate --disable CODE`` accept, and only
#: these: a warning is silenced, never an error.
ALL_WARNING_CODES: frozenset[str] = WARNING_CODES | CLUSTER_WARNING_CODES

_STRING_OR_SPACE = re.compile(r"\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'|\s+")


def normalize(expression: str) -> str:
    """The expression with runs of whitespace outside string literals removed."""
    return _STRING_OR_SPACE.sub(lambda m: "" if m.group().isspace() else m.group(), expression)


def lint(draft: Draft, where: Locator) -> None:
    _shadowed(draft.rules, where)
    for rule in draft.rules:
        _pool_avoid(rule, draft, where)
    _replicate_move_never(draft.rules, where)
    _unused_pools(draft, where)
    _thresholds(draft, where)
    _paused_workers(draft, where)
    _spill_lru(draft, where)
    _adaptive(draft, where)


def _unused_pools(draft: Draft, where: Locator) -> None:
    if where.has_errors:
        return  # a rule that did not compile may name the pool: no guess
    named = {p for r in draft.rules for p in (*(r.actions.pool or ()), *(r.actions.avoid or ()))}
    for name in draft.pools:
        if name not in named:
            where.warn(
                ("pools", name),
                f"pool '{name}' is named by no rule's pool or avoid (an 'amm' annotation "
                "may still name it; then silence this with '# amm-rules: "
                "disable=unused-pool')",
                "unused-pool",
                at_key=True,
            )


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
            where.warn(
                (*path, "match"),
                f"rule '{rule.name}' never matches: its match is always false",
                "never-matches",
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
                where.warn(
                    (*path, "name"),
                    f"rule '{rule.name}' can never decide anything: earlier rules always "
                    f"decide first: {'; '.join(shadows)}",
                    "shadowed-rule",
                )
        for name in fields:
            if rule.constant is True:
                always.setdefault(name, rule)
            same.setdefault((text, name), rule)


def _replicate_move_never(rules: list[RuleDraft], where: Locator) -> None:
    # For each rule R: the rules that certainly match every key R matches (R itself,
    # rules whose match is always true, rules with the same match text). If one of them
    # sets replicate, every key of R gets some replication target (from whichever rule
    # matches first); it certainly gets move: never if the first of them that sets move
    # says never and so does every rule before it that sets move.
    #
    # The certain rules of R are those always true and those of R's text: the first of
    # them that sets replicate is the earlier of the first of each kind, and so is the
    # first that says move: never before any rule (certain or not) sets move otherwise.
    # Computed once per kind and per text: a scan of the rules per rule took 8 s at
    # 10,000 rules (on a live scheduler's reload too).
    live = [r for r in rules if r.constant is not False]
    stop = next((r.index for r in live if r.actions.move not in (None, "never")), math.inf)

    def firsts(group: list[RuleDraft]) -> tuple[RuleDraft | None, RuleDraft | None]:
        replicate = next((r for r in group if r.actions.replicate is not None), None)
        never = (r for r in group if r.actions.move == "never" and r.index < stop)
        return replicate, next(never, None)

    def earlier(a: RuleDraft | None, b: RuleDraft | None) -> RuleDraft | None:
        return min((r for r in (a, b) if r is not None), key=lambda r: r.index, default=None)

    texts: dict[str, list[RuleDraft]] = {}
    for r in live:
        texts.setdefault(normalize(r.match_source), []).append(r)
    of_text = {text: firsts(group) for text, group in texts.items()}
    always_replicate, always_never = firsts([r for r in live if r.constant is True])
    for rule in live:
        text_replicate, text_never = of_text[normalize(rule.match_source)]
        replicate = earlier(always_replicate, text_replicate)
        move = earlier(always_never, text_never)
        if replicate is None or move is None:
            continue
        if max(replicate, move, key=lambda r: r.index) is not rule:
            continue  # reported once, on the later of the two rules
        target = replicate.actions.replicate
        if replicate is move:
            message = (
                f"rule '{rule.name}' sets both replicate and move: never; move: never wins, "
                "so its keys are left alone and the replication target is never held"
            )
            at = "move"
        else:
            other = move if rule is replicate else replicate
            why = "always matches" if other.constant is True else "has the same match"
            given = (
                f"move: never from rule '{other.name}'"
                if other is move
                else f"replicate: {target} from rule '{other.name}'"
            )
            message = (
                f"every key of rule '{rule.name}' also gets {given} (which {why}); "
                f"move: never wins, so replicate: {target} is never held for them"
            )
            at = "replicate" if rule is replicate else "move"
        where.warn(("rules", rule.index, at), message, "replicate-move-never")


def _pool_avoid(rule: RuleDraft, draft: Draft, where: Locator) -> None:
    path = ("rules", rule.index)
    pool = rule.actions.pool or ()
    avoid = rule.actions.avoid or ()
    both = [p for p in pool if p in avoid]
    if both:
        names = ", ".join(f"'{p}'" for p in both)
        where.warn(
            (*path, "avoid"),
            f"avoid: {names} also named in 'pool'; avoid wins, so those workers are never used",
            "pool-avoid-conflict",
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
        where.warn(
            (*path, at),
            f"no worker could hold this rule's keys: {reason}",
            "unsatisfiable-target",
        )


def _field(draft: Draft, section: str, name: str) -> tuple[str, ...]:
    """Where to warn about a field of a section: at the field if the file writes it,
    else at the section."""
    written = draft.data.get(section)
    return (section, name) if isinstance(written, dict) and name in written else (section,)


def _thresholds(draft: Draft, where: Locator) -> None:
    """``inverted-thresholds``: only settings under which nothing can ever move (the gap
    is measured around the mean, so thresholds that are strict but work are not)."""
    settings = draft.rebalance
    if settings is None:
        return
    pct = format_fraction
    if settings.recipient_max <= 0:
        where.warn(
            _field(draft, "rebalance", "recipient-max"),
            f"recipient-max is {pct(settings.recipient_max)}: no worker is ever below it, "
            "so no worker receives and nothing is rebalanced",
            "inverted-thresholds",
        )
    if settings.sender_min >= 1 and settings.measure not in MEASURES_WITH_SPILLED:
        where.warn(
            _field(draft, "rebalance", "sender-min"),
            f"sender-min is {pct(settings.sender_min)}: by measure '{settings.measure}' a "
            "worker would send only once it holds its whole memory limit, which Dask's "
            "workers do not reach (they pause at 80% and restart at 95%), so nothing is "
            "rebalanced; only 'managed_total', which counts spilled bytes, goes past it",
            "inverted-thresholds",
        )


def _paused_workers(draft: Draft, where: Locator) -> None:
    settings = draft.paused_workers
    if settings is None or settings.action == "report" or settings.max_paused_fraction > 0:
        return
    where.warn(
        _field(draft, "paused-workers", "max-paused-fraction"),
        f"max-paused-fraction is 0%: one paused worker is already more than 0% of the "
        f"cluster, so no worker is ever {'restarted' if settings.action == 'restart' else 'retired'}"
        "; write 'action: report' if only reports are wanted",
        "never-acts",
    )


def _spill_lru(draft: Draft, where: Locator) -> None:
    """A rule's ``spill`` under ``spill.order: lru`` orders nothing."""
    if draft.spill is None or draft.spill.order != "lru":
        return
    for rule in draft.rules:
        if rule.actions.spill is not None:
            where.warn(
                ("rules", rule.index, "spill"),
                f"spill: {rule.actions.spill} has no effect while spill.order is 'lru': "
                "workers give up the least recently used keys first; write 'order: value'",
                "never-acts",
            )


def _adaptive(draft: Draft, where: Locator) -> None:
    settings = draft.adaptive
    if settings is None:
        return
    section = draft.data.get("adaptive")
    if isinstance(section, dict) and section.get("balance") is True:
        rebalance = draft.rebalance
        if not settings.memory:
            why = "memory is off: the target is distributed's and nothing is balanced"
        elif rebalance is not None and rebalance.enabled:
            why = "the rebalance section is on: rebalancing follows its settings"
        else:
            why = ""
        if why:
            where.warn(("adaptive", "balance"), f"balance has no effect: {why}", "never-acts")
    if settings.memory or settings.hold_rules:
        return
    where.warn(
        ("adaptive",),
        "memory and hold-rules are both off: the section changes nothing but the order in "
        "which workers leave (the target is distributed's, and scale-down keeps only what "
        "a retirement would refuse); turn one on, or remove the section",
        "never-acts",
    )
