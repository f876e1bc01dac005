"""Classification: what the rules, the key's ``amm`` annotation and its runtime target
want for one key in memory (a :class:`~amm_rules.ruleset.Desired`).

:class:`Classifier` wraps a :class:`~amm_rules.ruleset.Ruleset` for use in the scheduler:

- the cascade itself is :meth:`Ruleset.resolve <amm_rules.ruleset.Ruleset.resolve>`;
- a match that reads only class attributes (prefix, group, type, annotations: see
  :data:`~amm_rules.ruleset.CLASS_ATTRIBUTES`) is evaluated once per distinct value of
  those attributes, not once per key; when every match is like that, the whole
  resolution is memoized per class;
- a match that raises counts as "no match" and is reported once per rule;
- an ``amm`` annotation is parsed once per distinct value; an invalid one is ignored
  for its keys and reported once per distinct value.

Its neighbours: :mod:`amm_rules.index` calls it for keys that entered memory;
:mod:`amm_rules.handlers` for ``explain``. It reads tasks through
:class:`~amm_rules.view.TaskFactsAdapter` and does not import ``distributed``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Hashable
from typing import Any

from amm_rules.actions import ActionError, parse_actions
from amm_rules.ruleset import CLASS_ATTRIBUTES, Actions, Desired, Rule, Ruleset, Target
from amm_rules.view import TaskFactsAdapter, freeze

logger = logging.getLogger(__name__)

#: Memo tables are cleared when they grow past this many entries (task groups are
#: created per graph, so a rule reading ``task.group`` meets new values forever).
MEMO_LIMIT = 100_000

_INVALID = object()


class Classifier:
    """Resolves keys against one ruleset. Rebuilt on every reload."""

    def __init__(
        self,
        ruleset: Ruleset,
        on_rule_error: Callable[[Rule, Exception], None] | None = None,
        on_invalid_annotation: Callable[[Any, ActionError, Hashable], None] | None = None,
    ):
        #: The ruleset as loaded (what status and explain report).
        self.ruleset = ruleset
        self._on_rule_error = on_rule_error
        self._on_invalid_annotation = on_invalid_annotation
        self._reported_rules: set[str] = set()
        self._annotations: dict[Hashable, Any] = {}
        self._match_memo: dict[tuple[int, Hashable], bool] = {}
        self._desired_memo: dict[Hashable, Desired] = {}
        #: The class attributes every match reads, if no match reads anything else.
        self._class_attributes: frozenset[str] | None = (
            ruleset.depends if ruleset.depends <= CLASS_ATTRIBUTES else None
        )
        self._engine = dataclasses.replace(
            ruleset, rules=tuple(self._wrap(i, r) for i, r in enumerate(ruleset.rules))
        )

    @property
    def replicas_sensitive(self) -> bool:
        """True if some match reads ``task.replicas`` (it changes as copies come and go)."""
        return "replicas" in self.ruleset.depends

    def resolve(self, ts: Any, runtime: Target | None = None) -> Desired:
        """The :class:`Desired` of a scheduler ``TaskState`` (or anything duck-alike)."""
        facts = TaskFactsAdapter(ts)
        annotation = self.annotation(ts)
        if self._class_attributes is None:
            return self._engine.resolve(facts, annotation=annotation, runtime=runtime)
        memo_key = (facts.class_key(self._class_attributes), annotation, runtime)
        try:
            return self._desired_memo[memo_key]
        except KeyError:
            pass
        desired = self._engine.resolve(facts, annotation=annotation, runtime=runtime)
        if len(self._desired_memo) >= MEMO_LIMIT:
            self._desired_memo.clear()
        self._desired_memo[memo_key] = desired
        return desired

    def annotation(self, ts: Any) -> Actions | None:
        """The key's parsed ``amm`` annotation; None if absent or invalid."""
        annotations = ts.annotations
        if not annotations:
            return None
        value = annotations.get("amm")
        if value is None:
            return None
        frozen = freeze(value)
        try:
            parsed = self._annotations[frozen]
        except KeyError:
            try:
                parsed = parse_actions(value, known_pools=self.ruleset.pools)
            except ActionError as exc:
                parsed = _INVALID
                if self._on_invalid_annotation is not None:
                    self._on_invalid_annotation(value, exc, ts.key)
            if len(self._annotations) >= MEMO_LIMIT:
                self._annotations.clear()
            self._annotations[frozen] = parsed
        return None if parsed is _INVALID else parsed

    def _wrap(self, index: int, rule: Rule) -> Rule:
        """The rule with a match that never raises, memoized per class if it can be."""
        predicate = rule.match
        class_only = rule.depends <= CLASS_ATTRIBUTES
        attributes = rule.depends
        memo = self._match_memo

        def safe(facts: Any) -> bool:
            try:
                return bool(predicate(facts))
            except Exception as exc:
                self._rule_failed(rule, exc)
                return False

        def memoized(facts: Any) -> bool:
            memo_key = (index, facts.class_key(attributes))
            try:
                return memo[memo_key]
            except KeyError:
                pass
            result = safe(facts)
            if len(memo) >= MEMO_LIMIT:
                memo.clear()
            memo[memo_key] = result
            return result

        return dataclasses.replace(rule, match=memoized if class_only else safe)

    def _rule_failed(self, rule: Rule, exc: Exception) -> None:
        if rule.name in self._reported_rules:
            return
        self._reported_rules.add(rule.name)
        logger.warning(
            "amm-rules: the match of rule %r raised %r; treated as no match", rule.name, exc
        )
        if self._on_rule_error is not None:
            self._on_rule_error(rule, exc)
