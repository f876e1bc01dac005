"""Classification: what the rules, the key's ``amm`` annotation and its runtime target
want for one key in memory (a :class:`~amm_rules.language.ruleset.Desired`).

:class:`Classifier` wraps a :class:`~amm_rules.language.ruleset.Ruleset` for use in the scheduler.
It gives exactly the answer of :meth:`Ruleset.resolve <amm_rules.language.ruleset.Ruleset.resolve>`
(the cascade), at a cost that follows the *classes* of keys rather than keys x rules:

- a key's class is the values of the class attributes the rules read (prefix, group,
  type, annotations: see :data:`~amm_rules.language.ruleset.CLASS_ATTRIBUTES`), read once per key,
  plus its parsed ``amm`` annotation and its runtime target;
- per class, the cascade is run once over the rules whose match reads only class
  attributes (:class:`_ClassCascade`). What is left is the rules that read the key
  itself (``task.key``, ``task.nbytes``, ``task.replicas``, ``task.waiters``,
  ``task.reads``) and could still decide a
  field, in file order: usually none, and the class's ``Desired`` is shared by its keys;
- otherwise a key evaluates only those remaining matches, and the ``Desired`` is shared
  by the keys of the class with the same outcomes;
- a match that raises counts as "no match" and is reported once per rule;
- an ``amm`` annotation (and a top-level ``replicate`` annotation, its shorthand for
  ``amm={"replicate": ...}``) is parsed once per distinct value; an invalid one is
  ignored for its keys and reported once per distinct value.

Its neighbours: :mod:`amm_rules.engine.index` calls it for keys that entered memory;
:mod:`amm_rules.engine.handlers` for ``explain``. It reads tasks through
:class:`~amm_rules.engine.adapters.TaskFactsAdapter` and :func:`~amm_rules.engine.adapters.class_reader`, and
does not import ``distributed``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Mapping
from dataclasses import replace
from typing import Any

from amm_rules.engine.adapters import TaskFactsAdapter, class_reader, freeze
from amm_rules.language.fields import ActionError, parse_actions, parse_target
from amm_rules.language.ruleset import (
    ACTION_FIELDS,
    CLASS_ATTRIBUTES,
    DEMAND_ATTRIBUTES,
    UNGOVERNED,
    Actions,
    Desired,
    Predicate,
    Reason,
    Rule,
    Ruleset,
    RuntimeTarget,
    Target,
    overrides,
)

logger = logging.getLogger(__name__)

#: Memo tables are cleared when they grow past this many entries (task groups are
#: created per graph, so a rule reading ``task.group`` meets new values forever).
MEMO_LIMIT = 100_000

_INVALID = object()
_ALL_FIELDS = len(ACTION_FIELDS)

#: One step of a class's remaining cascade: the rule, the fields it sets, and its match
#: if it must be evaluated per key (None: it matches every key of the class).
_Step = tuple[Rule, tuple[str, ...], Predicate | None]


class _ClassCascade:
    """The cascade for one class of keys (class attributes, annotation, runtime target),
    with the rules that read only class attributes already evaluated.

    ``base`` holds the fields decided before the first rule that reads the key itself;
    ``steps`` the rules after it that may still decide a field for some key. Without a
    per-key step, :attr:`desired` is the answer for every key of the class.
    """

    __slots__ = ("base", "reasons", "steps", "desired", "_by_outcome")

    def __init__(self, base: dict[str, Any], reasons: dict[str, Reason], steps: list[_Step]):
        self.base = base
        self.reasons = reasons
        self.steps = tuple(steps)
        #: Outcomes of the per-key matches evaluated, in order -> the Desired they give.
        self._by_outcome: dict[tuple[bool, ...], Desired] = {}
        self.desired: Desired | None = (
            None if any(match is not None for _, _, match in steps) else self._build(())
        )

    def resolve(self, facts: Any) -> Desired:
        """The Desired of one key of the class (``facts`` adapts that key)."""
        if self.desired is not None:
            return self.desired
        # Walk the remaining steps as Ruleset.resolve would, recording only the
        # outcomes of per-key matches: they determine the path, hence the answer.
        decided = set(self.base)
        outcomes: list[bool] = []
        for _rule, fields, match in self.steps:
            if len(decided) == _ALL_FIELDS:
                break
            if decided.issuperset(fields):
                continue
            if match is not None:
                hit = match(facts)
                outcomes.append(hit)
                if not hit:
                    continue
            decided.update(fields)
        path = tuple(outcomes)
        try:
            return self._by_outcome[path]
        except KeyError:
            pass
        desired = self._build(path)
        if len(self._by_outcome) >= MEMO_LIMIT:
            self._by_outcome.clear()
        self._by_outcome[path] = desired
        return desired

    def _build(self, path: tuple[bool, ...]) -> Desired:
        """Replay the steps with the given per-key outcomes, keeping values and reasons."""
        values = dict(self.base)
        reasons = dict(self.reasons)
        outcomes = iter(path)
        for rule, fields, match in self.steps:
            if len(values) == _ALL_FIELDS:
                break
            todo = [f for f in fields if f not in values]
            if not todo or (match is not None and not next(outcomes)):
                continue
            for name in todo:
                values[name] = getattr(rule.actions, name)
                reasons[name] = Reason("rule", rule.name)
        if not values:
            return UNGOVERNED
        return Desired(reasons=reasons, **values)


class Classifier:
    """Resolves keys against one ruleset. Rebuilt on every reload."""

    def __init__(
        self,
        ruleset: Ruleset,
        on_rule_error: Callable[[Rule, Exception], None] | None = None,
        on_invalid_annotation: Callable[..., None] | None = None,
        reads: Mapping[Hashable, int] | None = None,
    ):
        #: The ruleset as loaded (what status and explain report).
        self.ruleset = ruleset
        #: What ``task.reads`` reads (see :class:`~amm_rules.engine.demand.DemandTracker`).
        self._reads = reads
        self._on_rule_error = on_rule_error
        self._on_invalid_annotation = on_invalid_annotation
        self._reported_rules: set[str] = set()
        self._annotations: dict[Hashable, Any] = {}
        #: Each rule once: (rule, its set fields, reads only class attributes, safe
        #: match, safe class part or None); see :meth:`_split`.
        self._rules = tuple(
            (rule, rule.actions.set_fields(), rule.depends <= CLASS_ATTRIBUTES, *self._split(rule))
            for rule in ruleset.rules
        )
        #: The class of a task: the class attributes any rule reads.
        self._class_of = class_reader(ruleset.depends & CLASS_ATTRIBUTES)
        #: (class, annotation, runtime target) -> its cascade.
        self._cascades: dict[Hashable, _ClassCascade] = {}

    @property
    def replicas_sensitive(self) -> bool:
        """True if some match reads ``task.replicas`` (it changes as copies come and go)."""
        return "replicas" in self.ruleset.depends

    @property
    def demand_sensitive(self) -> bool:
        """True if some match reads ``task.waiters`` or ``task.reads`` (they change as
        the key's dependents are submitted and finish)."""
        return not DEMAND_ATTRIBUTES.isdisjoint(self.ruleset.depends)

    def resolve(self, ts: Any, runtime: Target | RuntimeTarget | None = None) -> Desired:
        """The :class:`Desired` of a scheduler ``TaskState`` (or anything duck-alike):
        the same as ``ruleset.resolve(TaskFactsAdapter(ts), annotation, runtime)``."""
        annotation = self.annotation(ts)
        memo_key = (self._class_of(ts), annotation, runtime)
        cascade = self._cascades.get(memo_key)
        if cascade is not None and cascade.desired is not None:
            return cascade.desired
        facts = TaskFactsAdapter(ts, self._reads)
        if cascade is None:
            cascade = self._cascade(facts, annotation, runtime)
            if len(self._cascades) >= MEMO_LIMIT:
                self._cascades.clear()
            self._cascades[memo_key] = cascade
        return cascade.resolve(facts)

    def annotation(self, ts: Any) -> Actions | None:
        """The key's parsed ``amm`` annotation, with a top-level ``replicate`` annotation
        as shorthand for ``amm={"replicate": ...}`` (``amm``'s own ``replicate`` wins);
        None if absent or invalid."""
        annotations = ts.annotations
        if not annotations:
            return None
        value = annotations.get("amm")
        short = annotations.get("replicate")
        if value is None and short is None:
            return None
        frozen = freeze(value) if short is None else (freeze(value), freeze(short))
        try:
            parsed = self._annotations[frozen]
        except KeyError:
            parsed = self._parse_annotation(value, short, ts.key)
            if len(self._annotations) >= MEMO_LIMIT:
                self._annotations.clear()
            self._annotations[frozen] = parsed
        return None if parsed is _INVALID else parsed

    def _parse_annotation(self, value: Any, short: Any, key: Hashable) -> Any:
        """Parse once per distinct pair of values. An invalid ``amm`` is ignored as a
        whole, an invalid ``replicate`` alone; each is reported (never raised)."""
        amm: Any = None
        if value is not None:
            try:
                amm = parse_actions(value, known_pools=self.ruleset.pools)
            except ActionError as exc:
                amm = _INVALID
                self._invalid(value, exc, key, "amm")
        if short is None:
            return amm
        try:
            target = parse_target(short)
        except ActionError as exc:
            self._invalid(short, exc, key, "replicate")
            return amm
        if amm is None or amm is _INVALID:
            return Actions(replicate=target)
        return amm if amm.replicate is not None else replace(amm, replicate=target)

    def ignored_annotations(self, ts: Any) -> list[str]:
        """The names of the key's annotations (``amm``, ``replicate``) that are invalid
        and ignored, for ``explain`` (not memoized: explain is rare)."""
        annotations = ts.annotations or {}
        out = []
        if annotations.get("amm") is not None:
            try:
                parse_actions(annotations["amm"], known_pools=self.ruleset.pools)
            except ActionError:
                out.append("amm")
        if annotations.get("replicate") is not None:
            try:
                parse_target(annotations["replicate"])
            except ActionError:
                out.append("replicate")
        return out

    def _invalid(self, value: Any, exc: ActionError, key: Hashable, name: str) -> None:
        if self._on_invalid_annotation is None:
            return
        if name == "amm":
            self._on_invalid_annotation(value, exc, key)
        else:
            self._on_invalid_annotation(value, exc, key, name=name)

    def _cascade(
        self, facts: Any, annotation: Actions | None, runtime: Target | RuntimeTarget | None
    ) -> _ClassCascade:
        """Run the cascade of ``Ruleset.resolve`` for the class of ``facts`` as far as
        class attributes allow (see :class:`_ClassCascade`)."""
        values, reasons = overrides(annotation, runtime)
        steps: list[_Step] = []
        for rule, fields, class_only, match, class_part in self._rules:
            if len(values) == _ALL_FIELDS:
                break
            todo = [f for f in fields if f not in values]
            if not todo:
                continue  # decided for every key of the class: never evaluated
            if not class_only:
                if class_part is not None and not class_part(facts):
                    continue  # false for the whole class: no key matches
                steps.append((rule, fields, match))
            elif not match(facts):
                continue
            elif steps:
                # Matches the whole class, but whether it decides a field depends on
                # the per-key rules before it.
                steps.append((rule, fields, None))
            else:
                for name in todo:
                    values[name] = getattr(rule.actions, name)
                    reasons[name] = Reason("rule", rule.name)
        return _ClassCascade(values, reasons, steps)

    def _split(self, rule: Rule) -> tuple[Predicate, Predicate | None]:
        """The rule's match as (what each key evaluates, what its class evaluates once).

        A match ``a and b`` whose operands read class attributes only in part is split:
        the class operands are evaluated once per class, and the keys of a class for
        which they hold evaluate only the others (``task.type == "numpy.ndarray" and
        task.nbytes >= 1 GiB`` reads ``nbytes`` only for numpy arrays). Operands have
        no side effects and never raise for the documented facts, so evaluating them in
        another order gives the same answer. Any other match: (the whole match, None)."""
        if rule.depends <= CLASS_ATTRIBUTES or not rule.conjuncts:
            return self._safe(rule), None
        by_class = [fn for fn, depends in rule.conjuncts if depends <= CLASS_ATTRIBUTES]
        per_key = [fn for fn, depends in rule.conjuncts if not depends <= CLASS_ATTRIBUTES]
        if not by_class:
            return self._safe(rule), None
        # Imported here: the expression package loads the parser, which a Classifier of
        # an already compiled ruleset has no other use for.
        from amm_rules.language.expr.compiler import all_of

        return self._safe(rule, all_of(per_key)), self._safe(rule, all_of(by_class))

    def _safe(self, rule: Rule, predicate: Predicate | None = None) -> Predicate:
        """The rule's match (or a part of it), never raising: an exception is "no
        match", reported once per rule."""
        if predicate is None:
            predicate = rule.match

        def safe(facts: Any) -> bool:
            try:
                return bool(predicate(facts))
            except Exception as exc:
                self._rule_failed(rule, exc)
                return False

        return safe

    def _rule_failed(self, rule: Rule, exc: Exception) -> None:
        if rule.name in self._reported_rules:
            return
        self._reported_rules.add(rule.name)
        logger.warning(
            "amm-rules: the match of rule %r raised %r; treated as no match", rule.name, exc
        )
        if self._on_rule_error is not None:
            self._on_rule_error(rule, exc)
