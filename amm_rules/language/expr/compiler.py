"""Compiling a checked AST into plain Python closures.

Runs after :mod:`amm_rules.language.expr.checker`, which guarantees that attributes exist and
operand types fit; what is left to decide at run time is only null (and, for
annotations, the kind of value). The predicates run on the scheduler's event loop for
many keys per cycle, so the closures are specialised when they are built: literal
subexpressions are folded, ``in`` with a literal list becomes a frozenset lookup,
``matches`` with a literal pattern uses a precompiled matcher, and attribute access
is one ``attrgetter`` call (plus one ``.get`` for annotations and resources). No
closure builds a dict or a list per call. Nothing here uses ``eval``/``exec``.

Run-time semantics are docs/expressions.md's ("Null and annotations", "Type names"): a
comparison with null, or with an annotation of another kind, is false and never raises;
``task.type`` compares names through :mod:`amm_rules.language.type_names`.
"""

from __future__ import annotations

import numbers
import operator
from collections.abc import Callable, Mapping
from operator import attrgetter
from typing import Any

from amm_rules.language.expr import ast
from amm_rules.language.expr.attributes import Resolved, ValueType
from amm_rules.language.expr.checker import Checked
from amm_rules.language.expr.glob import glob_match
from amm_rules.language.records import record
from amm_rules.language.type_names import expand, names_of, public_name

Fn = Callable[[Any], Any]

_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
#: ``c < x`` is ``x > c``: comparisons with the constant on the left are turned round.
_MIRROR = {"==": "==", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_ORDERING = frozenset({"<", "<=", ">", ">="})

# The kinds of run-time value that can be compared (see kind_of).
STR = "string"
NUM = "number"
BOOL = "bool"
_ORDERED_KINDS = frozenset({STR, NUM})


def kind_of(value: Any) -> str | None:
    """The comparable kind of a run-time value, or ``None`` (null, lists, objects).

    ``bool`` is its own kind although Python counts it as an ``int``: an annotation
    ``True`` is not the number 1 here.
    """
    cls = type(value)
    if cls is str:
        return STR
    if cls is int or cls is float:
        return NUM
    if cls is bool:
        return BOOL
    if isinstance(value, str):
        return STR
    if isinstance(value, numbers.Real):  # e.g. numpy scalars
        return NUM
    return None


@record(frozen=True)
class Code:
    """A compiled node: either a constant, or a function of the facts object."""

    fn: Fn | None
    value: Any = None
    #: Attribute roots the function reads.
    depends: frozenset[str] = frozenset()

    def as_fn(self) -> Fn:
        if self.fn is not None:
            return self.fn
        value = self.value
        return lambda _facts: value


def constant(value: Any) -> Code:
    return Code(None, value)


def compile_condition(root: ast.Node, checked: Checked) -> Code:
    """Compile ``root`` (already checked without problems) as a condition."""
    return _Compiler(checked).condition(root)


class _Compiler:
    def __init__(self, checked: Checked):
        self.checked = checked

    # -- conditions ------------------------------------------------------------------

    def condition(self, node: ast.Node) -> Code:
        if isinstance(node, ast.And):
            return self._chain(node.operands, stop=False)
        if isinstance(node, ast.Or):
            return self._chain(node.operands, stop=True)
        if isinstance(node, ast.Not):
            inner = self.condition(node.operand)
            if inner.fn is None:
                return constant(not inner.value)
            fn = inner.fn
            return Code(lambda f: not fn(f), depends=inner.depends)
        if isinstance(node, ast.Compare):
            return self.compare(node)
        if isinstance(node, ast.Attribute):
            return self._truth(node)
        assert isinstance(node, ast.Literal)  # the checker allows only true/false here
        return constant(bool(node.value))

    def _chain(self, operands: tuple[ast.Node, ...], stop: bool) -> Code:
        """``and`` (``stop=False``: the first false decides) or ``or`` (``stop=True``)."""
        fns: list[Fn] = []
        depends: frozenset[str] = frozenset()
        for operand in operands:
            code = self.condition(operand)
            if code.fn is None:
                if bool(code.value) is stop:
                    return constant(stop)
                continue  # 'true and x' is x; 'false or x' is x
            fns.append(code.fn)
            depends |= code.depends
        if not fns:
            return constant(not stop)
        return Code(_any(fns) if stop else all_of(fns), depends=depends)

    def _truth(self, node: ast.Attribute) -> Code:
        resolved = self.checked.attributes[id(node)]
        get = getter(resolved)
        if resolved.spec.type is ValueType.ANY:

            def truth(facts: Any) -> bool:
                try:
                    return bool(get(facts))
                except Exception:  # e.g. an array annotation: no single truth value
                    return False

            fn: Fn = truth
        else:
            fn = lambda f: bool(get(f))  # noqa: E731
        return Code(fn, depends=frozenset({resolved.spec.name}))

    # -- values ----------------------------------------------------------------------

    def value(self, node: ast.Node) -> Code:
        if isinstance(node, ast.Attribute):
            resolved = self.checked.attributes[id(node)]
            return Code(getter(resolved), depends=frozenset({resolved.spec.name}))
        if isinstance(node, ast.Literal):
            return constant(node.value)
        if isinstance(node, ast.ListLiteral):
            return constant(tuple(item.value for item in node.items))
        return self.condition(node)

    def _is_any(self, node: ast.Node) -> bool:
        """Is ``node`` an annotation (its type known only at run time)?"""
        resolved = self.checked.attributes.get(id(node))
        return resolved is not None and resolved.spec.type is ValueType.ANY

    def _is_type(self, node: ast.Node) -> bool:
        """Is ``node`` ``task.type`` (compared through the table of type names)?"""
        resolved = self.checked.attributes.get(id(node))
        return (
            resolved is not None
            and resolved.spec.context == "task"
            and resolved.spec.name == "type"
        )

    def _type_compare(
        self, node: ast.Compare, left: Code, right: Code, depends: frozenset[str]
    ) -> Code | None:
        """``task.type == c`` and ``!=``, with the constant's aliases; ``task.type``
        against another attribute, by public names. None: not a type comparison."""
        if node.op not in ("==", "!=") or not (
            self._is_type(node.left) or self._is_type(node.right)
        ):
            return None
        negate = node.op == "!="
        if left.fn is None or right.fn is None:
            const, attr = (left, right) if left.fn is None else (right, left)
            if attr.fn is None:
                return None
            get = attr.fn
            if not isinstance(const.value, str):
                return None  # (an annotation on the other side: left as it is)
            names = frozenset(names_of(const.value))
            if negate:
                return Code(
                    lambda f: (v := get(f)) is not None and v not in names, depends=depends
                )
            if len(names) == 1:
                (only,) = names
                return Code(lambda f: get(f) == only, depends=depends)
            return Code(lambda f: get(f) in names, depends=depends)
        lf, rf = left.fn, right.fn

        def same(f: Any) -> bool:
            a, b = lf(f), rf(f)
            if not isinstance(a, str) or not isinstance(b, str):
                return False
            return (public_name(a) == public_name(b)) is not negate

        return Code(same, depends=depends)

    # -- comparisons -----------------------------------------------------------------

    def compare(self, node: ast.Compare) -> Code:
        left, right = self.value(node.left), self.value(node.right)
        depends = left.depends | right.depends
        if node.op in ("in", "not in"):
            return self._membership(node, left, right, depends)
        if node.op == "matches":
            return self._matches(node, left, right, depends)
        typed = self._type_compare(node, left, right, depends)
        if typed is not None:
            return typed
        op: str = node.op
        checked = self._is_any(node.left) or self._is_any(node.right)
        if left.fn is None and right.fn is None:
            return constant(bool(_OPS[op](left.value, right.value)))
        if left.fn is None:
            op, left, right = _MIRROR[op], right, left
        assert left.fn is not None
        if right.fn is None:
            fn = (_checked_against if checked else _typed_against)(op, left.fn, right.value)
        else:
            fn = (_checked_between if checked else _typed_between)(op, left.fn, right.fn)
        return Code(fn, depends=depends)

    def _membership(
        self, node: ast.Compare, left: Code, right: Code, depends: frozenset[str]
    ) -> Code:
        negate = node.op == "not in"
        if right.fn is not None:
            # A list only known at run time: an annotation.
            lf, rf = left.as_fn(), right.fn
            return Code(lambda f: _member(lf(f), rf(f), negate), depends=depends)
        items: tuple[Any, ...] = right.value
        if not items and not negate:
            return constant(False)  # nothing is in an empty list
        if left.fn is None:
            found = any(kind_of(x) is kind_of(left.value) and x == left.value for x in items)
            return constant(found is not negate)
        get = left.fn
        if not self._is_any(node.left):
            # The checker made sure the items fit the attribute's type.
            members = frozenset(items)
            if self._is_type(node.left):
                members = expand(members)
            if negate:
                return Code(
                    lambda f: (v := get(f)) is not None and v not in members, depends=depends
                )
            return Code(lambda f: get(f) in members, depends=depends)
        # An annotation: only items of the value's own kind can match it.
        kinds = {kind_of(x) for x in items}
        by_kind = {kind: frozenset(x for x in items if kind_of(x) is kind) for kind in kinds}
        if negate and not items:
            fn: Fn = lambda f: kind_of(get(f)) is not None  # noqa: E731
        elif negate:
            fn = lambda f: (s := by_kind.get(kind_of(v := get(f)))) is not None and v not in s  # noqa: E731
        else:
            fn = lambda f: (s := by_kind.get(kind_of(v := get(f)))) is not None and v in s  # noqa: E731
        return Code(fn, depends=depends)

    def _matches(
        self, node: ast.Compare, left: Code, right: Code, depends: frozenset[str]
    ) -> Code:
        matcher = self.checked.patterns.get(id(node.right))
        if matcher is not None:
            if left.fn is None:
                return constant(matcher(left.value))
            get = left.fn
            if self._is_type(node.left):
                return Code(
                    lambda f: isinstance(v := get(f), str) and any(map(matcher, names_of(v))),
                    depends=depends,
                )
            return Code(lambda f: isinstance(v := get(f), str) and matcher(v), depends=depends)
        lf, rf = left.as_fn(), right.as_fn()
        return Code(
            lambda f: (
                isinstance(v := lf(f), str) and isinstance(p := rf(f), str) and glob_match(p, v)
            ),
            depends=depends,
        )


# -- building blocks -----------------------------------------------------------------


def getter(resolved: Resolved) -> Fn:
    """Read one attribute from a facts object."""
    spec = resolved.spec
    read = attrgetter(spec.name)
    if not spec.keyed:
        return read
    key, default = resolved.key, spec.default
    if resolved.path:
        return _nested(read, (key, *resolved.path), default)

    def read_key(facts: Any) -> Any:
        mapping = read(facts)
        return default if mapping is None else mapping.get(key, default)

    return read_key


def _nested(read: Fn, names: tuple[Any, ...], default: Any) -> Fn:
    """Read ``names`` down nested mappings (``task.annotations.a.b``): the default
    where a name is missing or a value on the way is not a mapping."""

    def read_path(facts: Any) -> Any:
        value = read(facts)
        for name in names:
            if not isinstance(value, Mapping):
                return default
            value = value.get(name, default)
        return value

    return read_path


def all_of(fns: list[Fn]) -> Fn:
    """True where every function is (in order, stopping at the first false)."""
    if len(fns) == 1:
        return fns[0]
    if len(fns) == 2:
        a, b = fns
        return lambda f: a(f) and b(f)
    chain = tuple(fns)

    # A plain loop: all() over a generator costs a frame per call on a hot path.
    def every(facts: Any) -> bool:
        for fn in chain:  # noqa: SIM110
            if not fn(facts):
                return False
        return True

    return every


def _any(fns: list[Fn]) -> Fn:
    if len(fns) == 1:
        return fns[0]
    if len(fns) == 2:
        a, b = fns
        return lambda f: a(f) or b(f)
    chain = tuple(fns)

    def some(facts: Any) -> bool:
        for fn in chain:  # noqa: SIM110
            if fn(facts):
                return True
        return False

    return some


def _typed_against(op: str, get: Fn, c: Any) -> Fn:
    """``attribute op constant`` where the checker proved the types fit: only null
    needs care. One closure per operator, so that no call goes through a table."""
    if op == "==":
        return lambda f: get(f) == c  # null == c is already false
    if op == "!=":
        return lambda f: (v := get(f)) is not None and v != c
    if op == "<":
        return lambda f: (v := get(f)) is not None and v < c
    if op == "<=":
        return lambda f: (v := get(f)) is not None and v <= c
    if op == ">":
        return lambda f: (v := get(f)) is not None and v > c
    assert op == ">="
    return lambda f: (v := get(f)) is not None and v >= c


def _checked_against(op: str, get: Fn, c: Any) -> Fn:
    """``annotation op constant``: the value must be of the constant's kind."""
    kind = kind_of(c)
    cmp = _OPS[op]
    return lambda f: kind_of(v := get(f)) is kind and cmp(v, c)


def _typed_between(op: str, lf: Fn, rf: Fn) -> Fn:
    cmp = _OPS[op]
    return lambda f: (a := lf(f)) is not None and (b := rf(f)) is not None and cmp(a, b)


def _checked_between(op: str, lf: Fn, rf: Fn) -> Fn:
    cmp = _OPS[op]
    allowed = _ORDERED_KINDS if op in _ORDERING else frozenset({STR, NUM, BOOL})
    return lambda f: (
        (k := kind_of(a := lf(f))) in allowed and k is kind_of(b := rf(f)) and cmp(a, b)
    )


def _member(value: Any, container: Any, negate: bool) -> bool:
    """``value in container`` for a list known only at run time (an annotation)."""
    kind = kind_of(value)
    if isinstance(container, Mapping):
        # A mapping holds its names: '"GPU" in task.annotations.resources'.
        if kind is None or kind is BOOL:
            return False
        try:
            found = value in container
        except TypeError:  # (a mapping that refuses the key's type)
            return False
        return found is not negate
    if kind is None or not isinstance(container, (list, tuple, set, frozenset)):
        return False
    found = has_kind = False
    for item in container:
        if kind_of(item) is kind:
            has_kind = True
            if item == value:
                found = True
                break
    if not negate:
        return found
    # As for literal lists: a value of a kind the list does not hold does not fit.
    return not found and (has_kind or not container)
