"""Property: whatever bytes a rules file holds, checking it yields diagnostics, never
an exception, and never an internal error.

Inputs are the valid cases and examples, mutated at the byte and line level (YAML
punctuation, tabs, tags, anchors, binary bytes, deleted or duplicated lines...).
``CI`` set in the environment bounds the number of examples (see conftest.py for the
hypothesis profile); the default is about 2,000.
"""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from amm_rules.language.loader import CheckResult, check_text
from amm_rules.language.reporters import format_github, format_json, format_text
from benchmarks.support import fuzzer
from tests.support.env import in_ci

ROOT = Path(__file__).resolve().parents[2]
SEEDS = [p.read_bytes() for p in sorted((ROOT / "tests" / "cases" / "valid").glob("*.yaml"))]
SEEDS += [p.read_bytes() for p in sorted((ROOT / "examples" / "rules").glob("*.yaml"))]
EXAMPLES = int(os.environ.get("AMM_RULES_FUZZ_EXAMPLES", "200" if in_ci() else "2000"))

# The shared fuzzer's tokens, plus a few that only byte-level mutation needs.
TOKENS = [*fuzzer.TOKENS, b"-", b"*b ", b"...", b"true", b"null", b"0"]


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(
            st.sampled_from(
                [
                    "insert",
                    "delete",
                    "replace",
                    "byte",
                    "line-delete",
                    "line-dup",
                    "line-swap",
                    "indent",
                ]
            )
        )
        pos = draw(st.integers(0, len(data)))
        lines = bytes(data).split(b"\n")
        i = draw(st.integers(0, len(lines) - 1))
        j = draw(st.integers(0, len(lines) - 1))
        if kind == "insert":
            data[pos:pos] = draw(st.sampled_from(TOKENS))
        elif kind == "delete":
            del data[pos : pos + draw(st.integers(1, 20))]
        elif kind == "replace":
            data[pos : pos + 1] = draw(st.sampled_from(TOKENS))
        elif kind == "byte":
            data[pos:pos] = bytes([draw(st.integers(0, 255))])
        else:
            if kind == "line-delete":
                del lines[i]
            elif kind == "line-dup":
                lines.insert(i, lines[i])
            elif kind == "line-swap":
                lines[i], lines[j] = lines[j], lines[i]
            else:
                lines[i] = b" " * draw(st.integers(0, 7)) + lines[i].lstrip(b" ")
            data = bytearray(b"\n".join(lines))
    return bytes(data)


@settings(max_examples=EXAMPLES, deadline=None)
@given(mutated())
def test_mutated_rules_never_raise(content: bytes) -> None:
    ruleset, diagnostics = check_text(content, "fuzz.yaml")
    assert [d for d in diagnostics if d.code == "internal"] == []
    assert (ruleset is None) == any(d.is_error for d in diagnostics)
    # YAML also ends lines at NEL, LINE SEPARATOR and PARAGRAPH SEPARATOR.
    decoded = content.decode("utf-8", "replace")
    n_lines = sum(decoded.count(c) for c in "\n\r\x85\u2028\u2029") + 2
    for d in diagnostics:
        assert d.severity in ("error", "warning")
        assert d.message and d.code
        assert 0 <= d.line <= n_lines and d.column >= 0
        assert (d.line == 0) == (d.column == 0)
    text = content.decode("utf-8", "replace")
    result = CheckResult("fuzz.yaml", ruleset, diagnostics, text)
    assert format_text([result]).endswith("\n")
    assert len(format_github([result]).splitlines()) == len(diagnostics)
    assert format_json([result]).startswith("[")
