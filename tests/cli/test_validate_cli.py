"""``amm-rules validate``, ``schema`` and ``demo`` through click's test runner."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
from click.testing import CliRunner

from amm_rules.cli import main
from amm_rules.language.schema import SCHEMA

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples" / "rules").glob("*.yaml"))

CLEAN = 'version: 1\nrules:\n  - name: keep\n    match: task.prefix == "a"\n    replicate: 2\n'
WARNING = "version: 1\nrebalance:\n  sender-min: 70%\n  recipient-max: 0%\n"
ERRORS = 'version: 1\nrules:\n  - name: bad\n    match: task.prefx == "a"\n    replicate: 0\n'


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    out = {}
    for name, text in [("clean", CLEAN), ("warning", WARNING), ("errors", ERRORS)]:
        path = tmp_path / f"{name}.yaml"
        path.write_text(text)
        out[name] = str(path)
    return out


def test_clean_file(files: dict[str, str]) -> None:
    status, output = run("validate", files["clean"])
    assert status == 0
    assert output == "1 file checked: no problems\n"


def test_warnings_pass_unless_strict(files: dict[str, str]) -> None:
    status, output = run("validate", files["warning"])
    assert status == 0
    assert (
        f"{files['warning']}:4:18: warning[inverted-thresholds]: recipient-max is 0%: no worker"
        in output
    )
    assert output.endswith("1 file checked: 1 warning\n")
    status, _ = run("validate", "--strict", files["warning"])
    assert status == 1


def test_text_format_shows_source_and_caret(files: dict[str, str]) -> None:
    status, output = run("validate", files["errors"])
    assert status == 1
    lines = output.splitlines()
    assert lines[0] == (
        f"{files['errors']}:4:17: error: match: task has no attribute 'prefx'; "
        "did you mean 'task.prefix'? (in rule 'bad')"
    )
    assert lines[1] == '      match: task.prefx == "a"'
    # The whole misspelt attribute is underlined; a YAML value gets a single caret.
    assert lines[2] == "  " + " " * 16 + "^~~~~"
    assert lines[3].startswith(f"{files['errors']}:5:16: error: replicate: must be at least 1")
    assert lines[4:6] == ["      replicate: 0", "  " + " " * 15 + "^"]
    assert lines[-1] == "1 file checked: 2 errors"


def test_json_format(files: dict[str, str]) -> None:
    status, output = run("validate", "--format", "json", files["errors"], files["warning"])
    assert status == 1
    items = json.loads(output)
    assert [
        (i["file"], i["line"], i["column"], i["severity"], i["code"], i["rule"]) for i in items
    ] == [
        (files["errors"], 4, 17, "error", "unknown-attribute", "bad"),
        (files["errors"], 5, 16, "error", "bad-value", "bad"),
        (files["warning"], 4, 18, "warning", "inverted-thresholds", "rebalance"),
    ]
    assert set(items[0]) == {
        "file",
        "line",
        "column",
        "end_column",
        "severity",
        "message",
        "rule",
        "code",
    }


def test_json_format_clean_is_an_empty_list(files: dict[str, str]) -> None:
    assert run("validate", "--format", "json", files["clean"]) == (0, "[]\n")


def test_github_format(files: dict[str, str], tmp_path: Path) -> None:
    status, output = run(
        "validate", "--format", "github", files["errors"], str(tmp_path / "missing.yaml")
    )
    assert status == 1
    lines = output.splitlines()
    assert lines[0].startswith(
        f"::error file={files['errors']},line=4,col=17,"
        "title=amm-rules unknown-attribute::match: task has no attribute"
    )
    assert lines[0].endswith("(in rule 'bad')")
    # A problem with the file as a whole carries no line; property values are escaped.
    assert lines[2] == (
        f"::error file={tmp_path / 'missing.yaml'},title=amm-rules unreadable::no such file"
    )
    assert len(lines) == 3


def test_github_escapes() -> None:
    from amm_rules.language.diagnostics import Diagnostic
    from amm_rules.language.loader import CheckResult
    from amm_rules.language.reporters import format_github

    diag = Diagnostic("a,b:c.yaml", 1, 2, "warning", "100% sure\nreally", None, "x")
    out = format_github([CheckResult("a,b:c.yaml", None, [diag])])
    assert out == (
        "::warning file=a%2Cb%3Ac.yaml,line=1,col=2,title=amm-rules x::100%25 sure%0Areally\n"
    )


def test_missing_file_and_directory(tmp_path: Path) -> None:
    status, output = run("validate", str(tmp_path / "nope.yaml"), str(tmp_path))
    assert status == 1
    assert output == (
        f"{tmp_path / 'nope.yaml'}: error: no such file\n"
        f"{tmp_path}: error: is a directory, not a rules file\n"
        "2 files checked: 2 errors\n"
    )


def test_binary_file(tmp_path: Path) -> None:
    path = tmp_path / "image.png"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00")
    status, output = run("validate", str(path))
    assert status == 1
    assert output == (
        f"{path}: error: binary file (contains NUL bytes); rules files are UTF-8 YAML text\n"
        "1 file checked: 1 error\n"
    )


def test_several_files_all_checked(files: dict[str, str]) -> None:
    status, output = run("validate", files["errors"], files["clean"], files["warning"])
    assert status == 1
    assert output.index(files["errors"]) < output.index(files["warning"])
    assert output.endswith("3 files checked: 2 errors, 1 warning\n")


def test_usage_errors() -> None:
    assert run("validate")[0] == 2
    assert run("validate", "--format", "xml", "x.yaml")[0] == 2
    assert run("frobnicate")[0] == 2


def test_schema_command() -> None:
    status, output = run("schema")
    assert status == 0
    assert json.loads(output) == SCHEMA


def test_demo_calls_the_demo_module(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    fake = types.ModuleType("amm_rules.demo")
    fake.main = lambda rules=None: calls.append(rules) or 0  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "amm_rules.demo", fake)
    assert run("demo", "--rules", "x.yaml")[0] == 0
    assert calls == ["x.yaml"]


def test_demo_falls_back_to_validating_examples(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "amm_rules.demo", None)  # as if it were not installed
    status, output = run("demo")
    assert status == 0
    assert output.endswith(f"{len(EXAMPLES)} files checked: no problems\n")
    assert len(EXAMPLES) >= 5


def test_caret_lines_up_after_tabs_and_crlf() -> None:
    """A tab before the column is kept in the caret line, so the caret sits under the
    token in a terminal; CRLF line ends do not leak into the output."""
    case = ROOT / "tests" / "cases" / "invalid" / "expr-crlf-tabs.yaml"
    status, output = run("validate", str(case))
    assert status == 1
    lines = output.splitlines()
    at = next(i for i, line in enumerate(lines) if ":11:52: error: " in line)
    source, caret = lines[at + 1], lines[at + 2]
    assert "\r" not in source
    assert source == "      match: \"task.prefix ==\t'a' and task.nbytes > 1 Mib\""
    assert caret == "  " + " " * 26 + "\t" + " " * 24 + "^~~"
    assert source[caret.index("^") :].startswith("Mib")
