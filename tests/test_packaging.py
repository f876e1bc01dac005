"""The wheel carries what the installed package loads (the grammar, its prebuilt parse
table, the demo's rules), and the README's first command works from it: the wheel
installed (not editable) in a fresh environment made by the test, ``amm-rules demo``
runs there with the demo rules the wheel ships."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import hatchling.build  # noqa: F401 - the wheel is built by it, without build isolation
import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
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


def test_the_installed_wheel_runs_the_demo_with_its_own_rules(wheel, tmp_path):
    """``pip install . && amm-rules demo``, with the wheel: a fresh virtual environment
    (its dependencies visible from this interpreter's site-packages, so that nothing
    is downloaded), the wheel installed in it, the command run outside the source
    tree with no PYTHONPATH."""
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
        check=True,
        timeout=120,
    )
    scripts = venv / Path(sysconfig.get_path("scripts")).relative_to(sys.prefix)
    python = scripts / Path(sys.executable).name
    subprocess.run(
        [
            sys.executable, "-m", "pip", "--python", str(python), "install",
            "--no-deps", "--no-index", "--quiet", str(wheel),
        ],
        check=True,
        timeout=300,
    )  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("DASK_")}
    where = subprocess.run(
        [str(python), "-c", "import amm_rules; print(amm_rules.__file__)"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    package = Path(where.stdout.strip()).parent
    assert package.is_relative_to(venv), package  # the wheel's copy, not the source tree
    demo = subprocess.run(
        [str(scripts / "amm-rules"), "demo"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert f"rules from {package / 'data' / 'demo.yaml'}\n" in demo.stdout
    assert demo.stdout.endswith("\nEvery target is met.\n"), demo.stdout
