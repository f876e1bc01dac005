"""Where a cycle's classification stops: :class:`ClassifyBudget`, the share of the
cycle's budget (``classify_seconds``) that the classification loop may take so that the
whole cycle fits it.

Its neighbours: :class:`~amm_rules.engine.policy.RulesPolicy` asks it for the loop's
deadline and tells it when cycles end; :meth:`KeyIndex.classify
<amm_rules.engine.state.index.KeyIndex.classify>` stops taking chunks at that deadline.
"""

from __future__ import annotations


class ClassifyBudget:
    """Where a cycle's classification stops, so that the whole cycle fits its budget.

    The budget (``classify_seconds``) is the cycle's time, from its start: classifying
    keys is one part of the work they bring; filing them, checking them against their
    targets, planning their copies and whatever the cycle does afterwards take more.
    The classification loop gets a share of what is left of the budget when it starts,
    and the share follows the cycles that stopped on it: the loop's time (up to its last
    chunk) over the time from the loop's start to the cycle's end (what the keys
    classified cost, in all)."""

    #: The share's bounds, and its start (before any cycle stopped on the budget).
    LOW, HIGH, FIRST = 0.2, 0.95, 0.5
    #: The weight of the last cycle in the share (the rest is the share before it).
    LEARN = 0.75

    def __init__(self) -> None:
        self.share = self.FIRST
        self._began: float | None = None
        self._loop = 0.0

    def deadline(self, cycle_start: float, now: float, seconds: float) -> float:
        """The ``time.perf_counter()`` value at which the loop stops taking chunks."""
        return now + max(0.0, cycle_start + seconds - now) * self.share

    def stopped(self, began: float, ended: float) -> None:
        """The loop ran from ``began`` to ``ended`` and left keys for the next cycles."""
        self._began, self._loop = began, ended - began

    def cycle_ended(self, now: float) -> None:
        """The cycle ended: learn the share from it, if its loop stopped on the budget."""
        began, self._began = self._began, None
        if began is None or now <= began:
            return
        seen = self._loop / (now - began)
        share = (1 - self.LEARN) * self.share + self.LEARN * seen
        self.share = min(self.HIGH, max(self.LOW, share))
