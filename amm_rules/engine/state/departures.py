"""What a worker took with it when it left: the keys that fell below their target and
the keys that lost their last copy, per departing worker.

The scheduler's ``remove_worker`` marks the worker closed, removes each of its copies
(``remove_replica``), then tells the plugins. The key index's ``remove_replica``
wrapper (:func:`amm_rules.engine.state.index.watch_scheduler`) calls
:meth:`Departures.lost_copy` for each copy of a closed worker, and its
``remove_worker`` hook calls :meth:`Departures.left`, which hands the tally to the
listener (the departures section, :mod:`amm_rules.engine.sections.departures`). Cost:
nothing while no worker leaves; a few attribute reads per copy of a leaving worker.

Neighbours: :mod:`amm_rules.engine.state.index` feeds it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from amm_rules.language.ruleset import ALL, Desired

#: Keys named per list of a departure (the counts are always whole).
KEYS_KEPT = 20


class Departure:
    """The copies one worker took with it."""

    __slots__ = (
        "address",
        "below",
        "below_bytes",
        "below_keys",
        "lost",
        "lost_bytes",
        "lost_keys",
    )

    def __init__(self, address: str):
        self.address = address
        #: Governed keys left with fewer copies than their target's minimum (but one).
        self.below = 0
        self.below_bytes = 0
        self.below_keys: list[Hashable] = []
        #: Keys, governed or not, left with no copy at all.
        self.lost = 0
        self.lost_bytes = 0
        self.lost_keys: list[Hashable] = []


class Departures:
    """The tallies of the workers leaving now, and who is told when one has left."""

    __slots__ = ("fetching", "listener", "source_lost", "tallies")

    def __init__(self) -> None:
        self.tallies: dict[str, Departure] = {}
        #: Called with the departure and whether the worker was retiring, once it left.
        self.listener: Callable[[Departure, bool], None] | None = None
        #: Governed keys that lost a copy with a worker that left (the key index's
        #: ``source_lost``: the replication section gives up their copies in flight).
        self.source_lost: set[Hashable] = set()
        #: Keys that lost a holder -> workers that were fetching them for a dependent
        #: then (the key index's ``fetching``).
        self.fetching: dict[Hashable, set[str]] = {}

    def lost_copy(self, address: str, ts: Any, wanted: Desired | None) -> None:
        """``ts`` lost its copy on ``address``, a worker leaving the cluster."""
        tally = self.tallies.get(address)
        if tally is None:
            tally = self.tallies[address] = Departure(address)
        left = len(ts.who_has or ())
        nbytes = max(ts.nbytes, 0)
        if not left:
            tally.lost += 1
            tally.lost_bytes += nbytes
            if len(tally.lost_keys) < KEYS_KEPT:
                tally.lost_keys.append(ts.key)
            return
        target = wanted.replicate if wanted is not None else None
        if target is None or (target.min != ALL and left >= target.min):
            return
        tally.below += 1
        tally.below_bytes += nbytes
        if len(tally.below_keys) < KEYS_KEPT:
            tally.below_keys.append(ts.key)

    def left(self, address: str, retiring: bool) -> None:
        """``address`` has left (the scheduler's plugins are told): its tally is done."""
        tally = self.tallies.pop(address, None) or Departure(address)
        if self.listener is not None:
            self.listener(tally, retiring)
