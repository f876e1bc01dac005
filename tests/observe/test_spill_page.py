"""The dashboard page's spill table, from a status report (plain data, no Bokeh)."""

from __future__ import annotations

from amm_rules.observe.dashboard import spill_rows


def test_a_row_per_worker_and_the_workers_left_alone():
    report = {
        "spill": {
            "workers": {
                "tcp://a:1": {
                    "keys_on_disk": 3,
                    "bytes_on_disk": 3 * 2**20,
                    "written_bytes": 2**30,
                    "read_bytes": 2**29,
                    "drops": 2,
                    "drop_bytes": 2**21,
                    "prefetches": 5,
                    "near_spill": 0.91,
                    "lru_read_bytes": 3 * 2**20,
                    "read_since_bytes": 2**20,
                    "saved_read_bytes": 2 * 2**20,
                }
            },
            "left_alone": {"tcp://b:1": "its data is a dict, not a SpillBuffer"},
        }
    }
    rows = spill_rows(report)
    assert rows["worker"] == ["tcp://a:1", "tcp://b:1"]
    assert rows["on_disk"] == [
        "3 keys, 3.00 MiB",
        "left alone: its data is a dict, not a SpillBuffer",
    ]
    assert rows["drops"][0] == "2 (2.00 MiB)" and rows["near"] == ["91%", "-"]
    assert rows["saved"] == ["2.00 MiB (LRU ~3.00 MiB)", "-"]
    assert spill_rows({}) == {name: [] for name in rows}
