"""Rebalance planner on simulated clusters: convergence, bytes moved, planner time.

A pure simulation, no Dask cluster: keys with sizes on workers with memory limits. Each
cycle does what the scheduler engine and the AMM do: settle the moves in flight
(:class:`amm_rules.engine.rebalance.plan.MoveBook`), plan (:func:`amm_rules.engine.rebalance.plan.plan_rebalance`),
start the copies, enact the drops; the copies land before the next cycle. It runs until a
cycle moves nothing and nothing is in flight.

Reported per scenario: cycles that moved data, final max/mean worker memory (as fractions of
each worker's limit), bytes copied against the minimum needed to balance
(:func:`amm_rules.engine.rebalance.plan.minimum_bytes_to_balance`), and planner time per cycle (median and
max; settle time included). Also the cost of one cycle on a balanced cluster (the steady
state) and on an imbalanced one with the default budget, at the largest size.

    python -m benchmarks.rebalance_planner            # all sizes, up to 1,000 workers / 1M keys
    python -m benchmarks.rebalance_planner --quick    # skip the largest size

Prints a table and writes ``benchmarks/results/rebalance_planner.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from collections.abc import Collection, Hashable
from dataclasses import replace
from pathlib import Path

from amm_rules.engine.rebalance.plan import (
    MoveBook,
    WorkerLoad,
    minimum_bytes_to_balance,
    plan_rebalance,
)
from amm_rules.language.ruleset import RebalanceSettings

MiB = 2**20
GiB = 2**30
RESULTS = Path(__file__).parent / "results" / "rebalance_planner.json"


class Cluster:
    """Keys on workers. ``owners[key]`` lists the workers holding the key."""

    def __init__(self, limits: dict[str, int], unmanaged: int):
        self.limits = limits
        self.unmanaged = unmanaged
        self.data: dict[str, dict[Hashable, int]] = {a: {} for a in limits}
        self.managed = dict.fromkeys(limits, 0)
        self.owners: dict[Hashable, list[str]] = {}
        self.in_transit: list[tuple[Hashable, str, int]] = []

    def put(self, address: str, key: Hashable, nbytes: int) -> None:
        self.data[address][key] = nbytes
        self.managed[address] += nbytes
        self.owners.setdefault(key, []).append(address)

    def drop(self, address: str, key: Hashable) -> None:
        self.managed[address] -= self.data[address].pop(key)
        self.owners[key].remove(address)

    def loads(self) -> list[WorkerLoad]:
        return [
            WorkerLoad(a, self.managed[a] + self.unmanaged, limit)
            for a, limit in self.limits.items()
        ]

    def keys_on(self, address: str, newest_first: bool):
        items = self.data[address].items()
        return reversed(items) if newest_first else items

    def holders(self, key: Hashable) -> Collection[str] | None:
        return self.owners.get(key) or None

    def can_place(self, key: Hashable, address: str) -> str | None:
        return "already holds a copy" if address in self.owners[key] else None

    def max_over_mean(self) -> float:
        loads = self.loads()
        mean = sum(w.memory for w in loads) / sum(w.memory_limit for w in loads)
        return max(w.memory / w.memory_limit for w in loads) / mean


def build(
    workers: int, keys: int, shape: str, seed: int = 0, heterogeneous: bool = False
) -> Cluster:
    """``shape``: ``half-full`` (half the workers at ~80%, half at ~20%) or ``one-hot``
    (one worker in eight at ~85%, the others at ~30%). Key sizes vary (log-uniform,
    a factor of 8 either way around the mean)."""
    rng = random.Random(seed)
    sizes = [16, 16, 32, 64] if heterogeneous else [16]
    limits = {f"w{i:04d}": rng.choice(sizes) * GiB for i in range(workers)}
    c = Cluster(limits, unmanaged=300 * MiB)
    if shape == "half-full":
        target = {a: 0.8 if i % 2 == 0 else 0.2 for i, a in enumerate(limits)}
    else:
        target = {a: 0.85 if i % 8 == 0 else 0.3 for i, a in enumerate(limits)}
    capacity = {a: target[a] * limits[a] - c.unmanaged for a in limits}
    mean_size = sum(capacity.values()) / keys
    addresses = list(limits)
    weights = [capacity[a] for a in addresses]
    for i, address in enumerate(rng.choices(addresses, weights, k=keys)):
        c.put(address, f"k{i}", max(1, int(mean_size * 8 ** rng.uniform(-1, 1) / 2.1)))
    return c


def converge(c: Cluster, settings: RebalanceSettings, max_cycles: int = 200) -> dict:
    book = MoveBook()
    minimum = minimum_bytes_to_balance(c.loads())
    before = c.max_over_mean()
    copied = 0
    active = 0
    times: list[float] = []
    for cycle in range(max_cycles):
        now = 2.0 * cycle
        t0 = time.perf_counter()
        settled = book.settle(now, holders=c.holders, alive=c.limits)
        plan = plan_rebalance(
            c.loads(),
            settings,
            keys_on=c.keys_on,
            can_move=lambda k, a: None,
            can_place=c.can_place,
            pending=book.pending.values(),
            cooling=book.cooling(now),
            previous=book.roles,
        )
        for move in plan.moves:
            book.start(move, now)
        book.remember(plan)
        times.append(time.perf_counter() - t0)
        # The AMM enacts: drops now, copies land before the next cycle.
        for p in settled.drops:
            c.drop(p.sender, p.key)
        for move in plan.moves:
            c.put(move.recipient, move.key, move.nbytes)
            copied += move.nbytes
        active += bool(plan.moves)
        if not plan.moves and not book.pending:
            break
    return {
        "cycles_moving": active,
        "max_over_mean_before": round(before, 3),
        "max_over_mean_after": round(c.max_over_mean(), 3),
        "bytes_moved": copied,
        "bytes_minimum": minimum,
        "moved_over_minimum": round(copied / minimum, 3) if minimum else None,
        "plan_ms_median": round(1000 * statistics.median(times), 2),
        "plan_ms_max": round(1000 * max(times), 2),
    }


def one_cycle_ms(c: Cluster, settings: RebalanceSettings, repeat: int = 5) -> float:
    """Best of ``repeat`` plans of a single cycle (no moves applied)."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        plan_rebalance(
            c.loads(),
            settings,
            keys_on=c.keys_on,
            can_move=lambda k, a: None,
            can_place=c.can_place,
        )
        best = min(best, time.perf_counter() - t0)
    return round(1000 * best, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip 1,000 workers / 1M keys")
    args = parser.parse_args()
    print(HEADER)

    on = RebalanceSettings(enabled=True)
    sizes = [(8, 10_000), (64, 100_000)] + ([] if args.quick else [(1_000, 1_000_000)])
    rows = []
    for workers, keys in sizes:
        for shape, hetero in [("half-full", False), ("one-hot", False), ("half-full", True)]:
            c = build(workers, keys, shape, heterogeneous=hetero)
            minimum = minimum_bytes_to_balance(c.loads())
            # A budget that allows balancing in about eight cycles, rounded to 256 MiB.
            budget = max(256 * MiB, -(-minimum // 8 // (256 * MiB)) * 256 * MiB)
            result = converge(c, replace(on, max_bytes_per_cycle=budget))
            rows.append(
                {
                    "workers": workers,
                    "keys": keys,
                    "shape": shape + (" (mixed limits)" if hetero else ""),
                    "budget": budget,
                    **result,
                }
            )
            print(_row(rows[-1]), flush=True)

    largest_w, largest_k = sizes[-1]
    imbalanced = build(largest_w, largest_k, "half-full")
    balanced = build(largest_w, largest_k, "half-full")
    converge(balanced, replace(on, max_bytes_per_cycle=1 << 50))
    single = {
        "workers": largest_w,
        "keys": largest_k,
        "balanced_cycle_ms": one_cycle_ms(balanced, on),
        "imbalanced_default_budget_ms": one_cycle_ms(imbalanced, on),
        "default_budget": on.max_bytes_per_cycle,
    }
    print(
        f"\none cycle at {largest_w} workers / {largest_k} keys: balanced "
        f"{single['balanced_cycle_ms']} ms, imbalanced with the default budget "
        f"({on.max_bytes_per_cycle // MiB} MiB) {single['imbalanced_default_budget_ms']} ms"
    )

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "python": platform.python_version(),
                "machine": platform.machine(),
                "scenarios": rows,
                "single_cycle": single,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {RESULTS.name}")


HEADER = (
    f"{'workers':>7} {'keys':>9} {'shape':<26} {'budget':>9} {'cycles':>6} "
    f"{'max/mean':>15} {'moved/min':>9} {'plan ms med/max':>16}"
)


def _row(r: dict) -> str:
    return (
        f"{r['workers']:>7} {r['keys']:>9} {r['shape']:<26} {r['budget'] / GiB:>7.2f}Gi "
        f"{r['cycles_moving']:>6} {r['max_over_mean_before']:>6.2f} -> "
        f"{r['max_over_mean_after']:<5.3f} {r['moved_over_minimum']:>9} "
        f"{r['plan_ms_median']:>7.1f}/{r['plan_ms_max']:<8.1f}"
    )


if __name__ == "__main__":
    main()
