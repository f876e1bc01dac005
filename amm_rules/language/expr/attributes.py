"""The attributes an expression can read, their value types, and their lookup.

This registry is the single list of ``task.*`` (a rule's ``match``) and ``worker.*``
(a pool) attributes: :mod:`amm_rules.language.expr.checker` resolves attribute nodes here,
:mod:`amm_rules.language.expr.compiler` builds getters from the result, and the attribute
tables in ``docs/expressions.md`` say what each one means. The root names are those
of :data:`amm_rules.language.ruleset.TASK_ATTRIBUTES` and :data:`~amm_rules.language.ruleset.WORKER_ATTRIBUTES`,
i.e. the fields of :class:`~amm_rules.language.ruleset.TaskFacts` and
:class:`~amm_rules.language.ruleset.WorkerFacts`.
"""

from __future__ import annotations

import enum
from functools import partial
from typing import Any, Literal

from amm_rules.language.expr.ast import Attribute
from amm_rules.language.expr.errors import (
    BAD_LITERAL,
    UNKNOWN_ATTRIBUTE,
    WRONG_CONTEXT,
    Problem,
    problem_at,
)
from amm_rules.language.records import record
from amm_rules.language.spelling import closest

Context = Literal["task", "worker"]
CONTEXTS: tuple[Context, ...] = ("task", "worker")


class ValueType(enum.Enum):
    """The static type of a value. The value is the phrase used in messages."""

    STRING = "a string"
    COUNT = "a count"
    SIZE = "a size in bytes"
    DURATION = "a duration in seconds"
    FRACTION = "a fraction between 0 and 1"
    #: A plain numeric literal, or a worker resource: fits any numeric type.
    NUMBER = "a number"
    BOOL = "true or false"
    LIST = "a list"
    #: An annotation: its type is only known at run time.
    ANY = "a value of any type"
    #: Something that already produced a problem; never reported again.
    ERROR = "an invalid value"


NUMERIC: frozenset[ValueType] = frozenset(
    {ValueType.COUNT, ValueType.SIZE, ValueType.DURATION, ValueType.FRACTION, ValueType.NUMBER}
)

#: How to write a value that fits each type: the end of a type-mismatch message.
HINTS: dict[ValueType, str] = {
    ValueType.STRING: "compare it with a quoted string such as 'x'",
    ValueType.COUNT: "compare it with a whole number such as 2",
    ValueType.SIZE: "compare it with a size such as 512 MiB",
    ValueType.DURATION: "compare it with a duration such as 10 min or 30s",
    ValueType.FRACTION: "compare it with a percentage such as 30% or a number such as 0.3",
    ValueType.NUMBER: "compare it with a number such as 1",
    ValueType.BOOL: "compare it with true or false",
}


@record(frozen=True)
class AttributeSpec:
    """One attribute: ``task.nbytes``, or a keyed family like ``worker.resources.NAME``."""

    context: Context
    #: The root: a field of the facts object (``"nbytes"``, ``"resources"``).
    name: str
    type: ValueType
    #: True for ``annotations`` and ``resources``: a mapping read by ``.NAME``.
    keyed: bool = False
    #: The value of a missing key of a keyed attribute.
    default: Any = None
    #: True for ``annotations``: the names after the first read nested mappings
    #: (``task.annotations.resources.GPU``).
    nested: bool = False

    @property
    def display(self) -> str:
        return f"{self.context}.{self.name}" + (".NAME" if self.keyed else "")


_T = ValueType
_task = partial(AttributeSpec, "task")
_worker = partial(AttributeSpec, "worker")
ATTRIBUTES: dict[Context, dict[str, AttributeSpec]] = {
    "task": {
        spec.name: spec
        for spec in (
            _task("key", _T.STRING),
            _task("prefix", _T.STRING),
            _task("group", _T.STRING),
            _task("type", _T.STRING),
            _task("nbytes", _T.SIZE),
            _task("replicas", _T.COUNT),
            _task("waiters", _T.COUNT),
            _task("reads", _T.COUNT),
            _task("annotations", _T.ANY, keyed=True, nested=True),
            _task("resources", _T.NUMBER, keyed=True, default=0),
            _task("span", _T.STRING),
            _task("span_done", _T.BOOL),
            _task("prefix_tasks", _T.COUNT),
            _task("prefix_produced_per_task", _T.SIZE),
            _task("prefix_freed_by_per_task", _T.SIZE),
            _task("prefix_net_per_task", _T.SIZE),
            _task("recompute_seconds", _T.DURATION),
        )
    },
    "worker": {
        spec.name: spec
        for spec in (
            _worker("address", _T.STRING),
            _worker("name", _T.STRING),
            _worker("host", _T.STRING),
            _worker("resources", _T.NUMBER, keyed=True, default=0),
            _worker("memory_limit", _T.SIZE),
            _worker("nthreads", _T.COUNT),
            _worker("memory", _T.SIZE),
            _worker("memory_fraction", _T.FRACTION),
        )
    },
}

_WHERE = {"task": "a rule's match", "worker": "a pool"}
_OTHER: dict[Context, Context] = {"task": "worker", "worker": "task"}


@record(frozen=True)
class Resolved:
    """An attribute node resolved against the registry: ``spec`` plus, for a keyed
    attribute, the ``key`` (``"GPU"`` in ``worker.resources.GPU``)."""

    spec: AttributeSpec
    key: str | None = None
    #: For a nested read (``task.annotations.a.b``): the names after ``key``.
    path: tuple[str, ...] = ()


def resolve(node: Attribute, context: Context) -> Resolved | Problem:
    """Look ``node`` up for ``context``; a :class:`Problem` says why it is not valid."""
    root, rest = node.parts[0], node.parts[1:]
    if root not in CONTEXTS:
        return _unknown_root(node, context)
    if root != context:
        where, other = _WHERE[context], _OTHER[context]
        return problem_at(
            node.span,
            WRONG_CONTEXT,
            f"{root} attributes cannot be used in {where}; {where} selects "
            f"{'keys' if context == 'task' else 'workers'} by {context}.* attributes"
            f" ({root}.* belongs in {_WHERE[other]})",
        )
    names = ATTRIBUTES[context]
    if not rest:
        return problem_at(
            node.span,
            UNKNOWN_ATTRIBUTE,
            f"'{root}' needs an attribute, e.g. {root}.{next(iter(names))}; "
            f"{root} attributes are {_listing(context)}",
        )
    spec = names.get(rest[0])
    if spec is None:
        hint = closest(rest[0], names, ignore_case=True)
        detail = (
            f"did you mean '{root}.{hint}'?"
            if hint
            else f"{root} attributes are {_listing(context)}"
        )
        return problem_at(
            node.part_spans[1], UNKNOWN_ATTRIBUTE, f"{root} has no attribute {rest[0]!r}; {detail}"
        )
    if spec.keyed:
        if len(rest) == 1:
            return problem_at(
                node.span,
                UNKNOWN_ATTRIBUTE,
                f"{root}.{spec.name} needs a name, e.g. {root}.{spec.name}."
                f"{'GPU' if spec.name == 'resources' else 'priority'}",
            )
        if len(rest) > 2 and not spec.nested:
            joined = ".".join(rest[1:])
            return problem_at(
                node.part_spans[3].to(node.span),
                UNKNOWN_ATTRIBUTE,
                f"{root}.{spec.name}.NAME takes exactly one name; for a name containing "
                f"dots write {root}.{spec.name}[{_quoted(joined)}]",
            )
        if spec.name == "resources":
            bad = _bad_resource_name(rest[1])
            if bad:
                return problem_at(node.part_spans[2], BAD_LITERAL, bad)
        return Resolved(spec, rest[1], tuple(rest[2:]))
    if len(rest) > 1:
        return problem_at(
            node.part_spans[2].to(node.span),
            UNKNOWN_ATTRIBUTE,
            f"{root}.{spec.name} has no attributes ({root}.{spec.name} is {spec.type.value})",
        )
    return Resolved(spec)


def _unknown_root(node: Attribute, context: Context) -> Problem:
    root = node.parts[0]
    span = node.part_spans[0]
    if len(node.parts) == 1:
        # A bare word: a forgotten prefix, a forgotten quote, or a literal from
        # another language.
        if root in ("null", "None", "nil", "none", "NULL"):
            return problem_at(
                span,
                BAD_LITERAL,
                f"there is no {root!r}: any comparison with a missing value is false; "
                f"test for a value with the attribute alone, e.g. 'not {context}."
                f"{'annotations.NAME' if context == 'task' else 'resources.NAME'}'",
            )
        hint: str | None
        if root in ATTRIBUTES[context]:
            hint = f"{context}.{root}"
        elif root in ("True", "False", "TRUE", "FALSE"):
            hint = root.lower()
        else:
            hint = closest(root, CONTEXTS, ignore_case=True)
        if hint:
            return problem_at(
                span, UNKNOWN_ATTRIBUTE, f"unknown name {root!r}; did you mean {hint!r}?"
            )
        return problem_at(
            span,
            UNKNOWN_ATTRIBUTE,
            f"unknown name {root!r}; attributes start with '{context}.', and a string needs "
            f'quotes: "{root}"',
        )
    hint = closest(root, CONTEXTS, ignore_case=True)
    detail = f"did you mean {hint!r}?" if hint else f"attributes start with '{context}.'"
    return problem_at(span, UNKNOWN_ATTRIBUTE, f"unknown name {root!r}; {detail}")


def resource_attribute(name: str) -> str:
    """How a match reads the resource ``name``: ``task.resources.GPU``,
    ``task.resources["gpu-a100"]``."""
    return f"task.resources.{name}" if name.isidentifier() else f'task.resources["{name}"]'


def _quoted(name: str) -> str:
    """``name`` as a string literal of the expression language."""
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _bad_resource_name(name: str) -> str | None:
    """Why ``name`` cannot be a resource's name, or None. Dask reads resources as
    ``NAME=AMOUNT`` pairs (``--resources "GPU=2"``): a name is a word, without spaces,
    ``=`` or ``,``."""
    if not name:
        return "a resource name cannot be empty; write e.g. resources.GPU"
    if any(ch.isspace() or ch in "=," or not ch.isprintable() for ch in name):
        hint = "".join(ch for ch in name if ch.isalnum() or ch in "_-.")
        suggestion = f"; did you mean {hint!r}?" if hint else ""
        return (
            f"{name!r} is not a resource name: resource names are words such as GPU or "
            f"gpu-a100, without spaces, '=' or ','{suggestion}"
        )
    return None


def _listing(context: Context) -> str:
    return ", ".join(spec.name for spec in ATTRIBUTES[context].values())
