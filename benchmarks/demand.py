"""Copies kept while in demand: a shared table read by waves of small tasks.

A 64 MiB table is computed on one worker of a ``LocalCluster`` (4 worker processes, one
thread each; the scheduler runs in this process, so its state is read directly). Then
10 waves of 200 small tasks, one wave every 3 seconds, each task reading the table. Each
wave's tasks run on every worker, so every worker needs the table. Between waves no task
waits for it: the stock ``ReduceReplicas`` drops the extra copies, and the next wave
fetches them again (dask/distributed#6056). The modes:

- ``stock``: distributed's own Active Memory Manager with ``ReduceReplicas``;
- ``amm-rules``: RulesPolicy with an empty rules file (its defaults);
- ``amm-rules+hold Ns``: RulesPolicy with a ``demand:`` section: copies a dependent read
  in the last N seconds are not trimmed, for keys read by at least 100 tasks (one mode
  per value of ``--holds``, 2 and 3 seconds by default);
- ``amm-rules+rule``: RulesPolicy with a rule ``task.reads >= 100`` ->
  ``replicate: {max: all}`` (keep every copy that lands, one per worker at most), which
  holds the copies for as long as the key lives.

Reported per mode (median of ``--repeats`` interleaved runs): bytes transferred between
workers (the workers' ``transfer_incoming_log``: dependency fetches and AMM copies), wall
time from the first wave to the last result, the median time of one wave (submitted to
gathered), peak managed memory summed over the workers, the table's copies just after
the last wave, and the AMM cycles after the last wave until the table is back to one
copy (``-`` if it is not within 20 seconds).

    python -m benchmarks.demand                  # about 12 minutes on 2 cores
    python -m benchmarks.demand --repeats 1      # one run of each mode
    python -m benchmarks.demand --append         # add runs to the results file

Prints a table and writes ``benchmarks/results/demand.json``; each run records the
machine's load average when it started (the numbers depend on it on a shared machine).
``--append`` adds the new runs to those already in the file (same setup and modes) and
reports medians over all of them.
"""

from __future__ import annotations

import os

# Before numpy is imported here or in a worker process (which inherits the environment).
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import AsyncIterator, Generator  # noqa: E402
from contextlib import asynccontextmanager, suppress  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import dask  # noqa: E402
import numpy as np  # noqa: E402
from distributed import Client, LocalCluster, wait  # noqa: E402
from distributed.active_memory_manager import ActiveMemoryManagerPolicy  # noqa: E402

MiB = 2**20
RESULTS = Path(__file__).parent / "results"
AMM = "distributed.scheduler.active-memory-manager"
TABLE_KEY = "table"


@dataclass(frozen=True)
class Setup:
    workers: int = 4
    table_bytes: int = 64 * MiB
    waves: int = 10
    tasks_per_wave: int = 200
    #: Seconds from the start of one wave to the start of the next.
    period: float = 3.0
    #: Seconds one task works (a small task: a lookup and a little arithmetic).
    task_seconds: float = 0.004
    amm_interval: float = 2.0
    memory_limit: int = 1024 * MiB


def modes_for(holds: list[float]) -> tuple[str, ...]:
    return ("stock", "amm-rules", *(f"amm-rules+hold {h:g}s" for h in holds), "amm-rules+rule")


def rules_for(mode: str) -> dict[str, Any] | None:
    if mode == "stock":
        return None
    if mode == "amm-rules":
        return {"version": 1}
    if mode.startswith("amm-rules+hold "):
        hold = mode.split()[-1]
        return {"version": 1, "demand": {"hold": hold, "match": "task.reads >= 100"}}
    return {
        "version": 1,
        "rules": [
            {"name": "shared", "match": "task.reads >= 100", "replicate": {"max": "all"}},
        ],
    }


# --- task functions (pickled by value into the worker processes) ----------------------


def make_table(nbytes: int) -> np.ndarray:
    return np.random.default_rng(0).random(nbytes // 8)


def lookup(i: int, table: np.ndarray, seconds: float) -> float:
    time.sleep(seconds)
    return float(table[(i * 7919) % len(table)])


def incoming_bytes(dask_worker: Any) -> int:
    """Bytes this worker fetched from other workers (dependencies and AMM copies)."""
    return sum(int(entry["total"]) for entry in dask_worker.transfer_incoming_log)


# --- measuring ----------------------------------------------------------------------


class CycleCounter(ActiveMemoryManagerPolicy):
    """An AMM policy that suggests nothing and counts the manager's cycles."""

    def __init__(self) -> None:
        self.cycles = 0

    def run(self) -> Generator[Any, Any, None]:
        self.cycles += 1
        return
        yield  # a generator, as the AMM expects


class Sampler:
    """Managed memory summed over the workers, on the scheduler, in the background."""

    def __init__(self, scheduler: Any, period: float = 0.1):
        self.scheduler = scheduler
        self.period = period
        self.peak = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            total = sum(ws.memory.managed for ws in self.scheduler.workers.values())
            self.peak = max(self.peak, total)
            await asyncio.sleep(self.period)

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task


def copies(scheduler: Any) -> int:
    ts = scheduler.tasks.get(TABLE_KEY)
    return len(ts.who_has or ()) if ts is not None else 0


@asynccontextmanager
async def local_cluster(mode: str, setup: Setup) -> AsyncIterator[tuple[Client, Any]]:
    rules = rules_for(mode)
    policies = (
        [{"class": "distributed.active_memory_manager.ReduceReplicas"}]
        if rules is None
        else [{"class": "amm_rules.RulesPolicy", "rules": rules}]
    )
    config = {
        f"{AMM}.start": True,
        f"{AMM}.interval": f"{setup.amm_interval}s",
        f"{AMM}.policies": policies,
    }
    with dask.config.set(config):
        cluster = LocalCluster(
            n_workers=setup.workers,
            threads_per_worker=1,
            processes=True,
            memory_limit=setup.memory_limit,
            asynchronous=True,
            dashboard_address=None,
        )
        async with cluster, Client(cluster, asynchronous=True) as client:
            await client.wait_for_workers(setup.workers)
            yield client, cluster.scheduler


async def one_run(mode: str, setup: Setup) -> dict[str, Any]:
    load = round(os.getloadavg()[0], 1)
    async with local_cluster(mode, setup) as (client, scheduler):
        counter = CycleCounter()
        scheduler.extensions["amm"].add_policy(counter)
        first = min(scheduler.workers, key=lambda a: str(scheduler.workers[a].name))
        table = client.submit(make_table, setup.table_bytes, key=TABLE_KEY, workers=[first])
        await wait(table)
        before = sum((await client.run(incoming_bytes)).values())
        sampler = Sampler(scheduler)
        sampler.start()
        wave_seconds = []
        t0 = time.monotonic()
        for wave in range(setup.waves):
            start = t0 + wave * setup.period
            await asyncio.sleep(max(0.0, start - time.monotonic()))
            w0 = time.monotonic()
            futures = client.map(
                lookup,
                range(setup.tasks_per_wave),
                table=table,
                seconds=setup.task_seconds,
                key=[f"lookup-{wave}-{i}" for i in range(setup.tasks_per_wave)],
            )
            await client.gather(futures)
            wave_seconds.append(time.monotonic() - w0)
            del futures
        wall = time.monotonic() - t0
        after_last = copies(scheduler)
        cycles_at_end = counter.cycles
        # How many AMM cycles until the table is back to one copy (if it is).
        deadline = time.monotonic() + 20
        while copies(scheduler) > 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        gone = counter.cycles - cycles_at_end if copies(scheduler) == 1 else None
        transferred = sum((await client.run(incoming_bytes)).values()) - before
        await sampler.stop()
        return {
            "transferred_mib": round(transferred / MiB, 1),
            "wall_s": round(wall, 2),
            "wave_s_median": round(statistics.median(wave_seconds), 3),
            "peak_managed_mib": round(sampler.peak / MiB, 1),
            "copies_after_last_wave": after_last,
            "cycles_until_one_copy": gone,
            "load_1min": load,
        }


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each metric's median over the runs (None when any run had None: the copies
    never went back to one); the load over the runs that recorded it."""
    out: dict[str, Any] = {}
    for name in dict.fromkeys(k for r in runs for k in r):
        values = [r.get(name) for r in runs]
        if name == "load_1min":
            values = [v for v in values if v is not None]
            out[name] = statistics.median(values) if values else None
            continue
        out[name] = None if any(v is None for v in values) else statistics.median(values)
    out["runs"] = runs
    return out


def table(results: dict[str, dict[str, Any]], setup: Setup) -> str:
    header = [
        "mode",
        "MiB transferred",
        "x stock",
        "wall s",
        "wave s (median)",
        "peak managed MiB",
        "copies after last wave",
        "cycles until 1 copy",
        "load",
    ]
    stock = results.get("stock", {}).get("transferred_mib") or None
    rows = []
    for mode, r in results.items():
        share = None if not stock else round(r["transferred_mib"] / stock, 2)
        rows.append(
            [
                mode,
                r["transferred_mib"],
                share,
                r["wall_s"],
                r["wave_s_median"],
                r["peak_managed_mib"],
                r["copies_after_last_wave"],
                r["cycles_until_one_copy"],
                r.get("load_1min"),
            ]
        )
    cells = [header] + [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    title = (
        f"{setup.waves} waves of {setup.tasks_per_wave} tasks every {setup.period:g} s, "
        f"a {setup.table_bytes // MiB} MiB table, {setup.workers} workers, AMM every "
        f"{setup.amm_interval:g} s"
    )
    lines = [title]
    for n, row in enumerate(cells):
        lines.append(
            "  ".join(
                v.rjust(w) if i else v.ljust(w)
                for i, (v, w) in enumerate(zip(row, widths, strict=True))
            )
        )
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def previous_runs(path: Path, setup: Setup, modes: tuple[str, ...]) -> dict[str, list[Any]]:
    """The runs already in the results file, for ``--append``."""
    if not path.exists():
        return {m: [] for m in modes}
    doc = json.loads(path.read_text())
    if doc.get("setup") != asdict(setup) or set(doc.get("results", {})) != set(modes):
        raise SystemExit(f"--append: {path} holds results of another setup or other modes")
    return {m: list(doc["results"][m]["runs"]) for m in modes}


async def main(setup: Setup, repeats: int, modes: tuple[str, ...], append: bool) -> None:
    path = RESULTS / "demand.json"
    runs = previous_runs(path, setup, modes) if append else {m: [] for m in modes}
    for n in range(repeats):  # interleaved, so that drifts of the machine hit every mode
        for mode in modes:
            print(f"{mode} ({n + 1}/{repeats})", flush=True)
            runs[mode].append(await one_run(mode, setup))
            print(f"  {runs[mode][-1]}", flush=True)
    results = {mode: median_run(runs[mode]) for mode in modes}
    print()
    print(table(results, setup))
    RESULTS.mkdir(exist_ok=True)
    doc = {
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "note": "a machine shared with other jobs; medians of interleaved runs",
        },
        "setup": asdict(setup),
        "repeats": len(runs[modes[0]]),
        "rules": {mode: rules_for(mode) for mode in modes},
        "results": results,
    }
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"\nwrote {path}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs of each mode (median)")
    parser.add_argument(
        "--holds", type=float, nargs="+", default=[2.0, 3.0], help="demand holds, seconds"
    )
    parser.add_argument("--period", type=float, default=Setup.period, help="seconds per wave")
    parser.add_argument(
        "--append", action="store_true", help="add the runs to those in the results file"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    setup = Setup(period=args.period)
    asyncio.run(main(setup, max(1, args.repeats), modes_for(args.holds), args.append))
