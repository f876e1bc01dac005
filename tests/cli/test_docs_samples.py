"""The ``amm-rules validate`` samples in README.md and docs/rules.md are what the command
prints: each sample's rules file (the file the sample was made from, written here) is
validated through click's runner, from its directory as the sample shows, and the output
is compared with the sample, line for line."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from amm_rules.cli import main

ROOT = Path(__file__).resolve().parents[2]

#: The rules.yaml of the README's sample.
README_RULES = """\
version: 1
pools:
  gpu: worker.resources.GPU >= 1
rules:
  - name: precious
    match: task.prefx == "stage1"
    replicate: 3
    pool: gpus
"""

#: The rules.yaml of docs/rules.md's samples (validated with the demo's rules).
RULES_MD_RULES = """\
version: 1
pools:
  gpu: worker.resources.GPU >= 1
rules:
  - name: stage-one
    match: task.prefx == "stage1"
    replicate: 3
  - name: device-arrays
    match: task.type == "cupy.ndarray"
    pool: gpus
    spread: hosts
rebalance:
  sender-min: 70%
  recipient-max: 0%
"""


def console_samples(doc: Path) -> dict[str, str]:
    """``$ amm-rules validate ...`` command -> the output the page shows under it."""
    text = doc.read_text(encoding="utf-8")
    out = {}
    for block in re.findall(r"^```console\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
        command, _, output = block.partition("\n")
        if command.startswith("$ amm-rules validate") and output:
            out[command[2:]] = output
    return out


def run_in(directory: Path, command: str) -> tuple[int, str]:
    args = command.split()[1:]  # without "amm-rules"
    cwd = os.getcwd()
    os.chdir(directory)
    try:
        result = CliRunner().invoke(main, args, catch_exceptions=False)
    finally:
        os.chdir(cwd)
    return result.exit_code, result.output


@pytest.fixture
def readme_dir(tmp_path: Path) -> Path:
    (tmp_path / "rules.yaml").write_text(README_RULES)
    return tmp_path


@pytest.fixture
def rules_md_dir(tmp_path: Path) -> Path:
    (tmp_path / "rules.yaml").write_text(RULES_MD_RULES)
    shutil.copy(ROOT / "examples" / "rules" / "demo.yaml", tmp_path / "demo.yaml")
    return tmp_path


def test_readme_validate_sample_is_the_real_output(readme_dir: Path) -> None:
    samples = console_samples(ROOT / "README.md")
    assert list(samples) == ["amm-rules validate rules.yaml"]
    status, output = run_in(readme_dir, "amm-rules validate rules.yaml")
    assert status == 1
    assert output == samples["amm-rules validate rules.yaml"]


@pytest.mark.parametrize(
    "command",
    ["amm-rules validate rules.yaml demo.yaml", "amm-rules validate --format github rules.yaml"],
    ids=["text", "github"],
)
def test_rules_md_sample_is_the_real_output(rules_md_dir: Path, command: str) -> None:
    sample = console_samples(ROOT / "docs" / "rules.md")[command]
    status, output = run_in(rules_md_dir, command)
    assert status == 1
    assert output == sample


def test_rules_md_json_sample_is_the_real_output(rules_md_dir: Path) -> None:
    command = "amm-rules validate --format json rules.yaml"
    sample = console_samples(ROOT / "docs" / "rules.md")[command]
    status, output = run_in(rules_md_dir, command)
    assert status == 1
    # The page shows the first problem, then "...".
    first = json.loads(sample.replace("  },\n  ...\n]", "  }\n]"))[0]
    real = json.loads(output)
    assert len(real) == 4
    assert {k: real[0][k] for k in first} == first


def test_rules_md_clean_sample_is_the_real_output(tmp_path: Path) -> None:
    shutil.copy(ROOT / "examples" / "rules" / "demo.yaml", tmp_path / "rules.yaml")
    command = "amm-rules validate rules.yaml"
    sample = console_samples(ROOT / "docs" / "rules.md")[command]
    assert run_in(tmp_path, command) == (0, sample)
