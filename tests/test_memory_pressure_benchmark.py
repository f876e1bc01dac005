"""The memory-pressure benchmark's summary (:mod:`benchmarks.memory_pressure`): ratios
over the ``without`` mode, paired by repeat, and the issue's targets read from them. No
cluster is started and no timing is asserted: the runs are made up."""

from __future__ import annotations

from typing import Any

from benchmarks.memory_pressure import paired, summarize, targets


def run(repeat: int, mode: str, wall: float, spilled: int) -> dict[str, Any]:
    return {
        "workload": "W2",
        "mode": mode,
        "repeat": repeat,
        "wall_s": wall,
        "spilled": spilled,
        "peak_managed": 0,
        "peak_managed_total": 0,
        "paused_s": 0.0,
        "holds": 1 if mode != "without" else 0,
    }


def test_paired_ratios_compare_runs_of_the_same_repeat() -> None:
    base = [run(0, "without", 1.0, 10), run(1, "without", 4.0, 10), run(2, "without", 2.0, 10)]
    other = [run(0, "early", 1.1, 0), run(1, "early", 3.0, 0), run(2, "early", 2.2, 0)]
    got = paired(base, other)
    assert got is not None
    assert got["median"] == 1.1  # 1.1, 0.75, 1.1: not 2.2 / 2.0 of the medians
    assert got["slower"] == 2 and got["n"] == 3
    assert got["q1"] <= got["median"] <= got["q3"]
    assert paired(base, [run(7, "early", 1.0, 0)]) is None  # no run to pair with


def test_targets_read_both_ratios() -> None:
    runs = [run(r, "without", w, 100) for r, w in enumerate((1.0, 2.0, 3.0))]
    runs += [run(r, "early", w, 0) for r, w in enumerate((1.2, 2.4, 2.0))]
    table = summarize(runs, ["W2"], ["without", "early"])
    row = table["W2"]["early"]
    # The medians agree (2.0 and 2.0); two repeats of three were 20% slower.
    assert row["spilled_ratio"] == 0 and row["wall_ratio"] == 1.0
    assert row["wall_paired"]["median"] == 1.2 and row["wall_paired"]["slower"] == 2
    got = targets(table, "early")
    assert got["helped"] == ["W2"] and got["met"] is True
    assert got["wall_worse_than_5pct"] == []
    assert got["wall_worse_than_5pct_paired"] == ["W2"]
