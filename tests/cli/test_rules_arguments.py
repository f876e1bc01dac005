"""Every command reads the rules files named on its command line the same way:
``-`` is standard input, and a named pipe or a shell's process substitution
(``<(git show HEAD~1:rules.yaml)``, the CI recipe of docs/testing-rules.md) is read to
its end like a regular file. The scheduler alone keeps refusing what is not a regular
file (tests/cli/test_validate_inputs.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from amm_rules.cli import main

ROOT = Path(__file__).resolve().parent.parent.parent
RULES = ROOT / "examples" / "rules" / "demo.yaml"
DUMP = ROOT / "examples" / "dumps" / "demo-cluster.msgpack.gz"
BAD = 'version: 1\nrules:\n  - name: bad\n    match: task.prefx == "a"\n    replicate: 2\n'


def run(*args: str, input: bytes | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), input=input, catch_exceptions=False)
    return result.exit_code, result.output


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash for process substitution")
@pytest.mark.parametrize("command", ["diff", "simulate", "validate"])
def test_process_substitution_as_in_the_ci_recipe(command: str) -> None:
    """The docs' CI step, in a real shell: the old rules come from a process
    substitution (``/dev/fd/63``), which is a pipe."""
    args = {
        "diff": f'<(cat "{RULES}") "{RULES}" --dump "{DUMP}"',
        "simulate": f'<(cat "{RULES}") --dump "{DUMP}"',
        "validate": f'<(cat "{RULES}")',
    }[command]
    proc = subprocess.run(
        ["bash", "-c", f'"{sys.executable}" -m amm_rules {command} {args}'],
        capture_output=True,
        timeout=120,
        cwd=ROOT,
    )
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    assert "not a regular file" not in err
    out = proc.stdout.decode()
    if command == "diff":
        assert "0 of 7 keys in memory change what they want" in out
    elif command == "simulate":
        assert "7 keys in memory" in out and "governed by the rules" in out


def test_dash_is_standard_input_for_diff_and_simulate() -> None:
    text = RULES.read_bytes()
    status, output = run("diff", "-", str(RULES), "--dump", str(DUMP), input=text)
    assert status == 0, output
    assert "0 of 7 keys in memory change what they want" in output
    status, output = run("simulate", "-", "--dump", str(DUMP), input=text)
    assert status == 0, output
    assert "governed by the rules" in output
    # Errors are named as validate names them.
    status, output = run("simulate", "-", "--dump", str(DUMP), input=BAD.encode())
    assert status == 1
    assert "<stdin>:4:17: error: match: task has no attribute 'prefx'" in output


def test_standard_input_is_read_once() -> None:
    status, output = run("diff", "-", "-", "--dump", str(DUMP), input=RULES.read_bytes())
    assert status == 2
    assert "OLD and NEW cannot both be '-': standard input is read once" in output


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes on this system")
def test_named_pipe_for_simulate(tmp_path: Path) -> None:
    fifo = tmp_path / "rules.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(RULES.read_bytes()))
    writer.start()
    try:
        status, output = run("simulate", str(fifo), "--dump", str(DUMP))
    finally:
        writer.join(timeout=60)
    assert status == 0, output
    assert "governed by the rules" in output
