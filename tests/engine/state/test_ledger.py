"""The ledger (:mod:`amm_rules.engine.state.ledger`): the one record of what the engine
asked and has not seen land.

Every part of the engine that asks for a copy writes it here and every part that must
not ask twice reads it here, so no test has to hold two records equal: these test the
record itself. A copy recorded is in flight until it lands (the replica hook, or the
cycle's look at the holders when no hook saw it), its key leaves memory, its worker
leaves or retires (forgotten), or its deadline passes (given up, and its worker backed
off from); back-offs end at their time. A property test drives random histories
against a plain model of those rules.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from amm_rules.engine.state.ledger import Copy, Drop, Ledger

NOW = 100.0
BACKOFF = 10.0


def expire(
    ledger: Ledger,
    now: float = NOW,
    holders: dict[str, set[str]] | None = None,
    gone: set[str] = frozenset(),  # type: ignore[assignment]
) -> None:
    held = holders or {}
    ledger.expire(now, BACKOFF, lambda key: held.get(key, set()), lambda w: w not in gone)


def test_a_copy_is_in_flight_until_it_lands() -> None:
    ledger = Ledger()
    ledger.record("k", "w1", "replication", NOW + 5, 10)
    assert ledger.in_flight("k") == {"w1": Copy("replication", NOW + 5, 10)}
    assert len(ledger) == 1
    assert ledger.landed("k", "w1") == Copy("replication", NOW + 5, 10)
    assert ledger.in_flight("k") == {} and not ledger.copies
    assert ledger.landings("replication") == (1, 10)
    # Seen by the planner of the next cycle as just landed, then no longer.
    assert ledger.just_landed("k") == {"w1"}
    expire(ledger)
    assert ledger.just_landed("k") == {"w1"} and set(ledger.settled_keys()) == {"k"}
    expire(ledger, NOW + 1)
    assert ledger.just_landed("k") == frozenset() and not ledger.settled_keys()


def test_a_copy_nobody_asked_for_lands_unnoticed() -> None:
    ledger = Ledger()
    ledger.record("k", "w1", "protect", NOW + 5)
    assert ledger.landed("k", "w2") is None
    assert ledger.landed("other", "w1") is None
    assert ledger.in_flight("k").keys() == {"w1"}
    assert ledger.landings("protect") == (0, 0)


def test_the_cycle_notes_landings_no_hook_saw() -> None:
    ledger = Ledger()
    ledger.record("k", "w1", "retirement of w0", NOW + 5, 7)
    expire(ledger, holders={"k": {"w0", "w1"}})
    assert ledger.in_flight("k") == {}
    assert ledger.just_landed("k") == {"w1"}
    assert ledger.landings("retirement of w0") == (1, 7)


def test_a_copy_past_its_deadline_is_given_up_and_its_worker_backed_off_from() -> None:
    ledger = Ledger()
    ledger.record("k", "w1", "replication", NOW)
    ledger.record("k", "w2", "replication", NOW + 2 * BACKOFF)
    expire(ledger)
    assert ledger.in_flight("k").keys() == {"w2"}
    assert ledger.backing_off("k") == {"w1": NOW + BACKOFF}
    assert set(ledger.settled_keys()) == {"k"}  # (planned again: it may be short now)
    # The back-off ends at its time.
    expire(ledger, NOW + BACKOFF)
    assert ledger.backing_off("k") == {} and not ledger.backoffs
    assert ledger.in_flight("k").keys() == {"w2"}
    assert ledger.landings("replication") == (0, 0)


def test_copies_to_workers_gone_or_retiring_are_forgotten_without_a_back_off() -> None:
    ledger = Ledger()
    ledger.record("k", "gone", "replication", NOW + 5)
    ledger.record("k", "w1", "replication", NOW + 5)
    ledger.back_off("k", ["gone"], NOW + 5)
    expire(ledger, gone={"gone"})
    assert ledger.in_flight("k").keys() == {"w1"}
    assert ledger.backing_off("k") == {}
    # The hook of a worker leaving does the same between two cycles.
    ledger.record("j", "w1", "protect", NOW + 5)
    ledger.back_off("j", ["w1", "w2"], NOW + 5)
    ledger.worker_left("w1")
    assert not ledger.copies and ledger.backoffs == {"j": {"w2": NOW + 5}}
    expire(ledger)
    assert set(ledger.settled_keys()) == {"j", "k"}  # (planned again: short now)


def test_a_key_that_left_memory_takes_its_copies_and_back_offs() -> None:
    ledger = Ledger()
    ledger.record("k", "w1", "replication", NOW + 5)
    ledger.back_off("k", ["w2"], NOW + 5)
    ledger.forget("k")
    assert not ledger.copies and not ledger.backoffs
    ledger.record("j", "w1", "replication", NOW + 5)
    expire(ledger, holders={})  # (in no worker's memory any more)
    assert ledger.in_flight("j").keys() == {"w1"}  # held by nobody yet: still in flight
    ledger.expire(NOW, BACKOFF, lambda key: None, lambda w: True)
    assert not ledger.copies


def test_giving_up_backs_off_from_the_workers_it_was_asked_of() -> None:
    ledger = Ledger()
    ledger.record("k", "w1", "replication", NOW + 5)
    ledger.record("k", "w2", "protect", NOW + 5)
    ledger.give_up("k", NOW + 1)
    assert ledger.in_flight("k") == {}
    assert ledger.backing_off("k") == {"w1": NOW + 1, "w2": NOW + 1}
    # A longer back-off stands.
    ledger.back_off("k", ["w1"], NOW + 9)
    ledger.back_off("k", ["w1"], NOW + 2)
    assert ledger.backing_off("k")["w1"] == NOW + 9
    ledger.give_up("nothing", NOW)
    assert "nothing" not in ledger.backoffs


def test_a_copy_counts_against_its_recipient_until_a_heartbeat_shows_it() -> None:
    """The bytes the workers' own figures do not show yet (the paused-workers section's
    room): copies in flight, and those landed since the recipient's last heartbeat,
    whoever asked them."""
    ledger = Ledger()
    ledger.record("x", "w", "paused-workers", 10.0, 1_000)
    ledger.record("y", "w", "replication", 10.0, 500)
    ledger.record("z", "v", "replication", 10.0, 0)  # no size known: nothing counted
    heartbeat = {"w": 1.0, "v": 1.0}
    assert ledger.unseen(heartbeat.get) == {"w": 1_500}
    ledger.landed("x", "w", seen=1.0)
    assert ledger.unseen(heartbeat.get) == {"w": 1_500}  # landed, no heartbeat since
    heartbeat["w"] = 2.0
    assert ledger.unseen(heartbeat.get) == {"w": 500}  # shown by the next heartbeat
    ledger.landed("y", "w", seen=2.0)
    ledger.expire(0.0, BACKOFF, lambda key: {"w"}, lambda w: True, {"w": 3.0}.get)
    assert ledger.unseen(heartbeat.get) == {}  # the cycle forgot what a heartbeat showed
    ledger.record("q", "w", "protect", 10.0, 7)
    ledger.landed("q", "w", seen=2.0)
    ledger.worker_left("w")
    assert ledger.unseen(heartbeat.get) == {}


def test_what_one_asker_has_in_flight() -> None:
    ledger = Ledger()
    ledger.record("a", "w1", "retirement of w0", NOW + 5, 3)
    ledger.record("b", "w1", "replication", NOW + 5)
    ledger.record("c", "w2", "retirement of w0", NOW + 5, 4)
    mine = ledger.asked_by("retirement of w0")
    assert mine == {
        "a": ("w1", Copy("retirement of w0", NOW + 5, 3)),
        "c": ("w2", Copy("retirement of w0", NOW + 5, 4)),
    }
    assert "3 copies in flight" in repr(ledger) and len(ledger) == 3


# -- a property test against a plain model ------------------------------------------------

WORKERS = ("w1", "w2", "w3")
KEYS = ("k1", "k2")
steps = st.lists(
    st.one_of(
        st.tuples(st.just("record"), st.sampled_from(KEYS), st.sampled_from(WORKERS),
                  st.integers(0, 6)),
        st.tuples(st.just("land"), st.sampled_from(KEYS), st.sampled_from(WORKERS)),
        st.tuples(st.just("forget"), st.sampled_from(KEYS)),
        st.tuples(st.just("leave"), st.sampled_from(WORKERS)),
        st.tuples(st.just("cycle"), st.integers(0, 3), st.sets(st.sampled_from(WORKERS))),
    ),
    max_size=30,
)  # fmt: skip


@settings(max_examples=500)
@given(steps)
def test_the_ledger_follows_a_plain_model(history: list[tuple]) -> None:  # type: ignore[type-arg]
    """Whatever happens, in any order: a copy is in flight from its record until it
    lands, its key leaves memory, its worker leaves (or retires: gone at a cycle), or a
    cycle finds its deadline passed, which backs its worker off until a later cycle."""
    ledger = Ledger()
    flying: dict[tuple[str, str], float] = {}
    backoff: dict[tuple[str, str], float] = {}
    now = 0.0
    for step in history:
        if step[0] == "record":
            _, key, worker, seconds = step
            ledger.record(key, worker, "x", now + seconds)
            flying[key, worker] = now + seconds
        elif step[0] == "land":
            _, key, worker = step
            ledger.landed(key, worker)
            flying.pop((key, worker), None)
        elif step[0] == "forget":
            key = step[1]
            ledger.forget(key)
            flying = {kw: t for kw, t in flying.items() if kw[0] != key}
            backoff = {kw: t for kw, t in backoff.items() if kw[0] != key}
        elif step[0] == "leave":
            worker = step[1]
            ledger.worker_left(worker)
            flying = {kw: t for kw, t in flying.items() if kw[1] != worker}
            backoff = {kw: t for kw, t in backoff.items() if kw[1] != worker}
        else:
            _, later, gone = step
            now += later
            ledger.expire(now, BACKOFF, lambda key: set(), lambda w, gone=gone: w not in gone)
            for (key, worker), deadline in list(flying.items()):
                if worker in gone:
                    del flying[key, worker]
                elif deadline <= now:
                    del flying[key, worker]
                    backoff[key, worker] = max(backoff.get((key, worker), 0.0), now + BACKOFF)
            backoff = {kw: t for kw, t in backoff.items() if t > now and kw[1] not in gone}
        seen = {(k, w): c.deadline for k, e in ledger.copies.items() for w, c in e.items()}
        assert seen == flying, step
        assert all(entry for entry in ledger.copies.values())  # no empty entries left
        waits = {(k, w): t for k, e in ledger.backoffs.items() for w, t in e.items()}
        assert waits == backoff, step
        for key in KEYS:
            assert ledger.in_flight(key).keys() == {w for k, w in flying if k == key}


def test_a_copy_dropped_to_give_its_worker_room_backs_the_worker_off() -> None:
    ledger = Ledger()
    ledger.dropped("k", "w1", "spill", "held elsewhere", NOW, NOW + 60)
    ledger.dropped("j", "w2", "spill", "held elsewhere", NOW, NOW + 60)
    assert ledger.drops_of("k") == {"w1": Drop("spill", "held elsewhere", NOW, NOW + 60)}
    assert ledger.backing_off("k") == {"w1": NOW + 60}, "no copy asked there meanwhile"
    expire(ledger, NOW + 30, {"k": {"w2"}, "j": {"w1"}})
    assert set(ledger.drops) == {"k", "j"}, "kept until the back-off ends"
    ledger.forget("j")
    ledger.worker_left("w9")
    assert set(ledger.drops) == {"k"}, "the key left memory"
    expire(ledger, NOW + 61, {"k": {"w2"}})
    assert ledger.drops_of("k") == {} and ledger.backing_off("k") == {}
    ledger.dropped("k", "w1", "spill", "held elsewhere", NOW, NOW + 60)
    ledger.worker_left("w1")
    assert not ledger.drops and not ledger.backoffs
