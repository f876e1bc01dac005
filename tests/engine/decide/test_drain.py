"""The drain's order of value and its prediction (amm_rules.engine.decide.drain): pure;
the prediction's sentence (amm_rules.engine.words), with dask's sizes."""

from __future__ import annotations

from amm_rules.engine.decide.drain import (
    BELOW_MIN,
    RECOMPUTE,
    REST,
    DrainItem,
    predict,
    rank,
)
from amm_rules.engine.words import prediction_sentence

CHEAP_LARGE = DrainItem("cheap-large", nbytes=1_000_000, seconds=0.5, group="cheap")
DEAR_SMALL = DrainItem("dear-small", nbytes=1_000, seconds=30.0, group="dear")
MIDDLE = DrainItem("middle", nbytes=10_000, seconds=5.0, group="middle")
UNKNOWN_BIG = DrainItem("unknown-big", nbytes=50_000, group="scattered")
UNKNOWN_SMALL = DrainItem("unknown-small", nbytes=500, group="scattered")
PINNED = DrainItem("pinned", nbytes=2_000_000, seconds=0.1, minimum=2, staying=1, rule="two")
PINNED_ALONE = DrainItem("pinned-alone", nbytes=3_000_000, minimum=2, staying=0, rule="two")


def test_a_rules_minimum_first_then_recompute_per_byte_then_the_rest() -> None:
    items = [UNKNOWN_BIG, CHEAP_LARGE, PINNED, MIDDLE, UNKNOWN_SMALL, DEAR_SMALL, PINNED_ALONE]
    ranked = [i.key for i in rank(items)]
    assert ranked == [
        "pinned-alone",  # below its minimum, no copy stays
        "pinned",  # below its minimum, one copy stays
        "dear-small",  # 30 s for 1 kB
        "middle",  # 5 s for 10 kB
        "cheap-large",  # 0.5 s for 1 MB
        "unknown-small",  # no estimate: the smallest first
        "unknown-big",
    ]
    assert [i.tier for i in rank(items)] == [BELOW_MIN] * 2 + [RECOMPUTE] * 3 + [REST] * 2


def test_ties_keep_the_order_the_keys_came_in() -> None:
    a = DrainItem("a", nbytes=100, seconds=1.0)
    b = DrainItem("b", nbytes=100, seconds=1.0)
    assert [i.key for i in rank([a, b])] == ["a", "b"]
    assert [i.key for i in rank([b, a])] == ["b", "a"]


def test_a_key_that_needs_two_copies_costs_twice_its_bytes() -> None:
    item = DrainItem("k", nbytes=100, copies=2, seconds=4.0)
    assert item.bytes_needed == 200
    assert item.worth == 4.0 / 200


def test_the_prediction_walks_the_order_at_the_rate() -> None:
    ranked = rank([CHEAP_LARGE, DEAR_SMALL, MIDDLE, UNKNOWN_SMALL])
    # 1,000 B/s for 20 s: the dear and middle keys (11 kB) fit, the large one does not,
    # and nothing after the first that does not fit is counted as in time.
    p = predict(ranked, rate=1_000, seconds_left=20, rate_source="heartbeats")
    assert p.in_time_keys == 2 and p.in_time_bytes == 11_000
    assert p.lost_keys == 2 and p.lost_bytes == 1_000_500
    assert p.lost_seconds == 0.5 and p.lost_unknown == 1
    assert p.cutoff == 2
    text = prediction_sentence(p)
    assert text.startswith(
        "at 0.98 kiB/s (heartbeats), 10.74 kiB of 0.96 MiB will leave in time; "
    )
    assert "of recompute will be lost: 2 keys (cheap 500 ms)" in text
    assert "1 without an estimate" in text


def test_a_key_below_its_minimum_with_a_copy_elsewhere_is_not_lost() -> None:
    p = predict(rank([PINNED, DEAR_SMALL]), rate=1, seconds_left=1)
    assert p.lost_keys == 1 and p.below_min == 1
    assert p.lost_seconds == 30.0
    assert "1 left below their minimum" in prediction_sentence(p)


def test_keys_that_cannot_move_are_lost_whatever_the_rate() -> None:
    frozen = DrainItem("frozen", nbytes=10, seconds=600.0, group="frozen")
    p = predict([DEAR_SMALL], rate=1e12, seconds_left=60, cannot_move=[frozen])
    assert p.in_time_keys == 1 and p.lost_keys == 0
    assert p.cannot_move == 1 and p.cannot_move_seconds == 600.0
    assert "≈ 600 s of recompute will be lost: 1 key (frozen 600 s)" in prediction_sentence(p)
    assert "1 that cannot move" in prediction_sentence(p)


def test_everything_in_time_says_how_long_it_takes() -> None:
    p = predict([DEAR_SMALL, MIDDLE], rate=1_100, seconds_left=60, rate_source="assumed")
    assert p.lost_keys == 0
    assert prediction_sentence(p) == (
        "at 1.07 kiB/s (assumed), all 10.74 kiB will leave in time (≈ 10 s of 60 s left)"
    )
    assert prediction_sentence(predict([], 1.0, 1.0)) == "every key is safe: nothing left to move"


def test_a_key_on_disk_costs_its_read_back_too() -> None:
    """Of two keys alike, the one in memory on the draining worker goes first."""
    on_disk = DrainItem("on-disk", nbytes=100, seconds=1.0, on_disk=100)
    in_memory = DrainItem("in-memory", nbytes=100, seconds=1.0)
    assert on_disk.cost == 200 and on_disk.worth == 1.0 / 200
    assert [i.key for i in rank([on_disk, in_memory])] == ["in-memory", "on-disk"]
    unknown_on_disk = DrainItem("u-disk", nbytes=100, on_disk=100)
    unknown = DrainItem("u", nbytes=150)
    assert [i.key for i in rank([unknown_on_disk, unknown])] == ["u", "u-disk"]
