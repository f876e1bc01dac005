"""Where a cycle's classification stops (:class:`ClassifyBudget`): the loop's share of
what is left of the cycle's budget follows the cycles that stopped on it."""

from __future__ import annotations

import pytest

from amm_rules.engine.decide.classify_budget import ClassifyBudget


def test_the_budget_share_follows_the_cycles_that_stop_on_it():
    budget = ClassifyBudget()
    assert budget.deadline(10.0, 10.02, 0.1) == pytest.approx(10.02 + 0.08 * budget.FIRST)
    # A cycle whose loop took 30 ms of 90 ms from its start to the cycle's end.
    budget.stopped(10.02, 10.05)
    budget.cycle_ended(10.11)
    learn = budget.LEARN
    assert budget.share == pytest.approx((1 - learn) * budget.FIRST + learn / 3)
    # A cycle that did not stop on the budget teaches nothing.
    before = budget.share
    budget.cycle_ended(20.0)
    assert budget.share == before
    # Bounded both ways; a cycle past its budget leaves the loop no time, not less.
    for _ in range(20):
        budget.stopped(0.0, 0.001)
        budget.cycle_ended(1.0)
    assert budget.share == budget.LOW
    for _ in range(20):
        budget.stopped(0.0, 1.0)
        budget.cycle_ended(1.0)
    assert budget.share == budget.HIGH
    assert budget.deadline(0.0, 0.5, 0.1) == 0.5
