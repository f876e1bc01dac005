"""The syntax tree of an expression: frozen dataclass nodes, each with its span.

:mod:`amm_rules.language.expr.parser` builds these from lark's parse tree; the checker and the
compiler (:mod:`amm_rules.language.expr.checker`, :mod:`amm_rules.language.expr.compiler`) only read
them. Spans are 1-based lines and columns within the expression text, taken from
lark's tokens where the text enters; ``end_column`` is just past the last character.
Parentheses leave no node: ``(a)`` is the node of ``a``.
"""

from __future__ import annotations

from typing import Literal as TypingLiteral

from amm_rules.language.records import record

#: The kinds of literal, as written.
LiteralKind = TypingLiteral["string", "number", "size", "duration", "fraction", "bool", "invalid"]
#: Comparison operators.
CompareOp = TypingLiteral["==", "!=", "<", "<=", ">", ">=", "in", "not in", "matches"]


@record(frozen=True)
class Span:
    """Where a node is in its expression: lines and columns, counted from 1."""

    line: int
    column: int
    end_line: int
    end_column: int

    def to(self, other: Span) -> Span:
        """The span from the start of ``self`` to the end of ``other``."""
        return Span(self.line, self.column, other.end_line, other.end_column)


@record(frozen=True)
class Attribute:
    """``task.prefix``, ``worker.resources.GPU``, ``task.annotations["my-key"]``."""

    #: The names as written: ``("task", "annotations", "my-key")``.
    parts: tuple[str, ...]
    span: Span
    #: The span of each part, to point at the one that is wrong.
    part_spans: tuple[Span, ...]

    @property
    def name(self) -> str:
        """The attribute as a user would write it, for messages."""
        out = self.parts[0]
        for part in self.parts[1:]:
            out += f".{part}" if part.isidentifier() else f"[{part!r}]"
        return out


@record(frozen=True)
class Literal:
    """A string, number, size, duration, percentage or boolean, with its decoded value.

    Sizes are whole bytes (``int``), durations seconds (``10 min`` is 600.0),
    percentages are fractions (``30%`` is 0.3).
    ``kind == "invalid"`` marks a literal that already produced a problem; the
    checker then stays quiet about it.
    """

    value: str | int | float | bool | None
    kind: LiteralKind
    #: The literal exactly as written, for messages.
    text: str
    span: Span


@record(frozen=True)
class ListLiteral:
    """``["a", "b"]``: literals only."""

    items: tuple[Literal, ...]
    span: Span


@record(frozen=True)
class Not:
    """``not a``."""

    operand: Node
    span: Span


@record(frozen=True)
class And:
    """``a and b and c``: one node for the whole chain."""

    operands: tuple[Node, ...]
    span: Span


@record(frozen=True)
class Or:
    """``a or b or c``: one node for the whole chain."""

    operands: tuple[Node, ...]
    span: Span


@record(frozen=True)
class Compare:
    """``left op right`` for every comparison, ``in``, ``not in`` and ``matches``."""

    op: CompareOp
    left: Node
    right: Node
    span: Span
    #: The span of the operator, for errors about the comparison as a whole.
    op_span: Span


Node = Attribute | Literal | ListLiteral | Not | And | Or | Compare
