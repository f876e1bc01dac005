"""``amm-rules validate``: standard input, named pipes, ``--disable``, ``--dask-config``,
and the shape of its reports (one problem per line, capped source lines, ``null``
positions in JSON)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from amm_rules.cli import main
from amm_rules.language.loader import check_path
from amm_rules.language.reporters import MAX_SHOWN

NEVER = "version: 1\nrules:\n  - name: none\n    match: task.prefix in []\n    replicate: 2\n"
BAD = 'version: 1\nrules:\n  - name: bad\n    match: task.prefx == "a"\n    replicate: 2\n'


def run(*args: str, input: bytes | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), input=input, catch_exceptions=False)
    return result.exit_code, result.output


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# -- standard input and streams ------------------------------------------------------


def test_dash_reads_standard_input() -> None:
    status, output = run("validate", "-", input=BAD.encode())
    assert status == 1
    assert output.startswith("<stdin>:4:17: error: match: task has no attribute 'prefx'")
    assert run("validate", "-", input=b"version: 1\n") == (0, "1 file checked: no problems\n")


def test_dev_stdin_reads_a_pipe() -> None:
    """``/dev/stdin`` fed by a pipe, through the console entry point: a stream that is
    not a regular file is read to its end at the command line."""
    proc = subprocess.run(
        [sys.executable, "-m", "amm_rules", "validate", "/dev/stdin"],
        input=BAD.encode(),
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.decode().startswith("/dev/stdin:4:17: error: match: task has no attribute")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes on this system")
def test_named_pipe_read_by_validate_refused_by_the_scheduler(tmp_path: Path) -> None:
    fifo = tmp_path / "rules.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text(NEVER))
    writer.start()
    try:
        status, output = run("validate", str(fifo))
    finally:
        writer.join(timeout=60)
    assert status == 0
    assert "warning[never-matches]: rule 'none' never matches" in output
    # What the scheduler reads (no streams): refused at once, without waiting for a writer.
    result = check_path(fifo)
    assert [d.code for d in result.diagnostics] == ["unreadable"]
    assert "not a regular file" in result.diagnostics[0].message


# -- silencing warnings ---------------------------------------------------------------


def test_disable_silences_a_warning_code(tmp_path: Path) -> None:
    path = write(tmp_path, "never.yaml", NEVER)
    status, output = run("validate", "--strict", path)
    assert status == 1
    # The text shows the warning's code, which --disable takes.
    assert ":4:12: warning[never-matches]: rule 'none' never matches" in output
    status, output = run("validate", "--strict", "--disable", "never-matches", path)
    assert (status, output) == (0, "1 file checked: no problems\n")
    # Repeatable; errors are not affected.
    bad = write(tmp_path, "bad.yaml", BAD)
    status, output = run(
        "validate", "--disable", "never-matches", "--disable", "shadowed-rule", path, bad
    )
    assert status == 1
    assert output.endswith("2 files checked: 1 error\n")


def test_disable_refuses_anything_but_a_warning_code(tmp_path: Path) -> None:
    path = write(tmp_path, "never.yaml", NEVER)
    for code in ("never-match", "unknown-attribute"):
        result = CliRunner().invoke(main, ["validate", "--disable", code, path])
        assert result.exit_code == 2
        assert f"'{code}' is not a warning code; only warnings can be disabled" in result.output


# -- one problem per line ---------------------------------------------------------------


def test_multi_line_rule_name_stays_on_one_line(tmp_path: Path) -> None:
    text = (
        "version: 1\nrules:\n  - name: |\n      two\n      lines\n"
        '    match: task.prefix == "a"\n    replicas: 2\n'
    )
    status, output = run("validate", write(tmp_path, "multi.yaml", text))
    assert status == 1
    problems = [line for line in output.splitlines() if ": error: " in line]
    assert len(problems) == 2
    assert all(line.endswith("(in rule 'two\\nlines\\n')") for line in problems)
    # Every other line is a source line or a caret line, then the summary.
    lines = output.splitlines()
    assert len(lines) == 2 * 3 + 1


def test_long_source_lines_are_capped(tmp_path: Path) -> None:
    head = " or ".join(f'task.prefix == "p{i}"' for i in range(80))
    tail = " or ".join(f'task.prefix == "q{i}"' for i in range(80))
    match = f"{head} or task.prefx == 1 or {tail}"
    path = write(
        tmp_path, "long.yaml", f"version: 1\nrules:\n  - name: long\n    match: {match}\n"
    )
    status, output = run("validate", path)
    lines = output.splitlines()
    at = next(i for i, line in enumerate(lines) if "no attribute 'prefx'" in line)
    source, caret = lines[at + 1], lines[at + 2]
    assert len(source) <= 2 + MAX_SHOWN + 6
    assert source.startswith("  ...") and source.endswith("...")
    # The caret is still under the misspelt attribute.
    assert source[caret.index("^") :].startswith("prefx")
    assert caret.endswith("^~~~~")


def test_json_whole_file_problems_have_null_positions(tmp_path: Path) -> None:
    status, output = run("validate", "--format", "json", str(tmp_path / "missing.yaml"))
    assert status == 1
    (item,) = json.loads(output)
    assert (item["line"], item["column"], item["end_column"]) == (None, None, None)
    assert item["code"] == "unreadable"


# -- dask config files -------------------------------------------------------------------

CONFIG = """\
distributed:
  scheduler:
    active-memory-manager:
      start: true
      policies:
        - class: distributed.active_memory_manager.ReduceReplicas
        - class: amm_rules.RulesPolicy
          rules:
            version: 1
            rules:
              - name: gold
                match: task.prefx == "gold"
                replicate: 2
        - class: amm_rules.RulesPolicy
          rules: {path}
        - class: amm_rules.RulesPolicy
          rules: missing-rules.yaml
"""


def test_dask_config_inline_and_path_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    rules = write(tmp_path, "rules.yaml", NEVER)
    config = write(tmp_path, "dask.yaml", CONFIG.format(path="rules.yaml"))
    status, output = run("validate", "--dask-config", config)
    assert status == 1
    lines = output.splitlines()
    # Inline rules: positions in the config file, with its source line.
    assert lines[0] == (
        f"{config}:12:29: error: match: task has no attribute 'prefx'; "
        "did you mean 'task.prefix'? (in rule 'gold')"
    )
    assert lines[1] == '                  match: task.prefx == "gold"'
    # A path that does not exist is reported where the config names it.
    assert lines[3].startswith(f"{config}:17:18: error: rules: 'missing-rules.yaml': no such file")
    assert "relative path is read from the current directory" in lines[3]
    # A path that exists: the rules file is checked as a file.
    assert f"{Path(rules).name}:4:12: warning[never-matches]: rule 'none' never matches" in output
    assert output.endswith("2 files checked: 2 errors, 1 warning\n")


def test_dask_config_without_a_policy_entry(tmp_path: Path) -> None:
    config = write(tmp_path, "dask.yaml", "distributed:\n  scheduler:\n    work-stealing: true\n")
    status, output = run("validate", "--dask-config", config)
    assert status == 1
    assert f"{config}: error: no amm_rules.RulesPolicy entry in this dask config" in output


def test_dask_config_clean_with_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    clean = "version: 1\nrules: []\n"
    config = write(
        tmp_path,
        "dask.yaml",
        "policies:\n  - class: amm_rules.RulesPolicy\n    rules:\n      version: 1\n",
    )
    path = write(tmp_path, "more.yaml", clean)
    assert run("validate", "--dask-config", config, path) == (
        0,
        "2 files checked: no problems\n",
    )
