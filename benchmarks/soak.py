"""A long chaos soak: minutes of workers dying, retiring, pausing and joining under
replication targets while a computation runs.

One in-process scheduler with amm-rules (every held key ``replicate: 3``) and a pool of
in-process workers. Each round starts a computation over the held keys and then, in
turn: kills the busiest holder without warning, kills the two busiest holders at once,
retires the busiest holder, or pauses a worker and kills a holder while it is paused.
New workers join to replace the lost ones, mid-computation. After each round:

- no held key lost its data (fewer holders than its target died at once);
- every target is restored (to what the workers allow) within ``--max-cycles`` cycles;
- the computation's results are right;
- at the end, no held key was ever computed twice (each is computed by a task under
  its own key that counts its runs), and the engine logged no ``error`` event.

The round logic is shared with ``tests/engine/test_chaos.py`` (:mod:`tests.support.chaos`).
From the repository root:

    python -m benchmarks.soak --minutes 3
    python -m benchmarks.soak --minutes 0.5 --workers 8 --keys 40

Prints a table and writes ``benchmarks/results/soak.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import platform
import random
import statistics
import time
from pathlib import Path
from typing import Any

import dask
from distributed import Client, Scheduler, Worker
from distributed.core import Status

from tests.support.chaos import (
    ChaosStats,
    busiest_holders,
    combine,
    held_rules,
    kill,
    kill_round,
    lost,
    make_held,
    recomputed,
    wait_for_targets,
)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "soak.json"
N = 3


async def start_worker(s: Scheduler) -> Worker:
    w = await Worker(s.address, nthreads=1, memory_limit="1 GiB")
    while w.address not in s.workers:
        await asyncio.sleep(0.01)
    return w


async def soak(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    prefix = "distributed.scheduler.active-memory-manager"
    config = {
        f"{prefix}.start": True,
        f"{prefix}.interval": args.interval,
        f"{prefix}.policies": [
            {
                "class": "amm_rules.RulesPolicy",
                "rules": held_rules(N),
                "inflight_timeout": args.inflight_timeout,
            }
        ],
        "distributed.worker.memory.pause": False,  # workers are paused by hand
        "optimization.fuse.active": False,
    }
    names = [f"held-{i}" for i in range(args.keys)]
    stats = ChaosStats(keys=args.keys)
    counts = {"kill": 0, "kill-two": 0, "retire": 0, "pause": 0, "joins": 0}
    failures: list[str] = []
    with dask.config.set(config):
        async with Scheduler(dashboard_address=":0", port=0) as s:
            workers = [await start_worker(s) for _ in range(args.workers)]
            async with Client(s.address, asynchronous=True) as c:
                held = await make_held(c, s, names, N)
                deadline = time.monotonic() + 60 * args.minutes
                round_no = 0
                while time.monotonic() < deadline:
                    kind = ("kill", "kill-two", "retire", "pause")[round_no % 4]
                    round_no += 1
                    try:
                        await one_round(c, s, workers, held, stats, kind, rng, args)
                        counts[kind] += 1
                    except AssertionError as exc:
                        failures.append(f"round {round_no} ({kind}): {exc}")
                    # Replace the lost workers: they join while the next round runs.
                    while len(workers) < args.workers:
                        workers.append(await start_worker(s))
                        counts["joins"] += 1
                final = await c.gather(list(held.values()))
                stats.wrong_results += sum(
                    v != k.encode().ljust(1_000, b".") for k, v in zip(names, final, strict=True)
                )
            errors = [m for _, m in s.get_events("amm-rules") if m["action"] == "error"]
            policy_cycles = s.extensions["amm"].policies.copy().pop().cycles
            for w in workers:
                await w.close()
    stats.recomputed = recomputed(names)
    restore = stats.cycles_to_restore or [0]
    return {
        "minutes": args.minutes,
        "workers": args.workers,
        "keys": args.keys,
        "target": N,
        "amm_interval_s": args.interval,
        "inflight_timeout_s": args.inflight_timeout,
        "rounds": stats.rounds,
        "rounds_by_kind": counts,
        "workers_killed": stats.kills,
        "workers_retired": counts["retire"],
        "workers_joined": counts["joins"],
        "amm_cycles": policy_cycles,
        "results_checked": stats.results_checked,
        "keys_lost": len(stats.lost),
        "keys_recomputed": len(stats.recomputed),
        "wrong_results": stats.wrong_results,
        "engine_error_events": len(errors),
        "cycles_to_restore": {
            "median": statistics.median(restore),
            "max": max(restore),
        },
        "failures": failures,
        "python": platform.python_version(),
    }


async def one_round(
    c: Client,
    s: Scheduler,
    workers: list[Worker],
    held: dict[str, Any],
    stats: ChaosStats,
    kind: str,
    rng: random.Random,
    args: argparse.Namespace,
) -> None:
    keys = list(held)
    if kind in ("kill", "kill-two"):
        await kill_round(
            c,
            s,
            workers,
            held,
            N,
            stats,
            kills=1 if kind == "kill" else 2,
            max_cycles=args.max_cycles,
        )
        return
    futures = [
        c.submit(combine, held[k], held[keys[0]], key=f"combine-{kind}-{stats.rounds}-{k}")
        for k in keys
    ]
    if kind == "retire":
        (leaving,) = busiest_holders(s, keys, 1)
        await c.retire_workers([leaving])
        workers[:] = [w for w in workers if w.address != leaving]
    else:  # pause a worker, kill a holder while it is paused, resume
        paused = rng.choice(workers)
        before = {k for k in keys if paused.address in {ws.address for ws in s.tasks[k].who_has}}
        paused.status = Status.paused
        while s.workers[paused.address].status != Status.paused:
            await asyncio.sleep(0.01)
        victim = next(
            w for w in workers if w is not paused and w.address in busiest_holders(s, keys, 3)
        )
        workers.remove(victim)
        await kill(victim)
        stats.kills += 1
        while victim.address in s.workers:
            await asyncio.sleep(0.01)
        stats.lost += lost(s, keys)
        await asyncio.sleep(20 * args.interval)
        after = {k for k in keys if paused.address in {ws.address for ws in s.tasks[k].who_has}}
        assert after <= before, f"a paused worker received copies: {sorted(after - before)}"
        paused.status = Status.running
    stats.lost += lost(s, keys)
    stats.cycles_to_restore.append(await wait_for_targets(s, keys, N, args.max_cycles))
    results = await c.gather(futures)
    stats.results_checked += len(results)
    stats.rounds += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--workers", type=int, default=10)
    parser.add_argument("--keys", type=int, default=60)
    parser.add_argument("--interval", type=float, default=0.1, help="AMM interval, seconds")
    parser.add_argument("--inflight-timeout", type=float, default=1.0)
    parser.add_argument("--max-cycles", type=int, default=60)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    logging.getLogger("distributed").setLevel(logging.CRITICAL)
    result = asyncio.run(soak(args))
    rows = [
        ("duration", f"{args.minutes} min"),
        ("workers / held keys / target", f"{args.workers} / {args.keys} / {N}"),
        ("rounds", result["rounds"]),
        (
            "workers killed / retired / joined",
            f"{result['workers_killed']} / {result['workers_retired']} / {result['workers_joined']}",
        ),
        ("AMM cycles", result["amm_cycles"]),
        ("results checked", result["results_checked"]),
        (
            "cycles to restore (median / max)",
            f"{result['cycles_to_restore']['median']} / {result['cycles_to_restore']['max']}",
        ),
        ("keys lost", result["keys_lost"]),
        ("keys recomputed", result["keys_recomputed"]),
        ("wrong results", result["wrong_results"]),
        ("engine error events", result["engine_error_events"]),
        ("failed rounds", len(result["failures"])),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    for failure in result["failures"][:10]:
        print(f"FAILURE {failure[:500]}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
