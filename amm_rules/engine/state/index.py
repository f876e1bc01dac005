"""The governed-key index: which keys in memory amm-rules governs, grouped by what they
want, and which of them changed since the last cycle, so that a cycle never scans
``scheduler.tasks`` and, in the steady state, looks only at keys that changed.

:class:`KeyIndex` is fed by deliberately tiny hooks (they run on the scheduler's hot
paths):

- the ``SchedulerPlugin.transition`` hook: a key entering memory is queued to be
  classified at the next cycle (:attr:`~KeyIndex.dirty`; what a cycle's budget leaves
  over waits in the backlog, :mod:`amm_rules.engine.state.backlog`); a key leaving
  memory is forgotten at once, with its runtime target and in-flight copies;
- wrappers of the scheduler's ``add_replica`` / ``remove_replica`` /
  ``remove_all_replicas`` (:func:`watch_scheduler`): a governed key that gained or lost
  a copy, or any key that now has more than one, is touched
  (:attr:`~KeyIndex.touched`), and the copies of governed keys are counted per rule
  (:attr:`GovernedKeys.copies_by <amm_rules.engine.state.governed.GovernedKeys.copies_by>`);
  a copy the engine asked for that landed is done in the ledger.
  The AMM gets no notification of replica changes (dependency transfers,
  ``client.replicate``, drops, dead workers all change ``ts.who_has`` silently), so
  this is how a cycle learns which keys to look at;
- a wrapper of ``update_data``: scattered data enters memory without a transition;
- ``add_worker`` / ``remove_worker``: pools and placements are recomputed and every
  governed key is checked once (so a target of ``all`` reaches a worker that joined
  within one cycle);
- ``log_event``: a worker's status changed (retiring, closing, resumed after a pause):
  the workers on their way out by their status (:attr:`~KeyIndex.closing`) are known
  without a scan of the workers;
- the same hooks feed, so that they need no hooks of their own, the
  :class:`~amm_rules.engine.state.demand.DemandTracker` (when the rules read demand),
  the :class:`~amm_rules.engine.state.flow.MemoryFlow`
  (:meth:`~KeyIndex.follow_flow`), the
  :class:`~amm_rules.engine.state.departures.Departures` (:attr:`KeyIndex.departing`)
  and the :class:`~amm_rules.engine.state.costs.RecomputeCosts`
  (:meth:`~KeyIndex.follow_costs`): each module says what it takes from them.

Workers leaving, joining, retiring or resuming, governed keys falling below their
target, the engine's own copies landing above a target's ``max`` (a move), tasks
finishing that held up the drop of a misplaced copy, and keys entering memory on a
retiring worker also wake the policy (the ``wake`` given to :meth:`KeyIndex.attach`),
which may ask the AMM for an early cycle (:mod:`amm_rules.engine.early`).

Governed keys live in :class:`~amm_rules.engine.state.governed.GovernedKeys`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Mapping, Set
from itertools import islice, repeat
from typing import TYPE_CHECKING, Any

from distributed.diagnostics.plugin import SchedulerPlugin

from amm_rules.engine.readonly import ReadOnly
from amm_rules.engine.state.backlog import Backlog
from amm_rules.engine.state.demand import DemandTracker
from amm_rules.engine.state.departures import Departures
from amm_rules.engine.state.governed import GovernedKeys, PlanClass
from amm_rules.engine.state.ledger import Ledger
from amm_rules.engine.wrapping import wrap_methods
from amm_rules.language.ruleset import ALL, Desired, RuntimeTarget

if TYPE_CHECKING:
    from amm_rules.engine.decide.classify import Classifier
    from amm_rules.engine.state.costs import RecomputeCosts
    from amm_rules.engine.state.flow import MemoryFlow

#: The statuses of a worker that stays (any other: it is on its way out), and of one
#: the scheduler retires.
_STAYING = frozenset({"running", "paused"})
RETIRING = "closing_gracefully"


class KeyIndex(SchedulerPlugin):
    """Governed keys in memory, by plan class; plus per-key engine state.

    Nothing of it is a public attribute to write: the hooks and the methods below write
    its tables, and everyone else reads them through read-only views (typed
    ``Mapping`` and ``Set``: mypy refuses a write), so that what a key's state is can be
    read in one place. (The engine's state is kept in few attributes: past 30, CPython
    stops sharing the instances' attribute tables, and every attribute read in the hooks
    gets slower.)"""

    idempotent = False

    def __init__(self, ledger: Ledger | None = None) -> None:
        self._dirty: dict[Hashable, Any] = {}
        self._backlog = Backlog()
        # Set when keys that may be indexed already joined _dirty (see reclassify).
        self._reclassifying = False
        self._loop_ended = 0.0
        self._tasks: Mapping[Hashable, Any] = {}
        self._runtime: dict[Hashable, RuntimeTarget] = {}
        self._ledger = Ledger() if ledger is None else ledger
        self._shortfall: dict[Hashable, tuple[str, str]] = {}
        self._workers_changed = True
        self._active = True
        self._wake: Callable[[str], None] = lambda reason: None
        self._touched: set[Hashable] = set()
        self._recheck: set[Hashable] = set()
        self._free: dict[Hashable, Any] = {}
        self._departing = Departures()
        self._demand = DemandTracker()
        self._flow: MemoryFlow | None = None
        self._costs: RecomputeCosts | None = None
        self._costs_kept: RecomputeCosts | None = None
        self._memory_changed = False
        self._closing: dict[str, str] = {}
        self._trim_waits: set[Hashable] = set()
        self._governed = GovernedKeys(self._free, self._forget_plan)
        self._desired = self._governed.desired  # never rebound: read by the hooks

    # -- wiring (the policy and the sections at attach) ----------------------------------

    def attach(
        self,
        tasks: Mapping[Hashable, Any],
        workers: Mapping[str, Any] | None = None,
        wake: Callable[[str], None] | None = None,
        queue_in_memory: bool = False,
    ) -> None:
        """Read the scheduler's ``tasks`` (and the statuses of its ``workers``, for
        :attr:`closing`); ``wake(reason)`` asks for an early cycle. With
        ``queue_in_memory``, every key in memory is queued to be classified: the one
        scan of ``tasks`` attaching costs."""
        self._tasks = tasks
        self._demand.tasks = tasks
        self._closing = {
            a: status
            for a, ws in (workers or {}).items()
            if (status := str(getattr(ws.status, "name", ws.status))) not in _STAYING
        }
        if wake is not None:
            self._wake = wake
        if queue_in_memory:
            self._dirty.update((k, ts) for k, ts in tasks.items() if ts.state == "memory")
        self._workers_changed = True

    def activate(self, active: bool = True) -> None:
        """Listen to the scheduler's hooks (False once the policy is detached: the
        scheduler wrappers then only pass through)."""
        self._active = active

    def follow_flow(self, flow: MemoryFlow | None) -> None:
        """Feed ``flow`` (keys entering and leaving memory, scattered keys); None: none."""
        self._flow = flow

    def follow_costs(self, costs: RecomputeCosts | None, keep_keys: bool = False) -> None:
        """Feed ``costs`` (sole copies, from the replica wrappers), and with
        ``keep_keys`` the keys entering and leaving memory (the transition hook), while
        it keeps them per group; None: none."""
        self._costs = costs
        self._costs_kept = costs if keep_keys else None

    # -- what it keeps, read-only (written by the hooks and the methods below) ----------

    #: The scheduler's tasks once attached.
    tasks = ReadOnly[Mapping[Hashable, Any]]("_tasks")
    #: What the engine asked and has not seen land (the context's ledger): the replica
    #: wrappers note landings, the hooks keys and workers that left.
    ledger = ReadOnly[Ledger]("_ledger")
    #: Reads and waiters of keys (followed only when the rules read demand).
    demand = ReadOnly[DemandTracker]("_demand")
    #: What the workers leaving take with them (:mod:`~amm_rules.engine.state.departures`).
    departing = ReadOnly[Departures]("_departing")
    #: The governed keys by plan class, and what they count towards each rule.
    governed = ReadOnly[GovernedKeys]("_governed")
    #: Governed key -> its resolved wishes.
    desired = ReadOnly[Mapping[Hashable, Desired]]("_desired")
    #: Runtime targets, with their origin: the ``amm_rules_set_target`` handler,
    #: ``amm_rules.persist``, distributed's ``replicate`` and ``scatter(broadcast=...)``.
    runtime = ReadOnly[Mapping[Hashable, RuntimeTarget]]("_runtime")
    #: Keys to classify at the next cycle, in the order they arrived: key -> its task,
    #: or None (keys to classify again); what a cycle's budget left over is the backlog.
    dirty = ReadOnly[Mapping[Hashable, Any]]("_dirty")
    #: The backlog's table: every key in it entered memory and is classified already or
    #: waits (those that left memory meanwhile map to a marker). A key in neither it
    #: nor :attr:`dirty` is classified (see :meth:`classify`).
    backlog = ReadOnly[Mapping[Hashable, Any]]("_backlog.table")
    #: Keys whose copies changed since the last cycle (:func:`watch_scheduler`).
    touched = ReadOnly[Set[Hashable]]("_touched")
    #: Keys nobody governs that hold more than one copy: what reduce-replicas walks (the
    #: scheduler's ``replicated_tasks`` minus governed keys, kept from :attr:`touched`).
    replicated_free = ReadOnly[Mapping[Hashable, Any]]("_free")
    #: Governed keys that the last plan left short of their target or placement: key ->
    #: (reason, sentence) (:mod:`~amm_rules.engine.state.journal`). Keys of a class the
    #: workers cannot satisfy at all are counted by class, not here.
    shortfall = ReadOnly[Mapping[Hashable, tuple[str, str]]]("_shortfall")
    #: Governed keys whose drop of a misplaced copy waited at their last plan (a
    #: dependent running there): a task that read one finishing wakes the policy.
    trim_waits = ReadOnly[Set[Hashable]]("_trim_waits")
    #: The memory flow the transition hook feeds (:meth:`follow_flow`), if any.
    flow = ReadOnly["MemoryFlow | None"]("_flow")
    #: The recompute costs the replica wrappers feed (:meth:`follow_costs`), if any.
    costs = ReadOnly["RecomputeCosts | None"]("_costs")
    #: Whether the hooks listen (see :meth:`activate`).
    active = ReadOnly[bool]("_active")
    #: A worker joined or left since the policy last recomputed pools.
    workers_changed = ReadOnly[bool]("_workers_changed")
    #: When the last classification stopped taking chunks (``time.perf_counter()``):
    #: what follows (filing, the rest of the cycle) is what its keys cost after it.
    loop_ended = ReadOnly[float]("_loop_ended")

    @property
    def closing(self) -> Set[str]:
        """Workers whose status says they are on their way out (retiring, closing),
        kept from their status changes: no scan of the workers."""
        return self._closing.keys()

    def __len__(self) -> int:
        return len(self._desired)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._desired

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
            ts = self._dirty[key] = self._tasks.get(key)
            # The memory flow counts here rather than as a plugin of its own: a second
            # plugin call on every transition cost about as much as its counting.
            flow = self._flow
            if flow is not None and ts is not None:
                flow.entered(key, ts, start, stimulus_id)
            # The recompute estimates read the scheduler's own figures per task group
            # when next refreshed; only while keys are kept per group is each counted.
            self._memory_changed = True
            kept = self._costs_kept
            if kept is not None and ts is not None:
                if start == "processing":
                    kept.finished(ts)
                else:
                    kept.entered(ts)
            if self._closing and self._closing.get(kwargs.get("worker", "")) == RETIRING:
                # A task that was running there when its retirement started finished:
                # the retirement waits until a cycle has planned where its key goes.
                self._wake("key-on-retiring-worker")
        elif start == "memory":
            self.forget(key)
            self._memory_changed = True  # the estimates of its dependents move
            flow, kept = self._flow, self._costs_kept
            if (flow is not None or kept is not None) and (ts := self._tasks.get(key)) is not None:
                if flow is not None:
                    flow.left(key, ts, stimulus_id)
                if kept is not None:
                    kept.left(ts)
        elif finish == "forgotten" and self._runtime:
            # A target set on a key still to compute (amm_rules.persist) that never
            # reached memory.
            self._runtime.pop(key, None)
        if start == "processing" and self._trim_waits:
            self._dependent_done(key)
        if self._demand.enabled:
            self._demand.transition(key, start, finish, kwargs.get("worker"))

    def _dependent_done(self, key: Hashable) -> None:
        """A task left processing while some governed keys' drops wait: if it read one,
        wake the policy (once per key and wait)."""
        ts = self._tasks.get(key)
        waits = self._trim_waits
        for dep in ts.dependencies if ts is not None else ():
            if dep.key in waits:
                waits.discard(dep.key)
                self._wake("dependent-finished")

    def add_worker(self, scheduler: Any = None, worker: str = "") -> None:
        self._workers_changed = True
        self._wake("worker-joined")

    def remove_worker(self, scheduler: Any = None, worker: str = "", **kwargs: Any) -> None:
        # Copies asked of the worker never land; every governed key is checked at the
        # next cycle.
        self._ledger.worker_left(worker)
        retiring = self._closing.pop(worker, None) == RETIRING
        if self._costs is not None:
            self._costs.worker_left(worker)  # its copies were removed before this hook
        self._workers_changed = True
        self._wake("worker-left")
        if self._active:
            self._departing.left(worker, retiring)

    def log_event(self, topic: Any, msg: Any) -> None:
        # A worker's status changed; the scheduler logs it as an event, there is no
        # other hook. A retiring worker's copies stop counting (they must be replaced
        # before it leaves); a resumed one may take copies again. A pause changes
        # nothing to repair: the paused worker keeps its copies.
        if type(msg) is dict and msg.get("action") == "worker-status-change":
            status = msg.get("status")
            if status not in _STAYING:
                self._closing[topic] = str(status)
                if status == RETIRING:
                    self._wake("worker-retiring")
            else:
                self._closing.pop(topic, None)  # a retirement that failed runs again
                if status == "running" and msg.get("prev-status") == "paused":
                    self._wake("worker-resumed")

    # -- bookkeeping -----------------------------------------------------------------

    def forget(self, key: Hashable) -> None:
        """The key left memory: drop everything known about it."""
        # Runs for every key leaving memory, and most of these tables are empty most of
        # the time (most keys are not governed): a look at a table costs less than a call.
        if key in self._desired:
            self._governed.unindex(key)
        if self._dirty:
            self._dirty.pop(key, None)
        if self._backlog.table:
            self._backlog.mark(key)
        if self._touched:
            self._touched.discard(key)
        if self._recheck:
            self._recheck.discard(key)
        if self._free:
            self._free.pop(key, None)
        if self._runtime:
            self._runtime.pop(key, None)
        ledger = self._ledger
        if ledger.copies or ledger.backoffs:
            ledger.forget(key)
        departing = self._departing
        if departing.source_lost or departing.fetching:
            departing.forget(key)
        if self._shortfall:
            self._shortfall.pop(key, None)
        self._demand.forget(key)

    def note_workers_changed(self) -> None:
        """Pools are recomputed, and every governed key checked, at the next cycle."""
        self._workers_changed = True

    def take_workers_changed(self) -> bool:
        """Whether workers changed since the last call (the policy's cycle asks)."""
        changed, self._workers_changed = self._workers_changed, False
        return changed

    def take_memory_changed(self) -> bool:
        """Whether a key entered or left memory since the last call (for the costs)."""
        changed, self._memory_changed = self._memory_changed, False
        return changed

    def set_runtime_target(self, key: Hashable, target: RuntimeTarget | None) -> None:
        """Set (None: remove) the runtime target of a key in memory or still to
        compute; the key is classified again at the next cycle. Forgotten when the key
        leaves memory or, never computed, is forgotten."""
        if target is None:
            self._runtime.pop(key, None)
        else:
            self._runtime[key] = target
        self.reclassify((key,))

    # -- keys to look at ----------------------------------------------------------------

    def touch(self, keys: Iterable[Hashable]) -> None:
        """Route these keys at the next cycle as if their copies changed."""
        self._touched.update(keys)

    def route_touched(self) -> None:
        """Route the keys whose copies changed: governed ones are checked this cycle,
        the others join reduce-replicas' walk if they hold several copies."""
        touched, self._touched = self._touched, set()
        tasks, desired, free = self._tasks, self._desired, self._free
        for key in touched:
            if key in desired:
                self._recheck.add(key)
                free.pop(key, None)
                continue
            ts = tasks.get(key)
            if ts is not None and ts.state == "memory" and len(ts.who_has or ()) > 1:
                free[key] = ts

    def look_again(self, keys: Iterable[Hashable]) -> None:
        """Check these governed keys at the next cycle (an action refused or deferred,
        copies held for waiters, a worker backed off, a claim let go)."""
        self._recheck.update(keys)

    def take_recheck(self) -> set[Hashable]:
        """The governed keys to look at again, taken (see :meth:`look_again`)."""
        recheck, self._recheck = self._recheck, set()
        return recheck

    def requeue(self, key: Hashable) -> None:
        """Classify a key again at the next cycle, out of reduce-replicas' walk until
        then, and route it once classified (the audit: a key whose filing was wrong)."""
        self._free.pop(key, None)
        self.queue((key,))
        self._touched.add(key)

    def drop_free(self, keys: Iterable[Hashable]) -> None:
        """Take keys out of reduce-replicas' walk (touched again when their copies or
        a claim on them change)."""
        for key in keys:
            self._free.pop(key, None)

    def note_plan(self, key: Hashable, short: tuple[str, str] | None, trim_waits: bool) -> None:
        """What a governed key's plan left: short of its target or placement (``short``:
        (reason, sentence), None: not), and whether the drop of a misplaced copy waits
        (a dependent finishing then wakes the policy)."""
        if short is None:
            self._shortfall.pop(key, None)
        else:
            self._shortfall[key] = short
        if trim_waits:
            self._trim_waits.add(key)
        else:
            self._trim_waits.discard(key)

    def clear_shortfall(self, keys: Iterable[Hashable]) -> None:
        """These keys hold their target now (checked and not to be planned)."""
        for key in list(keys):
            self._shortfall.pop(key, None)

    def _forget_plan(self, key: Hashable) -> None:
        """What was planned for a key that is no longer governed."""
        self._shortfall.pop(key, None)
        self._trim_waits.discard(key)

    # -- keys to classify -----------------------------------------------------------------

    def queue(self, keys: Iterable[Hashable]) -> None:
        """Classify these keys, none of them indexed, at the next cycle (scattered data,
        keys the audit found unfiled); keys not in the scheduler's tasks are passed over."""
        keys = list(keys)
        if self._backlog.table:
            for key in keys:
                self._backlog.mark(key)
        get = self._tasks.get
        self._dirty.update((key, ts) for key in keys if (ts := get(key)) is not None)

    def reclassify(self, keys: Iterable[Hashable]) -> None:
        """Classify these keys again at the next cycle (they may be governed already:
        a reload, a runtime target, copies that a match counts). Keys entering memory
        go into :attr:`dirty` directly: they are never indexed, which spares the check."""
        self._dirty.update(zip(keys, repeat(None)))
        self._reclassifying = True

    def unqueue(self, key: Hashable) -> None:
        """Take a key out of the keys to classify (it was classified on its own)."""
        self._dirty.pop(key, None)
        self._backlog.mark(key)

    @property
    def unclassified(self) -> int:
        """Keys waiting to be classified: in :attr:`dirty` or not yet reached in the
        backlog (keys of the backlog that left memory meanwhile count until reached)."""
        return len(self._dirty) + len(self._backlog)

    def unclassified_keys(self) -> list[Hashable]:
        """The keys waiting to be classified, in the order they will be (a walk over
        the backlog and a list of it: for looking at the engine, not for a cycle; see
        :meth:`waiting` for one key)."""
        return [*self._backlog.waiting_keys(), *self._dirty]

    def may_be_unclassified(self, key: Hashable) -> bool:
        """True if the key waits to be classified, or is in the backlog (classified
        already, perhaps: a table lookup cannot tell where the backlog's place is). Keys
        governed already are in the backlog only once classified (it holds keys that
        entered memory): for them, only :attr:`dirty` answers."""
        return key in self._dirty or self._backlog.holds(key)

    def waiting(self, key: Hashable) -> bool:
        """True if the key waits to be classified, exactly (for explain: a key of the
        backlog that is not governed costs a walk over what is left of the backlog)."""
        if key in self._dirty:
            return True
        return key not in self._desired and self._backlog.waits(key)

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

        Keys are taken oldest first, a chunk at a time as far as the budget goes
        (:mod:`~amm_rules.engine.state.backlog`): keys that arrived together, and whose
        tasks were made together, are read together, which the processor's caches reward
        (three times faster than a set's hash order at 100k keys); the hooks do not run
        during a cycle. Keys to classify again (indexed already: a reload, a runtime
        target) that the budget leaves over are taken out of :attr:`dirty` one by one
        rather than becoming the backlog, which holds keys that entered memory only."""
        filed: dict[PlanClass, list[Any]] = {}
        done = 0
        stopped = False
        if self._backlog.table:
            chunk = self._chunk_classifier(classifier, tasks, filed, {}, check)
            done, stopped = self._backlog.take(chunk, limit, deadline)
            self._loop_ended = time.perf_counter()
            if not len(self._backlog):
                self._backlog = Backlog()  # through: released
        if not stopped and done < limit and self._dirty:
            dirty = self._dirty
            keyed = self._reclassifying
            indexed = self._desired if keyed else {}
            place = Backlog(dirty)
            chunk = self._chunk_classifier(classifier, tasks, filed, indexed, check)
            taken, _ = place.take(chunk, limit - done, deadline, keyed)
            self._loop_ended = time.perf_counter()
            done += taken
            if taken == len(dirty):
                dirty.clear()
                self._reclassifying = False
            elif keyed:
                # (Listed first: keys cannot be taken out of a dict being iterated.)
                deque(map(dirty.pop, list(islice(dirty, taken))), maxlen=0)
            else:
                # Left over: the rest of dirty becomes the backlog, the place kept.
                self._backlog, self._dirty = place, {}
        return filed, done

    def _chunk_classifier(
        self,
        classifier: Classifier,
        tasks: Mapping[Hashable, Any],
        filed: dict[PlanClass, list[Any]],
        indexed: Mapping[Hashable, Any],
        check: Callable[[PlanClass, list[Any]], Iterable[Any]] | None,
    ) -> Callable[[list[Hashable] | None, list[Any]], None]:
        """What :meth:`Backlog.take <amm_rules.engine.state.backlog.Backlog.take>` hands
        each chunk to: classified, unindexed or filed into ``filed`` (and checked) with
        the chunk, while the processor's caches hold its tasks (gathering 16,384
        governed keys over chunks first cost a third more at a million keys)."""
        runtime, touched = self._runtime, self._touched

        def classify_chunk(keys: list[Hashable] | None, members: list[Any]) -> None:
            batches, dropped = classifier.classify(keys, members, tasks, runtime, indexed)
            for key in dropped:
                self._governed.unindex(key)
            touched.update(dropped)
            for cls, group in (
                self._governed.file(batches, fresh=not indexed).items() if batches else ()
            ):
                if check is not None:
                    group = list(check(cls, group))
                    if not group:
                        continue
                filed.setdefault(cls, []).extend(group)

        return classify_chunk


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
    # (The wrappers belong to the index: they read its tables, and write them through it.)
    desired = index.desired  # never rebound; the touched keys are, so read them each time
    ledger = index.ledger
    in_flight = ledger.copies  # never rebound
    moves = ledger.moves  # rebalancing's moves in flight (never rebound either)
    departing = index.departing

    def add_replica_watched(ts: Any, ws: Any) -> None:
        before = len(ts.who_has or ())  # adding a copy a worker already holds is a no-op
        add_replica(ts, ws)
        if not index._active:
            return
        held = len(ts.who_has)
        if held <= 2 and held > before and (costs := index._costs) is not None:
            costs.copy_added(ts, ws, held)  # a key's only copy, or no longer its only one
        asked = (
            ledger.landed(ts.key, ws.address, ws.last_seen)
            if in_flight and ts.key in in_flight
            else None
        )
        if held > before and (wanted := desired.get(ts.key)) is not None:
            index.governed.copies_changed(ts.key, 1)
            if wanted.spill is not None and (ruled := index.governed.spill_ruled) is not None:
                ruled.copied(ts, ws)
                index._wake("spill-rule-copy")  # its value sent before the worker writes it
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
                index._wake("copy-landed")
        if held > 1:  # the first copy is a key entering memory: see dirty
            index._touched.add(ts.key)
            # A rebalancing move's copy landed: its drop (the relief) follows at once.
            move = moves.get(ts.key) if moves else None
            if move is not None and move.recipient == ws.address:
                index._wake("move-landed")

    def remove_replica_watched(ts: Any, ws: Any) -> None:
        remove_replica(ts, ws)
        if not index._active:
            return
        if (costs := index._costs) is not None and (left := len(ts.who_has or ())) <= 1:
            costs.copy_removed(ts, ws, left)
        wanted = desired.get(ts.key)
        # remove_worker marks the worker closed before it removes its copies; a drop
        # leaves it running.
        closed = getattr(ws.status, "name", ws.status) == "closed"
        if closed:
            departing.lost_copy(ws.address, ts, wanted)
        if wanted is not None:
            index.governed.copies_changed(ts.key, -1)
            index._touched.add(ts.key)
            if closed:
                departing.source_lost.add(ts.key)
            target = wanted.replicate
            # Under ``all`` (a copy on every eligible worker) any copy lost is missed.
            if target is not None and (target.min == ALL or len(ts.who_has or ()) < target.min):
                index._wake("copy-lost")

    def remove_all_replicas_watched(ts: Any) -> None:
        # A key leaving memory: its copies go here, before the transition hook forgets it.
        if index._active and ts.who_has:
            if ts.key in desired:
                index.governed.copies_changed(ts.key, -len(ts.who_has))
            if len(ts.who_has) == 1 and (costs := index._costs) is not None:
                costs.all_removed(ts)
        remove_all_replicas(ts)

    wrappers: dict[str, Callable[..., Any]] = {
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
        who_has = kwargs.get("who_has") or {}
        if not (index._active and who_has):
            return update_data(*args, **kwargs)
        flow = index._flow
        before: set[Hashable] = set()
        if flow is not None:
            tasks = scheduler.tasks
            before = {
                k for k in who_has if (ts := tasks.get(k)) is not None and ts.state == "memory"
            }
        # Scattered again, maybe with a new size: un-filed now (with the size it was
        # filed with), filed again when classified.
        for key in who_has:
            if key in desired:
                index.governed.unindex(key)
        result = update_data(*args, **kwargs)
        index.queue(who_has)  # un-filed above: not indexed
        if flow is not None:
            flow.scattered(who_has, before)
        return result

    return update_data_watched
