"""Data-driven rules files: ``tests/cases/valid`` must load cleanly; each file in
``tests/cases/invalid`` states, in ``# expect:`` comments, exactly the diagnostics it yields.

An expectation reads ``# expect: LINE:COLUMN SEVERITY CODE "message fragment"``. The
test checks that the diagnostics and the expectations pair up one to one: same
position, severity and code, and the fragment is part of the message.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from amm_rules.language.loader import check_text

CASES = Path(__file__).resolve().parents[1] / "cases"
EXPECT = re.compile(
    r"^#\s*expect:\s*(?P<line>\d+):(?P<column>\d+)\s+(?P<severity>error|warning)\s+"
    r'(?P<code>[\w-]+)(?:\s+"(?P<fragment>.*)")?\s*$'
)


def _cases(kind: str) -> list[Path]:
    return sorted((CASES / kind).glob("*.yaml"))


def expectations(raw: bytes) -> list[tuple[int, int, str, str, str]]:
    """The ``# expect:`` lines of the leading comment block."""
    out = []
    for line in raw.decode("utf-8", "replace").splitlines():
        if not line.startswith("#"):
            break
        if m := EXPECT.match(line.lstrip("\ufeff")):
            out.append(
                (int(m["line"]), int(m["column"]), m["severity"], m["code"], m["fragment"] or "")
            )
    return out


@pytest.mark.parametrize("path", _cases("valid"), ids=lambda p: p.name)
def test_valid_case(path: Path) -> None:
    ruleset, diagnostics = check_text(path.read_bytes(), path.name)
    assert [str(d) for d in diagnostics] == []
    assert ruleset is not None


@pytest.mark.parametrize("path", _cases("invalid"), ids=lambda p: p.name)
def test_invalid_case(path: Path) -> None:
    raw = path.read_bytes()
    expected = expectations(raw)
    assert expected, f"{path.name} states no '# expect:' lines"
    ruleset, diagnostics = check_text(raw, path.name)
    unmatched = list(diagnostics)
    missing = []
    for line, column, severity, code, fragment in expected:
        for diag in unmatched:
            if (diag.line, diag.column, diag.severity, diag.code) == (
                line,
                column,
                severity,
                code,
            ) and fragment in diag.message:
                unmatched.remove(diag)
                break
        else:
            missing.append(f'{line}:{column} {severity} {code} "{fragment}"')
    got = "\n".join(
        f"  {d.line}:{d.column} {d.severity} {d.code} {d.message!r}" for d in diagnostics
    )
    assert not missing, f"expected but not reported: {missing}\nreported:\n{got}"
    assert not unmatched, f"reported but not expected: {[str(d) for d in unmatched]}"
    has_errors = any(severity == "error" for _, _, severity, _, _ in expected)
    assert (ruleset is None) == has_errors


def test_every_expression_code_is_covered() -> None:
    """The invalid cases exercise every code an expression error can carry."""
    from amm_rules.language.expr.errors import CODES

    seen = {code for path in _cases("invalid") for *_, code, _ in expectations(path.read_bytes())}
    assert seen >= CODES, f"no case for {sorted(CODES - seen)}"


def test_every_warning_is_covered() -> None:
    seen = {
        code
        for path in _cases("invalid")
        for _, _, severity, code, _ in expectations(path.read_bytes())
        if severity == "warning"
    }
    assert {
        "shadowed-rule",
        "never-matches",
        "pool-avoid-conflict",
        "unsatisfiable-target",
        "inverted-thresholds",
    } <= seen


@pytest.mark.parametrize("path", _cases("invalid") + _cases("valid"), ids=lambda p: p.name)
def test_pure_python_yaml_gives_the_same_diagnostics(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """libyaml is used when PyYAML has it; without it, positions and codes are the same."""
    import yaml

    from amm_rules.language import yaml_source

    raw = path.read_bytes()
    fast = [(d.line, d.column, d.code) for d in check_text(raw)[1]]
    monkeypatch.setattr(yaml_source, "_LOADER", yaml.SafeLoader)
    assert [(d.line, d.column, d.code) for d in check_text(raw)[1]] == fast
