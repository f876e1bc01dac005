"""The engine's journal: what it decided recently, how long its cycles took, how its
reloads went, and which governed keys its last plans left short of their target.

:class:`~amm_rules.engine.policy.RulesPolicy` writes here from its cycle, at a cost of
a few dictionary or deque operations per *action* (never per key in memory);
:mod:`amm_rules.observe` reads it to answer ``status``, ``explain``, the Prometheus
collector and cluster dumps. Everything kept is bounded.

Shortfall reasons (:func:`shortfall`, kept per key in
:attr:`amm_rules.engine.state.index.KeyIndex.shortfall`) are the ``in-progress`` half of a
rule's conformance: a key is short because copies or drops it asked for are still in
flight (``in-flight``), because an action waits for a dependent processing on a holder
or for a rebalancing move (``busy``), or because eligible workers cannot take a copy
right now (paused, backing off after a timed-out copy, a suggestion refused:
``waiting``). The ``unsatisfiable`` half is a property of a key's class on the current
workers, computed by :mod:`amm_rules.observe.conformance`.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Generator, Hashable, Mapping
from itertools import islice
from typing import Any, NamedTuple

from amm_rules.engine.dryrun import HELD_BACK, REBALANCE_LABEL
from amm_rules.engine.events import COUNTERS, dry_run_counts
from amm_rules.engine.words import counted

#: Decisions kept (across all keys); ``explain`` shows a key's own among them.
DECISIONS_KEPT = 10_000
#: Cycle durations kept (the recent cycles of ``status``: median and worst).
CYCLES_KEPT = 100

#: Counter label of rebalancing's copies and drops (``amm_rules_status``, events).
REBALANCE = REBALANCE_LABEL

#: Shortfall reasons of keys the workers can satisfy (in-progress).
IN_FLIGHT = "in-flight"
BUSY = "busy"
WAITING = "waiting"
IN_PROGRESS_REASONS = (IN_FLIGHT, BUSY, WAITING)


class Decision(NamedTuple):
    """One suggestion the engine made (or held back) for a key."""

    #: Wall-clock time (seconds since the epoch).
    time: float
    key: Hashable
    #: ``"replicate"`` or ``"drop"``.
    op: str
    worker: str
    #: ``"accepted"`` or ``"refused"`` by the AMM, ``"deferred"`` (not suggested), or
    #: ``"dry-run"`` (held back: see :mod:`amm_rules.engine.dryrun`).
    outcome: str
    reason: str
    #: Counter label: rule name, ``(annotation)``, ``(runtime)``, ``(rebalance)``...
    source: str


class Journal:
    """Bounded records of the engine's recent work (see the module docstring)."""

    def __init__(self) -> None:
        #: The latest decisions, oldest first.
        self.decisions: deque[Decision] = deque(maxlen=DECISIONS_KEPT)
        #: The same decisions by key, oldest first (``for_key`` reads one key's
        #: without a scan of the ring: ``explain`` asks for thousands of keys at once).
        self._by_key: defaultdict[Hashable, deque[Decision]] = defaultdict(deque)
        #: Durations (seconds) of the latest cycles, oldest first.
        self.cycle_seconds: deque[float] = deque(maxlen=CYCLES_KEPT)
        #: Cycles run and their total duration since the policy started.
        self.cycles = 0
        self.cycle_seconds_total = 0.0
        #: Counters of the last cycle: label -> {governed, requested, dropped, unmet, ...}.
        self.last_cycle: dict[str, dict[str, int]] = {}
        #: Copies requested and dropped since the policy started: label -> counts.
        self.totals: defaultdict[str, Counter[str]] = defaultdict(Counter)
        #: Reloads of the rules file by result (``ok``, ``error``).
        self.reloads: Counter[str] = Counter()
        #: Keys the classification budget left for later cycles, at the last cycle.
        self.backlog = 0
        #: The AMM's own measure of every worker in the last cycle (the AMM builds it
        #: each cycle, and updates it as it accepts suggestions): kept by reference, so
        #: that a status report need not measure a thousand workers again.
        self.worker_memory: Mapping[Any, int] = {}

    def decision(
        self, key: Hashable, op: str, worker: str, outcome: str, reason: str, source: str
    ) -> None:
        decisions = self.decisions
        if len(decisions) == decisions.maxlen:
            # The oldest decision leaves the ring: it is the oldest of its key's too.
            old = decisions[0]
            mine = self._by_key.get(old.key)
            if mine:
                mine.popleft()
                if not mine:
                    del self._by_key[old.key]
        d = Decision(time.time(), key, op, worker, outcome, reason, source)
        decisions.append(d)
        self._by_key[key].append(d)

    def cycle(self, seconds: float) -> None:
        self.cycles += 1
        self.cycle_seconds_total += seconds
        self.cycle_seconds.append(seconds)

    @property
    def last_cycle_seconds(self) -> float:
        """The duration of the last cycle (0 before the first)."""
        return self.cycle_seconds[-1] if self.cycle_seconds else 0.0

    def counted(self, stats: Mapping[str, Counter[str]]) -> None:
        """Keep a cycle's counters per label (:attr:`last_cycle`, :attr:`totals`)."""
        self.last_cycle = {
            label: {**{c: counts[c] for c in COUNTERS}, **dry_run_counts(counts)}
            for label, counts in stats.items()
        }
        for label, c in stats.items():
            self.totals[label].update(requested=c["requested"], dropped=c["dropped"])

    def for_key(self, key: Hashable, limit: int = 10) -> list[Decision]:
        """The key's latest decisions, oldest first (from the index by key: a few
        dictionary and deque operations, whatever the size of the ring)."""
        try:
            mine = self._by_key.get(key)
        except TypeError:  # an unhashable key has no decisions
            return []
        if not mine or limit <= 0:
            return []
        return _latest(mine, limit)

    def recent(self, limit: int) -> list[Decision]:
        """The latest ``limit`` decisions, oldest first."""
        return _latest(self.decisions, limit)

    def rebalancing(
        self,
        moves: Generator[Any, Any, None],
        pending: Mapping[Hashable, Any],
        held: Callable[[Any], str | None] | None = None,
    ) -> Generator[Any, Any, None]:
        """Pass the rebalancer's suggestions through to the AMM (and its answers back),
        writing each to the journal. ``pending``: the rebalancer's moves in flight;
        ``held``: names the dry-run label of a suggestion held back on its way (its
        outcome is then ``dry-run``, as for replication)."""
        choice = None
        while True:
            try:
                suggestion = moves.send(choice)
            except StopIteration:
                return
            choice = yield suggestion
            key = suggestion.ts.key
            (ws,) = suggestion.candidates or (None,)
            move = pending.get(key)
            if suggestion.op == "replicate":
                why = f"rebalance: move from {move.sender}" if move else "rebalance: move"
            else:
                why = f"rebalance: the copy landed on {move.recipient}" if move else "rebalance"
            if choice is not None:
                outcome = "accepted"
            elif held is not None and held(suggestion) is not None:
                outcome = HELD_BACK
            else:
                outcome = "refused"
            self.decision(key, suggestion.op, getattr(ws, "address", "?"), outcome, why, REBALANCE)


def _latest(decisions: deque[Decision], limit: int) -> list[Decision]:
    """The last ``limit`` of ``decisions``, oldest first."""
    return list(islice(reversed(decisions), limit))[::-1]


def shortfall(plan: Any, refused: bool) -> tuple[str, str] | None:
    """Why a planned key does not hold its target and placement yet, or None if it
    does: ``(reason, sentence)``, reason one of :data:`IN_PROGRESS_REASONS`.

    ``plan`` is the :class:`~amm_rules.engine.decide.plan.KeyPlan` as enacted (refused
    copies already taken out of ``plan.inflight``); ``refused``: the AMM refused one
    of its suggestions.
    """
    if plan.frozen:
        return None
    drops = plan.drops
    if plan.inflight:
        return IN_FLIGHT, f"{counted(len(plan.inflight), 'copy')} in flight"
    if drops and not refused:
        return IN_FLIGHT, f"{counted(len(drops), 'drop')} requested"
    if plan.deferred:
        return BUSY, plan.deferred[0]
    if plan.unmet:
        return WAITING, plan.unmet
    if refused or plan.replicas:
        return WAITING, "a suggestion was refused by the Active Memory Manager; retried"
    if plan.misplaced:
        where = ", ".join(sorted(set(plan.misplaced.values())))
        return WAITING, f"{len(plan.misplaced)} misplaced (copies {where})"
    return None
