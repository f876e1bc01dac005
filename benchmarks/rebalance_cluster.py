"""Rebalancing on a real local cluster, side by side with Dask's own tools.

Each run starts a fresh ``LocalCluster`` (worker processes, one thread each; the scheduler
runs in this process so that its state can be sampled without a network round trip) and
samples every worker's memory on the scheduler a few times a second. Four scenarios:

1. **At rest**: data computed on one worker, nothing else running. ``none`` (Dask's
   defaults: the stock AMM with ``ReduceReplicas``), ``legacy`` (``client.rebalance()``)
   and ``amm-rules`` (RulesPolicy with a ``rebalance`` section). Reported: AMM cycles and
   seconds to converge (max/mean worker memory within 1.15 and nothing in flight), the
   final max/mean, bytes moved against the minimum needed to balance.
2. **Computing**: the same data while waves of tasks keep reading it. ``none`` and
   ``amm-rules``; plus ``legacy``: ``client.rebalance()`` called once while a wave runs,
   which Dask documents as unsafe on a busy cluster. Reported: erred tasks, recomputed
   tasks (a key that started processing twice), wrong results, peak per-worker memory,
   reader throughput.
3. **All-to-all**: ``(x @ x.T).sum()`` on a persisted random matrix of about half the
   cluster's memory (every worker needs every row block: the Active Memory Manager talk's
   tensordot demo at this machine's size). ``amm-off``, ``stock`` (ReduceReplicas),
   ``amm-rules`` (RulesPolicy, rules without rules) and ``amm-rules+rebalance``.
   Reported: peak total and peak per-worker managed memory, peak spilled bytes, wall time.
4. **Scale-up while spilling**: data persisted on two workers, beyond their spill target
   (part of it on disk), then two empty workers join and passes over the data begin (each
   pass sums every chunk). ``stock`` (ReduceReplicas) and ``amm-rules`` (RulesPolicy with a
   ``rebalance`` section at its defaults). Reported: bytes the workers read from and wrote
   to disk during the passes (distributed's per-worker ``disk-read`` and ``disk-write``
   spill metrics), wall time of the passes, and max/mean of the data each worker holds
   (in memory and on disk) over time after the join.

Memory is the scheduler's view: ``managed`` (bytes of the keys a worker holds in RAM, which
is what rebalancing moves and what the ``rebalance`` rules here measure; process memory
includes interpreter and allocator overhead that no placement changes), ``spilled`` and
``process``. Worker processes run single-threaded BLAS.

    python -m benchmarks.rebalance_cluster            # about 50 minutes on 2 cores
    python -m benchmarks.rebalance_cluster --quick    # smaller data, shorter runs, 5 minutes

Scenario 3 runs each mode ``--repeats`` times (default 5), scenario 4 at most 3 times,
interleaved, and reports each metric's median: wall time and peaks vary by several percent
from run to run on a small machine.

Prints a table per scenario, writes ``benchmarks/results/rebalance_cluster.json`` and
the plot ``benchmarks/results/rebalance_cluster.png`` (per-worker managed memory over time, every run).
"""

from __future__ import annotations

import os

# Before numpy is imported here or in a worker process (which inherits the environment):
# one BLAS thread per worker thread, or four workers fight over two cores.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import AsyncIterator  # noqa: E402
from contextlib import asynccontextmanager, suppress  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import dask  # noqa: E402
import dask.array as da  # noqa: E402
import numpy as np  # noqa: E402
from distributed import Client, LocalCluster, wait  # noqa: E402

from amm_rules.engine.rebalance.plan import WorkerLoad, minimum_bytes_to_balance  # noqa: E402
from benchmarks.support.cluster import TransitionCounter  # noqa: E402

MiB = 2**20
GiB = 2**30
RESULTS = Path(__file__).parent / "results"
#: The scenarios, in the order they run (``--only`` picks one).
SCENARIOS = ("at_rest", "computing", "all_to_all", "scale_up")
#: The issue's target for a balanced cluster: fullest worker over the mean.
TARGET_RATIO = 1.15
AMM = "distributed.scheduler.active-memory-manager"
STOCK = [{"class": "distributed.active_memory_manager.ReduceReplicas"}]
#: The rebalance section of scenarios 1 and 2: the documented defaults, measured on managed
#: memory, as the legacy ``client.rebalance()`` is configured here (see the module docstring).
REBALANCE = {
    "enabled": True,
    "measure": "managed",
    "sender-min": "30%",
    "recipient-max": "60%",
    "gap": "10%",
    "max-bytes-per-cycle": "512 MiB",
}
#: Scenario 3 computes while it spills. There a worker that just spilled looks empty to
#: ``managed``; the default ``optimistic`` measure (RAM of the process minus what it
#: recently allocated) is what rebalancing would use on such a cluster.
REBALANCE_COMPUTING = {**REBALANCE, "measure": "optimistic"}
#: Scenario 4: the section as a user writes it, every field at its default (the
#: ``optimistic`` measure: RAM, since a spilled byte moved relieves no RAM).
REBALANCE_SCALE_UP: dict[str, Any] = {}


@dataclass(frozen=True)
class Size:
    workers: int
    #: Scenarios 1 and 2: memory limit per worker, chunks of data on the first worker.
    limit: int
    chunk: int
    chunks: int
    #: Scenario 2: seconds of readers.
    reading: float
    #: Scenario 3: memory limit per worker, the matrix and its chunks.
    matrix_limit: int
    shape: tuple[int, int]
    blocks: tuple[int, int]
    #: Scenario 4: memory limit per worker, data per first worker (a multiple of the
    #: limit: beyond the spill target), chunk size and passes over the data.
    scale_limit: int
    scale_data: float
    scale_chunk: int
    passes: int
    #: Seconds between two memory samples.
    period: float


FULL = Size(
    workers=4,
    limit=2 * GiB,
    chunk=16 * MiB,
    chunks=64,
    reading=30.0,
    matrix_limit=1 * GiB,
    shape=(2048, 131072),
    blocks=(256, 16384),
    scale_limit=1 * GiB,
    scale_data=1.0,
    scale_chunk=16 * MiB,
    passes=4,
    period=0.25,
)
QUICK = Size(
    workers=4,
    limit=1 * GiB,
    chunk=8 * MiB,
    chunks=48,
    reading=12.0,
    matrix_limit=1 * GiB,
    shape=(2048, 32768),
    blocks=(256, 4096),
    scale_limit=512 * MiB,
    scale_data=1.0,
    scale_chunk=8 * MiB,
    passes=2,
    period=0.2,
)


# --- task functions (pickled by value into the worker processes) ----------------------


def make_chunk(i: int, nbytes: int) -> np.ndarray:
    return np.random.default_rng(i).random(nbytes // 8)


def checksum(x: np.ndarray) -> float:
    time.sleep(0.05)  # a reader that takes a moment, so that waves overlap the AMM
    return float(x.sum())


def total(x: np.ndarray) -> float:
    return float(x.sum())


def disk_metrics(dask_worker: Any) -> dict[str, float]:
    """The worker's cumulative spill metrics (``disk-read``/``disk-write`` bytes and
    counts), as its SpillBuffer records them whatever caused the read or write."""
    metrics = getattr(dask_worker.data, "cumulative_metrics", {})
    return {
        f"{label}-{unit}": float(value)
        for (label, unit), value in metrics.items()
        if label in ("disk-read", "disk-write") and unit in ("bytes", "count")
    }


# --- measuring ----------------------------------------------------------------------


class Sampler:
    """Per-worker memory on the scheduler, every ``period`` seconds, in the background."""

    def __init__(self, scheduler: Any, period: float):
        self.scheduler = scheduler
        self.period = period
        #: (seconds since start, {worker name: (managed, spilled, process)})
        self.samples: list[tuple[float, dict[str, tuple[int, int, int]]]] = []
        self._task: asyncio.Task[None] | None = None
        self._t0 = 0.0

    def sample(self) -> None:
        now = time.monotonic() - self._t0
        row = {}
        for ws in self.scheduler.workers.values():
            m = ws.memory
            row[str(ws.name)] = (m.managed, m.spilled, m.process)
        self.samples.append((now, row))

    async def _run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(self.period)

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._task = asyncio.ensure_future(self._run())

    def now(self) -> float:
        """Seconds since the sampling started (the time axis of the samples)."""
        return round(time.monotonic() - self._t0, 2)

    def balance(self, since: float, workers: int) -> list[tuple[float, float]]:
        """(time, max/mean) of the data per worker (in memory and on disk) in the samples
        from ``since`` on that count ``workers`` workers (the scheduler knows a joining
        worker a moment after it is asked for)."""
        out = []
        for t, row in self.samples:
            if t < since or len(row) < workers:
                continue
            data = [m + d for m, d, _ in row.values()]
            mean = sum(data) / len(data)
            if mean:
                out.append((round(t, 2), round(max(data) / mean, 3)))
        return out

    async def stop(self) -> None:
        self.sample()
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task

    def peak(self, field: int | None, total: bool = False) -> int:
        """Peak of a field (0 managed, 1 spilled, 2 process; None: managed + spilled)
        on the fullest worker, or summed over the workers."""

        def value(v: tuple[int, int, int]) -> int:
            return v[0] + v[1] if field is None else v[field]

        values = [
            sum(value(v) for v in row.values()) if total else max(value(v) for v in row.values())
            for _, row in self.samples
            if row
        ]
        return max(values, default=0)

    def series(self) -> dict[str, Any]:
        """Managed and spilled memory per worker in MiB, for the JSON and the plot."""
        names = sorted({n for _, row in self.samples for n in row}, key=str)
        return {
            "t": [round(t, 2) for t, _ in self.samples],
            **{
                f"{field}_mib": {
                    n: [round(row.get(n, (0, 0, 0))[i] / MiB, 1) for _, row in self.samples]
                    for n in names
                }
                for i, field in enumerate(("managed", "spilled"))
            },
        }


def ratio(scheduler: Any) -> float:
    """Fullest worker over the cluster mean, managed memory as fractions of each limit."""
    workers = list(scheduler.workers.values())
    total = sum(ws.memory.managed for ws in workers)
    if not total:
        return 1.0
    mean = total / sum(ws.memory_limit for ws in workers)
    return max(ws.memory.managed / ws.memory_limit for ws in workers) / mean


def loads(scheduler: Any) -> list[WorkerLoad]:
    return [
        WorkerLoad(a, ws.memory.managed, ws.memory_limit) for a, ws in scheduler.workers.items()
    ]


def placement(scheduler: Any, keys: list[str]) -> dict[str, frozenset[str]]:
    return {
        k: frozenset(ws.address for ws in (scheduler.tasks[k].who_has or ()))
        for k in keys
        if k in scheduler.tasks
    }


def bytes_copied(before: dict[str, frozenset[str]], after: dict[str, frozenset[str]], nbytes: int):
    """Bytes of the copies that exist now and did not before (each key ``nbytes``)."""
    return sum(len(after.get(k, frozenset()) - holders) for k, holders in before.items()) * nbytes


def rules_policy(scheduler: Any) -> Any:
    from amm_rules.engine.policy import RulesPolicy

    amm = scheduler.extensions.get("amm")
    found = [p for p in (amm.policies if amm else ()) if isinstance(p, RulesPolicy)]
    return found[0] if found else None


def amm_config(
    mode: str, *, start: bool = True, rebalance: dict[str, Any] = REBALANCE
) -> dict[str, Any]:
    """AMM settings of a mode: ``amm-off``, ``stock``/``none``/``legacy`` (Dask's
    defaults), ``amm-rules`` (no rebalance), ``amm-rules+rebalance`` (with ``rebalance``)."""
    if mode == "amm-off":
        return {f"{AMM}.start": False, f"{AMM}.policies": []}
    if mode in ("stock", "none", "legacy"):
        return {f"{AMM}.start": True, f"{AMM}.policies": STOCK}
    rules: dict[str, Any] = {"version": 1}
    if mode.endswith("rebalance"):
        rules["rebalance"] = rebalance
    policy = {"class": "amm_rules.RulesPolicy", "rules": rules, "summary_interval": 0}
    return {f"{AMM}.start": start, f"{AMM}.policies": [policy]}


@asynccontextmanager
async def local_cluster(
    size: Size, limit: int, config: dict[str, Any], n_workers: int | None = None
) -> AsyncIterator[Any]:
    base = {
        f"{AMM}.interval": "2s",
        # client.rebalance() measures what the rebalance rules measure.
        "distributed.worker.memory.rebalance.measure": "managed",
        "distributed.scheduler.work-stealing": True,
    }
    with dask.config.set({**base, **config}):
        cluster = LocalCluster(
            n_workers=n_workers or size.workers,
            threads_per_worker=1,
            processes=True,
            memory_limit=limit,
            asynchronous=True,
            dashboard_address=None,
        )
        async with cluster, Client(cluster, asynchronous=True) as client:
            yield client, cluster.scheduler, cluster


async def place_on_first_worker(client: Client, scheduler: Any, size: Size) -> list[Any]:
    first = min(scheduler.workers, key=lambda a: str(scheduler.workers[a].name))
    keys = [f"data-{i}" for i in range(size.chunks)]
    futures = client.map(
        make_chunk, range(size.chunks), [size.chunk] * size.chunks, key=keys, workers=[first]
    )
    await wait(futures)
    return futures


async def converge(client: Client, scheduler: Any, timeout: float) -> dict[str, Any]:
    """Run the AMM until max/mean is within target and nothing is in flight."""
    policy = rules_policy(scheduler)
    start_cycles = policy.cycles
    t0 = time.monotonic()
    await client.amm.start()
    while time.monotonic() - t0 < timeout:
        if ratio(scheduler) <= TARGET_RATIO and not policy.rebalancer.book.pending:
            break
        await asyncio.sleep(0.05)
    return {
        "converged": ratio(scheduler) <= TARGET_RATIO,
        "seconds": round(time.monotonic() - t0, 2),
        "cycles": policy.cycles - start_cycles,
    }


# --- scenarios ------------------------------------------------------------------------


async def at_rest(size: Size, mode: str) -> dict[str, Any]:
    config = amm_config("amm-rules+rebalance", start=False) if mode == "amm-rules" else {}
    async with local_cluster(size, size.limit, config or amm_config(mode)) as (client, s, _):
        futures = await place_on_first_worker(client, s, size)
        keys = [f.key for f in futures]
        await asyncio.sleep(1.0)  # let heartbeats report
        before = placement(s, keys)
        minimum = minimum_bytes_to_balance(loads(s))
        initial = ratio(s)
        sampler = Sampler(s, size.period)
        sampler.start()
        out: dict[str, Any] = {"initial_ratio": round(initial, 3)}
        t0 = time.monotonic()
        if mode == "legacy":
            await client.rebalance()
            out.update(converged=ratio(s) <= TARGET_RATIO, seconds=round(time.monotonic() - t0, 2))
            out["cycles"] = None
            await asyncio.sleep(4.0)  # the stock AMM may trim what the command copied
        elif mode == "amm-rules":
            out.update(await converge(client, s, timeout=120.0))
            await asyncio.sleep(6.0)  # a few more cycles: nothing more should move
            policy = rules_policy(s)
            out["amm_bytes_copied"] = policy.rebalancer.totals["bytes"]
            out["cycles_that_moved"] = sum(
                1 for e in s.get_events("amm-rules") if e[1].get("rebalance", {}).get("moves")
            )
        else:
            await asyncio.sleep(6.0)
            out.update(converged=initial <= TARGET_RATIO, seconds=None, cycles=None)
        await sampler.stop()
        after = placement(s, keys)
        copied = bytes_copied(before, after, size.chunk)
        out.update(
            final_ratio=round(ratio(s), 3),
            bytes_copied=copied,
            minimum_bytes=minimum,
            copied_over_minimum=round(copied / minimum, 3) if minimum else None,
            keys_lost=sum(1 for k in keys if not after.get(k)),
            extra_copies=sum(len(h) - 1 for h in after.values() if h),
            series=sampler.series(),
        )
        return out


async def computing(size: Size, mode: str) -> dict[str, Any]:
    config = amm_config("amm-rules+rebalance") if mode == "amm-rules" else amm_config("none")
    expected = [float(make_chunk(i, size.chunk).sum()) for i in range(size.chunks)]
    async with local_cluster(size, size.limit, config) as (client, s, _):
        counter = TransitionCounter()
        s.add_plugin(counter, name="benchmark-transitions")
        futures = await place_on_first_worker(client, s, size)
        sampler = Sampler(s, size.period)
        sampler.start()
        wrong = waves = readers = 0
        legacy: dict[str, Any] | None = None
        legacy_task = None
        t0 = time.monotonic()
        wave = 0
        width = max(4, size.chunks // 4)
        while time.monotonic() - t0 < size.reading:
            first = wave * width // 2 % size.chunks  # overlapping, rotating windows
            part = [(first + j) % size.chunks for j in range(width)]
            readers_f = client.map(
                checksum, [futures[i] for i in part], key=[f"sum-{wave}-{i}" for i in part]
            )
            if mode == "legacy" and wave == 2:
                legacy_task = asyncio.ensure_future(_legacy_once(client))
            try:
                got = await client.gather(readers_f)
            except Exception as exc:  # an erred reader: counted, the run goes on
                got = []
                wrong += width
                logging.getLogger(__name__).warning("wave %d failed: %r", wave, exc)
            wrong += sum(
                1 for i, v in zip(part, got, strict=False) if not math.isclose(v, expected[i])
            )
            readers += len(got)
            waves += 1
            wave += 1
            del readers_f
        elapsed = time.monotonic() - t0
        if legacy_task is not None:
            legacy = await legacy_task
        await asyncio.sleep(2.0)
        await sampler.stop()
        final = await client.gather(futures)
        data_ok = all(math.isclose(float(x.sum()), expected[i]) for i, x in enumerate(final))
        policy = rules_policy(s)
        out = {
            "waves": waves,
            "readers_per_second": round(readers / elapsed, 2),
            "erred": sum(counter.erred.values()),
            "recomputed": counter.recomputed,
            "wrong_results": wrong,
            "data_intact": data_ok,
            "final_ratio": round(ratio(s), 3),
            "peak_worker_managed": sampler.peak(0),
            "peak_worker_process": sampler.peak(2),
            "series": sampler.series(),
        }
        if policy is not None:
            out["amm_moves"] = policy.rebalancer.totals["moves"]
            out["amm_bytes_copied"] = policy.rebalancer.totals["bytes"]
            out["amm_void"] = dict(policy.rebalancer.void_reasons)
        if legacy is not None:
            out["legacy_call"] = legacy
        return out


async def _legacy_once(client: Client) -> dict[str, Any]:
    t0 = time.monotonic()
    try:
        await client.rebalance()
    except Exception as exc:
        return {"raised": f"{type(exc).__name__}: {exc}"[:300], "seconds": time.monotonic() - t0}
    return {"raised": None, "seconds": round(time.monotonic() - t0, 2)}


async def all_to_all(size: Size, mode: str) -> dict[str, Any]:
    config = amm_config(mode, rebalance=REBALANCE_COMPUTING)
    async with local_cluster(size, size.matrix_limit, config) as (client, s, _):
        rng = da.random.default_rng(42)
        x = rng.random(size.shape, chunks=size.blocks)
        x = client.persist(x)
        await wait(x)
        await asyncio.sleep(1.0)
        sampler = Sampler(s, size.period)
        sampler.start()
        t0 = time.monotonic()
        result = await client.compute((x @ x.T).sum())
        wall = time.monotonic() - t0
        # Replicas of x made for the computation and still held a few AMM cycles later.
        await asyncio.sleep(6.0)
        await sampler.stop()
        left = sum(ws.memory.managed_total for ws in s.workers.values())
        policy = rules_policy(s)
        out = {
            "wall_seconds": round(wall, 2),
            "result": float(result),
            "matrix_bytes": int(x.nbytes),
            "peak_total_managed": sampler.peak(0, total=True),
            "peak_worker_managed": sampler.peak(0),
            "peak_spilled": sampler.peak(1, total=True),
            "peak_total_data": sampler.peak(None, total=True),
            "peak_worker_data": sampler.peak(None),
            "data_left_after": left,
            "peak_worker_process": sampler.peak(2),
            "series": sampler.series(),
        }
        if policy is not None:
            out["amm_moves"] = policy.rebalancer.totals["moves"]
            out["amm_bytes_copied"] = policy.rebalancer.totals["bytes"]
        return out


async def scale_up(size: Size, mode: str) -> dict[str, Any]:
    """Scenario 4: two workers hold data beyond their spill target; two empty workers
    join; passes over the data start at once (see the module docstring)."""
    if mode == "amm-rules":
        config = amm_config("amm-rules+rebalance", rebalance=REBALANCE_SCALE_UP)
    else:
        config = amm_config("stock")
    chunks = 2 * int(size.scale_data * size.scale_limit) // size.scale_chunk
    async with local_cluster(size, size.scale_limit, config, n_workers=2) as (client, s, cluster):
        first = sorted(s.workers, key=lambda a: str(s.workers[a].name))
        keys = [f"data-{i}" for i in range(chunks)]
        futures = [
            client.submit(make_chunk, i, size.scale_chunk, key=k, workers=[first[i % 2]])
            for i, k in enumerate(keys)
        ]
        await wait(futures)
        await asyncio.sleep(2.0)  # heartbeats report memory and spilled bytes
        out: dict[str, Any] = {
            "chunks": chunks,
            "data_bytes": chunks * size.scale_chunk,
            "spilled_before_join": sum(ws.memory.spilled for ws in s.workers.values()),
        }
        sampler = Sampler(s, size.period)
        sampler.start()
        await asyncio.sleep(1.0)
        before = await client.run(disk_metrics)
        joined = sampler.now()
        cluster.scale(size.workers)
        await client.wait_for_workers(size.workers)
        t0 = time.monotonic()
        passes = []
        for p in range(size.passes):
            start = time.monotonic()
            parts = client.map(total, futures, key=[f"total-{p}-{i}" for i in range(chunks)])
            got = await client.gather(parts)
            del parts
            passes.append(
                {
                    "seconds": round(time.monotonic() - start, 2),
                    "sum": sum(got),
                    "t": sampler.now(),
                }
            )
        wall = time.monotonic() - t0
        after = await client.run(disk_metrics)
        await sampler.stop()
        out.update(_disk_delta(before, after))
        balance = sampler.balance(joined, size.workers)
        during = [r for t, r in balance if t <= passes[-1]["t"]]
        policy = rules_policy(s)
        out.update(
            wall_seconds=round(wall, 2),
            pass_seconds=[p["seconds"] for p in passes],
            same_sums=len({round(p["sum"], 6) for p in passes}) == 1,
            balance_at_join=balance[0][1] if balance else None,
            balance_mean=round(statistics.fmean(during), 3) if during else None,
            balance_max=max(during, default=None),
            balance_end=during[-1] if during else None,
            balance_series=balance,
            events={"join": joined, "passes_end": [p["t"] for p in passes]},
            series=sampler.series(),
        )
        if policy is not None:
            out["amm_moves"] = policy.rebalancer.totals["moves"]
            out["amm_bytes_copied"] = policy.rebalancer.totals["bytes"]
        return out


def _disk_delta(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]):
    """Bytes and counts read and written by every worker between two snapshots (workers
    that joined in between start from 0), in total and per worker."""
    per_worker = {
        w: {k: v - before.get(w, {}).get(k, 0.0) for k, v in metrics.items()}
        for w, metrics in after.items()
    }
    names = ("disk-read-bytes", "disk-write-bytes", "disk-read-count", "disk-write-count")
    totals = {n.replace("-", "_"): sum(m.get(n, 0.0) for m in per_worker.values()) for n in names}
    return {**{k: int(v) for k, v in totals.items()}, "disk_per_worker": per_worker}


# --- reporting ------------------------------------------------------------------------


def _mib(n: Any) -> str:
    return "-" if n is None else f"{n / MiB:,.0f}"


def table(title: str, header: list[str], rows: list[list[Any]]) -> str:
    """A plain-text table; empty for a scenario that did not run (``--only``)."""
    if not rows:
        return ""
    cells = [header] + [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
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


def report(results: dict[str, dict[str, dict[str, Any]]]) -> str:
    out = []
    r1 = results.get("at_rest", {})
    out.append(
        table(
            "1. Imbalanced cluster at rest",
            [
                "mode",
                "cycles",
                "seconds",
                "max/mean before",
                "after",
                "MiB copied",
                "min MiB",
                "copied/min",
            ],
            [
                [
                    m,
                    r["cycles"],
                    r["seconds"],
                    r["initial_ratio"],
                    r["final_ratio"],
                    _mib(r["bytes_copied"]),
                    _mib(r["minimum_bytes"]),
                    r["copied_over_minimum"],
                ]
                for m, r in r1.items()
            ],
        )
    )
    r2 = results.get("computing", {})
    out.append(
        table(
            "2. Imbalanced cluster while tasks read the data",
            [
                "mode",
                "erred",
                "recomputed",
                "wrong",
                "data ok",
                "readers/s",
                "max/mean",
                "peak worker MiB",
                "legacy call",
            ],
            [
                [
                    m,
                    r["erred"],
                    r["recomputed"],
                    r["wrong_results"],
                    r["data_intact"],
                    r["readers_per_second"],
                    r["final_ratio"],
                    _mib(r["peak_worker_managed"]),
                    (r.get("legacy_call") or {}).get("raised", "-") if "legacy_call" in r else "-",
                ]
                for m, r in r2.items()
            ],
        )
    )
    r3 = results.get("all_to_all", {})
    out.append(
        table(
            "3. All-to-all: (x @ x.T).sum()",
            [
                "mode",
                "wall s",
                "peak total MiB",
                "peak worker MiB",
                "peak spilled MiB",
                "peak data MiB",
                "data left MiB",
                "result",
            ],
            [
                [
                    m,
                    r["wall_seconds"],
                    _mib(r["peak_total_managed"]),
                    _mib(r["peak_worker_managed"]),
                    _mib(r["peak_spilled"]),
                    _mib(r["peak_total_data"]),
                    _mib(r["data_left_after"]),
                    f"{r['result']:.6e}",
                ]
                for m, r in r3.items()
            ],
        )
    )
    r4 = results.get("scale_up", {})
    out.append(
        table(
            "4. Two workers join a spilling cluster; passes over the data",
            [
                "mode",
                "disk read MiB",
                "disk written MiB",
                "wall s",
                "s per pass",
                "max/mean at join",
                "mean",
                "end",
                "moved MiB",
            ],
            [
                [
                    m,
                    _mib(r["disk_read_bytes"]),
                    _mib(r["disk_write_bytes"]),
                    r["wall_seconds"],
                    " ".join(str(p) for p in r["pass_seconds"]),
                    r["balance_at_join"],
                    r["balance_mean"],
                    r["balance_end"],
                    _mib(r.get("amm_bytes_copied")),
                ]
                for m, r in r4.items()
            ],
        )
    )
    return "\n\n".join(t for t in out if t)


def plot(results: dict[str, dict[str, dict[str, Any]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    titles = {
        "at_rest": "at rest",
        "computing": "computing",
        "all_to_all": "all-to-all",
        "scale_up": "2 workers join",
    }
    ncols = max(len(v) for v in results.values())
    fig, axes = plt.subplots(
        len(results), ncols, figsize=(3.3 * ncols, 2.5 * len(results)), squeeze=False
    )
    for row, (scenario, runs) in enumerate(results.items()):
        for col in range(ncols):
            ax = axes[row][col]
            if col >= len(runs):
                ax.axis("off")
                continue
            mode, r = list(runs.items())[col]
            series = r["series"]
            # The all-to-all runs are capped by spilling: there, managed + spilled shows
            # the copies each worker holds; elsewhere nothing spills.
            with_spilled = scenario in ("all_to_all", "scale_up")
            for name, values in series["managed_mib"].items():
                if with_spilled:
                    values = [
                        m + d for m, d in zip(values, series["spilled_mib"][name], strict=True)
                    ]
                ax.plot(series["t"], values, linewidth=1, label=f"worker {name}")
            events = r.get("events") or {}
            if "join" in events:  # the join and the end of each pass
                ax.axvline(events["join"], color="black", linewidth=0.8)
                for t in events.get("passes_end", ()):
                    ax.axvline(t, color="grey", linewidth=0.6, linestyle=":")
            ax.set_title(f"{titles[scenario]}: {mode}", fontsize=9)
            ax.tick_params(labelsize=7)
            ax.set_xlabel("s", fontsize=7)
            if col == 0:
                ax.set_ylabel(
                    "managed + spilled MiB" if with_spilled else "managed MiB", fontsize=8
                )
    axes[0][0].legend(fontsize=6, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)


def dump_json(doc: Any) -> str:
    """Indented JSON with each list of numbers (the time series) on one line, so that the
    file stays small and a re-run shows up as a readable diff."""
    text = json.dumps(doc, indent=1, default=str)
    return (
        re.sub(
            r"\[\s*(-?[\d.e+-]+(?:,\s*-?[\d.e+-]+)*)\s*\]",
            lambda m: "[" + ", ".join(v.strip() for v in m[1].split(",")) + "]",
            text,
        )
        + "\n"
    )


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each numeric metric's median over the repeats; the first run's series; every
    repeat's metrics under ``repeats``."""
    out = dict(runs[0])
    for name, value in runs[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = statistics.median(r[name] for r in runs)
    out["repeats"] = [
        {k: v for k, v in r.items() if k not in ("series", "balance_series")} for r in runs
    ]
    return out


async def main(quick: bool, repeats: int, only: str | None = None) -> None:
    size = QUICK if quick else FULL
    scenarios = [only] if only else list(SCENARIOS)
    results: dict[str, dict[str, dict[str, Any]]] = {name: {} for name in scenarios}
    if "at_rest" in results:
        for mode in ("none", "legacy", "amm-rules"):
            print(f"at rest: {mode}", flush=True)
            results["at_rest"][mode] = await at_rest(size, mode)
    if "computing" in results:
        for mode in ("none", "amm-rules", "legacy"):
            print(f"computing: {mode}", flush=True)
            results["computing"][mode] = await computing(size, mode)
    if "all_to_all" in results:
        modes = ("amm-off", "stock", "amm-rules", "amm-rules+rebalance")
        runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
        for n in range(repeats):  # interleaved, so that drifts of the machine hit every mode
            for mode in modes:
                print(f"all-to-all: {mode} ({n + 1}/{repeats})", flush=True)
                runs[mode].append(await all_to_all(size, mode))
        for mode in modes:
            results["all_to_all"][mode] = median_run(runs[mode])
    if "scale_up" in results:
        modes = ("stock", "amm-rules")
        runs = {m: [] for m in modes}
        scale_repeats = min(repeats, 3)  # each run is a few minutes
        for n in range(scale_repeats):
            for mode in modes:
                print(f"scale-up: {mode} ({n + 1}/{scale_repeats})", flush=True)
                runs[mode].append(await scale_up(size, mode))
        for mode in modes:
            results["scale_up"][mode] = median_run(runs[mode])

    print()
    print(report(results))
    RESULTS.mkdir(exist_ok=True)
    suffix = ("-quick" if quick else "") + (f"-{only}" if only else "")
    doc = {
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
        "size": size.__dict__,
        "rebalance_rules": REBALANCE,
        "rebalance_rules_all_to_all": REBALANCE_COMPUTING,
        "rebalance_rules_scale_up": REBALANCE_SCALE_UP,
        "target_ratio": TARGET_RATIO,
        "results": results,
    }
    (RESULTS / f"rebalance_cluster{suffix}.json").write_text(dump_json(doc))
    plot(results, RESULTS / f"rebalance_cluster{suffix}.png")
    print(
        f"\nwrote {RESULTS / f'rebalance_cluster{suffix}.json'} and rebalance_cluster{suffix}.png"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller data, shorter runs")
    parser.add_argument(
        "--repeats", type=int, default=5, help="runs of each all-to-all mode (median reported)"
    )
    parser.add_argument(
        "--only",
        choices=SCENARIOS,
        help="run one scenario; results go to rebalance_cluster-SCENARIO.json and .png",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(main(args.quick, 1 if args.quick else max(1, args.repeats), args.only))
