"""The protect section's choice (:mod:`amm_rules.engine.decide.protect`): greedy by
recompute seconds per byte within the budget, the cut-off, and hysteresis."""

from __future__ import annotations

from amm_rules.engine.decide.protect import HYSTERESIS, Candidate, choose


def test_greedy_by_worth_per_byte_within_the_budget() -> None:
    candidates = [
        Candidate("big-dear", nbytes=1000, seconds=100.0),  # 0.1 s per byte
        Candidate("small-dear", nbytes=10, seconds=50.0),  # 5 s per byte
        Candidate("medium", nbytes=200, seconds=40.0),  # 0.2 s per byte
        Candidate("small-cheap", nbytes=10, seconds=0.5),  # below the cut-off
    ]
    choice = choose(candidates, budget=300, copies=2, min_recompute=1.0, max_keys=10)
    # big-dear does not fit once the others are in; nothing is spent beyond the budget.
    assert choice.keys == ["small-dear", "medium"]
    assert choice.spent == 210 <= 300
    assert choice.seconds == 90.0
    assert (choice.left_out, choice.no_room, choice.below) == (1, 1, 1)
    assert choice.left_out_seconds == 100.0


def test_a_key_too_large_is_passed_over_for_smaller_ones() -> None:
    candidates = [Candidate("huge", 10_000, 10_000.0), Candidate("a", 50, 1.0)]
    choice = choose(candidates, budget=100, copies=2, min_recompute=0.0, max_keys=10)
    assert choice.keys == ["a"]


def test_copies_multiply_what_a_key_costs_the_budget() -> None:
    candidates = [Candidate("a", 100, 10.0), Candidate("b", 100, 9.0)]
    assert choose(candidates, 250, copies=2, min_recompute=0, max_keys=9).keys == ["a", "b"]
    assert choose(candidates, 250, copies=3, min_recompute=0, max_keys=9).keys == ["a"]


def test_hysteresis_keeps_an_incumbent_against_a_slightly_better_newcomer() -> None:
    # Room for one key: the newcomer is 10% better per byte, less than the margin.
    old = Candidate("old", 100, 10.0, incumbent=True)
    new = Candidate("new", 100, 11.0)
    assert choose([new, old], 100, 2, 0.0, 9).keys == ["old"]
    # Clearly better (more than the margin): it takes the place.
    clearly = Candidate("new", 100, 10.0 * HYSTERESIS * 1.01)
    assert choose([clearly, old], 100, 2, 0.0, 9).keys == ["new"]
    # Without the margin the newcomer wins at once.
    assert choose([new, Candidate("old", 100, 10.0)], 100, 2, 0.0, 9).keys == ["new"]


def test_an_incumbent_keeps_its_protection_a_little_below_the_cut_off() -> None:
    just_below = 30.0 / HYSTERESIS + 0.1
    assert choose([Candidate("k", 10, just_below, True)], 100, 2, 30.0, 9).keys == ["k"]
    assert choose([Candidate("k", 10, just_below)], 100, 2, 30.0, 9).keys == []
    assert choose([Candidate("k", 10, 30.0 / HYSTERESIS - 0.1, True)], 100, 2, 30.0, 9).keys == []


def test_at_most_max_keys() -> None:
    candidates = [Candidate(i, 1, float(i + 1)) for i in range(10)]
    choice = choose(candidates, 1_000, 2, 0.0, max_keys=3)
    assert choice.keys == [9, 8, 7]
    assert choice.left_out == 7 and choice.no_room == 0
