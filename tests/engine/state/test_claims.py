"""Claims (:mod:`amm_rules.engine.state.claims`): keys a section holds, which the others
leave alone, and what explain says of them."""

from __future__ import annotations

import time

from amm_rules.engine.state.claims import EVERY, Claim, Claims


def test_a_key_held_alone_is_left_alone_until_released() -> None:
    claims = Claims()
    claims.hold("k", "legacy-replicate", "a client.replicate call copies it")
    assert claims.holder("k") == Claim("legacy-replicate", "a client.replicate call copies it")
    assert claims.alone("k") is not None and claims.keeping("k") is not None
    assert claims.keeps("k") == 0  # (whole: keeps every copy, see keeping)
    claims.release("legacy-replicate", ["k"])
    assert claims.holder("k") is None and claims.alone("k") is None and not claims.held


def test_a_move_keeps_every_copy_and_lets_others_copy() -> None:
    claims = Claims()
    claims.hold("k", "rebalance", "a move from a to b", alone=False)
    assert claims.alone("k") is None
    assert claims.keeping("k") == Claim("rebalance", "a move from a to b", False, EVERY)


def test_protect_keeps_a_number_of_copies() -> None:
    claims = Claims()
    claims.hold("k", "protect", "keeps 2 copies", alone=False, keeps=2)
    assert claims.keeps("k") == 2 and claims.keeping("k") is None
    # Held by two: the largest number kept counts, and a move keeps them all.
    claims.hold("k", "rebalance", "a move", alone=False)
    assert claims.keeps("k") == 2 and claims.keeping("k") is not None
    assert set(claims.held["k"]) == {"protect", "rebalance"}
    claims.release("rebalance")
    assert set(claims.held["k"]) == {"protect"} and claims.keeping("k") is None
    assert claims.of("protect") == {"k": claims.holder("k")}


def test_releasing_an_owner_releases_every_key_it_holds_and_no_other() -> None:
    claims = Claims()
    for key in ("a", "b", "c"):
        claims.hold(key, "the drain of w1", "copied in its turn")
    claims.hold("c", "protect", "keeps 2 copies", alone=False, keeps=2)
    claims.release("the drain of w1")
    assert set(claims.held) == {"c"} and claims.of("the drain of w1") == {}
    claims.release("nobody")
    claims.release("protect", ["c", "not held"])
    assert not claims.held and claims.of("protect") == {}
    assert len(claims) == 0


def test_a_hold_with_a_time_ends_by_itself() -> None:
    claims = Claims()
    claims.hold("a", "the drain of w1", "copied in its turn", until=10.0)
    claims.hold("b", "the drain of w1", "copied in its turn")
    claims.expire(9.0)
    assert set(claims.held) == {"a", "b"}
    claims.expire(10.0)
    assert set(claims.held) == {"b"}
    # Held again without a time: it no longer ends by itself.
    claims.hold("b", "the drain of w1", "copied in its turn", until=5.0)
    claims.hold("b", "the drain of w1", "copied in its turn")
    claims.expire(100.0)
    assert set(claims.held) == {"b"}


def test_explain_says_who_holds_a_key_why_and_until_when() -> None:
    claims = Claims()
    now = time.monotonic()
    claims.hold("k", "the drain of tcp://w1:1", "copied in its turn", until=now + 60)
    (said,) = claims.explain("k", now)
    until = time.strftime("%H:%M:%S", time.localtime(time.time() + 60))
    assert said in {
        f"held by the drain of tcp://w1:1 until {until}: copied in its turn",
        # (the clock may tick over a second between the two readings)
        "held by the drain of tcp://w1:1 until "
        + time.strftime("%H:%M:%S", time.localtime(time.time() + 59))
        + ": copied in its turn",
    }
    claims.hold("k", "protect", "keeps 2 copies", alone=False, keeps=2)
    assert claims.explain("k", now)[1] == "held by protect: keeps 2 copies"
    assert claims.explain("other") == []
