"""The governed-key index: which keys in memory amm-rules governs, grouped by what they
want, and which of them changed since the last cycle, so that a cycle never scans
``scheduler.tasks`` and, in the steady state, looks only at keys that changed.

:class:`KeyIndex` is fed by three deliberately tiny hooks (they run on the scheduler's
hot paths):

- the ``SchedulerPlugin.transition`` hook: a key entering memory goes into
  :attr:`~KeyIndex.dirty` (to be classified at the next cycle; what a cycle's budget
  leaves over waits in the backlog, see :meth:`~KeyIndex.classify`); a key leaving
  memory is forgotten at once, with its runtime target and in-flight copies;
- wrappers of the scheduler's ``add_replica`` / ``remove_replica`` /
  ``remove_all_replicas`` (:func:`watch_scheduler`): a governed key that gained or lost
  a copy, or any key that now has more than one, goes into :attr:`~KeyIndex.touched`,
  and the copies of governed keys are counted per rule (:attr:`~KeyIndex.copies_by`);
  a copy the engine asked for that landed is done in the ledger.
  The AMM gets no notification of replica changes (dependency transfers,
  ``client.replicate``, drops, dead workers all change ``ts.who_has`` silently), so
  this is how a cycle learns which keys to look at;
- a wrapper of ``update_data``: scattered data enters memory without a transition;
- ``add_worker`` / ``remove_worker``: pools and placements are recomputed and every
  governed key is checked once (so a target of ``all`` reaches a worker that joined
  within one cycle);
- the same transition hook feeds the :class:`~amm_rules.engine.state.demand.DemandTracker`
  (reads and waiters of keys), when the rules read demand, the
  :class:`~amm_rules.engine.state.flow.MemoryFlow` (keys entering and leaving memory, with
  their tasks), when the policy gives it one;
- ``log_event``: a worker's status changed (retiring, resumed after a pause);
- the same ``remove_replica`` wrapper and ``remove_worker`` hook tally, per worker
  leaving, the keys that fell below their target and those that lost their last copy
  (:class:`~amm_rules.engine.state.departures.Departures`, :attr:`KeyIndex.departing`).
- for the :class:`~amm_rules.engine.state.costs.RecomputeCosts` the transition hook
  sets a flag (:attr:`~KeyIndex.memory_changed`), and hands it the keys entering and
  leaving memory only while it keeps them per group; the replica wrappers tell the
  costs which worker holds a key's only copy;

Workers leaving, joining, retiring or resuming, governed keys falling below their
target, the engine's own copies landing above a target's ``max`` (a move), tasks
finishing that held up the drop of a misplaced copy, and keys entering memory on a
retiring worker also wake the policy
(:attr:`KeyIndex.wake`), which may ask the AMM for an early cycle
(:mod:`amm_rules.engine.early`).

Governed keys live in :attr:`~KeyIndex.groups`, one group per :data:`PlanClass` (the
resolved fields that decide the plan, plus the label of the replication target), so a
full check (:meth:`~KeyIndex.suspects`) costs one length comparison per key.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from itertools import islice, repeat
from typing import TYPE_CHECKING, Any

from distributed.diagnostics.plugin import SchedulerPlugin

from amm_rules.engine.state.demand import DemandTracker
from amm_rules.engine.state.departures import Departures
from amm_rules.engine.state.governed import GovernedKeys, Placement, PlanClass
from amm_rules.engine.state.ledger import Ledger
from amm_rules.engine.wrapping import wrap_methods
from amm_rules.language.ruleset import ALL, Desired, RuntimeTarget

if TYPE_CHECKING:
    from amm_rules.engine.decide.classify import Batch, Classifier
    from amm_rules.engine.state.costs import RecomputeCosts
    from amm_rules.engine.state.flow import MemoryFlow

#: Keys classified between two looks at the clock (see :meth:`KeyIndex.classify`).
CLASSIFY_CHUNK = 4096


class KeyIndex(SchedulerPlugin):
    """Governed keys in memory, by plan class; plus per-key engine state."""

    idempotent = False

    def __init__(self) -> None:
        #: Keys that entered memory (or must be classified again) since the last cycle,
        #: in the order they arrived: key -> its TaskState, or None (looked up then:
        #: only keys to classify again, see :meth:`reclassify`).
        #: Keys a cycle's budget left over wait in the backlog (see :meth:`classify`).
        self.dirty: dict[Hashable, Any] = {}
        #: Keys that entered memory, left over by a cycle's budget (see :class:`_Backlog`).
        #: (The engine's state is kept in few attributes: past 30, CPython stops
        #: sharing the instances' attribute tables, and every attribute read in the
        #: hooks gets slower.)
        self._backlog = _Backlog()
        #: The scheduler's ``tasks`` once attached (read by the transition hook).
        self.tasks: Mapping[Hashable, Any] = {}
        #: Runtime targets, with their origin: set through the ``amm_rules_set_target``
        #: handler, or by distributed's ``replicate`` and ``scatter(broadcast=...)``
        #: (see :mod:`amm_rules.engine.sections.legacy`).
        self.runtime: dict[Hashable, RuntimeTarget] = {}
        #: What the engine asked and has not seen land (the context's ledger): the
        #: replica wrappers note landings, the hooks keys and workers that left.
        self.ledger = Ledger()
        #: Governed keys that the last plan left short of their target or placement:
        #: key -> (reason, sentence) (see :mod:`amm_rules.engine.state.journal`). Keys of a
        #: class the workers cannot satisfy at all are counted by class, not here.
        self.shortfall: dict[Hashable, tuple[str, str]] = {}
        #: Set when a worker joined or left; the policy recomputes pools and clears it.
        self.workers_changed: bool = True
        #: False once the policy is detached: the scheduler wrappers then only pass through.
        self.active: bool = True
        #: Called with a reason when something happened that an early AMM cycle should
        #: repair (a worker left or joined, changed status, a governed key fell below
        #: its target); the policy sets it (see :mod:`amm_rules.engine.early`).
        self.wake: Callable[[str], None] = _no_wake
        #: When the last classification stopped taking chunks (``time.perf_counter()``):
        #: what follows (filing, the rest of the cycle) is what its keys cost after it.
        self.loop_ended = 0.0
        #: Set when keys that may be indexed already joined dirty (see reclassify).
        self._reclassifying = False
        #: Keys whose copies changed since the last cycle (see :func:`watch_scheduler`).
        self.touched: set[Hashable] = set()
        #: Rebalancing's moves in flight (key -> the move, with its ``recipient``), set
        #: by the rebalance section after each cycle: a move's copy landing wakes the
        #: policy, whose next cycle drops the sender's copy (the relief the move is for).
        self.moving: Mapping[Hashable, Any] = {}
        #: Governed keys to look at again next cycle (an action refused or deferred,
        #: copies held for waiters, a worker backed off).
        self.recheck: set[Hashable] = set()
        #: Keys nobody governs that hold more than one copy: what reduce-replicas walks
        #: (the scheduler's ``replicated_tasks`` minus governed keys, kept up to date
        #: from :attr:`touched`, so governed keys cost nothing there).
        self.replicated_free: dict[Hashable, Any] = {}
        #: What the workers leaving take with them (see
        #: :mod:`amm_rules.engine.state.departures`): per worker leaving now, the keys
        #: below target and lost; and the governed keys that lost a copy with a worker
        #: (:attr:`source_lost`) and the workers fetching them then (:attr:`fetching`).
        self.departing = Departures()
        #: Reads and waiters of keys (followed only when the rules read demand).
        self.demand = DemandTracker()
        #: The memory flow this hook feeds (keys entering and leaving memory), if any.
        self.flow: MemoryFlow | None = None
        #: The recompute costs the replica wrappers feed (sole copies), if any; the
        #: same while it keeps keys per group (the transition hook feeds it then).
        self.costs: RecomputeCosts | None = None
        self.costs_kept: RecomputeCosts | None = None
        #: A key entered or left memory since the recompute costs last looked.
        self.memory_changed = False
        #: Told of scattered keys (``update_data``): ``on_scatter(keys, already_in_memory)``.
        self.on_scatter: Callable[[Iterable[Hashable], set[Hashable]], None] | None = None
        #: Addresses of the workers retiring (from their status changes), until they
        #: leave: a key entering memory on one wakes the policy, since the retirement
        #: waits for a cycle to plan where that key goes.
        self.retiring: set[str] = set()
        #: Governed keys with a copy outside where they may live whose drop waited at
        #: their last planning (a dependent processing there, a refused action): a task
        #: that read one of them finishing wakes the policy, as the drop may go through.
        self.trim_waits: set[Hashable] = set()
        #: The governed keys by plan class, and what they count towards each rule
        #: (:class:`~amm_rules.engine.state.governed.GovernedKeys`); :attr:`desired`,
        #: governed key -> its resolved wishes, is its table, read by the hooks.
        self.governed = GovernedKeys(self.replicated_free, self._forget_plan)
        self.desired: dict[Hashable, Desired] = self.governed.desired

    @property
    def source_lost(self) -> set[Hashable]:
        """Governed keys that lost a copy with its worker (the worker died or left).
        Copies of them in flight may be fetched from that worker, and a fetch from a
        dead worker can hang until the comm times out: the policy gives them up."""
        return self.departing.source_lost

    @property
    def fetching(self) -> dict[Hashable, set[str]]:
        """Keys that lost a holder -> workers that were fetching them for a dependent
        then, without holding them: passed over for the key while they still are."""
        return self.departing.fetching

    # -- SchedulerPlugin hooks: keep them minimal, they run on every transition ----------

    def transition(
        self,
        key: Hashable,
        start: str,
        finish: str,
        *args: Any,
        stimulus_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        if finish == "memory":
            # The scheduler has just read the task: reading it again here is cheap,
            # where the classification, later, would look it up in a cold table.
            ts = self.dirty[key] = self.tasks.get(key)
            # The memory flow counts here rather than as a plugin of its own: a second
            # plugin call on every transition cost about as much as its counting.
            flow = self.flow
            if flow is not None and ts is not None:
                flow.entered(key, ts, start, stimulus_id)
            # The recompute estimates read the scheduler's own figures per task group
            # when next refreshed; only while keys are kept per group is each counted.
            self.memory_changed = True
            kept = self.costs_kept
            if kept is not None and ts is not None:
                if start == "processing":
                    kept.finished(ts)
                else:
                    kept.entered(ts)
            if self.retiring and kwargs.get("worker") in self.retiring:
                # A task that was running there when its retirement started finished:
                # the retirement waits until a cycle has planned where its key goes.
                self.wake("key-on-retiring-worker")
        elif start == "memory":
            self.forget(key)
            self.memory_changed = True  # the estimates of its dependents move
            flow, kept = self.flow, self.costs_kept
            if (flow is not None or kept is not None) and (ts := self.tasks.get(key)) is not None:
                if flow is not None:
                    flow.left(key, ts, stimulus_id)
                if kept is not None:
                    kept.left(ts)
        elif finish == "forgotten" and self.runtime:
            # A target set on a key still to compute (amm_rules.persist) that never
            # reached memory.
            self.runtime.pop(key, None)
        if start == "processing" and self.trim_waits:
            self._dependent_done(key)
        if self.demand.enabled:
            self.demand.transition(key, start, finish, kwargs.get("worker"))

    def _dependent_done(self, key: Hashable) -> None:
        """A task left processing while some governed keys' drops wait: if it read one,
        wake the policy (once per key and wait)."""
        ts = self.tasks.get(key)
        waits = self.trim_waits
        for dep in ts.dependencies if ts is not None else ():
            if dep.key in waits:
                waits.discard(dep.key)
                self.wake("dependent-finished")

    def add_worker(self, scheduler: Any = None, worker: str = "") -> None:
        self.workers_changed = True
        self.wake("worker-joined")

    def remove_worker(self, scheduler: Any = None, worker: str = "", **kwargs: Any) -> None:
        # Copies asked of the worker never land; every governed key is checked at the
        # next cycle.
        self.ledger.worker_left(worker)
        retiring = worker in self.retiring
        self.retiring.discard(worker)
        if self.costs is not None:
            self.costs.worker_left(worker)  # its copies were removed before this hook
        self.workers_changed = True
        self.wake("worker-left")
        if self.active:
            self.departing.left(worker, retiring)

    def log_event(self, topic: Any, msg: Any) -> None:
        # A worker's status changed; the scheduler logs it as an event, there is no
        # other hook. A retiring worker's copies stop counting (they must be replaced
        # before it leaves); a resumed one may take copies again. A pause changes
        # nothing to repair: the paused worker keeps its copies.
        if type(msg) is dict and msg.get("action") == "worker-status-change":
            status = msg.get("status")
            if status == "closing_gracefully":
                self.retiring.add(topic)
                self.wake("worker-retiring")
            elif msg.get("prev-status") == "closing_gracefully":
                self.retiring.discard(topic)  # the retirement failed: it runs again
            elif status == "running" and msg.get("prev-status") == "paused":
                self.wake("worker-resumed")

    # -- bookkeeping -----------------------------------------------------------------

    def forget(self, key: Hashable) -> None:
        """The key left memory: drop everything known about it."""
        # Runs for every key leaving memory, and most of these tables are empty most of
        # the time (most keys are not governed): a look at a table costs less than a call.
        if key in self.desired:
            self.unindex(key)
        if self.dirty:
            self.dirty.pop(key, None)
        if self._backlog.table:
            self.unqueue(key)
        if self.touched:
            self.touched.discard(key)
        if self.recheck:
            self.recheck.discard(key)
        if self.replicated_free:
            self.replicated_free.pop(key, None)
        if self.runtime:
            self.runtime.pop(key, None)
        ledger = self.ledger
        if ledger.copies or ledger.backoffs:
            ledger.forget(key)
        departing = self.departing
        if departing.source_lost:
            departing.source_lost.discard(key)
        if departing.fetching:
            departing.fetching.pop(key, None)
        if self.shortfall:
            self.shortfall.pop(key, None)
        self.demand.forget(key)

    def unqueue(self, key: Hashable) -> None:
        """Take a key out of the backlog (it left memory, or was classified on its own):
        marked, so that the backlog's place stays valid."""
        backlog = self._backlog
        if backlog.table.get(key, _LEFT) is not _LEFT:
            backlog.table[key] = _LEFT
            backlog.marked += 1

    def queue(self, keys: Iterable[Hashable]) -> None:
        """Classify these keys, none of them indexed, at the next cycle (scattered data,
        keys the audit found unfiled); keys not in the scheduler's tasks are passed over."""
        keys = list(keys)
        if self._backlog.table:
            for key in keys:
                self.unqueue(key)
        get = self.tasks.get
        self.dirty.update((key, ts) for key in keys if (ts := get(key)) is not None)

    @property
    def backlog(self) -> Mapping[Hashable, Any]:
        """The backlog's table (see :meth:`classify`): every key in it entered memory
        and is classified already or waits (keys that left memory meanwhile map to a
        marker). A key not in it nor in :attr:`dirty` is classified."""
        return self._backlog.table

    @property
    def unclassified(self) -> int:
        """Keys waiting to be classified: in :attr:`dirty` or not yet reached in the
        backlog (keys of the backlog that left memory meanwhile count until reached)."""
        return len(self.dirty) + len(self._backlog.table) - self._backlog.taken

    def unclassified_keys(self) -> list[Hashable]:
        """The keys waiting to be classified, in the order they will be (a walk over
        the backlog and a list of it: for looking at the engine, not for a cycle; see
        :meth:`waiting` for one key)."""
        waiting = [
            k
            for k, ts in islice(self._backlog.table.items(), self._backlog.taken, None)
            if ts is not _LEFT
        ]
        waiting.extend(self.dirty)
        return waiting

    def may_be_unclassified(self, key: Hashable) -> bool:
        """True if the key waits to be classified, or is in the backlog (classified
        already, perhaps: a table lookup cannot tell where the backlog's place is). Keys
        governed already are in the backlog only once classified (it holds keys that
        entered memory): for them, only :attr:`dirty` answers."""
        return key in self.dirty or self._backlog.table.get(key, _LEFT) is not _LEFT

    def waiting(self, key: Hashable) -> bool:
        """True if the key waits to be classified, exactly (for explain: a key of the
        backlog that is not governed costs a walk over what is left of the backlog)."""
        if key in self.dirty:
            return True
        if self._backlog.table.get(key, _LEFT) is _LEFT or key in self.desired:
            return False  # a key of the backlog is governed only once classified
        return key in islice(self._backlog.table, self._backlog.taken, None)

    def reclassify(self, keys: Iterable[Hashable]) -> None:
        """Classify these keys again at the next cycle (they may be governed already:
        a reload, a runtime target, copies that a match counts). Keys entering memory
        go into :attr:`dirty` directly: they are never indexed, which spares the check."""
        self.dirty.update(zip(keys, repeat(None)))
        self._reclassifying = True

    def classify(
        self,
        classifier: Classifier,
        tasks: Mapping[Hashable, Any],
        limit: int,
        deadline: float | None = None,
        check: Callable[[PlanClass, list[Any]], Iterable[Any]] | None = None,
    ) -> tuple[dict[PlanClass, list[Any]], int]:
        """Classify up to ``limit`` waiting keys (until ``deadline``, a
        ``time.perf_counter()`` value, if given): the backlog's first, then
        :attr:`dirty`'s. File the governed ones and unindex those no longer governed,
        which join :attr:`touched` so that reduce-replicas finds them if they hold
        several copies. Returns the tasks filed, by plan class (see :meth:`file`), and
        the number of keys taken. With ``check`` (``check(cls, tasks)``, the suspects
        of some tasks of a class: :meth:`suspects`), only the tasks it returns, checked
        as each chunk is filed, while the processor's caches still hold them (checking
        them at the end of the loop cost twice as much).

        Keys are taken oldest first, in the order they arrived: keys that arrived
        together, and whose tasks were made together, are read together, which the
        processor's caches reward (three times faster than a set's hash order at 100k
        keys). They are taken a chunk at a time, as far as the budget goes: nothing else
        changes the tables meanwhile (the hooks do not run during a cycle). When the
        budget stops the loop in :attr:`dirty`, what is left of it becomes the backlog
        as it is, with the loop's place in it, and a new ``dirty`` takes the keys that
        arrive next; keys to classify again (indexed already: a reload, a runtime
        target) are taken out one by one instead, so that the backlog holds keys that
        entered memory only (never indexed before their turn)."""
        filed: dict[PlanClass, list[Any]] = {}
        done = 0
        stopped = False
        if self._backlog.table:
            done, stopped = self._classify_from(
                classifier, tasks, limit, deadline, filed, {}, check, self._backlog
            )
            if self._backlog.taken >= len(self._backlog.table):
                self._backlog = _Backlog()  # through: released
        if not stopped and done < limit and self.dirty:
            dirty = self.dirty
            keyed = self._reclassifying
            indexed = self.desired if keyed else {}
            place = _Backlog(dirty)
            taken, _ = self._classify_from(
                classifier, tasks, limit - done, deadline, filed, indexed, check, place, keyed
            )
            done += taken
            if taken == len(dirty):
                dirty.clear()
                self._reclassifying = False
            elif keyed:
                # (Listed first: keys cannot be taken out of a dict being iterated.)
                deque(map(dirty.pop, list(islice(dirty, taken))), maxlen=0)
            else:
                # Left over: the rest of dirty becomes the backlog, the place kept.
                self._backlog, self.dirty = place, {}
        return filed, done

    def _classify_from(
        self,
        classifier: Classifier,
        tasks: Mapping[Hashable, Any],
        limit: int,
        deadline: float | None,
        filed: dict[PlanClass, list[Any]],
        indexed: Mapping[Hashable, Any],
        check: Callable[[PlanClass, list[Any]], Iterable[Any]] | None,
        place: _Backlog,
        keyed: bool = False,
    ) -> tuple[int, bool]:
        """Classify and file keys from ``place`` (the backlog, or a new place in
        :attr:`dirty`) on: returns the keys taken (marked ones not counted) and
        whether the deadline stopped the loop. ``keyed``: the keys are read from the
        table (they may map to None: keys to classify again)."""
        # Keys that entered memory (never indexed) are read through their tasks only:
        # most of them need not be touched at all (see Classifier.classify).
        keys_left = place.keys if keyed else None
        tasks_left = place.tasks
        done = 0
        stopped = False
        chunk: list[Hashable] | None = None
        while done < limit:
            # In chunks, so that the clock is read once per chunk, not once per key.
            # Keys and tasks in two lists: a list of pairs would allocate a tuple per
            # key, and with it the cyclic garbage collector's attention.
            chunk_tasks = list(islice(tasks_left, min(CLASSIFY_CHUNK, limit - done)))
            if not chunk_tasks:
                break
            taken = len(chunk_tasks)
            if keys_left is not None:
                chunk = list(islice(keys_left, taken))
            place.taken += taken
            if place.marked:
                # Keys that left memory meanwhile: passed over, and not counted.
                chunk_tasks = [ts for ts in chunk_tasks if ts is not _LEFT]
            done += len(chunk_tasks)
            batches, dropped = classifier.classify(
                chunk, chunk_tasks, tasks, self.runtime, indexed
            )
            for key in dropped:
                self.unindex(key)
            self.touched.update(dropped)
            # Filed (and checked) with each chunk, while the processor's caches hold its
            # tasks: gathering 16,384 governed keys over chunks first cost a third more
            # at a million keys.
            if batches:
                self._file_chunk(batches, filed, not indexed, check)
            if deadline is not None and time.perf_counter() >= deadline:
                stopped = True
                break
        self.loop_ended = time.perf_counter()
        return done, stopped

    def _file_chunk(
        self,
        batches: list[Batch],
        filed: dict[PlanClass, list[Any]],
        fresh: bool,
        check: Callable[[PlanClass, list[Any]], Iterable[Any]] | None,
    ) -> None:
        """File the batches of one chunk (see :meth:`classify`) into ``filed``."""
        for cls, members in self.file(batches, fresh=fresh).items():
            if check is not None:
                members = list(check(cls, members))
                if not members:
                    continue
            filed.setdefault(cls, []).extend(members)

    # -- the governed keys (see GovernedKeys) ------------------------------------------

    def put(self, key: Hashable, ts: Any, desired: Desired) -> None:
        """Index a governed key (or move it to its new group)."""
        self.governed.put(key, ts, desired)

    def file(self, batches: Iterable[Batch], fresh: bool = False) -> dict[PlanClass, list[Any]]:
        """Index classified keys (see :meth:`GovernedKeys.file`)."""
        return self.governed.file(batches, fresh)

    def unindex(self, key: Hashable) -> None:
        """The key is no longer governed (or is being re-filed)."""
        self.governed.unindex(key)

    def _forget_plan(self, key: Hashable) -> None:
        """What was planned for a key that is no longer governed."""
        self.shortfall.pop(key, None)
        self.trim_waits.discard(key)

    def copies_changed(self, key: Hashable, n: int) -> None:
        """A governed key gained (``n > 0``) or lost copies (:func:`watch_scheduler`)."""
        self.governed.copies_changed(key, n)

    def suspects(
        self,
        cls: PlanClass,
        placement: Placement,
        reduce_replicas: bool,
        members: Iterable[Any] | None = None,
    ) -> Iterator[Any]:
        """See :meth:`GovernedKeys.suspects`."""
        return self.governed.suspects(cls, placement, reduce_replicas, members)

    def suspects_among(
        self,
        keys: Iterable[Hashable],
        placement_of: Callable[[PlanClass], Placement],
        reduce_replicas: bool,
    ) -> Iterator[Any]:
        """See :meth:`GovernedKeys.suspects_among`."""
        return self.governed.suspects_among(keys, placement_of, reduce_replicas)

    def __len__(self) -> int:
        return len(self.desired)

    def __contains__(self, key: Hashable) -> bool:
        return key in self.desired


def watch_scheduler(scheduler: Any, index: KeyIndex) -> Callable[[], None]:
    """Wrap the scheduler's ``add_replica``, ``remove_replica``, ``remove_all_replicas``
    and ``update_data`` so the index learns which keys' copies changed (and how many
    copies governed keys hold) and which keys entered memory without a transition
    (scattered data). Returns the function that undoes it.

    Every change of ``ts.who_has`` in the scheduler goes through ``add_replica`` /
    ``remove_replica``, or ``remove_all_replicas`` when a key leaves memory (before the
    transition hook sees it leave). The wrappers are per scheduler instance, chain if two
    policies attach, and add a set insertion and, for a governed key, a count per rule
    to a replica change at most.
    """
    add_replica = scheduler.add_replica
    remove_replica = scheduler.remove_replica
    remove_all_replicas = scheduler.remove_all_replicas
    desired = index.desired  # never rebound; index.touched is, so read it each time
    ledger = index.ledger
    in_flight = ledger.copies  # never rebound

    def add_replica_watched(ts: Any, ws: Any) -> None:
        before = len(ts.who_has or ())  # adding a copy a worker already holds is a no-op
        add_replica(ts, ws)
        if not index.active:
            return
        held = len(ts.who_has)
        if held <= 2 and held > before and (costs := index.costs) is not None:
            costs.copy_added(ts, ws, held)  # a key's only copy, or no longer its only one
        asked = ledger.landed(ts.key, ws.address) if in_flight and ts.key in in_flight else None
        if held > before and (wanted := desired.get(ts.key)) is not None:
            index.copies_changed(ts.key, 1)
            # The engine's own copy landed above the target's max: the first half of a
            # move, whose second half (the drop) an early cycle makes. Copies fetched
            # by dependents are trimmed by the periodic cycles: a computation that
            # reads the key again would fetch it again (see docs/performance.md).
            target = wanted.replicate
            if (
                asked is not None
                and target is not None
                and type(target.max) is int
                and held > target.max
            ):
                index.wake("copy-landed")
        if held > 1:  # the first copy is a key entering memory: see dirty
            index.touched.add(ts.key)
            moving = index.moving
            move = moving.get(ts.key) if moving else None
            if move is not None and move.recipient == ws.address:
                index.wake("move-landed")

    def remove_replica_watched(ts: Any, ws: Any) -> None:
        remove_replica(ts, ws)
        if not index.active:
            return
        if (costs := index.costs) is not None and (left := len(ts.who_has or ())) <= 1:
            costs.copy_removed(ts, ws, left)
        wanted = desired.get(ts.key)
        # remove_worker marks the worker closed before it removes its copies; a drop
        # leaves it running.
        closed = getattr(ws.status, "name", ws.status) == "closed"
        if closed:
            index.departing.lost_copy(ws.address, ts, wanted)
        if wanted is not None:
            index.copies_changed(ts.key, -1)
            index.touched.add(ts.key)
            if closed:
                index.departing.source_lost.add(ts.key)
            target = wanted.replicate
            # Under ``all`` (a copy on every eligible worker) any copy lost is missed.
            if target is not None and (target.min == ALL or len(ts.who_has or ()) < target.min):
                index.wake("copy-lost")

    def remove_all_replicas_watched(ts: Any) -> None:
        # A key leaving memory: its copies go here, before the transition hook forgets it.
        if index.active and ts.who_has:
            if ts.key in desired:
                index.copies_changed(ts.key, -len(ts.who_has))
            if len(ts.who_has) == 1 and (costs := index.costs) is not None:
                costs.all_removed(ts)
        remove_all_replicas(ts)

    wrappers = {
        "add_replica": add_replica_watched,
        "remove_replica": remove_replica_watched,
        "remove_all_replicas": remove_all_replicas_watched,
        "update_data": _watch_update_data(scheduler, index),
    }
    return wrap_methods(scheduler, wrappers, {"update_data": "update_data"})


def _watch_update_data(scheduler: Any, index: KeyIndex) -> Callable[..., Any]:
    """The wrapper of ``update_data`` (see :func:`watch_scheduler`): scattered keys are
    un-filed, then queued to be classified."""
    update_data = scheduler.update_data
    desired = index.desired

    def update_data_watched(*args: Any, **kwargs: Any) -> Any:
        who_has = kwargs.get("who_has")
        on_scatter = index.on_scatter if index.active and who_has else None
        before: set[Hashable] = set()
        if on_scatter is not None:
            tasks = scheduler.tasks
            before = {
                k for k in who_has if (ts := tasks.get(k)) is not None and ts.state == "memory"
            }
        if index.active and who_has:
            # Scattered again, maybe with a new size: un-filed now (with the size it was
            # filed with), filed again when classified.
            for key in who_has:
                if key in desired:
                    index.unindex(key)
        result = update_data(*args, **kwargs)
        if index.active and who_has:
            index.queue(who_has)  # un-filed above: not indexed
            if on_scatter is not None:
                on_scatter(who_has, before)
        return result

    return update_data_watched


#: Marks a key of the backlog that left memory (or was classified on its own).
_LEFT: Any = object()


class _Backlog:
    """Keys that entered memory and a cycle's budget left over, with the place the
    classification reached in them (see :meth:`KeyIndex.classify`): the table of keys
    to classify of the cycle that stopped (key -> task), kept whole. Taking classified
    keys out of a table of a million one at a time cost as much as classifying them;
    a key that leaves memory meanwhile is marked (:data:`_LEFT`) rather than taken
    out, so that the table never changes size and the place (its iterators) stays
    valid."""

    __slots__ = ("table", "keys", "tasks", "taken", "marked")

    def __init__(self, table: dict[Hashable, Any] | None = None) -> None:
        self.table: dict[Hashable, Any] = {} if table is None else table
        self.keys: Iterator[Hashable] = iter(self.table)
        self.tasks: Iterator[Any] = iter(self.table.values())
        #: Entries passed so far, and entries marked.
        self.taken = 0
        self.marked = 0


def _no_wake(reason: str) -> None:
    return None
