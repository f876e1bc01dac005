"""``# amm-rules: disable=CODE``: silencing a warning in one place of a rules file.

A comment ``# amm-rules: disable=never-matches`` (several codes separated by commas)
silences those warnings on its own line and in the entry it is written in: the rule
(from its ``- name:`` to its last field), the pool, or the ``rebalance`` or
``paused-workers`` section. Only warnings can be silenced: an error means the file
cannot be used, and a comment does not change that. A directive naming anything but a
warning code is itself a warning (``bad-directive``), so a misspelt code does not
silently silence nothing.

Neighbours: :mod:`amm_rules.language.loader` calls :func:`apply` on every checked YAML
text, and ``amm-rules validate --dump`` calls :func:`silence` after adding the warnings
about a cluster; :mod:`amm_rules.language.lint` defines the warning codes
(:data:`~amm_rules.language.lint.ALL_WARNING_CODES`).
"""

from __future__ import annotations

import re
from typing import Any

from amm_rules.language.diagnostics import Diagnostic
from amm_rules.language.lint import ALL_WARNING_CODES
from amm_rules.language.yaml_source import YamlSource, read_yaml, split_lines

#: The directive, after a ``#`` that starts a comment (at the start of the line or
#: after a space).
DIRECTIVE = re.compile(r"(?:^|\s)#\s*amm-rules:\s*disable\s*=\s*(?P<codes>[^\s#]*)")


def directives(text: str) -> dict[int, list[tuple[str, int]]]:
    """Line (1-based) -> the codes its directive names, each with its column."""
    out: dict[int, list[tuple[str, int]]] = {}
    for row, line in enumerate(split_lines(text), start=1):
        m = DIRECTIVE.search(line)
        if m is None:
            continue
        column = m.start("codes") + 1
        for code in m["codes"].split(","):
            if code:
                out.setdefault(row, []).append((code, column))
            column += len(code) + 1
    return out


def entry_spans(source: YamlSource) -> list[tuple[int, int]]:
    """The first and last line (1-based) of every entry a directive can cover."""
    lines = split_lines(source.text)
    paths: list[tuple[Any, ...]] = [("rebalance",), ("paused-workers",)]
    data = source.data if isinstance(source.data, dict) else {}
    if isinstance(data.get("rules"), list):
        paths += [("rules", i) for i in range(len(data["rules"]))]
    if isinstance(data.get("pools"), dict):
        paths += [("pools", name) for name in data["pools"]]
    spans = []
    for path in paths:
        node = source.values.get(path)
        if node is None:
            continue
        key = source.keys.get(path)
        first = (key or node).start_mark.line + 1
        end = node.end_mark
        before = lines[end.line][: end.column] if end.line < len(lines) else ""
        # A block entry ends where the next one starts: that line is not its own.
        last = end.line if before.strip(" -") == "" else end.line + 1
        spans.append((first, max(first, last)))
    return spans


def apply(diagnostics: list[Diagnostic], source: YamlSource, file: str) -> list[Diagnostic]:
    """``diagnostics`` without the warnings that a directive silences, plus a
    ``bad-directive`` warning for each code a directive names that is not a warning's."""
    found = directives(source.text)
    if not found:
        return diagnostics
    out = _kept(diagnostics, source, found)
    for line, codes in found.items():
        for code, column in codes:
            if code not in ALL_WARNING_CODES:
                message = (
                    f"amm-rules: disable={code}: {code!r} is not a warning code; "
                    f"only warnings can be disabled: {', '.join(sorted(ALL_WARNING_CODES))}"
                )
                end = column + len(code)
                out.append(
                    Diagnostic(file, line, column, "warning", message, None, "bad-directive", end)
                )
    return out


def silence(results: list[Any]) -> None:
    """Drop from each checked file's diagnostics the warnings its directives silence
    (for warnings added after the check, such as ``validate --dump``'s)."""
    for result in results:
        if result.text is None or "amm-rules:" not in result.text:
            continue
        source, _ = read_yaml(result.text)
        if source is None:
            continue
        result.diagnostics = _kept(result.diagnostics, source, directives(source.text))


def _kept(
    diagnostics: list[Diagnostic], source: YamlSource, found: dict[int, list[tuple[str, int]]]
) -> list[Diagnostic]:
    """The diagnostics that no directive of ``found`` silences."""
    spans = entry_spans(source)
    return [d for d in diagnostics if d.is_error or not _silenced(d, found, spans)]


def _silenced(
    diag: Diagnostic, found: dict[int, list[tuple[str, int]]], spans: list[tuple[int, int]]
) -> bool:
    lines = {diag.line}
    for first, last in spans:
        if first <= diag.line <= last:
            lines.update(range(first, last + 1))
    return any(code == diag.code for line in lines for code, _ in found.get(line, ()))
