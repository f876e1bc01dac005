"""Dry-run enforcement: what is in dry-run is classified, planned and reported, never enacted.

A rules file, one rule or the ``rebalance:`` section may say ``enforcement: dry-run``
(:attr:`~amm_rules.language.ruleset.Ruleset.dry_run_rules`,
:attr:`~amm_rules.language.ruleset.Ruleset.rebalance_dry_run`). The engine classifies and
plans exactly as it would otherwise; :class:`DryRun` sits where the policy's suggestions
leave for the Active Memory Manager and holds back those that are dry-run. A suggestion
held back is answered as the AMM answers one it refuses (``None``), so the planner keeps
no copy in flight for it and looks at the key again next cycle: what is reported is what
enforcing the rules would do *now*, cycle after cycle.

Which suggestions are dry-run:

- a copy or drop of a key whose wishes (:class:`~amm_rules.language.ruleset.Desired`) take
  any field from a rule in dry-run, or, when the whole file is in dry-run, from an
  ``amm`` annotation or a runtime target. The key is left as it is (its rule still claims
  it: the rules after it do not decide the fields it sets, exactly as when it acts);
- every copy and drop of rebalancing when the ``rebalance:`` section is in dry-run, and
  rebalancing moves of the keys above in any case.

Keys no rule governs are still reduced to one copy (``reduce-replicas``): that is the
stock Active Memory Manager's behaviour, which amm-rules takes over, not a rule's. The
``paused-workers:`` section of a file in dry-run acts as its own ``action: report``
(:meth:`DryRun.paused_settings`): it reports the workers it would empty, restart or
retire, and copies, restarts and retires nothing.

Held-back suggestions are counted per label as ``would_request`` and ``would_drop``
(docs/policy.md, "Dry-run", says where they show). Neighbours: the replication and
rebalance sections wrap their suggestions with :meth:`DryRun.replication` and
:meth:`DryRun.rebalancing`; :mod:`amm_rules.engine.handlers` asks :meth:`DryRun.label` for
explain. The offline simulator (:mod:`amm_rules.offline.simulate`) uses the same filter.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Generator, Hashable, Mapping, MutableMapping
from dataclasses import replace
from typing import Any

from amm_rules.language.ruleset import ACTION_FIELDS, DRY_RUN, Desired, Ruleset

#: Label of rebalancing's held-back suggestions (the rebalancer's own counter label).
REBALANCE_LABEL = "(rebalance)"
#: Why a key in dry-run does not hold its target (a shortfall reason, beside those of
#: :mod:`amm_rules.engine.state.journal`), and the outcome journalled for what was held back.
HELD_BACK = "dry-run"

Suggestions = Generator[Any, Any, Any]
Stats = MutableMapping[str, Counter[str]]


class DryRun:
    """The dry-run parts of one ruleset (rebuilt on every reload)."""

    def __init__(self, ruleset: Ruleset):
        #: Names of the rules in dry-run.
        self.rules: frozenset[str] = ruleset.dry_run_rules
        #: The whole file is in dry-run (annotations and runtime targets too).
        self.file: bool = ruleset.enforcement == DRY_RUN
        #: Rebalancing plans and reports without moving anything.
        self.rebalance: bool = ruleset.rebalance_dry_run

    @property
    def keys_active(self) -> bool:
        """Some governed key may be in dry-run."""
        return bool(self.rules) or self.file

    def __repr__(self) -> str:
        return f"<DryRun file={self.file} rules={sorted(self.rules)} rebalance={self.rebalance}>"

    def paused_settings(self, settings: Any) -> Any:
        """The ``paused-workers`` section as it runs: in a file in dry-run, ``action:
        report`` (it also restarts and retires workers, which no filter of suggestions
        could hold back)."""
        if settings is None or not self.file:
            return settings
        return replace(settings, action="report")

    def label(self, desired: Desired | None) -> str | None:
        """The label under which a key's actions are held back, or None if they act:
        the first field (in the order of the action fields) decided by something in
        dry-run."""
        if desired is None or not self.keys_active:
            return None
        for name in ACTION_FIELDS:
            reason = desired.reasons.get(name)
            if reason is None:
                continue
            if reason.kind == "rule":
                if reason.rule in self.rules:
                    return reason.rule
            elif self.file:
                return f"({reason.kind})"
        return None

    def shortfall(
        self, desired: Desired, plan: Any, short: tuple[str, str] | None
    ) -> tuple[str, str] | None:
        """A key's shortfall (see :func:`amm_rules.engine.state.journal.shortfall`), said as
        :data:`HELD_BACK` when the key is in dry-run and its plan has actions: the
        engine is not on it, it is holding back."""
        label = self.label(desired) if plan.actions else None
        if label is None:
            return short
        first = plan.actions[0]
        return HELD_BACK, (
            f"held back by dry-run ({label}): {len(plan.actions)} actions, e.g. "
            f"{first.op} on {first.worker}"
        )

    def replication(
        self, suggestions: Suggestions, desired: Mapping[Hashable, Desired], stats: Stats
    ) -> Suggestions:
        """The replication suggestions, without those of keys in dry-run."""
        if not self.keys_active:
            return suggestions
        return hold_back(suggestions, lambda s: self.label(desired.get(s.ts.key)), stats)

    def rebalance_label(
        self, desired: Mapping[Hashable, Desired]
    ) -> Callable[[Any], str | None] | None:
        """The label a rebalancing suggestion is held back under (None: it acts), or None
        when nothing of rebalancing is in dry-run."""
        if self.rebalance:
            return lambda s: REBALANCE_LABEL
        if not self.keys_active:
            return None
        return lambda s: self.label(desired.get(s.ts.key))

    def rebalancing(
        self, suggestions: Suggestions, desired: Mapping[Hashable, Desired], stats: Stats
    ) -> Suggestions:
        """The rebalancing suggestions, without any if rebalancing is in dry-run, else
        without those of keys in dry-run."""
        label_of = self.rebalance_label(desired)
        if label_of is None:
            return suggestions
        return hold_back(suggestions, label_of, stats)


def hold_back(
    suggestions: Suggestions, label_of: Callable[[Any], str | None], stats: Stats
) -> Suggestions:
    """Pass ``suggestions`` on, except those ``label_of`` names: each of these is
    answered ``None`` (as a refusal) and counted under its label. Returns what the
    wrapped generator returns."""
    answer = None
    try:
        while True:
            try:
                suggestion = suggestions.send(answer)
            except StopIteration as stop:
                return stop.value
            label = label_of(suggestion)
            if label is None:
                answer = yield suggestion
            else:
                op = "would_request" if suggestion.op == "replicate" else "would_drop"
                stats[label][op] += 1
                answer = None
    finally:
        suggestions.close()
