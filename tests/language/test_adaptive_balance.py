"""``adaptive: balance``: the rebalancing the adaptive section asks for while adaptive
scaling runs (docs/adaptive.md, "Balance"), as the compiled rules carry it. The cluster
half is in ``tests/engine/sections/adaptive/test_adaptive.py``."""

from __future__ import annotations

import pytest

from amm_rules.language.loader import load_ruleset
from amm_rules.language.ruleset import RebalanceSettings


def test_the_balance_moves_from_and_up_to_the_share_the_headroom_leaves():
    balance = load_ruleset({"version": 1, "adaptive": {"headroom": "55%"}}).balance
    assert balance is not None
    assert balance.enabled and balance.measure == "managed"
    assert balance.sender_min == balance.recipient_max == pytest.approx(0.45)
    # The rest is the rebalance section's defaults.
    defaults = RebalanceSettings()
    assert (balance.gap, balance.max_bytes_per_cycle, balance.cooldown) == (
        defaults.gap,
        defaults.max_bytes_per_cycle,
        defaults.cooldown,
    )
    assert balance.match is None and balance.enforcement is None


@pytest.mark.parametrize(
    ("adaptive", "rebalance", "balances"),
    [
        ({}, None, True),
        ({"balance": False}, None, False),
        ({"memory": False}, None, False),  # no target from memory: nothing to balance for
        ({}, {}, False),  # the file's own rebalancing is on: its settings win
        ({}, {"enabled": False}, True),
        (None, None, False),
    ],
)
def test_the_balance_is_asked_only_by_the_section_and_without_the_files_rebalancing(
    adaptive, rebalance, balances
):
    data = {"version": 1}
    if adaptive is not None:
        data["adaptive"] = adaptive
    if rebalance is not None:
        data["rebalance"] = rebalance
    ruleset = load_ruleset(data)
    assert (ruleset.balance is not None) is balances
    if rebalance == {}:
        assert ruleset.rebalance.enabled and ruleset.rebalance.measure == "optimistic"
