"""A long fuzz run of the rules-file checker: hostile files in, diagnostics out.

The files come from the seeded generator the tests use (:mod:`benchmarks.support.fuzzer`):
rules files built from the format's vocabulary, mutated seed files (every case file and
example), and splices of both. Each file is checked with ``amm_rules.language.loader.check_text``;
a file without errors is compiled, and its matches and pools run on a few facts.

A *failure* is an exception, an ``internal`` diagnostic, a disagreement between "has an
error" and "has a ruleset", or a file that takes longer than ``--hang`` seconds (the
hang detector; a file takes milliseconds). Failures are written out with their seed and
index so that each one is reproduced by ``cases(seed, n)``. From the repository root:

    python -m benchmarks.fuzz_rules                  # 200,000 cases, seed 1
    python -m benchmarks.fuzz_rules --cases 20000 --seed 7

Prints a table and writes ``benchmarks/results/fuzz_rules.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.support.fuzzer import cases, check_and_run, seed_files

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "fuzz_rules.json"


def check_one(data: bytes) -> tuple[bool, list[str], str | None]:
    """(valid, diagnostic codes, failure or None)."""
    try:
        ruleset, diagnostics = check_and_run(data)
    except Exception as exc:
        return False, [], f"{type(exc).__name__}: {exc}"
    codes = [d.code for d in diagnostics]
    if "internal" in codes:
        return False, codes, next(d.message for d in diagnostics if d.code == "internal")
    if (ruleset is None) != any(d.is_error for d in diagnostics):
        return False, codes, "ruleset and errors disagree"
    return ruleset is not None, codes, None


def run(n: int, seed: int, hang: float) -> dict[str, Any]:
    seeds = seed_files()
    kinds: Counter[str] = Counter()
    codes: Counter[str] = Counter()
    valid = 0
    failures: list[dict[str, Any]] = []
    times: list[float] = []
    start = time.perf_counter()
    for i, (kind, data) in enumerate(cases(seed, n, seeds)):
        t0 = time.perf_counter()
        ok, found, failure = check_one(data)
        elapsed = time.perf_counter() - t0
        times.append(elapsed)
        kinds[kind] += 1
        codes.update(set(found))
        valid += ok
        if failure is None and elapsed > hang:
            failure = f"took {elapsed:.2f} s"
        if failure is not None:
            failures.append(
                {"index": i, "kind": kind, "failure": failure, "data": repr(data[:500])}
            )
    total = time.perf_counter() - start
    times.sort()
    return {
        "cases": n,
        "seed": seed,
        "seed_files": len(seeds),
        "kinds": dict(kinds),
        "valid": valid,
        "failures": failures,
        "distinct_codes": len(codes),
        "codes": dict(codes.most_common()),
        "seconds": round(total, 1),
        "per_file_ms": {
            "median": round(1000 * times[len(times) // 2], 3),
            "p99": round(1000 * times[int(len(times) * 0.99)], 3),
            "max": round(1000 * times[-1], 3),
        },
        "python": platform.python_version(),
        "machine": platform.machine(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--hang", type=float, default=2.0, help="seconds per file")
    args = parser.parse_args()
    result = run(args.cases, args.seed, args.hang)
    rows = [
        ("cases", f"{result['cases']:,}"),
        ("seed", result["seed"]),
        ("generated / mutated / spliced", " / ".join(f"{v:,}" for v in result["kinds"].values())),
        ("valid rules files", f"{result['valid']:,}"),
        ("distinct diagnostic codes", result["distinct_codes"]),
        ("failures", len(result["failures"])),
        ("time", f"{result['seconds']} s"),
        (
            "per file median / p99 / max",
            " / ".join(f"{v} ms" for v in result["per_file_ms"].values()),
        ),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    for failure in result["failures"][:10]:
        print(f"FAILURE case {failure['index']} ({failure['kind']}): {failure['failure']}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
