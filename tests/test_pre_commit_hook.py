"""``.pre-commit-hooks.yaml``: the hook pre-commit users add by the repository's URL runs
``amm-rules validate`` on rules files, and docs/rules.md shows how to add it."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml
from click.testing import CliRunner

from amm_rules.cli import main

ROOT = Path(__file__).resolve().parent.parent


def hook() -> dict:
    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    (only,) = [h for h in hooks if h["id"] == "amm-rules-validate"]
    return only


def test_hook_runs_the_console_script_on_files() -> None:
    entry = shlex.split(hook()["entry"])
    # The console script of that name (pyproject.toml's [project.scripts]).
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'\n{entry[0]} = "amm_rules.cli:main"\n' in pyproject
    assert hook()["language"] == "python"
    # pre-commit appends the staged file names to the entry.
    files = [str(p) for p in sorted((ROOT / "examples" / "rules").glob("*.yaml"))]
    result = CliRunner().invoke(main, [*entry[1:], *files], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert result.output == f"{len(files)} files checked: no problems\n"


def test_hook_selects_rules_files_by_name() -> None:
    pattern = re.compile(hook()["files"])
    for path in ("rules.yaml", "deploy/amm-rules.yml", "examples/rules/gpu-pools.yaml"):
        assert pattern.search(path), path
    for path in (".pre-commit-config.yaml", "docs/rules.md", "dask/scheduler.yaml"):
        assert not pattern.search(path), path


def test_docs_show_the_hook_id() -> None:
    text = (ROOT / "docs" / "rules.md").read_text()
    assert f"- id: {hook()['id']}" in text
