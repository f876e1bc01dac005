"""The expression language of rules files: a rule's ``match`` and a pool's workers.

``compile_expression(text, context)`` is the whole public interface: it parses the
text (:mod:`.parser`, with the lark grammar in ``grammar/expr.lark``), checks names and
types (:mod:`.checker`, against the registry in :mod:`.attributes`) and builds a
predicate from closures (:mod:`.compiler`). Any problem raises one
:class:`ExpressionError` listing every :class:`Problem` found, with 1-based positions
within the expression text; :mod:`amm_rules.language.loader` translates them to the rules file.

The reference for users is ``docs/expressions.md``. Nothing here imports
``distributed``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from amm_rules.language.expr.ast import And, Node
from amm_rules.language.expr.attributes import CONTEXTS, Context
from amm_rules.language.expr.checker import check
from amm_rules.language.expr.compiler import compile_condition
from amm_rules.language.expr.errors import TOO_DEEP, ExpressionError, Problem
from amm_rules.language.expr.parser import MAX_DEPTH, MAX_LENGTH, MAX_LIST_ITEMS, parse
from amm_rules.language.records import record

__all__ = [
    "MAX_DEPTH",
    "MAX_LENGTH",
    "MAX_LIST_ITEMS",
    "CompiledExpression",
    "Context",
    "ExpressionError",
    "Problem",
    "compile_expression",
]


#: One operand of a top-level ``and``: its predicate and the attribute roots it reads.
Conjunct = tuple[Callable[[Any], bool], frozenset[str]]


@record(frozen=True, eq=False)
class CompiledExpression:
    """A compiled ``match`` or pool expression."""

    #: The expression text, as given.
    source: str
    #: ``"task"`` (a rule's match) or ``"worker"`` (a pool).
    context: Context
    #: ``predicate(facts) -> bool``; ``facts`` has the attributes of
    #: :class:`~amm_rules.language.ruleset.TaskFacts` or :class:`~amm_rules.language.ruleset.WorkerFacts`.
    #: It never raises for facts of the documented types.
    predicate: Callable[[Any], bool]
    #: Attribute roots the predicate reads, e.g. ``{"prefix", "annotations"}``;
    #: empty for a constant.
    depends: frozenset[str]
    #: ``True``/``False`` when the expression is the same for every key or worker
    #: (``true``, ``1 < 2``, ``x or true``), else ``None``.
    constant: bool | None
    #: The root of the syntax tree.
    ast: Node
    #: For a top-level ``a and b and ...``: each operand that is not constant, compiled
    #: on its own, with the attribute roots it reads (in source order); else empty. A
    #: caller that knows some attributes to be shared by many facts objects can evaluate
    #: the operands reading only those once for all of them (the rules engine does so
    #: per class of keys).
    conjuncts: tuple[Conjunct, ...] = ()
    #: What is legal but almost certainly not meant (a misspelt type name, the
    #: ``resources`` annotation), positioned in the text: warnings, never raised.
    warnings: tuple[Problem, ...] = ()
    #: The resource names it reads (``worker.resources.GPU``: ``GPU``).
    resources: frozenset[str] = frozenset()

    def __call__(self, facts: Any) -> bool:
        return self.predicate(facts)

    def __repr__(self) -> str:
        return f"<CompiledExpression {self.context}: {self.source}>"


def compile_expression(
    text: str, context: Context, resources: frozenset[str] = frozenset()
) -> CompiledExpression:
    """Compile ``text`` for ``context`` (``"task"`` or ``"worker"``). ``resources``: names
    known to be resources (those the pools of the file read), which an annotation
    should not be named after (a ``resources-annotation`` warning).

    Raises :class:`ExpressionError` with every problem found: all name, type and
    literal problems at once; a syntax error stops at the first.
    """
    if context not in CONTEXTS:
        raise ValueError(f"context must be 'task' or 'worker', not {context!r}")
    if not isinstance(text, str):
        raise TypeError(f"an expression is a string, not {type(text).__name__}")
    try:
        found: list[Problem] = []
        root = parse(text, found)
        checked = check(root, context, resources)
        found += checked.problems
        if found:
            raise ExpressionError(found, text)
        code = compile_condition(root, checked)
    except RecursionError:
        # Defensive: the depth limit keeps every recursive pass far from Python's
        # limit, but the caller's own stack depth is unknown.
        raise ExpressionError(
            [Problem("the expression is nested too deeply", 1, 1, TOO_DEEP)], text
        ) from None
    constant: bool | None = None
    conjuncts: tuple[Conjunct, ...] = ()
    if code.fn is None:
        constant = bool(code.value)
        predicate: Callable[[Any], bool] = (lambda _f: True) if constant else (lambda _f: False)
    else:
        predicate, conjuncts = code.fn, _conjuncts(root, checked)
    return CompiledExpression(
        text,
        context,
        predicate,
        code.depends,
        constant,
        root,
        conjuncts,
        tuple(checked.warnings),
        frozenset(checked.resources),
    )


def _conjuncts(root: Node, checked: Any) -> tuple[Conjunct, ...]:
    if not isinstance(root, And):
        return ()
    out = []
    for operand in root.operands:
        code = compile_condition(operand, checked)
        if code.fn is not None:  # a constant true operand changes nothing (false: constant)
            out.append((code.fn, code.depends))
    return tuple(out) if len(out) > 1 else ()
