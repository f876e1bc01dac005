"""Hints for expressions YAML misreads when they are not quoted
(:mod:`amm_rules.language.quoting`), and when they are not given."""

from __future__ import annotations

import yaml

from amm_rules.language.loader import check_text
from amm_rules.language.quoting import comment_hint, quoted, quoted_line, yaml_error_hint


def messages(text: str) -> list[str]:
    return [d.message for d in check_text(text)[1]]


def test_quoted_lines_are_yaml_for_the_same_expression() -> None:
    for line in (
        '  - match: task.annotations.tier == "gold: yes"',
        '    match: "gpu" in task.annotations.tags',
        "  big: 'gpu' in worker.name",
        """    match: 'it''s' == task.prefix or task.key matches "a: b" """,
    ):
        fixed = quoted_line(line)
        assert fixed is not None
        value = line.split(": ", 1)[1].strip()
        key = fixed.split(":", 1)[0].lstrip(" -")
        assert yaml.safe_load(fixed.lstrip(" -")) == {key: value}


def test_quoted_prefers_single_quotes() -> None:
    assert quoted('a == "b"') == "'a == \"b\"'"
    assert quoted("a == 'b'") == "\"a == 'b'\""
    assert quoted("a == 'b' or c == \"d\"") == "'a == ''b'' or c == \"d\"'"


def test_no_hint_where_quoting_is_not_the_fix() -> None:
    # A real comment after a complete string is a comment.
    assert comment_hint('    match: task.prefix == "a"  # note', 'task.prefix == "a"') is None
    # Not an expression entry.
    assert yaml_error_hint("    name: a: b", 12, "mapping values are not allowed") is None
    # Quoted as a whole: the error is something else.
    line = "    match: 'task.prefix == \"a\"'"
    assert yaml_error_hint(line, 32, "did not find expected key") is None
    # An error before the value.
    assert yaml_error_hint('  match: "a" in task.tags', 2, "did not find expected key") is None


def test_real_comment_after_an_incomplete_expression_gets_no_hint() -> None:
    (message,) = messages(
        "version: 1\nrules:\n  - name: x\n    match: task.prefix == 'a' and  # more\n"
        "    replicate: 2\n"
    )
    assert "unexpected end of the expression" in message
    assert "quote" not in message


def test_dash_hint_only_for_a_dashed_name() -> None:
    base = "version: 1\nrules:\n  - name: x\n    match: '{}'\n    replicate: 2\n"
    (message,) = messages(base.format("task.annotations.cache-tier == 1"))
    assert 'task.annotations["cache-tier"]' in message
    (message,) = messages(base.format("task.nbytes - 1 > 2"))
    assert "brackets" not in message
