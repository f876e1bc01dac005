"""Rules the test suite keeps, checked on its own source with :mod:`ast` (docs/reliability.md,
"How the suite is kept honest"):

- no fixed sleep and no poll of distributed's own (``asyncio.sleep``, ``time.sleep``,
  ``async_poll_for``, ``poll_for``) in a test module: tests wait on a condition with a
  deadline that fails, through :mod:`benchmarks.support.waiting` (which also keeps each
  test's poll budget under its timeout). A sleep that is a task's own work, run on a
  worker, says so with a ``# work:`` comment on its line, and the pause of a loop that
  checks that nothing happens for a while (a stall) with ``# window:``;
- no ``pytest.importorskip``: what the tests need is in the ``test`` extra, and a broken
  install must fail, not skip.

``tests/support/`` is where waiting is implemented, so it is not scanned. The checker is
tested on planted violations.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent
#: Calls that wait a fixed time, or poll outside benchmarks.support.waiting.
WAITS = {"asyncio.sleep", "time.sleep", "sleep", "async_poll_for", "poll_for"}
SKIPS = {"pytest.importorskip", "importorskip"}


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def violations(source: str, name: str) -> list[str]:
    """``name:line: what`` for every broken rule in one module's source."""
    lines = source.splitlines()
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        called = _dotted(node.func)
        line = lines[node.lineno - 1]
        if called in WAITS and "# work:" not in line and "# window:" not in line:
            out.append(
                (node.lineno, f"{called}(): wait on a condition (benchmarks.support.waiting)")
            )
        elif called in SKIPS:
            out.append((node.lineno, f"{called}(): import it (the test extra has it)"))
    return [f"{name}:{lineno}: {what}" for lineno, what in sorted(out)]


def test_tests_wait_on_conditions_and_skip_nothing_installed() -> None:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if "support" in path.relative_to(ROOT).parts:
            continue
        found += violations(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT.parent)))
    assert found == []


def test_the_checker_finds_planted_violations() -> None:
    planted = """\
import asyncio, time
import pytest
from time import sleep
from distributed.utils_test import async_poll_for

async def test_a(s):
    await asyncio.sleep(0.3)
    time.sleep(1)
    sleep(1)
    await async_poll_for(lambda: True, timeout=5)
    np = pytest.importorskip("numpy")

def work():
    time.sleep(0.02)  # work: a task that takes a while
"""
    assert violations(planted, "t.py") == [
        "t.py:7: asyncio.sleep(): wait on a condition (benchmarks.support.waiting)",
        "t.py:8: time.sleep(): wait on a condition (benchmarks.support.waiting)",
        "t.py:9: sleep(): wait on a condition (benchmarks.support.waiting)",
        "t.py:10: async_poll_for(): wait on a condition (benchmarks.support.waiting)",
        "t.py:11: pytest.importorskip(): import it (the test extra has it)",
    ]
