"""Whole hosts lost, cut off and healed: what each costs in data, recomputation, cycles
and transfers, for amm-rules (``replicate: 2, spread: host``) and, for scenarios 1 and 2,
for the stock AMM (``ReduceReplicas``, after ``client.replicate(n=2)``).

Each host is a Linux network namespace with two worker processes under nannies; the
scheduler runs in this process on the hosts' bridge (:mod:`benchmarks.support.hosts`,
:mod:`benchmarks.support.host_scenarios`, which ``tests/engine/policy/test_hosts.py`` runs in
short versions). The scenarios:

1. a host killed (SIGKILL to all its processes), ``--rounds`` times;
2. a host cut off past the scheduler's patience (``worker-ttl``), healed, its workers
   started again, ``--rounds`` times;
3. a host cut off within that patience while a worker of another host dies, ``--rounds``
   times;
4. a host killed while a rebalance moves copies and a worker retires, ``--rounds`` times;
5. the soak: random kills, power losses, cut-offs short and long, two hosts cut apart,
   and hosts joining, for ``--soak-minutes``.

Needs Linux, root and ``ip`` (iproute2). From the repository root::

    python -m benchmarks.hosts                       # about 15 minutes
    python -m benchmarks.hosts --rounds 2 --soak-minutes 1 --only 1,5

Prints the table of docs/reliability.md ("Hosts lost, cut off and healed") and writes
``benchmarks/results/hosts.json`` (every round, with its per-key figures).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import platform
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from benchmarks.support import host_scenarios as hs
from benchmarks.support.hosts import sweep, unavailable

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "hosts.json"

Scenario = Callable[[hs.HostCluster], Awaitable[list[hs.Round]]]


async def run(
    label: str, number: int, mode: str, settings: hs.Settings, scenario: Scenario, persist: bool
) -> dict[str, Any]:
    """One scenario on a fresh cluster: its rounds, or the failure that ended it."""
    started = time.monotonic()
    rounds: list[hs.Round] = []
    failure = None
    truth: dict[str, Any] = {}
    engine_errors: list[Any] = []
    try:
        async with hs.host_cluster(settings, mode) as cluster:
            if persist:
                await cluster.persist()
            rounds = await scenario(cluster)
            if cluster.held is not None:
                truth = await cluster.truth()
            engine_errors = [
                msg
                for _, msg in cluster.scheduler.get_events("amm-rules")
                if msg.get("action") in ("error", "rule-error", "audit")
            ]
    except Exception as exc:  # a benchmark reports a failed scenario and goes on
        failure = f"{type(exc).__name__}: {exc}"[:2000]
    row = {
        "number": number,
        "scenario": label,
        "policy": "amm-rules" if mode == "rules" else "stock (ReduceReplicas)",
        **hs.summary(rounds),
        "results_correct": all(r.notes.get("result_correct", True) for r in rounds),
        "truth": truth,
        "engine_error_events": len(engine_errors),
        "failure": failure,
        "seconds": round(time.monotonic() - started, 1),
    }
    print(_line(row), flush=True)
    return {"row": row, "rounds": [asdict(r) for r in rounds]}


def _mm(value: list[float] | None) -> str:
    if value is None:
        return "-"
    median, most = value
    return f"{median:g} / {most:g}"


HEADER = (
    "| # | scenario | policy | rounds | keys lost | keys recomputed "
    "| cycles to repair (median / max) | copy actions per key (median / max) |"
)


def _line(row: dict[str, Any]) -> str:
    failed = f" FAILED: {row['failure'][:300]}" if row["failure"] else ""
    return (
        f"| {row['number']} | {row['scenario']} | {row['policy']} | {row['rounds']} "
        f"| {row['keys_lost']} | {row['keys_recomputed']} | {_mm(row['cycles_to_repair'])} "
        f"| {_mm(row['actions_per_key'])} |{failed}"
    )


def plan(args: argparse.Namespace, settings: hs.Settings) -> list[tuple[Any, ...]]:
    """(label, number, mode, settings, scenario, persist) of every run asked for."""
    n = args.rounds
    moving = hs.moving(settings)
    soak_settings = replace(settings, spare_hosts=1)
    seconds = args.soak_minutes * 60

    async def soak(cluster: hs.HostCluster) -> list[hs.Round]:
        return await hs.soak(cluster, seconds=seconds, seed=args.seed)

    runs = [
        ("host killed", 1, "rules", settings, lambda c: hs.kill_host(c, n), True),
        ("host killed", 1, "stock", settings, lambda c: hs.kill_host(c, n), True),
        ("cut off past worker-ttl, healed", 2, "rules", settings, lambda c: hs.cut_long(c, n), True),
        ("cut off past worker-ttl, healed", 2, "stock", settings, lambda c: hs.cut_long(c, n), True),
        ("cut off within worker-ttl, a worker dies", 3, "rules", settings, lambda c: hs.cut_short(c, n), True),
        ("killed mid-move and mid-retirement", 4, "rules", moving, lambda c: hs.kill_while_moving(c, n), False),
        (f"soak, {args.soak_minutes:g} min", 5, "rules", soak_settings, soak, True),
    ]  # fmt: skip
    return [r for r in runs if r[1] in args.only]


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    settings = replace(
        hs.Settings(), interval=args.interval, inflight_timeout=args.inflight_timeout
    )
    print(HEADER)
    print("|" + " --- |" * 8)
    results = [await run(*spec) for spec in plan(args, settings)]
    return {
        "benchmark": "hosts",
        "settings": asdict(settings),
        "args": {k: v for k, v in vars(args).items() if k != "json"},
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
        "rows": [r["row"] for r in results],
        "rounds": {f"{r['row']['number']}-{r['row']['policy']}": r["rounds"] for r in results},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds of scenarios 1-4")
    parser.add_argument("--soak-minutes", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=1, help="the soak's faults")
    parser.add_argument("--interval", type=float, default=hs.Settings.interval)
    parser.add_argument("--inflight-timeout", type=float, default=hs.Settings.inflight_timeout)
    parser.add_argument(
        "--only",
        type=lambda s: {int(x) for x in s.split(",")},
        default={1, 2, 3, 4, 5},
        help="scenarios to run, e.g. 1,2",
    )
    parser.add_argument("--json", type=Path, default=RESULTS)
    args = parser.parse_args()
    reason = unavailable()
    if reason is not None:
        print(f"benchmarks.hosts: {reason}", file=sys.stderr)
        raise SystemExit(2)
    sweep()
    logging.getLogger("distributed").setLevel(logging.CRITICAL)
    result = asyncio.run(main_async(args))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")
    shown = args.json.relative_to(ROOT) if args.json.is_relative_to(ROOT) else args.json
    print(f"wrote {shown}")


if __name__ == "__main__":
    main()
