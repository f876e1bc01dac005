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

from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from amm_rules.language.ruleset import ALL, Desired

if TYPE_CHECKING:
    from amm_rules.engine.state.ledger import Ledger

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
        #: Governed keys that lost a copy with a worker that left (their copies in
        #: flight are given up: :meth:`give_up_orphaned_copies`).
        self.source_lost: set[Hashable] = set()
        #: Keys that lost a holder -> workers that were fetching them for a dependent
        #: then.
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

    def lost_holders(self, keys: Iterable[Hashable]) -> None:
        """These governed keys lost a copy with a worker that died (on a scheduler the
        replica wrappers say so; a simulation's kill calls this)."""
        self.source_lost.update(keys)

    def forget(self, key: Hashable) -> None:
        """The key left memory."""
        self.source_lost.discard(key)
        self.fetching.pop(key, None)

    def give_up_orphaned_copies(
        self, ledger: Ledger, tasks: Mapping[Hashable, Any], until: float
    ) -> None:
        """A key that lost a holder with its worker may be on its way to other workers
        from that dead worker, and such a fetch can hang until the comm times out
        (seconds to minutes) while the key is short. Two kinds of recipient:

        - the engine's own copies in flight (the ``ledger``'s): forgotten, and their
          workers passed over until ``until``, so that other workers are asked first;
          with no other worker, the same one is asked again later (which refreshes its
          list of holders);
        - workers running a dependent of the key that do not hold it: they are
          fetching it for that task, maybe from the dead worker. Asking one of them
          for a copy would add nothing (the worker keeps its fetch going) and the
          copy would count as in flight, the key short, for the whole in-flight
          timeout. They are passed over for the key for as long as they still fetch
          it (run a dependent without holding it): a fetch from a dead worker can
          outlast the in-flight timeout of the copy asked of another worker instead.

        The dependents are read (in ``tasks``, the scheduler's) for keys that lost a
        holder, and then each cycle only for those whose fetches go on."""
        fetching = self.fetching
        for key in self.source_lost:
            ledger.give_up(key, until)
            fetchers = _fetching_for_dependents(tasks.get(key))
            if fetchers:
                fetching.setdefault(key, set()).update(fetchers)
        read, self.source_lost = self.source_lost, set()
        for key, workers in list(fetching.items()):
            if key not in read:  # (just read above: still fetching)
                workers.intersection_update(_fetching_for_dependents(tasks.get(key)))
            if not workers:
                del fetching[key]
                continue
            ledger.back_off(key, workers, until)


def _fetching_for_dependents(ts: Any) -> list[str]:
    """Workers running a task that depends on ``ts`` and not holding it: they fetch it
    (or are about to). Empty for a key gone from memory or without dependents."""
    if ts is None or not ts.waiters:
        return []
    holders = ts.who_has or ()
    return [
        ws.address
        for dts in ts.waiters
        if (ws := dts.processing_on) is not None and ws not in holders
    ]
