"""Start-up of ``amm-rules validate`` against importing its parsing dependencies.

``amm-rules validate FILE`` should start in about the time it takes Python to import
pyyaml, jsonschema, lark and click (the *baseline*), because it imports nothing else
heavy (in particular not ``distributed``). The goal is under 1.3 times the baseline.

Each measurement is a series of **alternating pairs**: the baseline and the validate
command run one after the other, the order swapped from one pair to the next (so that a
change in the machine's load hits both alike), after one untimed warm-up of each.
Reported per command: the medians of both, the ratio of the medians, and the median and
range of the per-pair ratios.

Set-ups (``--setups``), each a fresh virtual environment (``--system-site-packages``, so
that the dependencies are the running interpreter's and nothing is downloaded):

- ``wheel``: the package built as a wheel and installed (bytecode compiled by pip);
- ``editable``: ``pip install -e .`` of this checkout (bytecode written on first import
  into a temporary ``PYTHONPYCACHEPREFIX``, so that the checkout stays clean);
- ``checkout``: no installation, this checkout on ``PYTHONPATH`` and the entry point
  called with ``python -c`` (how this benchmark measured before it made environments).

and in each, two commands: the console script (``amm-rules validate FILE``) and
``python -m amm_rules validate FILE``. ``--variants`` adds the rows that explain why two
earlier measurements differed (another file; bytecode not written, as with
``PYTHONDONTWRITEBYTECODE=1`` in an editable install).

Prints a table and writes ``benchmarks/results/startup.json``.

Usage, from the repository root: ``python -m benchmarks.startup [--pairs N] [--file F]
[--setups wheel,editable] [--variants]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "startup.json"
BASELINE = "import yaml, jsonschema, lark, click"
DEFAULT_FILE = "examples/rules/gpu-pools.yaml"


@dataclass
class Setup:
    """An environment to run commands in: its interpreter, console script, environment
    variables and working directory. The directory is outside the checkout, as a user's
    project is: ``python -c`` and ``python -m`` put the working directory first on
    ``sys.path``, so that run from the repository root they import the checkout's
    ``amm_rules`` instead of the installed one."""

    name: str
    python: str
    script: list[str]
    env: dict[str, str]
    cwd: Path


@dataclass
class Row:
    """One series of pairs: wall-clock and CPU seconds (user + system) of each run."""

    setup: str
    command: str
    file: str
    baseline_s: list[float] = field(default_factory=list)
    command_s: list[float] = field(default_factory=list)
    baseline_cpu_s: list[float] = field(default_factory=list)
    command_cpu_s: list[float] = field(default_factory=list)

    @staticmethod
    def _ratios(base: list[float], cmd: list[float]) -> list[float]:
        return [c / b for b, c in zip(base, cmd, strict=True)]

    @property
    def ratios(self) -> list[float]:
        return self._ratios(self.baseline_s, self.command_s)

    def summary(self) -> dict[str, object]:
        out: dict[str, object] = {"setup": self.setup, "command": self.command}
        out.update(file=self.file, pairs=len(self.ratios))
        for label, base, cmd in (
            ("", self.baseline_s, self.command_s),
            ("cpu_", self.baseline_cpu_s, self.command_cpu_s),
        ):
            ratios = self._ratios(base, cmd)
            out.update(
                {
                    f"baseline_{label}median_s": statistics.median(base),
                    f"command_{label}median_s": statistics.median(cmd),
                    f"{label}ratio_of_medians": statistics.median(cmd) / statistics.median(base),
                    f"{label}median_pair_ratio": statistics.median(ratios),
                    f"{label}pair_ratio_min": min(ratios),
                    f"{label}pair_ratio_max": max(ratios),
                }
            )
        return out


# -- environments -----------------------------------------------------------------------


def _run(argv: list[str], **kwargs: object) -> None:
    subprocess.run(argv, check=True, capture_output=True, **kwargs)  # type: ignore[call-overload]


def _clean_env() -> dict[str, str]:
    env = dict(os.environ)
    for name in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX", "VIRTUAL_ENV"):
        env.pop(name, None)
    return env


def _venv(where: Path) -> tuple[str, Path]:
    _run([sys.executable, "-m", "venv", "--system-site-packages", str(where)])
    bindir = where / ("Scripts" if os.name == "nt" else "bin")
    return str(bindir / "python"), bindir


def make_setup(name: str, tmp: Path) -> Setup:
    env = _clean_env()
    cwd = tmp / "project"
    cwd.mkdir(exist_ok=True)
    if name == "checkout":
        env["PYTHONPATH"] = str(ROOT)
        env["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache-checkout")
        entry = [sys.executable, "-c", "from amm_rules.cli import main; main()"]
        return Setup(name, sys.executable, entry, env, cwd)
    python, bindir = _venv(tmp / name)
    pip = [python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--quiet"]
    if name == "wheel":
        wheels = tmp / "wheels"
        _run([python, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
              "-w", str(wheels), str(ROOT)])  # fmt: skip
        _run([*pip, str(next(wheels.glob("amm_rules-*.whl")))])
    elif name == "editable":
        # hatchling's editable wheels need the `editables` package in the build
        # environment (pip's isolated builds fetch it themselves).
        if subprocess.run([python, "-c", "import editables"], capture_output=True).returncode:
            _run([python, "-m", "pip", "install", "--quiet", "editables"])
        _run([*pip, "-e", str(ROOT)])
        # Bytecode is written on first import, as in an editable install; into a
        # temporary directory, so that the checkout stays clean.
        env["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache-editable")
    else:
        raise SystemExit(f"unknown set-up {name!r}; expected wheel, editable or checkout")
    return Setup(name, python, [str(bindir / "amm-rules")], env, cwd)


def check_setup(setup: Setup) -> str:
    """Where the set-up's interpreter imports amm_rules from (a sanity check): ``this
    checkout`` or ``site-packages`` (the results name no path of the machine)."""
    out = subprocess.run(
        [setup.python, "-c", "import amm_rules; print(amm_rules.__file__)"],
        env=setup.env,
        cwd=setup.cwd,
        check=True,
        capture_output=True,
        text=True,
    )
    return where_label(Path(out.stdout.strip()))


def where_label(path: Path) -> str:
    if path.is_relative_to(ROOT):
        return "this checkout"
    return "site-packages" if "site-packages" in path.parts else "elsewhere"


# -- measuring ----------------------------------------------------------------------------


def _timed(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """Wall-clock and CPU seconds of one run. On a shared machine the wall clock also
    counts the time spent waiting for a core; the CPU time (user + system, of the child)
    much less so."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1):  # 1: the file has problems, still a full run
        raise RuntimeError(f"{argv} failed: {done.stderr.decode()[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed, cpu


def pairs(setup: Setup, name: str, argv: list[str], file: str, n: int) -> Row:
    """``n`` alternating pairs of (baseline, command), after one warm-up of each."""
    baseline = [setup.python, "-c", BASELINE]
    row = Row(setup.name, name, file)

    def run(argv: list[str]) -> tuple[float, float]:
        return _timed(argv, setup.env, setup.cwd)

    run(baseline)
    run(argv)
    for i in range(n):
        if i % 2 == 0:
            b, c = run(baseline), run(argv)
        else:
            c, b = run(argv), run(baseline)
        row.baseline_s.append(b[0])
        row.command_s.append(c[0])
        row.baseline_cpu_s.append(b[1])
        row.command_cpu_s.append(c[1])
    return row


def measure(setup: Setup, file: str, n: int) -> list[Row]:
    path = str(ROOT / file)
    return [
        pairs(setup, "amm-rules validate", [*setup.script, "validate", path], file, n),
        pairs(
            setup,
            "python -m amm_rules validate",
            [setup.python, "-m", "amm_rules", "validate", path],
            file,
            n,
        ),
    ]


def variants(setups: dict[str, Setup], file: str, n: int) -> list[Row]:
    """Rows that explain earlier, differing measurements: another file; ``python -m`` run
    from the repository root with ``PYTHONDONTWRITEBYTECODE=1`` (it imports the checkout
    instead of the installed package, compiling it on every run); an editable install
    without bytecode."""
    rows = []
    other = "examples/rules/demo.yaml" if file != "examples/rules/demo.yaml" else DEFAULT_FILE
    for setup in setups.values():
        argv = [*setup.script, "validate", str(ROOT / other)]
        rows.append(pairs(setup, "amm-rules validate", argv, other, n))
    no_bytecode = {**_clean_env(), "PYTHONDONTWRITEBYTECODE": "1"}
    if "wheel" in setups:
        wheel = setups["wheel"]
        at_root = Setup("wheel, run in checkout", wheel.python, wheel.script, no_bytecode, ROOT)
        argv = [wheel.python, "-m", "amm_rules", "validate", file]
        rows.append(pairs(at_root, "python -m amm_rules validate", argv, file, n))
    if "editable" in setups:
        editable = setups["editable"]
        nobc = Setup("editable, no bytecode", editable.python, editable.script, no_bytecode,
                     editable.cwd)  # fmt: skip
        argv = [*editable.script, "validate", str(ROOT / file)]
        rows.append(pairs(nobc, "amm-rules validate", argv, file, n))
    return rows


# -- report -------------------------------------------------------------------------------


def report(rows: list[Row]) -> list[dict[str, object]]:
    """Print the table: per row, wall clock then CPU time (medians in ms, the ratio of
    the medians, the median pair ratio and the range of the pair ratios)."""
    out = [r.summary() for r in rows]
    head = (
        f"{'set-up':<22} {'command':<29} {'file':<15} "
        f"{'wall: base':>10} {'cmd':>6} {'ratio':>5} {'pairs':>16}  "
        f"{'cpu: base':>9} {'cmd':>6} {'ratio':>5} {'pairs':>16}"
    )
    print(head)
    print("-" * len(head))
    for s in out:
        cells = [f"{s['setup']:<22} {s['command']:<29} {Path(str(s['file'])).name:<15}"]
        for label, width in (("", 10), ("cpu_", 9)):
            base = float(s[f"baseline_{label}median_s"]) * 1000  # type: ignore[arg-type]
            cmd = float(s[f"command_{label}median_s"]) * 1000  # type: ignore[arg-type]
            ratio = float(s[f"{label}ratio_of_medians"])  # type: ignore[arg-type]
            pair = float(s[f"{label}median_pair_ratio"])  # type: ignore[arg-type]
            lo = float(s[f"{label}pair_ratio_min"])  # type: ignore[arg-type]
            hi = float(s[f"{label}pair_ratio_max"])  # type: ignore[arg-type]
            cells.append(
                f"{base:>{width - 2}.0f}ms {cmd:>4.0f}ms {ratio:>5.2f} "
                f"{pair:>5.2f} ({lo:.2f}-{hi:.2f})"
            )
        print("  ".join(cells))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=15, help="alternating pairs per row")
    parser.add_argument("--file", default=DEFAULT_FILE, help="rules file to validate")
    parser.add_argument("--setups", default="wheel,editable", help="comma-separated")
    parser.add_argument("--variants", action="store_true", help="add the explaining rows")
    parser.add_argument("--json", type=Path, default=RESULTS)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="amm-rules-startup-") as tmp_dir:
        tmp = Path(tmp_dir)
        setups = {name: make_setup(name, tmp) for name in args.setups.split(",")}
        where = {name: check_setup(s) for name, s in setups.items()}
        for name, path in where.items():
            print(f"{name}: amm_rules from {path}")
        rows = [row for s in setups.values() for row in measure(s, args.file, args.pairs)]
        if args.variants:
            rows += variants(setups, args.file, args.pairs)
        summaries = report(rows)
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {
                "pairs": args.pairs,
                "file": args.file,
                "baseline": BASELINE,
                "python": platform.python_version(),
                "platform": platform.platform(),
                "cpus": os.cpu_count(),
                "load_average_after": load,
                "imported_from": where,
                "rows": summaries,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {args.json.relative_to(ROOT) if args.json.is_relative_to(ROOT) else args.json}")


if __name__ == "__main__":
    main()
