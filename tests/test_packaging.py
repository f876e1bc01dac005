"""The wheel carries what the installed package loads: the grammar, its prebuilt
parse table and the demo's rules."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    pytest.importorskip("hatchling")
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--quiet",
            "--wheel-dir",
            str(out),
            str(REPO),
        ],
        check=True,
        timeout=300,
    )
    (built,) = out.glob("amm_rules-*.whl")
    return built


@pytest.fixture(scope="module")
def wheel_names(wheel) -> set[str]:
    with zipfile.ZipFile(wheel) as zf:
        return set(zf.namelist())


@pytest.mark.parametrize(
    "name",
    [
        "amm_rules/grammar/expr.lark",
        "amm_rules/language/expr/parse_table.json",
        "amm_rules/data/demo.yaml",
        "amm_rules/py.typed",
        "amm_rules/engine/policy.py",
    ],
)
def test_wheel_contains(wheel_names, name):
    assert name in wheel_names


def test_wheel_declares_the_console_script(wheel, wheel_names):
    (entry_points,) = [n for n in wheel_names if n.endswith("entry_points.txt")]
    with zipfile.ZipFile(wheel) as zf:
        text = zf.read(entry_points).decode()
    assert "amm-rules = amm_rules.cli:main" in text
