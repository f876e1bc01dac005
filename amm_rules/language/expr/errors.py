"""Problems found in an expression, and the one exception that carries them.

Every module of :mod:`amm_rules.language.expr` reports what is wrong as a :class:`Problem`
(plain data: message, 1-based line and column *within the expression text*, a stable
code). :func:`amm_rules.language.expr.compile_expression` raises them together in one
:class:`ExpressionError`; the loader translates the positions to the rules file and
turns them into :class:`amm_rules.language.diagnostics.Diagnostic`.
"""

from __future__ import annotations

from collections.abc import Iterable

from amm_rules.language.expr.ast import Span
from amm_rules.language.records import record

#: The codes a :class:`Problem` can carry.
SYNTAX = "syntax"
UNKNOWN_ATTRIBUTE = "unknown-attribute"
WRONG_CONTEXT = "wrong-context"
TYPE_MISMATCH = "type-mismatch"
UNKNOWN_UNIT = "unknown-unit"
BAD_LITERAL = "bad-literal"
TOO_LONG = "too-long"
TOO_DEEP = "too-deep"
#: Codes of warnings (legal, almost certainly not meant): ``validate`` reports them
#: with these codes, which ``# amm-rules: disable=CODE`` silences.
TYPE_NAME = "type-name"
RESOURCES_ANNOTATION = "resources-annotation"
REGEX_PATTERN = "regex-pattern"
WARNING_CODES: frozenset[str] = frozenset({TYPE_NAME, RESOURCES_ANNOTATION, REGEX_PATTERN})

CODES: frozenset[str] = frozenset(
    {
        SYNTAX,
        UNKNOWN_ATTRIBUTE,
        WRONG_CONTEXT,
        TYPE_MISMATCH,
        UNKNOWN_UNIT,
        BAD_LITERAL,
        TOO_LONG,
        TOO_DEEP,
    }
)


@record(frozen=True)
class Problem:
    """One thing wrong with an expression.

    ``line`` and ``column`` are 1-based and count characters of the expression text
    (a tab is one column). ``end_column`` is the column just past the offending token
    on the same line, or ``None`` when the problem has no extent (e.g. the whole
    expression is too long).
    """

    message: str
    line: int
    column: int
    code: str
    end_column: int | None = None

    def __str__(self) -> str:
        return f"{self.line}:{self.column}: {self.message}"


def problem_at(span: Span, code: str, message: str) -> Problem:
    """A problem over ``span``, with its end when it ends on the line it starts on."""
    end = span.end_column if span.end_line == span.line else None
    return Problem(message, span.line, span.column, code, end)


def sort_key(problem: Problem) -> tuple[int, int, str]:
    return (problem.line, problem.column, problem.message)


class ExpressionError(ValueError):
    """An expression that cannot be compiled; ``problems`` lists everything found.

    ``str(error)`` shows each problem as ``line:col: message``, then the line of the
    expression it is on, with a caret under the offending token::

        1:15: unknown unit 'XB' ...
        task.nbytes > 5 XB
                        ^~
    """

    def __init__(self, problems: Iterable[Problem], source: str = ""):
        self.problems: list[Problem] = sorted(problems, key=sort_key)
        #: The expression text the positions refer to.
        self.source = source
        super().__init__(self._render())

    def _render(self) -> str:
        lines = [line.rstrip("\r") for line in self.source.split("\n")]
        out: list[str] = []
        for problem in self.problems:
            out.append(str(problem))
            if 1 <= problem.line <= len(lines):
                text = lines[problem.line - 1]
                out.append(text)
                out.append(_caret(text, problem.column, problem.end_column))
        return "\n".join(out)

    # An exception with its own __init__ arguments must say how to rebuild itself,
    # or copy.copy() (and sending it to a Dask client) loses the problems.
    def __reduce__(self) -> tuple[type[ExpressionError], tuple[list[Problem], str]]:
        return (type(self), (self.problems, self.source))


def _caret(text: str, column: int, end_column: int | None) -> str:
    """``    ^~~`` under columns ``column`` .. ``end_column - 1`` of ``text``."""
    column = max(1, min(column, len(text) + 1))
    # Keep tabs so that the caret lines up however the terminal renders them.
    pad = "".join("\t" if ch == "\t" else " " for ch in text[: column - 1])
    end = column + 1 if end_column is None else min(end_column, len(text) + 1)
    return pad + "^" + "~" * max(0, end - column - 1)
