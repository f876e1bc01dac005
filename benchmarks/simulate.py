"""How long ``amm-rules simulate`` takes on a large cluster dump (goal: 100,000 keys in
under 30 s).

The large dump is synthesized from the layout of a real one. First a real cluster (a
scheduler and four workers in this process, on two hosts, two with ``GPU=1``: the demo's
cluster) computes a few keys of every kind the demo rules govern and is dumped with
``Client.dump_cluster_state``; that small dump is also the fixture committed as
``examples/dumps/demo-cluster.msgpack.gz`` (``--write-fixture`` rewrites it). Then its
entries are copied, field for field, into a dump of ``--workers`` workers on a host per
four and ``--keys`` keys: the same fields and the same repr strings for ``who_has``,
``has_what`` and prefixes, with addresses, keys, sizes and holders varied. The keys
are what the demo rules act on: precious results with one copy (the rules want three,
on distinct hosts), device data off the GPU workers, host data on them, big frames,
and other keys, some with extra copies to trim.

Scenarios: ``demo`` (examples/rules/demo.yaml) and ``demo+rebalance`` (the same with a
``rebalance:`` section, which moves at most 512 MiB a cycle and so takes many cycles).
Each is timed on the msgpack dump, ``--repeats`` times interleaved, as the command runs
it: read the dump, simulate until nothing changes, build the report (and render it as
JSON). The YAML dump is read once, for reference. Prints a table of medians and writes
``benchmarks/results/simulate.json``.

Usage, from the repository root:
``python -m benchmarks.simulate [--keys N] [--workers N] [--repeats N] [--write-fixture]``
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "examples" / "dumps" / "demo-cluster.msgpack.gz"
RESULTS = ROOT / "benchmarks" / "results" / "simulate.json"
DEMO = ROOT / "examples" / "rules" / "demo.yaml"
REBALANCE = """
rebalance:
  sender-min: 30%
  recipient-max: 60%
  gap: 10%
  max-bytes-per-cycle: 512 MiB
"""
MiB = 2**20

# -- the small real dump -------------------------------------------------------------------


async def _small_cluster(path: Path) -> None:
    import dask
    import numpy as np
    from distributed import Client, Scheduler, Worker

    config = {
        "distributed.scheduler.active-memory-manager.start": False,
        "optimization.fuse.active": False,
    }
    with dask.config.set(config):
        async with Scheduler(dashboard_address=":0", port=0) as s:
            specs = [
                ("127.0.0.1", "gpu-1", {"GPU": 1}),
                ("127.0.0.1", "cpu-1", {}),
                ("127.0.0.2", "gpu-2", {"GPU": 1}),
                ("127.0.0.2", "cpu-2", {}),
            ]
            workers = [
                Worker(s.address, host=host, name=name, resources=res, memory_limit="2 GiB")
                for host, name, res in specs
            ]
            await asyncio.gather(*workers)
            try:
                async with Client(s.address, asynchronous=True) as c:
                    addr = {w.name: w.address for w in workers}

                    def put(key: str, nbytes: int, where: str) -> Any:
                        return c.submit(np.ones, nbytes // 8, key=key, workers=[addr[where]])

                    futures = [
                        put("precious-0", 4 * MiB, "cpu-1"),
                        put("precious-1", 4 * MiB, "gpu-2"),
                        put("device-0", 2 * MiB, "cpu-2"),
                        put("device-1", 2 * MiB, "gpu-1"),
                        put("host-0", 1 * MiB, "gpu-2"),
                        put("other-0", 1 * MiB, "cpu-1"),
                        put("other-1", 1 * MiB, "cpu-2"),
                    ]
                    await c.gather(futures)
                    await c.replicate([futures[5]], n=2)
                    await c.dump_cluster_state(str(path).removesuffix(".msgpack.gz"))
            finally:
                await asyncio.gather(*(w.close() for w in workers))


def write_fixture(path: Path = FIXTURE) -> Path:
    """Dump the demo's small real cluster to ``path`` (a ``.msgpack.gz``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    asyncio.run(_small_cluster(path))
    return path


# -- the large synthetic dump ------------------------------------------------------------------


def _load(path: Path) -> dict[str, Any]:
    return msgpack.unpackb(gzip.decompress(path.read_bytes()), strict_map_key=False)


def synthesize(
    template: dict[str, Any], n_keys: int, n_workers: int, seed: int = 0
) -> dict[str, Any]:
    """A dump of ``n_workers`` workers and ``n_keys`` keys in the layout of ``template``."""
    rng = random.Random(seed)
    # One worker in five is busy: it is picked six times as often, and ends well above
    # the others (what rebalancing is for).
    weights = [6 if i % 5 == 0 else 1 for i in range(n_workers)]
    sched = template["scheduler"]
    w_tmpl = next(iter(sched["workers"].values()))
    t_tmpl = next(t for t in sched["tasks"].values() if t["state"] == "memory")
    old_addr = w_tmpl["address"]
    ws_repr = next(r for t in sched["tasks"].values() for r in t["who_has"] if old_addr in r)
    old_key = t_tmpl["key"]
    ts_repr = f"<TaskState {old_key!r} memory>"
    prefix_repr = t_tmpl["prefix"]

    addresses = [f"tcp://10.0.{i // 4}.{i % 4 + 1}:4{i:04d}" for i in range(n_workers)]
    gpu = {a for i, a in enumerate(addresses) if i % 4 == 0}
    w_refs = {
        a: ws_repr.replace(repr(old_addr), repr(a)).replace(
            f"name: {w_tmpl['name']}", f"name: w{i}"
        )
        for i, a in enumerate(addresses)
    }
    tasks: dict[str, Any] = {}
    has_what: dict[str, list[str]] = {a: [] for a in addresses}
    nbytes_on = dict.fromkeys(addresses, 0)
    kinds = ["precious"] * 10 + ["device"] * 20 + ["host"] * 20 + ["other"] * 50
    for i in range(n_keys):
        kind = kinds[i % len(kinds)]
        key = f"{kind}-{i}"
        nbytes = rng.randint(MiB // 4, 2 * MiB)
        if kind == "other" and i % 10 == 1:
            holders = rng.sample(addresses, 2)  # an extra copy to trim
        else:
            holders = rng.choices(addresses, weights)
        entry = dict(t_tmpl)
        entry.update(
            key=key,
            nbytes=nbytes,
            type="numpy.ndarray",
            prefix=prefix_repr.replace(_name_of(prefix_repr), kind, 1),
            group=prefix_repr.replace(_name_of(prefix_repr), kind, 1),
            group_key=kind,
            who_has=[w_refs[a] for a in holders],
            annotations={},
        )
        tasks[key] = entry
        ref = ts_repr.replace(repr(old_key), repr(key))
        for a in holders:
            has_what[a].append(ref)
            nbytes_on[a] += nbytes
    workers = {}
    for i, a in enumerate(addresses):
        entry = dict(w_tmpl)
        managed = nbytes_on[a]
        unmanaged = 200 * MiB
        entry.update(
            address=a,
            host=a.split("://")[1].rsplit(":", 1)[0],
            name=f"w{i}",
            resources={"GPU": 1} if a in gpu else {},
            memory_limit=4 * 2**30,
            nbytes=managed,
            has_what=has_what[a],
            memory={
                **w_tmpl["memory"],
                "managed": managed,
                "managed_total": managed,
                "process": managed + unmanaged,
                "optimistic": managed + unmanaged,
                "unmanaged": unmanaged,
                "unmanaged_old": unmanaged,
                "unmanaged_recent": 0,
                "spilled": 0,
            },
        )
        workers[a] = entry
    scheduler = dict(sched)
    scheduler.update(workers=workers, tasks=tasks, transition_log=[], task_groups={})
    return {"scheduler": scheduler, "workers": {}, "versions": template.get("versions", {})}


def _name_of(prefix_repr: str) -> str:
    return prefix_repr[1:].split(":", 1)[0]


def write_dumps(data: dict[str, Any], directory: Path) -> dict[str, Path]:
    import yaml

    out = {"msgpack": directory / "large.msgpack.gz", "yaml": directory / "large.yaml"}
    out["msgpack"].write_bytes(gzip.compress(msgpack.packb(data), compresslevel=1))
    with open(out["yaml"], "w") as f:
        yaml.dump(data, f, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper))
    return out


# -- timing ------------------------------------------------------------------------------------


def time_simulation(path: Path, rules: Path) -> dict[str, float | int]:
    from amm_rules.language.loader import load_ruleset
    from amm_rules.offline.dump import read_dump
    from amm_rules.offline.report import simulation_report
    from amm_rules.offline.sim_cluster import SimCluster
    from amm_rules.offline.simulate import Simulation

    ruleset = load_ruleset(str(rules))
    # Wall time, and the CPU time of this process: on a shared machine the second says
    # what the work costs, the first also how long it waited for a core.
    c0, t0 = time.process_time(), time.perf_counter()
    state = read_dump(path)
    t1 = time.perf_counter()
    sim = Simulation(ruleset, SimCluster(state))
    result = sim.run()
    t2 = time.perf_counter()
    report = simulation_report(sim, result)
    json.dumps(report)
    c3, t3 = time.process_time(), time.perf_counter()
    return {
        "read_s": t1 - t0,
        "simulate_s": t2 - t1,
        "report_s": t3 - t2,
        "total_s": t3 - t0,
        "cpu_s": c3 - c0,
        "cycles": sim.last_active,
        "settled": result.settled,
        "actions": len(result.actions),
        "keys": len(state.tasks),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--write-fixture", action="store_true", help="rewrite the fixture dump")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    if args.write_fixture or not FIXTURE.exists():
        write_fixture()
        print(f"wrote {FIXTURE.relative_to(ROOT)}")
    template = _load(FIXTURE)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        dumps = write_dumps(synthesize(template, args.keys, args.workers), directory)
        sizes = {fmt: p.stat().st_size for fmt, p in dumps.items()}
        rebalance = directory / "demo-rebalance.yaml"
        rebalance.write_text(DEMO.read_text() + REBALANCE)
        scenarios = {"demo": DEMO, "demo+rebalance": rebalance}
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in scenarios}
        for _ in range(args.repeats):
            for name, rules in scenarios.items():  # interleaved
                runs[name].append(time_simulation(dumps["msgpack"], rules))
        from amm_rules.offline.dump import read_dump

        c0, t0 = time.process_time(), time.perf_counter()
        read_dump(dumps["yaml"])
        yaml_read = time.perf_counter() - t0
        yaml_cpu = time.process_time() - c0

    rows = []
    print(f"{args.keys} keys, {args.workers} workers; medians of {args.repeats} interleaved runs")
    print(
        f"{'scenario':<16} {'read s':>7} {'simulate s':>11} {'report s':>9} {'total s':>8} "
        f"{'CPU s':>6} {'cycles':>7} {'actions':>8}"
    )
    for name, results in runs.items():
        med = {
            k: statistics.median(r[k] for r in results)
            for k in ("read_s", "simulate_s", "report_s", "total_s", "cpu_s")
        }
        last = results[-1]
        rows.append(
            {
                "scenario": name,
                **med,
                "cycles": last["cycles"],
                "actions": last["actions"],
                "settled": last["settled"],
                "runs": results,
            }
        )
        print(
            f"{name:<16} {med['read_s']:>7.2f} {med['simulate_s']:>11.2f} "
            f"{med['report_s']:>9.2f} {med['total_s']:>8.2f} {med['cpu_s']:>6.2f} "
            f"{last['cycles']:>7} {last['actions']:>8}"
        )
    print(
        f"reading the YAML dump instead: {yaml_read:.1f} s ({yaml_cpu:.1f} s CPU); "
        f"msgpack.gz {sizes['msgpack'] / MiB:.0f} MiB, YAML {sizes['yaml'] / MiB:.0f} MiB"
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "keys": args.keys,
                "workers": args.workers,
                "repeats": args.repeats,
                "scenarios": rows,
                "yaml_read_s": yaml_read,
                "yaml_read_cpu_s": yaml_cpu,
                "dump_bytes": sizes,
                "python": sys.version.split()[0],
                "platform": platform.platform(),
                "cpus": os.cpu_count(),
                # The machine is shared: its load (1-minute average) around the runs.
                "load_average": [load_before, os.getloadavg()[0]],
            },
            indent=2,
        )
        + "\n"
    )
    print(f"load average (1 min) before and after: {load_before:.1f}, {os.getloadavg()[0]:.1f}")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
