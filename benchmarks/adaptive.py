"""Adaptive scaling of a ``LocalCluster`` whose data grows to about three workers' memory
and shrinks again, with a ``replicate: 2`` rule on part of it: distributed's own target
and choice of workers to close (``stock``) against the ``adaptive:`` section
(``adaptive``).

Each run starts a ``LocalCluster`` of one worker process (``processes=True``, one
thread, ``memory_limit``) under RulesPolicy with the rule, and ``adapt(minimum=1,
maximum=4)``; the scheduler runs in this process. Spilling and pausing are distributed's
defaults (target 60%, spill 70%, pause 80% of the limit; terminate off). The workload:

1. ``model``: small keys held throughout, which the rule ``precious`` keeps at two
   copies (``replicate: 2``);
2. ``grow``: stages persisted one after the other, ``gap`` seconds apart (the data
   arrives at a pace: files landing, a stream, the steps of an analysis), each of chunks
   made by a short task (a little CPU, much memory: distributed's CPU target asks for
   few workers), until the data is about three workers' memory: three times 40% of the
   limit (what a worker holds under the section's default headroom of 60%; distributed
   spills from 60% of the limit in managed data, or 70% of it in process memory, which
   counts some 100 MiB of the process's own);
3. ``passes``: passes over every chunk, each chunk read where it is by a short task
   (what spilled is read back), and a sum;
4. ``shrink``: the stages released one by one;
5. ``settle``: until no worker came or went for a while (adaptive scales down).

Measured from the scheduler: bytes written to disk and read back (the workers'
``disk-write``/``disk-read`` metrics, summed by the scheduler from heartbeats); wall
time (steps 1 to 4); worker-seconds (the workers running, integrated over the whole run:
the cost); key-seconds below the rule's minimum caused by a scale-down (a key of
``model`` that held its two copies and holds fewer after a worker left); keys computed
twice (recomputed: a worker closed with data that did not leave it); the most workers.

Modes alternate (each first in turn), medians of the repeats; the load average before
each run is recorded. ``--quick``: smaller limits, fewer and smaller stages, for
development (the figures of a quick run prove nothing).

Usage: ``python -m benchmarks.adaptive [--repeats N] [--quick] [--modes stock,adaptive]
[--section JSON] [--plots-only]``; writes ``benchmarks/results/adaptive.json``
(``adaptive-quick.json`` with ``--quick``) and, but for ``--quick``, the plots of
docs/performance.md (:func:`plot`: workers and bytes written to disk over time, first
repeat); needs the ``dev`` extra (matplotlib) for those.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import statistics
import time
from collections.abc import Hashable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import dask
import distributed
import numpy as np
from distributed import Client

from benchmarks.support.cluster import TransitionCounter, spilling_cluster, spilling_config
from benchmarks.support.results import run_header

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PLOT = ROOT / "docs" / "adaptive-workers.png"
#: Seconds between two points of a run's time series (workers, bytes written).
SERIES_S = 0.5
MiB = 2**20
MODES = ("stock", "adaptive")
#: The ``adaptive:`` section of the ``adaptive`` mode (``--section`` changes it).
SECTION: dict[str, Any] = {}
RULE = {"name": "precious", "match": "task.prefix == 'model'", "replicate": 2}
SAMPLE_S = 0.1


@dataclass(frozen=True)
class Shape:
    """The sizes of one series."""

    #: Each worker's memory limit.
    limit: int
    #: One chunk's bytes, and the seconds its task sleeps.
    chunk: int
    delay: float
    #: Stages of growth, and seconds between two; the data at its peak is ``peak``
    #: workers' 40% of the limit.
    stages: int
    gap: float
    peak: float
    #: Passes over the data at its peak, and the seconds each chunk's task sleeps.
    passes: int
    pass_delay: float
    #: Keys of ``model`` and their size.
    model_keys: int
    model_size: int
    #: Seconds between two releases, and without a worker coming or going at the end.
    pause: float
    settle: float

    @property
    def chunks_per_stage(self) -> int:
        peak_bytes = self.peak * 0.4 * self.limit
        return max(1, math.ceil(peak_bytes / self.stages / self.chunk))


FULL = Shape(1024 * MiB, 8 * MiB, 0.05, 6, 6.0, 3.0, 2, 0.05, 8, MiB, 1.0, 10.0)
QUICK = Shape(500 * MiB, 4 * MiB, 0.02, 3, 4.0, 3.0, 1, 0.02, 4, MiB // 2, 0.5, 8.0)
#: Most seconds waited for the cluster to settle at the end.
SETTLE_CAP = 90.0


# -- the workload -------------------------------------------------------------------


def make_chunk(seed: int, nbytes: int, delay: float) -> np.ndarray:
    time.sleep(delay)
    return np.random.default_rng(seed).random(nbytes // 8)


def head_sum(chunk: np.ndarray, delay: float) -> float:
    time.sleep(delay)
    return float(chunk[:100].sum())


def stage_graph(stage: int, shape: Shape) -> dict[Hashable, Any]:
    name = f"chunk-{stage}"
    n = shape.chunks_per_stage
    return {
        (name, i): (make_chunk, stage * 10_000 + i, shape.chunk, shape.delay) for i in range(n)
    }


def model_graph(shape: Shape) -> dict[Hashable, Any]:
    return {
        ("model", i): (make_chunk, 1_000_000 + i, shape.model_size, 0.0)
        for i in range(shape.model_keys)
    }


# -- what is measured ---------------------------------------------------------------


def disk_bytes(s: Any, activity: str) -> int:
    """Bytes the workers' spilling wrote (``disk-write``) or read back (``disk-read``)."""
    return int(
        sum(
            v
            for k, v in s.cumulative_worker_metrics.items()
            if isinstance(k, tuple) and activity in k and k[-1] == "bytes"
        )
    )


class Sampler:
    """Worker-seconds, the most workers, and key-seconds below the rule's minimum after
    a key had reached it (a key falls below it only when a worker holding a copy
    leaves: nothing else drops a copy the rule wants)."""

    def __init__(self, s: Any, model: list[Hashable]):
        self.s = s
        self.model = model
        self.worker_s = 0.0
        self.most = 0
        self.below_key_s = 0.0
        self.reached: set[Hashable] = set()
        self.changed = time.monotonic()
        #: (seconds since the start, workers, MiB written to disk so far, MiB of managed
        #: data in memory), every :data:`SERIES_S`.
        self.series: list[tuple[float, int, float, float]] = []
        self._written0 = disk_bytes(s, "disk-write")
        self._count = 0
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task

    async def _run(self) -> None:
        last = start = time.monotonic()
        point = 0.0
        while not self._stop.is_set():
            await asyncio.sleep(SAMPLE_S)
            now = time.monotonic()
            dt, last = now - last, now
            n = len(self.s.workers)
            if n != self._count:
                self._count, self.changed = n, now
            self.most = max(self.most, n)
            self.worker_s += dt * n
            if now - point >= SERIES_S:
                point = now
                written = (disk_bytes(self.s, "disk-write") - self._written0) / MiB
                managed = sum(ws.memory.managed for ws in self.s.workers.values()) / MiB
                self.series.append((round(now - start, 1), n, round(written), round(managed)))
            for key in self.model:
                ts = self.s.tasks.get(key)
                held = len(ts.who_has or ()) if ts is not None else 0
                if held >= 2:
                    self.reached.add(key)
                elif key in self.reached:
                    self.below_key_s += dt


async def one_run(mode: str, shape: Shape) -> dict[str, Any]:
    rules: dict[str, Any] = {"version": 1, "rules": [RULE]}
    if mode == "adaptive":
        rules["adaptive"] = dict(SECTION)
    load = os.getloadavg()[0]
    with dask.config.set(spilling_config(rules)):
        async with (
            spilling_cluster(1, 1, shape.limit) as cluster,
            Client(cluster, asynchronous=True) as client,
        ):
            s = cluster.scheduler
            counter = TransitionCounter.on(s)
            cluster.adapt(minimum=1, maximum=4)
            model = list(model_graph(shape))
            sampler = Sampler(s, model)
            written0, read0 = disk_bytes(s, "disk-write"), disk_bytes(s, "disk-read")
            start, started = time.monotonic(), time.time()
            sampler.start()
            held = client.get(model_graph(shape), model, sync=False)
            await distributed.wait(held)
            stages = []
            for stage in range(shape.stages):
                if stage:
                    await asyncio.sleep(shape.gap)
                dsk = stage_graph(stage, shape)
                stages.append(client.get(dsk, list(dsk), sync=False))
                await distributed.wait(stages[-1])
            everything = [f for futures in stages for f in futures]
            for _ in range(shape.passes):
                heads = client.map(head_sum, everything, delay=shape.pass_delay, pure=False)
                await client.submit(sum, heads, pure=False)
                del heads
            del everything
            grown = time.monotonic() - start
            while stages:
                stages.pop(0)
                await asyncio.sleep(shape.pause)
            wall = time.monotonic() - start
            # Settled: no worker came or went for a while since the workload ended.
            sampler.changed = max(sampler.changed, time.monotonic())
            while time.monotonic() - sampler.changed < shape.settle:
                if time.monotonic() - start - wall > SETTLE_CAP:
                    break
                await asyncio.sleep(SAMPLE_S)
            await asyncio.sleep(1.5)  # the workers' last heartbeats bring their metrics
            await sampler.stop()
            result = {
                "mode": mode,
                "wall_s": round(wall, 2),
                "grow_s": round(grown, 2),
                "total_s": round(time.monotonic() - start, 2),
                "written": disk_bytes(s, "disk-write") - written0,
                "read_back": disk_bytes(s, "disk-read") - read0,
                "worker_s": round(sampler.worker_s, 1),
                "below_min_key_s": round(sampler.below_key_s, 1),
                "recomputed": counter.recomputed,
                "most_workers": sampler.most,
                "final_workers": len(s.workers),
                "load_before": round(load, 2),
                "series": sampler.series,
                "adapt_log": [
                    (round(t - started, 1), dict(r))
                    for t, r in getattr(cluster._adaptive, "log", [])
                    if t >= started
                ][:50],
            }
            del held
            return result


# -- the series ---------------------------------------------------------------------


async def run(modes: list[str], repeats: int, shape: Shape) -> list[dict[str, Any]]:
    out = []
    for r in range(repeats):
        # Each mode first in turn: drift in the machine's load falls on every mode alike.
        for mode in modes[r % len(modes) :] + modes[: r % len(modes)]:
            result = await one_run(mode, shape)
            result["repeat"] = r
            shown = {k: v for k, v in result.items() if k not in ("adapt_log", "series")}
            print(json.dumps(shown), flush=True)
            out.append(result)
    return out


MEASURES = (
    "wall_s",
    "total_s",
    "written",
    "read_back",
    "worker_s",
    "below_min_key_s",
    "recomputed",
    "most_workers",
    "final_workers",
)


def summarize(runs: list[dict[str, Any]], modes: list[str]) -> dict[str, Any]:
    """Per mode, each measure's median and range; for ``adaptive``, its medians over
    ``stock``'s and the issue's goals."""
    table: dict[str, Any] = {}
    for mode in modes:
        got = [r for r in runs if r["mode"] == mode]
        if got:
            table[mode] = {
                k: {
                    "median": statistics.median(r[k] for r in got),
                    "min": min(r[k] for r in got),
                    "max": max(r[k] for r in got),
                }
                for k in MEASURES
            }
    base, new = table.get("stock"), table.get("adaptive")
    if base is not None and new is not None:

        def ratio(k: str) -> float | None:
            b = base[k]["median"]
            return round(new[k]["median"] / b, 3) if b else None

        ratios = {k: ratio(k) for k in ("written", "wall_s", "worker_s", "read_back")}
        table["ratios"] = ratios
        table["goals"] = {
            "written_at_most_0.3": _at_most(ratios["written"], 0.3, new["written"]["median"]),
            "wall_at_most_0.8": _at_most(ratios["wall_s"], 0.8),
            "worker_s_at_most_1.2": _at_most(ratios["worker_s"], 1.2),
            "zero_below_min": new["below_min_key_s"]["max"] == 0,
        }
    return table


def _at_most(ratio: float | None, bound: float, value: float | None = None) -> bool:
    if ratio is None:
        return value == 0
    return ratio <= bound


def mib(n: float) -> str:
    return f"{n / MiB:,.0f}"


def plain(x: float) -> str:
    return f"{x:g}"


def print_table(table: dict[str, Any], repeats: int) -> None:
    rows = (
        ("wall s", "wall_s", plain),
        ("run s (to settled)", "total_s", plain),
        ("written to disk MiB", "written", mib),
        ("read back MiB", "read_back", mib),
        ("worker-seconds", "worker_s", plain),
        ("key-s below min", "below_min_key_s", plain),
        ("keys recomputed", "recomputed", plain),
        ("most workers", "most_workers", plain),
        ("workers at the end", "final_workers", plain),
    )
    modes = [m for m in MODES if m in table]
    print(f"\n{'':<22}" + "".join(f"{m:>24}" for m in modes))
    for label, key, fmt in rows:
        cells = []
        for m in modes:
            v = table[m][key]
            cells.append(f"{fmt(v['median'])} ({fmt(v['min'])}-{fmt(v['max'])})")
        print(f"{label:<22}" + "".join(f"{c:>24}" for c in cells))
    if "ratios" in table:
        print("adaptive / stock (medians): " + json.dumps(table["ratios"]))
        print("goals: " + json.dumps(table["goals"]))
    print(f"medians (min-max) of {repeats} runs per mode")


def dumps(result: dict[str, Any]) -> str:
    """The benchmark's JSON, short enough to read: one run per line but its series, which
    only the first repeat keeps (for the plot), one line each."""
    lines: list[str] = []
    runs = [
        {k: v for k, v in r.items() if k != "series" or r["repeat"] == 0} for r in result["runs"]
    ]
    for r in runs:
        series = r.pop("series", None)
        line = json.dumps(r)
        if series is not None:
            line = line[:-1] + ', "series": ' + json.dumps(series) + "}"
        lines.append(line)
    head = json.dumps({**result, "runs": []}, indent=2)
    body = ",\n    ".join(lines)
    return head.replace('"runs": []', '"runs": [\n    ' + body + "\n  ]") + "\n"


def plot(data: dict[str, Any], path: Path = PLOT) -> None:
    """The figure of docs/performance.md, from the benchmark's JSON: workers and bytes
    written to disk over the first repeat, per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in data["runs"] if r["repeat"] == 0 and r.get("series")]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5.2), sharex=True)
    for r in sorted(runs, key=lambda r: MODES.index(r["mode"])):
        ts = [p[0] for p in r["series"]]
        (line,) = top.step(ts, [p[1] for p in r["series"]], where="post", label=r["mode"])
        bottom.plot(ts, [p[2] for p in r["series"]], color=line.get_color(), label=r["mode"])
        bottom.plot(
            ts, [p[3] for p in r["series"]], color=line.get_color(), linestyle=":", linewidth=1
        )
        top.axvline(r["wall_s"], color=line.get_color(), linestyle=":", linewidth=1)
    top.set_ylabel("workers")
    top.set_title("Adaptive scaling, first repeat (dotted: the workload ends)")
    top.legend()
    bottom.set_ylabel("MiB")
    bottom.set_xlabel("seconds since the start")
    bottom.set_title("written to disk so far (solid), data in memory (dotted)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="small sizes, for development")
    parser.add_argument("--modes", default=",".join(MODES), help="modes, comma-separated")
    parser.add_argument(
        "--section", default="{}", help="the adaptive mode's adaptive: section, as JSON"
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--plots-only", action="store_true", help="plot the JSON again")
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        parser.error(f"unknown modes {', '.join(unknown)}: {', '.join(MODES)}")
    SECTION.update(json.loads(args.section))
    shape = QUICK if args.quick else FULL
    out = args.json or RESULTS / ("adaptive-quick.json" if args.quick else "adaptive.json")
    if args.plots_only:
        plot(json.loads(out.read_text()))
        return
    logging.getLogger("distributed").setLevel(logging.CRITICAL)
    logging.getLogger("amm_rules").setLevel(logging.CRITICAL)
    started = time.time()
    runs = asyncio.run(run(modes, args.repeats, shape))
    table = summarize(runs, modes)
    print_table(table, args.repeats)
    result = {
        **run_header(started),
        "settings": {
            "repeats": args.repeats,
            "quick": args.quick,
            "shape": {**asdict(shape), "chunks_per_stage": shape.chunks_per_stage},
            "rule": RULE,
            "section": SECTION,
            "adapt": {"minimum": 1, "maximum": 4},
        },
        "table": table,
        "runs": runs,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(dumps(result))
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    if not args.quick:
        plot(result)


if __name__ == "__main__":
    main()
