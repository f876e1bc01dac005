"""The transfer meter (amm_rules.engine.state.transfer): bytes a worker sent per second,
from its heartbeats' metrics."""

from __future__ import annotations

from amm_rules.engine.state.transfer import TransferMeter, sent_bytes


def beat(memory: int = 0, disk: int = 0) -> dict:
    return {
        "digests_total_since_heartbeat": {
            ("get-data", "memory-read", "bytes"): memory,
            ("get-data", "disk-read", "bytes"): disk,
            ("get-data", "network", "seconds"): 0.5,
        }
    }


def test_the_bytes_sent_are_read_from_memory_and_from_disk() -> None:
    assert sent_bytes(beat(100, 20)) == 120
    assert sent_bytes({"digests_total_since_heartbeat": {}}) == 0
    assert sent_bytes({}) is None and sent_bytes(None) is None


def test_the_rate_counts_from_the_first_heartbeat_after_the_watch() -> None:
    meter = TransferMeter(window=10)
    meter.watch("w")
    meter.heartbeat("w", 100.0, beat(5_000))  # partly sent before the watch: not counted
    assert meter.rate("w") is None
    meter.heartbeat("w", 101.0, beat(1_000))
    meter.heartbeat("w", 102.0, beat(3_000))
    assert meter.rate("w") == 2_000.0
    assert meter.sent("w") == 4_000


def test_old_heartbeats_leave_the_window() -> None:
    meter = TransferMeter(window=2)
    meter.watch("w")
    for t, n in [(0.0, 0), (1.0, 9_000), (2.0, 1_000), (3.0, 1_000), (4.0, 1_000)]:
        meter.heartbeat("w", t, beat(n))
    # Only the heartbeats of the last two seconds count, from the one before them.
    assert meter.rate("w") == 1_000.0


def test_unwatched_workers_and_blind_heartbeats_cost_nothing() -> None:
    meter = TransferMeter()
    meter.heartbeat("other", 1.0, beat(10))
    assert meter.heard == 0 and "other" not in meter.samples
    meter.watch("w")
    meter.heartbeat("w", 1.0, {"transfer": {}})
    assert meter.heard == 1 and meter.blind == 1 and meter.rate("w") is None
    meter.forget("w")
    assert meter.rate("w") is None
