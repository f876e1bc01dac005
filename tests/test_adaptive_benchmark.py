"""The adaptive benchmark's summary (:mod:`benchmarks.adaptive`): medians per mode, the
ratios over stock's and the issue's goals read from them. No cluster is started and no
timing is asserted: the runs are made up."""

from __future__ import annotations

from typing import Any

from benchmarks.adaptive import FULL, QUICK, summarize


def run(mode: str, written: int, wall: float, worker_s: float, below: float) -> dict[str, Any]:
    return {
        "mode": mode,
        "wall_s": wall,
        "total_s": wall + 10,
        "written": written,
        "read_back": written // 2,
        "worker_s": worker_s,
        "below_min_key_s": below,
        "recomputed": 0,
        "most_workers": 4,
        "final_workers": 1 if mode == "stock" else 2,
    }


def test_goals_are_read_from_the_medians() -> None:
    runs = [
        run("stock", 100, 10.0, 40.0, 30.0),
        run("stock", 300, 12.0, 44.0, 20.0),
        run("stock", 200, 11.0, 42.0, 25.0),
        run("adaptive", 20, 8.0, 48.0, 0.0),
        run("adaptive", 60, 9.0, 50.0, 0.0),
        run("adaptive", 40, 8.5, 52.0, 0.0),
    ]
    table = summarize(runs, ["stock", "adaptive"])
    assert table["stock"]["written"]["median"] == 200
    assert table["ratios"]["written"] == 0.2 and table["ratios"]["wall_s"] == round(8.5 / 11, 3)
    assert table["goals"] == {
        "written_at_most_0.3": True,
        "wall_at_most_0.8": True,
        "worker_s_at_most_1.2": True,  # 50 / 42
        "zero_below_min": True,
    }
    runs.append(run("adaptive", 40, 8.5, 60.0, 0.5))
    goals = summarize(runs, ["stock", "adaptive"])["goals"]
    assert goals["zero_below_min"] is False  # any run, not the median


def test_nothing_written_by_stock_meets_the_disk_goal_only_if_nothing_is_written() -> None:
    runs = [run("stock", 0, 10.0, 40.0, 0.0), run("adaptive", 0, 8.0, 40.0, 0.0)]
    assert summarize(runs, ["stock", "adaptive"])["goals"]["written_at_most_0.3"] is True
    runs[1]["written"] = 5
    assert summarize(runs, ["stock", "adaptive"])["goals"]["written_at_most_0.3"] is False


def test_the_shapes_grow_to_three_workers_at_forty_percent() -> None:
    for shape in (FULL, QUICK):
        peak = shape.stages * shape.chunks_per_stage * shape.chunk
        assert 3 * 0.4 * shape.limit <= peak < 3 * 0.4 * shape.limit + shape.stages * shape.chunk
