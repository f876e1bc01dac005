"""Keys typed on a command line, as dask prints them, turned back into keys.

Dask keys are strings, bytes, integers, floats, or tuples of those (``('x-1a2b', 0)``);
``str(key)`` is how dask prints them (in the dashboard, logs and errors), so that is
what users paste. :func:`parse_key` reads that text without evaluating code: the text is
parsed into Python's syntax tree (``ast.parse``, which runs nothing), and only string,
bytes and number literals, negative numbers and tuples of them are accepted; anything
else is a plain string key, or, if it opens a tuple, an error.

The text is bounded (:data:`MAX_KEY_TEXT` characters), and a text nested deeper than
:data:`MAX_KEY_DEPTH` is one clear error, never a ``RecursionError`` or ``MemoryError``:
the depth is counted, so the answer does not depend on how deep the interpreter's parser
happens to get before it gives up (that varies with the recursion limit and the stack).

Imports nothing from dask or distributed (the command line loads it before connecting).
"""

from __future__ import annotations

import ast
from collections.abc import Hashable

#: Longest key text read (dask's keys are names and short tuples; the parser of
#: Python's syntax recurses per nesting level and holds the whole tree).
MAX_KEY_TEXT = 10_000
#: Deepest nesting read (tuples within tuples, a sign on a number): dask's keys nest two
#: or three levels.
MAX_KEY_DEPTH = 32


class KeyTextError(ValueError):
    """Text that starts like a tuple key but is not one."""


def _shown(text: str) -> str:
    return repr(text) if len(text) <= 60 else f"{text[:60]!r}..."


def parse_key(text: str) -> list[Hashable]:
    """The keys ``text`` may stand for, most likely first.

    - ``('x-1a2b', 0)`` (a tuple, as dask prints it): that tuple;
    - ``'x'`` or ``"x"`` (quoted): the string inside;
    - ``5`` or ``2.5``: the string first, then the number (dask prints both alike);
    - anything else: the text itself, as a string key.

    Raises :class:`ValueError` for a text that opens a tuple and is not one of
    literals (``(1 + 2, 'x')``, ``('x', foo)``...).
    """
    if len(text) > MAX_KEY_TEXT:
        raise KeyTextError(
            f"{_shown(text)} is not a key: {len(text):,} characters, more than the "
            f"limit of {MAX_KEY_TEXT:,}"
        )
    stripped = text.strip()
    if stripped.startswith("("):
        value = _literal(stripped)
        if not isinstance(value, tuple):
            raise KeyTextError(
                f"{_shown(text)} is not a key: a tuple key is written like ('name-1a2b', 0), "
                "of strings and numbers only"
            )
        return [value]
    try:
        value = _literal(stripped)
    except KeyTextError:
        return [text]
    if stripped[:1] in ("'", '"') or stripped[:2] in ("b'", 'b"'):
        return [value] if isinstance(value, (str, bytes)) else [text]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [text, value]
    return [text]


def _literal(text: str) -> Hashable:
    try:
        tree = ast.parse(text, mode="eval")
        if _depth(tree.body) > MAX_KEY_DEPTH:
            raise KeyTextError(f"{_shown(text)} is not a key: nested too deeply")
        return _value(tree.body, text)
    except (SyntaxError, ValueError) as exc:
        if isinstance(exc, KeyTextError):
            raise
        raise KeyTextError(
            f"{_shown(text)} is not a key: {exc.msg if isinstance(exc, SyntaxError) else exc}"
        ) from None
    except (RecursionError, MemoryError):
        raise KeyTextError(f"{_shown(text)} is not a key: nested too deeply") from None


def _depth(root: ast.AST) -> int:
    """How deep the tree nests, counted without recursion (stops past the bound)."""
    deepest = 0
    stack = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > MAX_KEY_DEPTH:
            break
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return deepest


def _value(node: ast.AST, text: str) -> Hashable:
    if isinstance(node, ast.Constant) and type(node.value) in (str, bytes, int, float):
        return node.value
    if (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, ast.USub)
        and isinstance(node.operand, ast.Constant)
        and isinstance(number := node.operand.value, (int, float))
        and not isinstance(number, bool)
    ):
        return -number
    if isinstance(node, ast.Tuple):
        return tuple(_value(elt, text) for elt in node.elts)
    raise KeyTextError(
        f"{_shown(text)} is not a key: only strings, numbers and tuples of them may appear "
        f"in a key, not {type(node).__name__.lower()}"
    )
