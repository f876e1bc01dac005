"""``.ci/matrix.py``, the version matrix of CI: its environments as written on its command
line, the interpreters it finds (through pyenv or on PATH, never a path written in the
repository), and the tests it selects (the ``compat`` marker)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("ci_matrix", ROOT / ".ci" / "matrix.py")
assert spec is not None and spec.loader is not None
matrix = importlib.util.module_from_spec(spec)
sys.modules["ci_matrix"] = matrix  # dataclasses look their module up
spec.loader.exec_module(matrix)


def test_the_default_matrix_is_the_floor_on_the_oldest_python_and_the_newest_on_the_newest():
    floor, newest = (matrix.parse(s) for s in matrix.DEFAULT)
    assert (floor.name, floor.python) == ("floor", "3.10")
    assert floor.constraints == ROOT / ".ci" / "constraints-floor.txt"
    assert (newest.name, newest.python, newest.constraints) == ("newest", "3.13", None)


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("floor", "expected NAME=PYTHON[:CONSTRAINTS]"),
        ("floor=3", "expected NAME=PYTHON[:CONSTRAINTS]"),
        ("floor=3.10:no-such-pins.txt", "no constraints file"),
    ],
)
def test_a_wrong_environment_is_refused_with_words(spec, says):
    with pytest.raises(SystemExit, match=r"^matrix: ") as raised:
        matrix.parse(spec)
    assert says in str(raised.value)


def test_the_interpreter_of_a_version_is_found():
    version = "{}.{}".format(*sys.version_info[:2])
    python = matrix.find_python(version)
    out = subprocess.run(
        [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert out.stdout.strip() == version


def test_a_missing_interpreter_is_named(monkeypatch):
    monkeypatch.setattr(matrix, "_pyenv", lambda: None)
    with pytest.raises(SystemExit, match=r"^matrix: no Python 2\.1 on this machine"):
        matrix.find_python("2.1")


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
        "tests/engine/test_legacy_replicate.py",
        "tests/engine/test_memory_pressure.py",
        "tests/engine/test_paused_workers.py",
        "tests/engine/test_retire_adaptive.py",
        "tests/observe/test_metrics.py",
        "tests/observe/test_dashboard.py",
    } <= modules
    assert all(m.startswith(("tests/engine/", "tests/observe/")) for m in modules), modules
    tests = sum(1 for line in out.stdout.splitlines() if "::" in line)
    assert 140 <= tests <= 200, tests
