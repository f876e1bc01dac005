"""A leaking workload with and without the ``paused-workers`` section: how long its
workers stay paused and when it completes.

Each run starts a ``LocalCluster`` of worker processes with nannies (two plain workers
and one that runs the leaky tasks, each with a 400 MiB limit, pausing at 50%), persists
nine keys (three per worker), then submits the workload: leaky tasks that each leak
``--leak`` MiB outside Dask's data (:mod:`benchmarks.support.leak`) on the leaky worker, and
ordinary tasks on the others. The leaky worker pauses after five leaky tasks.

- ``without``: the rules have no ``paused-workers`` section. The run stops at
  ``--cap`` seconds if the workload has not completed by then (it does not: the paused
  worker never runs its remaining tasks);
- ``with``: ``after: --after``, ``action: restart``, ``require-unmanaged: 40%``,
  ``max-paused-fraction: 50%``.

Measured per run: the workload's completion time (from its submission), the seconds
workers spent paused in that time (the engine's pause clock, from the scheduler's
status changes), restarts, keys copied off the paused worker, persisted keys lost or
recomputed. Runs alternate between the two modes; the table gives medians.

Usage: ``python -m benchmarks.paused_workers [--repeats N] [--after S] [--cap S]``;
writes ``benchmarks/results/paused_workers.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import dask
from distributed import Client, LocalCluster

from benchmarks.support import leak
from benchmarks.support.cluster import TransitionCounter
from benchmarks.support.leak import held, leaky, worker_config

ROOT = Path(__file__).resolve().parent.parent

RESULTS = ROOT / "benchmarks" / "results" / "paused_workers.json"
LIMIT = 400 * 2**20
HELD = [f"held-{i}" for i in range(9)]
SIZE = 100_000


def rules_text(mode: str, after: float) -> str:
    text = "version: 1\n"
    if mode == "with":
        text += (
            f"paused-workers:\n  after: {after}s\n  action: restart\n"
            "  require-unmanaged: 40%\n  max-paused-fraction: 50%\n"
        )
    return text


def ordinary(i: int) -> int:
    time.sleep(0.05)
    return i


async def one_run(mode: str, args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    rules_file = directory / f"rules-{mode}.yaml"
    rules_file.write_text(rules_text(mode, args.after))
    prefix = "distributed.scheduler.active-memory-manager"
    config = {
        f"{prefix}.start": True,
        f"{prefix}.interval": 0.5,
        f"{prefix}.policies": [{"class": "amm_rules.RulesPolicy", "rules": str(rules_file)}],
        **worker_config(pause=0.5),
    }
    with dask.config.set(config):
        async with (
            LocalCluster(
                n_workers=2,
                threads_per_worker=1,
                processes=True,
                asynchronous=True,
                dashboard_address=":0",
                memory_limit=LIMIT,
            ) as cluster,
            Client(cluster, asynchronous=True) as c,
        ):
            ((_, spec),) = cluster.new_worker_spec().items()
            options = {**spec["options"], "resources": {"LEAKY": 1}, "name": "leaky"}
            cluster.worker_spec["leaky"] = {**spec, "options": options}
            await cluster._correct_state()
            await c.wait_for_workers(3)
            s = cluster.scheduler
            executions = TransitionCounter()
            s.add_plugin(executions, name="executions")
            addresses = list(s.workers)
            persisted = [
                c.submit(held, k, SIZE, key=k, workers=[addresses[i % 3]])
                for i, k in enumerate(HELD)
            ]
            await c.gather(persisted)
            (policy,) = [p for p in s.extensions["amm"].policies if hasattr(p, "paused")]
            paused_before = policy.paused.metrics()["paused_seconds"]
            start = time.monotonic()
            work = [
                c.submit(leaky, i, args.leak, resources={"LEAKY": 1}, pure=False)
                for i in range(args.leaky)
            ] + [c.submit(ordinary, i, pure=False) for i in range(args.ordinary)]
            try:
                await asyncio.wait_for(c.gather(work), args.cap)
                completed = time.monotonic() - start
            except asyncio.TimeoutError:
                completed = None
            metrics = policy.paused.metrics()
            values = await c.gather(persisted)
            return {
                "mode": mode,
                "completed_s": None if completed is None else round(completed, 2),
                "tasks_done": sum(f.done() for f in work),
                "tasks": len(work),
                "paused_s": round(metrics["paused_seconds"] - paused_before, 2),
                "restarted": int(metrics["restarted"]),
                "keys_copied": int(metrics["copies"]),
                "persisted_lost": sum(
                    v != held(k, SIZE) for k, v in zip(HELD, values, strict=True)
                ),
                "persisted_recomputed": sum(executions.processing[k] > 1 for k in HELD),
            }


def median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return (
        round(statistics.median(present), 2) if present and len(present) == len(values) else None
    )


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    leak.ship()
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            for mode in ("without", "with"):
                result = await one_run(mode, args, Path(tmp))
                print(result, flush=True)
                out.append(result)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--after", type=float, default=5.0, help="paused-workers after, s")
    parser.add_argument("--cap", type=float, default=60.0, help="longest wait, s")
    parser.add_argument("--leak", type=int, default=30, help="MiB leaked per leaky task")
    parser.add_argument("--leaky", type=int, default=8, help="leaky tasks")
    parser.add_argument("--ordinary", type=int, default=40, help="ordinary tasks")
    args = parser.parse_args()
    logging.getLogger("distributed").setLevel(logging.CRITICAL)
    logging.getLogger("amm_rules").setLevel(logging.CRITICAL)
    runs = asyncio.run(run(args))
    table = {}
    for mode in ("without", "with"):
        rows = [r for r in runs if r["mode"] == mode]
        table[mode] = {
            "completed_s": median([r["completed_s"] for r in rows]),
            "completed_runs": sum(r["completed_s"] is not None for r in rows),
            "paused_s": median([r["paused_s"] for r in rows]),
            "restarted": median([r["restarted"] for r in rows]),
            "keys_copied": median([r["keys_copied"] for r in rows]),
            "persisted_lost": sum(r["persisted_lost"] for r in rows),
            "persisted_recomputed": sum(r["persisted_recomputed"] for r in rows),
        }
    print(
        f"{'mode':<8} {'completed (median s)':>21} {'runs completed':>15} {'paused s':>9} "
        f"{'restarts':>9} {'keys copied':>12} {'lost':>5} {'recomputed':>11}"
    )
    for mode, row in table.items():
        done = row["completed_s"] if row["completed_s"] is not None else f"> {args.cap:g}"
        print(
            f"{mode:<8} {done!s:>21} {row['completed_runs']:>9} of {args.repeats:<3} "
            f"{row['paused_s']!s:>9} {row['restarted']!s:>9} {row['keys_copied']!s:>12} "
            f"{row['persisted_lost']:>5} {row['persisted_recomputed']:>11}"
        )
    result = {
        "settings": vars(args),
        "python": platform.python_version(),
        "table": table,
        "runs": runs,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
