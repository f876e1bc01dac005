"""From expression text to the AST of :mod:`amm_rules.language.expr.ast`.

Owns the one shared lark LALR parser (made lazily, once per process, from
``grammar/expr.lark`` by :mod:`amm_rules.language.expr.table`), the limits on length and nesting, and the translation of
lark's exceptions into :class:`~amm_rules.language.expr.errors.Problem` with a line and column.
Literal tokens are decoded here (via :mod:`amm_rules.language.expr.literals`), so a bad escape
or an unknown unit is reported at the exact token; the problems of all literals are
collected, while a syntax error stops at the first. Types and attribute names are
checked later, by :mod:`amm_rules.language.expr.checker`.
"""

from __future__ import annotations

import contextlib
import re
import threading
from typing import cast

from lark import Lark, Token, Transformer, Tree
from lark.exceptions import (
    UnexpectedCharacters,
    UnexpectedInput,
    UnexpectedToken,
    VisitError,
)

from amm_rules.language.expr import ast
from amm_rules.language.expr.errors import (
    BAD_LITERAL,
    SYNTAX,
    TOO_DEEP,
    TOO_LONG,
    ExpressionError,
    Problem,
)
from amm_rules.language.expr.literals import (
    LiteralError,
    decode_duration,
    decode_number,
    decode_percent,
    decode_size,
    decode_string,
)
from amm_rules.language.fields import DURATION_UNITS

#: Longest expression accepted, in characters.
MAX_LENGTH = 4096
#: Deepest nesting of parentheses and ``not`` accepted.
MAX_DEPTH = 64
#: Most items in one list literal.
MAX_LIST_ITEMS = 10_000

KEYWORDS = ("and", "or", "not", "in", "matches", "true", "false")

_parser: Lark | None = None
_parser_lock = threading.Lock()


def get_parser() -> Lark:
    """The shared parser, made on first use, not at import (``amm-rules validate`` must
    start fast), by :func:`amm_rules.language.expr.table.make_parser`."""
    global _parser
    if _parser is None:
        with _parser_lock:
            if _parser is None:
                from amm_rules.language.expr.table import make_parser

                _parser = make_parser()
    return _parser


def parse(text: str, problems: list[Problem] | None = None) -> ast.Node:
    """Parse ``text`` into an AST; raise :class:`ExpressionError` on a syntax error
    or a limit exceeded.

    Bad literals do not stop parsing: their problems are appended to ``problems``
    when it is given (so that the checker's can join them), else raised. A bad
    literal is in the tree with ``kind == "invalid"``.
    """
    if len(text) > MAX_LENGTH:
        message = f"the expression is {len(text)} characters long; the limit is {MAX_LENGTH}"
        raise ExpressionError([Problem(message, 1, 1, TOO_LONG)], text)
    if not text.strip():
        raise ExpressionError([Problem("the expression is empty", 1, 1, SYNTAX, 2)], text)
    try:
        tree = get_parser().parse(text)
    except UnexpectedInput as exc:
        raise ExpressionError([_syntax_problem(exc, text)], text) from None
    deep = _too_deep(tree)
    if deep is not None:
        raise ExpressionError([deep], text)
    builder = _AstBuilder()
    try:
        node = builder.transform(tree)
    except VisitError as exc:
        # The one place where lark's wrapper is taken off an exception raised while
        # building the AST. RecursionError is the defensive case: the depth check
        # above keeps the tree far below Python's limit, but the caller's own stack
        # depth is unknown.
        if isinstance(exc.orig_exc, RecursionError):
            raise ExpressionError(
                [Problem("the expression is nested too deeply", 1, 1, TOO_DEEP)], text
            ) from None
        raise exc.orig_exc from None
    if problems is not None:
        problems.extend(builder.problems)
    elif builder.problems:
        raise ExpressionError(builder.problems, text)
    return node


# -- limits --------------------------------------------------------------------------


def _too_deep(tree: Tree) -> Problem | None:
    """The first ``(`` or ``not`` beyond :data:`MAX_DEPTH` levels, if any.

    Iterative on purpose: it runs before anything recursive sees the tree.
    """
    worst: tuple[int, int, int] | None = None
    stack: list[tuple[Tree | Token, int]] = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, Tree):
            continue
        if node.data in ("paren", "not_"):
            depth += 1
            if depth > MAX_DEPTH:
                first = node.children[0]
                assert isinstance(first, Token)
                here = (first.line or 1, first.column or 1, first.end_column or 2)
                worst = here if worst is None else min(worst, here)
                continue
        stack.extend((child, depth) for child in node.children)
    if worst is None:
        return None
    line, column, end = worst
    message = f"the expression is nested too deeply: more than {MAX_DEPTH} levels of "
    return Problem(message + "parentheses and 'not'", line, column, TOO_DEEP, end)


# -- syntax errors -------------------------------------------------------------------

#: How to name each terminal in "expected ..." (in this order).
_EXPECTED_NAMES = {
    "NAME": "an attribute",
    "STRING": "a string",
    "NUMBER": "a number",
    "TRUE": "true",
    "FALSE": "false",
    "LSQB": "'['",
    "LPAR": "'('",
    "NOT": "'not'",
    "COMPARE": "a comparison (== != < <= > >=)",
    "IN": "'in'",
    "MATCHES": "'matches'",
    "PERCENT": "'%'",
    "DOT": "'.'",
    "AND": "'and'",
    "OR": "'or'",
    "COMMA": "','",
    "RSQB": "']'",
    "RPAR": "')'",
    "$END": "the end of the expression",
}
_VALUE_START = {"NAME", "STRING", "NUMBER", "LPAR"}
_CHAR_HINTS = {
    "=": "use '==' to compare",
    "&": "use 'and'",
    "|": "use 'or'",
    "!": "use 'not', or '!=' to compare",
    '"': "this string has no closing quote on its line",
    "'": "this string has no closing quote on its line",
    "\\": "a backslash can only appear inside a string",
    "{": "there are no mappings; write a list with '[...]'",
    "+": "there is no arithmetic; write sizes with a unit, e.g. 512 MiB",
    "*": "there is no arithmetic; write sizes with a unit, e.g. 512 MiB (for a glob, use matches '...*')",
}


def _syntax_problem(exc: UnexpectedInput, text: str) -> Problem:
    if isinstance(exc, UnexpectedCharacters):
        pos = exc.pos_in_stream if exc.pos_in_stream is not None else len(text)
        char = text[pos] if pos < len(text) else ""
        hint = _bracket_hint(text, pos) or _CHAR_HINTS.get(char)
        message = f"unexpected character {char!r}" + (f"; {hint}" if hint else "")
        return Problem(message, exc.line, exc.column, SYNTAX, exc.column + 1)
    expected = _expected(exc)
    if isinstance(exc, UnexpectedToken) and exc.token.type != "$END":
        token = exc.token
        message = _unexpected_token_message(token, expected)
        end = token.end_column if token.end_line == token.line else None
        return Problem(message, token.line or 1, token.column or 1, SYNTAX, end)
    # The end of the text came too early: point just past its last character.
    line, column = _end_position(text)
    message = f"unexpected end of the expression; expected {_describe_expected(expected)}"
    return Problem(message, line, column, SYNTAX, column + 1)


#: An attribute of at least three parts written just before a character: ``task.annotations.x``
#: (compiled on first use, by ``re``'s cache: only an error needs it).
_ATTRIBUTE_BEFORE = r"(?<![\w.])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*){2,})$"
#: The rest of a name with ``-`` in it: ``-tier``, ``-v2-x``.
_DASHED_REST = r"(?:-[\w]+)+"


def _bracket_hint(text: str, pos: int) -> str | None:
    """``task.annotations.cache-tier``: a name with ``-`` is written in brackets, as
    ``task.annotations["cache-tier"]``; say so with the attribute rewritten."""
    if text[pos : pos + 1] != "-":
        return None
    before = re.search(_ATTRIBUTE_BEFORE, text[:pos])
    rest = re.compile(_DASHED_REST).match(text, pos)
    if before is None or rest is None:
        return None
    *parent, last = before.group(1).split(".")
    name = last + rest.group()
    return f"a name with '-' in it is written in brackets: {'.'.join(parent)}[\"{name}\"]"


def _expected(exc: UnexpectedInput) -> set[str]:
    """The terminals that could have come next.

    LALR merges states, so ``exc.expected`` may list tokens valid only in another
    context (``,`` after a number outside a list); asking the interactive parser
    which tokens it would really accept gives the exact set.
    """
    expected: set[str] = set(getattr(exc, "expected", None) or ())
    interactive = getattr(exc, "interactive_parser", None)
    if interactive is not None:
        # Best effort: exc.expected is still right, only less precise.
        with contextlib.suppress(Exception):
            expected = set(interactive.accepts())
    return expected


def _unexpected_token_message(token: Token, expected: set[str]) -> str:
    value = str(token)
    if token.type == "NAME" and value.lower() in KEYWORDS:
        return f"unexpected {value!r}; keywords are lowercase: write {value.lower()!r}"
    return f"unexpected {value!r}; expected {_describe_expected(expected)}"


def _describe_expected(expected: set[str]) -> str:
    names = set(expected)
    parts: list[str] = []
    if names >= _VALUE_START:
        # Where any value can start, say so in one phrase.
        parts.append("a value (an attribute such as task.prefix, a literal, or '(')")
        names -= _VALUE_START | {"TRUE", "FALSE", "LSQB", "NOT"}
    if names == {"NAME"}:
        return "a name"
    if {"COMPARE", "IN", "MATCHES"} <= names:
        parts.append("an operator (== != < <= > >= in, not in, matches)")
        # '.' and '[' may continue an attribute, but that is rarely what went wrong.
        names -= {"COMPARE", "IN", "MATCHES", "NOT", "DOT", "LSQB"}
    if "PERCENT" in names and "NAME" in names:
        # Only a number can be followed by '%' or a word: the word is a unit.
        names.discard("NAME")
        parts.append("a unit (such as MiB)")
    parts += [label for name, label in _EXPECTED_NAMES.items() if name in names]
    if not parts:
        return "something else"
    if len(parts) == 1:
        return parts[0]
    return ", ".join(parts[:-1]) + " or " + parts[-1]


def _end_position(text: str) -> tuple[int, int]:
    """Line and column just past the last non-blank character."""
    body = text.rstrip()
    line = body.count("\n") + 1
    column = len(body) - (body.rfind("\n") + 1) + 1
    return line, column


# -- lark tree -> AST ----------------------------------------------------------------


def _span(token: Token) -> ast.Span:
    return ast.Span(token.line or 1, token.column or 1, token.end_line or 1, token.end_column or 1)


def _node_span(item: ast.Node | Token) -> ast.Span:
    return _span(item) if isinstance(item, Token) else item.span


class _AstBuilder(Transformer):
    """Builds AST nodes bottom-up. Literal problems are collected, not raised, so that
    every bad literal in an expression is reported at once."""

    def __init__(self) -> None:
        super().__init__()
        self.problems: list[Problem] = []

    def _bad(
        self, error: LiteralError, token: Token, text: str, span: ast.Span | None = None
    ) -> ast.Literal:
        """Record the problem of a literal at ``token``; the literal, invalid, over
        ``span`` (the token's by default)."""
        at = _span(token)
        column = at.column + error.offset
        end = column + error.length if error.length else at.end_column
        self.problems.append(Problem(error.message, at.line, column, error.code, end))
        return ast.Literal(None, "invalid", text, span or at)

    # Boolean structure

    def start(self, children: list[ast.Node]) -> ast.Node:
        return children[0]

    def or_expr(self, children: list[ast.Node | Token]) -> ast.Or:
        operands = tuple(c for c in children if not isinstance(c, Token))
        return ast.Or(operands, operands[0].span.to(operands[-1].span))

    def and_expr(self, children: list[ast.Node | Token]) -> ast.And:
        operands = tuple(c for c in children if not isinstance(c, Token))
        return ast.And(operands, operands[0].span.to(operands[-1].span))

    def not_(self, children: list[ast.Node | Token]) -> ast.Not:
        keyword, operand = children
        assert isinstance(keyword, Token) and not isinstance(operand, Token)
        return ast.Not(operand, _span(keyword).to(operand.span))

    def paren(self, children: list[ast.Node | Token]) -> ast.Node:
        inner = children[1]
        assert not isinstance(inner, Token)
        return inner

    # Comparisons

    def _compare(self, op: ast.CompareOp, children: list[ast.Node | Token]) -> ast.Compare:
        left, right = children[0], children[-1]
        assert not isinstance(left, Token) and not isinstance(right, Token)
        op_tokens = [c for c in children[1:-1] if isinstance(c, Token)]
        op_span = _span(op_tokens[0]).to(_span(op_tokens[-1]))
        return ast.Compare(op, left, right, left.span.to(right.span), op_span)

    def compare(self, children: list[ast.Node | Token]) -> ast.Compare:
        # The grammar's comparison operators are CompareOp's spellings.
        return self._compare(cast(ast.CompareOp, str(children[1])), children)

    def in_(self, children: list[ast.Node | Token]) -> ast.Compare:
        return self._compare("in", children)

    def not_in(self, children: list[ast.Node | Token]) -> ast.Compare:
        return self._compare("not in", children)

    def matches(self, children: list[ast.Node | Token]) -> ast.Compare:
        return self._compare("matches", children)

    # Operands

    def attribute(self, children: list[Token]) -> ast.Attribute:
        parts: list[str] = []
        spans: list[ast.Span] = []
        for token in children:
            if token.type == "NAME":
                parts.append(str(token))
                spans.append(_span(token))
            elif token.type == "STRING":
                try:
                    parts.append(decode_string(str(token)))
                except LiteralError as error:
                    self._bad(error, token, str(token))
                    parts.append(str(token))
                spans.append(_span(token))
        return ast.Attribute(tuple(parts), spans[0].to(_node_span(children[-1])), tuple(spans))

    def string(self, children: list[Token]) -> ast.Literal:
        (token,) = children
        try:
            return ast.Literal(decode_string(str(token)), "string", str(token), _span(token))
        except LiteralError as error:
            return self._bad(error, token, str(token))

    def number(self, children: list[Token]) -> ast.Literal:
        (token,) = children
        try:
            return ast.Literal(decode_number(str(token)), "number", str(token), _span(token))
        except LiteralError as error:
            return self._bad(error, token, str(token))

    def size(self, children: list[Token]) -> ast.Literal:
        """A number with a unit: a size (``512 MiB``), or a duration (``10 min``)."""
        number, unit = children
        span = _span(number).to(_span(unit))
        text = f"{number} {unit}"
        try:
            if str(unit) in DURATION_UNITS:
                seconds = decode_duration(str(number), str(unit))
                return ast.Literal(seconds, "duration", text, span)
            return ast.Literal(decode_size(str(number), str(unit)), "size", text, span)
        except LiteralError as error:
            # An unknown unit is reported at the unit, anything else at the number.
            return self._bad(error, unit if error.code != BAD_LITERAL else number, text, span)

    def percent(self, children: list[Token]) -> ast.Literal:
        number, sign = children
        span = _span(number).to(_span(sign))
        text = f"{number}%"
        try:
            return ast.Literal(decode_percent(str(number)), "fraction", text, span)
        except LiteralError as error:
            return self._bad(error, number, text, span)

    def true(self, children: list[Token]) -> ast.Literal:
        return ast.Literal(True, "bool", "true", _span(children[0]))

    def false(self, children: list[Token]) -> ast.Literal:
        return ast.Literal(False, "bool", "false", _span(children[0]))

    def list(self, children: list[ast.Literal | Token]) -> ast.ListLiteral:
        items = tuple(c for c in children if not isinstance(c, Token))
        span = _node_span(children[0]).to(_node_span(children[-1]))
        if len(items) > MAX_LIST_ITEMS:
            message = f"the list has {len(items)} items; the limit is {MAX_LIST_ITEMS}"
            self.problems.append(
                Problem(message, span.line, span.column, TOO_LONG, span.column + 1)
            )
        return ast.ListLiteral(items, span)
