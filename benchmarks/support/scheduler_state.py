"""A real ``distributed.Scheduler`` holding a large cluster state, built in one process.

The scale benchmark (``benchmarks/scale.py``) and its smoke test
(``tests/test_scale_benchmark.py``) need a scheduler that looks, to the Active Memory
Manager and to amm-rules, exactly like one that has run a large computation: real
``WorkerState``, ``TaskPrefix``, ``TaskGroup`` and ``TaskState`` objects, linked the way
the scheduler links them. Nothing here opens a socket:

- the scheduler is constructed (inside a running asyncio loop) but never started;
- workers are registered with the bookkeeping of ``Scheduler.add_worker`` (workers,
  ``running``, host info, totals, aliases, a heartbeat carrying resources and memory
  metrics, idle/saturated sets, the plugins' ``add_worker`` hooks), minus the comm;
- keys are created with ``SchedulerState.new_task``, wanted by a client through
  ``client_desires_keys`` and put in memory with ``_add_to_memory`` (the second half of
  the processing -> memory transition); extra copies go through ``add_replica``, so
  ``who_has``, ``has_what``, ``nbytes`` and ``replicated_tasks`` agree;
- the comms to workers and to the client are :class:`NullComm` objects, and the AMM's
  two transfer calls are replaced by a :class:`TransferLog` that records what was asked
  and sends nothing (:meth:`TransferLog.apply` enacts it when a test wants the copies
  to "land");
- new keys can be computed for real, through ``update_graph``'s own
  ``_create_taskstate_from_graph`` and the ``task-finished`` handler, by
  :func:`compute_keys`, which plays the workers' part from the ``compute-task``
  messages the scheduler sends (this is how the benchmark drives transitions).

The layout of the data (prefixes, types, sizes, which keys hold how many copies, on
which workers) is computed from a rules file, so that every key already holds what the
rules want: the steady state in which a policy should find nothing to do.
"""

from __future__ import annotations

import functools
import gc
import hashlib
import inspect
import itertools
import operator
import time
from collections import Counter, deque
from collections.abc import Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import dask
from dask._task_spec import Task, TaskRef
from distributed import Scheduler
from distributed.core import Status
from distributed.scheduler import TaskState, WorkerState

from amm_rules.language.ruleset import Desired, Ruleset, TaskFacts, WorkerFacts

GiB = 2**30
MiB = 2**20

#: Ten operations at five stages make the 50 prefixes of the state: ``add_0`` ...
VERBS: tuple[str, ...] = (
    "read_parquet", "from_array", "getitem", "add", "mul",
    "sum", "groupby_agg", "merge", "shuffle", "checkpoint",
)  # fmt: skip
PREFIXES: tuple[str, ...] = tuple(f"{verb}_{stage}" for stage in range(5) for verb in VERBS)
#: Task groups per prefix (a group is one collection in dask terms).
GROUPS_PER_PREFIX = 4
#: Result type of each operation; stage 2 of ``getitem`` and ``add`` runs on GPUs.
TYPES: Mapping[str, str] = {
    "read_parquet": "pandas.core.frame.DataFrame",
    "from_array": "numpy.ndarray",
    "getitem": "numpy.ndarray",
    "add": "numpy.ndarray",
    "mul": "numpy.ndarray",
    "sum": "numpy.float64",
    "groupby_agg": "pandas.core.frame.DataFrame",
    "merge": "pandas.core.frame.DataFrame",
    "shuffle": "pandas.core.frame.DataFrame",
    "checkpoint": "builtins.bytes",
}
GPU_PREFIXES = frozenset({"getitem_2", "add_2"})
#: Typical result size of each operation (a key's size varies a little around it).
SIZES: Mapping[str, int] = {
    "read_parquet": 8 * MiB,
    "from_array": 4 * MiB,
    "getitem": 2 * MiB,
    "add": 4 * MiB,
    "mul": 4 * MiB,
    "sum": 8,
    "groupby_agg": 1 * MiB,
    "merge": 16 * MiB,
    "shuffle": 8 * MiB,
    "checkpoint": 32 * MiB,
}
#: One array key in this many is large (what a size rule picks out).
LARGE_EVERY = 97
LARGE_NBYTES = 300 * MiB

#: Workers per host (addresses share the host part).
WORKERS_PER_HOST = 4
#: Of every ten workers, these carry ``resources={"GPU": 1}`` ...
GPU_SLOTS = frozenset({0, 1})
#: ... and these have a large memory limit.
BIGMEM_SLOTS = frozenset({2, 3})
CLIENT = "bench-client"


class NullComm:
    """Stands for a ``BatchedSend`` to a worker or client: counts messages, sends none.

    A worker's comm also keeps the ``compute-task`` messages, which
    :func:`compute_keys` answers as the worker would.
    """

    def __init__(self, keep: deque[tuple[str, dict[str, Any]]] | None = None, address: str = ""):
        self.address = address
        self.sent = 0
        self._keep = keep

    def send(self, *msgs: dict[str, Any]) -> None:
        self.sent += len(msgs)
        if self._keep is not None:
            for msg in msgs:
                if msg.get("op") == "compute-task":
                    self._keep.append((self.address, msg))

    def closed(self) -> bool:
        return False

    async def close(self) -> None:  # what Scheduler.close awaits on a worker's comm
        return None

    def abort(self) -> None:  # what Scheduler.close calls on a client's comm
        return None


@dataclass
class TransferLog:
    """Replaces ``Scheduler.request_acquire_replicas`` and ``request_remove_replicas``.

    Counts what the AMM asked and keeps the requests, without touching the state: a
    cycle can be repeated on exactly the same state. :meth:`apply` enacts the requests
    (copies land, dropped copies go) when the caller wants the cluster to move on.
    """

    acquire: list[tuple[str, list[Hashable]]] = field(default_factory=list)
    remove: list[tuple[str, list[Hashable]]] = field(default_factory=list)

    def request_acquire_replicas(
        self, addr: str, keys: Iterable[Hashable], *, stimulus_id: str
    ) -> None:
        self.acquire.append((addr, list(keys)))

    def request_remove_replicas(
        self, addr: str, keys: list[Hashable], *, stimulus_id: str
    ) -> None:
        self.remove.append((addr, list(keys)))

    @property
    def copies(self) -> int:
        return sum(len(keys) for _, keys in self.acquire)

    @property
    def drops(self) -> int:
        return sum(len(keys) for _, keys in self.remove)

    def clear(self) -> None:
        self.acquire.clear()
        self.remove.clear()

    def take(self) -> TransferLog:
        """The requests recorded so far (this log is emptied)."""
        out = TransferLog(list(self.acquire), list(self.remove))
        self.clear()
        return out

    def apply(self, scheduler: Scheduler) -> None:
        """Enact the recorded requests as the workers would, then forget them: each
        requested copy lands, each dropped copy goes (never the last one)."""
        for addr, keys in self.acquire:
            ws = scheduler.workers.get(addr)
            for key in keys:
                ts = scheduler.tasks.get(key)
                if ws is not None and ts is not None and ts.state == "memory":
                    scheduler.add_replica(ts, ws)
        for addr, keys in self.remove:
            ws = scheduler.workers.get(addr)
            for key in keys:
                ts = scheduler.tasks.get(key)
                if (
                    ws is not None
                    and ts is not None
                    and ws in (ts.who_has or ())
                    and len(ts.who_has) > 1
                ):
                    scheduler.remove_replica(ts, ws)
        self.clear()


@dataclass
class BenchState:
    """A scheduler holding the state, and what the benchmark needs to drive it."""

    scheduler: Scheduler
    ruleset: Ruleset
    transfers: TransferLog
    #: ``compute-task`` messages sent to workers and not yet answered.
    outbox: deque[tuple[str, dict[str, Any]]]
    #: Keys put in memory by :func:`build_state`, in creation order.
    keys: list[Hashable]
    #: Workers by address, and the names of the pools each is in.
    pools: dict[str, frozenset[str]]
    #: How the keys' copies were laid out: governed keys, keys per copy count...
    census: Counter[str] = field(default_factory=Counter)
    #: Generation counter for fresh keys made by :func:`new_key_names`.
    generation: int = 0


# ---------------------------------------------------------------------------------
# Keys: names, types, sizes
# ---------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def _token(*parts: object) -> str:
    """A 32-hex-digit token, as dask puts in its collection names."""
    return hashlib.md5("-".join(map(str, parts)).encode()).hexdigest()


def key_name(i: int, generation: int = 0) -> tuple[str, int]:
    """The key of the i-th chunk: ``("add_3-<token>", i)`` like a dask collection's."""
    prefix = PREFIXES[i % len(PREFIXES)]
    group = (i // len(PREFIXES)) % GROUPS_PER_PREFIX
    return (f"{prefix}-{_token(prefix, group, generation)}", i)


def key_prefix(i: int) -> str:
    return PREFIXES[i % len(PREFIXES)]


def key_type(i: int) -> str:
    return _layout(i % len(PREFIXES), i % 7, i % LARGE_EVERY == 0)[0]


def key_nbytes(i: int) -> int:
    return _layout(i % len(PREFIXES), i % 7, i % LARGE_EVERY == 0)[1]


@functools.cache
def _layout(p: int, variant: int, large: bool) -> tuple[str, int]:
    """Type and size of a key, from its prefix and two properties of its index
    (cached: the builder asks for a million keys and there are 700 answers)."""
    prefix = PREFIXES[p]
    verb = prefix.rsplit("_", 1)[0]
    typename = "cupy.ndarray" if prefix in GPU_PREFIXES else TYPES[verb]
    if typename == "numpy.ndarray" and large:
        return typename, LARGE_NBYTES
    base = SIZES[verb]
    # A little variety, so that sizes are not one value per prefix.
    return typename, base + variant * (base // 16)


# ---------------------------------------------------------------------------------
# The scheduler and its workers
# ---------------------------------------------------------------------------------


def new_scheduler() -> Scheduler:
    """An unstarted scheduler whose own AMM does nothing (the benchmark runs ad-hoc ones).

    Must be called inside a running asyncio loop, as the scheduler's constructor
    expects one.
    """
    with dask.config.set({"distributed.scheduler.active-memory-manager.start": False}):
        scheduler = Scheduler(validate=False, dashboard_address=":0")
    return scheduler


def worker_address(i: int) -> str:
    host = i // WORKERS_PER_HOST
    return f"tcp://10.{host // 65536 % 256}.{host // 256 % 256}.{host % 256}:{40000 + i % WORKERS_PER_HOST}"


async def add_workers(
    scheduler: Scheduler, n: int, outbox: deque[tuple[str, dict[str, Any]]]
) -> None:
    """Register ``n`` workers with the bookkeeping of ``Scheduler.add_worker``, minus the
    comm (which ``add_worker`` reads and writes for the worker's whole life)."""
    now = time.time()
    for i in range(n):
        address = worker_address(i)
        slot = i % 10
        gpu = slot in GPU_SLOTS
        limit = (256 if slot in BIGMEM_SLOTS else 64) * GiB
        ws = WorkerState(
            address=address,
            status=Status.running,
            pid=1000 + i,
            name=f"worker-{i}",
            nthreads=4,
            memory_limit=limit,
            local_directory="dask-scratch-space",
            nanny=None,
            server_id=f"Worker-{_token('worker', i)}",
            scheduler=scheduler,
        )
        scheduler.workers[address] = ws
        scheduler._workers_added_total += 1
        scheduler.running.add(ws)
        dh = scheduler.host_info.setdefault(ws.host, {})
        dh.setdefault("addresses", set()).add(address)
        dh["nthreads"] = dh.get("nthreads", 0) + ws.nthreads
        scheduler.total_memory += ws.memory_limit
        scheduler.total_nthreads += ws.nthreads
        scheduler.total_nthreads_history.append((now, scheduler.total_nthreads))
        scheduler.aliases[ws.name] = address
        heartbeat(scheduler, ws, resources={"GPU": 1} if gpu else {}, now=now)
        scheduler.check_idle_saturated(ws)
        scheduler.stream_comms[address] = NullComm(outbox, address)  # type: ignore[assignment]
        for plugin in list(scheduler.plugins.values()):
            result = plugin.add_worker(scheduler=scheduler, worker=address)
            if inspect.isawaitable(result):
                await result
    scheduler._refresh_no_workers_since()


def heartbeat(
    scheduler: Scheduler,
    ws: WorkerState,
    *,
    resources: dict[str, float] | None = None,
    now: float | None = None,
) -> None:
    """A worker heartbeat, as ``Worker.heartbeat`` sends it: process memory is the
    managed bytes plus 512 MiB of unmanaged memory; resources are (re)declared."""
    metrics = {
        "memory": ws.nbytes + 512 * MiB,
        "spilled_bytes": {"memory": 0, "disk": 0},
        "bandwidth": {"total": 100e6, "workers": {}, "types": {}},
        "digests_total_since_heartbeat": {},
    }
    scheduler.heartbeat_worker(
        address=ws.address,
        resolve_address=False,
        now=now or time.time(),
        resources=resources,
        metrics=metrics,
    )


def worker_pools(scheduler: Scheduler, ruleset: Ruleset) -> dict[str, frozenset[str]]:
    """The pools of the rules file each worker is in (evaluated here, independently of
    the engine, so that the layout does not depend on the code it benchmarks)."""
    out = {}
    for address, ws in scheduler.workers.items():
        facts = WorkerFacts(
            address=address,
            name=str(ws.name),
            host=ws.host,
            resources=dict(ws.resources),
            memory_limit=ws.memory_limit,
            nthreads=ws.nthreads,
        )
        out[address] = frozenset(
            name for name, pool in ruleset.pools.items() if pool.predicate(facts)
        )
    return out


# ---------------------------------------------------------------------------------
# Data in memory
# ---------------------------------------------------------------------------------


class Placer:
    """Chooses the workers holding a key's copies so that the rules are already met:
    as many copies as ``replicate`` asks (its ``min``), inside ``pool`` and outside
    ``avoid``, on distinct hosts with ``spread: host``. Keys no rule places go round-robin
    over every worker."""

    def __init__(
        self, scheduler: Scheduler, ruleset: Ruleset, pools: Mapping[str, frozenset[str]]
    ):
        self.ruleset = ruleset
        self.workers = list(scheduler.workers.values())
        self.pools = pools
        self._eligible: dict[tuple[Any, Any], list[WorkerState]] = {}
        self._desired: dict[tuple[str, str, int], Desired] = {}

    def desired(self, key: tuple[str, int], i: int) -> Desired:
        # Memoized per (collection name, type, size): the rules of the scale file read
        # the key only through its name part, so every chunk of a collection with the
        # same type and size resolves alike.
        memo = (key[0], key_type(i), key_nbytes(i))
        try:
            return self._desired[memo]
        except KeyError:
            pass
        facts = TaskFacts(
            key=str(key),
            prefix=key_prefix(i),
            group=key[0],
            type=memo[1],
            nbytes=memo[2],
            replicas=1,
        )
        d = self._desired[memo] = self.ruleset.resolve(facts)
        return d

    def eligible(self, d: Desired) -> list[WorkerState]:
        memo = (d.pool, d.avoid)
        try:
            return self._eligible[memo]
        except KeyError:
            pass
        want = set(d.pool) if d.pool is not None else None
        shun = set(d.avoid or ())
        out = [
            ws
            for ws in self.workers
            if (want is None or want & self.pools[ws.address])
            and not shun & self.pools[ws.address]
        ]
        if not out:
            raise ValueError(f"no worker may hold keys wanting {d.explain()}")
        self._eligible[memo] = out
        return out

    def place(self, d: Desired, i: int) -> list[WorkerState]:
        workers = self.eligible(d)
        wanted = d.replicate is not None and d.move != "never"
        copies = d.replicate.bounds(len(workers))[0] if wanted else 1  # type: ignore[union-attr]
        start = (i * 7919) % len(workers)  # a stride prime to the pool size spreads keys
        rotated = itertools.chain(workers[start:], workers[:start])
        if d.spread != "host":
            return list(itertools.islice(rotated, copies))
        out: list[WorkerState] = []
        hosts: set[str] = set()
        for ws in rotated:
            if ws.host not in hosts:
                out.append(ws)
                hosts.add(ws.host)
                if len(out) == copies:
                    break
        return out


def fill_memory(state: BenchState, n_keys: int) -> None:
    """Put ``n_keys`` keys in memory, each on the workers the rules want."""
    scheduler = state.scheduler
    placer = Placer(scheduler, state.ruleset, state.pools)
    census = state.census
    keys = [key_name(i) for i in range(n_keys)]
    for key in keys:
        scheduler.new_task(key, None, "released")
    # Persisted data: a client wants every key, or the scheduler would release it.
    scheduler.client_desires_keys(keys=keys, client=CLIENT)
    recommendations: dict[Hashable, str] = {}
    client_msgs: dict[str, list[dict[str, Any]]] = {}
    tasks = scheduler.tasks
    for i, key in enumerate(keys):
        ts = tasks[key]
        d = placer.desired(key, i)
        first, *others = placer.place(d, i)
        ts.set_nbytes(key_nbytes(i))
        # The memory side of the processing -> memory transition: first copy, state,
        # type, the group's type set.
        scheduler._add_to_memory(
            ts, first, recommendations, client_msgs, type=b"", typename=key_type(i)
        )
        for ws in others:
            scheduler.add_replica(ts, ws)
        census["governed"] += bool(d.governed)
        census[f"copies={1 + len(others)}"] += 1
        if d.replicate is not None:
            census["under a replication target"] += 1
    # _add_to_memory recommends nothing here (no dependencies, wanted by the client).
    assert not recommendations, list(recommendations.items())[:3]
    state.keys.extend(keys)
    for ws in scheduler.workers.values():
        heartbeat(scheduler, ws)


async def build_state(n_keys: int, n_workers: int, ruleset: Ruleset) -> BenchState:
    """A scheduler with ``n_workers`` workers and ``n_keys`` keys in memory laid out
    as ``ruleset`` wants. Call inside a running asyncio loop; close with
    ``await state.scheduler.close()``."""
    # The builder makes millions of long-lived objects: the cyclic GC would scan them
    # again and again while they are made (doubling the build time) and find nothing.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return await _build_state(n_keys, n_workers, ruleset)
    finally:
        if gc_was_enabled:
            gc.enable()
        gc.collect()


async def _build_state(n_keys: int, n_workers: int, ruleset: Ruleset) -> BenchState:
    scheduler = new_scheduler()
    outbox: deque[tuple[str, dict[str, Any]]] = deque()
    transfers = TransferLog()
    # The AMM calls these two as attributes of the scheduler: instance attributes win.
    scheduler.request_acquire_replicas = transfers.request_acquire_replicas  # type: ignore[method-assign]
    scheduler.request_remove_replicas = transfers.request_remove_replicas  # type: ignore[method-assign]
    scheduler.client_desires_keys(keys=[], client=CLIENT)  # registers the client
    scheduler.client_comms[CLIENT] = NullComm()  # type: ignore[assignment]
    await add_workers(scheduler, n_workers, outbox)
    state = BenchState(
        scheduler=scheduler,
        ruleset=ruleset,
        transfers=transfers,
        outbox=outbox,
        keys=[],
        pools=worker_pools(scheduler, ruleset),
    )
    fill_memory(state, n_keys)
    return state


# ---------------------------------------------------------------------------------
# Driving the scheduler: computations, lost copies
# ---------------------------------------------------------------------------------


def _chunk(*args: Any) -> None:  # pragma: no cover - never executed: no worker runs it
    return None


def new_key_names(state: BenchState, n: int) -> list[tuple[str, int]]:
    """``n`` keys that do not exist yet, with the prefixes, types and sizes of the layout."""
    state.generation += 1
    return [key_name(i, state.generation) for i in range(n)]


def compute_keys(
    state: BenchState,
    keys: list[tuple[str, int]],
    *,
    chains: bool = False,
    stimulus: str = "bench",
) -> int:
    """Submit ``keys`` as a graph and run it to completion, playing the workers' part.

    The graph goes through ``_create_taskstate_from_graph`` (what ``update_graph`` runs
    after deserializing a graph); each ``compute-task`` message the scheduler sends is
    answered with ``handle_task_finished`` (what a worker's ``task-finished`` message
    triggers), carrying the size and type of the layout. With ``chains``, every key
    depends on an intermediate key that is released once its dependent is done, so
    keys go through released -> waiting -> processing -> memory -> released ->
    forgotten as in a real pipeline. The client keeps ``keys`` in memory.

    Returns the number of transitions the scheduler made.
    """
    scheduler = state.scheduler
    outbox = state.outbox
    dsk: dict[Hashable, Any] = {}
    for key in keys:
        if chains:
            name, i = key
            dep = (f"load-{name}", i)
            dsk[dep] = Task(dep, _chunk, i)
            dsk[key] = Task(key, _chunk, TaskRef(dep))
        else:
            dsk[key] = Task(key, _chunk, key[1])
    ordered = {k: n for n, k in enumerate(dsk)}
    before = scheduler.transition_counter
    scheduler._create_taskstate_from_graph(
        start=time.time(),
        dsk=dsk,
        keys=set(keys),
        ordered=ordered,
        client=CLIENT,
        annotations_by_type={},
        global_annotations=None,
        stimulus_id=f"{stimulus}-update-graph",
        submitting_task=None,
        span_metadata={"collections": []},
    )
    sizes = {key: (key_nbytes(key[1]), key_type(key[1])) for key in keys}
    finished = 0
    while outbox:
        address, msg = outbox.popleft()
        key = msg["key"]
        nbytes, typename = sizes.get(key, (64, "numpy.ndarray"))
        t = time.time()
        scheduler.handle_task_finished(
            key=key,
            worker=address,
            stimulus_id=f"{stimulus}-task-finished-{finished}",
            run_id=msg["run_id"],
            nbytes=nbytes,
            type=b"",
            typename=typename,
            metadata={},
            thread=1,
            startstops=[{"action": "compute", "start": t - 0.01, "stop": t}],
        )
        finished += 1
    return scheduler.transition_counter - before


def release_keys(state: BenchState, keys: Iterable[Hashable], stimulus: str = "bench") -> int:
    """The client releases ``keys`` (memory -> released -> forgotten)."""
    scheduler = state.scheduler
    before = scheduler.transition_counter
    scheduler.client_releases_keys(
        keys=list(keys), client=CLIENT, stimulus_id=f"{stimulus}-release"
    )
    return scheduler.transition_counter - before


def lose_copies(state: BenchState, n: int, *, seed: int = 0) -> list[Hashable]:
    """Take one copy away from ``n`` replicated keys, as ``remove_worker`` does for the
    keys of a worker that died: the scheduler forgets the replica."""
    scheduler = state.scheduler
    replicated = sorted(scheduler.replicated_tasks, key=lambda ts: ts.key[1])
    step = max(1, len(replicated) // max(n, 1))
    out = []
    for ts in itertools.islice(replicated[seed % step :: step], n):
        ws = max(ts.who_has, key=operator.attrgetter("address"))  # type: ignore[arg-type]
        scheduler.remove_replica(ts, ws)
        out.append(ts.key)
    return out


def add_copies(state: BenchState, keys: Iterable[Hashable]) -> None:
    """Give each key one more copy, on the first worker (by address) not holding it, as
    a dependency transfer or ``client.replicate`` would."""
    scheduler = state.scheduler
    workers = sorted(scheduler.workers.values(), key=operator.attrgetter("address"))
    for key in keys:
        ts = scheduler.tasks[key]
        ws = next(w for w in workers if w not in (ts.who_has or ()))
        scheduler.add_replica(ts, ws)


def memory_tasks(state: BenchState) -> Iterator[TaskState]:
    return (ts for ts in state.scheduler.tasks.values() if ts.state == "memory")
