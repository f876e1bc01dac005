"""A worker that must leave before a deadline: distributed's retirement, the rules'
retirement and the rules' drain, each SIGKILLed at the same deadline.

The cluster: a scheduler (in this process, RulesPolicy in its AMM) and four ``dask
worker`` processes with nannies, all in a network namespace whose loopback sends at most
``--mbit`` megabits per second (:mod:`benchmarks.support.throttle`): the link of a
machine, shared by every transfer. One worker, *the leaving one*, holds data of mixed
value, each key held only there but the pinned ones:

- ``cheap-*``: large keys (``--cheap-mib`` each) computed in a few milliseconds;
- ``dear-*``: small keys (256 KiB) that took ``--dear-seconds`` each to compute;
- ``pin-*``: keys under ``replicate: {min: 2}`` (4 MiB, 0.2 s each), one copy there and
  one elsewhere.

Together they cannot all leave within ``--deadline`` at that rate. At the *notice* the
leaving worker is told to go, by each mode in turn, and at the deadline its process
group (nanny and worker) is SIGKILLed, as a spot instance or a pod past its grace period:

- ``stock``: ``client.retire_workers`` with ``RulesPolicy(retire_by_rules=False)``
  (distributed's ``RetireWorker`` places the keys);
- ``rules``: ``client.retire_workers`` with the rules placing the keys (no deadline, no
  order);
- ``drain``: ``amm_rules.drain(worker, deadline=..., close=True)``.

Measured, per run: compute seconds recomputed after the kill (the measured duration of
each lost key's task, from the scheduler's task groups), keys lost by kind, pinned keys
left below their minimum at the kill, bytes moved off the leaving worker before it died,
and the time from the notice to each key's safety (its first copy elsewhere); for the
drain also its first prediction beside what happened.

Usage: ``python -m benchmarks.drain [--repeats N] [--deadline S] [--mbit R]``; needs
root, ``ip`` and ``tc`` (the throttled namespace); about 4 minutes. Writes
``benchmarks/results/drain.json`` (or ``--json PATH``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import dask
from dask.utils import key_split

from benchmarks.support.throttle import run_throttled, unavailable

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "drain.json"
MODES = ("stock", "rules", "drain")
STAYING = 3
RULES = {
    "version": 1,
    "rules": [{"name": "pinned", "match": 'task.key matches "pin-*"', "replicate": {"min": 2}}],
}


def cheap(i: int, mib: int) -> bytes:
    return bytes([i % 256]) * (mib * 2**20)


def dear(i: int, seconds: float) -> bytes:
    time.sleep(seconds)
    return bytes([i % 256]) * 2**18


def pinned(i: int) -> bytes:
    time.sleep(0.2)
    return bytes([i % 256]) * 4 * 2**20


class Safety:
    """When each key got its first copy off the leaving worker (scheduler side)."""

    def __init__(self, scheduler: Any, leaving: str, keys: set[Hashable]):
        self.times: dict[Hashable, float] = {}
        self.bytes = 0
        self.notice = time.monotonic()
        self.stopped = False
        inner = scheduler.add_replica

        def add_replica(ts: Any, ws: Any) -> None:
            inner(ts, ws)
            if self.stopped:
                return  # after the kill: copies of recomputed keys
            if ws.address != leaving and ts.key in keys and ts.key not in self.times:
                self.times[ts.key] = time.monotonic() - self.notice
                self.bytes += ts.nbytes

        scheduler.add_replica = add_replica


async def one_run(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """One mode, once: a fresh cluster, the notice, the kill, the repair."""
    from distributed import Client, Scheduler

    import amm_rules

    policy = {"class": "amm_rules.RulesPolicy", "rules": RULES}
    if mode == "stock":
        policy["retire_by_rules"] = False
    config = {
        "distributed.scheduler.active-memory-manager.start": True,
        "distributed.scheduler.active-memory-manager.interval": 0.5,
        "distributed.scheduler.active-memory-manager.policies": [policy],
        "distributed.scheduler.worker-ttl": None,
        # The data stays where it was computed: on the leaving worker.
        "distributed.scheduler.work-stealing": False,
    }
    with dask.config.set(config):
        async with Scheduler(host="127.0.0.1", port=0, dashboard_address=":0") as s:
            procs = [
                _worker(s.address, name)
                for name in ["leaving"] + [f"w{i}" for i in range(STAYING)]
            ]
            try:
                async with Client(s.address, asynchronous=True) as c:
                    await c.wait_for_workers(STAYING + 1, timeout=120)
                    return await _scenario(mode, args, s, c, procs[0], amm_rules)
            finally:
                for p in procs:
                    _kill(p)


def _worker(address: str, name: str) -> subprocess.Popen[bytes]:
    command = [
        sys.executable,
        "-m",
        "distributed.cli.dask_worker",
        address,
        "--name",
        name,
        "--nthreads",
        "4",
        "--memory-limit",
        "4GiB",
    ]
    return subprocess.Popen(
        command, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def _kill(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=30)


async def _scenario(
    mode: str, args: argparse.Namespace, s: Any, c: Any, proc: Any, amm_rules: Any
) -> dict[str, Any]:
    (leaving,) = [a for a, ws in s.workers.items() if ws.name == "leaving"]
    loose = {"workers": [leaving], "allow_other_workers": True}
    futures = [
        c.submit(cheap, i, args.cheap_mib, key=f"cheap-{i}", **loose) for i in range(args.cheap)
    ]
    futures += [
        c.submit(dear, i, args.dear_seconds, key=f"dear-{i}", **loose) for i in range(args.dear)
    ]
    futures += [c.submit(pinned, i, key=f"pin-{i}", **loose) for i in range(args.pinned)]
    await _wait(futures)
    keys = {f.key for f in futures}
    deadline_ = time.monotonic() + 120
    while not all(
        len(s.tasks[k].who_has or ()) == (2 if key_split(k) == "pin" else 1) for k in keys
    ):
        if time.monotonic() > deadline_:
            raise RuntimeError("the data did not settle (pinned keys at 2 copies, others at 1)")
        await asyncio.sleep(0.2)
    on_leaving = {k for k in keys if any(ws.address == leaving for ws in s.tasks[k].who_has)}
    cost = {k: _duration(s, k) for k in keys}
    safety = Safety(s, leaving, on_leaving)
    notice = time.monotonic()
    if mode == "drain":
        task = asyncio.ensure_future(
            amm_rules.drain([leaving], deadline=args.deadline, close=True, client=c)
        )
    else:
        task = asyncio.ensure_future(c.retire_workers([leaving]))
    measured = asyncio.ensure_future(_measured_prediction(c, leaving)) if mode == "drain" else None
    await asyncio.sleep(max(0.0, notice + args.deadline - time.monotonic()))
    killed = proc.poll() is None and leaving in s.workers
    _kill(proc)
    safety.stopped = True
    # What the kill left: lost keys, pinned keys below their minimum.
    deadline_ = time.monotonic() + 30
    while leaving in s.workers and time.monotonic() < deadline_:
        await asyncio.sleep(0.05)
    lost = [k for k in keys if s.tasks[k].state != "memory" or not s.tasks[k].who_has]
    below = [k for k in keys if key_split(k) == "pin" and len(s.tasks[k].who_has or ()) < 2]
    drained = None
    if mode == "drain":
        with contextlib.suppress(Exception):
            drained = await asyncio.wait_for(task, 40)
    else:
        task.cancel()
    await _wait(futures, timeout=300)  # recomputed
    by_kind: dict[str, dict[str, Any]] = {}
    for kind in ("pin", "dear", "cheap"):
        mine = [k for k in on_leaving if key_split(k) == kind]
        times = sorted(safety.times[k] for k in mine if k in safety.times)
        by_kind[kind] = {
            "keys": len(mine),
            "lost": sum(1 for k in lost if key_split(k) == kind),
            "safe": len(times),
            "safe_median_s": round(statistics.median(times), 3) if times else None,
            "safe_last_s": round(times[-1], 3) if times else None,
        }
    out = {
        "mode": mode,
        "killed_at_deadline": killed,
        "recomputed_seconds": round(sum(cost[k] for k in lost), 2),
        "lost_keys": len(lost),
        "below_min": len(below),
        "bytes_moved": safety.bytes,
        "kinds": by_kind,
    }
    if drained:
        line = next(iter(drained.values()))
        out["first_prediction"] = line.get("first_prediction", {}).get("text")
        out["measured_prediction"] = measured.result() if measured and measured.done() else None
        out["outcome"] = line.get("outcome")
    return out


async def _measured_prediction(c: Any, leaving: str) -> dict[str, Any] | None:
    """The drain's first prediction made at a measured rate (seconds into the drain)."""
    started = time.monotonic()
    while True:
        report = await c.scheduler.amm_rules_drain_report(workers=[leaving])
        line = report.get(leaving) or {}
        prediction = line.get("prediction") or {}
        if prediction.get("rate_source") not in (None, "assumed"):
            return {
                "after_s": round(time.monotonic() - started, 2),
                "text": prediction.get("text"),
                "lost_keys": prediction.get("lost_keys"),
                "lost_seconds": prediction.get("lost_seconds"),
            }
        if line.get("outcome") is not None:
            return None
        await asyncio.sleep(0.1)


def _duration(s: Any, key: Hashable) -> float:
    group = s.tasks[key].group
    done = max(1, sum(group.states.get(st, 0) for st in ("memory", "released", "forgotten")))
    return group.all_durations.get("compute", 0.0) / done


async def _wait(futures: list[Any], timeout: float = 300) -> None:
    from distributed import wait

    await wait(futures, timeout=timeout)


def table(runs: list[dict[str, Any]]) -> str:
    """Medians per mode."""
    lines = [
        "| mode | recomputed (s) | keys lost | dear keys lost | pinned below min 2 "
        "| moved (MiB) | dear safe (median s) | pinned safe (last s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for mode in MODES:
        mine = [r for r in runs if r["mode"] == mode]
        if not mine:
            continue

        def med(f: Any, mine: list[dict[str, Any]] = mine) -> Any:
            values = [v for v in (f(r) for r in mine) if v is not None]
            return statistics.median(values) if values else None

        def show(v: Any, digits: int = 1) -> str:
            return "-" if v is None else f"{v:.{digits}f}"

        lines.append(
            f"| {mode} | {show(med(lambda r: r['recomputed_seconds']))} "
            f"| {show(med(lambda r: r['lost_keys']), 0)} "
            f"| {show(med(lambda r: r['kinds']['dear']['lost']), 0)} "
            f"| {show(med(lambda r: r['below_min']), 0)} "
            f"| {show(med(lambda r: r['bytes_moved'] / 2**20), 0)} "
            f"| {show(med(lambda r: r['kinds']['dear']['safe_median_s']), 2)} "
            f"| {show(med(lambda r: r['kinds']['pin']['safe_last_s']), 2)} |"
        )
    return "\n".join(lines)


def inside(args: argparse.Namespace) -> None:
    """In the throttled namespace: the runs, interleaved."""
    logging.basicConfig(level=logging.ERROR)
    runs = []
    for repeat in range(args.repeats):
        for mode in MODES:
            started = time.monotonic()
            run = asyncio.run(one_run(mode, args))
            run["repeat"] = repeat
            run["seconds"] = round(time.monotonic() - started, 1)
            print(json.dumps(run), flush=True)
            runs.append(run)
    result = {
        "benchmark": "drain",
        "settings": {k: v for k, v in vars(args).items() if k not in ("inside", "json", "table")},
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "runs": runs,
    }
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(table(runs))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.drain", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--deadline", type=float, default=8.0)
    parser.add_argument("--mbit", type=float, default=200.0, help="the link's rate (megabits/s)")
    parser.add_argument("--cheap", type=int, default=24)
    parser.add_argument("--cheap-mib", type=int, default=16)
    parser.add_argument("--dear", type=int, default=40)
    parser.add_argument("--dear-seconds", type=float, default=1.0)
    parser.add_argument("--pinned", type=int, default=8)
    parser.add_argument("--json", default=str(RESULTS))
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--table", action="store_true", help="print the table of --json and stop")
    args = parser.parse_args(argv)
    if args.table:
        print(table(json.loads(Path(args.json).read_text())["runs"]))
        return 0
    if args.inside:
        inside(args)
        return 0
    why = unavailable()
    if why is not None:
        print(f"benchmarks.drain: {why}", file=sys.stderr)
        return 2
    return run_throttled(
        args.mbit,
        [
            sys.executable,
            "-m",
            "benchmarks.drain",
            "--inside",
            *(argv if argv is not None else sys.argv[1:]),
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


if __name__ == "__main__":
    sys.exit(main())
