"""Classification: what the rules, the key's ``amm`` annotation and its runtime target
want for one key in memory (a :class:`~amm_rules.language.ruleset.Desired`).

:class:`Classifier` wraps a :class:`~amm_rules.language.ruleset.Ruleset` for use in the scheduler.
It gives exactly the answer of :meth:`Ruleset.resolve <amm_rules.language.ruleset.Ruleset.resolve>`
(the cascade), at a cost that follows the *classes* of keys rather than keys x rules:

- a key's class is the values of the class attributes the rules read (prefix, group,
  type, annotations, the published memory flow of the prefix: see
  :data:`~amm_rules.language.ruleset.CLASS_ATTRIBUTES`), read once per key,
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

Keys arrive in memory by the thousand, and the keys of one task group nearly always
share their class: :meth:`Classifier.classify` (the cycle's path) remembers, per task
group, the class its last key had (the group fixes prefix and group name; the type and
the annotations are compared per key, because they are per task). A key whose type and
annotations are those of its group's last key gets the group's cascade at the cost of
a few attribute reads; any other key (another type, other annotations, a runtime
target) takes the path above, which then becomes its group's last class. What is left
per key is the cascade's per-key matches, if any, walked as a decision tree of their
outcomes.

Its neighbours: :mod:`amm_rules.engine.state.index` calls it for keys that entered memory;
:mod:`amm_rules.engine.handlers` for ``explain``. It reads tasks through
:class:`~amm_rules.engine.adapters.TaskFactsAdapter` and :func:`~amm_rules.engine.adapters.class_reader`, and
does not import ``distributed``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from amm_rules.engine.adapters import AnnotationTooLarge, TaskFactsAdapter, class_reader, freeze
from amm_rules.language.fields import ActionError, parse_actions, parse_target
from amm_rules.language.ruleset import (
    ACTION_FIELDS,
    CLASS_ATTRIBUTES,
    DEMAND_ATTRIBUTES,
    FLOW_ATTRIBUTES,
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


class _Node:
    """A per-key match of a class's cascade, and what each of its outcomes leads to:
    the next match to evaluate or the answer (built on first use)."""

    __slots__ = ("match", "path", "yes", "no")

    def __init__(self, match: Predicate, path: tuple[bool, ...]):
        self.match = match
        #: Outcomes of the per-key matches evaluated before this one.
        self.path = path
        self.yes: _Node | Desired | None = None
        self.no: _Node | Desired | None = None


_Branch = _Node | Desired


class _ClassCascade:
    """The cascade for one class of keys (class attributes, annotation, runtime target),
    with the rules that read only class attributes already evaluated.

    ``base`` holds the fields decided before the first rule that reads the key itself;
    ``steps`` the rules after it that may still decide a field for some key. Without a
    per-key step, :attr:`desired` is the answer for every key of the class. With some,
    the outcomes of the per-key matches that :meth:`Ruleset.resolve
    <amm_rules.language.ruleset.Ruleset.resolve>` would evaluate decide the answer:
    they are walked as a decision tree, each node built when a key first reaches it.
    """

    __slots__ = ("base", "reasons", "steps", "desired", "_root", "_nodes")

    def __init__(self, base: dict[str, Any], reasons: dict[str, Reason], steps: list[_Step]):
        self.base = base
        self.reasons = reasons
        self.steps = tuple(steps)
        self._nodes = 0
        self._root: _Branch = self._branch(())
        self.desired: Desired | None = self._root if isinstance(self._root, Desired) else None

    def resolve(self, facts: Any) -> Desired:
        """The Desired of one key of the class (``facts`` adapts that key)."""
        node = self._root
        while isinstance(node, _Node):
            if node.match(facts):
                child = node.yes
                if child is None:
                    child = node.yes = self._branch((*node.path, True))
            else:
                child = node.no
                if child is None:
                    child = node.no = self._branch((*node.path, False))
            node = child
        return node

    def _branch(self, path: tuple[bool, ...]) -> _Branch:
        """What follows the per-key outcomes ``path``: the next per-key match that
        ``Ruleset.resolve`` would evaluate, or the answer when there is none (the steps
        replayed with those outcomes, keeping values and reasons)."""
        if self._nodes >= MEMO_LIMIT:
            # Keys of one class taking ever new paths: forget the tree, start again.
            self._nodes = 0
            self._root = self._branch(())
        values = dict(self.base)
        reasons = dict(self.reasons)
        outcomes = iter(path)
        for rule, fields, match in self.steps:
            if len(values) == _ALL_FIELDS:
                break
            todo = [f for f in fields if f not in values]
            if not todo:
                continue
            if match is not None:
                try:
                    hit = next(outcomes)
                except StopIteration:
                    self._nodes += 1
                    return _Node(match, path)
                if not hit:
                    continue
            for name in todo:
                values[name] = getattr(rule.actions, name)
                reasons[name] = Reason("rule", rule.name)
        if not values:
            return UNGOVERNED
        return Desired(reasons=reasons, **values)


class _GroupClass:
    """The class of the last key classified of a task group (see :meth:`Classifier.classify`)."""

    __slots__ = ("type", "annotations", "cascade", "flow", "plain", "resources", "span_done")

    def __init__(
        self,
        type_: Any,
        annotations: Any,
        cascade: _ClassCascade,
        flow: Any = None,
        flow_sensitive: bool = False,
        resources: Any = None,
        span_done: Any = None,
    ):
        self.type = type_
        #: The key's annotations, None if it had none.
        self.annotations = annotations
        self.cascade = cascade
        #: The task's resource restriction (while rules read ``task.resources``): they
        #: are per task, like annotations, and compared per key.
        self.resources = resources
        #: The state of the group's span the class was made with (while rules read
        #: ``task.span_done``): a span that finished (or ran again) is another class.
        self.span_done = span_done
        #: The published memory flow of the group's prefix the class was made with
        #: (while rules read ``task.prefix_*``): a republished one is another class.
        self.flow = flow
        #: The Desired of every key of the group with this type, without annotations
        #: (nor a runtime target), when the class decides it and the rules do not read
        #: the memory flow: the commonest case, answered by one attribute read.
        self.plain = (
            cascade.desired
            if annotations is None and not flow_sensitive and span_done is None
            else None
        )


#: Governed keys of one classification that share a ``Desired``: (it, keys, tasks).
Batch = tuple[Desired, list[Hashable], list[Any]]


class Classifier:
    """Resolves keys against one ruleset. Rebuilt on every reload."""

    def __init__(
        self,
        ruleset: Ruleset,
        on_rule_error: Callable[[Rule, Exception], None] | None = None,
        on_invalid_annotation: Callable[..., None] | None = None,
        reads: Mapping[Hashable, int] | None = None,
        flow: Mapping[str, Any] | None = None,
        spans: Any = None,
        costs: Mapping[Any, float] | None = None,
    ):
        #: The ruleset as loaded (what status and explain report).
        self.ruleset = ruleset
        #: The state of spans (``task.span_done``: ``spans.done_of(ts)``), or None.
        self.spans = spans
        #: task group -> its published recompute estimate (``task.recompute_seconds``).
        self.costs = costs
        #: What ``task.reads`` reads (see :class:`~amm_rules.engine.state.demand.DemandTracker`).
        self._reads = reads
        #: prefix -> its published memory-flow figures (``task.prefix_*``), or None.
        self.flow = flow
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
        self._class_of = class_reader(ruleset.depends & CLASS_ATTRIBUTES, flow, spans)
        #: (class, annotation, runtime target) -> its cascade.
        self._cascades: dict[Hashable, _ClassCascade] = {}
        #: Task group -> the class of its last key classified (see classify). Holding
        #: the group keeps its identity unique while remembered.
        self._groups: dict[Any, _GroupClass] = {}
        #: Rules read ``task.prefix_*``: a group's class holds while its prefix's
        #: published figures are those it was made with.
        self._flow_sensitive = flow is not None and not FLOW_ATTRIBUTES.isdisjoint(ruleset.depends)
        #: Rules read ``task.resources``: a group's class holds for a key whose resource
        #: restriction is that of the group's last key.
        self._reads_resources = "resources" in ruleset.depends
        #: Rules read ``task.span_done``: a group's class holds while its span's state
        #: is the one it was made with.
        self._span_sensitive = spans is not None and ruleset.reads_span_state

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
        cascade = self._class_cascade(ts, runtime)
        if cascade.desired is not None:
            return cascade.desired
        return cascade.resolve(
            TaskFactsAdapter(ts, self._reads, self.flow, self.spans, self.costs)
        )

    def facts(self, ts: Any) -> TaskFactsAdapter:
        """``ts`` as a rule's match sees it: with demand's reads, the published memory
        flow, the spans and the recompute costs. (The per-key paths of :meth:`resolve`
        and :meth:`classify` build it inline: one call less per key.)"""
        return TaskFactsAdapter(ts, self._reads, self.flow, self.spans, self.costs)

    def _class_cascade(self, ts: Any, runtime: Target | RuntimeTarget | None) -> _ClassCascade:
        """The cascade of the key's class, annotation and runtime target (memoized)."""
        annotation = self.annotation(ts)
        memo_key = (self._class_of(ts), annotation, runtime)
        cascade = self._cascades.get(memo_key)
        if cascade is None:
            cascade = self._cascade(self.facts(ts), annotation, runtime)
            if len(self._cascades) >= MEMO_LIMIT:
                self._cascades.clear()
            self._cascades[memo_key] = cascade
        return cascade

    def classify(
        self,
        keys: Sequence[Hashable] | None,
        known: Sequence[Any],
        tasks: Mapping[Hashable, Any],
        runtime: Mapping[Hashable, Target | RuntimeTarget],
        indexed: Mapping[Hashable, Any],
    ) -> tuple[list[Batch], list[Hashable]]:
        """Resolve many keys, as :meth:`resolve` each, at a cost per key of a few
        attribute reads when its task group's last key had the same class.

        ``known`` holds the ``TaskState`` of each key, or None where it is not known:
        then it is looked up in ``tasks`` (the scheduler's ``tasks``; keys not there are
        skipped). Without ``keys``, ``known`` holds tasks only (None is skipped), and a
        key is read from its task only when needed: most keys are never touched, which
        spares the processor's caches. ``runtime`` holds the runtime targets, ``indexed`` the
        keys governed so far. Returns ``(batches, dropped)``: the governed keys in
        memory as :data:`Batch` tuples, one per distinct ``Desired``, and the keys of
        ``indexed`` that are no longer governed.

        A task's group must be hashable by identity and fix its prefix, as the
        scheduler's ``TaskGroup`` does (``TaskState.prefix`` is ``group.prefix``).
        """
        batches: dict[int, Batch] = {}
        dropped: list[Hashable] = []
        if keys is not None:
            # (Not ``None in known``: that would call TaskState.__eq__ for each task.)
            get = tasks.get
            known = [get(k) if ts is None else ts for k, ts in zip(keys, known, strict=True)]
            # One test in C for the lot: usually none of them is indexed.
            any_indexed = bool(indexed) and not indexed.keys().isdisjoint(keys)
        else:
            any_indexed = bool(indexed) and not indexed.keys().isdisjoint(
                ts.key for ts in known if ts is not None
            )
        groups = self._groups
        any_runtime = bool(runtime)
        flow = self.flow if self._flow_sensitive else None
        check_resources = self._reads_resources
        spans = self.spans if self._span_sensitive else None
        # Keys arrive a group at a time: the batch of the previous key is usually this
        # key's too, and is appended to without a lookup.
        previous: Desired | None = None
        add_key = add_task = dropped.append  # rebound before any use
        # The key is read from its task (ts.key) only where it is needed.
        for ts in known:
            if ts is None:
                continue
            last = groups.get(ts.group)
            # Case 0: the group's last class, with neither annotations nor a per-key
            # match (nor memory-flow figures): its Desired.
            if (
                last is not None
                and ts.type == last.type
                and not ts.annotations
                and (desired := last.plain) is not None
                and not (check_resources and ts.resource_restrictions != last.resources)
                and not (any_runtime and ts.key in runtime)
            ):
                pass
            else:
                # Case 1: the key has its group's last class: the group's cascade.
                if (
                    last is not None
                    and ts.type == last.type
                    and not (any_runtime and ts.key in runtime)
                    and (flow is None or flow.get(ts.prefix.name) is last.flow)
                    and not (check_resources and ts.resource_restrictions != last.resources)
                    and (spans is None or spans.done_of(ts) is last.span_done)
                ):
                    mine = ts.annotations
                    if mine:
                        theirs = last.annotations
                        same = theirs is not None and (mine is theirs or _same(mine, theirs))
                    else:
                        same = last.annotations is None
                    cascade = last.cascade if same else self._group_miss(ts, runtime)
                # Case 2: another class, or a runtime target: the class memo.
                else:
                    cascade = self._group_miss(ts, runtime)
                desired = cascade.desired
                if desired is None:
                    desired = cascade.resolve(
                        TaskFactsAdapter(ts, self._reads, self.flow, self.spans, self.costs)
                    )
            if desired is UNGOVERNED:
                if any_indexed and ts.key in indexed:
                    dropped.append(ts.key)
                continue
            if ts.state != "memory":
                continue
            if desired is not previous:
                batch = batches.get(id(desired))
                if batch is None:
                    batch = batches[id(desired)] = (desired, [], [])
                previous = desired
                add_key, add_task = batch[1].append, batch[2].append
            add_key(ts.key)
            add_task(ts)
        return list(batches.values()), dropped

    def _group_miss(
        self, ts: Any, runtime: Mapping[Hashable, Target | RuntimeTarget]
    ) -> _ClassCascade:
        """The cascade of a key whose group's last class does not apply; it becomes
        the group's last class unless the key has a runtime target (its own)."""
        target = runtime.get(ts.key)
        cascade = self._class_cascade(ts, target)
        if target is None:
            groups = self._groups
            if len(groups) >= MEMO_LIMIT:
                groups.clear()
            flow = self.flow.get(ts.prefix.name) if self._flow_sensitive and self.flow else None
            groups[ts.group] = _GroupClass(
                ts.type,
                ts.annotations or None,
                cascade,
                flow,
                self._flow_sensitive,
                ts.resource_restrictions if self._reads_resources else None,
                self.spans.done_of(ts) if self._span_sensitive else None,
            )
        return cascade

    @property
    def groups_remembered(self) -> int:
        """Task groups whose last class is remembered."""
        return len(self._groups)

    def forget_groups(self, live: Mapping[str, Any]) -> None:
        """Forget the groups that are no longer the scheduler's (``live``: its
        ``task_groups``, name -> group): their keys are gone, and remembering them
        would keep them in memory."""
        self._groups = {g: c for g, c in self._groups.items() if live.get(g.name) is g}

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
        try:
            frozen = freeze(value) if short is None else (freeze(value), freeze(short))
        except AnnotationTooLarge as exc:  # ignored for the key, like any invalid value
            name = "amm" if value is not None and _too_large(value) else "replicate"
            self._invalid(value if name == "amm" else short, exc, ts.key, name)
            return None
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

    def _invalid(self, value: Any, exc: Exception, key: Hashable, name: str) -> None:
        if self._on_invalid_annotation is not None:
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


_PLAIN = (str, int, bool, type(None))


def _same(a: Any, b: Any) -> bool:
    """True if two annotation values are the same for every rule and every ``amm``
    annotation: equal, and of the same types throughout (``1``, ``1.0`` and ``True``
    are equal in Python but not to a rule). Values of other types are compared by
    identity only; False sends the key down the full path, which is always right."""
    if a is b:
        return True
    kind = type(a)
    if kind is not type(b):
        return False
    if kind is dict:
        if len(a) != len(b):
            return False
        for name, value in a.items():
            other = b.get(name, _INVALID)
            if other is _INVALID or not _same(value, other):
                return False
        return True
    if kind is list or kind is tuple:
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if kind is float:
        return repr(a) == repr(b)  # -0.0 == 0.0, nan != nan: compare the spelling
    if kind in _PLAIN:
        return bool(a == b)
    return False


def _too_large(value: Any) -> bool:
    try:
        freeze(value)
    except AnnotationTooLarge:
        return True
    return False
