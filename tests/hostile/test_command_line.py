"""Hostile text reaching the command line: key names (any client chooses them) and rule
names (a double-quoted YAML string may hold any character) with terminal escape
sequences, and key arguments that break Python's parser (docs/reliability.md,
promise 15)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from distributed.utils_test import gen_cluster

from amm_rules.cli import main
from amm_rules.cli.keys import MAX_KEY_DEPTH, MAX_KEY_TEXT, KeyTextError, parse_key
from amm_rules.language.reporters import escape_controls
from benchmarks.support.waiting import wait_for
from tests.support.cluster import amm_config, copies, keep, rules

#: An OSC sequence setting the terminal's title, and one clearing the screen.
OSC = "\x1b]0;pwned\x07"
CLEAR = "\x1b[2J"
RULE = f"evil{OSC}"
KEY = f"evil-{CLEAR}1"


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


# ---------------------------------------------------------------------------------
# 15. Terminal escapes


def test_escape_controls_escapes_as_repr_does() -> None:
    assert escape_controls(f"a\n{OSC}\tb\u202ec\r") == "a\n\\x1b]0;pwned\\x07\tb\\u202ec\\r"
    assert escape_controls("plain\ntext é ✓\n") == "plain\ntext é ✓\n"


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 2,
    config=amm_config(rules({"name": RULE, "match": 'task.prefix == "evil"', "replicate": 2})),
    timeout=60,
)
async def test_status_and_explain_escape_what_clients_and_rules_name(c, s, a, b):
    future = c.submit(lambda: 1, key=KEY)
    await wait_for(lambda: copies(s, KEY) == 2, "the key at 2 copies")

    def cli(*args: str) -> tuple[int, str]:
        return run(*args, "--scheduler", s.address)

    status, text = await asyncio.to_thread(cli, "status")
    assert status == 0, text
    assert "\x1b" not in text and "\x07" not in text
    assert "evil\\x1b]0;pwned\\x07" in text
    status, text = await asyncio.to_thread(cli, "explain", KEY)
    assert status == 0, text
    assert "\x1b" not in text and "evil-\\x1b[2J1" in text
    # JSON is data: the names as they are (JSON escapes them its own way).
    status, text = await asyncio.to_thread(cli, "status", "--format", "json")
    assert status == 0 and RULE in json.loads(text)["rules"]
    status, text = await asyncio.to_thread(cli, "explain", KEY, "--format", "json")
    assert status == 0 and KEY in json.loads(text)
    keep([future])


def test_validate_escapes_a_rule_name_written_with_escapes(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(
        'version: 1\nrules:\n  - name: "evil\\e]0;pwned\\a"\n    match: "true"\n    replicate: -1\n'
    )
    status, text = run("validate", str(path))
    assert status == 1
    assert "\x1b" not in text and "(in rule 'evil\\x1b]0;pwned\\x07')" in text
    status, text = run("validate", str(path), "--format", "json")
    assert json.loads(text)[0]["rule"] == RULE


# ---------------------------------------------------------------------------------
# 16. Key texts that break the parser


@pytest.mark.parametrize(
    "text, why",
    [
        ("(" + "-" * 3000 + "1,)", "nested too deeply"),
        ("(" + "-" * 100_000 + "1,)", f"more than the limit of {MAX_KEY_TEXT:,}"),
        ("(" * 4_000 + ")" * 4_000, "too many nested parentheses"),
    ],
)
def test_a_key_text_that_breaks_the_parser_is_one_line(text: str, why: str) -> None:
    """A RecursionError and a MemoryError, as tracebacks."""
    status, output = run("explain", "--scheduler", "tcp://127.0.0.1:1", "--", text)
    assert status == 2
    (line,) = [x for x in output.splitlines() if x.startswith("Error")]
    assert line.startswith(f"Error: Invalid value for KEY: {text[:60]!r}... is not a key: ")
    assert line.endswith(why)
    assert len(output) < 1_000


@pytest.mark.parametrize("limit", [1_000, 100_000])
def test_how_deep_a_key_may_nest_does_not_depend_on_the_recursion_limit(limit: int) -> None:
    """The parser of Python's syntax got through 3,000 signs in a process whose recursion
    limit had been raised, and the answer changed from "nested too deeply" to "not
    unaryop": the depth is counted, whatever the limit."""
    deep = "(" + "-" * 3000 + "1,)"
    nested = "(" * MAX_KEY_DEPTH + "1" + ",)" * MAX_KEY_DEPTH  # tuples in tuples
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(limit)
    try:
        for text in (deep, nested):
            with pytest.raises(KeyTextError, match="nested too deeply$"):
                parse_key(text)
        assert parse_key("(('x-1', -1), 2)") == [(("x-1", -1), 2)]
    finally:
        sys.setrecursionlimit(before)
