"""Time to govern, alone: the ``all keys enter memory`` rows of :mod:`benchmarks.scale`,
repeated, with the distribution of cycle times and the transition hook's cost.

On the scale benchmark's state (one size, built once), for ``--rounds`` rounds, in turn
for the per-key rules file (``benchmarks/rules/scale.yaml``) and the group-level one
(``benchmarks/rules/scale-groups.yaml``): every key in memory is handed to the policy's
transition hook as it enters memory, then cycles run at the default budget until every
key is classified and filed (:func:`benchmarks.scale.measure_governed`). Reports, per
run: the cycles, the processor and elapsed time per key, the slowest cycle and the 95th
percentile of the cycles' elapsed and processor times (the budget, ``classify_seconds``,
is 0.1 s of a cycle's elapsed time); and the processor time the transition hook took per key to queue them.
Before the rounds, the median of 9 steady cycles (nothing to do) on the same state.

Usage, from the repository root:
``python -m benchmarks.govern [--size KEYSxWORKERS] [--rounds N] [--files groups,per-key]``

Prints one line per run and the medians, and writes ``benchmarks/results/govern.json``
(``--json`` elsewhere).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks import scale
from benchmarks.support import scheduler_state

RESULTS = scale.ROOT / "benchmarks" / "results" / "govern.json"


def p95(samples: list[float]) -> float:
    """The 95th percentile as the scale benchmark's tables give it (nearest rank)."""
    return scale.summary(samples)["p95_s"]


def hook_cost(state: scheduler_state.BenchState, policy: Any) -> float:
    """Processor seconds per key of the transition hook queueing every key in memory
    (``processing -> memory``) on a fresh index of the policy's type, reading the
    state's tasks: what :func:`benchmarks.scale.measure_governed` feeds, timed alone
    (:func:`benchmarks.scale.hook_cost` replays every recorded transition instead)."""
    tasks = state.scheduler.tasks
    keys = [k for k, ts in tasks.items() if ts.state == "memory"]
    index = type(policy.index)()
    index.attach(tasks)
    index.follow_costs(type(policy.ctx.costs)())  # fed as the engine feeds it
    hook = index.transition
    gc.collect()
    start = time.thread_time()
    for key in keys:
        hook(key, "processing", "memory")
    return (time.thread_time() - start) / len(keys)


def run(n_keys: int, n_workers: int, rounds: int, files: list[str]) -> list[dict[str, Any]]:
    return asyncio.run(_run(n_keys, n_workers, rounds, files))


async def _run(n_keys: int, n_workers: int, rounds: int, files: list[str]) -> list[dict[str, Any]]:
    scale.log(f"{n_keys:,} keys, {n_workers:,} workers: building the state")
    state = await scheduler_state.build_state(n_keys, n_workers, scale.load_ruleset(scale.RULES))
    gc.collect()
    gc.freeze()  # as the scale benchmark: the state's heap stays out of the cycles' times
    runs = []
    policy = None
    try:
        policy, manager, _ = scale.measure_attach(state)
        steady = scale.timed_cycles(state, manager, 9)
        scale.log(f"  steady cycle: median {steady['median_s'] * 1e3:.2f} ms")
        runs.append({"file": "steady", "median_s": steady["median_s"], "p95_s": steady["p95_s"]})
        for r in range(rounds):
            for name in files:
                if name == "per-key":
                    m = scale.measure_governed(state, manager, policy)
                else:
                    m = scale.measure_governed_groups(state, policy)
                row = {
                    "round": r,
                    "file": name,
                    "cycles": m["cycles"],
                    "cpu_us_per_key": m["cpu_us_per_key"],
                    "elapsed_us_per_key": m["us_per_key"],
                    "max_cycle_s": m["max_cycle_s"],
                    "p95_cycle_s": p95(m["samples_s"]),
                    "cycles_s": m["samples_s"],
                    "max_cycle_cpu_s": max(m["samples_cpu_s"]),
                    "p95_cycle_cpu_s": p95(m["samples_cpu_s"]),
                    "cycles_cpu_s": m["samples_cpu_s"],
                    "governed_keys": m["governed_keys"],
                    "hook_cpu_us_per_key": hook_cost(state, policy) * 1e6,
                }
                runs.append(row)
                scale.log(
                    f"  {name:>8}: {row['cycles']} cycles, {row['cpu_us_per_key']:.3f} us/key "
                    f"processor, {row['elapsed_us_per_key']:.3f} elapsed; cycles max "
                    f"{row['max_cycle_s'] * 1e3:.0f} ms, p95 {row['p95_cycle_s'] * 1e3:.0f} ms; "
                    f"hook {row['hook_cpu_us_per_key']:.3f} us/key"
                )
    finally:
        if policy is not None:
            # The scheduler was never started: closing it tears down no extension, so
            # the policy leaves its hooks (and the process's metrics) itself.
            policy.detach()
        await state.scheduler.close()
        gc.unfreeze()
    return runs


def medians(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    out = {}
    for name in dict.fromkeys(r["file"] for r in runs if r["file"] != "steady"):
        mine = [r for r in runs if r["file"] == name]
        out[name] = {
            field: statistics.median(r[field] for r in mine)
            for field in (
                "cycles",
                "cpu_us_per_key",
                "elapsed_us_per_key",
                "max_cycle_s",
                "p95_cycle_s",
                "max_cycle_cpu_s",
                "p95_cycle_cpu_s",
                "hook_cpu_us_per_key",
            )
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="1000000x1000", metavar="KEYSxWORKERS")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--files", default="groups,per-key", help="groups, per-key or both")
    parser.add_argument("--json", type=Path, default=RESULTS)
    args = parser.parse_args()
    n_keys, n_workers = (int(n) for n in args.size.lower().split("x"))
    files = [f.strip() for f in args.files.split(",") if f.strip()]
    unknown = set(files) - {"groups", "per-key"}
    if unknown:
        parser.error(f"--files: unknown file {sorted(unknown)[0]!r} (groups, per-key)")
    runs = run(n_keys, n_workers, args.rounds, files)
    report = {
        "keys": n_keys,
        "workers": n_workers,
        "engine": scale.engine_digest(),
        "python": platform.python_version(),
        "runs": runs,
        "medians": medians(runs),
    }
    for name, m in report["medians"].items():
        print(
            f"{name:>8}: {m['cycles']:.0f} cycles, {m['cpu_us_per_key']:.3f} us/key processor, "
            f"{m['elapsed_us_per_key']:.3f} elapsed, slowest cycle {m['max_cycle_s'] * 1e3:.0f} ms, "
            f"p95 {m['p95_cycle_s'] * 1e3:.0f} ms, hook {m['hook_cpu_us_per_key']:.3f} us/key"
        )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
