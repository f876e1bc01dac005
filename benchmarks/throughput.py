"""End-to-end scheduler throughput with RulesPolicy against the stock ReduceReplicas.

Each run starts a fresh scheduler with 4 in-process workers (one thread each, in this
process and on this event loop, as ``LocalCluster(processes=False)`` runs them), maps
``inc`` over ``--tasks`` integers, sums the results in one task and waits for the sum.
The time from the ``map`` to the sum's result is the run's time. The scheduler's AMM
runs at its default interval with either

- ``rules``: ``RulesPolicy`` with ``benchmarks/rules/throughput.yaml`` (20 rules, the
  first governing every key at one copy), or
- ``stock``: distributed's own ``ReduceReplicas``.

Runs alternate in ABBA order (the load of a shared machine drifts); the result is the
median time of each mode and the median of the per-pair ratios, in elapsed time and in
the process's processor time (scheduler and workers share the process, so on a machine
shared with other work the processor time is the steadier measure of the work done).
Every run also counts the AMM's cycles and the seconds spent in them.

``--profile`` adds one run per mode under cProfile and reports where amm-rules' time
goes: its transition hook, its wrappers of the scheduler's replica methods, the AMM
cycles (and, within them, classification, planning and reduce-replicas), against the
stock policy's cycles.

From the repository root::

    python -m benchmarks.throughput                 # 20,000 tasks, 3 runs per mode
    python -m benchmarks.throughput --tasks 5000 --repeats 2 --profile

Prints a table and writes ``benchmarks/results/throughput.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import logging
import os
import platform
import pstats
import statistics
import time
from pathlib import Path
from typing import Any

import dask
import distributed
from distributed import Client, Scheduler, Worker

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "benchmarks" / "rules" / "throughput.yaml"
RESULTS = ROOT / "benchmarks" / "results" / "throughput.json"
AMM = "distributed.scheduler.active-memory-manager"
MODES = ("rules", "stock")

#: What the profile reports: (label, file suffix, function, file suffix and function of
#: the scheduler method it wraps, whose time is subtracted, or None).
PROFILED: tuple[tuple[str, str, str, tuple[str, str] | None], ...] = (
    ("transition hook", "engine/state/index.py", "transition", None),
    ("add_replica wrapper", "engine/state/index.py", "add_replica_watched",
     ("distributed/scheduler.py", "add_replica")),
    ("remove_replica wrapper", "engine/state/index.py", "remove_replica_watched",
     ("distributed/scheduler.py", "remove_replica")),
    ("update_data wrapper", "engine/state/index.py", "update_data_watched",
     ("distributed/scheduler.py", "update_data")),
    ("AMM cycles (run_once)", "distributed/active_memory_manager.py", "run_once", None),
    ("  RulesPolicy.run", "engine/policy.py", "run", None),
    ("    classification", "engine/sections/classification.py", "_classify_dirty", None),
    ("    suspects", "engine/sections/replication.py", "_suspects", None),
    ("    planning and suggesting", "engine/sections/replication.py", "_plan_and_suggest", None),
    ("    reduce-replicas", "engine/sections/reduce_replicas.py", "reduce_replicas", None),
    ("  stock ReduceReplicas.run", "distributed/active_memory_manager.py", "run", None),
)  # fmt: skip


def inc(x: int) -> int:
    return x + 1


def config(mode: str) -> dict[str, Any]:
    policies: list[dict[str, Any]]
    if mode == "rules":
        policies = [{"class": "amm_rules.RulesPolicy", "rules": str(RULES)}]
    else:
        policies = [{"class": "distributed.active_memory_manager.ReduceReplicas"}]
    return {f"{AMM}.start": True, f"{AMM}.policies": policies}


async def one_run(mode: str, n_tasks: int, profiler: cProfile.Profile | None = None) -> dict:
    """One computation on a fresh cluster; its time and the AMM's share of it."""
    with dask.config.set(config(mode)):
        async with Scheduler(dashboard_address=":0", port=0) as s:
            workers = [await Worker(s.address, nthreads=1, memory_limit="2 GiB") for _ in range(4)]
            amm = s.extensions["amm"]
            cycle_s: list[float] = []
            run_once = amm.run_once

            def timed_run_once() -> None:
                start = time.perf_counter()
                try:
                    run_once()
                finally:
                    cycle_s.append(time.perf_counter() - start)

            amm.run_once = timed_run_once  # type: ignore[method-assign]
            # The periodic callback holds the bound method: restart it on the wrapper.
            amm.stop()
            amm.start()
            async with Client(s.address, asynchronous=True) as c:
                gc.collect()
                if profiler is not None:
                    profiler.enable()
                start, cpu = time.perf_counter(), time.process_time()
                futures = c.map(inc, range(n_tasks))
                total = c.submit(sum, futures)
                result = await total
                elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
                if profiler is not None:
                    profiler.disable()
                assert result == sum(range(1, n_tasks + 1)), result
                del futures, total
            for w in workers:
                await w.close()
    return {
        "seconds": elapsed,
        "cpu_seconds": cpu,
        "amm_cycles": len(cycle_s),
        "amm_seconds": sum(cycle_s),
    }


def profile_table(profiler: cProfile.Profile) -> dict[str, float]:
    """Seconds of the functions of :data:`PROFILED` in a profile: cumulative time, minus
    the time of the scheduler method a wrapper calls (the wrapper's own cost)."""
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]

    def find(suffix: str, name: str) -> list[tuple[Any, Any]]:
        return [
            (func, row)
            for func, row in stats.items()
            if func[2] == name and func[0].replace(os.sep, "/").endswith(suffix)
        ]

    out: dict[str, float] = {}
    for label, suffix, name, wrapped in PROFILED:
        total = 0.0
        for func, row in find(suffix, name):
            total += row[3]
            if wrapped is not None:
                for _inner, (_cc, _nc, _tt, _ct, callers) in find(*wrapped):
                    total -= callers.get(func, (0, 0, 0, 0))[3]
        out[label] = total
    return out


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    for r in range(args.repeats):
        order = MODES if r % 2 == 0 else MODES[::-1]
        for mode in order:
            result = await one_run(mode, args.tasks)
            runs[mode].append(result)
            print(
                f"run {r + 1} {mode:<5} {result['seconds']:8.2f} s, "
                f"{result['cpu_seconds']:8.2f} s of processor time",
                flush=True,
            )
    profiles: dict[str, dict[str, float]] = {}
    if args.profile:
        for mode in MODES:
            profiler = cProfile.Profile()
            result = await one_run(mode, args.tasks, profiler)
            profiles[mode] = {"run_s": result["seconds"], **profile_table(profiler)}
    pairs = list(zip(runs["rules"], runs["stock"], strict=True))
    ratios = [a["seconds"] / b["seconds"] for a, b in pairs]
    cpu_ratios = [a["cpu_seconds"] / b["cpu_seconds"] for a, b in pairs]
    return {
        "tasks": args.tasks,
        "workers": 4,
        "amm_interval_s": dask.config.get(f"{AMM}.interval"),
        "runs": runs,
        "median_s": {m: statistics.median(x["seconds"] for x in runs[m]) for m in MODES},
        "median_cpu_s": {m: statistics.median(x["cpu_seconds"] for x in runs[m]) for m in MODES},
        "median_amm_s": {m: statistics.median(x["amm_seconds"] for x in runs[m]) for m in MODES},
        "paired_ratio_median": statistics.median(ratios),
        "paired_ratios": ratios,
        "paired_cpu_ratio_median": statistics.median(cpu_ratios),
        "paired_cpu_ratios": cpu_ratios,
        "profiles": profiles,
    }


def report(result: dict[str, Any]) -> str:
    med, cpu, amm = result["median_s"], result["median_cpu_s"], result["median_amm_s"]
    lines = [
        f"{result['tasks']:,} inc tasks and a sum, 4 in-process workers, "
        f"{len(result['runs']['rules'])} runs per mode (ABBA)",
        f"{'mode':<8} {'median s':>10} {'processor s':>12} {'AMM cycles s':>13}",
        f"{'rules':<8} {med['rules']:>10.2f} {cpu['rules']:>12.2f} {amm['rules']:>13.3f}",
        f"{'stock':<8} {med['stock']:>10.2f} {cpu['stock']:>12.2f} {amm['stock']:>13.3f}",
        f"rules / stock, time: {med['rules'] / med['stock']:.3f} (medians), "
        f"{result['paired_ratio_median']:.3f} (median of paired ratios)",
        f"rules / stock, processor time: {cpu['rules'] / cpu['stock']:.3f} (medians), "
        f"{result['paired_cpu_ratio_median']:.3f} (median of paired ratios)",
    ]
    for mode, prof in result["profiles"].items():
        lines.append(f"profile, {mode} (run {prof['run_s']:.2f} s under cProfile):")
        for label, seconds in prof.items():
            if label != "run_s" and seconds:
                share = seconds / prof["run_s"]
                lines.append(f"  {label:<40} {seconds:8.3f} s {share:7.2%}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3, help="runs per mode")
    parser.add_argument("--profile", action="store_true", help="one more run per mode, profiled")
    parser.add_argument("--json", type=Path, default=RESULTS)
    args = parser.parse_args()
    logging.getLogger("distributed").setLevel(logging.CRITICAL)
    started = time.time()
    result = asyncio.run(main_async(args))
    result.update(
        date=time.strftime("%Y-%m-%d", time.localtime(started)),
        duration_s=time.time() - started,
        machine={"cpus": os.cpu_count(), "platform": platform.platform()},
        python=platform.python_version(),
        distributed=distributed.__version__,
    )
    print(report(result))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    shown = args.json.relative_to(ROOT) if args.json.is_relative_to(ROOT) else args.json
    print(f"wrote {shown}")


if __name__ == "__main__":
    main()
