"""Pure tests of the rebalance decisions (:mod:`amm_rules.engine.rebalance.plan`): no cluster.

Most tests build a small :class:`Model` of a cluster (workers with limits, keys with
sizes and holders), plan one cycle, and look at the plan; the convergence tests apply
plans to the model cycle after cycle, as the engine and the AMM would, with copies
landing between cycles and drops applied when :class:`MoveBook` says the copy landed.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from amm_rules.engine.rebalance.plan import (
    ABOVE,
    NEEDED,
    SIZE_MISSES,
    SPILLING,
    TOO_SMALL,
    Move,
    MoveBook,
    PendingMove,
    RebalancePlan,
    WorkerLoad,
    minimum_bytes_to_balance,
    plan_rebalance,
    settle_moves,
    smallest_move,
)
from amm_rules.language.ruleset import RebalanceSettings

MiB = 2**20
GiB = 2**30

ON = RebalanceSettings(enabled=True)


class Model:
    """A cluster as rebalance sees it: keys (with sizes) on workers (with limits)."""

    def __init__(self, limits: dict[str, int], unmanaged: int = 0):
        self.limits = dict(limits)
        self.unmanaged = {a: unmanaged for a in limits}
        self.data: dict[str, dict[Hashable, int]] = {a: {} for a in limits}
        self.who_has: dict[Hashable, set[str]] = {}
        self.spilled: dict[str, int] = {a: 0 for a in limits}
        #: Bytes each worker can take before it spills (None: thresholds off).
        self.headroom: dict[str, int | None] = {a: None for a in limits}
        self.paused: set[str] = set()
        #: Copies requested and not yet landed: (key, recipient).
        self.in_transit: list[tuple[Hashable, str]] = []
        self.copied = 0
        self.calls: list[tuple[str, bool]] = []

    def put(self, address: str, key: Hashable, nbytes: int) -> None:
        self.data[address][key] = nbytes
        self.who_has.setdefault(key, set()).add(address)

    def fill(self, address: str, n: int, nbytes: int, prefix: str | None = None) -> None:
        for i in range(n):
            self.put(address, f"{prefix or address}-{i}", nbytes)

    def drop(self, address: str, key: Hashable) -> None:
        del self.data[address][key]
        self.who_has[key].discard(address)

    def release(self, key: Hashable) -> None:
        for a in self.who_has.pop(key, ()):
            del self.data[a][key]

    def remove_worker(self, address: str) -> None:
        for key in self.data.pop(address):
            self.who_has[key].discard(address)
            if not self.who_has[key]:
                del self.who_has[key]
        del self.limits[address]

    def memory(self, address: str) -> int:
        return sum(self.data[address].values()) + self.unmanaged[address]

    def loads(self) -> list[WorkerLoad]:
        return [
            WorkerLoad(
                a,
                self.memory(a),
                self.limits[a],
                running=a not in self.paused,
                spilled=self.spilled[a],
                headroom=self.headroom[a],
            )
            for a in self.limits
        ]

    def fractions(self) -> list[float]:
        return [self.memory(a) / self.limits[a] for a in self.limits]

    def keys_on(self, address: str, newest_first: bool):
        self.calls.append((address, newest_first))
        items = self.data[address].items()
        return reversed(items) if newest_first else items

    def holders(self, key: Hashable) -> Collection[str] | None:
        return self.who_has.get(key) or None

    def can_place(self, key: Hashable, address: str) -> str | None:
        return "already holds a copy" if address in self.who_has.get(key, ()) else None

    def plan(self, settings: RebalanceSettings = ON, **kw) -> RebalancePlan:
        kw.setdefault("can_move", lambda k, a: None)
        kw.setdefault("can_place", self.can_place)
        return plan_rebalance(self.loads(), settings, keys_on=self.keys_on, **kw)

    def land(self) -> None:
        """Every requested copy lands (between two AMM cycles)."""
        for key, recipient in self.in_transit:
            if key in self.who_has and recipient in self.limits:
                self.put(recipient, key, next(iter(self.data[a][key] for a in self.who_has[key])))
        self.in_transit.clear()

    def cycle(
        self,
        book: MoveBook,
        now: float,
        settings: RebalanceSettings = ON,
        can_move: Callable = lambda k, a: None,
        can_place: Callable | None = None,
    ) -> RebalancePlan:
        """One AMM cycle: settle, plan, start the copies; the drops are enacted after
        the policy has run, as the AMM does."""
        settled = book.settle(now, holders=self.holders, alive=self.limits)
        for p in settled.drops:
            assert p.recipient in self.who_has[p.key], "drop before the copy landed"
        plan = self.plan(
            settings,
            can_move=can_move,
            can_place=can_place or self.can_place,
            pending=book.pending.values(),
            cooling=book.cooling(now),
            previous=book.roles,
        )
        for m in plan.moves:
            book.start(m, now)
            self.in_transit.append((m.key, m.recipient))
            self.copied += m.nbytes
        book.remember(plan)
        for p in settled.drops:
            self.drop(p.sender, p.key)
        return plan


def converge(model: Model, settings: RebalanceSettings = ON, cycles: int = 30, **kw):
    """Run cycles (2 s apart) until a plan moves nothing and nothing is in flight.
    Returns (cycles that moved data, plans, the book)."""
    book = MoveBook(cooldown=60)
    plans = []
    for i in range(cycles):
        plan = model.cycle(book, now=2.0 * i, settings=settings, **kw)
        plans.append(plan)
        model.land()
        if not plan.moves and not book.pending:
            break
    return sum(1 for p in plans if p.moves), plans, book


def max_over_mean(model: Model) -> float:
    mean = sum(model.memory(a) for a in model.limits) / sum(model.limits.values())
    return max(model.fractions()) / mean


# --- pairing ---------------------------------------------------------------------------


def test_pairs_fullest_sender_with_emptiest_recipient():
    m = Model({"full": 10 * GiB, "half": 10 * GiB, "low": 10 * GiB, "empty": 10 * GiB})
    m.fill("full", 80, 100 * MiB)  # ~78%
    m.fill("half", 60, 100 * MiB)  # ~59%
    m.fill("low", 20, 100 * MiB)  # ~20%
    plan = m.plan(replace(ON, max_bytes_per_cycle=100 * MiB))
    assert [(mv.sender, mv.recipient) for mv in plan.moves] == [("full", "empty")]
    assert plan.senders == {"full", "half"}
    assert plan.recipients == {"low", "empty"}
    assert "full at 78%" in plan.moves[0].reason


def test_no_worker_sends_and_receives_and_nobody_crosses_the_mean():
    m = Model({f"w{i}": 10 * GiB for i in range(6)})
    for i, n in enumerate([90, 70, 50, 10, 5, 0]):
        m.fill(f"w{i}", n, 100 * MiB)
    plan = m.plan(replace(ON, max_bytes_per_cycle=100 * GiB))
    assert plan.moves
    assert not plan.senders & plan.recipients
    after = {a: m.memory(a) for a in m.limits}
    for mv in plan.moves:
        assert mv.sender in plan.senders and mv.recipient in plan.recipients
        after[mv.sender] -= mv.nbytes
        after[mv.recipient] += mv.nbytes
    for a in plan.senders:
        assert after[a] / m.limits[a] >= plan.mean
    for a in plan.recipients:
        assert after[a] / m.limits[a] <= plan.mean


def test_recipient_that_already_holds_the_key_is_skipped():
    m = Model({"a": 10 * GiB, "b": 10 * GiB, "c": 10 * GiB})
    m.put("a", "x", 4 * GiB)
    m.put("b", "x", 4 * GiB)  # b holds a replica and is the emptiest after a
    m.put("a", "y", 3 * GiB)
    plan = m.plan()
    assert all(mv.recipient != "b" or mv.key != "x" for mv in plan.moves)


def test_a_replicated_key_moves_at_most_once_per_plan():
    m = Model({"a": 10 * GiB, "b": 10 * GiB, "c": 10 * GiB, "d": 10 * GiB})
    for i in range(8):
        m.put("a", f"k{i}", 1 * GiB)
        m.put("b", f"k{i}", 1 * GiB)
    plan = m.plan(replace(ON, max_bytes_per_cycle=100 * GiB))
    keys = [mv.key for mv in plan.moves]
    assert keys and len(keys) == len(set(keys))
    assert plan.skipped.get("moved by this plan from another holder", 0) > 0


# --- budget, gap, thresholds -------------------------------------------------------


def test_budget_per_cycle_is_never_exceeded():
    m = Model({"a": 10 * GiB, "b": 10 * GiB})
    m.fill("a", 80, 100 * MiB)
    plan = m.plan()  # default budget 512 MiB
    assert plan.budget == 512 * MiB
    assert len(plan.moves) == 5
    assert plan.bytes == sum(mv.nbytes for mv in plan.moves) == 500 * MiB
    assert plan.stopped == "budget spent"
    assert m.plan(budget=250 * MiB).bytes == 200 * MiB


def test_key_larger_than_the_budget_never_moves():
    m = Model({"a": 10 * GiB, "b": 10 * GiB})
    m.fill("a", 8, 1 * GiB)
    plan = m.plan()
    assert plan.moves == ()
    assert plan.skipped == {"larger than the budget left this cycle": 8}


def test_gap_dead_band():
    m = Model({"a": 10 * GiB, "b": 10 * GiB})
    # 46% and 36%: mean 41%, both within 5% of it (gap 10%).
    m.fill("a", 46, 100 * MiB)
    m.fill("b", 36, 100 * MiB)
    plan = m.plan()
    assert plan.moves == ()
    assert plan.roles == {"a": "within gap", "b": "within gap"}
    # A narrower gap makes them a sender and a recipient.
    plan = m.plan(replace(ON, gap=0.04))
    assert plan.roles == {"a": "sender", "b": "recipient"}
    assert plan.moves


def _at(m: Model, percents: dict[str, int]) -> Model:
    for address, pct in percents.items():
        m.fill(address, pct * 4, m.limits[address] // 400)  # keys of 1% / 4
    return m


def test_workers_inside_the_band_top_up_only_when_needed():
    # a is far above the mean; everybody else is just inside the band, below the mean.
    m = _at(Model({a: 10 * GiB for a in "abcd"}), {"a": 60, "b": 48, "c": 48, "d": 48})
    plan = m.plan(replace(ON, max_bytes_per_cycle=4 * GiB))
    assert plan.roles == {"a": "sender", "b": "recipient", "c": "recipient", "d": "recipient"}
    assert plan.bytes == pytest.approx(0.09 * 10 * GiB, rel=0.05)  # a down to the mean
    # When the workers below the band can take it all, those inside it stay put.
    m = _at(Model({a: 10 * GiB for a in "abce"}), {"a": 60, "b": 20, "c": 39, "e": 43})
    plan = m.plan()
    assert plan.roles["c"] == "within gap" and plan.recipients == {"b"}
    assert plan.moves and all(mv.recipient == "b" for mv in plan.moves)


def test_sender_min_no_moves_while_everybody_is_low():
    m = Model({"a": 10 * GiB, "b": 10 * GiB})
    m.fill("a", 28, 100 * MiB)  # 27%, below the default sender-min of 30%
    plan = m.plan()
    assert plan.moves == ()
    assert plan.roles["a"].startswith("below sender-min")
    assert m.plan(replace(ON, sender_min=0.2)).moves


def test_recipient_max_and_no_filling_past_it():
    m = Model({"a": 10 * GiB, "b": 10 * GiB, "c": 10 * GiB})
    m.fill("a", 95, 100 * MiB)  # 93%
    m.fill("b", 90, 100 * MiB)  # 88%
    m.fill("c", 45, 100 * MiB)  # 44%, below the mean (75%) but ...
    settings = replace(ON, recipient_max=0.40, max_bytes_per_cycle=100 * GiB)
    plan = m.plan(settings)
    assert plan.roles["c"].startswith("above recipient-max")
    assert plan.moves == ()
    # With a higher recipient-max, c fills up to it and no further.
    settings = replace(settings, recipient_max=0.60)
    plan = m.plan(settings)
    received = sum(mv.nbytes for mv in plan.moves if mv.recipient == "c")
    assert received > 0
    assert m.memory("c") + received <= 0.60 * 10 * GiB


def test_heterogeneous_limits_are_fractions_of_each_workers_own_limit():
    m = Model({"small": 10 * GiB, "big": 40 * GiB})
    m.fill("small", 50, 100 * MiB)  # 4.9 GiB, 49%
    m.fill("big", 50, 100 * MiB)  # the same bytes, 12%
    plan = m.plan(replace(ON, max_bytes_per_cycle=100 * GiB))
    assert plan.roles == {"small": "sender", "big": "recipient"}
    assert all(mv.sender == "small" for mv in plan.moves)
    # The mean is total over total: both end near 19.5%.
    assert plan.mean == pytest.approx(100 * 100 * MiB / (50 * GiB))


def test_paused_worker_sends_but_never_receives():
    m = Model({"a": 10 * GiB, "b": 10 * GiB, "c": 10 * GiB})
    m.fill("a", 80, 100 * MiB)
    m.paused = {"a", "b"}
    plan = m.plan()
    assert plan.roles["b"] == "not running (paused)"
    assert plan.moves and {mv.recipient for mv in plan.moves} == {"c"}


def test_worker_without_memory_limit_is_left_alone():
    m = Model({"a": 10 * GiB, "b": 10 * GiB, "nolimit": 0})
    m.fill("a", 80, 100 * MiB)
    plan = m.plan()
    assert plan.roles["nolimit"] == "no memory limit"
    assert all("nolimit" not in (mv.sender, mv.recipient) for mv in plan.moves)


def test_disabled_plans_nothing():
    m = Model({"a": 10 * GiB, "b": 10 * GiB})
    m.fill("a", 80, 100 * MiB)
    plan = m.plan(RebalanceSettings(enabled=False))
    assert plan.moves == () and plan.stopped == "disabled"


# --- rules and the running computation -------------------------------------------------


def test_pools_are_respected_through_can_place():
    m = Model({"gpu0": 10 * GiB, "gpu1": 10 * GiB, "cpu0": 10 * GiB, "cpu1": 10 * GiB})
    m.fill("gpu0", 40, 100 * MiB, prefix="dev")  # device data: gpu pool only
    m.fill("gpu0", 40, 100 * MiB, prefix="host")

    def can_place(key, address):
        if key.startswith("dev") and not address.startswith("gpu"):
            return "outside pool gpu"
        return m.can_place(key, address)

    plan = m.plan(replace(ON, max_bytes_per_cycle=100 * GiB), can_place=can_place)
    assert plan.moves
    for mv in plan.moves:
        assert mv.recipient.startswith("gpu") or not mv.key.startswith("dev")
    assert any(mv.key.startswith("dev") and mv.recipient == "gpu1" for mv in plan.moves)


def test_move_never_and_waiters_are_respected_through_can_move():
    m = Model({"a": 10 * GiB, "b": 10 * GiB})
    m.fill("a", 80, 100 * MiB)
    pinned = {"a-0", "a-1"}
    read = {"a-2": "read by a task processing on a"}

    def can_move(key, sender):
        if key in pinned:
            return "move: never (rule costly-pickles)"
        return read.get(key)

    plan = m.plan(can_move=can_move)
    moved = {mv.key for mv in plan.moves}
    assert moved and not moved & (pinned | set(read))
    assert plan.skipped["move: never (rule costly-pickles)"] == 2
    assert plan.skipped["read by a task processing on a"] == 1


@pytest.mark.parametrize("answer", [False, ""])
def test_a_falsy_refusal_is_a_refusal(answer):
    m = Model({"a": 10 * GiB, "b": 10 * GiB})
    m.fill("a", 80, 100 * MiB)
    assert m.plan(can_place=lambda k, a: answer).moves == ()
    assert m.plan(can_move=lambda k, a: answer).moves == ()
    assert m.plan(can_move=lambda k, a: True).moves  # True means allowed


def test_keys_in_flight_or_cooling_do_not_move():
    m = Model({"a": 10 * GiB, "b": 10 * GiB})
    m.fill("a", 80, 100 * MiB)
    plan = m.plan(cooling={"a-0", "a-1"}, pending=[PendingMove("a-2", "a", "b", 100 * MiB, 0.0)])
    moved = {mv.key for mv in plan.moves}
    assert moved and not moved & {"a-0", "a-1", "a-2"}
    assert plan.skipped["moved recently (cool-down)"] == 2
    assert plan.skipped["move in flight"] == 1


def test_moves_in_flight_count_as_done_and_lock_roles():
    m = Model({"a": 10 * GiB, "b": 10 * GiB, "c": 10 * GiB})
    m.fill("a", 60, 100 * MiB)
    m.fill("c", 30, 100 * MiB)
    # 3 GiB already on their way from a to b: a is at the mean once they land.
    pending = [PendingMove(f"a-{i}", "a", "b", 100 * MiB, 0.0) for i in range(30)]
    plan = m.plan(pending=pending)
    assert plan.roles["a"] == "within gap" and plan.moves == ()
    # b is receiving: even if it were far above the mean it would not send.
    m.fill("b", 80, 100 * MiB, prefix="b")
    plan = m.plan(pending=pending)
    assert plan.roles["b"] == "receiving a move in flight"
    assert all(mv.sender != "b" for mv in plan.moves)


def test_scan_is_bounded_when_nothing_can_move():
    m = Model({"a": 10 * GiB, "b": 10 * GiB})
    m.fill("a", 5000, 1 * MiB)
    calls = []

    def can_move(key, sender):
        calls.append(key)
        return "pinned"

    plan = m.plan(can_move=can_move, sender_scan_limit=100)
    assert plan.moves == () and len(calls) == 100
    assert plan.skipped["scan limit reached on a sender"] == 1


def test_sender_stops_looking_when_no_recipient_has_room():
    m = Model({"a": 10 * GiB, "b": 10 * GiB, "c": 10 * GiB})
    m.fill("a", 40, 200 * MiB)  # 78%
    m.fill("b", 60, 100 * MiB)  # 59%: recipients, but recipient-max (60%) leaves
    m.fill("c", 60, 100 * MiB)  # them 144 MiB of room, less than any key of a
    placed = []
    plan = m.plan(can_place=lambda k, a: placed.append(k))
    assert plan.roles == {"a": "sender", "b": "recipient", "c": "recipient"}
    assert plan.moves == () and placed == []
    assert plan.skipped == {"no recipient has room for it": SIZE_MISSES}


# --- spilled memory ------------------------------------------------------------------------


def test_spilling_sender_offers_newest_keys_first_and_others_oldest_first():
    m = Model({"a": 10 * GiB, "b": 10 * GiB, "c": 10 * GiB})
    m.fill("a", 80, 100 * MiB)
    m.fill("b", 80, 100 * MiB)
    m.spilled["a"] = 1 * GiB
    plan = m.plan(replace(ON, max_bytes_per_cycle=100 * GiB))
    assert ("a", True) in m.calls and ("b", False) in m.calls
    from_a = [mv.key for mv in plan.moves if mv.sender == "a"]
    from_b = [mv.key for mv in plan.moves if mv.sender == "b"]
    assert from_a[0] == "a-79" and from_b[0] == "b-0"


def test_managed_total_sheds_no_more_than_the_excess_in_memory():
    settings = replace(ON, measure="managed_total", max_bytes_per_cycle=100 * GiB)
    m = Model({"a": 10 * GiB, "b": 10 * GiB})
    m.fill("a", 80, 100 * MiB)  # 7.8 GiB by managed_total ...
    m.spilled["a"] = 6 * GiB  # ... of which 6 GiB on disk: 1.8 GiB in RAM
    plan = m.plan(settings)
    assert plan.roles["a"] == "excess is spilled to disk" and plan.moves == ()
    m.spilled["a"] = 2 * GiB  # 5.8 GiB in RAM; mean 3.9 GiB: ~1.9 GiB worth moving
    plan = m.plan(settings)
    assert 0 < plan.bytes <= m.memory("a") - 2 * GiB - plan.mean * 10 * GiB
    # With the optimistic measure spilled bytes are not in `memory` at all: no cap.
    assert m.plan(replace(settings, measure="optimistic")).bytes > plan.bytes


def test_no_recipient_at_its_spill_threshold():
    # Every worker spills: moving data between them only moves where it spills.
    m = Model({"a": 10 * GiB, "b": 10 * GiB, "c": 10 * GiB})
    m.fill("a", 90, 100 * MiB)
    m.fill("b", 30, 100 * MiB)
    m.fill("c", 30, 100 * MiB)
    m.headroom.update(a=-1 * GiB, b=0, c=-10 * MiB)
    plan = m.plan(replace(ON, max_bytes_per_cycle=100 * GiB))
    assert plan.moves == () and plan.stopped == "no recipients"
    assert plan.roles == {"a": "sender", "b": SPILLING, "c": SPILLING}
    # One worker with room below its threshold takes what fits there, no more.
    m.headroom["c"] = 250 * MiB
    plan = m.plan(replace(ON, max_bytes_per_cycle=100 * GiB))
    assert {mv.recipient for mv in plan.moves} == {"c"}
    assert 0 < plan.bytes <= 250 * MiB
    # Unknown thresholds (None) leave the measure alone to decide.
    m.headroom.update(b=None, c=None)
    assert m.plan(replace(ON, max_bytes_per_cycle=100 * GiB)).bytes > 1 * GiB


def test_keys_too_small_to_change_any_worker_never_move():
    m = Model({"a": 768 * MiB, "b": 768 * MiB})
    for i in range(40):
        m.put("a", f"store-map-{i}", 16)  # what da.store leaves per chunk written
    m.fill("a", 5, 64 * MiB, prefix="chunk")
    for i in range(40, 80):
        m.put("a", f"store-map-{i}", 16)
    plan = m.plan(replace(ON, max_bytes_per_cycle=100 * GiB))
    assert plan.moves and all(mv.key.startswith("chunk") for mv in plan.moves)
    assert plan.skipped[TOO_SMALL] > 0
    # Only tiny keys: nothing moves, however unbalanced the counts.
    small = Model({"a": 768 * MiB, "b": 768 * MiB})
    small.fill("a", 900, 300 * 2**10)  # 34% of a's limit, in keys of 300 KiB
    plan = small.plan(replace(ON, max_bytes_per_cycle=100 * GiB))
    assert plan.roles["a"] == "sender"
    assert plan.moves == () and plan.skipped == {TOO_SMALL: 900}
    # The floor: 1 MiB, or a thousandth of the sender's limit if that is less.
    assert smallest_move(16 * GiB) == MiB and smallest_move(100 * MiB) == 104_857


# --- convergence, hysteresis, bytes moved ------------------------------------------------


def imbalanced(n: int = 8, keys: int = 400, size: int = 25 * MiB) -> Model:
    """Half the workers full, the others nearly empty."""
    m = Model({f"w{i}": 16 * GiB for i in range(n)}, unmanaged=300 * MiB)
    for i in range(n):
        m.fill(f"w{i}", keys if i < n // 2 else keys // 10, size)
    return m


def one_hot() -> Model:
    """Data pinned on one worker: 87% there, 28% elsewhere."""
    m = Model({f"w{i}": 16 * GiB for i in range(4)}, unmanaged=200 * MiB)
    m.fill("w0", 220, 64 * MiB)
    for a in ("w1", "w2", "w3"):
        m.fill(a, 68, 64 * MiB)
    return m


def heterogeneous() -> Model:
    """Limits from 8 to 64 GiB; the fullest by bytes is not the fullest by fraction."""
    m = Model({"s0": 8 * GiB, "s1": 8 * GiB, "b0": 32 * GiB, "b1": 64 * GiB})
    for address, gib in [("s0", 7), ("s1", 2), ("b0", 10), ("b1", 40)]:
        m.fill(address, gib * 16, 64 * MiB)
    return m


@pytest.mark.parametrize(
    ("model", "budget"),
    [
        pytest.param(imbalanced, 4 * GiB, id="half-full"),
        pytest.param(lambda: imbalanced(n=16, keys=300, size=40 * MiB), 8 * GiB, id="16-workers"),
        pytest.param(one_hot, 2 * GiB, id="one-hot"),
        pytest.param(heterogeneous, 4 * GiB, id="heterogeneous"),
    ],
)
def test_converges_within_ten_cycles_without_oscillation(model, budget):
    m = model()
    assert max_over_mean(m) > 1.4
    minimum = minimum_bytes_to_balance(m.loads())
    settings = replace(ON, max_bytes_per_cycle=budget)
    active, plans, book = converge(m, settings)
    assert active <= 10
    assert max_over_mean(m) <= 1.15
    assert m.copied <= 1.2 * minimum
    # No trading places: a worker that sent never receives, and the reverse.
    sent = set().union(*(p.senders for p in plans))
    received = set().union(*(p.recipients for p in plans))
    assert sent and received and not sent & received
    # Hysteresis: once balanced, nothing moves again.
    for i in range(10):
        assert m.cycle(book, now=1000.0 + 2 * i, settings=settings).moves == ()


def test_a_started_role_continues_to_the_mean():
    m = Model({"a": 10 * GiB, "b": 10 * GiB, "c": 10 * GiB})
    m.fill("a", 47, 100 * MiB)  # 46%, mean 41%: inside the band ...
    m.fill("b", 40, 100 * MiB)
    m.fill("c", 40, 100 * MiB)
    assert m.plan().moves == ()
    # ... but a was sending and b, c receiving: they go on until they reach the mean.
    previous = {"a": "sender", "b": "recipient", "c": "recipient"}
    plan = m.plan(previous=previous)
    assert plan.roles == previous and plan.moves
    # A former recipient above the mean, or a sender below it, starts nothing.
    plan = m.plan(previous={"a": "recipient", "b": "sender"})
    assert plan.moves == () and set(plan.roles.values()) == {"within gap"}


def test_no_key_is_lost_or_duplicated_by_moves():
    m = imbalanced()
    before = {k: len(v) for k, v in m.who_has.items()}
    converge(m, replace(ON, max_bytes_per_cycle=4 * GiB))
    assert {k: len(v) for k, v in m.who_has.items()} == before


def test_budget_slows_but_does_not_stop_convergence():
    m = imbalanced()
    active, plans, _ = converge(m, replace(ON, max_bytes_per_cycle=512 * MiB), cycles=100)
    assert all(p.bytes <= 512 * MiB for p in plans)
    assert active > 10  # ~17 GiB to move at 512 MiB a cycle
    assert max_over_mean(m) <= 1.15


# --- the yardstick: the least that must move ----------------------------------------------


def test_minimum_bytes_to_balance_on_worked_examples():
    def load(address: str, memory: int, limit: int) -> WorkerLoad:
        return WorkerLoad(address, memory, limit)

    assert minimum_bytes_to_balance([]) == 0
    # Everybody at the mean: nothing to move.
    assert minimum_bytes_to_balance([load("a", 30, 100), load("b", 60, 200)]) == 0
    # Equal limits, all on one worker: half of it moves.
    assert minimum_bytes_to_balance([load("a", 100, 100), load("b", 0, 100)]) == 50
    # Fractions of each worker's own limit: the mean is 60 / 300 = 20%, so a (limit 100)
    # keeps 20 and b (limit 200) should hold 40: 40 bytes move.
    assert minimum_bytes_to_balance([load("a", 60, 100), load("b", 0, 200)]) == 40
    # 600 bytes on 3,000 of limits: 20%, a share of 200 each. a sends its 300 above it
    # (100 to b, 200 to c).
    loads = [load("a", 500, 1_000), load("b", 100, 1_000), load("c", 0, 1_000)]
    assert minimum_bytes_to_balance(loads) == 300
    # A worker without a memory limit has no fraction: it is left out.
    unlimited = load("n", 10**9, 0)
    assert minimum_bytes_to_balance([load("a", 100, 100), load("b", 0, 100), unlimited]) == 50


@given(st.lists(st.tuples(st.integers(0, 10**9), st.integers(1, 10**9)), min_size=1, max_size=12))
def test_minimum_bytes_to_balance_is_what_the_emptiest_workers_lack(pairs):
    """What must leave the workers above the mean is what the workers below it lack:
    the yardstick, computed from the senders' side, equals the recipients' side."""
    loads = [WorkerLoad(f"w{i}", m, limit) for i, (m, limit) in enumerate(pairs)]
    mean = sum(m for m, _ in pairs) / sum(limit for _, limit in pairs)
    lacking = sum(max(0.0, mean * limit - m) for m, limit in pairs)
    minimum = minimum_bytes_to_balance(loads)
    assert abs(minimum - lacking) <= 1 + 1e-9 * lacking
    assert 0 <= minimum <= sum(m for m, _ in pairs)


# --- settling moves ----------------------------------------------------------------------


def _settle(pending, who_has, alive=("a", "b", "c"), now=10.0, **kw):
    return settle_moves(pending, holders=lambda k: who_has.get(k), alive=set(alive), now=now, **kw)


P = PendingMove("x", "a", "b", 100, started=0.0)


def test_settle_drops_only_once_the_copy_landed():
    s = _settle([P], {"x": {"a"}})
    assert s.drops == () and s.pending == {"x": P}
    s = _settle([P], {"x": {"a", "b"}})
    assert [d.key for d in s.drops] == ["x"]
    assert s.pending["x"].landed == 10.0
    s = _settle([s.pending["x"]], {"x": {"b"}}, now=12.0)
    assert [d.key for d in s.done] == ["x"] and s.pending == {}


@pytest.mark.parametrize(
    ("who_has", "alive", "now", "kw", "reason"),
    [
        ({}, "abc", 10.0, {}, "key released"),
        ({"x": set()}, "abc", 10.0, {}, "key released"),
        ({"x": {"a"}}, "ac", 10.0, {}, "recipient left the cluster"),
        ({"x": {"a", "b"}}, "ac", 10.0, {}, "recipient left the cluster"),
        ({"x": {"c"}}, "abc", 10.0, {}, "sender lost its copy before the copy landed"),
        ({"x": {"a", "c"}}, "bc", 10.0, {}, "sender lost its copy before the copy landed"),
        ({"x": {"a"}}, "abc", 10.0, {"refused": {"x"}}, "copy refused"),
        ({"x": {"a"}}, "abc", 31.0, {}, "copy did not land within 30s"),
    ],
)
def test_settle_voids_moves_when_the_world_changed(who_has, alive, now, kw, reason):
    s = _settle([P], who_has, alive=alive, now=now, **kw)
    assert s.void == ((P, reason),)
    assert s.drops == () and s.pending == {}


def test_settle_retries_a_refused_drop_then_gives_up():
    landed = replace(P, landed=5.0)
    s = _settle([landed], {"x": {"a", "b"}}, can_drop=lambda k, a: "dependent running")
    assert s.drops == () and s.pending == {"x": landed}
    s = _settle([landed], {"x": {"a", "b"}}, now=20.0)
    assert s.drops == (landed,)
    s = _settle([landed], {"x": {"a", "b"}}, now=36.0)
    assert s.void == ((landed, "sender's copy not dropped within 30s"),)


@pytest.mark.parametrize(
    ("standing", "can_drop", "dropped", "reason"),
    [
        # Within the target: the drop, as without one; a refused drop waits.
        (None, None, True, None),
        (None, "dependent running", False, None),
        # A holder was lost mid-move: the target needs the sender's copy, busy or not.
        (NEEDED, None, False, NEEDED),
        (NEEDED, "dependent running", False, NEEDED),
        # Above the target: the drop if it can go now, else the move gives way.
        (ABOVE, None, True, None),
        (ABOVE, "dependent running", False, ABOVE),
    ],
)
def test_settle_puts_the_keys_replication_target_first(standing, can_drop, dropped, reason):
    landed = replace(P, landed=5.0)
    asked = []

    def target(key, sender):
        asked.append((key, sender))
        return standing

    s = _settle(
        [landed], {"x": {"a", "b"}}, can_drop=lambda k, a: can_drop, target=target, now=6.0
    )
    assert asked == [("x", "a")]
    assert s.drops == ((landed,) if dropped else ())
    if reason is None:
        assert s.void == () and s.pending == {"x": landed}
    else:
        assert s.void == ((landed, reason),) and s.pending == {}


def test_settle_asks_the_target_only_once_the_copy_landed():
    def target(key, sender):
        raise AssertionError("asked before the copy landed")

    s = _settle([P], {"x": {"a"}}, target=target)
    assert s.pending == {"x": P} and s.void == ()


def test_movebook_cools_keys_down_after_their_move():
    book = MoveBook(cooldown=20)
    mv = Move("x", "a", "b", 100)
    book.start(mv, now=0.0)
    who_has = {"x": {"a", "b"}}
    s = book.settle(2.0, holders=who_has.get, alive={"a", "b"})
    assert s.drops and "x" in book.pending
    who_has["x"] = {"b"}
    s = book.settle(4.0, holders=who_has.get, alive={"a", "b"})
    assert s.done and not book.pending
    assert "x" in book.cooling(23.9)
    assert "x" not in book.cooling(24.0)
    book.refuse(Move("y", "a", "b", 1), now=30.0)
    assert "y" in book.cooling(49.0) and "y" not in book.cooling(50.0)
    book.start(Move("z", "a", "c", 1), now=50.0)
    book.forget("z")
    assert not book.pending


def test_a_short_copy_timeout_abandons_the_move_and_cools_its_key():
    book = MoveBook(cooldown=5.0, copy_timeout=2.0, drop_timeout=1.0)
    book.start(Move("slow", "a", "b", 100), now=0.0)
    book.start(Move("fast", "a", "c", 100), now=0.0)
    who_has = {"slow": {"a"}, "fast": {"a", "c"}}
    # At the timeout itself the copy may still land; the fast one did, its drop is asked.
    s = book.settle(2.0, holders=who_has.get, alive={"a", "b", "c"})
    assert [p.key for p in s.drops] == ["fast"] and set(book.pending) == {"slow", "fast"}
    # Past it, the slow move is abandoned: nothing dropped, the key cools down. The fast
    # one's drop did not happen within drop-timeout of its landing: abandoned too.
    s = book.settle(3.5, holders=who_has.get, alive={"a", "b", "c"})
    assert [(p.key, why) for p, why in s.void] == [
        ("slow", "copy did not land within 2s"),
        ("fast", "sender's copy not dropped within 1s"),
    ]
    assert s.drops == () and not book.pending
    assert set(book.cooling(8.4)) == {"slow", "fast"} and not book.cooling(8.5)


def test_movebook_retime_applies_to_moves_in_flight_and_keys_cooling():
    book = MoveBook(cooldown=60.0, copy_timeout=30.0, drop_timeout=30.0)
    for i, now in enumerate([0.0, 10.0, 20.0]):
        book.refuse(Move(f"k{i}", "a", "b", 1), now=now)
    book.start(Move("x", "a", "b", 1), now=0.0)
    # Shorter: each key's cool-down now ends 15 s after it started, in the same order.
    book.retime(cooldown=15.0, copy_timeout=5.0, drop_timeout=5.0)
    assert list(book.cooling(14.9)) == ["k0", "k1", "k2"]
    assert list(book.cooling(25.0)) == ["k2"]
    book.refuse(Move("k3", "a", "b", 1), now=26.0)
    assert list(book.cooling(35.0)) == ["k3"] and not book.cooling(41.0)
    # Longer: keys already cooling wait for the new length too.
    book.refuse(Move("k4", "a", "b", 1), now=50.0)
    book.retime(cooldown=100.0, copy_timeout=5.0, drop_timeout=5.0)
    assert "k4" in book.cooling(149.9) and not book.cooling(150.0)
    # The move in flight was kept; the new copy-timeout applies to it.
    s = book.settle(6.0, holders={"x": {"a"}}.get, alive={"a", "b"})
    assert [why for _, why in s.void] == ["copy did not land within 5s"]


# --- properties -------------------------------------------------------------------------


@st.composite
def clusters(draw):
    n = draw(st.integers(2, 7))
    limits = {f"w{i}": draw(st.sampled_from([4, 8, 16, 32])) * GiB for i in range(n)}
    m = Model(limits, unmanaged=draw(st.integers(0, 512)) * MiB)
    for i, a in enumerate(limits):
        for j in range(draw(st.integers(0, 40))):
            m.put(a, f"k{i}-{j}", draw(st.integers(0, 600)) * MiB)
    # Some replicated keys.
    keys = list(m.who_has)
    for key in draw(st.lists(st.sampled_from(keys), max_size=10)) if keys else ():
        m.put(
            draw(st.sampled_from(list(limits))),
            key,
            next(iter(m.data[a][key] for a in m.who_has[key])),
        )
    m.paused = set(draw(st.lists(st.sampled_from(list(limits)), max_size=2)))
    return m


@hsettings(max_examples=150)
@given(
    m=clusters(),
    settings=st.builds(
        RebalanceSettings,
        enabled=st.just(True),
        measure=st.sampled_from(["optimistic", "managed_total"]),
        sender_min=st.floats(0, 0.8),
        recipient_max=st.floats(0.2, 1.0),
        gap=st.floats(0, 0.3),
        max_bytes_per_cycle=st.integers(0, 4 * GiB),
    ),
    forbidden=st.sets(st.tuples(st.integers(0, 40), st.integers(0, 6)), max_size=60),
    events=st.lists(
        st.sampled_from(["land", "stall", "release", "kill", "spill"]), min_size=12, max_size=12
    ),
    seed=st.randoms(use_true_random=False),
)
def test_properties_over_random_clusters_and_events(m, settings, forbidden, events, seed):
    book = MoveBook(cooldown=10.0, copy_timeout=6.0, drop_timeout=6.0)
    last_moved: dict[Hashable, float] = {}

    def can_place(key, address):
        j = int(str(key).rsplit("-", 1)[1])
        if (j, int(address[1:])) in forbidden:
            return "outside pool"
        return m.can_place(key, address)

    for cycle, event in enumerate(events):
        now = 2.0 * cycle
        # The world changes between cycles.
        if event == "release" and m.who_has:
            m.release(seed.choice(sorted(m.who_has)))
        elif event == "kill" and len(m.limits) > 2:
            m.remove_worker(seed.choice(sorted(m.limits)))
        elif event == "spill":
            a = seed.choice(sorted(m.limits))
            m.spilled[a] = m.memory(a) // 2
        # Settle: drops only where the copy has landed, never the last copy.
        settled = book.settle(now, holders=m.holders, alive=m.limits)
        for p in settled.drops:
            assert p.recipient in m.who_has[p.key] and p.sender in m.who_has[p.key]
            m.drop(p.sender, p.key)
        plan = m.plan(
            settings,
            can_place=can_place,
            pending=book.pending.values(),
            cooling=book.cooling(now),
            previous=book.roles,
        )
        # Never past the budget; no worker on both sides; every recipient may hold it.
        assert plan.bytes == sum(mv.nbytes for mv in plan.moves) <= settings.max_bytes_per_cycle
        assert not plan.senders & plan.recipients
        assert len({mv.key for mv in plan.moves}) == len(plan.moves)
        for mv in plan.moves:
            assert mv.sender in plan.senders and mv.recipient in plan.recipients
            assert can_place(mv.key, mv.recipient) is None
            assert mv.sender in m.who_has[mv.key]
            # Never a key twice within its cool-down (nor while in flight).
            assert mv.key not in book.pending
            assert now - last_moved.get(mv.key, -1e9) > book.cooldown
            book.start(mv, now)
            m.in_transit.append((mv.key, mv.recipient))
        book.remember(plan)
        for key in book.pending:
            last_moved[key] = now  # cool-down counts from the end of a move
        if event != "stall":
            m.land()
