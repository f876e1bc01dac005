"""Where each character of a YAML scalar's value was written in the file.

An expression error comes with a (line, column) inside the expression text, which is
the *value* of a YAML scalar. To point at the file, this module replays how YAML turned
the written text into the value (quotes, escapes, line folding, block indentation) and
keeps, for every value character, the index of the source character it came from.

The replay is checked: if it does not reproduce the value exactly (an exotic style
this module does not model), :func:`expression_position` falls back to a simple rule:
single-line plain and quoted scalars are ``start + offset`` (``+1`` for the opening
quote); block scalars are line-based (first content line after the indicator line,
column = content indentation + column).

Neighbours: :mod:`amm_rules.language.yaml_source` supplies the nodes and the text;
:mod:`amm_rules.language.locator` calls :func:`expression_position`.
"""

from __future__ import annotations

import re

from yaml.nodes import ScalarNode

from amm_rules.language.yaml_source import LINE_BREAK, YamlSource

_ESCAPES = {
    "0": "\0", "a": "\x07", "b": "\x08", "t": "\t", "\t": "\t", "n": "\n", "v": "\x0b",
    "f": "\x0c", "r": "\r", "e": "\x1b", " ": " ", '"': '"', "/": "/", "\\": "\\",
    "N": "\x85", "_": "\xa0", "L": "\u2028", "P": "\u2029",
}  # fmt: skip
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}
_PROPERTY = re.compile(r"(?:[&!][^\s]*\s+)*")

#: A value character: (the character, index of the source character it came from).
Piece = tuple[str, int]


def expression_position(
    source: YamlSource, node: ScalarNode, line: int, column: int
) -> tuple[int, int]:
    """1-based (line, column) in the file of 1-based (line, column) in ``node.value``."""
    value = node.value
    lines = value.split("\n")
    line = min(max(line, 1), len(lines))
    index = sum(len(part) + 1 for part in lines[: line - 1]) + max(column, 1) - 1
    indices = source_indices(source.text, node)
    if indices:
        if index < len(indices):
            return source.position_of_index(indices[index])
        last_line, last_column = source.position_of_index(indices[-1])
        return last_line, last_column + 1 + (index - len(indices))
    return _fallback(source, node, line, column)


def source_indices(text: str, node: ScalarNode) -> list[int] | None:
    """Source index of each character of ``node.value``, or ``None`` if the replay of
    this scalar's style does not reproduce its value."""
    start = _scalar_start(text, node)
    end = node.end_mark.index
    style = node.style
    if style in ("|", ">"):
        pieces = _block(text, start, end, folded=style == ">")
        written = "".join(c for c, _ in pieces)
        if written.rstrip("\n") != node.value.rstrip("\n"):
            return None
        indices = [i for _, i in pieces][: len(node.value)]
        while len(indices) < len(node.value):  # kept trailing newlines ("|+")
            indices.append(indices[-1] if indices else start)
        return indices
    flowed: list[Piece] | None
    if style in ("'", '"'):
        flowed = _flow(text, start + 1, end - 1, quote=style)
    else:
        flowed = _flow(text, start, end, quote=None)
    if flowed is None or "".join(c for c, _ in flowed) != node.value:
        return None
    return [i for _, i in flowed]


def _scalar_start(text: str, node: ScalarNode) -> int:
    """Index of the scalar itself: the node's mark is at its anchor or tag, if any."""
    index = node.start_mark.index
    if text[index : index + 1] in ("&", "!"):
        found = _PROPERTY.match(text, index)
        assert found is not None  # (the pattern matches the empty text too)
        index = found.end()
    return index


def _raw_lines(text: str, start: int, end: int) -> list[tuple[int, int, int]]:
    """(first index, end index, index of the line break or ``end``) of each line."""
    out = []
    pos = start
    for m in LINE_BREAK.finditer(text, start, end):
        out.append((pos, m.start(), m.start()))
        pos = m.end()
    out.append((pos, end, end))
    return out


def _flow(text: str, start: int, end: int, quote: str | None) -> list[Piece] | None:
    """Plain, single- or double-quoted scalar: strip and fold lines, then unescape."""
    lines = _raw_lines(text, start, end)
    pieces: list[Piece] = []
    blanks = 0
    brk_prev = start
    joined = True  # the previous line ended with an escaped line break ("\" at its end)
    last = len(lines) - 1
    for n, (lo, hi, brk) in enumerate(lines):
        if n > 0:
            while lo < hi and text[lo] in " \t":
                lo += 1
        if n < last:
            while hi > lo and text[hi - 1] in " \t" and not _escaped(text, lo, hi - 1, quote):
                hi -= 1
        if 0 < n < last and lo == hi:
            blanks += 1
            continue
        if n > 0 and not joined:
            separator = "\n" * blanks if blanks else " "
            pieces.extend((c, brk_prev) for c in separator)
        blanks = 0
        escaped_break = quote == '"' and n < last and _escaped(text, lo, hi, quote)
        if escaped_break:
            hi -= 1  # the backslash itself
        decoded = _unescape(text, lo, hi, quote)
        if decoded is None:
            return None
        pieces.extend(decoded)
        joined = escaped_break
        brk_prev = brk
    return pieces


def _escaped(text: str, lo: int, end: int, quote: str | None) -> bool:
    """True if ``text[end]`` is preceded by an odd number of backslashes (or, for
    the line-break check, ``end`` is the line's end and the line ends in one)."""
    if quote != '"':
        return False
    count = 0
    i = end - 1
    while i >= lo and text[i] == "\\":
        count += 1
        i -= 1
    return count % 2 == 1


def _unescape(text: str, lo: int, hi: int, quote: str | None) -> list[Piece] | None:
    out: list[Piece] = []
    i = lo
    while i < hi:
        c = text[i]
        if quote == "'" and c == "'" and text[i + 1 : i + 2] == "'":
            out.append(("'", i))
            i += 2
        elif quote == '"' and c == "\\":
            code = text[i + 1 : i + 2]
            if code in _ESCAPES:
                out.append((_ESCAPES[code], i))
                i += 2
            elif code in _HEX_ESCAPES:
                digits = text[i + 2 : i + 2 + _HEX_ESCAPES[code]]
                try:
                    out.append((chr(int(digits, 16)), i))
                except ValueError:
                    return None
                i += 2 + len(digits)
            else:
                return None
        else:
            out.append((c, i))
            i += 1
    return out


def _block(text: str, start: int, end: int, folded: bool) -> list[Piece]:
    """Literal (``|``) or folded (``>``) block scalar starting at its indicator."""
    lines = _raw_lines(text, start, end)[1:]  # the first line is the header
    indent = None
    for lo, hi, _ in lines:
        body = text[lo:hi]
        if body.strip():
            indent = len(body) - len(body.lstrip(" "))
            break
    if indent is None:
        return []
    pieces: list[Piece] = []
    previous: str | None = None  # "normal", "more" (more indented) or None at the start
    pending: list[int] = []  # break indices of blank lines since the last content line
    last_break = start
    for lo, hi, brk in lines:
        if not text[lo:hi].strip():
            pending.append(brk)
            continue
        kind = "more" if text[lo + indent : lo + indent + 1] in (" ", "\t") else "normal"
        if previous is not None:
            if not folded or previous == "more" or kind == "more":
                separators = ["\n"] * (1 + len(pending))
            elif pending:
                separators = ["\n"] * len(pending)
            else:
                separators = [" "]
            pieces.extend((s, last_break) for s in separators)
        elif pending:
            pieces.extend(("\n", b) for b in pending)
        pending = []
        pieces.extend((text[i], i) for i in range(lo + indent, hi))
        previous = kind
        last_break = brk
    pieces.append(("\n", last_break))
    return pieces


def _fallback(source: YamlSource, node: ScalarNode, line: int, column: int) -> tuple[int, int]:
    start_line, start_column = source.position_of_index(_scalar_start(source.text, node))
    if node.style in ("|", ">"):
        body = source.text[node.start_mark.index :].split("\n")[1:2]
        indent = len(body[0]) - len(body[0].lstrip(" ")) if body else 0
        return start_line + line, indent + column
    if line == 1:
        return start_line, start_column + column - 1 + (1 if node.style in ("'", '"') else 0)
    return start_line + line - 1, column
