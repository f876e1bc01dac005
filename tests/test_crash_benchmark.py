"""The crash benchmark's parts (:mod:`benchmarks.crash`, :mod:`benchmarks.support.crash`)
without running it: the workload's shape, the measures read from a scheduler, the
summary's arithmetic and goals, and its plots drawn from a small JSON. No timing."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from benchmarks import crash as bench
from benchmarks.support import crash


def test_the_stage_mixes_small_dear_and_large_cheap_outputs() -> None:
    stage = crash.Stage()
    tasks = stage.tasks()
    assert len(tasks) == 12
    dear = [v for k, v in tasks.items() if k.startswith("dear-")]
    bulky = [v for k, v in tasks.items() if k.startswith("bulky-")]
    # Worth per byte: the dear keys are worth far more than the bulky ones.
    assert min(s / b for s, b in dear) > 100 * max(s / b for s, b in bulky)
    assert crash.first("dear-0", 0.0, 10) == b"dear-0...."
    assert crash.read(b"abc", 0.0) == 3


class _Worker:
    def __init__(self, address: str) -> None:
        self.address = address


def _scheduler(holders: dict[str, list[str]], nbytes: int = 10) -> Any:
    workers = {a: _Worker(a) for hs in holders.values() for a in hs}
    tasks = {
        k: SimpleNamespace(who_has={workers[a] for a in hs}, nbytes=nbytes)
        for k, hs in holders.items()
    }
    return SimpleNamespace(tasks=tasks, workers=workers)


def test_measures_read_from_the_scheduler() -> None:
    s = _scheduler({"dear-0": ["a"], "dear-1": ["a", "b"], "bulky-0": ["b"]})
    work = {"dear-0": 1.5, "dear-1": 1.5, "bulky-0": 0.3}
    assert crash.sole_work(s, work) == {"a": 1.5, "b": 0.3}
    assert crash.extra_bytes(s) == 10
    assert crash.covered(s, work) == (1.5, 10)


def _run(mode: str, kind: str | None, wall: float, seconds: float = 0.0) -> dict[str, Any]:
    return {
        "mode": mode,
        "victim_kind": kind,
        "wall_s": wall,
        "recomputed_tasks": int(seconds / 1.5),
        "recomputed_seconds": seconds,
        "second_stage_reran": 1,
        "peak_extra_bytes": 100,
        "mean_extra_bytes": 50,
        "peak_protect_bytes": 20 if mode == "protect" else 0,
        "budget_bytes": 40 if mode == "protect" else None,
        "covered_seconds": {"replicate": 12.0, "protect": 11.0}.get(mode, 0.0),
        "first_stage_extra_bytes": {"replicate": 300, "protect": 20}.get(mode, 0),
        "killed_at_s": None if mode == "no-crash" else 1.0,
        "samples": [(0.0, 0, 0), (0.1, 100, 20 if mode == "protect" else 0)],
    }


def test_summary_time_lost_and_goals(tmp_path: Path) -> None:
    runs = [
        _run("no-crash", None, 10.0),
        _run("stock", "busiest", 14.0, 4.5),
        _run("replicate", "busiest", 11.0),
        _run("protect", "busiest", 11.5),
    ]
    summary = bench.summarize(runs)
    table = summary["table"]
    assert summary["no_crash_wall_s"] == 10.0
    assert table["stock (busiest)"]["time_lost_s"] == 4.0
    assert table["protect (busiest)"]["time_lost_s"] == 1.5
    assert summary["goals"]["busiest"] == {
        "recomputed_seconds_le_0.1_of_stock": True,
        "time_lost_le_half_of_stock": True,
        "protect_within_budget": True,
        "covers_ge_0.8_of_replicate": True,
        "extra_le_third_of_replicate": True,
    }
    lost, memory = tmp_path / "lost.png", tmp_path / "memory.png"
    bench.plot({"runs": runs, "summary": summary}, lost, memory)
    assert lost.read_bytes()[:4] == memory.read_bytes()[:4] == b"\x89PNG"
