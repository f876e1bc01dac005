"""Glob patterns for ``matches``: ``*``, ``?``, ``[abc]``, ``[a-z]``, ``[!abc]``.

The matcher never backtracks more than one level, so its time is linear in the length
of the text for a given pattern (at worst text length times pattern length). That
matters because patterns are written by users and run on the scheduler's event loop:
a regex translation (as :mod:`fnmatch` does) can take exponential time on a pattern
like ``a*a*a*a*b``.

How it works: the pattern is split at its stars into fixed-width *segments*. The first
segment must match at the start of the text and the last at the end; each middle
segment is then placed at its leftmost possible position after the previous one.
Leftmost placement is always safe: any match that places a segment further right
leaves less room for the segments after it, never more.

Semantics follow :func:`fnmatch.fnmatchcase`: case-sensitive, ``*`` and ``?`` match
any character (including ``.``, ``/`` and newlines), ``]`` right after ``[`` or
``[!`` is a literal member, ``-`` first or last in a class is literal. Unlike
fnmatch, an unclosed ``[`` or an empty range like ``[z-a]`` is an error
(:class:`GlobError`), since it is almost certainly a typo. There is no backslash
escape: write ``[*]`` to match a literal star.

Used by :mod:`amm_rules.language.expr.checker` (to reject bad literal patterns) and by
:mod:`amm_rules.language.expr.compiler` (to precompile them).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache
from operator import methodcaller
from typing import TypeGuard

from amm_rules.language.records import record

Matcher = Callable[[str], bool]

#: Longest pattern :func:`glob_match` accepts at run time (a pattern read from an
#: annotation); longer ones match nothing. A literal pattern in a rules file is bounded
#: by the expression length limit, which is the same.
MAX_RUNTIME_PATTERN = 4096


class GlobError(ValueError):
    """An invalid pattern; ``offset`` is the 0-based index of the problem in it."""

    def __init__(self, message: str, offset: int):
        super().__init__(message)
        self.message = message
        self.offset = offset


@record(frozen=True)
class CharClass:
    """``[...]``: a set of characters and ranges, possibly negated."""

    chars: frozenset[str]
    ranges: tuple[tuple[str, str], ...]
    negated: bool

    def __call__(self, ch: str) -> bool:
        hit = ch in self.chars or any(lo <= ch <= hi for lo, hi in self.ranges)
        return hit != self.negated


#: One item of a segment: a run of literal text, ``None`` for ``?``, or a class.
Atom = str | CharClass | None
Segment = tuple[Atom, ...]


def compile_glob(pattern: str) -> Matcher:
    """A function ``text -> bool`` for ``pattern``; raises :class:`GlobError`."""
    segments = _parse(pattern)
    # The common shapes need no Python-level code at all: C-level callables.
    literals = [seg for seg in segments if _is_literal(seg)]
    if len(literals) == len(segments):
        texts = ["".join(seg) for seg in literals]
        if len(texts) == 1:
            return texts[0].__eq__
        if len(texts) == 2:
            head, tail = texts
            if not tail:
                return methodcaller("startswith", head)
            if not head:
                return methodcaller("endswith", tail)
            size = len(head) + len(tail)
            return lambda s: len(s) >= size and s.startswith(head) and s.endswith(tail)
        if len(texts) == 3 and not texts[0] and not texts[2]:
            return methodcaller("__contains__", texts[1])
    widths = [_width(seg) for seg in segments]
    return lambda s: _match(segments, widths, s)


@lru_cache(maxsize=256)
def _cached(pattern: str) -> Matcher | None:
    try:
        return compile_glob(pattern)
    except GlobError:
        return None


def glob_match(pattern: str, text: str) -> bool:
    """Match ``text`` against a pattern known only at run time; an invalid pattern
    matches nothing."""
    if len(pattern) > MAX_RUNTIME_PATTERN:
        return False
    matcher = _cached(pattern)
    return matcher is not None and matcher(text)


def _is_literal(segment: Segment) -> TypeGuard[tuple[str, ...]]:
    return all(isinstance(atom, str) for atom in segment)


def _parse(pattern: str) -> list[Segment]:
    """Split ``pattern`` at stars into segments of atoms (always at least one)."""
    segments: list[Segment] = []
    atoms: list[Atom] = []
    literal: list[str] = []

    def flush_literal() -> None:
        if literal:
            atoms.append("".join(literal))
            literal.clear()

    i = 0
    n = len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "*":
            flush_literal()
            segments.append(tuple(atoms))
            atoms = []
            while i < n and pattern[i] == "*":  # "**" is "*"
                i += 1
            continue
        if ch == "?":
            flush_literal()
            atoms.append(None)
            i += 1
        elif ch == "[":
            flush_literal()
            char_class, i = _parse_class(pattern, i)
            atoms.append(char_class)
        else:
            literal.append(ch)
            i += 1
    flush_literal()
    segments.append(tuple(atoms))
    return segments


def _parse_class(pattern: str, start: int) -> tuple[CharClass, int]:
    """Parse the class opening at ``pattern[start] == "["``; return it and the index
    just past its ``]``."""
    i = start + 1
    negated = i < len(pattern) and pattern[i] == "!"
    if negated:
        i += 1
    first = i
    chars: set[str] = set()
    ranges: list[tuple[str, str]] = []
    while True:
        if i >= len(pattern):
            raise GlobError("unclosed '[' in pattern; write '[[]' to match a literal '['", start)
        ch = pattern[i]
        if ch == "]" and i > first:
            break
        is_range = i + 2 < len(pattern) and pattern[i + 1] == "-" and pattern[i + 2] != "]"
        if is_range:
            lo, hi = ch, pattern[i + 2]
            if lo > hi:
                raise GlobError(f"empty range '{lo}-{hi}' in pattern; write '{hi}-{lo}'", i)
            ranges.append((lo, hi))
            i += 3
        else:
            chars.add(ch)
            i += 1
    return CharClass(frozenset(chars), tuple(ranges), negated), i + 1


def _width(segment: Segment) -> int:
    return sum(len(atom) if isinstance(atom, str) else 1 for atom in segment)


def _match_at(segment: Segment, text: str, i: int) -> bool:
    """Does ``segment`` match ``text`` at index ``i``? (The caller checked the length.)"""
    for atom in segment:
        if isinstance(atom, str):
            if not text.startswith(atom, i):
                return False
            i += len(atom)
        else:
            if atom is not None and not atom(text[i]):
                return False
            i += 1
    return True


@lru_cache(maxsize=1024)
def _segment_regex(segment: Segment) -> re.Pattern[str]:
    """The regular expression of one fixed-width segment (``?`` is any character), which
    :func:`_match` searches for its leftmost place. A segment has no star, so its regular
    expression has no quantifier and cannot backtrack beyond one placement: the search is
    the same "each start, at most its width in steps" as a loop here, but in C. (A Python
    loop took half a minute for a 3,000-character pattern of classes on a 100k-character
    key, on the scheduler's event loop.)"""
    parts = []
    for atom in segment:
        if isinstance(atom, str):
            parts.append(re.escape(atom))
        elif atom is None:
            parts.append(".")
        else:
            members = "".join(re.escape(c) for c in sorted(atom.chars))
            members += "".join(f"{re.escape(lo)}-{re.escape(hi)}" for lo, hi in atom.ranges)
            parts.append(f"[{'^' if atom.negated else ''}{members}]")
    return re.compile("".join(parts), re.DOTALL)


def _match(segments: list[Segment], widths: list[int], text: str) -> bool:
    if len(segments) == 1:
        return len(text) == widths[0] and _match_at(segments[0], text, 0)
    start = widths[0]
    stop = len(text) - widths[-1]
    if (
        stop < start
        or not _match_at(segments[0], text, 0)
        or not _match_at(segments[-1], text, stop)
    ):
        return False
    for k in range(1, len(segments) - 1):
        found = _segment_regex(segments[k]).search(text, start, stop)
        if found is None:
            return False
        start = found.start() + widths[k]
    return True


# -- a regular expression written where a glob is read ---------------------------------------

#: Escapes of a regular expression that no glob can write (``\d`` is ``[0-9]``; any other
#: escaped character is itself).
_CLASS_ESCAPES = frozenset("wsDWSb")


def regex_meant(pattern: str) -> tuple[bool, str | None]:
    """Whether ``pattern`` reads as a regular expression rather than a glob, and the
    glob it probably means (None when a glob cannot say it: alternatives, counted
    repeats, ``\\w``...).

    Only what a glob pattern would not hold on purpose counts: a ``^`` first, a ``$``
    last, a backslash escape (a glob has none), ``.+``, a ``+`` after ``]`` or ``)``,
    ``(?``. ``"pandas.*"`` is a fine glob (``pandas.`` then anything) and is not
    reported; ``"^x-.*$"`` is, with ``"x-*"``."""
    signs = (
        pattern.startswith("^")
        or (pattern.endswith("$") and not pattern.endswith("\\$"))
        or "\\" in pattern
        or ".+" in pattern
        or "]+" in pattern
        or ")+" in pattern
        or ")*" in pattern
        or "(?" in pattern
    )
    if not signs or len(pattern) < 2:
        return False, None
    return True, _glob_of(pattern)


def _glob_of(regex: str) -> str | None:
    """A glob for a simple regular expression, read as a whole-string match."""
    text = regex[1:] if regex.startswith("^") else regex
    if text.endswith("$") and not text.endswith("\\$"):
        text = text[:-1]
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        nxt = text[i + 1] if i + 1 < n else ""
        if ch == "\\":
            if not nxt or nxt in _CLASS_ESCAPES:
                return None
            out.append("[0-9]" if nxt == "d" else _literal(nxt))
            i += 2
        elif ch == ".":
            if nxt in ("*", "+"):  # ".+": at least one character; "*" is what is meant
                out.append("*")
                i += 2
                continue
            out.append("?")
            i += 1
        elif ch == "[":
            end = text.find("]", i + 2)
            if end < 0:
                return None
            body = text[i + 1 : end]
            if len(body) == 1 and body not in "*?[!^":
                out.append(body)  # "[.]": a literal dot, which a glob writes as it is
            else:
                out.append("[!" + body[1:] + "]" if body.startswith("^") else f"[{body}]")
            i = end + 1
        elif ch in "*+":  # a repeat of what came before: a glob says "anything"
            if not out:
                return None
            out[-1] = "*" if ch == "*" else f"{out[-1]}*"
            i += 1
        elif ch in "(){}|?^$":
            return None
        else:
            out.append(_literal(ch))
            i += 1
    glob = "".join(out)
    while "**" in glob:
        glob = glob.replace("**", "*")
    return glob or None


def _literal(ch: str) -> str:
    """``ch`` as a glob matches it literally."""
    return f"[{ch}]" if ch in "*?[" else ch
