"""Three workloads that produce memory faster than they free it, with and without the
``memory-pressure`` section: peak managed memory, bytes spilled, seconds paused, wall time.

Each run starts a ``LocalCluster`` of three worker processes with spilling and pausing
on (distributed's defaults: target 60%, spill 70%, pause 80% of the worker's memory
limit; terminate off, so that a run is never cut short by a restart), runs one workload
and measures, from the scheduler (which runs in this process):

- ``peak_managed``: the largest sum over workers of managed memory in RAM
  (``WorkerState.memory.managed``: Dask's data, replicas included, spilled bytes not),
  sampled every 50 ms; ``peak_managed_total`` also counts bytes on disk;
- ``spilled``: bytes written to disk by the workers' spilling (their ``disk-write``
  metrics, summed by the scheduler from heartbeats);
- ``paused_s``: seconds workers spent paused, summed over workers (sampled);
- ``wall_s``: from submitting the graph to having the result.

The workloads (dask/distributed issue 3898 and its neighbours):

- ``W1``: ``(a @ a.T).sum()`` on a random 5000 x 5000 array in chunks of 1000; 1 thread
  per worker, 400 MiB each;
- ``W2``: ``(u**2).mean(0)``, ``(v**2).mean(0)``, ``(u*v).mean(0)`` computed together
  over shared random inputs u and v of 20000 x 2000 in chunks of 1000 rows (dask's
  "quadratic means"); 1 thread per worker, 250 MiB each;
- ``W3``: a root group of twice the cluster's threads (the largest group the scheduler
  does not queue) of 40 MiB chunks, each consumed with its neighbour (a transfer) by a
  task that sleeps 1 s; 2 threads per worker, 400 MiB each.

Modes: ``without`` runs RulesPolicy with no rules (the engine is there, its memory flow
included, nothing is held); ``with`` adds a ``memory-pressure`` section with its defaults
(``--section`` changes them); ``always`` a section that holds whenever a producer heads
the queue, whatever the memory (:data:`SECTIONS`). Runs rotate through the modes, and
workloads are interleaved, so that a shared machine's changing load falls on every mode
alike; the load average before each run is recorded.

Usage: ``python -m benchmarks.memory_pressure [--repeats N] [--only W1,W2,W3]
[--modes without,with,always] [--section JSON] [--variant NAME=JSON ...]``; writes
``benchmarks/results/memory_pressure.json``. A ``--variant`` adds a mode of that name
whose section is the JSON (fields over the defaults), to compare settings in one
interleaved series.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import time
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np
from distributed import Client

from benchmarks.support.cluster import spilling_cluster, spilling_config
from benchmarks.support.results import run_header

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "memory_pressure.json"
MiB = 2**20
WORKERS = 3
#: Workload -> (threads per worker, memory limit per worker).
SHAPES = {"W1": (1, 400 * MiB), "W2": (1, 250 * MiB), "W3": (2, 400 * MiB)}
W3_CHUNK = 40 * MiB
W3_DELAY = 1.0
#: The ``memory-pressure`` section of each mode but ``without``. ``with``: every default
#: (``--section`` changes them); ``always``: hold whenever a producer heads the queue,
#: whatever the memory (the hold then acts from the graph's first task, as a lower
#: ``worker-saturation`` would, but for producers only).
SECTIONS: dict[str, dict[str, Any]] = {
    "with": {},
    "always": {
        "threshold": "1%",
        "release": "0%",
        "require-transfers": False,
        "min-hold": 0,
        "max-hold": "24h",
    },
}
MODES = ("without", "with", "always")
SAMPLE_S = 0.05


# -- workloads ----------------------------------------------------------------------


def make_chunk(i: int, nbytes: int) -> np.ndarray:
    return np.random.default_rng(i).random(nbytes // 8)


def slow_pair(a: np.ndarray, b: np.ndarray, delay: float) -> float:
    time.sleep(delay)
    return float(a[:10].sum() + b[:10].sum())


def workload(name: str, threads: int) -> tuple[Any, Any]:
    """(what to compute, how): a list of collections, or a graph and its output key."""
    if name == "W1":
        a = da.random.random((5000, 5000), chunks=1000)
        return "collections", [(a @ a.T).sum()]
    if name == "W2":
        u = da.random.random((20000, 2000), chunks=(1000, 2000))
        v = da.random.random((20000, 2000), chunks=(1000, 2000))
        return "collections", [(u**2).mean(0), (v**2).mean(0), (u * v).mean(0)]
    if name == "W3":
        n = 2 * WORKERS * threads
        token = f"{time.time_ns()}"
        chunk, pair = f"chunk-{token}", f"pair-{token}"
        dsk: dict[Any, Any] = {(chunk, i): (make_chunk, i, W3_CHUNK) for i in range(n)}
        for i in range(n):
            dsk[(pair, i)] = (slow_pair, (chunk, i), (chunk, (i + 1) % n), W3_DELAY)
        dsk[f"total-{token}"] = (sum, [(pair, i) for i in range(n)])
        return "graph", (dsk, f"total-{token}")
    raise ValueError(name)


# -- one run ------------------------------------------------------------------------


def spilled_bytes(s: Any) -> int:
    return sum(
        v
        for k, v in s.cumulative_worker_metrics.items()
        if isinstance(k, tuple) and "disk-write" in k and k[-1] == "bytes"
    )


async def sample(s: Any, out: dict[str, float], stop: asyncio.Event) -> None:
    last = time.monotonic()
    while not stop.is_set():
        await asyncio.sleep(SAMPLE_S)
        now = time.monotonic()
        dt, last = now - last, now
        workers = list(s.workers.values())
        in_ram = sum(ws.memory.managed for ws in workers)
        total = sum(ws.nbytes for ws in workers)
        out["peak_managed"] = max(out.get("peak_managed", 0), in_ram)
        out["peak_managed_total"] = max(out.get("peak_managed_total", 0), total)
        paused = sum(getattr(ws.status, "name", "") == "paused" for ws in workers)
        out["paused_s"] = out.get("paused_s", 0.0) + dt * paused


def rules_of(mode: str) -> dict[str, Any]:
    section = SECTIONS.get(mode)
    return {"version": 1, **({"memory-pressure": dict(section)} if section is not None else {})}


async def one_run(name: str, mode: str) -> dict[str, Any]:
    threads, limit = SHAPES[name]
    load = os.getloadavg()[0]
    with dask.config.set(spilling_config(rules_of(mode))):
        async with (
            spilling_cluster(WORKERS, threads, limit) as cluster,
            Client(cluster, asynchronous=True) as client,
        ):
            s = cluster.scheduler
            (policy,) = [p for p in s.extensions["amm"].policies if hasattr(p, "pressure")]
            kind, what = workload(name, threads)
            measured: dict[str, float] = {}
            stop = asyncio.Event()
            spilled_before = spilled_bytes(s)
            sampler = asyncio.create_task(sample(s, measured, stop))
            start = time.monotonic()
            if kind == "graph":
                dsk, key = what
                await client.gather(client.get(dsk, key, sync=False))
            else:
                await client.gather(client.compute(what))
            wall = time.monotonic() - start
            pressure = policy.pressure.metrics()
            flow = policy.flow.table()
            await asyncio.sleep(1.5)  # the workers' last heartbeats bring their metrics
            stop.set()
            await sampler
            return {
                "workload": name,
                "mode": mode,
                "wall_s": round(wall, 2),
                "spilled": spilled_bytes(s) - spilled_before,
                "peak_managed": int(measured.get("peak_managed", 0)),
                "peak_managed_total": int(measured.get("peak_managed_total", 0)),
                "paused_s": round(measured.get("paused_s", 0.0), 2),
                "holds": int(pressure["holds"]),
                "held_s": pressure["held_seconds"],
                "queued_roots": int(pressure["queued_roots"]),
                "load_before": round(load, 2),
                "flow": top_flow(flow),
            }


def top_flow(table: dict[str, dict[str, Any]], n: int = 4) -> dict[str, dict[str, Any]]:
    """The prefixes adding the most and freeing the most, for the docs."""
    rows = [(p, r) for p, r in table.items() if r["net_per_task"] is not None]
    rows.sort(key=lambda pr: pr[1]["net_per_task"])
    keep = rows[:n] + rows[-n:]
    return {p: r for p, r in keep}


# -- the series ---------------------------------------------------------------------


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    out = []
    for r in range(args.repeats):
        # Each mode first, middle and last in turn: drift in the machine's load falls on
        # every mode alike.
        modes = args.modes[r % len(args.modes) :] + args.modes[: r % len(args.modes)]
        for name in args.only:
            for mode in modes:
                result = await one_run(name, mode)
                result["repeat"] = r
                print(json.dumps({k: v for k, v in result.items() if k != "flow"}), flush=True)
                out.append(result)
    return out


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


MEASURES = ("wall_s", "spilled", "peak_managed", "peak_managed_total", "paused_s", "holds")


def summarize(runs: list[dict[str, Any]], only: list[str], modes: list[str]) -> dict[str, Any]:
    """Per workload and mode, each measure's median and range; for the modes with a
    section, their medians over the ``without`` mode's (``spilled_ratio``, ``wall_ratio``)."""
    table: dict[str, Any] = {}
    for name in only:
        rows = {m: [r for r in runs if r["workload"] == name and r["mode"] == m] for m in modes}
        table[name] = {
            mode: {k: spread([r[k] for r in got]) for k in MEASURES}
            for mode, got in rows.items()
            if got
        }
        base = table[name].get("without")
        for mode, m in table[name].items():
            if mode == "without" or base is None:
                continue
            spilled = base["spilled"]["median"]
            m["spilled_ratio"] = m["spilled"]["median"] / spilled if spilled else None
            m["wall_ratio"] = m["wall_s"]["median"] / base["wall_s"]["median"]
            m["wall_paired"] = paired(rows["without"], rows[mode])
    return table


def paired(base: list[dict[str, Any]], other: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Wall time over the ``without`` run of the same repeat (run next to it): median,
    quartiles, and how many repeats were slower."""
    by_repeat = {r["repeat"]: r["wall_s"] for r in base}
    ratios = sorted(
        r["wall_s"] / by_repeat[r["repeat"]] for r in other if r["repeat"] in by_repeat
    )
    if not ratios:
        return None
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    return {
        "median": round(statistics.median(ratios), 3),
        "q1": round(q[0], 3),
        "q3": round(q[2], 3),
        "slower": sum(x > 1 for x in ratios),
        "n": len(ratios),
    }


def targets(table: dict[str, Any], mode: str) -> dict[str, Any]:
    """The issue's targets for one mode: on one workload at least, bytes spilled at most
    half and wall time no worse; on none, wall time worse by more than 5%."""
    rows = {name: t[mode] for name, t in table.items() if mode in t and "wall_ratio" in t[mode]}
    helped = [
        name
        for name, m in rows.items()
        if m["spilled_ratio"] is not None and m["spilled_ratio"] <= 0.5 and m["wall_ratio"] <= 1.0
    ]
    worse = [name for name, m in rows.items() if m["wall_ratio"] > 1.05]
    # The same by paired ratios (each run over the ``without`` run of its repeat), which a
    # shared machine's drifting load disturbs less than a ratio of medians.
    worse_paired = [
        name
        for name, m in rows.items()
        if m.get("wall_paired") and m["wall_paired"]["median"] > 1.05
    ]
    return {
        "helped": helped,
        "wall_worse_than_5pct": worse,
        "wall_worse_than_5pct_paired": worse_paired,
        "met": bool(helped) and not worse,
    }


def mib(n: float) -> str:
    return f"{n / MiB:,.0f}"


def one_decimal(x: float) -> str:
    return f"{x:.1f}"


def cell(m: dict[str, Any], key: str, fmt: Any = one_decimal) -> str:
    """``median (min-max)`` of one measure."""
    v = m[key]
    return f"{fmt(v['median'])} ({fmt(v['min'])}-{fmt(v['max'])})"


def print_table(table: dict[str, Any], repeats: int) -> None:
    print(
        f"\n{'workload':<8} {'mode':<8} {'wall s':>16} {'spilled MiB':>18} "
        f"{'peak managed MiB':>18} {'paused s':>14} {'holds':>6}"
    )
    for name, t in table.items():
        for mode, m in t.items():
            print(
                f"{name:<8} {mode:<8} {cell(m, 'wall_s'):>16} {cell(m, 'spilled', mib):>18} "
                f"{cell(m, 'peak_managed', mib):>18} {cell(m, 'paused_s'):>14} "
                f"{m['holds']['median']:>6.0f}"
            )
        for mode, m in t.items():
            if "wall_ratio" in m:
                ratio = m["spilled_ratio"]
                shown = "-" if ratio is None else f"{ratio:.2f}"
                p = m["wall_paired"]
                pair = (
                    ""
                    if p is None
                    else (
                        f", paired {p['median']:.2f} ({p['q1']:.2f}-{p['q3']:.2f}), "
                        f"slower in {p['slower']}/{p['n']}"
                    )
                )
                print(f"{'':<8} {mode}/without: spilled {shown}, wall {m['wall_ratio']:.2f}{pair}")
    print(f"medians (min-max) of {repeats} runs per mode")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", default="W1,W2,W3", help="workloads, comma-separated")
    parser.add_argument("--modes", default=",".join(MODES), help="modes, comma-separated")
    parser.add_argument(
        "--section",
        default="{}",
        help="the memory-pressure section of the 'with' mode, as JSON (default: {})",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=JSON",
        help="one more mode, NAME, with this memory-pressure section (repeatable)",
    )
    parser.add_argument("--json", type=Path, default=RESULTS)
    args = parser.parse_args()
    args.only = [w.strip() for w in args.only.split(",") if w.strip()]
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for variant in args.variant:
        name, _, section = variant.partition("=")
        if not name or name in MODES or not section:
            parser.error(f"--variant {variant!r}: NAME=JSON with a new NAME")
        SECTIONS[name] = json.loads(section)
        args.modes.append(name)
    known = set(MODES) | set(SECTIONS)
    unknown = sorted(set(args.modes) - known) + sorted(set(args.only) - set(SHAPES))
    if unknown:
        parser.error(f"unknown {', '.join(unknown)}: modes {MODES}, workloads {tuple(SHAPES)}")
    SECTIONS["with"].update(json.loads(args.section))
    logging.getLogger("distributed").setLevel(logging.CRITICAL)
    logging.getLogger("amm_rules").setLevel(logging.CRITICAL)
    started = time.time()
    runs = asyncio.run(run(args))
    table = summarize(runs, args.only, args.modes)
    print_table(table, args.repeats)
    goals = {mode: targets(table, mode) for mode in args.modes if mode != "without"}
    print(json.dumps(goals))
    result = {
        **run_header(started),
        "settings": {
            "repeats": args.repeats,
            "workers": WORKERS,
            "shapes": {k: {"threads": t, "memory_limit": m} for k, (t, m) in SHAPES.items()},
            "modes": args.modes,
            "sections": {mode: SECTIONS[mode] for mode in args.modes if mode in SECTIONS},
        },
        "table": table,
        "targets": goals,
        "runs": runs,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.json.relative_to(ROOT) if args.json.is_relative_to(ROOT) else args.json}")


if __name__ == "__main__":
    main()
