"""The spill benchmark's summary (:mod:`benchmarks.spill`): ratios over stock and the
issue's goals read from them, and the rules of each mode valid. No cluster is started
and no timing is asserted: the runs are made up."""

from __future__ import annotations

from typing import Any

from amm_rules.language.loader import check_text
from benchmarks.spill import MODES, goals, rules_of, summarize


def run(workload: str, mode: str, wall: float, read: int) -> dict[str, Any]:
    return {
        "workload": workload,
        "mode": mode,
        "wall_s": wall,
        "written": 2 * read,
        "read": read,
        "recomputed_s": 0.0,
        "peak": 0,
        "drops": 0,
        "prefetches": 0,
        "idle": 0,
    }


def test_ratios_over_stock_and_the_goals() -> None:
    runs = [
        run("reuse", "stock", 10.0, 1000),
        run("reuse", "value", 7.0, 400),
        run("reuse", "value+", 8.0, 400),
        run("fits", "stock", 10.0, 0),
        run("fits", "value", 10.2, 0),
        run("fits", "value+", 10.5, 0),
    ]
    table = summarize(runs, ["reuse", "fits"], list(MODES))
    assert table["reuse"]["value"]["read_ratio"] == 0.4
    assert table["reuse"]["value"]["wall_ratio"] == 0.7
    assert table["fits"]["value"]["read_ratio"] is None  # nothing read back by stock
    met = goals(table)
    assert met["value"] == {"met": ["reuse", "fits"], "missed": []}
    assert met["value+"] == {"met": [], "missed": ["reuse", "fits"]}  # 0.8x wall, +5%


def test_every_mode_has_valid_rules() -> None:
    import json

    for mode in MODES:
        _, diagnostics = check_text(json.dumps(rules_of(mode)), f"<{mode}>")
        assert not diagnostics, (mode, diagnostics)
    assert "spill" not in rules_of("stock")
