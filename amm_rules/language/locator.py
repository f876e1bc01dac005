"""Turn problems found at a data path into positioned :class:`Diagnostic` objects.

The checks (:mod:`amm_rules.language.schema_check`, :mod:`amm_rules.language.build`,
:mod:`amm_rules.language.lint`) speak in paths: ``("rules", 2, "replicate", "max")``. A
:class:`Locator` knows the file, the data and (for YAML files) the
:class:`~amm_rules.language.yaml_source.YamlSource`, and from a path derives the position (of
the key or the value), and the entry the problem is in: the rule's name,
``pools.NAME``, ``rebalance``, ``paused-workers``, ``demand`` or ``memory-pressure``.
Inline mappings have no positions; their diagnostics have line and column 0 and rely on
the entry and field named in the message.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from yaml.nodes import CollectionNode, ScalarNode

from amm_rules.language.diagnostics import FILE_SECTIONS, Diagnostic, Severity
from amm_rules.language.schema_check import Path, SchemaProblem, field_label
from amm_rules.language.yaml_source import YamlSource, split_lines


class Locator:
    """Collects the diagnostics of one rules file."""

    def __init__(self, file: str, data: Any, source: YamlSource | None = None):
        self.file = file
        self.data = data
        self.source = source
        self.diagnostics: list[Diagnostic] = []
        #: Every prefix of every path at which an error was reported, so that later
        #: checks can skip what was already reported, in constant time.
        self._reported: set[Path] = set()
        # Values refused while reading the YAML (a tag, a too-long integer) were
        # reported then: their data is None, which later checks must not report again.
        for path in source.refused if source is not None else ():
            self._mark(path)

    # -- positions ------------------------------------------------------------------

    def position(self, path: Path, at_key: bool = False) -> tuple[int, int]:
        if self.source is None:
            return 0, 0
        if at_key and (pos := self.source.key_position(path)):
            return pos
        node = self.source.values.get(path)
        # A block list or mapping starts on the line after its key; the key is where
        # a reader looks for "rules: expected a list".
        if isinstance(node, CollectionNode) and not node.flow_style and path in self.source.keys:
            return self.source.key_position(path) or (0, 0)
        while path:
            if (pos := self.source.value_position(path)) is not None:
                return pos
            path = path[:-1]
        return self.source.value_position(()) or (1, 1)

    def entry(self, path: Path) -> str | None:
        """The ``rule`` field of a diagnostic at ``path``."""
        if len(path) >= 2 and path[0] == "rules" and isinstance(path[1], int):
            return self.item_name(path[0], path[1])
        if len(path) >= 2 and path[0] == "pools":
            return f"pools.{path[1]}"
        if path and path[0] in FILE_SECTIONS:
            return str(path[0])
        return None

    def item_name(self, section: str, index: int) -> str:
        """The ``name`` of the item ``index`` of the list ``section``, or ``#N`` (from 1)
        when it has none."""
        items = self.data.get(section) if isinstance(self.data, dict) else None
        item = items[index] if isinstance(items, list) and index < len(items) else None
        name = item.get("name") if isinstance(item, dict) else None
        return name if isinstance(name, str) and name else f"#{index + 1}"

    # -- recording ------------------------------------------------------------------

    def add(
        self,
        path: Path,
        message: str,
        code: str,
        *,
        severity: Severity = "error",
        at_key: bool = False,
        span: tuple[int, int, int | None] | None = None,
    ) -> None:
        """A problem at ``path``: at its position (of its key, with ``at_key``), or at
        ``span`` (line, column and end column) when known."""
        line, column, end = span or (*self.position(path, at_key), None)
        self.diagnostics.append(
            Diagnostic(self.file, line, column, severity, message, self.entry(path), code, end)
        )
        if severity == "error":
            self._mark(path)

    def warn(self, path: Path, message: str, code: str, *, at_key: bool = False) -> None:
        self.add(path, message, code, severity="warning", at_key=at_key)

    def add_schema(self, problems: Iterable[SchemaProblem]) -> None:
        refused = self.source.refused if self.source is not None else set()
        incomplete = self.source.incomplete if self.source is not None else set()
        for p in problems:
            # Already reported while reading the YAML: a refused value (its data is
            # None) or a mapping that lost entries would only repeat that problem.
            if any(p.path[:n] in refused for n in range(len(p.path) + 1)):
                continue
            if p.path in incomplete and p.code in ("missing-field", "no-action"):
                continue
            self.add(p.path, p.message, p.code, at_key=p.at_key)

    def add_expression(
        self, path: Path, problems: Iterable[Any], severity: Severity = "error"
    ) -> None:
        """Errors (or warnings) of an expression (``Problem`` objects, positions inside
        the text)."""
        from amm_rules.language.scalar_positions import expression_position

        label = field_label(path)
        source = self.source
        node = source.values.get(path) if source is not None else None
        for problem in problems:
            span = None
            if source is not None and isinstance(node, ScalarNode) and problem.line > 0:
                line, column = expression_position(source, node, problem.line, problem.column)
                end_column = None
                if problem.end_column is not None and problem.end_column > problem.column:
                    end = expression_position(source, node, problem.line, problem.end_column)
                    if end[0] == line and end[1] > column:
                        end_column = end[1]
                span = (line, column, end_column)
            message = f"{label}: {problem.message}" if label else problem.message
            if problem.code == "syntax" and isinstance(node, ScalarNode):
                message += self._comment_hint(node)
            self.add(path, message, problem.code, severity=severity, span=span)

    def _comment_hint(self, node: ScalarNode) -> str:
        """``"; YAML read ... as a comment: quote ..."`` when a plain (unquoted) value
        lost its end to a comment, else ``""``."""
        if node.style not in (None, "") or self.source is None:
            return ""
        from amm_rules.language.quoting import comment_hint

        lines = split_lines(self.source.text)
        row = node.end_mark.line
        if node.start_mark.line != row or row >= len(lines):
            return ""
        hint = comment_hint(lines[row], node.value)
        return f"; {hint}" if hint else ""

    def _mark(self, path: Path) -> None:
        for n in range(len(path) + 1):
            self._reported.add(path[:n])

    def reported_under(self, path: Path) -> bool:
        """True if an error was reported at ``path`` or anywhere inside it."""
        return path in self._reported

    @property
    def has_errors(self) -> bool:
        return any(d.is_error for d in self.diagnostics)
