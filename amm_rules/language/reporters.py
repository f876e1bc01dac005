r"""Reporters: diagnostics → text, JSON or GitHub workflow commands.

Reporters only format; they never decide what is a problem. Each takes the
:class:`~amm_rules.language.loader.CheckResult` of every file, in the order the files were
named, and returns the whole report as a string.

- ``text``: ``path:line:column: severity: message (in rule 'NAME')``, then the source
  line and a caret under the column, and a summary line at the end;
- ``json``: a list of objects with ``file, line, column, end_column, severity, message,
  rule, code`` (``line`` and ``column`` are ``null`` for a problem with the whole file);
- ``github``: ``::error file=...,line=...,col=...::message`` lines, which GitHub Actions
  turns into annotations on the pull request.

:func:`escape_controls` is how every text output of the command line reaches a terminal:
control characters (a rule name written ``"\e]..."`` in double quotes, a key a client
chose) are shown escaped as ``repr`` would, never sent raw; JSON output is left as is.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from amm_rules.language.diagnostics import Diagnostic, sort_key
from amm_rules.language.loader import CheckResult
from amm_rules.language.plurals import counted


def escape_controls(text: str) -> str:
    """``text`` with every character that is not printable, but line breaks and tabs
    (the layout of a report), escaped as ``repr`` escapes it (``\x1b``, ``\x07``,
    ``\u202e``): a terminal then shows it instead of obeying it."""
    if text.replace("\n", "").replace("\t", "").isprintable():
        return text
    return "".join(c if c in "\n\t" or c.isprintable() else repr(c)[1:-1] for c in text)


def _sorted(results: Sequence[CheckResult]) -> list[tuple[CheckResult, list[Diagnostic]]]:
    return [(r, sorted(r.diagnostics, key=sort_key)) for r in results]


def summary(results: Sequence[CheckResult]) -> str:
    """``"2 files checked: 1 error, 1 warning"``."""
    errors = sum(d.is_error for r in results for d in r.diagnostics)
    warnings = sum(not d.is_error for r in results for d in r.diagnostics)
    counts = [counted(errors, "error")] if errors else []
    if warnings:
        counts.append(counted(warnings, "warning"))
    return f"{counted(len(results), 'file')} checked: {', '.join(counts) or 'no problems'}"


#: Longest source line shown under a problem, in characters; a longer one is shown as
#: the part around the column, with ``...`` for what is left out.
MAX_SHOWN = 160


def format_text(results: Sequence[CheckResult], *, with_summary: bool = True) -> str:
    from amm_rules.language.yaml_source import LINE_BREAK, split_lines

    out: list[str] = []
    for result, diagnostics in _sorted(results):
        lines = split_lines(result.text) if result.text is not None else []
        for diag in diagnostics:
            # One problem, one line: a break in a name or message is shown as an escape.
            out.append(LINE_BREAK.sub(lambda m: repr(m.group())[1:-1], str(diag)))
            if 0 < diag.line <= len(lines):
                width = (diag.end_column or diag.column + 1) - diag.column
                source, column, width = excerpt(lines[diag.line - 1], diag.column, width)
                out.append(f"  {source}")
                # Keep tabs so the caret lines up under tab-indented text.
                prefix = "".join(c if c == "\t" else " " for c in source[: max(column - 1, 0)])
                out.append(f"  {prefix}^{'~' * max(width - 1, 0)}")
    if with_summary:
        out.append(summary(results))
    return "\n".join(out) + "\n"


def excerpt(line: str, column: int, width: int, limit: int = MAX_SHOWN) -> tuple[str, int, int]:
    """At most ``limit`` characters of ``line`` around ``column``, with ``...`` where it
    is cut; the column and underline width within what is shown."""
    if len(line) <= limit:
        return line, column, width
    width = max(1, min(width, limit // 2))
    start = max(0, min(column - 1 - limit // 4, len(line) - limit))
    shown = line[start : start + limit]
    head = "..." if start > 0 else ""
    tail = "..." if start + limit < len(line) else ""
    return head + shown + tail, column - start + len(head), width


def format_json(results: Sequence[CheckResult]) -> str:
    items = [_json_item(d) for _, diagnostics in _sorted(results) for d in diagnostics]
    return json.dumps(items, indent=2) + "\n"


def _json_item(diag: Diagnostic) -> dict[str, object]:
    """A diagnostic as JSON: a problem with the file as a whole (or with inline rules,
    which have no lines) has ``null`` for its line and column, not 0."""
    item = diag.to_dict()
    if diag.line <= 0:
        item["line"] = item["column"] = item["end_column"] = None
    return item


#: Characters other than CR and LF that end a line for a reader splitting lines the
#: Unicode way; an annotation must stay on one line, so they are written as escapes.
_OTHER_LINE_ENDS: dict[str, str | int | None] = {
    c: f"\\u{ord(c):04x}" for c in "\v\f\x1c\x1d\x1e\x85\u2028\u2029"
}


def _escape_data(text: str) -> str:
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.translate(str.maketrans(_OTHER_LINE_ENDS))


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def format_github(results: Sequence[CheckResult]) -> str:
    out = []
    for _, diagnostics in _sorted(results):
        for d in diagnostics:
            props = [f"file={_escape_property(d.file)}"]
            if d.line > 0:
                props += [f"line={d.line}", f"col={d.column}"]
            props.append(f"title={_escape_property('amm-rules ' + d.code)}")
            out.append(f"::{d.severity} {','.join(props)}::{_escape_data(d.described())}")
    return "".join(line + "\n" for line in out)


REPORTERS: dict[str, Callable[[Sequence[CheckResult]], str]] = {
    "text": lambda results: escape_controls(format_text(results)),
    "json": format_json,
    "github": lambda results: escape_controls(format_github(results)),
}
