"""The version matrix of CI: the tests marked ``compat`` (the engine on a real scheduler,
legacy calls, metrics, the dashboard) in fresh virtual environments, one per release of
dask/distributed and Python, beside the whole suite that ``.ci/run`` runs on the default
environment.

Each environment is ``NAME=PYTHON[:CONSTRAINTS]``: a Python version (``3.10``), and a pip
constraints file (pins), or none for the newest releases the package index offers. By
default::

    floor=3.10:.ci/constraints-floor.txt     the declared floor, on the oldest Python
    newest=3.13                              the newest releases, on the newest Python

The interpreters are found through pyenv when it is there (the newest patch release of
that version it has), else as ``pythonX.Y`` on PATH; a missing one is installed with
``pyenv install`` when pyenv is there, else the script stops and says what to install.
The environments are installed, then tested, side by side (one per core). Run from the
repository's root::

    python .ci/matrix.py                                   # the default matrix
    python .ci/matrix.py next=3.13:my-pins.txt             # one environment of your own
    python .ci/matrix.py --pre newest=3.13                 # with pre-releases
    python .ci/matrix.py floor=3.10:.ci/constraints-floor.txt -- -x tests/engine

Arguments after ``--`` replace the tests (default ``-m compat -n 2 --dist worksteal``: two
pytest processes in each environment, whose tests mostly wait on a cluster). Exits non-zero
when an environment could not be made or its tests failed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ["floor=3.10:.ci/constraints-floor.txt", "newest=3.13"]
#: Lines of a failed environment's output shown (the rest is in its log).
TAIL = 150
#: pip's notes about this machine's extra package locations, which say nothing here.
NOISE = re.compile(r"^WARNING: Location '.*' is ignored")


@dataclass
class Env:
    name: str
    python: str
    constraints: Path | None
    interpreter: str = ""
    venv: Path | None = None
    log: Path | None = None
    versions: str = ""
    summary: str = ""
    ok: bool = False


def parse(spec: str) -> Env:
    m = re.fullmatch(r"(?P<name>[\w.-]+)=(?P<python>\d+\.\d+)(?::(?P<constraints>.+))?", spec)
    if m is None:
        raise SystemExit(
            f"matrix: {spec!r}: expected NAME=PYTHON[:CONSTRAINTS], e.g. floor=3.10:pins.txt"
        )
    constraints = Path(m["constraints"]).resolve() if m["constraints"] else None
    if constraints is not None and not constraints.is_file():
        raise SystemExit(f"matrix: {spec!r}: no constraints file {constraints}")
    return Env(m["name"], m["python"], constraints)


def _pyenv() -> str | None:
    found = shutil.which("pyenv")
    if found:
        return found
    root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    candidate = root / "bin" / "pyenv"
    return str(candidate) if candidate.is_file() else None


def _is_version(python: str, version: str) -> bool:
    try:
        out = subprocess.run(
            [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except OSError:
        return False
    return out.returncode == 0 and out.stdout.strip() == version


def _from_pyenv(pyenv: str, version: str) -> str | None:
    listed = subprocess.run([pyenv, "versions", "--bare"], capture_output=True, text=True)
    patches = [v for v in listed.stdout.split() if re.fullmatch(rf"{re.escape(version)}\.\d+", v)]
    if not patches:
        return None
    newest = max(patches, key=lambda v: int(v.rsplit(".", 1)[1]))
    root = subprocess.run([pyenv, "root"], capture_output=True, text=True).stdout.strip()
    python = str(Path(root) / "versions" / newest / "bin" / "python")
    return python if _is_version(python, version) else None


def find_python(version: str, install: bool = True) -> str:
    """The interpreter of ``version`` (``3.10``), installed with pyenv if need be (and
    ``install``)."""
    pyenv = _pyenv()
    if pyenv is not None:
        found = _from_pyenv(pyenv, version)
        if found:
            return found
    on_path = shutil.which(f"python{version}")
    if on_path and _is_version(on_path, version):
        return on_path
    if pyenv is not None and install:
        print(f"matrix: no Python {version}; installing it with pyenv", flush=True)
        subprocess.run([pyenv, "install", "--skip-existing", version], timeout=1800)
        found = _from_pyenv(pyenv, version)
        if found:
            return found
    raise SystemExit(
        f"matrix: no Python {version} on this machine, and it could not be installed: "
        f"install it (pyenv install {version}, or your system's python{version} package)"
    )


def _run(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> int:
    with log.open("a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        return subprocess.run(
            cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env
        ).returncode


def install(env: Env, where: Path, pre: bool) -> None:
    env.venv = where / env.name
    env.log = where / f"{env.name}.log"
    if _run([env.interpreter, "-m", "venv", str(env.venv)], env.log) != 0:
        env.summary = "could not make its virtual environment"
        return
    pip = [str(env.venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    pip += ["--pre"] if pre else []
    pip += ["--constraint", str(env.constraints)] if env.constraints else ["--upgrade"]
    if _run([*pip, "--editable", f"{ROOT}[test]"], env.log) != 0:
        env.summary = "could not install the package with its test extra"
        return
    probe = subprocess.run(
        [
            str(env.venv / "bin" / "python"),
            "-c",
            "import platform, dask, distributed; print(f'Python {platform.python_version()}, "
            "dask {dask.__version__}, distributed {distributed.__version__}')",
        ],
        capture_output=True,
        text=True,
    )
    env.versions = probe.stdout.strip() or probe.stderr.strip()


def test(env: Env, args: list[str]) -> None:
    if env.summary:  # not installed
        return
    assert env.venv is not None and env.log is not None
    started = time.monotonic()
    run_env = {**os.environ, "CI": os.environ.get("CI", "true")}
    run_env.pop("VIRTUAL_ENV", None)
    code = _run(
        [str(env.venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        env.log,
        run_env,
    )
    lines = env.log.read_text().splitlines()
    closing = [line for line in lines if re.search(r"\d+ (passed|failed|error)", line)]
    env.summary = (closing[-1].strip("= ") if closing else f"pytest exited {code}") + (
        f" ({time.monotonic() - started:.0f} s)"
    )
    env.ok = code == 0


def report(env: Env) -> None:
    print(
        f"matrix {env.name}: {env.versions or 'Python ' + env.python}: {env.summary}", flush=True
    )
    if not env.ok and env.log is not None and env.log.exists():
        lines = [line for line in env.log.read_text().splitlines() if not NOISE.match(line)]
        print(f"--- the last {TAIL} lines of {env.name}'s output ---")
        print("\n".join(lines[-TAIL:]), flush=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("envs", nargs="*", metavar="NAME=PYTHON[:CONSTRAINTS]")
    parser.add_argument("--pre", action="store_true", help="allow pre-releases")
    parser.add_argument("--keep", metavar="DIR", help="make the environments here and keep them")
    parser.add_argument(
        "--show",
        action="store_true",
        help="print each environment (name, Python, interpreter, constraints) and stop",
    )
    parser.add_argument("--no-install", action="store_true", help="never install a missing Python")
    if "--" in argv:
        split = argv.index("--")
        argv, tests = argv[:split], argv[split + 1 :]
    else:
        tests = ["-m", "compat", "-n", "2", "--dist", "worksteal"]
    options = parser.parse_args(argv)
    envs = [parse(spec) for spec in options.envs or DEFAULT]
    for env in envs:
        env.interpreter = find_python(env.python, install=not options.no_install)
    if options.show:
        for env in envs:
            print(env.name, env.python, env.interpreter, env.constraints or "-")
        return 0
    where = Path(options.keep or tempfile.mkdtemp(prefix="amm-rules-matrix-"))
    where.mkdir(parents=True, exist_ok=True)
    try:
        started = time.monotonic()
        with ThreadPoolExecutor(len(envs)) as pool:
            list(pool.map(lambda e: install(e, where, options.pre), envs))
        installed = time.monotonic()
        with ThreadPoolExecutor(len(envs)) as pool:
            list(pool.map(lambda e: test(e, tests), envs))
        for env in envs:
            report(env)
        print(
            f"matrix: installed in {installed - started:.0f} s, tested in "
            f"{time.monotonic() - installed:.0f} s",
            flush=True,
        )
    finally:
        if not options.keep:
            shutil.rmtree(where, ignore_errors=True)
    return 0 if all(env.ok for env in envs) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
