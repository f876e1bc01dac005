"""Adaptive scaling's pure half (amm_rules.engine.decide.adaptive): the memory target,
which workers scale-down may close under the rules and why the others stay, and the
order of leaving; their sentences (amm_rules.engine.words)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from amm_rules.engine.decide.adaptive import (
    DISK,
    HELD_BACK,
    MIN,
    NEVER,
    NOWHERE,
    POOL,
    SPREAD,
    DiskMeter,
    HeldClass,
    Kept,
    LeavingCost,
    MemoryDemand,
    Slot,
    cheapest_first,
    expected_bytes,
    hold,
    memory_target,
)
from amm_rules.engine.words import kept_sentence, target_sentence
from amm_rules.language.ruleset import ALL, Target

GiB = 2**30
MiB = 2**20

# -- up ----------------------------------------------------------------------------------


def test_the_target_holds_the_data_under_the_headroom() -> None:
    # 4 GiB limits, 60% kept free: 1.6 GiB each; 5 GiB in memory and on disk -> 4.
    demand = MemoryDemand(limits=(4 * GiB,) * 2, in_memory=3 * GiB, on_disk=2 * GiB)
    t = memory_target(demand, headroom=0.6, disk_rate=MiB)
    assert t.per_worker == int(4 * GiB * 0.4)
    assert t.needed == 5 * GiB and t.expected == 0
    assert t.workers == 4
    assert t.rising == ()


def test_tasks_still_to_run_count_by_their_prefix_net_bytes_per_task() -> None:
    demand = MemoryDemand(
        limits=(GiB,),
        in_memory=100 * MiB,
        to_run={"load": 300, "sum": 40, "new": 10, "nothing": 0},
        # sum frees more than it produces; "new" has no finished task yet
        per_task={"load": 4 * MiB, "sum": -8 * MiB, "nothing": MiB},
    )
    assert expected_bytes(demand.to_run, demand.per_task) == {"load": 1200 * MiB}
    t = memory_target(demand, headroom=0.5, disk_rate=MiB)
    assert t.expected == 1200 * MiB and t.needed == 1300 * MiB
    assert t.workers == 3  # 1300 MiB / 512 MiB
    assert t.top == (("load", 300, 1200 * MiB),)


def test_no_data_asks_for_nothing_and_unknown_room_asks_for_nothing() -> None:
    assert memory_target(MemoryDemand(limits=(GiB,) * 3), 0.6, MiB).workers == 0
    # No worker: nothing known of the room the data will have.
    t = memory_target(MemoryDemand(limits=(), in_memory=GiB), 0.6, MiB)
    assert t.workers == 0 and t.needed == GiB
    # A worker without a memory limit: memory is not what bounds it.
    assert memory_target(MemoryDemand(limits=(GiB, 0), in_memory=5 * GiB), 0.6, MiB).workers == 0


def test_the_target_rises_by_one_while_workers_spill_or_producers_are_held() -> None:
    calm = MemoryDemand(limits=(GiB,) * 3, in_memory=GiB, on_disk=MiB, disk_rate=MiB // 2)
    assert memory_target(calm, 0.6, MiB).workers == 3
    spilling = MemoryDemand(limits=(GiB,) * 3, in_memory=GiB, on_disk=MiB, disk_rate=5 * MiB)
    t = memory_target(spilling, 0.6, MiB)
    assert t.workers == 4 and t.rising == (DISK,)
    held = MemoryDemand(limits=(GiB,) * 3, in_memory=GiB // 10, held_back=True)
    assert memory_target(held, 0.6, MiB).rising == (HELD_BACK,)
    assert memory_target(held, 0.6, MiB).workers == 4
    # Rising never lowers what the data needs.
    big = MemoryDemand(limits=(GiB,) * 3, in_memory=4 * GiB, held_back=True)
    assert memory_target(big, 0.6, MiB).workers == 10


def test_traffic_with_nothing_left_on_disk_asks_for_no_more() -> None:
    """The meter's window goes on counting what was read back a moment ago: once the
    data it read was released, nothing is on disk, and no worker more is asked."""
    released = MemoryDemand(limits=(GiB,) * 3, in_memory=GiB, disk_rate=50 * MiB)
    t = memory_target(released, 0.6, MiB)
    assert t.workers == 3 and t.rising == ()


def test_spilling_data_that_far_fewer_workers_hold_asks_for_no_more() -> None:
    """A few keys left on disk after the data was released: the data needs one worker
    of four; another would not help."""
    small = MemoryDemand(limits=(GiB,) * 4, in_memory=GiB // 10, on_disk=MiB, disk_rate=50 * MiB)
    assert memory_target(small, 0.6, MiB).rising == ()
    two = MemoryDemand(limits=(GiB,) * 2, in_memory=GiB // 10, on_disk=MiB, disk_rate=50 * MiB)
    assert memory_target(two, 0.6, MiB).rising == ()
    # Once risen, the worker the rise added is kept while the data needs all the
    # running workers but that one: not let go at once, and no further one asked for.
    after_rise = MemoryDemand(
        limits=(GiB,) * 4, in_memory=int(1.1 * GiB), on_disk=MiB, disk_rate=50 * MiB
    )
    assert memory_target(after_rise, 0.6, MiB).rising == ()
    t = memory_target(replace(after_rise, rose=True), 0.6, MiB)
    assert t.rising == () and t.keeps_rise and t.workers == 4
    assert "the worker added while the workers spilled is kept" in target_sentence(t)


def test_a_rise_on_disk_traffic_climbs_no_further_than_one_worker() -> None:
    """Spilling on, the data needing two workers of 0.4 GiB: the target asks for a
    third; once it runs, the target keeps three, not four (asking again for one more as
    each rise's worker joined climbed to four, then let two go at once)."""
    need = int(0.8 * GiB) - MiB  # with the MiB on disk: two workers' room
    rose = False
    asked = []
    for running in (2, 3, 3, 3):
        demand = MemoryDemand(
            limits=(GiB,) * running, in_memory=need, on_disk=MiB, disk_rate=50 * MiB, rose=rose
        )
        t = memory_target(demand, 0.6, MiB)
        rose = DISK in t.rising or t.keeps_rise
        asked.append(t.workers)
    assert asked == [3, 3, 3, 3]
    # Once the traffic stops, the kept worker may go.
    quiet = MemoryDemand(limits=(GiB,) * 3, in_memory=need, disk_rate=0.0, rose=True)
    assert memory_target(quiet, 0.6, MiB).workers == 2


def test_the_targets_sentence() -> None:
    demand = MemoryDemand(
        limits=(GiB,) * 2,
        in_memory=GiB - 10 * MiB,
        on_disk=10 * MiB,
        to_run={"load": 100},
        per_task={"load": 10 * MiB},
        disk_rate=12 * MiB,
    )
    text = target_sentence(memory_target(demand, 0.6, MiB))
    assert text == (
        "memory asks for 5 workers: 1.98 GiB to hold (0.98 GiB expected from the tasks to "
        "run: load 0.98 GiB), 409.60 MiB each under the headroom; one more than running: "
        "the workers write to disk or read back 12.00 MiB/s"
    )
    assert "no worker is running" in target_sentence(memory_target(MemoryDemand(()), 0.6, MiB))


# -- down: which may go ----------------------------------------------------------------


def slots(*spec: str) -> dict[str, Slot]:
    """``"a@h1:gpu,big"``: worker a on host h1 in pools gpu and big (``!`` at the end:
    paused)."""
    out = {}
    for s in spec:
        running = not s.endswith("!")
        s = s.rstrip("!")
        name, _, rest = s.partition("@")
        host, _, pools = rest.partition(":")
        out[name] = Slot(name, host or name, frozenset(filter(None, pools.split(","))), running)
    return out


PRECIOUS = {"replicate": "rule precious"}


def test_a_rules_minimum_keeps_the_workers_it_needs() -> None:
    workers = slots("a", "b", "c", "d")
    two = HeldClass(keys=12, target=Target.exact(2), sources=PRECIOUS)
    decided = hold(workers, [two], ["a", "b", "c", "d"])
    assert decided.allowed == ["a", "b"]
    assert decided.kept == {
        "c": [Kept(MIN, 12, "rule precious", 2)],
        "d": [Kept(MIN, 12, "rule precious", 2)],
    }
    assert kept_sentence("c", decided.kept["c"]) == (
        "kept c: 12 keys of rule precious would fall below min 2"
    )
    # Without hold-rules, only what a retirement would refuse holds a worker.
    assert hold(workers, [two], ["a", "b", "c", "d"], minimums=False).allowed == list("abcd")


def test_min_all_follows_the_workers_and_a_class_already_short_keeps_what_it_has() -> None:
    workers = slots("a", "b", "c")
    every = HeldClass(keys=5, target=Target.exact(ALL))
    assert hold(workers, [every], ["a", "b", "c"]).allowed == ["a", "b"]
    at_least = HeldClass(keys=5, target=Target(2, ALL))
    assert hold(workers, [at_least], ["a", "b", "c"]).allowed == ["a"]
    # Three copies wanted, two workers: already short; neither may go.
    three = HeldClass(keys=4, target=Target.exact(3), sources={"replicate": "rule three"})
    decided = hold(slots("a", "b"), [three], ["a", "b"])
    assert decided.allowed == [] and decided.kept["a"] == [Kept(MIN, 4, "rule three", 3)]


def test_a_pool_a_rule_needs_is_never_emptied_and_other_workers_go() -> None:
    workers = slots("g1@h:gpu", "g2@h:gpu", "c1", "c2")
    gpu = HeldClass(keys=7, pool=("gpu",), sources={"pool": "rule device"})
    decided = hold(workers, [gpu], ["g1", "g2", "c1", "c2"])
    assert decided.allowed == ["g1", "c1", "c2"]
    assert decided.kept == {"g2": [Kept(POOL, 7, "rule device", 0, ("gpu",))]}
    assert kept_sentence("g2", decided.kept["g2"]) == (
        "kept g2: 7 keys of rule device would have no worker in pool gpu"
    )
    # So does a class that avoids every worker but one.
    spot = HeldClass(keys=3, avoid=("spot",), sources={"avoid": "rule steady"})
    decided = hold(slots("s1@h1:spot", "s2@h2:spot", "x"), [spot], ["x", "s1", "s2"])
    assert decided.allowed == ["s1", "s2"] and decided.kept["x"][0].kind == POOL


def test_spread_host_keys_are_never_left_on_one_host() -> None:
    workers = slots("a1@h1", "a2@h1", "b1@h2", "b2@h2")
    spread = HeldClass(
        keys=9, target=Target.exact(2), spread="host", sources={"spread": "rule apart"}
    )
    decided = hold(workers, [spread], ["b1", "b2", "a1", "a2"])
    assert decided.allowed == ["b1", "a1"]
    assert decided.kept["b2"] == [Kept(SPREAD, 9, "rule apart", 1)]
    assert "9 keys of rule apart (spread: host) would be left on one host" in kept_sentence(
        "b2", decided.kept["b2"]
    )
    # On one host already (a LocalCluster), spread asks nothing more of scale-down.
    one_host = slots("a@h", "b@h", "c@h")
    assert hold(one_host, [spread], ["a", "b", "c"]).allowed == ["a"]


def test_keys_that_may_not_move_keep_a_holder_and_keys_with_nowhere_to_go_too() -> None:
    workers = slots("a", "b", "c")
    never = HeldClass(
        keys=2,
        move="never",
        holders=[frozenset({"a"}), frozenset({"a", "b"})],
        sources={"move": "rule pinned"},
    )
    decided = hold(workers, [never], ["b", "a", "c"])
    assert decided.allowed == ["b", "c"]
    # Both keys: one held only there, the other only there and on b, which goes.
    assert decided.kept == {"a": [Kept(NEVER, 2, "rule pinned")]}
    assert kept_sentence("a", decided.kept["a"]) == (
        "kept a: 2 keys of rule pinned (move: never) would have no copy left"
    )
    # Stranded also without hold-rules: the retirement would refuse it.
    assert hold(workers, [never], ["b", "a", "c"], minimums=False).kept == decided.kept
    nowhere = HeldClass(
        keys=1,
        pool=("gpu",),
        holders=[frozenset({"b"})],
        sources={"pool": "rule device"},
    )
    decided = hold(workers, [nowhere], ["a", "b", "c"], minimums=False)
    assert decided.kept == {"b": [Kept(NOWHERE, 1, "rule device", 0, ("gpu",))]}


def test_reasons_of_one_rule_add_up_and_each_rule_is_named() -> None:
    workers = slots("a", "b")
    classes = [
        HeldClass(keys=3, target=Target.exact(2), sources=PRECIOUS),
        HeldClass(keys=4, target=Target.exact(2), spread="none", sources=PRECIOUS),
        HeldClass(keys=1, target=Target(2, None), sources={"replicate": "amm annotation"}),
    ]
    decided = hold(workers, classes, ["a", "b"])
    assert decided.kept["a"] == [
        Kept(MIN, 7, "rule precious", 2),
        Kept(MIN, 1, "amm annotation", 2),
    ]


def test_paused_workers_receive_nothing_and_count_for_no_rule() -> None:
    workers = slots("a", "b", "p!")
    two = HeldClass(keys=1, target=Target.exact(2), sources=PRECIOUS)
    # The paused worker may go; the two running ones are the rule's.
    decided = hold(workers, [two], ["p", "a", "b"])
    assert decided.allowed == ["p"] and set(decided.kept) == {"a", "b"}


# -- the property: what is allowed is safe, and whatever was kept would not be ---------


def _safe(
    workers: Mapping[str, Slot], classes: Iterable[HeldClass], leaving: set[str], minimums: bool
) -> bool:
    """Closing ``leaving`` breaks no class (written from the rules, not from hold)."""
    for cls in classes:
        want = set(cls.pool) if cls.pool is not None else None
        shun = set(cls.avoid or ())
        eligible = {
            a
            for a, s in workers.items()
            if s.running and (want is None or want & s.pools) and not (shun & s.pools)
        }
        staying = eligible - leaving
        touched = bool(eligible & leaving)
        restricted = cls.pool is not None or cls.avoid is not None
        stay_put = cls.move == "never" or (restricted and not eligible)
        if stay_put and any(h and h <= leaving for h in cls.holders):
            return False
        if restricted and touched and not staying:
            return False
        if not minimums or not touched:
            continue
        lo = cls.target.bounds(len(staying))[0] if cls.target is not None else 1
        if len(staying) < lo:
            return False
        hosts = {workers[a].host for a in eligible}
        if cls.spread == "host" and len({workers[a].host for a in staying}) < min(lo, len(hosts)):
            return False
    return True


@st.composite
def clusters(draw: st.DrawFn) -> tuple[dict[str, Slot], list[HeldClass], list[str]]:
    n = draw(st.integers(1, 7))
    workers = {}
    for i in range(n):
        host = f"h{draw(st.integers(0, 2))}"
        pools = frozenset(p for p in ("gpu", "spot") if draw(st.booleans()))
        workers[f"w{i}"] = Slot(f"w{i}", host, pools, draw(st.integers(0, 5)) > 0)
    addresses = sorted(workers)
    classes = []
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.integers(0, 3))
        lo = draw(st.integers(1, 4))
        target = [None, Target.exact(lo), Target(lo, None), Target(lo, ALL)][kind]
        holders = [
            frozenset(draw(st.sets(st.sampled_from(addresses), max_size=3)))
            for _ in range(draw(st.integers(0, 3)))
        ]
        classes.append(
            HeldClass(
                keys=draw(st.integers(1, 5)),
                target=target,
                pool=draw(st.sampled_from([None, ("gpu",), ("gpu", "spot")])),
                avoid=draw(st.sampled_from([None, None, ("spot",)])),
                spread=draw(st.sampled_from([None, "host"])),
                move=draw(st.sampled_from([None, None, "never"])),
                holders=holders,
            )
        )
    candidates = draw(st.permutations(addresses))
    return workers, classes, list(candidates)


@settings(max_examples=300, deadline=None)
@given(clusters(), st.booleans())
def test_what_hold_allows_is_safe_and_what_it_keeps_would_not_be(
    drawn: tuple[dict[str, Slot], list[HeldClass], Sequence[str]], minimums: bool
) -> None:
    workers, classes, candidates = drawn
    decided = hold(workers, classes, candidates, minimums=minimums)
    assert sorted(decided.allowed + list(decided.kept)) == sorted(candidates)
    assert all(decided.kept.values())  # every worker kept says why
    allowed = set(decided.allowed)
    assert _safe(workers, classes, allowed, minimums)
    # Any part of what is allowed is safe too (adaptive may close fewer).
    for address in decided.allowed:
        assert _safe(workers, classes, allowed - {address}, minimums)
    # Each worker kept would have broken a class given those let go before it.
    before: set[str] = set()
    for address in candidates:
        if address in allowed:
            before.add(address)
        else:
            assert not _safe(workers, classes, before | {address}, minimums), address


# -- down: which first -------------------------------------------------------------------


def test_idle_workers_first_then_the_cheapest_to_move() -> None:
    costs = [
        LeavingCost("busy", busy=True),
        LeavingCost("big", nbytes=800 * MiB),
        # fewer bytes, but 200 MiB of them on disk: read back, then sent
        LeavingCost("spilled", nbytes=500 * MiB, on_disk=400 * MiB),
        # fewest bytes, but the only copies of an hour of compute
        LeavingCost("dear", nbytes=100 * MiB, at_risk=3600.0),
        LeavingCost("cheap", nbytes=100 * MiB),
    ]
    order = cheapest_first(costs, bandwidth=100 * MiB, disk_read=100 * MiB)
    assert order == ["cheap", "big", "spilled", "dear", "busy"]
    # The stock order (idle first, fewest bytes first) would have been:
    assert [c.address for c in sorted(costs, key=lambda c: (c.busy, c.nbytes))] == [
        "dear",
        "cheap",
        "spilled",
        "big",
        "busy",
    ]


def test_the_disk_meter_measures_over_its_window() -> None:
    meter = DiskMeter(window=10.0)
    assert meter.rate() is None and meter.read_speed() is None
    meter.sample(0.0, 0, 0, 0.0)
    assert meter.rate() is None
    meter.sample(2.0, 20 * MiB, 0, 0.0)
    assert meter.rate() == 10 * MiB
    meter.sample(4.0, 20 * MiB, 20 * MiB, 0.5)
    assert meter.rate() == 10 * MiB and meter.read_speed() == 40 * MiB
    # Once the spilling stops, the window forgets it.
    for t in range(6, 30, 2):
        meter.sample(float(t), 20 * MiB, 20 * MiB, 0.5)
    assert meter.rate() == 0.0
    # Totals that go back (a new scheduler) start the measure again.
    meter.sample(31.0, 0, 0, 0.0)
    assert meter.rate() is None
