"""The seed's named workloads under each mode of the Active Memory Manager: does any
section of amm-rules make a real workload worse, and does rebalancing pay where
imbalance is the cause?

The workloads (:mod:`benchmarks.support.workloads`): ``double_diff`` and
``vorticity`` (two large arrays, stored into numpy memmaps with ``da.store``),
``anom_mean`` (the anomaly's mean over time) and ``dataframe_align`` (two frames
aligned on a shuffled index). Each run starts a ``LocalCluster`` of worker processes
(by default 4 workers of 768 MiB and one thread each, distributed's memory thresholds:
spilling from 60% of the limit) whose scheduler runs in this process, runs one
workload under one mode and measures:

- ``wall_s``: from submitting the graph to its end (the imbalance variant: the
  inputs persisted, then the computation: ``persist_s`` + ``compute_s``);
- ``written``/``read``: bytes the workers' spill buffers wrote to and read back from
  disk (``SpillBuffer.cumulative_metrics``, asked of each worker before and after);
- ``peak_process``/``peak_managed``: per worker, the largest process memory and
  managed memory the scheduler saw (sampled every ``--period`` s);
- ``imbalance``: max/mean of the workers' managed memory (in RAM and on disk), sampled
  while the mean is at least 5% of a worker's limit: its mean over the run and its
  largest value; the samples are kept for the plots;
- ``workers_lost``: workers that left the scheduler during the run;
- ``scheduler_cpu_s``: processor time of this process's event-loop thread (scheduler
  and client) during the run; and the engine's own figures (each section in use).

The modes (:data:`benchmarks.support.workloads.MODES`): ``off`` (no AMM), ``stock``
(distributed's ReduceReplicas), ``engine`` (amm-rules with an empty rules file),
``rebalance``, ``memory-pressure``, ``protect``, ``spill``, ``adaptive`` (each section
alone, at its defaults; ``adaptive`` acts only where the cluster adapts, which this one
does not), ``recommended`` (``examples/rules/recommended.yaml``). Rounds rotate the modes'
order and interleave the workloads; the summary gives medians and ranges and,
per mode, ratios to stock's medians.

The imbalance variant (``--imbalance producers`` or ``late``): each workload's inputs
are persisted first on ``--heavy`` workers (``producers``) or before the others join
(``late``), then computed on all of them; ``--imbalance-modes`` (default: stock,
rebalance, recommended).

Usage::

    python -m benchmarks.workloads --quick             # a few minutes: small data
    python -m benchmarks.workloads                     # medians of 3, about 1.5 h on 2 cores
    python -m benchmarks.workloads --imbalance producers --only double_diff,anom_mean
    python -m benchmarks.workloads --scale 4           # 4 x the memory per worker, same chunks
    python -m benchmarks.workloads --plots-only        # the plots again from the JSON
    python -m benchmarks.workloads --markdown          # the docs' tables from the JSON

Writes ``benchmarks/results/workloads[-VARIANT][-quick].json`` and, unless ``--quick``,
the plots ``docs/workloads-<workload>[-VARIANT].png``.
"""

from __future__ import annotations

import os

# One BLAS thread per worker thread: workers inherit the environment.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import AsyncIterator, Iterable  # noqa: E402
from contextlib import asynccontextmanager, suppress  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import dask  # noqa: E402
import distributed  # noqa: E402
from distributed import Client, LocalCluster, wait  # noqa: E402
from distributed.diagnostics.plugin import SchedulerPlugin  # noqa: E402

from benchmarks.support import workloads as w  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DOCS = ROOT / "docs"
MiB = 2**20
#: The imbalance variant's default modes.
IMBALANCE_MODES = ("stock", "rebalance", "recommended")
#: Imbalance samples count while the workers' mean is at least this fraction of a limit.
IMBALANCE_FLOOR = 0.05


@dataclass(frozen=True)
class Setup:
    """The cluster of a run and how its workload is sized."""

    workers: int = 4
    memory_limit: int = 768 * MiB
    threads: int = 1
    #: Seconds between two memory samples.
    period: float = 0.25
    #: The AMM's interval (distributed's default).
    interval: float = 2.0
    #: Multiplies :data:`benchmarks.support.workloads.FRACTIONS` (``--quick``: smaller data).
    data: float = 1.0


QUICK = Setup(workers=4, memory_limit=384 * MiB, data=1.0, period=0.2)


# -- measuring ----------------------------------------------------------------------


class Departures(SchedulerPlugin):
    """Workers that left the scheduler while counting."""

    name = "workloads-departures"

    def __init__(self) -> None:
        self.lost: list[str] = []
        self.counting = True

    def remove_worker(self, scheduler: Any, worker: str, **kwargs: Any) -> None:
        if self.counting:
            self.lost.append(worker)


class Sampler:
    """Per-worker memory on the scheduler, every ``period`` seconds."""

    def __init__(self, scheduler: Any, period: float) -> None:
        self.scheduler = scheduler
        self.period = period
        self.t0 = time.monotonic()
        #: (seconds, {worker: (managed in RAM, spilled, process)})
        self.samples: list[tuple[float, dict[str, tuple[int, int, int]]]] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            self.take()
            await asyncio.sleep(self.period)

    def take(self) -> None:
        now = round(time.monotonic() - self.t0, 3)
        mem = {
            ws.name if isinstance(ws.name, str) else str(ws.name): (
                ws.memory.managed,
                ws.memory.spilled,
                ws.memory.process,
            )
            for ws in self.scheduler.workers.values()
        }
        self.samples.append((now, mem))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task
        self.take()

    def imbalance(self, limit: int) -> list[tuple[float, float]]:
        """(seconds, max/mean of managed memory in RAM and on disk) while the mean is
        at least :data:`IMBALANCE_FLOOR` of a worker's limit."""
        out = []
        for t, mem in self.samples:
            totals = [m + s for m, s, _ in mem.values()]
            if len(totals) < 2:
                continue
            mean = statistics.fmean(totals)
            if mean >= IMBALANCE_FLOOR * limit:
                out.append((t, round(max(totals) / mean, 3)))
        return out

    def peaks(self, index: int) -> dict[str, int]:
        out: dict[str, int] = {}
        for _, mem in self.samples:
            for name, values in mem.items():
                out[name] = max(out.get(name, 0), values[index])
        return out


def disk_metrics(dask_worker: Any) -> dict[str, float]:
    """A worker's cumulative spill metrics: bytes written to and read from disk."""
    metrics = getattr(dask_worker.data, "cumulative_metrics", {})
    return {
        label: float(value)
        for (label, unit), value in metrics.items()
        if label in ("disk-read", "disk-write") and unit == "bytes"
    }


async def disk_totals(client: Client) -> dict[str, dict[str, float]]:
    return await client.run(disk_metrics)


def disk_delta(
    before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]
) -> dict[str, int]:
    out = {"written": 0, "read": 0}
    for addr, metrics in after.items():
        was = before.get(addr, {})
        out["written"] += int(metrics.get("disk-write", 0) - was.get("disk-write", 0))
        out["read"] += int(metrics.get("disk-read", 0) - was.get("disk-read", 0))
    return out


def engine_figures(scheduler: Any, sections: Iterable[str]) -> dict[str, Any]:
    """The engine's own figures: the copies and drops it requested per label, and the
    status of each named section (moves, holds, protected keys)."""
    out: dict[str, Any] = {}
    names = set(sections)
    for policy in scheduler.extensions["amm"].policies:
        if not hasattr(policy, "sections"):
            continue
        out["totals"] = {label: dict(c) for label, c in policy.totals.items()}
        for section in policy.sections:
            if section.name in names:
                out[section.name] = compact(json.loads(json.dumps(section.status(), default=str)))
    return out


#: Parts of a section's status left out of the results: examples and per-worker roles.
LEFT_OUT = frozenset({"examples", "roles", "void"})


def compact(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: compact(v) for k, v in value.items() if k not in LEFT_OUT}
    return value


# -- one run ------------------------------------------------------------------------


@asynccontextmanager
async def cluster_for(
    mode: str, setup: Setup, workers: int | None = None, processes: bool = True
) -> AsyncIterator[tuple[LocalCluster, Client]]:
    """A local cluster whose scheduler (in this process) runs ``mode``'s AMM, and a
    client of it; ``workers`` to start with (default: ``setup.workers``)."""
    with dask.config.set(w.amm_config(mode, setup.interval)):
        async with (
            LocalCluster(
                n_workers=setup.workers if workers is None else workers,
                threads_per_worker=setup.threads,
                processes=processes,
                asynchronous=True,
                dashboard_address=":0",
                memory_limit=setup.memory_limit,
            ) as cluster,
            Client(cluster, asynchronous=True) as client,
        ):
            yield cluster, client


async def run_workload(
    client: Client,
    built: w.Built,
    imbalance: w.Imbalance | None,
    cluster: LocalCluster,
    workers: int,
) -> tuple[float, dict[str, dict[str, float]] | None, list[Any]]:
    """Run ``built`` (its inputs persisted first in the imbalance variant, after which
    the cluster has ``workers`` workers). Returns the seconds the inputs took to
    persist and the workers' disk metrics then (0 and None without the variant), and
    the results."""
    if imbalance is None:
        results = await client.gather(client.compute(built.compute(built.inputs)))
        return 0.0, None, list(results)
    start = time.monotonic()
    heavy = sorted(cluster.scheduler.workers)[: imbalance.heavy]
    if imbalance.kind == "producers":
        inputs = client.persist(built.inputs, workers=heavy, allow_other_workers=False)
    else:
        inputs = client.persist(built.inputs)
    await wait(inputs)
    if imbalance.kind == "late":
        cluster.scale(workers)
        await client.wait_for_workers(workers)
    persist_s = time.monotonic() - start
    disk = await disk_totals(client)
    results = await client.gather(client.compute(built.compute(inputs)))
    return persist_s, disk, list(results)


async def one_run(
    name: str,
    mode: str,
    setup: Setup,
    seed: int,
    imbalance: w.Imbalance | None = None,
) -> dict[str, Any]:
    if imbalance is None:
        fraction, chunk = w.FRACTIONS[name], None
    else:
        fraction, chunk = imbalance.fraction, imbalance.chunk_fraction
    shape = w.shape_of(name, setup.workers, setup.memory_limit, fraction * setup.data, chunk)
    latency = 0.0 if imbalance is None else imbalance.latency(shape)
    sink_dir = Path(tempfile.mkdtemp(prefix="amm-rules-workloads-"))
    built = w.build(name, shape, seed, sink_dir, latency)
    start_workers = imbalance.heavy if imbalance and imbalance.kind == "late" else None
    load = os.getloadavg()[0]
    try:
        async with cluster_for(mode, setup, start_workers) as (cluster, client):
            result = await measured_run(client, cluster, built, mode, setup, imbalance)
            result["load_before"] = round(load, 2)
            return result
    finally:
        shutil.rmtree(sink_dir, ignore_errors=True)


async def measured_run(
    client: Client,
    cluster: LocalCluster,
    built: w.Built,
    mode: str,
    setup: Setup,
    imbalance: w.Imbalance | None,
) -> dict[str, Any]:
    s = cluster.scheduler
    departures = Departures()
    s.add_plugin(departures, name=Departures.name)
    disk_before = await disk_totals(client)
    sampler = Sampler(s, setup.period)
    sampler.start()
    cpu = time.thread_time()
    start = time.monotonic()
    persist_s, disk_persisted, _ = await run_workload(
        client, built, imbalance, cluster, setup.workers
    )
    wall = time.monotonic() - start
    cpu = time.thread_time() - cpu
    await sampler.stop()
    disk_after = await disk_totals(client)
    disk = disk_delta(disk_before, disk_after)
    phases = None
    if disk_persisted is not None:
        phases = {
            "persist": disk_delta(disk_before, disk_persisted),
            "compute": disk_delta(disk_persisted, disk_after),
        }
    departures.counting = False
    ratios = sampler.imbalance(setup.memory_limit)
    values = [r for _, r in ratios]
    return {
        "workload": built.name,
        "mode": mode,
        "variant": "even" if imbalance is None else imbalance.kind,
        "seed": built.seed,
        "input_bytes": built.shape.input_bytes,
        "wall_s": round(wall, 3),
        "persist_s": round(persist_s, 3),
        "compute_s": round(wall - persist_s, 3),
        "written": disk["written"],
        "read": disk["read"],
        "disk_phases": phases,
        "peak_process": sampler.peaks(2),
        "peak_managed": sampler.peaks(0),
        "imbalance_mean": round(statistics.fmean(values), 3) if values else None,
        "imbalance_max": max(values) if values else None,
        "workers_lost": len(departures.lost),
        "scheduler_cpu_s": round(cpu, 3),
        "engine": engine_figures(s, w.sections_of(mode)),
        "imbalance_samples": ratios,
    }


# -- the series ---------------------------------------------------------------------


def rotated(modes: list[str], r: int) -> list[str]:
    """The modes in round ``r``'s order: each mode first, middle and last in turn, so
    that a drift in the machine's load falls on every mode alike."""
    k = r % len(modes)
    return modes[k:] + modes[:k]


async def series(args: argparse.Namespace, setup: Setup) -> list[dict[str, Any]]:
    out = []
    for r in range(args.repeats):
        for name in args.only:
            for mode in rotated(args.modes, r):
                result = await one_run(name, mode, setup, seed=r, imbalance=args.variant)
                result["repeat"] = r
                shown = {k: v for k, v in result.items() if k != "imbalance_samples"}
                print(json.dumps(shown), flush=True)
                out.append(result)
    return out


# -- the summary --------------------------------------------------------------------

MEASURES = ("wall_s", "written", "read", "scheduler_cpu_s", "imbalance_mean", "workers_lost")


def spread(values: Iterable[float | None]) -> dict[str, float] | None:
    got = [v for v in values if v is not None]
    if not got:
        return None
    return {"median": statistics.median(got), "min": min(got), "max": max(got)}


def summarize(runs: list[dict[str, Any]], names: list[str], modes: list[str]) -> dict[str, Any]:
    """Per workload and mode: each measure's median and range, the largest peak of
    process memory of any worker, and ratios of medians to stock's."""
    table: dict[str, Any] = {}
    for name in names:
        rows: dict[str, Any] = {}
        for mode in modes:
            got = [r for r in runs if r["workload"] == name and r["mode"] == mode]
            if not got:
                continue
            entry = {k: spread(r[k] for r in got) for k in MEASURES}
            entry["peak_process"] = spread(max(r["peak_process"].values(), default=0) for r in got)
            entry["runs"] = len(got)
            rows[mode] = entry
        base = rows.get("stock")
        for mode, entry in rows.items():
            if base is not None and mode != "stock":
                entry["vs_stock"] = ratios(entry, base)
        table[name] = rows
    return table


def ratios(entry: dict[str, Any], base: dict[str, Any]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for k in ("wall_s", "written", "read", "scheduler_cpu_s", "peak_process"):
        b = base[k]["median"] if base.get(k) else 0
        v = entry[k]["median"] if entry.get(k) else 0
        # Below 1 MiB of disk traffic on both sides there is nothing to compare.
        if k in ("written", "read") and max(b, v) < MiB:
            out[k] = None
        else:
            out[k] = round(v / b, 3) if b else None
    return out


def goals(table: dict[str, Any], variant: str) -> dict[str, Any]:
    """The issue's goals. Even workloads: each section's wall and bytes written within
    3% of stock's (or it moved nothing). The imbalance variant: rebalance reads back at
    most half of stock's bytes and takes at most 80% of its wall time."""
    out: dict[str, Any] = {}
    for name, rows in table.items():
        for mode, entry in rows.items():
            r = entry.get("vs_stock")
            if r is None:
                continue
            if variant == "even":
                worse = [k for k in ("wall_s", "written") if r.get(k) is not None and r[k] > 1.03]
                out.setdefault(mode, {})[name] = {"within_3pct": not worse, "worse": worse}
            elif mode in ("rebalance", "recommended"):
                read_ok = r["read"] is not None and r["read"] <= 0.5
                wall_ok = r["wall_s"] is not None and r["wall_s"] <= 0.8
                out.setdefault(mode, {})[name] = {
                    "read_halved": read_ok,
                    "wall_cut_20pct": wall_ok,
                    "met": read_ok and wall_ok,
                }
    return out


def mib(n: float) -> str:
    return f"{n / MiB:,.0f}"


def cell(entry: dict[str, Any], key: str, fmt: Any = lambda x: f"{x:.1f}") -> str:
    v = entry.get(key)
    return "-" if v is None else f"{fmt(v['median'])} ({fmt(v['min'])}-{fmt(v['max'])})"


def print_table(table: dict[str, Any], repeats: int) -> None:
    head = (
        f"{'workload':<16} {'mode':<16} {'wall s':>18} {'written MiB':>20} {'read MiB':>20} "
        f"{'peak MiB':>8} {'max/mean':>8} {'sched cpu':>9} {'lost':>4}  vs stock"
    )
    print("\n" + head)
    for name, rows in table.items():
        for mode, e in rows.items():
            r = e.get("vs_stock") or {}
            vs = ", ".join(f"{k.split('_')[0]} {v:.2f}" for k, v in r.items() if v is not None)
            imb = e["imbalance_mean"]
            print(
                f"{name:<16} {mode:<16} {cell(e, 'wall_s'):>18} {cell(e, 'written', mib):>20} "
                f"{cell(e, 'read', mib):>20} {mib(e['peak_process']['median']):>8} "
                f"{'-' if imb is None else format(imb['median'], '.2f'):>8} "
                f"{e['scheduler_cpu_s']['median']:>9.1f} "
                f"{e['workers_lost']['median']:>4.0f}  {vs}"
            )
    print(f"medians (min-max) of {repeats} runs per mode")


def markdown(table: dict[str, Any]) -> str:
    """The tables of docs/performance.md: per workload, a row per mode with medians and
    ranges, and each ratio of medians to stock's."""
    out = []
    for name, rows in table.items():
        out += [
            f"**{name}**",
            "",
            "| mode | wall s | written MiB | read MiB | peak MiB | max/mean | scheduler s | lost "
            "| wall, written, read vs stock |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for mode, e in rows.items():
            r = e.get("vs_stock") or {}
            ratios = ", ".join(
                "-" if r.get(k) is None else f"{r[k]:.2f}" for k in ("wall_s", "written", "read")
            )
            imb = e["imbalance_mean"]
            out.append(
                f"| {mode} | {cell(e, 'wall_s')} | {cell(e, 'written', mib)} "
                f"| {cell(e, 'read', mib)} | {mib(e['peak_process']['median'])} "
                f"| {'-' if imb is None else format(imb['median'], '.2f')} "
                f"| {e['scheduler_cpu_s']['median']:.1f} | {e['workers_lost']['max']:.0f} "
                f"| {ratios if mode != 'stock' else ''} |"
            )
        out.append("")
    return "\n".join(out)


# -- plots ----------------------------------------------------------------------------


def plot(data: dict[str, Any], out_dir: Path = DOCS) -> list[Path]:
    """One figure per workload: wall time and disk traffic per mode (medians, with the
    range), and max/mean of the workers' memory over time (each mode's median run)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variant = data["settings"]["variant"]
    suffix = "" if variant == "even" else f"-{variant}"
    written = []
    for name, rows in data["table"].items():
        modes = list(rows)
        fig, (ax_wall, ax_disk, ax_imb) = plt.subplots(1, 3, figsize=(13, 3.8))
        xs = range(len(modes))
        walls = [rows[m]["wall_s"] for m in modes]
        ax_wall.bar(
            xs,
            [v["median"] for v in walls],
            yerr=[
                [v["median"] - v["min"] for v in walls],
                [v["max"] - v["median"] for v in walls],
            ],
            capsize=3,
        )
        ax_wall.set_xticks(list(xs), modes, rotation=30, ha="right")
        ax_wall.set_ylabel("wall time, s (median, min-max)")
        for j, key in enumerate(("written", "read")):
            vals = [rows[m][key]["median"] / MiB for m in modes]
            ax_disk.bar([x + (j - 0.5) * 0.4 for x in xs], vals, 0.4, label=key)
        ax_disk.set_xticks(list(xs), modes, rotation=30, ha="right")
        ax_disk.set_ylabel("spilled to / read from disk, MiB")
        ax_disk.legend()
        for mode in modes:
            run = median_run(data["runs"], name, mode)
            if run and run["imbalance_samples"]:
                ts, vs = zip(*run["imbalance_samples"], strict=True)
                ax_imb.plot(ts, vs, label=mode, linewidth=1)
        ax_imb.set_xlabel("seconds since the start")
        ax_imb.set_ylabel("max/mean of workers' data")
        ax_imb.legend(fontsize=7)
        fig.suptitle(f"{name}{' (' + variant + ')' if variant != 'even' else ''}")
        fig.tight_layout()
        path = out_dir / f"workloads-{name}{suffix}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    return written


def median_run(runs: list[dict[str, Any]], name: str, mode: str) -> dict[str, Any] | None:
    got = sorted(
        (r for r in runs if r["workload"] == name and r["mode"] == mode),
        key=lambda r: r["wall_s"],
    )
    return got[len(got) // 2] if got else None


# -- main -----------------------------------------------------------------------------


def parse(argv: list[str] | None = None) -> tuple[argparse.Namespace, Setup]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small data, 1 repeat")
    parser.add_argument("--repeats", type=int, default=None, help="runs per mode (3)")
    parser.add_argument("--only", default=",".join(w.WORKLOADS), help="workloads")
    parser.add_argument("--modes", default=None, help="modes, comma-separated")
    parser.add_argument("--workers", type=int, default=None, help="worker processes (4)")
    parser.add_argument(
        "--scale", type=float, default=1.0, help="memory per worker (and data) x this"
    )
    parser.add_argument("--imbalance", choices=("producers", "late"), default=None)
    parser.add_argument("--heavy", type=int, default=1, help="workers holding the inputs")
    parser.add_argument(
        "--fraction", type=float, default=0.35, help="inputs / cluster memory (variant)"
    )
    parser.add_argument(
        "--load-rate",
        type=float,
        default=64.0,
        help="MiB/s one thread loads (variant; 0: no wait)",
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--plots-only", action="store_true")
    parser.add_argument(
        "--markdown", action="store_true", help="print the docs' tables from the JSON"
    )
    args = parser.parse_args(argv)
    base = QUICK if args.quick else Setup()
    setup = Setup(
        workers=args.workers or base.workers,
        memory_limit=int(base.memory_limit * args.scale),
        threads=base.threads,
        period=base.period,
        interval=base.interval,
        data=base.data,
    )
    args.only = [x.strip() for x in args.only.split(",") if x.strip()]
    default_modes = IMBALANCE_MODES if args.imbalance else w.MODES
    args.modes = [x.strip() for x in (args.modes or ",".join(default_modes)).split(",")]
    unknown = sorted(set(args.only) - set(w.WORKLOADS)) + sorted(set(args.modes) - set(w.MODES))
    if unknown:
        parser.error(f"unknown {', '.join(unknown)}: workloads {w.WORKLOADS}, modes {w.MODES}")
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    args.variant = None
    if args.imbalance:
        rate = args.load_rate * MiB if args.load_rate > 0 else None
        args.variant = w.Imbalance(args.imbalance, args.heavy, args.fraction, rate)
    if args.json is None:
        variant = f"-{args.imbalance}" if args.imbalance else ""
        args.json = RESULTS / f"workloads{variant}{'-quick' if args.quick else ''}.json"
    return args, setup


def main(argv: list[str] | None = None) -> None:
    args, setup = parse(argv)
    if args.markdown:
        print(markdown(json.loads(args.json.read_text())["table"]))
        return
    if args.plots_only:
        for path in plot(json.loads(args.json.read_text())):
            print(f"wrote {path.relative_to(ROOT)}")
        return
    logging.getLogger("distributed").setLevel(logging.CRITICAL)
    logging.getLogger("amm_rules").setLevel(logging.CRITICAL)
    w.ship()
    started = time.time()
    runs = asyncio.run(series(args, setup))
    variant = "even" if args.variant is None else args.variant.kind
    table = summarize(runs, args.only, args.modes)
    print_table(table, args.repeats)
    met = goals(table, variant)
    print(json.dumps(met))
    result = {
        "date": time.strftime("%Y-%m-%d", time.localtime(started)),
        "duration_s": round(time.time() - started),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "dask": dask.__version__,
        "distributed": distributed.__version__,
        "settings": {
            **asdict(setup),
            "repeats": args.repeats,
            "quick": args.quick,
            "variant": variant,
            "imbalance": None if args.variant is None else asdict(args.variant),
            "modes": args.modes,
            "fractions": w.FRACTIONS,
            "chunks": w.CHUNKS,
            "rules": {
                m: str(r.relative_to(w.ROOT)) if isinstance(r, Path) else r
                for m, r in w.RULES.items()
            },
        },
        "table": table,
        "goals": met,
        "runs": runs,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.json}")
    if not args.quick:
        for path in plot(result):
            print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
