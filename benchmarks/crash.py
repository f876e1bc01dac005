"""A worker killed mid-computation: what its crash costs under the stock AMM, under
``replicate: 2`` on the whole first stage, and under ``protect:``.

Each run starts a ``LocalCluster`` of ``--workers`` worker processes with nannies (one
thread each, 1 GiB each), computes and persists a first stage of CPU-bound tasks with
outputs of mixed sizes (:class:`benchmarks.support.crash.Stage`: ``dear`` tasks, small
and long to compute; ``bulky`` ones, large and quick), waits until the mode's copies
are made, then runs a second stage that reads every first-stage key; once half of the
second stage is done, one worker is killed with SIGKILL (its nanny starts a new one).
The victim is the worker holding alone the most first-stage work (``busiest``, what
the engine's work at risk points at) or one drawn at random (``random``, seeded per
repeat, the same in every mode). The modes, interleaved in each repeat:

- ``stock``: distributed's own AMM (``ReduceReplicas``), the baseline;
- ``replicate``: a rule ``replicate: 2`` on the whole first stage, what a careful user
  writes today;
- ``protect``: ``protect: {budget: 10%, min-recompute: 1s}`` (the first stage's tasks
  compute for seconds, not the default 30 s; the budget is the default);
- ``no-crash``: the stock AMM and no kill: the floor.

Per run: the second stage's wall time, the first-stage tasks recomputed and their
compute seconds, the second-stage tasks run again, the peak and mean extra memory
(bytes of copies beyond one, sampled every 0.1 s from the end of the first stage),
and the time lost to the crash (wall time minus the median of the no-crash runs).
Tables per mode and victim; JSON in ``benchmarks/results/crash.json``; the plots
(:func:`plot`, from the JSON) in ``docs/crash-time-lost.png`` and
``docs/crash-memory.png``.

Usage: ``python -m benchmarks.crash [--repeats N] [--workers N] [--victims
busiest,random] [--json PATH] [--plots-only]``; needs the ``bench`` extra (matplotlib).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import signal
import statistics
import time
from pathlib import Path
from typing import Any

import dask
import distributed
from distributed import Client, LocalCluster, wait

from benchmarks.support import crash
from benchmarks.support.cluster import TransitionCounter, copies

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "crash.json"
PLOT_LOST = ROOT / "docs" / "crash-time-lost.png"
PLOT_MEMORY = ROOT / "docs" / "crash-memory.png"
MODES = ("stock", "replicate", "protect", "no-crash")
LIMIT = 2**30
INTERVAL = 0.5
#: Readers per first-stage key, and the seconds each computes.
READERS = 3
READ_SECONDS = 0.3
SAMPLE = 0.1


def amm_config(mode: str) -> dict[str, Any]:
    prefix = "distributed.scheduler.active-memory-manager"
    if mode in ("stock", "no-crash"):
        policy = {"class": "distributed.active_memory_manager.ReduceReplicas"}
    elif mode == "replicate":
        policy = {"class": "amm_rules.RulesPolicy", "rules": crash.replicate_rules()}
    else:
        policy = {"class": "amm_rules.RulesPolicy", "rules": crash.protect_rules("10%", "1s")}
    return {
        f"{prefix}.start": True,
        f"{prefix}.interval": INTERVAL,
        f"{prefix}.policies": [policy],
    }


class Sampler:
    """Extra bytes over time (and protection's own, in the protect mode)."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self.samples: list[tuple[float, int, int]] = []
        self.start = time.monotonic()
        self._task: asyncio.Task[None] | None = None

    def begin(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        s = self.scheduler
        sections = [_protect_section(p) for p in s.extensions["amm"].policies if hasattr(p, "ctx")]
        protect = next((x for x in sections if x is not None), None)
        while True:
            own = protect.held[2] if protect is not None else 0
            self.samples.append((time.monotonic() - self.start, crash.extra_bytes(s), own))
            await asyncio.sleep(SAMPLE)

    def end(self) -> None:
        if self._task is not None:
            self._task.cancel()


def _protect_section(policy: Any) -> Any:
    from amm_rules.engine.sections.protect import ProtectSection

    return policy.section(ProtectSection)


async def settle(s: Any, mode: str, keys: list[str], timeout: float = 60.0) -> float:
    """Wait until the mode's copies are made; returns the seconds it took."""
    start = time.monotonic()
    deadline = start + timeout
    while time.monotonic() < deadline:
        if mode == "replicate":
            done = all(copies(s, k) >= 2 for k in keys)
        elif mode == "protect":
            (policy,) = s.extensions["amm"].policies
            protected = _protect_section(policy).protected
            done = bool(protected) and all(copies(s, k) >= 2 for k in protected)
        else:
            done = True
        if done:
            return time.monotonic() - start
        await asyncio.sleep(0.1)
    raise TimeoutError(f"{mode}: the copies were not made within {timeout} s")


def choose_victim(s: Any, how: str, work: dict[str, float], rng: random.Random) -> str:
    if how == "busiest":
        at_risk = crash.sole_work(s, work)
        return max(sorted(at_risk), key=lambda a: at_risk[a])
    return rng.choice(sorted(s.workers))


async def one_run(
    mode: str, victim_kind: str, repeat: int, args: argparse.Namespace
) -> dict[str, Any]:
    stage = crash.Stage(dear_seconds=args.work)
    tasks = stage.tasks()
    work = {k: secs for k, (secs, _) in tasks.items()}
    rng = random.Random(repeat)
    with dask.config.set(amm_config(mode)):
        async with (
            LocalCluster(
                n_workers=args.workers,
                threads_per_worker=1,
                processes=True,
                asynchronous=True,
                dashboard_address=":0",
                memory_limit=LIMIT,
            ) as cluster,
            Client(cluster, asynchronous=True) as c,
        ):
            s = cluster.scheduler
            counter = TransitionCounter.on(s)
            begun = time.monotonic()
            futures = [
                c.submit(crash.first, k, secs, size, key=k, pure=False)
                for k, (secs, size) in tasks.items()
            ]
            await wait(futures)
            first_s = time.monotonic() - begun
            settled = await settle(s, mode, list(tasks))
            sampler = Sampler(s)
            sampler.begin()
            start = time.monotonic()
            readers = [
                c.submit(crash.read, f, READ_SECONDS, key=f"read-{f.key}-{j}", pure=False)
                for f in futures
                for j in range(READERS)
            ]
            victim = None
            killed_at = None
            covered, first_extra = crash.covered(s, work)
            at_risk_victim = None
            if mode != "no-crash":
                while sum(r.done() for r in readers) < len(readers) // 2:
                    await asyncio.sleep(0.02)
                covered, first_extra = crash.covered(s, work)
                victim = choose_victim(s, victim_kind, work, rng)
                at_risk_victim = crash.sole_work(s, work)[victim]
                pids = await c.run(os.getpid, workers=[victim])
                os.kill(pids[victim], signal.SIGKILL)
                killed_at = time.monotonic() - sampler.start
            results = await c.gather(readers)
            wall = time.monotonic() - start
            sampler.end()
            assert results == [tasks[f.key][1] for f in futures for _ in range(READERS)]
            recomputed = [k for k in tasks if counter.processing[k] > 1]
            reran = sum(1 for r in readers if counter.processing[r.key] > 1)
            extra = [b for _, b, _ in sampler.samples]
            budget = None
            if mode == "protect":
                (policy,) = s.extensions["amm"].policies
                budget = _protect_section(policy).budget
            return {
                "mode": mode,
                "victim_kind": victim_kind if mode != "no-crash" else None,
                "repeat": repeat,
                "victim": victim,
                "victim_sole_work_s": at_risk_victim,
                "covered_seconds": round(covered, 3),
                "first_stage_extra_bytes": first_extra,
                "first_stage_s": round(first_s, 3),
                "settle_s": round(settled, 3),
                "wall_s": round(wall, 3),
                "recomputed_tasks": len(recomputed),
                "recomputed_seconds": round(sum(work[k] for k in recomputed), 3),
                "second_stage_reran": reran,
                "peak_extra_bytes": max(extra, default=0),
                "mean_extra_bytes": round(statistics.fmean(extra), 1) if extra else 0,
                "peak_protect_bytes": max((o for _, _, o in sampler.samples), default=0),
                "budget_bytes": budget,
                "killed_at_s": None if killed_at is None else round(killed_at, 3),
                "samples": [(round(t, 2), b, o) for t, b, o in sampler.samples],
            }


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    crash.ship()
    out = []
    for repeat in range(args.repeats):
        for victim_kind in args.victims:
            for mode in MODES:
                if mode == "no-crash" and victim_kind != args.victims[0]:
                    continue
                result = await one_run(mode, victim_kind, repeat, args)
                shown = {k: v for k, v in result.items() if k != "samples"}
                print(json.dumps(shown), flush=True)
                out.append(result)
    return out


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians per (mode, victim kind), time lost against the no-crash median, and the
    issue's goals."""
    floor = statistics.median(r["wall_s"] for r in runs if r["mode"] == "no-crash")
    rows: dict[str, dict[str, Any]] = {}
    for r in runs:
        name = "no-crash" if r["mode"] == "no-crash" else f"{r['mode']} ({r['victim_kind']})"
        rows.setdefault(name, {"runs": []})["runs"].append(r)
    table = {}
    for name, entry in rows.items():
        rs = entry["runs"]
        table[name] = {
            "runs": len(rs),
            "wall_s": statistics.median(r["wall_s"] for r in rs),
            "time_lost_s": statistics.median(r["wall_s"] - floor for r in rs),
            "recomputed_tasks": statistics.median(r["recomputed_tasks"] for r in rs),
            "recomputed_seconds": statistics.median(r["recomputed_seconds"] for r in rs),
            "second_stage_reran": statistics.median(r["second_stage_reran"] for r in rs),
            "peak_extra_bytes": statistics.median(r["peak_extra_bytes"] for r in rs),
            "mean_extra_bytes": statistics.median(r["mean_extra_bytes"] for r in rs),
            "peak_protect_bytes": max(r["peak_protect_bytes"] for r in rs),
            "covered_seconds": statistics.median(r["covered_seconds"] for r in rs),
            "first_stage_extra_bytes": statistics.median(r["first_stage_extra_bytes"] for r in rs),
            "budget_bytes": rs[0]["budget_bytes"],
        }
    goals = {}
    for kind in ("busiest", "random"):
        stock, prot, repl = (table.get(f"{m} ({kind})") for m in ("stock", "protect", "replicate"))
        if not (stock and prot and repl):
            continue
        goals[kind] = {
            "recomputed_seconds_le_0.1_of_stock": prot["recomputed_seconds"]
            <= 0.1 * stock["recomputed_seconds"],
            "time_lost_le_half_of_stock": prot["time_lost_s"] <= 0.5 * stock["time_lost_s"],
            "protect_within_budget": prot["peak_protect_bytes"] <= (prot["budget_bytes"] or 0),
            "covers_ge_0.8_of_replicate": prot["covered_seconds"] >= 0.8 * repl["covered_seconds"],
            "extra_le_third_of_replicate": prot["first_stage_extra_bytes"]
            <= repl["first_stage_extra_bytes"] / 3,
        }
    return {"no_crash_wall_s": floor, "table": table, "goals": goals}


def print_table(summary: dict[str, Any]) -> None:
    print(f"\nno-crash wall time (median): {summary['no_crash_wall_s']:.2f} s")
    head = (
        f"{'mode (victim)':<22} {'wall s':>7} {'lost s':>7} {'recomp':>6} {'recomp s':>8} "
        f"{'reran':>5} {'peak extra MiB':>14} {'mean extra MiB':>14} {'covered s':>9}"
    )
    print(head)
    for name, row in summary["table"].items():
        print(
            f"{name:<22} {row['wall_s']:>7.2f} {row['time_lost_s']:>7.2f} "
            f"{row['recomputed_tasks']:>6g} {row['recomputed_seconds']:>8.2f} "
            f"{row['second_stage_reran']:>5g} {row['peak_extra_bytes'] / 2**20:>14.1f} "
            f"{row['mean_extra_bytes'] / 2**20:>14.1f} {row['covered_seconds']:>9.2f}"
        )
    for kind, goals in summary["goals"].items():
        print(f"goals ({kind}): {goals}")


def plot(
    data: dict[str, Any], lost_path: Path = PLOT_LOST, memory_path: Path = PLOT_MEMORY
) -> None:
    """The two figures of docs/performance.md, from the benchmark's JSON."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = data["runs"]
    floor = data["summary"]["no_crash_wall_s"]
    kinds = [k for k in ("busiest", "random") if any(r["victim_kind"] == k for r in runs)]
    modes = ("stock", "replicate", "protect")
    fig, ax = plt.subplots(figsize=(7, 3.6))
    width = 0.8 / max(1, len(kinds))
    for j, kind in enumerate(kinds):
        values = []
        for m in modes:
            lost = [
                r["wall_s"] - floor for r in runs if r["mode"] == m and r["victim_kind"] == kind
            ]
            values.append(statistics.median(lost) if lost else 0.0)
        xs = [i + (j - (len(kinds) - 1) / 2) * width for i in range(len(modes))]
        ax.bar(xs, values, width, label=f"victim: {kind}")
        for x, v in zip(xs, values, strict=True):
            ax.annotate(f"{v:.2f}", (x, v), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(modes)), ["stock AMM", "replicate: 2", "protect: 10%"])
    ax.set_ylabel("seconds lost to the crash (median)")
    ax.set_title("Time lost when a worker is killed mid-way through the second stage")
    ax.legend()
    fig.tight_layout()
    fig.savefig(lost_path, dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 3.6))
    kind = kinds[0] if kinds else None
    for m in ("stock", "replicate", "protect", "no-crash"):
        chosen = [
            r for r in runs if r["mode"] == m and (m == "no-crash" or r["victim_kind"] == kind)
        ]
        if not chosen:
            continue
        r = chosen[0]
        ts = [t for t, _, _ in r["samples"]]
        mib = [b / 2**20 for _, b, _ in r["samples"]]
        (line,) = ax.plot(ts, mib, label=m)
        if r["killed_at_s"] is not None:
            ax.axvline(r["killed_at_s"], color=line.get_color(), linestyle=":", linewidth=1)
    ax.set_xlabel("seconds since the second stage started (dotted: the kill)")
    ax.set_ylabel("extra memory, MiB (copies beyond one)")
    ax.set_title(f"Extra memory over time (first repeat, victim: {kind})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(memory_path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--work", type=float, default=1.5, help="seconds of a dear task")
    parser.add_argument("--victims", default="busiest,random")
    parser.add_argument("--json", type=Path, default=RESULTS)
    parser.add_argument("--plots-only", action="store_true", help="plot the JSON again")
    args = parser.parse_args()
    args.victims = [v for v in args.victims.split(",") if v]
    if args.plots_only:
        plot(json.loads(args.json.read_text()))
        return
    runs = asyncio.run(run(args))
    summary = summarize(runs)
    data = {
        "benchmark": "crash",
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "versions": {"dask": dask.__version__, "distributed": distributed.__version__},
        "args": {k: v for k, v in vars(args).items() if k not in ("json", "plots_only")},
        "stage": {
            "bytes": crash.Stage(dear_seconds=args.work).bytes,
            "seconds": crash.Stage(dear_seconds=args.work).seconds,
        },
        "summary": summary,
        "runs": runs,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(data, indent=1) + "\n")
    print_table(summary)
    plot(data)


if __name__ == "__main__":
    main()
