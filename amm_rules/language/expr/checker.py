"""Static checks of an AST: attribute names, context, types and literal patterns.

Runs after :mod:`amm_rules.language.expr.parser` and before :mod:`amm_rules.language.expr.compiler`.
It walks the whole tree and collects every problem (one bad operand does not hide
another), then hands the compiler what it learnt: the registry entry of every attribute
(:mod:`amm_rules.language.expr.attributes`) and the precompiled matcher of every literal
glob pattern (:mod:`amm_rules.language.expr.glob`).

The typing rules, in short: numbers fit any numeric type, but sizes, counts,
fractions and durations do not fit each other; strings fit strings; ``true``/``false`` fit each
other and cannot be ordered; annotations (type *any*) fit everything and are checked
at run time; lists appear only on the right of ``in``/``not in``.
"""

from __future__ import annotations

from dataclasses import field, replace

from amm_rules.language.expr import ast
from amm_rules.language.expr.attributes import (
    HINTS,
    NUMERIC,
    Context,
    Resolved,
    ValueType,
    resolve,
    resource_attribute,
)
from amm_rules.language.expr.errors import (
    BAD_LITERAL,
    REGEX_PATTERN,
    RESOURCES_ANNOTATION,
    TYPE_MISMATCH,
    TYPE_NAME,
    Problem,
    problem_at,
)
from amm_rules.language.expr.glob import GlobError, Matcher, compile_glob, regex_meant
from amm_rules.language.records import record
from amm_rules.language.type_names import misspelt

_LITERAL_TYPES = {
    "string": ValueType.STRING,
    "number": ValueType.NUMBER,
    "size": ValueType.SIZE,
    "duration": ValueType.DURATION,
    "fraction": ValueType.FRACTION,
    "bool": ValueType.BOOL,
    "invalid": ValueType.ERROR,
}
_ORDERING = frozenset({"<", "<=", ">", ">="})
#: Resource names so common that an annotation of that name is almost certainly a
#: resource restriction misread (compared case-insensitively); the names a rules file's
#: pools read as ``worker.resources.NAME`` count too (see :func:`check`).
CONVENTIONAL_RESOURCES = frozenset({"gpu", "gpus", "tpu", "tpus"})


@record
class Checked:
    """What the checker learnt, keyed by ``id()`` of the AST nodes (the tree is alive
    for as long as this is used)."""

    attributes: dict[int, Resolved] = field(default_factory=dict)
    patterns: dict[int, Matcher] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    #: What is legal but almost certainly not meant (``validate`` shows them as
    #: warnings): a type name that looks misspelt, a resource read as an annotation, a
    #: regular expression given to ``matches``.
    warnings: list[Problem] = field(default_factory=list)
    #: The names read as ``worker.resources.NAME`` / ``task.resources.NAME``.
    resources: set[str] = field(default_factory=set)


def check(root: ast.Node, context: Context, resources: frozenset[str] = frozenset()) -> Checked:
    """Check ``root`` as a condition in ``context``; problems are in the result.
    ``resources``: names known to be resources (those the file's pools read): an
    annotation of one of these names gets a ``resources-annotation`` warning."""
    checker = _Checker(context, resources)
    checker.condition(root)
    return checker.result


def fits(a: ValueType, b: ValueType) -> bool:
    """Can values of types ``a`` and ``b`` be compared with ``==``?"""
    if ValueType.LIST in (a, b):
        return False
    if a is b or ValueType.ANY in (a, b):
        return True
    return a in NUMERIC and b in NUMERIC and ValueType.NUMBER in (a, b)


class _Checker:
    def __init__(self, context: Context, resources: frozenset[str] = frozenset()):
        self.context = context
        self.result = Checked()
        #: Casefolded resource name -> the name as a pool reads it (None: a
        #: conventional name, suggested as the annotation writes it).
        self.resources: dict[str, str | None] = dict.fromkeys(CONVENTIONAL_RESOURCES)
        self.resources.update((name.casefold(), name) for name in resources)

    # -- conditions and values -------------------------------------------------------

    def condition(self, node: ast.Node) -> None:
        """``node`` is used as true/false: an operand of and/or/not, or the whole."""
        if isinstance(node, ast.Attribute):
            # Any attribute may stand alone: it is tested for truth (0, "" and null
            # are false), as in 'not worker.resources.GPU'.
            self.value(node)
        elif isinstance(node, (ast.Literal, ast.ListLiteral)):
            kind = self.value(node)
            if kind not in (ValueType.BOOL, ValueType.ERROR):
                self._not_a_condition(node, kind)
        elif isinstance(node, (ast.And, ast.Or)):
            for operand in node.operands:
                self.condition(operand)
        elif isinstance(node, ast.Not):
            self.condition(node.operand)
        else:
            self.compare(node)

    def value(self, node: ast.Node) -> ValueType:
        """The type of ``node`` used as an operand of a comparison."""
        if isinstance(node, ast.Attribute):
            resolved = resolve(node, self.context)
            if isinstance(resolved, Problem):
                self.result.problems.append(resolved)
                return ValueType.ERROR
            self.result.attributes[id(node)] = resolved
            if resolved.spec.name == "resources" and resolved.key is not None:
                self.result.resources.add(resolved.key)
            elif resolved.spec.name == "annotations" and resolved.key == "resources":
                self._resources_annotation(node, resolved.path[0] if resolved.path else "GPU")
            elif (
                resolved.spec.name == "annotations"
                and resolved.key is not None
                and resolved.key.casefold() in self.resources
            ):
                written = self.resources[resolved.key.casefold()]
                self._resources_annotation(node, written or resolved.key)
            return resolved.spec.type
        if isinstance(node, ast.Literal):
            return _LITERAL_TYPES[node.kind]
        if isinstance(node, ast.ListLiteral):
            return ValueType.LIST
        self.condition(node)
        return ValueType.BOOL

    # -- comparisons -----------------------------------------------------------------

    def compare(self, node: ast.Compare) -> None:
        left = self.value(node.left)
        right = self.value(node.right)
        if ValueType.ERROR in (left, right):
            return
        self._names(node)
        if node.op in ("in", "not in"):
            self._membership(node, left, right)
        elif node.op == "matches":
            self._matches(node, left, right)
        else:
            self._comparison(node, left, right)

    def _comparison(self, node: ast.Compare, left: ValueType, right: ValueType) -> None:
        for side, kind in ((node.left, left), (node.right, right)):
            if kind is ValueType.LIST:
                self._problem(side, f"a list can only follow 'in' or 'not in', not {node.op!r}")
                return
        if node.op in _ORDERING:
            for side, kind in ((node.left, left), (node.right, right)):
                if kind is ValueType.BOOL:
                    self._problem(
                        side, f"true and false cannot be ordered with {node.op!r}; use == or !="
                    )
                    return
        if not fits(left, right):
            self._mismatch(node.left, left, node.right, right)

    def _membership(self, node: ast.Compare, left: ValueType, right: ValueType) -> None:
        if left is ValueType.LIST:
            self._problem(
                node.left, f"a list cannot be looked up with {node.op!r}; only single values"
            )
            return
        if isinstance(node.right, ast.ListLiteral):
            for item in node.right.items:
                kind = _LITERAL_TYPES[item.kind]
                if kind is not ValueType.ERROR and not fits(left, kind):
                    self._mismatch(node.left, left, item, kind)
                    return
            return
        if right is not ValueType.ANY:
            hint = (
                "; to look for a part of a string, use matches with a pattern such as '*part*'"
                if right is ValueType.STRING
                else ""
            )
            self._problem(
                node.right,
                f"{node.op!r} needs a list on its right, such as ['a', 'b'], but "
                f"{_describe(node.right)} is {right.value}{hint}",
            )

    def _matches(self, node: ast.Compare, left: ValueType, right: ValueType) -> None:
        ok = (ValueType.STRING, ValueType.ANY)
        if left not in ok:
            self._problem(
                node.left,
                f"'matches' compares a string with a glob pattern, but {_describe(node.left)} "
                f"is {left.value}",
            )
        if right not in ok:
            self._problem(
                node.right,
                f"'matches' needs a glob pattern (a string such as 'x-*') on its right, but "
                f"{_describe(node.right)} is {right.value}",
            )
            return
        pattern = node.right
        if isinstance(pattern, ast.Literal) and isinstance(pattern.value, str):
            self._regex(pattern)
            try:
                self.result.patterns[id(pattern)] = compile_glob(pattern.value)
            except GlobError as error:
                problem = problem_at(pattern.span, BAD_LITERAL, f"bad pattern: {error.message}")
                if "\\" not in pattern.text:
                    # Without escapes, character i of the pattern is column + 1 + i.
                    column = pattern.span.column + 1 + error.offset
                    problem = replace(problem, column=column, end_column=column + 1)
                self.result.problems.append(problem)

    # -- names written as strings: types and spans -------------------------------------

    def _names(self, node: ast.Compare) -> None:
        """Check the strings compared with ``task.type`` (a misspelt known name is a
        warning) and ``task.span`` (a path that no span can have is an error)."""
        for side, other in ((node.left, node.right), (node.right, node.left)):
            resolved = self.result.attributes.get(id(side))
            if resolved is None or resolved.spec.context != "task":
                continue
            name = resolved.spec.name
            if name not in ("type", "span"):
                continue
            literals = other.items if isinstance(other, ast.ListLiteral) else (other,)
            for literal in literals:
                value = literal.value if isinstance(literal, ast.Literal) else None
                if not isinstance(value, str):
                    continue
                if name == "span":
                    why = span_problem(value, node.op == "matches")
                    if why is not None:
                        self.result.problems.append(problem_at(literal.span, BAD_LITERAL, why))
                elif node.op != "matches" and (hint := misspelt(value)) is not None:
                    self._warn(
                        literal,
                        f"no type is recorded as {value!r}; did you mean {hint!r}? (the type "
                        "names in docs/expressions.md match whichever name a release records)",
                        TYPE_NAME,
                    )

    def _regex(self, pattern: ast.Literal) -> None:
        """A ``matches`` pattern that reads as a regular expression: say so, with the
        glob it probably means."""
        value = pattern.value
        assert isinstance(value, str)
        regex, glob = regex_meant(value)
        if not regex:
            return
        meant = (
            f"; did you mean {_quote_like(pattern.text, glob)}?"
            if glob is not None
            else "; for alternatives, join comparisons with 'or' or use 'in [...]'"
        )
        self._warn(
            pattern,
            f"{pattern.text} looks like a regular expression, but 'matches' takes a "
            f"glob pattern (*, ?, [abc]; the whole string must match){meant}",
            REGEX_PATTERN,
        )

    def _resources_annotation(self, node: ast.Attribute, resource: str) -> None:
        self._warn(
            node,
            f"{node.name} reads an annotation; what a task asked for with resources= "
            f"is its resource restriction: write {resource_attribute(resource)}",
            RESOURCES_ANNOTATION,
        )

    def _warn(self, node: ast.Node, message: str, code: str) -> None:
        """A warning at ``node`` (legal, almost certainly not meant)."""
        self.result.warnings.append(problem_at(node.span, code, message))

    # -- messages --------------------------------------------------------------------

    def _mismatch(
        self, left: ast.Node, left_type: ValueType, right: ast.Node, right_type: ValueType
    ) -> None:
        """Report two operands that do not fit, at the one most likely wrong: the
        literal next to an attribute, else the right-hand side."""
        if _is_literal(left) and not _is_literal(right):
            known, known_type, culprit, culprit_type = right, right_type, left, left_type
        else:
            known, known_type, culprit, culprit_type = left, left_type, right, right_type
        hint = HINTS.get(known_type)
        if isinstance(known, ast.Attribute) and hint:
            message = (
                f"{known.name} is {known_type.value}; {hint} "
                f"({_describe(culprit)} is {culprit_type.value})"
            )
        else:
            message = (
                f"cannot compare {_describe(known)} ({known_type.value}) with "
                f"{_describe(culprit)} ({culprit_type.value})"
            )
        self._problem(culprit, message)

    def _not_a_condition(self, node: ast.Node, kind: ValueType) -> None:
        example = ""
        if isinstance(node, ast.Literal) and kind is ValueType.STRING:
            name = "prefix" if self.context == "task" else "name"
            example = f", e.g. {self.context}.{name} == {node.text}"
        self._problem(
            node,
            f"{_describe(node)} is {kind.value}, not a condition; compare an attribute "
            f"with it{example}",
        )

    def _problem(self, node: ast.Node, message: str) -> None:
        self.result.problems.append(problem_at(node.span, TYPE_MISMATCH, message))


def span_problem(value: str, pattern: bool = False) -> str | None:
    """Why no span's path can be (or, for a pattern, match) ``value``; None if it can.

    A span's path is its names joined by ``/``: ``"etl/load"``. Names cannot be empty,
    so a path neither starts nor ends with ``/`` nor holds ``//``; the tuple
    distributed shows (``('etl', 'load')``) is written as the path."""
    if not value:
        return "a span path cannot be empty; outside any span a key's span is 'default'"
    stripped = value.strip()
    if stripped.startswith(("(", "[")) and stripped.endswith((")", "]")) and "," in stripped:
        names = [n.strip().strip("'\"") for n in stripped[1:-1].split(",") if n.strip()]
        return (
            f"{value!r} is not a span path: write the span's names joined by '/', "
            f"e.g. {'/'.join(names)!r}"
        )
    if value.startswith("/") or value.endswith("/") or "//" in value:
        cleaned = "/".join(p for p in value.split("/") if p)
        hint = f"; did you mean {cleaned!r}?" if cleaned else ""
        what = "pattern" if pattern else "path"
        return (
            f"{value!r} is not a span {what}: span names are joined by a single '/', "
            f"with no '/' at either end{hint}"
        )
    return None


def _quote_like(text: str, value: str) -> str:
    """``value`` quoted as ``text`` (a string literal as written) is."""
    quote = text[0] if text[:1] in ("'", '"') else '"'
    return f"{quote}{value}{quote}"


def _is_literal(node: ast.Node) -> bool:
    return isinstance(node, (ast.Literal, ast.ListLiteral))


def _describe(node: ast.Node) -> str:
    if isinstance(node, ast.Attribute):
        return node.name
    if isinstance(node, ast.Literal):
        return node.text
    if isinstance(node, ast.ListLiteral):
        return "the list"
    return "the condition"
