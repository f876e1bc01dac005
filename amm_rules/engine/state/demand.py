"""A key's demand: how many dependents read it, and where and when they last did.

The scheduler knows a key's dependents still to run (``TaskState.waiters``) but not
who has read it already, nor where: :class:`DemandTracker` keeps that, per key in
memory, from the scheduler's transitions (fed by :class:`~amm_rules.engine.state.index.KeyIndex`,
whose plugin hook calls :meth:`DemandTracker.transition`):

- ``reads[key]``: dependents that finished (``processing -> memory``) since the key
  entered memory; what ``task.reads`` returns in a ``match``. For keys already in
  memory when the tracker starts following (the policy attaches, a reload turns demand
  on), it starts from the dependents whose results are in memory (:meth:`seed`);
- ``last_read[key][address]``: when a dependent last finished reading the key on that
  worker; what the ``demand:`` section's ``hold`` reads (:meth:`held`);
- ``touched``: keys whose waiters or reads changed since the last cycle. A dependent
  joins a key's waiters when it starts waiting and leaves them when it finishes, and
  each of those is a transition of the *dependent*: its dependencies are marked here,
  and the policy classifies them again if a rule's match reads ``task.waiters`` or
  ``task.reads`` (so those attributes stay current as tasks finish).

Nothing is followed unless the rules read demand (``Ruleset.reads_demand``): the hook
then costs one look at each dependency of the task that changed state.

Neighbours: :mod:`amm_rules.engine.state.index` forgets a key here when it leaves memory;
:mod:`amm_rules.engine.decide.view` reads ``reads`` for ``task.reads``; the policy passes
:meth:`held` to the planner and to reduce-replicas.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

from amm_rules.engine.adapters import TaskFactsAdapter
from amm_rules.language.ruleset import DemandSettings

#: Task states in which a task is one of its dependencies' waiters.
WAITING_STATES = frozenset({"waiting", "queued", "processing", "no-worker"})


class DemandTracker:
    """Reads and waiters of keys in memory, kept from the scheduler's transitions."""

    def __init__(self) -> None:
        #: False until the rules read demand; the hook then returns at once.
        self.enabled: bool = False
        #: The scheduler's ``tasks`` (set when the policy attaches).
        self.tasks: Mapping[Hashable, Any] = {}
        #: Dependents that finished reading the key since it entered memory.
        self.reads: dict[Hashable, int] = {}
        #: key -> {worker address: monotonic time a dependent last finished there}.
        self.last_read: dict[Hashable, dict[str, float]] = {}
        #: Keys whose waiters or reads changed since the policy last looked.
        self.touched: set[Hashable] = set()
        #: The ``demand:`` section in force.
        self.settings = DemandSettings()
        self._on_match_error: Callable[[Exception], None] | None = None
        #: A task as the section's match sees it (the engine's, as the rules see it).
        self._facts: Callable[[Any], Any] = lambda ts: TaskFactsAdapter(ts, self.reads)

    def configure(
        self,
        settings: DemandSettings,
        enabled: bool,
        on_match_error: Callable[[Exception], None] | None = None,
        facts: Callable[[Any], Any] | None = None,
    ) -> None:
        """Apply a (re)loaded rules file. Turning the tracker off forgets what it had
        counted: counts kept while nobody updates them would be wrong later. ``facts``:
        a task as rules see it (reads, memory flow, spans, recompute costs)."""
        self.settings = settings
        self._on_match_error = on_match_error
        if facts is not None:
            self._facts = facts
        if self.enabled and not enabled:
            self.clear()
        self.enabled = enabled

    def transition(self, key: Hashable, start: str, finish: str, worker: Any) -> None:
        """A task changed state: if it entered or left its dependencies' waiters, or
        finished reading them, note it for each dependency."""
        if start not in WAITING_STATES and finish not in WAITING_STATES:
            return
        ts = self.tasks.get(key)
        dependencies = ts.dependencies if ts is not None else None
        if not dependencies:
            return
        touched = self.touched
        if start == "processing" and finish == "memory":
            reads = self.reads
            now = time.monotonic()
            where = worker if isinstance(worker, str) else None
            for dts in dependencies:
                if not dts.who_has:
                    continue  # not in memory (a reader finishing after a loss)
                k = dts.key
                touched.add(k)
                reads[k] = reads.get(k, 0) + 1
                if where is not None:
                    self.last_read.setdefault(k, {})[where] = now
        else:
            # Only keys with copies can be governed: others are classified when they
            # enter memory anyway.
            touched.update(dts.key for dts in dependencies if dts.who_has)

    def seed(self, tasks: Iterable[Any]) -> int:
        """Reads of keys that were in memory before the tracker followed them (the
        policy attached, or a reload turned demand on), from what the scheduler still
        knows: each dependent whose result is in memory has read the key. A lower
        bound (dependents that ran and were released are not known any more); where
        and when they read it is not known either, so the ``hold`` keeps nothing for
        them. Returns the keys seeded."""
        if not self.enabled:
            return 0
        reads, touched = self.reads, self.touched
        seeded = 0
        for ts in tasks:
            if not ts.who_has:
                continue
            done = sum(1 for d in ts.dependents if d.state == "memory")
            if done > reads.get(ts.key, 0):
                reads[ts.key] = done
                touched.add(ts.key)
                seeded += 1
        return seeded

    def forget(self, key: Hashable) -> None:
        """The key left memory (a new copy of it starts with no reads)."""
        if self.reads:  # empty unless the rules read demand: runs on every key leaving
            self.reads.pop(key, None)
        if self.last_read:
            self.last_read.pop(key, None)
        if self.touched:
            self.touched.discard(key)

    def clear(self) -> None:
        self.reads.clear()
        self.last_read.clear()
        self.touched.clear()

    def held_copies(self, ts: Any, now: float) -> frozenset[str]:
        """The workers whose copy of ``ts`` the ``demand:`` hold keeps now: a
        dependent finished reading it there less than ``hold`` ago, and the section's
        match (if any) selects the key. Empty when the hold is off."""
        settings = self.settings
        if settings.hold <= 0 or ts.key not in self.last_read:
            return frozenset()
        held = self.held(ts.key, now, settings.hold)
        if held and settings.match is not None:
            try:
                selected = settings.match(self._facts(ts))
            except Exception as exc:
                selected = False
                if self._on_match_error is not None:
                    self._on_match_error(exc)
            if not selected:
                return frozenset()
        return held

    def held(self, key: Hashable, now: float, hold: float) -> frozenset[str]:
        """Workers where a dependent finished reading ``key`` less than ``hold``
        seconds before ``now``. Older entries are pruned on the way."""
        entry = self.last_read.get(key)
        if not entry:
            return frozenset()
        horizon = now - hold
        out = [addr for addr, t in entry.items() if t > horizon]
        if len(out) < len(entry):
            if out:
                self.last_read[key] = {addr: entry[addr] for addr in out}
            else:
                del self.last_read[key]
        return frozenset(out)

    def __repr__(self) -> str:
        state = "on" if self.enabled else "off"
        return f"<DemandTracker {state}: {len(self.reads)} keys read>"
