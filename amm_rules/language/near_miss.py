"""Why a rule matches no key, told from the keys there are: near-miss hints.

A correct-looking rule can match nothing: the file names a type, a prefix, a span or a
resource the way the data is not named. :func:`near_misses` reads a rule's match (its
syntax tree) and a :class:`Census` of keys (counts of their types, prefixes, spans,
resource restrictions and annotation names: a bounded sample of a live cluster's keys,
or a dump's) and says what the rule probably meant::

    3 keys of type pandas.DataFrame in memory (the rule says pandas.core.frame.DataFrame)
    12 keys were made by tasks with resources={'GPU': 1} (use task.resources.GPU)

Used by the engine's conformance (state ``idle``, :mod:`amm_rules.observe.conformance`)
and by ``validate --dump`` (:mod:`amm_rules.offline.checks`). Pure: the census is plain
counts, and nothing here imports dask or distributed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from amm_rules.language.expr import ast
from amm_rules.language.expr.attributes import resource_attribute
from amm_rules.language.expr.glob import glob_match
from amm_rules.language.plurals import counted, plural
from amm_rules.language.type_names import names_of

#: Most hints told per rule.
MAX_HINTS = 3


@dataclass
class Census:
    """Counts of keys by what rules read of them (see the module docstring)."""

    keys: int = 0
    types: Counter[str] = field(default_factory=Counter)
    prefixes: Counter[str] = field(default_factory=Counter)
    spans: Counter[str] = field(default_factory=Counter)
    #: Resource restrictions, as sorted (name, amount) tuples.
    resources: Counter[tuple[tuple[str, float], ...]] = field(default_factory=Counter)
    annotations: Counter[str] = field(default_factory=Counter)
    #: True when the counts are of a sample (the figures are then "at least").
    sampled: bool = False

    def add(
        self,
        type_: str | None,
        prefix: str,
        span: str,
        resources: Any,
        annotations: Iterable[str],
    ) -> None:
        self.keys += 1
        if type_:
            self.types[type_] += 1
        self.prefixes[prefix] += 1
        self.spans[span] += 1
        if resources:
            self.resources[tuple(sorted((str(k), v) for k, v in resources.items()))] += 1
        self.annotations.update(str(a) for a in annotations)


def near_misses(root: ast.Node, census: Census) -> list[str]:
    """Hints for a rule whose match (``root``) matched none of the keys counted."""
    out: list[str] = []
    for attribute, values, pattern in _comparisons(root):
        hint = _hint(attribute, values, pattern, census)
        if hint and hint not in out:
            out.append(hint)
    out.extend(h for h in _annotation_hints(root, census) if h not in out)
    return out[:MAX_HINTS]


def _comparisons(root: ast.Node) -> Iterator[tuple[tuple[str, ...], list[str], bool]]:
    """``(attribute parts, string values, is a pattern)`` of every comparison of a task
    attribute with string literals."""
    for node in _nodes(root, operands=False):
        if not isinstance(node, ast.Compare):
            continue
        for side, other in ((node.left, node.right), (node.right, node.left)):
            if not isinstance(side, ast.Attribute):
                continue
            literals = other.items if isinstance(other, ast.ListLiteral) else (other,)
            values = [
                lit.value
                for lit in literals
                if isinstance(lit, ast.Literal) and isinstance(lit.value, str)
            ]
            if values and node.op in ("==", "in", "matches"):
                yield side.parts, values, node.op == "matches"
            elif node.op in ("<", "<=", ">", ">=", "==") and len(side.parts) == 3:
                yield side.parts, [], False  # task.resources.GPU >= 1


def _hint(parts: tuple[str, ...], values: list[str], pattern: bool, census: Census) -> str | None:
    if len(parts) < 2 or parts[0] != "task":
        return None
    name = parts[1]
    if name == "type" and values:
        return _near(values, census.types, pattern, "of type", aliases=True)
    if name == "prefix" and values:
        return _near(values, census.prefixes, pattern, "of prefix")
    if name == "span" and values:
        return _spans(values, census, pattern)
    if name == "resources" and len(parts) == 3:
        return _resources(parts[2], census)
    return None


def _near(
    values: list[str], counts: Counter[str], pattern: bool, what: str, aliases: bool = False
) -> str | None:
    """A name in memory close to what the rule says, when no key has the rule's."""

    def seen(value: str) -> bool:
        if pattern:
            return any(glob_match(value, n) for n in counts)
        names = names_of(value) if aliases else (value,)
        return any(counts.get(n) for n in names)

    if any(seen(v) for v in values):
        return None
    from amm_rules.language.spelling import closest

    for value in values:
        target = value.replace("*", "")
        folded = _fold(target.rsplit(".", 1)[-1])
        candidates = [n for n in counts if folded and folded in _fold(n)]
        best = candidates[0] if len(candidates) == 1 else None
        if best is None:
            best = closest(target, sorted(counts), ignore_case=True)
        if best is None and candidates:
            best = max(candidates, key=counts.__getitem__)
        if best is not None:
            return (
                f"{counted(counts[best], 'key')} {what} {best} in memory (the rule says {value})"
            )
    return None


def _spans(values: list[str], census: Census, pattern: bool) -> str | None:
    spans = census.spans
    if any((glob_match(v, s) if pattern else v == s) for v in values for s in spans) or not spans:
        return None
    listed = ", ".join(f"{s} ({n:,})" for s, n in spans.most_common(3))
    return f"keys in memory are in spans {listed} (the rule says {values[0]})"


def _resources(name: str, census: Census) -> str | None:
    if not census.resources or any(name in dict(r) for r in census.resources):
        return None
    restriction, n = census.resources.most_common(1)[0]
    return _made_with(restriction, n, restriction[0][0], f"the rule reads task.resources.{name}; ")


def _made_with(
    restriction: tuple[tuple[str, float], ...], n: int, name: str, why: str = ""
) -> str:
    """``12 keys were made by tasks with resources={'GPU': 1} (use task.resources.GPU)``."""
    return (
        f"{counted(n, 'key')} {plural(n, 'was', 'were')} made by tasks with resources="
        f"{dict(restriction)!r} ({why}use {resource_attribute(name)})"
    )


def _annotation_hints(root: ast.Node, census: Census) -> list[str]:
    """A rule reading the ``resources`` annotation, or an annotation no key has that is
    named as the keys' resource restrictions are (``task.annotations.GPU`` over keys
    made with ``resources={"GPU": 1}``): point at ``task.resources``."""
    out = []
    named = {name.casefold(): name for r in census.resources for name, _ in r}
    for node in _nodes(root, operands=True):
        if not isinstance(node, ast.Attribute):
            continue
        parts = node.parts
        if len(parts) < 3 or parts[:2] != ("task", "annotations") or not census.resources:
            continue
        if parts[2] == "resources":
            restriction, n = census.resources.most_common(1)[0]
            name = parts[3] if len(parts) > 3 else restriction[0][0]
        elif parts[2].casefold() in named and parts[2] not in census.annotations:
            # task.annotations.GPU over keys made with resources={"GPU": 1}
            name = named[parts[2].casefold()]
            restriction, n = max(
                ((r, k) for r, k in census.resources.items() if name in dict(r)),
                key=lambda item: item[1],
            )
        else:
            continue
        out.append(_made_with(restriction, n, name))
    return out


def _nodes(root: ast.Node, *, operands: bool) -> Iterator[ast.Node]:
    """The nodes of a match, depth first; with ``operands``, those inside its
    comparisons too."""
    stack = [root]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.And, ast.Or)):
            stack.extend(node.operands)
        elif isinstance(node, ast.Not):
            stack.append(node.operand)
        elif isinstance(node, ast.Compare) and operands:
            stack.extend((node.left, node.right))


def _fold(text: str) -> str:
    return "".join(ch for ch in text.casefold() if ch.isalnum())
