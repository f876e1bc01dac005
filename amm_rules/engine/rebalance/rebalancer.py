"""Rebalancing inside :class:`~amm_rules.engine.policy.RulesPolicy`: the adapter between the
scheduler's objects and the pure planner of :mod:`amm_rules.engine.rebalance.plan`: it
reads the live scheduler to feed the planner, and turns its answers into AMM
``Suggestion``\\ s. One :class:`Rebalancer` lives as long as its policy (hot reloads
keep it); each AMM cycle :meth:`Rebalancer.run` measures the workers, settles the moves
in flight, plans with the rules as predicates and suggests the copies (its steps say
how).

Neighbours: the rebalance section (:mod:`amm_rules.engine.sections.rebalance`) runs it,
holds the keys of the moves in flight (the other sections keep their copies) and reports
it; the moves in flight are kept in the engine's ledger
(:mod:`amm_rules.engine.state.ledger`); :meth:`Rebalancer.cycle_summary` adds its part
to ``cycle`` events.

Cost per cycle: O(workers) to measure, plus the planner's O(keys moved) and the moves in
flight; a disabled rebalancer with nothing in flight costs nothing. It never scans
``scheduler.tasks``: candidate keys are read lazily from the senders' ``has_what``.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from collections.abc import Callable, Collection, Generator, Iterable, Mapping
from typing import Any

import dask
from distributed.active_memory_manager import Suggestion

from amm_rules.engine import key_logger
from amm_rules.engine.adapters import TaskFactsAdapter, headroom, worker_status
from amm_rules.engine.decide.deciders import MOVE, Question, count_copies, first_refusal
from amm_rules.engine.decide.view import ClusterView, KeyView
from amm_rules.engine.rebalance.plan import (
    ABOVE,
    NEEDED,
    Key,
    MoveBook,
    RebalancePlan,
    Settlement,
    Target,
    WorkerLoad,
    plan_rebalance,
)
from amm_rules.engine.state.journal import REBALANCE as SOURCE
from amm_rules.engine.state.ledger import Copy
from amm_rules.language.ruleset import UNGOVERNED, RebalanceSettings

logger = logging.getLogger(__name__)

#: Why a key with dependents still to run is not moved.
READ_SOON = "read by a task still to run"
#: Why a key its sender holds on disk is not moved (its memory is not the sender's).
ON_DISK = "on disk on the sender: moving it relieves no memory"
#: How many void reasons and examples ``status`` keeps from the last plan.
EXAMPLES_KEPT = 10


def spill_thresholds() -> tuple[float | None, float | None]:
    """The workers' spill thresholds as fractions of their memory limit, from the dask
    config (``distributed.worker.memory.target``: managed memory; ``.spill``: process
    memory), each None when off. The scheduler's config: workers started with other
    thresholds are not known to it."""
    out = []
    for name in ("target", "spill"):
        value = dask.config.get(f"distributed.worker.memory.{name}", None)
        out.append(float(value) if value not in (None, False) else None)
    return out[0], out[1]


class Rebalancer:
    """The ``rebalance:`` section of the rules, run each AMM cycle (see the module doc).

    Starts with the default settings (disabled); :meth:`configure` installs the rules',
    timings of the :class:`~amm_rules.engine.rebalance.plan.MoveBook` included.
    """

    def __init__(self, moves: dict[Key, Any] | None = None) -> None:
        #: The settings in force (replaced on reload by :meth:`configure`).
        self.settings = RebalanceSettings()
        #: Moves in flight, keys cooling down, roles of the last plan (the book's
        #: default timings are the default settings').
        self.book = MoveBook(pending=moves)
        #: The plan of the last cycle that planned (``None`` before the first).
        self.last_plan: RebalancePlan | None = None
        #: What the last settlement decided.
        self.last_settlement: Settlement | None = None
        #: Since the policy started: moves started, bytes copied, moves done, drops
        #: accepted, copies the AMM refused, moves void.
        self.totals: Counter[str] = Counter()
        #: Since the policy started: why moves were abandoned.
        self.void_reasons: Counter[str] = Counter()
        #: This cycle's facts for the ``cycle`` event (see :meth:`cycle_summary`).
        self._cycle: dict[str, Any] = {}
        self._on_match_error: Callable[[Exception], None] | None = None
        # The sender the planner is considering for a key: ``can_move(key, sender)`` is
        # asked right before ``can_place(key, ...)`` for the same key, and ``spread: host``
        # must not count the sender's own host (its copy is the one that leaves).
        self._sender: tuple[Key, str] | None = None
        #: What ``task.reads`` reads in ``rebalance.match`` (the policy's demand tracker).
        self.reads: Mapping[Key, int] | None = None
        #: prefix -> published memory-flow figures, for a match reading ``task.prefix_*``.
        self.flow: Mapping[str, Any] | None = None
        #: task group -> its published recompute estimate (``task.recompute_seconds``).
        self.costs: Mapping[Any, float] | None = None
        #: The spans' states (``task.span_done``).
        self.spans: Any = None

    def __repr__(self) -> str:
        state = "enabled" if self.settings.enabled else "disabled"
        return f"<Rebalancer {state}, {self.book!r}>"

    # ------------------------------------------------------------------ rules

    def configure(
        self,
        settings: RebalanceSettings,
        on_match_error: Callable[[Exception], None] | None = None,
    ) -> None:
        """Install the settings of a (re)loaded ruleset.

        Moves in flight are kept and settled even if rebalancing was switched off: their
        copies were asked for, and the sender's copy must still go once they land (or the
        key keeps an extra copy that only replication would trim). Keys cooling down
        keep cooling. New timings apply at once (:meth:`MoveBook.retime`). The roles of
        the last plan are forgotten when the settings changed: they carry the old band's
        hysteresis.
        """
        if settings != self.settings:
            self.book.roles = {}
        self.book.retime(
            cooldown=settings.cooldown,
            copy_timeout=settings.copy_timeout,
            drop_timeout=settings.drop_timeout,
        )
        self.settings = settings
        self._on_match_error = on_match_error

    @property
    def idle(self) -> bool:
        """Nothing to do this cycle: disabled and no move in flight."""
        return not self.settings.enabled and not self.book.pending

    # ------------------------------------------------------------------ the cycle

    def run(
        self,
        scheduler: Any,
        manager: Any,
        *,
        now: float,
        desired: Mapping[Key, Any],
        inflight: Mapping[Key, Mapping[str, Copy]],
        cluster: Callable[[], ClusterView],
        stats: Mapping[str, Counter[str]],
        adopt: Callable[[Key, str], None] | None = None,
        on_disk: Callable[[Key, str], bool] | None = None,
    ) -> Generator[Suggestion, Any, None]:
        """One cycle. ``desired``: governed keys' resolved wishes (others are ungoverned);
        ``inflight``: the engine's copies in flight (the ledger's); ``cluster``: builds the
        planner's view of the workers (pools), called at most once, when a move of a
        replicated key settles or a key with a ``pool`` or ``avoid`` needs a recipient;
        ``stats``: the cycle's counters, by label; ``adopt(key, recipient)``: told of
        each move given up after its copy landed (the copy is the key's own now);
        ``on_disk(key, worker)``: whether the worker holds the key on disk (the spill
        section's table): such a key is not moved from it, which would read it back
        and relieve no memory (dask/distributed#6002).
        """
        self._cycle = {}
        if self.idle:
            return
        settings = self.settings
        tasks = scheduler.tasks
        workers = scheduler.workers
        view = functools.cache(cluster)

        # 1. Measure before anything is yielded: the AMM's tally moves with each accepted
        #    suggestion, and this cycle's drops of landed moves are already counted by
        #    the planner through the moves in flight.
        loads = self._loads(workers, manager) if settings.enabled else []

        # 2. Settle the moves in flight, even when rebalancing is off: their copies were
        #    asked for, and the senders' copies must still go once they land.
        target = self._target(tasks, manager, desired, view)
        settlement, dropped = yield from self._settle(tasks, workers, now, stats, target, adopt)
        if not settings.enabled:
            return

        # 3. Plan.
        plan = plan_rebalance(
            loads,
            settings,
            keys_on=self._keys_on(workers),
            can_move=self._can_move(tasks, manager, desired, inflight, on_disk),
            can_place=self._can_place(tasks, manager, desired, inflight, view),
            pending=self.book.pending.values(),
            cooling=self.book.cooling(now),
            previous=self.book.roles,
        )
        self._sender = None

        # 4. Copy.
        started, copied = yield from self._copy(plan, tasks, workers, now, stats)
        if started or dropped or settlement.void:
            logger.debug(
                "amm-rules rebalance: %d moves (%d B), %d drops, %d done, %d void; %r",
                started,
                copied,
                dropped,
                len(settlement.done),
                len(settlement.void),
                plan,
            )

    def _settle(
        self,
        tasks: Mapping[Key, Any],
        workers: Mapping[str, Any],
        now: float,
        stats: Mapping[str, Counter[str]],
        target: Target,
        adopt: Callable[[Key, str], None] | None,
    ) -> Generator[Suggestion, Any, tuple[Settlement, int]]:
        """Step 2 of :meth:`run`: for each move whose copy landed, ask the sender to drop
        its copy; forget the moves that are complete or void. Returns the settlement and
        the number of drops the AMM accepted.

        A refused drop is not retried here: the move stays in flight, and the next
        cycles ask again until the move's drop timeout (:meth:`MoveBook.settle`), unless
        the key's replication target says otherwise (``target``). A move given up after
        its copy landed hands the copy to ``adopt``.
        """
        alive = {a for a, ws in workers.items() if worker_status(ws) != "closing"}
        holders = self._holders(tasks)
        settlement = self.book.settle(
            now, holders=holders, alive=alive, can_drop=self._can_drop(tasks), target=target
        )
        self.last_settlement = settlement
        if adopt is not None:
            for p, _ in settlement.void:
                if (
                    p.landed is not None
                    and p.recipient in alive
                    and p.recipient in (holders(p.key) or ())
                ):
                    adopt(p.key, p.recipient)
        dropped = 0
        for p in settlement.drops:
            ts = tasks.get(p.key)
            ws = workers.get(p.sender)
            if ts is None or ws is None:  # pragma: no cover - settle checked both
                continue
            accepted = (yield Suggestion("drop", ts, {ws})) is not None
            dropped += accepted
            key_logger.debug(
                "(drop, %s, %s) %s: rebalance, copy landed on %s",
                p.key,
                p.sender,
                "accepted" if accepted else "refused",
                p.recipient,
            )
        void = Counter(reason for _, reason in settlement.void)
        for p, reason in settlement.void:
            key_logger.debug("(move, %s, %s) abandoned: %s", p.key, p.sender, reason)
        self.totals.update(done=len(settlement.done), drops=dropped, void=len(settlement.void))
        self.void_reasons.update(void)
        if dropped:
            stats[SOURCE]["dropped"] += dropped
        self._cycle = {
            "drops": dropped,
            "done": len(settlement.done),
            "void": dict(void),
        }
        return settlement, dropped

    def _copy(
        self,
        plan: RebalancePlan,
        tasks: Mapping[Key, Any],
        workers: Mapping[str, Any],
        now: float,
        stats: Mapping[str, Counter[str]],
    ) -> Generator[Suggestion, Any, tuple[int, int]]:
        """Step 4 of :meth:`run`: one ``replicate`` per move, with the recipient as the
        only candidate, so that the AMM validates the planner's choice instead of making
        its own. An accepted copy starts the move in the book; a refused one only cools
        the key down, so that it is not proposed again before its cool-down ends.
        Returns the moves started and their bytes.
        """
        started = refused = copied = 0
        for move in plan.moves:
            ts = tasks.get(move.key)
            ws = workers.get(move.recipient)
            if ts is None or ws is None:  # pragma: no cover - the plan read them just now
                continue
            accepted = (yield Suggestion("replicate", ts, {ws})) is not None
            if accepted:
                self.book.start(move, now)
                started += 1
                copied += move.nbytes
            else:
                self.book.refuse(move, now)
                refused += 1
            key_logger.debug(
                "(replicate, %s, %s) %s: rebalance from %s; %s",
                move.key,
                move.recipient,
                "accepted" if accepted else "refused",
                move.sender,
                move.reason,
            )
        self.book.remember(plan)
        self.last_plan = plan
        self.totals.update(moves=started, bytes=copied, refused=refused)
        if started:
            stats[SOURCE]["requested"] += started
        self._cycle.update(
            moves=started,
            bytes=copied,
            refused=refused,
            mean=plan.mean,
            stopped=plan.stopped,
            roles=dict(plan.roles),
            skipped=dict(plan.skipped),
        )
        return started, copied

    def _loads(self, workers: Mapping[str, Any], manager: Any) -> list[WorkerLoad]:
        """Every worker that is not retiring, by the rules' measure, plus the bytes the AMM
        has accepted for it so far in this cycle (the AMM's tally minus its own measure,
        so this works whatever measure the AMM itself uses), and its headroom below the
        spill thresholds (:func:`headroom`)."""
        measure = self.settings.measure
        tally = getattr(manager, "workers_memory", None)
        amm_measure = getattr(manager, "measure", measure)
        thresholds = spill_thresholds()
        out = []
        for address, ws in workers.items():
            status = worker_status(ws)
            if status == "closing":
                continue
            memory = ws.memory  # a property that builds a new object: read it once
            delta = 0
            if tally is not None and ws in tally:
                delta = tally[ws] - getattr(memory, amm_measure)
            limit = ws.memory_limit or 0
            out.append(
                WorkerLoad(
                    address,
                    max(0, getattr(memory, measure) + delta),
                    limit,
                    running=status == "running",
                    spilled=memory.spilled,
                    headroom=headroom(memory, limit, thresholds, delta),
                )
            )
        return out

    # ------------------------------------------------------------------ predicates

    @staticmethod
    def _keys_on(workers: Mapping[str, Any]) -> Callable[[str, bool], Iterable[tuple[Key, int]]]:
        def keys_on(address: str, newest_first: bool) -> Iterable[tuple[Key, int]]:
            # has_what is insertion-ordered: oldest first. Lazy, so the planner pays
            # only for the keys it looks at.
            has_what = workers[address].has_what
            order = reversed(has_what) if newest_first else has_what
            return ((ts.key, max(ts.nbytes, 0)) for ts in order)

        return keys_on

    @staticmethod
    def _holders(tasks: Mapping[Key, Any]) -> Callable[[Key], Collection[str] | None]:
        def holders(key: Key) -> Collection[str] | None:
            ts = tasks.get(key)
            if ts is None or ts.state != "memory" or not ts.who_has:
                return None
            return {ws.address for ws in ts.who_has}

        return holders

    @staticmethod
    def _can_drop(tasks: Mapping[Key, Any]) -> Callable[[Key, str], str | None]:
        def can_drop(key: Key, sender: str) -> str | None:
            ts = tasks[key]
            for waiter in ts.waiters or ():
                if waiter.processing_on is not None and waiter.processing_on.address == sender:
                    return "a dependent is processing on the sender"
            return None

        return can_drop

    @staticmethod
    def _target(
        tasks: Mapping[Key, Any],
        manager: Any,
        desired: Mapping[Key, Any],
        view: Callable[[], ClusterView],
    ) -> Target:
        """Where a replicated key's target stands while its move's copy has landed, as
        the replication planner counts it (:func:`~amm_rules.engine.decide.deciders.count_copies`):
        copies on workers where they count (inside the pool, outside avoided pools, not
        retiring), less those being dropped in this cycle. ``NEEDED``: without the
        sender's copy the key would hold fewer than its ``replicate`` minimum;
        ``ABOVE``: it holds more than the maximum."""
        pending = getattr(manager, "pending", None) or {}

        def target(key: Key, sender: str) -> str | None:
            d = desired.get(key)
            ts = tasks.get(key)
            if d is None or d.replicate is None or ts is None:
                return None
            placeable = view().placeable(d.pool, d.avoid)
            entry = pending.get(ts)
            leaving = entry[1] if entry is not None else ()
            holders = [ws.address for ws in ts.who_has or () if ws not in leaving]
            count = count_copies(d, holders, placeable)
            if sender in placeable and len(count.good) - 1 < count.lo:
                return NEEDED
            if count.above:
                return ABOVE
            return None

        return target

    def _can_move(
        self,
        tasks: Mapping[Key, Any],
        manager: Any,
        desired: Mapping[Key, Any],
        inflight: Mapping[Key, Mapping[str, Copy]],
        on_disk: Callable[[Key, str], bool] | None = None,
    ) -> Callable[[Key, str], str | None]:
        pending = getattr(manager, "pending", None) or {}
        match = self.settings.match

        def can_move(key: Key, sender: str) -> str | None:
            ts = tasks.get(key)
            if ts is None or ts.state != "memory":
                return "not in memory"
            if ts.actor:
                return "actor"
            if ts in pending:
                return "another decision about it this cycle"
            if key in inflight:
                return "replication copy in flight"
            d = desired.get(key, UNGOVERNED)
            if d.move == "never":
                return f"move: never ({d.reasons['move']})"
            if ts.waiters:
                # Moving it now races with that read or pays a transfer for no relief
                # (docs/rebalance.md, "Safety while computing").
                return READ_SOON
            if on_disk is not None and on_disk(key, sender):
                return ON_DISK
            if match is not None:
                try:
                    facts = TaskFactsAdapter(ts, self.reads, self.flow, self.spans, self.costs)
                    if not match(facts):
                        return "outside rebalance.match"
                except Exception as exc:
                    if self._on_match_error is not None:
                        self._on_match_error(exc)
                    return "rebalance.match raised"
            self._sender = (key, sender)
            return None

        return can_move

    def _can_place(
        self,
        tasks: Mapping[Key, Any],
        manager: Any,
        desired: Mapping[Key, Any],
        inflight: Mapping[Key, Mapping[str, Copy]],
        view: Callable[[], ClusterView],
    ) -> Callable[[Key, str], str | None]:
        """May a move put a copy of the key on a recipient? The decider table's answer
        for a move (:mod:`amm_rules.engine.decide.deciders`): the first reason against
        it, or None."""
        pending = getattr(manager, "pending", None) or {}
        questions: dict[Key, Question] = {}

        def can_place(key: Key, recipient: str) -> str | None:
            cluster = view()
            w = cluster.workers.get(recipient)
            if w is None:
                return "not a worker of this cycle"
            sender = self._sender[1] if self._sender and self._sender[0] == key else None
            q = questions.get(key)
            if q is None or q.sender != sender:
                ts = tasks[key]
                entry = pending.get(ts)
                key_view = KeyView(
                    key,
                    desired.get(key, UNGOVERNED),
                    frozenset(ws.address for ws in ts.who_has or ()),
                    inflight={a: c.deadline for a, c in inflight.get(key, {}).items()},
                    pending_add=frozenset(ws.address for ws in entry[0])
                    if entry is not None
                    else frozenset(),
                )
                q = questions[key] = Question(key_view, cluster, MOVE, sender=sender)
            said = first_refusal(q, w)
            return None if said is None else said.why

        return can_place

    # ------------------------------------------------------------------ reporting

    def cycle_summary(self, into: dict[str, Any]) -> bool:
        """Add this cycle's facts to ``into``, the part of the next ``cycle`` event kept
        since the last one: flows (moves, bytes, drops, done, void, skipped) add up,
        states (roles, mean, why planning stopped) are the latest. True if a move
        started, dropped, finished or was void. Read once: a cycle that does not run the
        rebalancer must not report the last one's again."""
        cycle, self._cycle = self._cycle, {}
        if not cycle:
            return False
        for name in ("moves", "bytes", "drops", "done", "refused"):
            into[name] = into.get(name, 0) + cycle.get(name, 0)
        for name in ("void", "skipped"):
            counts = into.setdefault(name, {})
            for reason, n in cycle.get(name, {}).items():
                counts[reason] = counts.get(reason, 0) + n
        for name in ("roles", "mean", "stopped"):
            if name in cycle:
                into[name] = cycle[name]
        return bool(
            cycle.get("moves") or cycle.get("drops") or cycle.get("done") or cycle.get("void")
        )


__all__ = ["SOURCE", "Rebalancer", "spill_thresholds"]
