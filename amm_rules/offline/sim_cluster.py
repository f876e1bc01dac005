"""A recorded cluster as the engine sees a live one: scheduler-shaped objects.

The engine reads the scheduler through duck-typed adapters
(:mod:`amm_rules.engine.adapters`) and its placements, the rebalancer reads
``tasks``/``workers`` and the Active Memory Manager reads ``workers``, ``running`` and
each worker's ``memory``. :class:`SimCluster` offers exactly those attributes, built from a
:class:`~amm_rules.offline.dump.ClusterState` (a dump, a running scheduler's state, a
test file's fixture): :class:`SimTask` stands for a ``TaskState``, :class:`SimWorker`
for a ``WorkerState`` with a real ``distributed.scheduler.MemoryState``. So the same
adapters turn them into the engine's views, and nothing of the rules is implemented
twice.

A :class:`SimCluster` changes only as the simulator says: :meth:`SimCluster.add_replica`
and :meth:`SimCluster.remove_replica` move copies (and bytes), and record which keys
changed; :meth:`SimCluster.remove_workers` takes workers away (with the copies they
held). The computation itself is frozen: no task runs, none is released.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator
from typing import Any

from distributed.core import Status
from distributed.scheduler import MemoryState

from amm_rules.engine.adapters import DEFAULT_SPAN, span_path
from amm_rules.offline.dump import ClusterState, GroupRecord, TaskRecord, WorkerRecord

#: Task states of work not done yet (for a span's state).
_TO_RUN = frozenset({"waiting", "queued", "processing", "no-worker"})

Key = Hashable


class Named:
    """A ``TaskPrefix``: what the engine reads of one is its name."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


class SimWorker:
    """A ``WorkerState`` of a recorded cluster."""

    __slots__ = (
        "address",
        "name",
        "host",
        "status",
        "resources",
        "nthreads",
        "memory_limit",
        "has_what",
        "processing",
        "_base",
        "delta",
    )

    def __init__(self, record: WorkerRecord):
        self.address = record.address
        self.name = record.name
        self.host = record.host
        self.status: Status = Status.__members__.get(record.status, Status.closed)
        self.resources = dict(record.resources)
        self.nthreads = record.nthreads
        self.memory_limit = record.memory_limit
        #: Keys in memory here, oldest first (a dict used as an ordered set).
        self.has_what: dict[SimTask, None] = {}
        self.processing: set[SimTask] = set()
        self._base = dict(record.memory)
        #: Bytes added (or removed) by the copies the simulation made or dropped.
        self.delta = 0

    @property
    def memory(self) -> MemoryState:
        """Memory as recorded, plus what the simulation added: a copy counts in every
        measure (managed and process alike), as once the worker has reported it."""
        b = self._base
        return MemoryState(
            process=max(0, b.get("process", 0) + self.delta),
            unmanaged_old=b.get("unmanaged_old", 0),
            managed=max(0, b.get("managed", 0) + self.delta),
            spilled=b.get("spilled", 0),
        )

    @property
    def nbytes(self) -> int:
        """Bytes of the keys it holds (as ``WorkerState.nbytes``)."""
        return sum(max(0, ts.nbytes) for ts in self.has_what)

    def __repr__(self) -> str:
        return f"<SimWorker {self.address!r}, name: {self.name}, status: {self.status.name}>"


class SimTask:
    """A ``TaskState`` of a recorded cluster."""

    __slots__ = (
        "key",
        "state",
        "prefix",
        "group",
        "type",
        "nbytes",
        "who_has",
        "waiters",
        "who_wants",
        "processing_on",
        "annotations",
        "actor",
        "resource_restrictions",
    )

    def __init__(self, record: TaskRecord, prefix: Named, group: SimGroup):
        self.key = record.key
        self.state = record.state
        self.prefix = prefix
        self.group = group
        self.type = record.type
        self.nbytes = record.nbytes
        self.who_has: set[SimWorker] | None = None
        self.waiters: set[SimTask] | None = None
        #: The clients holding it (the spill sweep asks): not read from the dump.
        self.who_wants: set[Any] | None = None
        self.processing_on: SimWorker | None = None
        self.annotations = record.annotations
        self.actor = record.actor
        self.resource_restrictions = dict(record.resources) or None

    def __repr__(self) -> str:
        return f"<SimTask {self.key!r} {self.state}>"


class SimGroup:
    """A ``TaskGroup`` of a recorded cluster: its name, and what the recompute estimates
    read (:mod:`amm_rules.engine.state.costs`): compute seconds, tasks per state,
    dependency groups, its prefix (no average duration: a dump has none)."""

    __slots__ = ("name", "prefix", "states", "all_durations", "dependencies", "span_id")

    def __init__(self, name: str, prefix: Named, record: GroupRecord | None):
        self.name = name
        self.prefix = prefix
        #: The group's span (here the span's path, which stands for its id).
        self.span_id: str | None = None
        self.states: dict[str, int] = dict(record.states) if record is not None else {}
        self.all_durations = {"compute": record.compute} if record and record.compute else {}
        self.dependencies: set[SimGroup] = set()

    def __len__(self) -> int:
        return sum(self.states.values())

    def __repr__(self) -> str:
        return f"<{self.name}>"


class SentMessages(list[Any]):
    """A stream to a worker of a recorded cluster: the messages sent on it."""

    def send(self, msg: Any) -> None:
        self.append(msg)


class SimCluster:
    """The scheduler of a recorded cluster: ``tasks``, ``workers`` and what the Active
    Memory Manager calls. Transfers it is asked for are kept until :meth:`enact`."""

    #: The AMM checks its suggestions' invariants when the scheduler validates.
    validate = True

    def __init__(self, state: ClusterState):
        self.source = state.source
        self.workers: dict[str, SimWorker] = {a: SimWorker(w) for a, w in state.workers.items()}
        self.tasks: dict[Key, SimTask] = {}
        names: dict[str, Named] = {}
        #: Group name -> its group, as the scheduler's ``task_groups``.
        self.task_groups: dict[str, SimGroup] = {}
        for record in state.tasks.values():
            prefix = names.setdefault(record.prefix, Named(record.prefix))
            group = self.task_groups.get(record.group)
            if group is None:
                group = SimGroup(record.group, prefix, state.groups.get(record.group))
                self.task_groups[record.group] = group
            self.tasks[record.key] = SimTask(record, prefix, group)
            if group.span_id is None:
                group.span_id = span_path(self.tasks[record.key])
        self._link_groups(state)
        self._link(state)
        #: Keys whose copies changed since :meth:`take_touched`.
        self.touched: set[Key] = set()
        #: Workers with status running (statuses change only when workers are removed).
        self.running: set[SimWorker] = {
            ws for ws in self.workers.values() if ws.status == Status.running
        }
        #: Transfers the AMM asked for: (op, worker address, key).
        self.requested: list[tuple[str, str, Key]] = []
        #: The scheduler's stream handlers and its streams to the workers: no worker
        #: listens to a recorded cluster, so what a section sends is kept (address ->
        #: messages) for tests to read.
        self.stream_handlers: dict[str, Any] = {}
        self.stream_comms: dict[str, SentMessages] = {a: SentMessages() for a in self.workers}

    def _link_groups(self, state: ClusterState) -> None:
        """Dependencies between groups, and the states of groups the dump did not
        record (counted from their tasks)."""
        groups = self.task_groups
        for name, group in groups.items():
            record = state.groups.get(name)
            if record is not None:
                group.dependencies = {groups[d] for d in record.dependencies if d in groups}
        if any(name not in state.groups for name in groups):
            for ts in self.tasks.values():
                of = ts.group
                if of.name not in state.groups:
                    of.states[ts.state] = of.states.get(ts.state, 0) + 1

    def _link(self, state: ClusterState) -> None:
        workers, tasks = self.workers, self.tasks
        for record in state.tasks.values():
            ts = tasks[record.key]
            holders = {workers[a] for a in record.who_has}
            if record.state == "memory" and holders:
                ts.who_has = holders
            elif record.state == "memory":
                ts.state = "released"  # in memory nowhere: nothing to plan
            if record.waiters:
                ts.waiters = {tasks[k] for k in record.waiters if k in tasks}
            if record.processing_on in workers:
                ts.processing_on = workers[record.processing_on]
                ts.processing_on.processing.add(ts)
        # Keys in each worker's order as recorded, then any the record missed.
        for address, worker in state.workers.items():
            ws = workers[address]
            for key in worker.has_what:
                ts = tasks[key]
                if ts.who_has and ws in ts.who_has:
                    ws.has_what[ts] = None
        for ts in tasks.values():
            for ws in ts.who_has or ():
                ws.has_what.setdefault(ts, None)

    def span_states(self) -> dict[str, bool]:
        """Whether each span of the recording is done: none of its tasks (nor of its
        sub-spans') was waiting to run or running when it was recorded."""
        running: set[str] = set()
        spans: set[str] = set()
        for ts in self.tasks.values():
            path = ts.group.span_id or DEFAULT_SPAN
            spans.add(path)
            if ts.state in _TO_RUN:
                running.add(path)
        return {
            path: not any(r == path or r.startswith(f"{path}/") for r in running) for path in spans
        }

    # -- what the AMM reads and calls ----------------------------------------------------

    @property
    def memory(self) -> MemoryState:
        return MemoryState.sum(*(ws.memory for ws in self.workers.values()))

    def request_acquire_replicas(
        self, addr: str, keys: Iterable[Key], *, stimulus_id: str = ""
    ) -> None:
        self.requested.extend(("replicate", addr, k) for k in keys)

    def request_remove_replicas(
        self, addr: str, keys: Iterable[Key], *, stimulus_id: str = ""
    ) -> None:
        self.requested.extend(("drop", addr, k) for k in keys)

    # -- changes ------------------------------------------------------------------------

    def enact(self) -> list[tuple[str, str, Key]]:
        """Land every requested copy and drop every requested copy (never the last
        one), as the workers would before the next cycle; returns what was done."""
        done = []
        requested, self.requested = self.requested, []
        for op, addr, key in sorted(requested, key=lambda r: r[0] != "replicate"):
            ts = self.tasks.get(key)
            ws = self.workers.get(addr)
            if ts is None or ws is None or ts.state != "memory" or not ts.who_has:
                continue
            if op == "replicate" and ws not in ts.who_has:
                self.add_replica(ts, ws)
                done.append((op, addr, key))
            elif op == "drop" and ws in ts.who_has and len(ts.who_has) > 1:
                self.remove_replica(ts, ws)
                done.append((op, addr, key))
        return done

    def add_replica(self, ts: SimTask, ws: SimWorker) -> None:
        assert ts.who_has is not None
        ts.who_has.add(ws)
        ws.has_what[ts] = None
        ws.delta += ts.nbytes
        self.touched.add(ts.key)

    def remove_replica(self, ts: SimTask, ws: SimWorker) -> None:
        assert ts.who_has is not None
        ts.who_has.discard(ws)
        ws.has_what.pop(ts, None)
        ws.delta -= ts.nbytes
        self.touched.add(ts.key)

    def remove_workers(self, addresses: Iterable[str]) -> list[SimTask]:
        """Workers leave with their copies (as when they die). Returns the keys left
        with no copy: they are no longer in memory."""
        lost = []
        for address in addresses:
            ws = self.workers.pop(address, None)
            if ws is None:
                continue
            self.running.discard(ws)
            for ts in list(ws.has_what):
                assert ts.who_has is not None
                ts.who_has.discard(ws)
                self.touched.add(ts.key)
                if not ts.who_has:
                    ts.who_has = None
                    ts.state = "released"
                    lost.append(ts)
            ws.has_what.clear()
            for ts in ws.processing:
                ts.processing_on = None  # to be rescheduled elsewhere
            ws.processing.clear()
        return lost

    def take_touched(self) -> set[Key]:
        out, self.touched = self.touched, set()
        return out

    # -- reading ------------------------------------------------------------------------

    def in_memory(self) -> Iterator[SimTask]:
        return (ts for ts in self.tasks.values() if ts.state == "memory" and ts.who_has)

    def measure(self, measure: str) -> dict[str, int]:
        """Memory of each worker by ``measure`` (a ``MemoryState`` attribute)."""
        return {a: getattr(ws.memory, measure) for a, ws in self.workers.items()}

    def __repr__(self) -> str:
        return f"<SimCluster {self.source}: {len(self.workers)} workers, {len(self.tasks)} tasks>"
