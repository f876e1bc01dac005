"""Which keys the ``protect:`` section keeps extra copies of: a pure, greedy choice.

:func:`choose` takes the candidates (keys in memory whose recompute estimate is known,
each with its size, estimate and whether it is protected now) and a budget in bytes,
and returns the keys to protect: the most recompute seconds per byte of extra copies
first, as long as their extra copies fit the budget (a key too large for what is left
is passed over for smaller ones). It is the classic greedy answer to a knapsack, exact
when every key is small against the budget.

Hysteresis, so that keys near the cut-off do not flap from one cycle to the next: a key
protected now competes with its worth multiplied by :data:`HYSTERESIS` (a newcomer
displaces it only when it is worth clearly more per byte), and keeps its protection
while its estimate stays above ``min_recompute / HYSTERESIS``.

Neighbours: :mod:`amm_rules.engine.sections.protect` gathers the candidates from the
recompute costs (:mod:`amm_rules.engine.state.costs`) and makes the copies.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

#: A protected key's worth per byte counts this many times against a newcomer's, and
#: its estimate may fall this many times below ``min-recompute`` before it loses
#: protection.
HYSTERESIS = 1.25


class Candidate(NamedTuple):
    """A key that protection may keep extra copies of (a tuple: a choice builds one per
    key examined, up to hundreds of thousands)."""

    key: Hashable
    #: One copy's size in bytes.
    nbytes: int
    #: Its recompute estimate, seconds.
    seconds: float
    #: Protected now (hysteresis applies).
    incumbent: bool = False


@dataclass
class Choice:
    """What :func:`choose` decided."""

    #: Keys to protect, most worth per byte first.
    keys: list[Hashable] = field(default_factory=list)
    #: Bytes of extra copies the chosen keys take: at most the budget.
    spent: int = 0
    #: Recompute seconds the chosen keys stand for.
    seconds: float = 0.0
    #: Candidates (at or above the cut-off) left out, and their seconds.
    left_out: int = 0
    left_out_seconds: float = 0.0
    #: Candidates left out because the budget was spent (not the key limit).
    no_room: int = 0
    #: Keys below the cut-off (not candidates at all).
    below: int = 0


class Ranking:
    """:func:`choose` in two steps, so that a caller can gather the candidates a slice
    at a time (over several cycles): :meth:`add` each, then :meth:`pick`."""

    __slots__ = ("below", "floor", "min_recompute", "ranked")

    def __init__(self, min_recompute: float) -> None:
        self.min_recompute = min_recompute
        self.floor = min_recompute / HYSTERESIS
        #: (minus the worth per byte, arrival, candidate): sorted, the greedy order.
        self.ranked: list[tuple[float, int, Candidate]] = []
        self.below = 0

    def add(self, c: Candidate) -> None:
        if c.seconds < self.min_recompute and not (c.incumbent and c.seconds >= self.floor):
            self.below += 1
            return
        worth = c.seconds / max(1, c.nbytes)
        if c.incumbent:
            worth *= HYSTERESIS
        self.ranked.append((-worth, len(self.ranked), c))

    def pick(self, budget: int, copies: int, max_keys: int) -> Choice:
        """The keys to protect with ``copies`` copies each within ``budget`` bytes of
        extra copies, at most ``max_keys`` of them."""
        extra = max(1, copies - 1)
        out = Choice(below=self.below)
        self.ranked.sort()  # (arrivals differ: candidates are never compared)
        keys = out.keys
        for _, _, c in self.ranked:
            cost = max(0, c.nbytes) * extra
            if len(keys) < max_keys and out.spent + cost <= budget:
                keys.append(c.key)
                out.spent += cost
                out.seconds += c.seconds
            else:
                out.left_out += 1
                out.left_out_seconds += c.seconds
                if len(keys) < max_keys:
                    out.no_room += 1
        return out


def choose(
    candidates: Iterable[Candidate],
    budget: int,
    copies: int,
    min_recompute: float,
    max_keys: int,
) -> Choice:
    """The keys to protect with ``copies`` copies each within ``budget`` bytes of extra
    copies, at most ``max_keys`` of them (see the module docstring)."""
    ranking = Ranking(min_recompute)
    for c in candidates:
        ranking.add(c)
    return ranking.pick(budget, copies, max_keys)


__all__ = ["HYSTERESIS", "Candidate", "Choice", "Ranking", "choose"]
