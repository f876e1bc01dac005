"""``.ci/matrix.py``, the version matrix of CI: its environments as written on its command
line, the interpreters it finds (through pyenv or on PATH, never a path written in the
repository), and the tests it selects (the ``compat`` marker)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MATRIX = ROOT / ".ci" / "matrix.py"


def matrix(*args: str) -> subprocess.CompletedProcess[str]:
    """``.ci/matrix.py ARGS`` as CI runs it (a script of the repository, not a module)."""
    return subprocess.run(
        [sys.executable, str(MATRIX), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_default_matrix_is_the_floor_on_the_oldest_python_and_the_newest_on_the_newest():
    done = matrix("--show", "--no-install")
    if done.returncode != 0:  # an interpreter missing on this machine: said in one line
        assert done.stderr.startswith("matrix: no Python"), done.stderr
        return
    floor, newest = (line.split() for line in done.stdout.splitlines())
    assert floor[:2] == ["floor", "3.10"] and floor[3].endswith("constraints-floor.txt")
    assert newest[:2] == ["newest", "3.13"] and newest[3] == "-"


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("floor", "expected NAME=PYTHON[:CONSTRAINTS]"),
        ("floor=3", "expected NAME=PYTHON[:CONSTRAINTS]"),
        ("floor=3.10:no-such-pins.txt", "no constraints file"),
    ],
)
def test_a_wrong_environment_is_refused_with_words(spec, says):
    done = matrix("--show", "--no-install", spec)
    assert done.returncode != 0 and done.stderr.startswith("matrix: ")
    assert says in done.stderr


def test_the_interpreter_of_a_version_is_found():
    version = "{}.{}".format(*sys.version_info[:2])
    done = matrix("--show", "--no-install", f"here={version}")
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    python = line.split()[2]
    out = subprocess.run(
        [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert out.stdout.strip() == version


def test_a_missing_interpreter_is_named():
    done = matrix("--show", "--no-install", "old=2.1")
    assert done.returncode != 0
    assert done.stderr.startswith("matrix: no Python 2.1 on this machine"), done.stderr


def test_the_compat_marker_selects_the_engine_legacy_metrics_and_dashboard_tests():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-m",
            "compat",
            "-p",
            "no:cacheprovider",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    modules = {line.split("::")[0] for line in out.stdout.splitlines() if "::" in line}
    assert {
        "tests/engine/sections/legacy/test_legacy_replicate.py",
        "tests/engine/sections/memory_pressure/test_memory_pressure.py",
        "tests/engine/sections/paused_workers/test_paused_workers.py",
        "tests/engine/sections/retirement/test_adaptive.py",
        "tests/observe/test_metrics.py",
        "tests/observe/test_dashboard.py",
    } <= modules
    assert all(m.startswith(("tests/engine/", "tests/observe/")) for m in modules), modules
    tests = sum(1 for line in out.stdout.splitlines() if "::" in line)
    assert 140 <= tests <= 240, tests
