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

It also measures how fast the engine repairs (:class:`RepairWatch`): for every copy of
a held key lost with its worker that left the key short of its target, the time from
its loss (``remove_worker`` removing the copy) to the engine's copy request for the key
(``request_acquire_replicas``), per key and per removed worker (the slowest of its
keys; keys whose copies came back before any request, by a dependency transfer, are
counted apart); the time and AMM cycles from a round's loss to every target restored
(exactly at target), and the cycles until no key is below its target any more (repaired:
copies a computation fetched may be trimmed later), with the most cycles by kind of
round; the early cycles the engine asked for
(:mod:`amm_rules.engine.early`), on average and at most in one second, with their wait
from request to start split into what the debounce and the rate limit chose and how
late the event loop ran the timer; and the event loop's lag over the run (how much
longer than asked a 10 ms sleep took), so that a slow time-to-request can be told from a
loaded loop.

The round logic is shared with ``tests/engine/policy/test_chaos.py`` (:mod:`benchmarks.support.chaos`).
From the repository root:

    python -m benchmarks.soak --minutes 3                  # AMM interval 2 s (the default)
    python -m benchmarks.soak --minutes 3 --interval 0.1   # cycles twenty times as often
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

from benchmarks.support.chaos import (
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
from benchmarks.support.cluster import policy_of
from benchmarks.support.looplag import LoopLag

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "soak.json"
N = 3


class RepairWatch:
    """Times the engine's repairs on a live scheduler: wraps its ``remove_replica``
    (around the engine's own wrapper) and ``request_acquire_replicas`` (what the AMM
    calls to enact a copy)."""

    def __init__(self, s: Scheduler, keys: set[str], target: int):
        self.keys = keys
        self.target = target
        #: Held key short of its target -> monotonic time it lost its copy.
        self.short: dict[str, float] = {}
        #: Removed worker -> (time of its first lost copy, keys waiting for a request,
        #: latencies of those requested so far).
        self.removals: dict[str, tuple[float, set[str], list[float]]] = {}
        self.per_key_s: list[float] = []
        self.per_removal_s: list[float] = []
        #: Short keys whose copies came back before any request (a dependency transfer).
        self.restored_unasked = 0
        remove_replica = s.remove_replica
        add_replica = s.add_replica
        request = s.request_acquire_replicas

        def remove_replica_timed(ts: Any, ws: Any) -> None:
            remove_replica(ts, ws)
            key = ts.key
            if ws.status != Status.closed or key not in self.keys:
                return
            if len(ts.who_has or ()) >= self.target or not ts.who_has:
                return  # not short (replaced before, as a retiring worker's), or lost
            now = time.monotonic()
            self.short.setdefault(key, now)
            removal = self.removals.setdefault(ws.address, (now, set(), []))
            removal[1].add(key)

        def add_replica_timed(ts: Any, ws: Any) -> None:
            add_replica(ts, ws)
            if ts.key in self.short and len(ts.who_has) >= self.target:
                del self.short[ts.key]
                self.restored_unasked += 1
                for address, (_start, waiting, latencies) in list(self.removals.items()):
                    waiting.discard(ts.key)
                    if not waiting:
                        if latencies:
                            self.per_removal_s.append(max(latencies))
                        del self.removals[address]

        def request_timed(addr: str, keys: Any, *, stimulus_id: str) -> Any:
            keys = list(keys)
            now = time.monotonic()
            for key in keys:
                lost_at = self.short.pop(key, None)
                if lost_at is None:
                    continue
                self.per_key_s.append(now - lost_at)
                for address, (start, waiting, latencies) in list(self.removals.items()):
                    if key in waiting:
                        waiting.discard(key)
                        latencies.append(now - start)
                        if not waiting:
                            self.per_removal_s.append(max(latencies))
                            del self.removals[address]
            return request(addr, keys, stimulus_id=stimulus_id)

        s.remove_replica = remove_replica_timed  # type: ignore[method-assign]
        s.add_replica = add_replica_timed  # type: ignore[method-assign]
        s.request_acquire_replicas = request_timed  # type: ignore[method-assign]


def distribution(samples: list[float]) -> dict[str, Any]:
    """Median, 90th percentile (nearest rank) and maximum of samples."""
    if not samples:
        return {"n": 0, "median": None, "p90": None, "max": None}
    ordered = sorted(samples)
    p90 = ordered[min(len(ordered) - 1, max(0, round(0.9 * len(ordered) + 0.5) - 1))]
    return {
        "n": len(ordered),
        "median": statistics.median(ordered),
        "p90": p90,
        "max": ordered[-1],
    }


def early_timings(timings: list[tuple[float, float, float]]) -> dict[str, Any]:
    """Split the early cycles' time from request to start: what the debounce and rate
    limit chose, and how late the loop ran the timer."""
    return {
        "chosen_wait_s": distribution([planned - asked for asked, planned, _ in timings]),
        "timer_late_s": distribution([started - planned for _, planned, started in timings]),
    }


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
                "early_cycle_gap": None if args.no_early else args.early_gap,
            }
        ],
        "distributed.worker.memory.pause": False,  # workers are paused by hand
        "optimization.fuse.active": False,
    }
    names = [f"held-{i}" for i in range(args.keys)]
    stats = ChaosStats(keys=args.keys)
    counts = {"kill": 0, "kill-two": 0, "retire": 0, "pause": 0, "joins": 0}
    cycles_by_kind: dict[str, list[int]] = {k: [] for k in ("kill", "kill-two", "retire", "pause")}
    repair_by_kind: dict[str, list[int]] = {k: [] for k in cycles_by_kind}
    lag = LoopLag()
    failures: list[str] = []
    with dask.config.set(config):
        async with Scheduler(dashboard_address=":0", port=0) as s:
            watch = RepairWatch(s, set(names), N)
            workers = [await start_worker(s) for _ in range(args.workers)]
            async with Client(s.address, asynchronous=True) as c:
                held = await make_held(c, s, names, N)
                started = time.monotonic()
                deadline = started + 60 * args.minutes
                round_no = 0
                lag.start()
                try:
                    while time.monotonic() < deadline:
                        kind = ("kill", "kill-two", "retire", "pause")[round_no % 4]
                        round_no += 1
                        restores = len(stats.cycles_to_restore)
                        repairs = len(stats.cycles_to_repair)
                        try:
                            await one_round(c, s, workers, held, stats, kind, rng, args)
                            counts[kind] += 1
                            cycles_by_kind[kind] += stats.cycles_to_restore[restores:]
                            repair_by_kind[kind] += stats.cycles_to_repair[repairs:]
                        except AssertionError as exc:
                            failures.append(f"round {round_no} ({kind}): {exc}")
                        # Replace the lost workers: they join while the next round runs.
                        while len(workers) < args.workers:
                            workers.append(await start_worker(s))
                            counts["joins"] += 1
                    final = await c.gather(list(held.values()))
                    stats.wrong_results += sum(
                        v != k.encode().ljust(1_000, b".")
                        for k, v in zip(names, final, strict=True)
                    )
                    elapsed = time.monotonic() - started
                finally:
                    lag.stop()  # also when a round raised something else
            errors = [m for _, m in s.get_events("amm-rules") if m["action"] == "error"]
            policy = s.extensions["amm"].policies.copy().pop()
            policy_cycles = policy.cycles
            early = policy.early.status()
            timings = list(policy.early.timings)
            for w in workers:
                await w.close()
    stats.recomputed = recomputed(names)
    restore = stats.cycles_to_restore or [0]
    repair = stats.cycles_to_repair or [0]
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
            "samples": stats.cycles_to_restore,
            "by_kind": cycles_by_kind,
        },
        # Cycles until no key was below its target (restored: exactly at it).
        "cycles_to_repair": {
            "median": statistics.median(repair),
            "max": max(repair),
            "samples": stats.cycles_to_repair,
            "by_kind": repair_by_kind,
        },
        "seconds_to_restore": distribution(stats.seconds_to_restore),
        "seconds_to_request_per_key": distribution(watch.per_key_s),
        "seconds_to_request_per_removal": distribution(watch.per_removal_s),
        "short_keys_never_requested": len(watch.short),
        "short_keys_restored_unasked": watch.restored_unasked,
        "early_cycles": {
            "delay_s": early["delay"],
            "gap_s": early["gap"],
            "requested": early["requested"],
            "ran": early["ran"],
            "superseded": early["superseded"],
            "per_second": early["ran"] / elapsed,
            "max_per_second": early["max_per_second"],
            **early_timings(timings),
        },
        "loop_lag_s": distribution(lag.samples),
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
    policy = policy_of(s)
    since = policy.cycles
    repaired: list[int] = []
    if kind == "retire":
        (leaving,) = busiest_holders(s, keys, 1)
        await c.retire_workers([leaving])
        workers[:] = [w for w in workers if w.address != leaving]
        gone = time.monotonic()
        stats.lost += lost(s, keys)
        restored = await wait_for_targets(
            s, keys, N, args.max_cycles, since=since, repaired=repaired
        )
        seconds = time.monotonic() - gone
    else:  # pause a worker, kill a holder while it is paused, resume
        paused = rng.choice(workers)
        before = {k for k in keys if paused.address in {ws.address for ws in s.tasks[k].who_has}}
        paused.status = Status.paused
        while s.workers[paused.address].status != Status.paused:
            await asyncio.sleep(0.01)
        victim = next(
            w for w in workers if w is not paused and w.address in busiest_holders(s, keys, 3)
        )
        since = policy.cycles
        workers.remove(victim)
        await kill(victim)
        stats.kills += 1
        while victim.address in s.workers:
            await asyncio.sleep(0.01)
        gone = time.monotonic()
        stats.lost += lost(s, keys)
        # The targets come back on the running workers while this one is paused ...
        restored = await wait_for_targets(
            s, keys, N, args.max_cycles, since=since, repaired=repaired
        )
        seconds = time.monotonic() - gone
        # ... and a few more cycles pass: none may send the paused worker a copy.
        cycles = policy.cycles
        while policy.cycles < cycles + 3 and time.monotonic() < gone + 20 * args.interval:
            await asyncio.sleep(0.01)
        after = {k for k in keys if paused.address in {ws.address for ws in s.tasks[k].who_has}}
        assert after <= before, f"a paused worker received copies: {sorted(after - before)}"
        paused.status = Status.running
    stats.cycles_to_restore.append(restored)
    stats.cycles_to_repair += repaired
    stats.seconds_to_restore.append(seconds)
    results = await c.gather(futures)
    stats.results_checked += len(results)
    stats.rounds += 1


def dist_ms(d: dict[str, Any]) -> str:
    """``median / p90 / max`` of a distribution in seconds, as milliseconds."""
    if not d["n"]:
        return "-"
    return (
        f"{d['median'] * 1000:.0f} / {d['p90'] * 1000:.0f} / {d['max'] * 1000:.0f} ms (n={d['n']})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--workers", type=int, default=10)
    parser.add_argument("--keys", type=int, default=60)
    parser.add_argument(
        "--interval", type=float, default=2.0, help="AMM interval, seconds (default: dask's)"
    )
    parser.add_argument(
        "--inflight-timeout", type=float, default=None, help="default: the policy's"
    )
    parser.add_argument(
        "--early-gap", type=float, default=0.1, help="RulesPolicy early_cycle_gap, seconds"
    )
    parser.add_argument("--no-early", action="store_true", help="no early cycles")
    parser.add_argument("--max-cycles", type=int, default=60)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, default=RESULTS)
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
        (
            "cycles to repair: none below target (median / max)",
            f"{result['cycles_to_repair']['median']} / {result['cycles_to_repair']['max']}",
        ),
        ("seconds to restore (median / p90 / max)", dist_ms(result["seconds_to_restore"])),
        ("lost copy to request, per key", dist_ms(result["seconds_to_request_per_key"])),
        (
            "lost copies to requests, per removal",
            dist_ms(result["seconds_to_request_per_removal"]),
        ),
        (
            "short keys restored before a request / never requested",
            f"{result['short_keys_restored_unasked']} / {result['short_keys_never_requested']}",
        ),
        (
            "early cycles: run / asked / answered by another",
            f"{result['early_cycles']['ran']} / {result['early_cycles']['requested']} / "
            f"{result['early_cycles']['superseded']}",
        ),
        (
            "early cycles per second (mean / most in 1 s)",
            f"{result['early_cycles']['per_second']:.2f} / {result['early_cycles']['max_per_second']}",
        ),
        (
            "cycles to restore, most by kind",
            ", ".join(
                f"{k} {max(v, default=0)}"
                for k, v in result["cycles_to_restore"]["by_kind"].items()
            ),
        ),
        (
            "cycles to repair, most by kind",
            ", ".join(
                f"{k} {max(v, default=0)}"
                for k, v in result["cycles_to_repair"]["by_kind"].items()
            ),
        ),
        (
            "early cycle: request to timer (debounce, gap)",
            dist_ms(result["early_cycles"]["chosen_wait_s"]),
        ),
        (
            "early cycle: timer to start (loop late)",
            dist_ms(result["early_cycles"]["timer_late_s"]),
        ),
        (f"event loop lag ({LoopLag.TICK * 1000:.0f} ms sleeps)", dist_ms(result["loop_lag_s"])),
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
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    shown = args.json.relative_to(ROOT) if args.json.is_relative_to(ROOT) else args.json
    print(f"wrote {shown}")


if __name__ == "__main__":
    main()
