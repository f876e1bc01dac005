"""Start-up time of ``amm-rules validate`` against importing its parsing dependencies.

``amm-rules validate`` should start in about the time it takes Python to import
pyyaml, jsonschema, lark and click, because it imports nothing else heavy (in
particular not ``distributed``). This script times, over N runs each:

- ``python -c pass`` (the interpreter alone, for reference);
- ``python -c "import yaml, jsonschema, lark, click"`` (the baseline);
- ``amm-rules validate examples/rules/demo.yaml`` (the console script; when it is
  not installed, the same entry point called with ``python -c``);
- ``python -m amm_rules validate examples/rules/demo.yaml``.

It prints a table, the ratio of each command's median to the baseline's median, and
writes ``benchmarks/results/startup.json``. Commands run round-robin after one untimed
warm-up each; bytecode is written (to a temporary directory), as it is for an
installed package.

Usage, from the repository root: ``python -m benchmarks.startup [--runs N]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEMO = "examples/rules/demo.yaml"
RESULTS = ROOT / "benchmarks" / "results" / "startup.json"


def commands() -> dict[str, list[str]]:
    py = sys.executable
    script = shutil.which("amm-rules")
    entry = [script] if script else [py, "-c", "from amm_rules.cli import main; main()"]
    return {
        "python -c pass": [py, "-c", "pass"],
        "import yaml, jsonschema, lark, click": [py, "-c", "import yaml, jsonschema, lark, click"],
        "amm-rules validate demo.yaml": [*entry, "validate", DEMO],
        "python -m amm_rules validate demo.yaml": [py, "-m", "amm_rules", "validate", DEMO],
    }


def time_commands(
    cmds: dict[str, list[str]], runs: int, env: dict[str, str]
) -> dict[str, list[float]]:
    """Wall times of each command, run round-robin so that a change in machine load
    affects every command alike."""
    for argv in cmds.values():
        # One untimed run first, so every timed run finds files in the OS cache and
        # bytecode already compiled.
        subprocess.run(argv, cwd=ROOT, env=env, check=True, capture_output=True)
    times: dict[str, list[float]] = {name: [] for name in cmds}
    for _ in range(runs):
        for name, argv in cmds.items():
            start = time.perf_counter()
            subprocess.run(argv, cwd=ROOT, env=env, check=True, capture_output=True)
            times[name].append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="timed runs per command")
    args = parser.parse_args()

    env = dict(os.environ)
    # An installed package has its bytecode compiled, as the dependencies do. Let the
    # warm-up run compile this checkout's modules too, into a temporary directory so
    # that the source tree stays clean.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="amm-rules-bench-")
    # Run against this checkout even when the package is not installed.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    baseline_name = "import yaml, jsonschema, lark, click"

    cmds = commands()
    results = {}
    for name, times in time_commands(cmds, args.runs, env).items():
        argv = cmds[name]
        results[name] = {
            "argv": [Path(a).name if a == argv[0] else a for a in argv],
            "median_s": statistics.median(times),
            "min_s": min(times),
            "mean_s": statistics.fmean(times),
            "stdev_s": statistics.stdev(times) if len(times) > 1 else 0.0,
        }
    base = results[baseline_name]["median_s"]
    for entry in results.values():
        entry["ratio_to_baseline"] = entry["median_s"] / base

    width = max(len(n) for n in results)
    print(f"{'command':<{width}}  {'median':>8}  {'min':>8}  {'mean':>8}  {'ratio':>6}")
    for name, e in results.items():
        print(
            f"{name:<{width}}  {e['median_s'] * 1000:>6.1f}ms  {e['min_s'] * 1000:>6.1f}ms  "
            f"{e['mean_s'] * 1000:>6.1f}ms  {e['ratio_to_baseline']:>6.2f}"
        )
    print(
        f"\nratio (median, validate / baseline): "
        f"{results['amm-rules validate demo.yaml']['ratio_to_baseline']:.2f} (console script), "
        f"{results['python -m amm_rules validate demo.yaml']['ratio_to_baseline']:.2f} "
        "(python -m)"
    )

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "runs": args.runs,
                "python": platform.python_version(),
                "platform": platform.platform(),
                "console_script_installed": shutil.which("amm-rules") is not None,
                "baseline": baseline_name,
                "results": results,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
