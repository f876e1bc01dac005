"""Rules inside a dask config file: every ``amm_rules.RulesPolicy`` entry, checked.

A scheduler's dask config turns the policy on with an entry such as::

    distributed:
      scheduler:
        active-memory-manager:
          policies:
            - class: amm_rules.RulesPolicy
              rules: /etc/dask/rules.yaml    # a path, or the rules written inline

:func:`check_dask_config` reads such a file with positions, finds every mapping whose
``class`` is the policy (wherever it is in the file), and checks its ``rules``: an
inline mapping with the config file's own lines and columns, a path by reading that
file. A relative path is read from the current directory, as the scheduler reads it
from its working directory.

:func:`entries` and :func:`inline_diagnostics` are also what the scheduler uses to give
positions to the errors of inline rules (see :mod:`amm_rules.engine.rules_file`). Like
the rest of the language half, this module imports neither dask nor distributed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from amm_rules.language.diagnostics import Diagnostic, sort_key
from amm_rules.language.loader import (
    CheckResult,
    check_source,
    check_yaml_source,
    file_problem,
    read_rules_bytes,
)
from amm_rules.language.yaml_source import YamlSource, decode, mark_position, read_yaml

#: The ``class`` values that name the policy (its public name and its module path).
POLICY_CLASSES = frozenset({"amm_rules.RulesPolicy", "amm_rules.engine.policy.RulesPolicy"})

Path = tuple[Any, ...]


def entries(data: Any, path: Path = ()) -> Iterator[Path]:
    """The path of every mapping in ``data`` whose ``class`` names the policy."""
    if isinstance(data, dict):
        if data.get("class") in POLICY_CLASSES:
            yield path
        for key, value in data.items():
            yield from entries(value, (*path, key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            yield from entries(value, (*path, index))


def sub_source(source: YamlSource, at: Path) -> YamlSource:
    """The part of ``source`` under ``at``, with its paths relative to it and its
    positions those of the whole file."""
    n = len(at)

    def inside(table: dict[Path, Any]) -> dict[Path, Any]:
        return {p[n:]: node for p, node in table.items() if p[:n] == at}

    return YamlSource(
        text=source.text,
        data=_at(source.data, at),
        values=inside(source.values),
        keys=inside(source.keys),
        refused={p[n:] for p in source.refused if p[:n] == at},
        incomplete={p[n:] for p in source.incomplete if p[:n] == at},
    )


def check_dask_config(path: str | os.PathLike[str]) -> list[CheckResult]:
    """The config file's own result (its inline rules, with its positions), then one
    result per rules file its entries name."""
    name = os.fspath(path)
    raw = read_rules_bytes(path, streams=True)
    if isinstance(raw, str):
        return [file_problem(name, raw, "unreadable")]
    text, problems = decode(raw)
    if text is None:
        return [file_problem(name, problems[0].message, problems[0].code)]
    source, problems = read_yaml(text)
    if source is None:
        diagnostics = [
            Diagnostic(name, p.line, p.column, "error", f"dask config: {p.message}", None, p.code)
            for p in problems
        ]
        return [CheckResult(name, None, diagnostics, text)]
    found = list(entries(source.data))
    if not found:
        return [
            file_problem(
                name,
                "no amm_rules.RulesPolicy entry in this dask config (an entry of "
                "distributed.scheduler.active-memory-manager.policies with "
                "'class: amm_rules.RulesPolicy')",
                "no-policy",
                text,
            )
        ]
    own = CheckResult(name, None, [], text)
    files: list[CheckResult] = []
    for at in found:
        rules = _at(source.data, at).get("rules")
        if isinstance(rules, dict):
            result = check_yaml_source(sub_source(source, (*at, "rules")), name)
            own.diagnostics.extend(result.diagnostics)
            if result.ruleset is not None:
                own.inline.append(result.ruleset)
        elif isinstance(rules, str) and rules.strip():
            raw = read_rules_bytes(rules)
            if isinstance(raw, str):
                own.diagnostics.append(_unreadable(source, name, at, rules, raw))
            else:
                files.append(check_source(raw, rules))
        else:
            own.diagnostics.append(_entry_problem(source, name, at, rules))
    own.diagnostics.sort(key=sort_key)
    return [own, *files]


def inline_diagnostics(text: str, name: str, rules: Any) -> list[Diagnostic] | None:
    """The diagnostics of the inline ``rules`` as written in the config file ``text``,
    with its positions; ``None`` when no policy entry of the file holds these rules."""
    source, _ = read_yaml(text)
    if source is None:
        return None
    for at in entries(source.data):
        entry = _at(source.data, at)
        if isinstance(entry.get("rules"), dict) and entry["rules"] == rules:
            return check_yaml_source(sub_source(source, (*at, "rules")), name).diagnostics
    return None


def _at(data: Any, path: Path) -> Any:
    """The value at ``path`` in ``data``."""
    for step in path:
        data = data[step]
    return data


def _entry_problem(source: YamlSource, name: str, at: Path, rules: Any) -> Diagnostic:
    key = source.keys.get((*at, "rules"))
    node = key or source.values.get(at)
    line, column = mark_position(node.start_mark) if node else (0, 0)
    if rules is None and key is None:
        message = "this amm_rules.RulesPolicy entry has no 'rules' (a path or a mapping)"
    else:
        message = "rules: expected the path of a rules file or the rules as a mapping"
    return Diagnostic(name, line, column, "error", message, None, "wrong-type")


def _unreadable(source: YamlSource, name: str, at: Path, rules: str, why: str) -> Diagnostic:
    node = source.values.get((*at, "rules"))
    line, column = mark_position(node.start_mark) if node else (0, 0)
    relative = (
        ""
        if os.path.isabs(rules)
        else (
            " (a relative path is read from the current directory here, and from its working "
            "directory by the scheduler)"
        )
    )
    return Diagnostic(
        name, line, column, "error", f"rules: {rules!r}: {why}{relative}", None, "unreadable"
    )
