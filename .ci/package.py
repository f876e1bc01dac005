"""The package as an index would serve it, checked by CI (``.ci/run``):

1. the sdist is built from the checkout, unpacked in a temporary directory, and the
   wheel is built from the unpacked sdist (as ``pip`` and ``build`` do);
2. a quick subset of the tests runs from the unpacked sdist (the tests that read the
   repository's files: examples, schemas, the pre-commit hook, docs), with this
   interpreter, importing the package from there;
3. the wheel is installed in a fresh virtual environment with its dependencies from the
   package index, and ``amm-rules validate`` and ``amm-rules demo`` run from it, outside
   any source tree.

Run from the repository's root with the environment that has the test extra::

    python .ci/package.py
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The tests run from the sdist: those that read files of the repository.
QUICK = [
    "tests/language",
    "tests/test_examples.py",
    "tests/test_pre_commit_hook.py",
    "tests/test_docs_truths.py",
    "tests/test_layout.py",
    "tests/test_suite_rules.py",
    "tests/offline/test_rule_tests.py",
    "tests/cli/test_validate_cli.py",
    "tests/typing",
]
NOISE = re.compile(r"^WARNING: Location '.*' is ignored")


def run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    """Run ``cmd``; its output, or exit with it shown when it fails."""
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    out = "\n".join(
        line for line in (done.stdout + done.stderr).splitlines() if not NOISE.match(line)
    )
    if done.returncode != 0:
        print(f"package: failed ({done.returncode}): {' '.join(cmd)}\n{out}", flush=True)
        sys.exit(1)
    return out


def build(work: Path) -> tuple[Path, Path, Path]:
    """The sdist, the directory it unpacks to, and the wheel built from that."""
    dist = work / "dist"
    run([sys.executable, "-m", "hatchling", "build", "-t", "sdist", "-d", str(dist)], ROOT)
    (sdist,) = dist.glob("amm_rules-*.tar.gz")
    with tarfile.open(sdist) as tf:
        tf.extractall(work, filter="data")
    (unpacked,) = (p for p in work.iterdir() if p.is_dir() and p.name.startswith("amm_rules-"))
    run([sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(dist)], unpacked)
    (wheel,) = dist.glob("amm_rules-*.whl")
    return sdist, unpacked, wheel


def test_sdist(unpacked: Path) -> str:
    env = {**os.environ, "CI": os.environ.get("CI", "true")}
    where = run([sys.executable, "-c", "import amm_rules; print(amm_rules.__file__)"], unpacked)
    if not Path(where.strip()).is_relative_to(unpacked):
        print(f"package: the tests would import {where.strip()}, not the sdist's package")
        sys.exit(1)
    out = run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *QUICK], unpacked, env
    )
    return out.splitlines()[-1]


def test_wheel(wheel: Path, work: Path) -> list[str]:
    venv = work / "wheel-env"
    run([sys.executable, "-m", "venv", str(venv)], work)
    bin_ = venv / "bin"
    run([str(bin_ / "python"), "-m", "pip", "install", "--quiet", str(wheel)], work)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("DASK_")}
    env.pop("VIRTUAL_ENV", None)
    outside = work / "elsewhere"
    outside.mkdir()
    examples = sorted(str(p) for p in (ROOT / "examples" / "rules").glob("*.yaml"))
    said = [run([str(bin_ / "amm-rules"), "--version"], outside, env).strip()]
    said.append(
        run([str(bin_ / "amm-rules"), "validate", *examples], outside, env).splitlines()[-1]
    )
    demo = run([str(bin_ / "amm-rules"), "demo"], outside, env)
    # The verdict, then the suggestion of the recommended rules file.
    if "Every target is met." not in demo.splitlines():
        print(f"package: the wheel's demo did not say every target was met:\n{demo}")
        sys.exit(1)
    said.append("demo: Every target is met.")
    return said


def main() -> int:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="amm-rules-package-") as tmp:
        work = Path(tmp)
        sdist, unpacked, wheel = build(work)
        print(f"package: built {sdist.name} and, from it, {wheel.name}", flush=True)
        print(f"package: tests from the unpacked sdist: {test_sdist(unpacked)}", flush=True)
        for line in test_wheel(wheel, work):
            print(f"package: from the wheel in a fresh environment: {line}", flush=True)
    print(f"package: done in {time.monotonic() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
