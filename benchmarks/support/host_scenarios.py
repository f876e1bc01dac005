"""The host scenarios: whole failure domains lost, cut off and healed on a real cluster,
and what they cost in data, recomputation, cycles and transfers.

A :class:`HostCluster` is a scheduler in this process, listening on the bridge of a
:class:`~benchmarks.support.hosts.Hosts` (so a test or a benchmark reads its state
directly), and ``dask worker`` processes with nannies inside the host namespaces, two
per host. Its held data is a persisted ``dask.array`` (``arange``, one chunk per key),
governed by ``replicate: 2, spread: host`` (``mode="rules"``) or left to the stock AMM
(``mode="stock"``: ``ReduceReplicas``, after ``client.replicate(n=2)``, which is what a
stock user would call for two copies).

The scenarios (numbered as in docs/reliability.md, "Hosts lost, cut off and healed"),
each a number of rounds, each round one fault and its repair:

1. :func:`kill_host`: SIGKILL to every process of the host holding most copies;
2. :func:`cut_long`: a host cut off past the scheduler's patience (``worker-ttl``): the
   scheduler removes its workers, the keys are copied again while it is away; healed, its
   workers close themselves (distributed's workers do not reconnect), and the host's
   workers are started again (as a host's service manager would);
3. :func:`cut_short`: a host cut off for less than that patience while a worker of another
   host dies, so that copies are asked from and to the unreachable workers; healed;
4. :func:`kill_while_moving`: a host killed while a rebalance moves copies and a worker
   of another host retires;
5. :func:`soak`: random kills, power losses, cut-offs short and long, two hosts cut
   apart, and hosts (re)joining, while computations read the held keys.

What a round measures (:class:`Round`): keys lost (every copy gone: the key left memory),
keys recomputed (their task ran again), AMM cycles from the scheduler's knowing of the
fault to every key back at its target on distinct live hosts (for ``stock``: back in
memory), and the copy and drop requests the scheduler sent per key. Every wait has a
deadline and fails naming what it waited for. Neighbours: :mod:`benchmarks.support.hosts`
(the namespaces and the faults); ``tests/engine/policy/test_hosts.py`` (short rounds, asserts)
and ``benchmarks/hosts.py`` (long rounds, the table).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import random
import signal
import statistics
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Hashable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import dask
import dask.array as da
import distributed
from distributed import Client, Scheduler, futures_of
from distributed.active_memory_manager import ActiveMemoryManagerPolicy
from distributed.core import Status
from distributed.diagnostics.plugin import SchedulerPlugin

from amm_rules.engine.policy import RulesPolicy
from benchmarks.support.hosts import Host, Hosts

#: The rule of the held keys (``mode="rules"``).
HELD_RULE = {
    "name": "held",
    "match": 'task.prefix == "arange"',
    "replicate": 2,
    "spread": "host",
}
#: Copies each held key should have, on as many distinct hosts.
TARGET = 2
#: Worker statuses whose copies do not count (the worker is leaving).
LEAVING = frozenset({Status.closing, Status.closing_gracefully, Status.closed})


@dataclass(frozen=True)
class Settings:
    """What a cluster and its scenarios are made of. Seconds unless said."""

    hosts: int = 3
    #: Hosts made but not started (a ``join`` starts one).
    spare_hosts: int = 0
    workers_per_host: int = 2
    #: Held keys, and float64 values per key.
    keys: int = 36
    chunk: int = 10_000
    #: The AMM's interval.
    interval: float = 0.2
    #: RulesPolicy's ``inflight_timeout``.
    inflight_timeout: float = 2.0
    #: distributed's ``comm.timeouts.connect`` (scheduler and workers): how long a
    #: connection attempt to an unreachable peer lasts.
    connect_timeout: float = 2.0
    #: The scheduler's patience: ``distributed.scheduler.worker-ttl`` (distributed waits
    #: at least ten heartbeat intervals, 5 s on a small cluster).
    worker_ttl: float = 5.0
    #: A short cut-off (scenario 3, the soak): well within the patience.
    short_cut: float = 2.5
    #: Cycles a repair may take, whatever the fault, before a wait fails; and a bound in
    #: seconds for any one wait.
    max_cycles: int = 200
    wait: float = 90.0
    #: Cycles in which nothing may be asked once a round settled ("and it stays so").
    quiet_cycles: int = 10
    #: Extra ``rebalance`` section for the rules (scenario 4), or None.
    rebalance: dict[str, Any] | None = None


# -- recording what happens on the scheduler ---------------------------------------------


class CycleCounter(ActiveMemoryManagerPolicy):
    """A policy that suggests nothing and counts the AMM's cycles (stock and rules alike)."""

    def __init__(self) -> None:
        self.cycles = 0

    def run(self) -> Any:
        self.cycles += 1
        return
        yield  # a generator, as the AMM expects


class KeyLedger(SchedulerPlugin):
    """Per watched key: how often its task started running and how often it left memory
    (all its copies were gone: lost)."""

    name = "host-scenarios-ledger"

    def __init__(self) -> None:
        self.watched: set[Hashable] = set()
        self.runs: Counter[Hashable] = Counter()
        self.left_memory: Counter[Hashable] = Counter()

    def transition(self, key: Hashable, start: str, finish: str, *args: Any, **kw: Any) -> None:
        if key not in self.watched:
            return
        if finish == "processing":
            self.runs[key] += 1
        elif start == "memory":
            self.left_memory[key] += 1


@dataclass
class Request:
    """One copy (``acquire``) or drop (``remove``) the scheduler sent to a worker."""

    at: float
    op: str
    worker: str
    key: Hashable
    #: The key's holders when it was sent (for a copy: where it may come from).
    holders: frozenset[str]


class Actions:
    """Every copy and drop request the scheduler sends (the AMM enacts every accepted
    suggestion through these two methods), with the key's holders at the time."""

    def __init__(self, scheduler: Scheduler):
        self.log: list[Request] = []
        self._scheduler = scheduler
        for name, op in (
            ("request_acquire_replicas", "acquire"),
            ("request_remove_replicas", "remove"),
        ):
            setattr(scheduler, name, self._recorder(getattr(scheduler, name), op))

    def _recorder(self, original: Callable[..., None], op: str) -> Callable[..., None]:
        tasks = self._scheduler.tasks

        def record(addr: str, keys: Iterable[Hashable], *, stimulus_id: str) -> None:
            keys = list(keys)
            now = time.monotonic()
            for key in keys:
                ts = tasks.get(key)
                holders = frozenset(ws.address for ws in (ts.who_has or ())) if ts else frozenset()
                self.log.append(Request(now, op, addr, key, holders))
            original(addr, keys, stimulus_id=stimulus_id)

        return record

    def since(self, start: int) -> list[Request]:
        return self.log[start:]

    @staticmethod
    def per_key(requests: Iterable[Request]) -> Counter[Hashable]:
        return Counter(r.key for r in requests)


# -- the cluster -----------------------------------------------------------------------


def scheduler_config(settings: Settings, mode: str) -> dict[str, Any]:
    """The scheduler's dask config (set in this process, where the scheduler runs)."""
    prefix = "distributed.scheduler.active-memory-manager"
    if mode == "rules":
        rules: dict[str, Any] = {"version": 1, "rules": [HELD_RULE]}
        if settings.rebalance is not None:
            rules["rebalance"] = settings.rebalance
        policy = {
            "class": "amm_rules.RulesPolicy",
            "rules": rules,
            "inflight_timeout": settings.inflight_timeout,
        }
    elif mode == "stock":
        policy = {"class": "distributed.active_memory_manager.ReduceReplicas"}
    else:
        raise ValueError(f"mode: expected 'rules' or 'stock', got {mode!r}")
    return {
        f"{prefix}.start": True,
        f"{prefix}.interval": settings.interval,
        f"{prefix}.measure": "managed",
        f"{prefix}.policies": [policy],
        "distributed.scheduler.worker-ttl": f"{settings.worker_ttl}s",
        "distributed.comm.timeouts.connect": f"{settings.connect_timeout}s",
    }


def worker_env(settings: Settings) -> dict[str, str]:
    """The worker processes' dask config, as environment variables."""
    return {
        "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": f"{settings.connect_timeout}s",
        # Forked from a process that imported distributed already: a worker starts in
        # a fraction of a second.
        "DASK_DISTRIBUTED__WORKER__MULTIPROCESSING_METHOD": "fork",
        "DASK_DISTRIBUTED__WORKER__MEMORY__PAUSE": "false",
        "DASK_LOGGING__DISTRIBUTED": "warning",
    }


class Timeout(AssertionError):
    """A wait of a scenario passed its deadline."""


class HostCluster:
    """A scheduler here, workers in the hosts, the held keys, and the recorders."""

    def __init__(
        self, hosts: Hosts, scheduler: Scheduler, client: Client, settings: Settings, mode: str
    ):
        self.hosts = hosts
        self.scheduler = scheduler
        self.client = client
        self.settings = settings
        self.mode = mode
        self.counter = CycleCounter()
        scheduler.extensions["amm"].add_policy(self.counter)
        self.actions = Actions(scheduler)
        self.ledger = KeyLedger()
        scheduler.add_plugin(self.ledger)
        #: Hosts whose workers are (meant to be) running: not killed, not closed.
        self.up: set[str] = set()
        self.held: Any = None
        self.keys: list[Hashable] = []
        #: Computations started (:meth:`computation`).
        self.computations = 0

    # -- waiting ------------------------------------------------------------------------

    @property
    def cycles(self) -> int:
        return self.counter.cycles

    async def until(
        self,
        condition: Callable[[], Any],
        what: str,
        timeout: float | None = None,
        show: Callable[[], Any] | None = None,
        max_cycles: int | None = None,
    ) -> None:
        """Poll ``condition`` every 10 ms; fail after ``timeout`` seconds (the settings'
        ``wait``) or ``max_cycles`` AMM cycles, naming ``what`` and ``show()``."""
        timeout = self.settings.wait if timeout is None else timeout
        deadline = time.monotonic() + timeout
        start = self.cycles
        while not condition():
            over = max_cycles is not None and self.cycles - start > max_cycles
            if over or time.monotonic() > deadline:
                seen = f"; last seen: {show()!r}" if show is not None else ""
                bound = f"{timeout} s" + (f" or {max_cycles} cycles" if max_cycles else "")
                raise Timeout(f"not reached within {bound}: {what}{seen}")
            await asyncio.sleep(0.01)

    async def cycles_pass(self, n: int) -> None:
        start = self.cycles
        await self.until(lambda: self.cycles - start >= n, f"{n} more AMM cycles")

    # -- hosts and workers ---------------------------------------------------------------

    def workers_of(self, host: Host) -> list[str]:
        return [a for a, ws in self.scheduler.workers.items() if ws.host == host.address]

    async def start_host(self, host: Host, nworkers: int | None = None) -> None:
        """Start the host's workers (``nworkers`` more, by default all of them) and
        wait until the scheduler has the host's full complement running."""
        n = self.settings.workers_per_host
        host.start_workers(self.scheduler.address, nworkers or n, env=worker_env(self.settings))
        await self.until(
            lambda: sum(ws.status == Status.running for ws in self._workers_on(host)) == n,
            f"the {n} workers of {host.name} running",
            show=lambda: host.log_tail(),
        )
        self.up.add(host.name)

    def _workers_on(self, host: Host) -> list[Any]:
        return [ws for ws in self.scheduler.workers.values() if ws.host == host.address]

    def kill(self, host: Host) -> None:
        host.kill()
        self.up.discard(host.name)

    async def gone(self, host: Host, timeout: float | None = None) -> None:
        """Wait until the scheduler has removed every worker of ``host``."""
        await self.until(
            lambda: not self.workers_of(host), f"the workers of {host.name} removed", timeout
        )

    def live_hosts(self, key: Hashable) -> set[str]:
        """Names of the hosts holding ``key`` on a worker that is not leaving, on a host
        that is up and not cut off."""
        ts = self.scheduler.tasks.get(key)
        if ts is None or ts.state != "memory":
            return set()
        out = set()
        for ws in ts.who_has or ():
            host = self.hosts.host_of(ws.host)
            if host and ws.status not in LEAVING and not host.is_cut and host.name in self.up:
                out.add(host.name)
        return out

    def copies(self, key: Hashable) -> int:
        ts = self.scheduler.tasks.get(key)
        return len(ts.who_has or ()) if ts is not None and ts.state == "memory" else 0

    def goal(self) -> int:
        """Copies (on distinct hosts) each key should have now: the target, or as many
        live hosts as there are; for ``stock``, one copy (in memory)."""
        live = len([h for h in self.hosts if h.name in self.up and not h.is_cut])
        return 1 if self.mode == "stock" else min(TARGET, live)

    def short(self) -> list[Hashable]:
        """Held keys below the goal on live hosts (for ``stock``: not in memory)."""
        goal = self.goal()
        return [k for k in self.keys if len(self.live_hosts(k)) < goal]

    def settled(self) -> bool:
        """Every key at exactly its goal, on as many distinct live hosts."""
        goal = self.goal()
        if self.mode == "stock":
            return all(self.copies(k) == 1 and self.live_hosts(k) for k in self.keys)
        return all(self.copies(k) == goal == len(self.live_hosts(k)) for k in self.keys)

    def placement(self) -> dict[str, Any]:
        """How many keys have how many copies on how many live hosts, and the state of a
        few keys below the goal (for a failure's message)."""
        out: dict[str, Any] = dict(
            Counter(f"{self.copies(k)} on {len(self.live_hosts(k))}" for k in self.keys)
        )
        for key in self.short()[:3]:
            ts = self.scheduler.tasks.get(key)
            out[str(key)] = (
                None
                if ts is None
                else {
                    "state": ts.state,
                    "processing_on": ts.processing_on and ts.processing_on.address,
                    "who_has": sorted(ws.address for ws in ts.who_has or ()),
                    "story": [str(t[1:4]) for t in self.scheduler.story(key)[-6:]],
                }
            )
        return out

    # -- data -------------------------------------------------------------------------------

    async def persist(self, workers: list[str] | None = None) -> None:
        """Persist the held array (on ``workers`` only, if given) and wait until it is
        placed: at its target by the rules, or trimmed back by the stock AMM."""
        s = self.settings
        array = da.arange(s.keys * s.chunk, chunks=s.chunk, dtype="float64")
        self.keys = list(array.__dask_keys__())
        self.ledger.watched.update(self.keys)
        self.held = self.client.persist(array, workers=workers)
        await distributed.wait(futures_of(self.held))
        if self.mode == "stock":
            await self.client.replicate(futures_of(self.held), n=TARGET)
            # ReduceReplicas drops every copy above one, within a cycle or two.
            await self.until(self.settled, "the stock AMM trimmed every key to one copy")
        else:
            await self.until(self.settled, "every held key at its target", show=self.placement)

    def computation(self, delay: float = 0.1) -> Any:
        """A computation reading the held keys (a future): each chunk added to the chunk
        at the other end (a transfer between workers, often between hosts), ``delay``
        seconds a task, summed; it equals twice :meth:`expected_sum`. Its keys are new
        each time (distributed counts, per key, the workers that died running it)."""
        self.computations += 1
        tag = self.computations
        held = sorted(futures_of(self.held), key=lambda f: f.key[1])

        def slow_add(a: Any, b: Any) -> Any:
            time.sleep(delay)  # work: a task that takes a while, so faults land mid-run
            return a + b

        def total(parts: list[Any]) -> float:
            return float(sum(p.sum() for p in parts))

        parts = [
            self.client.submit(slow_add, a, b, key=f"pair-{tag}-{i}")
            for i, (a, b) in enumerate(zip(held, reversed(held), strict=True))
        ]
        return self.client.submit(total, parts, key=f"total-{tag}")

    def expected_sum(self) -> float:
        n = self.settings.keys * self.settings.chunk
        return float(n * (n - 1) // 2)

    async def check_data(self) -> bool:
        """Whether the held array still sums to what it should."""
        return float(await self.client.compute(self.held.sum())) == self.expected_sum()

    async def truth(self) -> dict[str, Any]:
        """The scheduler's ``who_has`` against what each worker holds, and the engine's
        counters against both (``mode="rules"``)."""
        who_has = await self.client.who_has(futures_of(self.held))
        held = await self.scheduler.broadcast(msg={"op": "keys"})
        on_workers = {
            str(k): {a for a, ks in held.items() if k in map(str, ks)} for k in map(str, self.keys)
        }
        scheduler_view = {str(k): set(v) for k, v in who_has.items()}
        out: dict[str, Any] = {
            "who_has_matches_workers": scheduler_view == on_workers,
            "copies": sum(len(v) for v in scheduler_view.values()),
        }
        if self.mode == "rules":
            policy = policy_of(self.scheduler)
            out["engine_governed"] = policy.index.governed.governed_by.get("held", 0)
            out["engine_copies"] = policy.index.governed.copies_by.get("held", 0)
        return out


def policy_of(scheduler: Scheduler) -> RulesPolicy:
    (policy,) = [p for p in scheduler.extensions["amm"].policies if isinstance(p, RulesPolicy)]
    return policy


@contextlib.asynccontextmanager
async def host_cluster(settings: Settings, mode: str = "rules") -> AsyncIterator[HostCluster]:
    """Hosts, a scheduler on their bridge, every host's workers running, a client; all
    of it gone at the end (the hosts' processes killed, whatever happened)."""
    made = Hosts(settings.hosts + settings.spare_hosts)
    with made as hosts, dask.config.set(scheduler_config(settings, mode)):
        async with (
            Scheduler(
                host=hosts.address, port=0, dashboard=False, dashboard_address=":0"
            ) as scheduler,
            Client(scheduler.address, asynchronous=True) as client,
        ):
            cluster = HostCluster(hosts, scheduler, client, settings, mode)
            first = hosts.hosts[: settings.hosts]
            try:
                for host in first:
                    host.start_workers(
                        scheduler.address, settings.workers_per_host, env=worker_env(settings)
                    )
                n = settings.hosts * settings.workers_per_host
                await cluster.until(
                    lambda: len(scheduler.workers) == n,
                    f"{n} workers",
                    show=lambda: [h.log_tail(5) for h in first],
                )
                cluster.up.update(h.name for h in first)
                yield cluster
            finally:
                # Before the scheduler closes: workers that outlive it would wait for
                # it until their death timeout.
                for host in hosts:
                    host.kill()


# -- rounds ---------------------------------------------------------------------------------


@dataclass
class Round:
    """One fault and its repair."""

    #: The scenario, and the kind of fault (kill, power-off, cut-short, cut-long,
    #: apart, join, kill-while-moving).
    scenario: str
    kind: str
    fault: str
    lost: list[str] = field(default_factory=list)
    recomputed: list[str] = field(default_factory=list)
    #: AMM cycles from the scheduler's knowing of the fault to no key short (None: the
    #: keys were never short on live hosts, e.g. nothing to repair).
    cycles_to_repair: int | None = None
    seconds_to_repair: float | None = None
    #: Copy and drop requests per key that got any, in the round.
    actions: dict[str, int] = field(default_factory=dict)
    #: Scenario 3: copies asked to a cut-off worker or from keys held only there, per key.
    unreachable: dict[str, int] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)


class RoundClock:
    """Marks where a round starts in the recorders, and fills its :class:`Round`."""

    def __init__(self, cluster: HostCluster, kind: str, fault: str):
        self.cluster = cluster
        self.round = Round(kind, kind, fault)
        self.actions_start = len(cluster.actions.log)
        self.runs = Counter(cluster.ledger.runs)
        self.left = Counter(cluster.ledger.left_memory)
        self.noticed_cycle: int | None = None
        self.noticed_at = time.monotonic()

    def noticed(self) -> None:
        """The scheduler knows of the fault now (a killed or cut-off host's workers are
        removed): cycles to repair count from here."""
        self.noticed_cycle = self.cluster.cycles
        self.noticed_at = time.monotonic()

    async def repaired(self) -> None:
        """Wait until no key is short on live hosts; note the cycles and seconds."""
        cluster = self.cluster
        if self.noticed_cycle is None:
            self.noticed()
        if not cluster.short():
            return  # nothing to repair (cycles_to_repair stays None)
        await cluster.until(
            lambda: not cluster.short(),
            f"{self.round.fault}: every held key at its goal on distinct live hosts",
            show=cluster.placement,
            max_cycles=cluster.settings.max_cycles,
        )
        self.round.cycles_to_repair = cluster.cycles - (self.noticed_cycle or 0)
        self.round.seconds_to_repair = round(time.monotonic() - self.noticed_at, 3)

    async def settled(self) -> None:
        """Wait until every key is exactly at its goal and stays so, with no copy or drop
        sent, for ``quiet_cycles`` cycles (a transfer that hung may still land late and
        be trimmed: then the wait starts again), within ``max_cycles`` in all."""
        cluster = self.cluster
        settings = cluster.settings
        start = cluster.cycles
        while True:
            left = settings.max_cycles - (cluster.cycles - start)
            await cluster.until(
                cluster.settled,
                f"{self.round.fault}: every held key exactly at its goal",
                show=cluster.placement,
                max_cycles=max(left, 0),
            )
            before, since = len(cluster.actions.log), cluster.cycles

            def over(before: int = before, since: int = since) -> bool:
                """Quiet long enough, or something was asked, or a key moved off."""
                return (
                    cluster.cycles - since >= settings.quiet_cycles
                    or len(cluster.actions.log) > before
                    or not cluster.settled()
                )

            await cluster.until(over, f"{settings.quiet_cycles} quiet cycles")
            if len(cluster.actions.log) == before and cluster.settled():
                return
            if cluster.cycles - start > settings.max_cycles:
                raise Timeout(
                    f"{self.round.fault}: not settled within {settings.max_cycles} cycles: "
                    f"{cluster.placement()}"
                )

    def close(self) -> Round:
        cluster = self.cluster
        r = self.round
        runs = cluster.ledger.runs - self.runs
        left = cluster.ledger.left_memory - self.left
        r.recomputed = sorted(str(k) for k in runs)
        r.lost = sorted(str(k) for k in left)
        held = set(cluster.keys)
        requests = [q for q in cluster.actions.since(self.actions_start) if q.key in held]
        r.actions = {str(k): n for k, n in Actions.per_key(requests).items()}
        return r


def busiest(cluster: HostCluster, among: Iterable[Host] | None = None) -> Host:
    """The up host holding the most copies of held keys."""
    candidates = [h for h in (among or cluster.hosts) if h.name in cluster.up and not h.is_cut]
    load = Counter()
    for key in cluster.keys:
        ts = cluster.scheduler.tasks.get(key)
        for ws in (ts.who_has or ()) if ts else ():
            load[ws.host] += 1
    return max(candidates, key=lambda h: (load[h.address], -h.index))


# -- one round of each fault ------------------------------------------------------------


async def kill_round(cluster: HostCluster, victim: Host, restart: bool = True) -> Round:
    """SIGKILL to every process of ``victim``; wait for the repair and quiet; with
    ``restart``, start the host's workers again (an empty host joining)."""
    clock = RoundClock(cluster, "kill", f"kill {victim.name}")
    only_there = [k for k in cluster.keys if cluster.live_hosts(k) == {victim.name}]
    clock.round.notes["keys_only_on_victim"] = len(only_there)
    cluster.kill(victim)
    await cluster.gone(victim)
    clock.noticed()
    await clock.repaired()
    await clock.settled()
    if restart:
        await cluster.start_host(victim)
        await clock.settled()
    return clock.close()


def _patience(settings: Settings) -> float:
    """Seconds within which the scheduler removes an unreachable host's workers: two
    checks of ``worker-ttl`` (it checks every ``worker-ttl``), its attempt to reach the
    nannies (a connection attempt each), and room for a loaded machine."""
    return 3 * settings.worker_ttl + 2 * settings.connect_timeout + 10


async def cut_long_round(cluster: HostCluster, victim: Host, restart: bool = True) -> Round:
    """Cut ``victim`` off until the scheduler removes its workers; wait for the repair
    while it is away; heal; wait until its workers closed themselves (they hear from the
    scheduler again, which has forgotten them); with ``restart``, start them again."""
    clock = RoundClock(cluster, "cut-long", f"cut {victim.name} off past worker-ttl")
    cut_at = time.monotonic()
    victim.cut_off()
    await cluster.gone(victim, timeout=_patience(cluster.settings))
    clock.round.notes["seconds_to_removal"] = round(time.monotonic() - cut_at, 2)
    cluster.up.discard(victim.name)
    clock.noticed()
    await clock.repaired()
    victim.heal()
    await cluster.until(
        lambda: not victim.pids(),
        f"the removed workers of {victim.name} closing themselves once healed",
        show=victim.log_tail,
    )
    victim.reap()
    await clock.settled()
    if restart:
        await cluster.start_host(victim)
        await clock.settled()
    return clock.close()


async def power_off_round(cluster: HostCluster, victim: Host) -> Round:
    """A power loss: ``victim`` is cut off, then its processes killed, so that no
    connection is closed cleanly; the link comes back once the scheduler removed the
    host's workers (the machine rebooted, with no workers running)."""
    clock = RoundClock(cluster, "power-off", f"power off {victim.name}")
    victim.cut_off()
    cluster.kill(victim)
    await cluster.gone(victim, timeout=_patience(cluster.settings))
    clock.noticed()
    await clock.repaired()
    victim.heal()
    await clock.settled()
    return clock.close()


async def cut_short_round(cluster: HostCluster, victim: Host) -> Round:
    """Cut ``victim`` off for ``short_cut`` seconds, less than the scheduler's patience,
    and meanwhile SIGKILL the worker process of another host that shares most keys with
    it (its nanny starts a new one), so that keys are short and copies are asked from
    and to the unreachable workers; heal; wait for the repair. :attr:`Round.unreachable`
    counts per key the copies asked to a worker of ``victim`` or of a key held only
    there, while it was cut off."""
    settings = cluster.settings
    dying, host_of_dying = _worker_sharing_most(cluster, victim)
    clock = RoundClock(cluster, "cut-short", f"cut {victim.name} off for {settings.short_cut} s")
    cut_workers = set(cluster.workers_of(victim))
    victim.cut_off()
    cut_at = time.monotonic()
    with contextlib.suppress(ProcessLookupError):
        os.kill(cluster.scheduler.workers[dying].pid, signal.SIGKILL)
    await cluster.until(lambda: dying not in cluster.scheduler.workers, "the worker killed")
    clock.noticed()
    # The fault's length: the cut lasts this long whatever happens meanwhile.
    await asyncio.sleep(max(0.0, settings.short_cut - (time.monotonic() - cut_at)))
    during = cluster.actions.since(clock.actions_start)
    victim.heal()
    clock.round.notes["cut_seconds"] = round(time.monotonic() - cut_at, 2)
    clock.round.notes["cut_workers_removed"] = len(cut_workers - set(cluster.scheduler.workers))
    unreachable = Counter(
        r.key
        for r in during
        if r.op == "acquire"
        and (r.worker in cut_workers or (r.holders and r.holders <= cut_workers))
    )
    clock.round.unreachable = {str(k): n for k, n in unreachable.items()}
    await clock.repaired()
    n = settings.workers_per_host
    await cluster.until(
        lambda: len(cluster.workers_of(host_of_dying)) == n, "the killed worker restarted"
    )
    await clock.settled()
    return clock.close()


def _worker_sharing_most(cluster: HostCluster, victim: Host) -> tuple[str, Host]:
    """The worker of another up host holding most keys that also have a copy on
    ``victim``, and its host."""
    on_victim = {k for k in cluster.keys if victim.name in cluster.live_hosts(k)}
    best: tuple[int, str, Host] | None = None
    for host in cluster.hosts:
        if host is victim or host.name not in cluster.up:
            continue
        for address in cluster.workers_of(host):
            ws = cluster.scheduler.workers[address]
            shared = sum(ts.key in on_victim for ts in ws.has_what)
            if best is None or shared > best[0]:
                best = (shared, address, host)
    if best is None:
        raise ValueError(f"no up host besides {victim.name}")
    return best[1], best[2]


async def apart_round(cluster: HostCluster, a: Host, b: Host) -> Round:
    """Cut ``a`` and ``b`` apart (each still reaches the scheduler and the other hosts)
    for twice ``short_cut`` seconds; join them; wait for quiet."""
    clock = RoundClock(cluster, "apart", f"cut {a.name} and {b.name} apart")
    cluster.hosts.cut_apart(a, b)
    clock.noticed()
    await asyncio.sleep(2 * cluster.settings.short_cut)  # the fault's length
    cluster.hosts.join_apart(a, b)
    await clock.repaired()
    await clock.settled()
    return clock.close()


async def join_round(cluster: HostCluster, host: Host) -> Round:
    """Start the workers of a host that is down (killed, removed, or never started)."""
    clock = RoundClock(cluster, "join", f"{host.name} joins")
    await cluster.start_host(host)
    clock.noticed()
    await clock.repaired()
    await clock.settled()
    return clock.close()


# -- scenarios 1 to 3 ---------------------------------------------------------------------


async def kill_host(cluster: HostCluster, rounds: int = 1) -> list[Round]:
    """Scenario 1: kill the busiest host, repair, start it again; ``rounds`` times."""
    return [await kill_round(cluster, busiest(cluster)) for _ in range(rounds)]


async def cut_long(cluster: HostCluster, rounds: int = 1) -> list[Round]:
    """Scenario 2: cut the busiest host off past the scheduler's patience; ``rounds`` times."""
    return [await cut_long_round(cluster, busiest(cluster)) for _ in range(rounds)]


async def cut_short(cluster: HostCluster, rounds: int = 1) -> list[Round]:
    """Scenario 3: cut the busiest host off within the scheduler's patience while a
    worker elsewhere dies; ``rounds`` times."""
    return [await cut_short_round(cluster, busiest(cluster)) for _ in range(rounds)]


# -- scenario 4 ---------------------------------------------------------------------------

#: A rebalance section that moves data on these small workers: any worker above the
#: mean sends, and a small budget keeps moves in flight across cycles.
REBALANCE = {
    "measure": "managed",
    "sender-min": 0,
    "recipient-max": 1,
    "gap": 0,
    "max-bytes-per-cycle": 2_600_000,
}
#: Elements of a chunk while rebalancing: 1.28 MB a key, above the smallest key the
#: rebalancer moves off a worker of 1 GiB (1 MiB), two keys a cycle within its budget.
MOVING_CHUNK = 160_000


def moving(settings: Settings) -> Settings:
    """``settings`` for scenario 4: the rebalance section on, keys large enough to move."""
    return replace(settings, rebalance=REBALANCE, chunk=MOVING_CHUNK)


async def kill_while_moving(cluster: HostCluster, rounds: int = 1) -> list[Round]:
    """Scenario 4: with the held keys computed on one worker (so that the rebalance
    section keeps moving copies off it), a worker of a second host retiring
    (``retire_workers``) and moves in flight, kill a third host. Needs
    :func:`moving` settings; each round persists the keys anew."""
    out = []
    for _ in range(rounds):
        out.append(await _kill_while_moving_round(cluster))
        await cluster.client.cancel(futures_of(cluster.held))
        cluster.held = None
        await cluster.until(
            lambda: not any(k in cluster.scheduler.tasks for k in cluster.keys), "keys released"
        )
    return out


async def _kill_while_moving_round(cluster: HostCluster) -> Round:
    hosts = [h for h in cluster.hosts if h.name in cluster.up]
    heavy, retiring_host, victim = hosts[0], hosts[1], hosts[2]
    await cluster.persist(workers=cluster.workers_of(heavy)[:1])
    policy = policy_of(cluster.scheduler)
    await cluster.until(lambda: policy.rebalancer.book.pending, "a rebalancing move in flight")
    clock = RoundClock(
        cluster, "kill-while-moving", f"kill {victim.name} mid-move, mid-retirement"
    )
    retiring = cluster.workers_of(retiring_host)[0]
    retirement = asyncio.create_task(cluster.client.retire_workers([retiring]))
    await cluster.until(
        lambda: cluster.scheduler.workers[retiring].status == Status.closing_gracefully,
        "the retirement started",
    )
    clock.round.notes["moves_in_flight_at_kill"] = len(policy.rebalancer.book.pending)
    clock.round.notes["retiring_at_kill"] = retiring in cluster.scheduler.workers
    cluster.kill(victim)
    await cluster.gone(victim)
    clock.noticed()
    await clock.repaired()
    retired = await asyncio.wait_for(retirement, cluster.settings.wait)
    clock.round.notes["retired"] = sorted(retired) == [retiring]
    await clock.settled()
    clock.round.notes["data_correct"] = await cluster.check_data()
    r = clock.close()
    # Back to whole hosts: a worker replaces the retired one, the killed host starts again.
    await cluster.start_host(retiring_host, nworkers=1)
    await cluster.start_host(victim)
    return r


# -- scenario 5 ---------------------------------------------------------------------------

#: The soak's faults (and ``join``, when a host is down).
SOAK_FAULTS = ("kill", "power-off", "cut-short", "cut-long", "apart")


async def soak(
    cluster: HostCluster,
    *,
    rounds: int | None = None,
    seconds: float | None = None,
    seed: int = 1,
    schedule: Sequence[str] | None = None,
) -> list[Round]:
    """Scenario 5: one fault per round, for ``rounds`` rounds or ``seconds`` seconds, on
    hosts of which at least three are up before each fault: at random (``seed``) from
    :data:`SOAK_FAULTS`, or a ``join`` (a host that is down starts again) when fewer
    than three are up, or at random when some host is down; or the kinds in
    ``schedule``, in order. A computation over the held keys runs through each round
    and its result is checked (:attr:`Round.notes` ``result_correct``)."""
    rng = random.Random(seed)
    start = time.monotonic()
    out: list[Round] = []
    while (rounds is None or len(out) < rounds) and (
        seconds is None or time.monotonic() - start < seconds
    ):
        if schedule is not None and len(out) == len(schedule):
            break
        up = [h for h in cluster.hosts if h.name in cluster.up]
        down = [h for h in cluster.hosts if h.name not in cluster.up]
        if schedule is not None:
            kind = schedule[len(out)]
        elif len(up) < 3:
            kind = "join"
        else:
            kind = rng.choice(SOAK_FAULTS + (("join",) if down else ()))
        total = cluster.computation()
        r = await _soak_round(cluster, kind, rng, up, down)
        r.notes["result_correct"] = float(await total) == 2 * cluster.expected_sum()
        r.scenario = "soak"
        out.append(r)
    return out


async def _soak_round(
    cluster: HostCluster, kind: str, rng: random.Random, up: list[Host], down: list[Host]
) -> Round:
    if kind == "join":
        if not down:
            raise ValueError("join: no host is down")
        return await join_round(cluster, rng.choice(down))
    if len(up) < 3:
        raise ValueError(f"{kind}: only {len(up)} hosts up, a fault needs three")
    if kind == "apart":
        a, b = rng.sample(up, 2)
        return await apart_round(cluster, a, b)
    victim = rng.choice(up)
    if kind == "kill":
        return await kill_round(cluster, victim, restart=False)
    if kind == "power-off":
        return await power_off_round(cluster, victim)
    if kind == "cut-short":
        return await cut_short_round(cluster, victim)
    if kind == "cut-long":
        return await cut_long_round(cluster, victim, restart=False)
    raise ValueError(f"unknown fault {kind!r}; expected one of {SOAK_FAULTS + ('join',)}")


# -- figures --------------------------------------------------------------------------------


def summary(rounds: list[Round]) -> dict[str, Any]:
    """A row of the table: rounds, keys lost and recomputed (in all rounds), cycles to
    repair and copy/drop requests per key (median and max over the rounds' values)."""
    cycles = [r.cycles_to_repair for r in rounds if r.cycles_to_repair is not None]
    actions = [n for r in rounds for n in r.actions.values()]
    unreachable = [n for r in rounds for n in r.unreachable.values()]
    return {
        "rounds": len(rounds),
        "keys_lost": sum(len(r.lost) for r in rounds),
        "keys_recomputed": sum(len(r.recomputed) for r in rounds),
        "cycles_to_repair": _median_max(cycles),
        "seconds_to_repair": _median_max(
            [r.seconds_to_repair for r in rounds if r.seconds_to_repair is not None]
        ),
        "actions_per_key": _median_max(actions),
        "keys_with_actions": len(actions),
        "unreachable_requests_per_key": _median_max(unreachable),
        "faults": dict(Counter(r.kind for r in rounds)),
    }


def _median_max(values: list[float]) -> list[float] | None:
    if not values:
        return None
    return [statistics.median(values), max(values)]


def as_dict(r: Round) -> dict[str, Any]:
    return asdict(r)


def bound_per_key(settings: Settings, seconds: float) -> int:
    """Copies one key may be asked for in ``seconds`` without a storm: one, and one more
    after each in-flight timeout (a worker whose copy timed out is not asked again for
    as long again, so a second worker is asked)."""
    return 1 + math.ceil(seconds / settings.inflight_timeout)
