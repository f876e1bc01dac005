"""Hints for expressions that YAML misreads because they are not quoted.

An expression is a YAML value, and three common expressions are not what YAML reads
when they are written plain (unquoted):

1. ``match: task.annotations.tier == "gold: yes"``: YAML takes ``: `` as the start of a
   mapping value ("mapping values are not allowed in this context");
2. ``match: "gpu" in task.annotations.tags``: YAML takes ``"gpu"`` as the whole value
   and then finds text where it expects a key ("did not find expected key");
3. ``match: task.key matches "tmp #*"``: YAML takes `` #*"`` as a comment, so the
   expression it hands over has a string with no closing quote.

The fix is the same each time: quote the whole expression. This module recognises the
line of such an expression and writes the quoted line to show. Its neighbours:
:mod:`amm_rules.language.yaml_source` (cases 1 and 2, YAML syntax errors) and
:mod:`amm_rules.language.locator` (case 3, a syntax error in the expression).
"""

from __future__ import annotations

import re

#: ``  - match: VALUE`` or ``  gpu: VALUE``: indentation (and list dash), key, value.
_ENTRY = re.compile(r"^(?P<lead>[ ]*(?:-[ ]+)*)(?P<key>[A-Za-z_][\w-]*)[ ]*:[ ]+(?P<value>.*)$")
#: An attribute of the expression language: what makes a value an expression.
_ATTRIBUTE = re.compile(r"\b(?:task|worker)\.[A-Za-z_]")
#: A YAML comment: `` #`` after the value.
_COMMENT = re.compile(r"[ \t]+#")

_QUOTED_ALONE = "YAML reads a value that starts with a quote as that quoted string alone"
#: The YAML syntax errors an unquoted expression causes, and what YAML did.
_WHY = {
    "mapping values are not allowed": "YAML reads ': ' in an unquoted value as a new key",
    "did not find expected key": _QUOTED_ALONE,
    "expected <block end>": _QUOTED_ALONE,
}


def quoted(value: str) -> str:
    """``value`` as one quoted YAML scalar: in single quotes (where ``"`` needs no
    escape), or in double quotes when it holds only ``'`` quotes."""
    if "'" in value and '"' not in value and "\\" not in value:
        return f'"{value}"'
    return "'" + value.replace("'", "''") + "'"


def _split_comment(value: str) -> tuple[str, str]:
    """The value and a trailing comment, when the part before `` #`` holds balanced
    double and single quotes (else the ``#`` is inside a string of the expression)."""
    for m in _COMMENT.finditer(value):
        before = value[: m.start()]
        if before.count('"') % 2 == 0 and before.count("'") % 2 == 0:
            return before, value[m.start() :]
    return value, ""


def expression_entry(line: str) -> tuple[str, str, str] | None:
    """``(lead, key, value)`` when ``line`` is a ``key: value`` entry whose value is an
    expression (a ``match``, or a value reading ``task.`` or ``worker.``)."""
    m = _ENTRY.match(line.rstrip())
    if m is None:
        return None
    value = m["value"]
    if value[:1] in "|>" or not (m["key"] == "match" or _ATTRIBUTE.search(value)):
        return None
    return m["lead"], m["key"], value


def quoted_line(line: str, *, keep_comment: bool = True) -> str | None:
    """The line with its expression quoted as a whole, or ``None`` when it is not an
    expression entry. With ``keep_comment``, a trailing comment stays outside."""
    entry = expression_entry(line)
    if entry is None:
        return None
    lead, key, value = entry
    comment = ""
    if keep_comment:
        value, comment = _split_comment(value)
    return f"{lead}{key}: {quoted(value.rstrip())}{comment}".strip()


def yaml_error_hint(line: str, column: int, problem: str) -> str | None:
    """For a YAML syntax error at ``column`` of ``line``: what to add to its message,
    when the error is inside the value of an unquoted expression."""
    why = next((w for text, w in _WHY.items() if text in problem), None)
    entry = expression_entry(line)
    if why is None or entry is None:
        return None
    lead, key, value = entry
    if value[:1] in "'\"" and value.rstrip().endswith(value[0]) and value.count(value[0]) == 2:
        return None  # already quoted as a whole: the error is something else
    start = line.index(value, len(lead) + len(key)) + 1
    if column < start:
        return None
    return f"{why}: quote the whole expression, as in  {quoted_line(line)}"


def comment_hint(line: str, expression: str) -> str | None:
    """For an expression (a plain YAML value) that lost its end to a comment: what to add
    to its syntax error. ``line`` is the source line the value is written on."""
    if expression.count('"') % 2 == 0 and expression.count("'") % 2 == 0:
        return None  # its strings are closed: the comment is a comment
    entry = expression_entry(line)
    if entry is None:
        return None
    lead, key, value = entry
    lost = value[len(expression) :] if value.startswith(expression) else ""
    if not _COMMENT.match(lost):
        return None
    return (
        f"YAML read {lost.strip()!r} as a comment: quote the whole expression, as in  "
        f"{quoted_line(line, keep_comment=False)}"
    )
