"""Where a retiring worker's keys go: the rules' placement against distributed's own
``RetireWorker``, side by side.

Each scenario builds a small in-process cluster with RulesPolicy attached to the
scheduler's AMM, places data, logs every copy the scheduler records
(:class:`benchmarks.support.retire.ReplicaLog`), retires one or two workers with ``retire_workers`` and
checks what the rules forbid. It runs twice per repeat, interleaved: ``rules`` (the
default) and ``stock`` (``RulesPolicy(retire_by_rules=False)``: RetireWorker places the
keys, the rules move them afterwards). With both in the AMM, which of RetireWorker and
RulesPolicy runs first in a cycle is arbitrary, so the stock outcome varies from run to
run: the table gives, per scenario, in how many runs the rule was broken.

The AMM compares workers by ``managed`` memory (in-process workers share one process,
so the other measures cannot tell them apart).

Usage: ``python -m benchmarks.retirement [--repeats N]``; writes
``benchmarks/results/retirement.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import platform
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import dask
from distributed import Client, Scheduler, Worker

from benchmarks.support.retire import ReplicaLog

ROOT = Path(__file__).resolve().parent.parent

RESULTS = ROOT / "benchmarks" / "results" / "retirement.json"
POOLS = {"gpu": "worker.resources.GPU >= 1", "spot": "worker.resources.SPOT >= 1"}
GPU = {"GPU": 1}
SPOT = {"SPOT": 1}


def config(rules: list[dict[str, Any]], placement: str) -> dict[str, Any]:
    prefix = "distributed.scheduler.active-memory-manager"
    policy = {
        "class": "amm_rules.RulesPolicy",
        "rules": {"version": 1, "pools": POOLS, "rules": rules},
        "retire_by_rules": placement == "rules",
    }
    return {
        f"{prefix}.start": True,
        f"{prefix}.interval": 0.1,
        f"{prefix}.measure": "managed",
        f"{prefix}.policies": [policy],
    }


async def wait_for(condition: Callable[[], bool], timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        await asyncio.sleep(0.02)
    return False


def holders(s: Any, key: str) -> set[str]:
    ts = s.tasks.get(key)
    return {ws.address for ws in (ts.who_has or ())} if ts is not None else set()


async def cluster(
    specs: list[dict[str, Any]], rules: list[dict[str, Any]], placement: str
) -> tuple[Any, Any, list[Any], contextlib.AsyncExitStack]:
    stack = contextlib.AsyncExitStack()
    with dask.config.set(config(rules, placement)):
        s = await stack.enter_async_context(Scheduler(dashboard_address=":0"))
        workers = [
            await stack.enter_async_context(Worker(s.address, nthreads=1, **spec))
            for spec in specs
        ]
    c = await stack.enter_async_context(Client(s.address, asynchronous=True))
    return s, c, workers, stack


async def scatter(c: Any, data: dict[str, Any], worker: Any, kept: list[Any]) -> None:
    kept.append(await c.scatter(data, workers=[worker.address]))


# -- the scenarios: each returns {"broken": bool, ...} -----------------------------------


async def pool(placement: str) -> dict[str, Any]:
    """Keys of pool gpu on gpu0; gpu1 holds more memory than the two CPU workers."""
    rules = [{"name": "device", "match": 'task.key matches "dev-*"', "pool": "gpu"}]
    specs = [{"resources": GPU}, {"resources": GPU}, {}, {}]
    s, c, (gpu0, gpu1, cpu0, cpu1), stack = await cluster(specs, rules, placement)
    async with stack:
        kept: list[Any] = []
        await scatter(c, {"blob": b"." * 2_000_000}, gpu1, kept)
        await scatter(c, {f"dev-{i}": i for i in range(4)}, gpu0, kept)
        log = ReplicaLog(s)
        await c.retire_workers([gpu0.address])
        keys = [f"dev-{i}" for i in range(4)]
        await wait_for(lambda: all(holders(s, k) == {gpu1.address} for k in keys))
        outside = {k for k in keys if log.seen(k) - {gpu1.address}}
        return {"broken": bool(outside), "keys_outside_pool": len(outside)}


async def avoid(placement: str) -> dict[str, Any]:
    """Keys that avoid pool spot on a; the spot workers are the emptiest."""
    rules = [{"name": "safe", "match": 'task.key matches "x-*"', "avoid": "spot"}]
    specs = [{}, {}, {"resources": SPOT}, {"resources": SPOT}]
    s, c, (a, b, spot0, spot1), stack = await cluster(specs, rules, placement)
    async with stack:
        kept: list[Any] = []
        await scatter(c, {"blob": b"." * 2_000_000}, b, kept)
        await scatter(c, {f"x-{i}": i for i in range(4)}, a, kept)
        log = ReplicaLog(s)
        await c.retire_workers([a.address])
        keys = [f"x-{i}" for i in range(4)]
        await wait_for(lambda: all(holders(s, k) == {b.address} for k in keys))
        inside = {k for k in keys if log.seen(k) & {spot0.address, spot1.address}}
        return {"broken": bool(inside), "keys_in_avoided_pool": len(inside)}


async def spread(placement: str) -> dict[str, Any]:
    """replicate: 2, spread: host; the workers of hosts .2 and .3 retire at once (each
    key has a copy on one of them at least); a1 and a2 share host .1."""
    rules = [
        {"name": "spread", "match": 'task.key matches "x-*"', "replicate": 2, "spread": "host"}
    ]
    hosts = ["127.0.0.1", "127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"]
    specs = [{"host": h} for h in hosts]
    s, c, (a1, a2, b, c3, d), stack = await cluster(specs, rules, placement)
    async with stack:
        kept: list[Any] = []
        await scatter(c, {"blob-d": b"." * 3_000_000}, d, kept)
        await scatter(c, {f"x-{i}": i for i in range(4)}, b, kept)
        keys = [f"x-{i}" for i in range(4)]
        await wait_for(lambda: all(len(holders(s, k)) == 2 for k in keys))
        leaving = {b.address, c3.address}
        staying = {k: holders(s, k) - leaving for k in keys}
        log = ReplicaLog(s)
        await c.retire_workers(sorted(leaving))
        await wait_for(lambda: all(len(holders(s, k)) == 2 for k in keys))
        hosts_of = {w.address: w.host for w in (a1, a2, b, c3, d)}
        shared = set()
        for k in keys:
            copies = [hosts_of[w] for w in staying[k] | log.seen(k)]
            if len(set(copies)) < len(copies):
                shared.add(k)
        return {"broken": bool(shared), "keys_with_two_copies_on_a_host": len(shared)}


async def move_never(placement: str) -> dict[str, Any]:
    rules = [{"name": "frozen", "match": 'task.key matches "x-*"', "move": "never"}]
    s, c, (a, b, w3), stack = await cluster([{}, {}, {}], rules, placement)
    async with stack:
        kept: list[Any] = []
        await scatter(c, {f"x-{i}": i for i in range(4)}, a, kept)
        log = ReplicaLog(s)
        retired = await c.retire_workers([a.address])
        copied = {k for k in (f"x-{i}" for i in range(4)) if log.seen(k)}
        return {"broken": bool(copied), "keys_copied": len(copied), "retired": bool(retired)}


async def targets(placement: str) -> dict[str, Any]:
    """replicate: 3 on 5 workers; the worker holding every key retires."""
    rules = [{"name": "three", "match": 'task.key matches "x-*"', "replicate": 3}]
    s, c, workers, stack = await cluster([{}] * 5, rules, placement)
    async with stack:
        kept: list[Any] = []
        leaving = workers[0]
        await scatter(c, {f"x-{i}": i for i in range(4)}, leaving, kept)
        keys = [f"x-{i}" for i in range(4)]
        await wait_for(lambda: all(len(holders(s, k)) == 3 for k in keys))
        await c.retire_workers([leaving.address])
        fewest = min(len(holders(s, k) - {leaving.address}) for k in keys)
        return {"broken": fewest < 3, "fewest_copies_when_retired": fewest}


async def no_recipient(placement: str) -> dict[str, Any]:
    """The only GPU worker retires while holding pool-gpu keys."""
    rules = [{"name": "device", "match": 'task.key matches "dev-*"', "pool": "gpu"}]
    s, c, (gpu0, cpu0, cpu1), stack = await cluster([{"resources": GPU}, {}, {}], rules, placement)
    async with stack:
        kept: list[Any] = []
        await scatter(c, {f"dev-{i}": i for i in range(4)}, gpu0, kept)
        log = ReplicaLog(s)
        retired = await c.retire_workers([gpu0.address])
        copied = {k for k in (f"dev-{i}" for i in range(4)) if log.seen(k)}
        return {
            "broken": bool(copied),
            "keys_copied_outside_pool": len(copied),
            "retired": bool(retired),
        }


SCENARIOS: dict[str, tuple[str, Callable[[str], Awaitable[dict[str, Any]]]]] = {
    "pool": ("a key of pool gpu lands outside it", pool),
    "avoid": ("a key lands in its avoided pool", avoid),
    "spread": ("two copies of a key on one host", spread),
    "move-never": ("a move: never key is copied", move_never),
    "targets": ("below replicate=3 when retire_workers returns", targets),
    "no-recipient": ("a key of pool gpu is copied outside it", no_recipient),
}


async def run(repeats: int) -> dict[str, Any]:
    out: dict[str, Any] = {name: {"rules": [], "stock": []} for name in SCENARIOS}
    for _ in range(repeats):
        for name, (_, scenario) in SCENARIOS.items():
            for placement in ("rules", "stock"):  # interleaved
                out[name][placement].append(await scenario(placement))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=8)
    args = parser.parse_args()
    logging.getLogger("distributed").setLevel(logging.CRITICAL)
    logging.getLogger("amm_rules").setLevel(logging.CRITICAL)
    started = time.time()
    runs = asyncio.run(run(args.repeats))
    rows = []
    for name, (what, _) in SCENARIOS.items():
        broken = {p: sum(r["broken"] for r in runs[name][p]) for p in ("rules", "stock")}
        rows.append((name, what, broken["rules"], broken["stock"]))
    print(
        f"{'scenario':<13} {'broken when':<47} {'rules':>7} {'stock':>7}  (runs of {args.repeats})"
    )
    for name, what, rules_broken, stock_broken in rows:
        print(f"{name:<13} {what:<47} {rules_broken:>7} {stock_broken:>7}")
    result = {
        "repeats": args.repeats,
        "python": platform.python_version(),
        "seconds": round(time.time() - started, 1),
        "broken": {name: {"rules": r, "stock": st} for name, _, r, st in rows},
        "runs": runs,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
