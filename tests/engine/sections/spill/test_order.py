"""The worker's order of eviction by value per byte, driven as a zict LRU drives it,
and the value of a key (pure: no cluster)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from zict import LRU

from amm_rules.engine.decide.spill import OVERHEAD, changed, value_per_byte
from amm_rules.engine.spill.order import (
    CONSUMED_AFTER,
    FIRST_BAND,
    LAST_BAND,
    ValueOrder,
    band,
)


def lru_with_order(
    n: float, neutral: float = 1.0, grace: float = 0.0, clock: Callable[[], float] = time.monotonic
) -> tuple[LRU, list[str], ValueOrder]:
    """An LRU evicting in a ValueOrder (a key consumed at once unless ``grace`` says)."""
    evicted: list[str] = []
    lru: LRU = LRU(n, {}, on_evict=lambda k, v: evicted.append(k), weight=lambda k, v: v)
    order = lru.order = ValueOrder(neutral=neutral, grace=grace, clock=clock)  # type: ignore[assignment]
    return lru, evicted, order


def test_the_lru_evicts_the_lowest_value_first_and_stock_order_among_unvalued_keys():
    lru, evicted, order = lru_with_order(10)
    order.set_values({"dear": math.inf, "cheap": 0.0})
    for key in ("dear", "a", "cheap", "b"):
        lru[key] = 2
    lru["c"] = 2
    lru["d"] = 2  # 12 > 10: one goes
    assert evicted == ["cheap"]
    lru["e"] = 2
    assert evicted == ["cheap", "a"], "unvalued keys: least recently used first"
    _ = lru["b"]  # b used: c goes before it
    lru["f"] = 2
    assert evicted == ["cheap", "a", "c"]
    lru.evict()
    lru.evict()
    lru.evict()
    assert "dear" not in evicted, "spill: last goes after everything else"
    assert list(order)[-1] == "dear"


def test_values_and_readers_move_a_present_key_between_bands():
    _, _, order = lru_with_order(100, neutral=1.0)
    for key in "xyz":
        order.add(key)
    assert list(order) == ["x", "y", "z"]
    assert order.set_values({"x": 50.0, "z": 0.01}) == 2
    assert list(order) == ["z", "y", "x"]
    order.set_readers({"z": 100.0})
    assert list(order) == ["y", "x", "z"]
    order.set_readers({})
    order.set_values({"z": None})
    assert order.sent("z") is None and order.value_of("z") == 1.0
    assert list(order) == ["z", "y", "x"], "z consumed: before the unvalued y"
    order.forget(["x"])
    assert order.sent("x") is None
    assert order.keys_by_use() == ["x", "y", "z"]


def test_keys_the_scheduler_did_not_value_count_their_readers_and_are_consumed():
    _, _, order = lru_with_order(100, neutral=1.0)
    for key in "abc":
        order.add(key)
    assert list(order) == ["a", "b", "c"], "no value, no reader: stock order"
    order.set_readers({"a": 1.0, "b": 1.0})
    assert list(order)[0] == "c", "a task about to read a and b: kept longer"
    order.update_readers({"a": 0.0})
    assert list(order) == ["a", "c", "b"], "a read: given up first"
    order.update_readers({"b": 0.0})
    assert list(order) == ["b", "a", "c"], "the last consumed first"


def test_a_key_counts_as_consumed_only_once_it_outlived_the_grace():
    """An intermediate result read by its last task is released by the scheduler within
    milliseconds: given up at once, it was written to disk for nothing (the workloads'
    double difference wrote twice stock's bytes). Consumed only if still present once
    the grace has passed, and then the last consumed first, as before."""
    now = [0.0]
    lru, evicted, order = lru_with_order(6, grace=CONSUMED_AFTER, clock=lambda: now[0])
    for key in ("old", "mid", "new"):
        lru[key] = 2
        order.update_readers({key: 1.0})
    order.update_readers({"new": 0.0})  # its last reader finished
    now[0] += CONSUMED_AFTER / 2
    assert list(order)[0] == "new", "its reader gone: below the read keys, in its band"
    order.update_readers({"mid": 0.0})
    del lru["new"]  # released by the scheduler within the grace
    lru["next"] = 2
    lru["more"] = 2  # 8 > 6: one goes
    assert evicted == ["mid"], "unread and unconsumed: least recently used first"
    now[0] += CONSUMED_AFTER
    order.update_readers({"old": 0.0})
    lru["last"] = 2
    assert evicted == ["mid", "next"], "old consumed within the grace: not yet first"
    now[0] += CONSUMED_AFTER
    assert list(order)[0] == "old", "still present past the grace: consumed, first to go"
    order.update_readers({"more": 1.0})
    order.update_readers({"more": 0.0})
    now[0] += CONSUMED_AFTER
    assert list(order)[:2] == ["more", "old"], "the last consumed first"
    order.update_readers({"old": 1.0})  # read again: in use
    assert list(order)[0] == "more"


def test_a_key_just_stored_counts_as_read_once_until_the_scheduler_comes_to_it():
    """The scheduler values a worker's keys once a cycle: a key stored since is young,
    counts as read once more (a key the scheduler will say is read stands where it
    will), is not given up as consumed yet, and stops being young once a value comes
    (or it is forgotten), or once ``young`` seconds passed. A read in memory keeps it
    young; so does a key read back from disk (else, among young keys, it would be
    written again at once). Read by a task of the worker, a key is young no more."""
    now = [0.0]
    lru, evicted, order = lru_with_order(100, grace=0.0, clock=lambda: now[0])
    order.young, order.young_value = 4.0, 0.5
    lru["unread"] = 2
    now[0] = 10.0  # unread: no longer young
    lru["young"] = 2
    lru["valued"] = 2
    order.set_values({"valued": 1.2})  # a band above the unvalued, below 1 + 0.5
    assert order.value_of("young") == 1.5 and order.sent("young") is None
    assert list(order) == ["unread", "valued", "young"], "young (1.5) after valued (1.2)"
    _ = lru["young"]  # read in memory: still young
    now[0] = 14.5  # 4.5 s since it was stored: the scheduler had nothing to say
    assert list(order) == ["unread", "young", "valued"], "young no more: stock order"
    lru["fresh"] = 2
    order.set_values({"fresh": None})  # the scheduler came to it: nothing to say
    assert order.value_of("fresh") == 1.0
    lru["again"] = 2
    order.set_values({"again": 3.0})  # its value: young no longer
    assert order.value_of("again") == 3.0
    lru.evict()
    lru.evict()
    assert evicted == ["unread", "young"]
    order.disk = {"young"}
    lru["young"] = 2  # read back from disk
    order.disk = ()
    assert order.value_of("young") == 1.5, "read back: young"
    order.update_readers({"young": 1.0})
    order.update_readers({"young": 0.0})
    assert order.value_of("young") == 1.0 and list(order)[0] == "young", "read, consumed"
    lru["new"] = 2
    assert order.value_of("new") == 1.5
    assert order.set_young_value(1.0) == 1, "a read back measured dearer: its band moves"
    assert order.value_of("new") == 2.0
    order.forget(["new"])
    assert order.value_of("new") == 1.0


def test_read_by_a_task_a_key_read_back_is_young_no_more_and_a_new_one_keeps_its_place():
    """A pass over a dataset reads back each key once: what it read within the grace must
    not stand tied with what it is about to read (least recently used first: the keys
    about to be read would go first). A new key read by its last task is most often an
    intermediate result the scheduler releases within milliseconds: it keeps its place
    through the grace."""
    now = [0.0]
    _, _, order = lru_with_order(100, grace=CONSUMED_AFTER, clock=lambda: now[0])
    disk = {"read"}  # the buffer deletes a key from disk once it is back in memory
    order.young, order.young_value, order.disk = 4.0, 1.0, disk
    for key in ("next", "read", "intermediate"):
        order.add(key)
    disk.clear()
    order.set_readers({"next": 1.0, "read": 1.0, "intermediate": 1.0})
    order.update_readers({"read": 0.0, "intermediate": 0.0})  # read, within the grace
    assert order.value_of("read") == 1.0 and order.value_of("next") == 2.0
    assert order.value_of("intermediate") == 2.0, "new: kept through the grace"
    assert list(order)[0] == "read"
    now[0] += CONSUMED_AFTER
    assert list(order)[:2] == ["intermediate", "read"], "consumed, the last first"
    assert order.value_of("intermediate") == 1.0


def test_bands():
    assert band(0.0) == FIRST_BAND and band(math.inf) == LAST_BAND
    assert band(1.0) == 0 and band(1.1) == band(1.0) and band(1.3) == 1
    assert band(1e-300) > FIRST_BAND


def test_the_value_of_a_key():
    rates = {"write": 2e-9, "read": 1e-9}
    big, small = 100 * 2**20, 10_000
    sole = value_per_byte(big, 0, 1, drop_copies=True, **rates)
    assert sole == pytest.approx((OVERHEAD + big * 2e-9) / big / 2e-9)  # in writes
    # Readers elsewhere make it dearer; a copy elsewhere (drop-copies) cheaper.
    assert value_per_byte(big, 2, 1, drop_copies=True, **rates) > sole
    assert value_per_byte(big, 0, 2, drop_copies=True, **rates) == 0.0
    assert value_per_byte(big, 0, 2, drop_copies=False, **rates) == sole
    # Small keys cost their overhead for few bytes: kept before large ones.
    assert value_per_byte(small, 0, 1, drop_copies=True, **rates) > sole
    assert value_per_byte(big, 5, 1, drop_copies=True, spill="first", **rates) == 0.0
    assert value_per_byte(1, 0, 1, drop_copies=True, spill="last", **rates) == math.inf
    # A copy released once dependents elsewhere finish: kept as one about to be read
    # (writing it frees memory that its release would have freed anyway).
    releasing = value_per_byte(big, 0, 2, drop_copies=False, releasing=True, **rates)
    assert releasing == pytest.approx(value_per_byte(big, 1, 1, drop_copies=False, **rates))
    assert value_per_byte(big, 0, 2, drop_copies=True, releasing=True, **rates) == 0.0
    assert changed(None, 1.0) and not changed(1.0, 1.1) and changed(1.0, 1.2)
    assert changed(1.0, math.inf) and changed(0.0, 1.0) and not changed(0.0, 0.0)


def test_readers_updated_key_by_key():
    _, _, order = lru_with_order(100, neutral=1.0)
    for key in "xyz":
        order.add(key)
    order.set_values({"x": 1.0, "y": 1.0, "z": 1.0})
    order.set_readers({"x": 10.0, "y": 10.0})
    assert list(order)[0] == "z" and set(list(order)[1:]) == {"x", "y"}
    assert order.update_readers({"x": 0.0}) == 1
    assert list(order) == ["x", "z", "y"], "consumed: before the keys of its value"
    assert order.value_of("x") == 1.0 and order.value_of("y") == 11.0
    order.update_readers({"y": 0.0})
    assert list(order) == ["y", "x", "z"], "the last consumed first"
    order.remove("x")
    order.add("x")  # read again: in use, no longer consumed
    assert list(order) == ["y", "z", "x"]


def test_the_table_of_keys_on_disk():
    from amm_rules.engine.state.spilled import SpilledKeys

    table = SpilledKeys()
    table.report("w1", 100.0, [("a", 40.0, 10), ("b", 0.0, 5)], fast=90, target=100)
    table.report("w2", 100.0, [("a", 1.0, 10)], fast=10, target=100, process=80, spill_at=100)
    assert table.on_disk("a") == {"w1": 60.0, "w2": 99.0}
    assert table.workers["w1"].bytes == 15 and table.total_bytes() == 25
    assert table.workers["w1"].fullness == 0.9 and table.workers["w2"].fullness == 0.8
    assert table.workers["w2"].excess(0.7) == 80 - 70
    table.report("w1", 101.0, [("b", 0.0, 7)], ["a"])
    assert table.workers["w1"].bytes == 7 and table.on_disk("a") == {"w2": 99.0}
    table.worker_left("w2")
    assert "a" not in table and table.is_on_disk("b", "w1")
    table.alone("w3", "its data is a dict")
    assert table.left_alone == {"w3": "its data is a dict"}


def test_the_shadow_reads_back_what_least_recently_used_reads_back():
    """With no value and no reader the order is least-recently-used's: what the shadow
    says a stock buffer would have read back is what the buffer read back."""
    import random

    from zict import Buffer

    from amm_rules.engine.spill.order import ShadowLRU

    shadow = ShadowLRU()
    read: list[int] = []

    class Disk(dict):  # type: ignore[type-arg]
        def __getitem__(self, key: str) -> int:
            read.append(super().__getitem__(key))
            return super().__getitem__(key)

    def weigh(key: str, value: int) -> int:
        shadow.touch(key, value)
        return value

    buffer: Buffer = Buffer({}, Disk(), n=100, weight=weigh)
    lru = buffer.fast
    order = lru.order = ValueOrder(neutral=1.0, weights=lru.weights, shadow=shadow, grace=0.0)  # type: ignore[assignment]
    lru.on_evict.insert(0, lambda k, v: shadow.fit(lru.total_weight - lru.weights[k]))
    rng = random.Random(4)
    sizes = {f"k{i}": rng.randint(5, 30) for i in range(20)}
    for _ in range(500):
        key = rng.choice(list(sizes))
        if key in buffer:  # a task reads it
            _ = buffer[key]
        else:  # computed (again, once released)
            buffer[key] = sizes[key]
        if rng.random() < 0.03:
            victim = rng.choice(list(sizes))
            if victim in buffer:
                del buffer[victim]
                shadow.forget(victim)
    assert read and shadow.read_bytes == sum(read) and shadow.reads == len(read)
    assert list(order) == list(shadow.memory)


def test_a_key_written_again_as_it_is_read_back_stays_on_disk_in_the_plugins_table(
    tmp_path: Path,
) -> None:
    """The buffer makes room before it tells of a read back: a key read back and, being
    the first to go, written again at once is on disk, and the table of keys on disk
    (what the scheduler is told, what prefetch reads back) says so."""
    from distributed.spill import SpillBuffer

    from amm_rules.engine.spill.plugin import SpillPlugin

    buffer = SpillBuffer(str(tmp_path), target=1_000)
    plugin = SpillPlugin()
    plugin.data = buffer
    buffer.fast_to_slow_callbacks.append(plugin._written)
    buffer.slow_to_fast_callbacks.append(plugin._read_back)
    fast = buffer.fast
    order = fast.order = ValueOrder(fast.order, neutral=1.0, weights=fast.weights)
    order.set_values({"first": 0.0})  # spill: first
    buffer["first"] = b"f" * 600
    buffer["other"] = b"o" * 600  # 1,200 > 1,000: "first" goes
    assert "first" in buffer.slow and "first" in plugin.on_disk
    assert buffer["first"] == b"f" * 600  # read back, and the first to go again
    assert "first" in buffer.slow and "first" in plugin.on_disk
    assert "first" not in plugin.gone, "not told as gone from disk"
