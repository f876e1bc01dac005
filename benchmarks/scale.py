"""Scheduler cost of amm-rules at scale: a million keys, a thousand workers, 20 rules.

Builds a real ``distributed.Scheduler`` state in this process (see
:mod:`benchmarks.support.scheduler_state`: real workers, tasks, groups and prefixes, no
network), lays the data out as ``benchmarks/rules/scale.yaml`` wants it, and measures
side by side, on each size:

- ``attach``: creating ``RulesPolicy`` and an ad-hoc AMM on a scheduler that already
  holds the state, then its first cycle, and the cycles until every key in memory is
  classified (the policy's classification budget spreads them over several cycles);
- ``steady``: a RulesPolicy cycle when every target is met (nothing to do);
- ``governed``: time to govern every key when all of them enter memory at once (the
  transition hook sees each arrive), in cycles of the default classification budget
  and in seconds, for the 20-rule file (whose matches read sizes and key names) and for
  ``benchmarks/rules/scale-groups.yaml`` (the same rules reading only group-level
  attributes: prefix, group, type);
- ``changed``: the first cycle after 1% of the keys changed (0.5% new keys computed
  through the scheduler's transitions, 0.5% of keys lost a copy);
- ``reduce-only``: RulesPolicy with a rules file without rules (only
  ``reduce-replicas``), on the steady state;
- ``stock``: distributed's own ``ReduceReplicas`` on the steady and changed states.
  In the steady state 10% of the keys hold 2 or 3 copies (their rules want them), so
  the stock policy, which knows no rules, asks to drop every extra copy;
- ``memory``: bytes the engine holds per governed key (tracemalloc around an attach);
- ``observe``: what looking at the engine costs on the event loop: a ``status_report``
  (``amm-rules status``), a Prometheus scrape of the engine's collector (computing
  and formatting every ``dask_amm_rules_*`` sample), and ``explain`` of one governed
  key, on the steady state; then steady cycles again, each after a scrape, to show that
  the collector adds nothing to the cycle;
- ``page``: the dashboard page (``/amm-rules``) of one open browser tab: opening it, and
  its update once a second (its status report, its Bokeh models, and the changes
  serialized as the dashboard's server sends them), each after a steady cycle;
- ``protect``: the 20-rule file with a ``protect:`` section, every task group given a
  measured compute time (a few milliseconds to ten minutes per task, by group): the
  cycles until the protected copies landed, then the steady cycle, the first cycle
  after 1% of the keys changed, and a status report, with the recompute estimates
  and the protect section's choice in them;
- ``spill``: the 20-rule file with a ``spill:`` section (``order: value``,
  ``drop-copies``), every worker reporting 90% of its memory target in use and 10% of its
  keys on disk (no worker runs the plugin: what it would report is fed to the
  section): the first cycle, the steady cycle (keys valued within the section's time
  slice, copies held elsewhere dropped from every worker) and a status report;
- ``adaptive``: what adaptive scaling's two questions cost the event loop:
  ``adaptive_target()`` and ``workers_to_close(n=half the workers)``, distributed's own
  (no policy attached) and with the 20-rule file and an ``adaptive:`` section (the
  target that counts memory, the guard over the governed classes, the order of leaving);
- ``transitions``: the scheduler's transition throughput on a 100k-task graph with
  and without amm-rules (its scheduler plugins and its wrappers of the scheduler's
  replica methods), and the cost of each plugin's transition hook alone (the index's
  and the memory flow's).

A cycle is ``ActiveMemoryManagerExtension.run_once()`` of a manager holding only the
policy measured, so the AMM's own work (reading worker memory, validating and grouping
suggestions) is included: it is what the event loop pays. Transfers are stubbed (the
state does not change between cycles), so repeated cycles measure the same work.

Usage, from the repository root:
``python -m benchmarks.scale [--quick] [--cycles N] [--profile] [--size KEYSxWORKERS]``

Prints a table and writes ``benchmarks/results/scale.json`` (``--quick``: 100k keys
and 100 workers only, a 20k-task graph for transitions).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import distributed
from distributed.active_memory_manager import ActiveMemoryManagerExtension, ReduceReplicas
from distributed.diagnostics.plugin import SchedulerPlugin

from amm_rules import RulesPolicy, load_ruleset
from amm_rules.engine.sections.adaptive import AdaptiveSection
from amm_rules.engine.sections.protect import ProtectSection
from amm_rules.observe.explain import explain_keys
from amm_rules.observe.metrics import RulesCollector
from amm_rules.observe.status import status_report
from benchmarks.support import scheduler_state

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "benchmarks" / "rules" / "scale.yaml"
#: The same rules with the per-key operands (size, key globs) replaced by group-level
#: ones (prefix, group, type): what a rules file reading only those costs.
GROUP_RULES = ROOT / "benchmarks" / "rules" / "scale-groups.yaml"
RESULTS = ROOT / "benchmarks" / "results" / "scale.json"
#: Only ``reduce-replicas`` (on by default): what the stock policy does, by amm-rules.
NO_RULES: dict[str, Any] = {"version": 1}
#: The protect section of the ``protect`` measurement: a budget the dearest groups fill.
PROTECT = """
protect:
  budget: 2 GiB
  min-recompute: 1s
"""
#: The spill section of the ``spill`` measurement: order by value, copies dropped.
SPILL = """
spill:
  order: value
  drop-copies: true
"""
#: In the ``spill`` measurement, every worker reports this share of its memory buffer's
#: target in use (above the section's drop threshold) and this share of its keys on disk.
SPILL_FULLNESS = 0.9
SPILL_ON_DISK = 0.1
#: The adaptive section of the ``adaptive`` measurement: every default.
ADAPTIVE = """
adaptive: {}
"""
#: Per-task compute seconds given to the groups for the ``protect`` measurement.
PROTECT_SECONDS = (0.005, 0.05, 0.5, 2.0, 30.0, 600.0)
#: Audit interval of the measured 20-rule policy: longer than any run, so that audits
#: come only where measure_audit asks for one.
AUDIT_NEVER_HERE = 3600.0

#: (keys in memory, workers)
FULL_SIZES = [(100_000, 100), (100_000, 1_000), (1_000_000, 100), (1_000_000, 1_000)]
QUICK_SIZES = [(100_000, 100)]

TARGET_STEADY_S = 0.020
TARGET_OBSERVE_S = 0.005
TARGET_HOOK_OVERHEAD = 0.05
#: The memory flow's transition hook (engine/state/flow.py): at most 3% of the throughput.
TARGET_FLOW_HOOK_OVERHEAD = 0.03


# ---------------------------------------------------------------------------------
# Timing helpers
# ---------------------------------------------------------------------------------


def summary(samples: list[float], **extra: Any) -> dict[str, Any]:
    """Median and p95 (nearest rank) of samples in seconds, plus the samples."""
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, max(0, round(0.95 * len(ordered) + 0.5) - 1))]
    return {
        "median_s": statistics.median(ordered),
        "p95_s": p95,
        "n": len(ordered),
        "samples_s": samples,
        **extra,
    }


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


class GcWatch:
    """Time spent in the cyclic garbage collector, and full collections, while active.

    A cycle that allocates much (a Suggestion and a set per dropped copy, the AMM's
    pending entries) triggers collections; a full one walks every object not frozen.
    Reported next to the times, so that a p95 far above the median can be read."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full = 0
        self._start = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start
            self.full += info["generation"] == 2

    def __enter__(self) -> GcWatch:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def report(self) -> dict[str, Any]:
        return {"gc_s": self.seconds, "gc_full_collections": self.full}


def new_manager(scheduler: Any, policy: Any) -> ActiveMemoryManagerExtension:
    """An ad-hoc AMM running only ``policy``, as ``retire_workers`` makes one."""
    return ActiveMemoryManagerExtension(scheduler, {policy}, register=False, start=False)


#: Policy id -> the scheduler plugins :func:`detach` removed (name, plugin).
_DETACHED: dict[int, list[tuple[str, Any]]] = {}


def _engine_plugins(scheduler: Any, policy: RulesPolicy) -> list[tuple[str, Any]]:
    """The scheduler plugins the policy added, as (name, plugin): the engine's one
    plugin (``ctx.hooks``); in engines before it, the index and whatever of the
    policy's sections the scheduler holds (the sections themselves, their attributes,
    the handlers' metadata keeper), each called on every transition."""
    hooks = getattr(getattr(policy, "ctx", None), "hooks", None)
    if hooks is not None:
        return [(n, p) for n, p in scheduler.plugins.items() if p is hooks]
    mine: list[Any] = [policy.index, getattr(policy, "flow", None)]
    for section in getattr(policy, "sections", ()):
        mine.append(section)
        mine.extend(vars(section).values())
    return [
        (n, p)
        for n, p in scheduler.plugins.items()
        if n == "amm-rules-handlers" or any(p is q for q in mine)
    ]


def detach(scheduler: Any, policy: RulesPolicy) -> None:
    """Remove the policy's scheduler plugins, so that they no longer see transitions,
    and switch off its other scheduler hooks (they stay installed but pass through)."""
    removed = _engine_plugins(scheduler, policy)
    for name, _ in removed:
        scheduler.remove_plugin(name=name)
    _DETACHED.setdefault(id(policy), []).extend(removed)
    policy.index.activate(False)


def reattach(scheduler: Any, policy: RulesPolicy) -> None:
    """Undo :func:`detach` (nothing to do if attached)."""
    for name, plugin in _DETACHED.pop(id(policy), []):
        scheduler.add_plugin(plugin, name=name)
    policy.index.activate(True)


def engine_digest() -> str:
    """A digest of the engine's source, to tie numbers to the code that produced them."""
    digest = hashlib.sha256()
    for path in sorted((ROOT / "amm_rules").rglob("*.py")):
        digest.update(path.relative_to(ROOT).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def cycles(
    state: scheduler_state.BenchState, manager: ActiveMemoryManagerExtension, n: int
) -> tuple[list[float], int, int]:
    """Run ``n`` cycles; return their times and what the last one asked for."""
    times = []
    copies = drops = 0
    for _ in range(n):
        state.transfers.clear()
        times.append(timed(manager.run_once))
        copies, drops = state.transfers.copies, state.transfers.drops
    state.transfers.clear()
    return times, copies, drops


def timed_cycles(
    state: scheduler_state.BenchState, manager: ActiveMemoryManagerExtension, n: int
) -> dict[str, Any]:
    with GcWatch() as watch:
        times, copies, drops = cycles(state, manager, n)
    return summary(times, copies=copies, drops=drops, **watch.report())


def settle(
    state: scheduler_state.BenchState, manager: ActiveMemoryManagerExtension, limit: int = 8
) -> int:
    """Let the policy's transfers land until it asks for nothing and has classified
    every key; return the cycles run."""
    for n in range(1, limit + 1):
        state.transfers.clear()
        manager.run_once()
        if not (state.transfers.acquire or state.transfers.remove or unclassified(manager)):
            return n
        state.transfers.apply(state.scheduler)
    raise RuntimeError(f"the policy still asks for transfers after {limit} cycles")


def unclassified(manager: ActiveMemoryManagerExtension) -> int:
    """Keys a RulesPolicy of the manager has left for its next cycles (its budget)."""
    return sum(p.index.unclassified for p in manager.policies if isinstance(p, RulesPolicy))


def catch_up(
    state: scheduler_state.BenchState, manager: ActiveMemoryManagerExtension
) -> dict[str, Any]:
    """Run cycles until the policy has classified every key in memory (the
    classification budget spreads the keys found at attach over several cycles)."""
    times = []
    while unclassified(manager):
        state.transfers.clear()
        times.append(timed(manager.run_once))
    state.transfers.clear()
    return {"cycles": len(times), "total_s": sum(times), "max_s": max(times, default=0.0)}


def governed(policy: RulesPolicy) -> int:
    return len(policy.index)


# ---------------------------------------------------------------------------------
# Measurements on one state
# ---------------------------------------------------------------------------------


def measure_attach(
    state: scheduler_state.BenchState,
) -> tuple[RulesPolicy, ActiveMemoryManagerExtension, dict]:
    """Attach the 20-rule policy to the state and run its first cycle."""
    scheduler = state.scheduler
    gc.collect()
    policy: RulesPolicy | None = None
    manager: ActiveMemoryManagerExtension | None = None

    def attach() -> None:
        nonlocal policy, manager
        policy = RulesPolicy(rules=RULES, audit_interval=AUDIT_NEVER_HERE)
        manager = new_manager(scheduler, policy)

    attach_s = timed(attach)
    assert policy is not None and manager is not None
    state.transfers.clear()
    first_s = timed(manager.run_once)
    copies, drops = state.transfers.copies, state.transfers.drops
    rest = catch_up(state, manager)
    out = {
        "attach_s": attach_s,
        "first_cycle_s": first_s,
        # Every cycle until all keys in memory were classified, the first included.
        "classified_after_cycles": 1 + rest["cycles"],
        "classify_total_s": first_s + rest["total_s"],
        "classify_max_cycle_s": max(first_s, rest["max_s"]),
        "governed_keys": governed(policy),
        "copies": copies,
        "drops": drops,
    }
    return policy, manager, out


def measure_governed(
    state: scheduler_state.BenchState, manager: ActiveMemoryManagerExtension, policy: RulesPolicy
) -> dict[str, Any]:
    """Time to govern every key in memory entering memory at once: each key is taken
    out of the settled policy's index and handed to its transition hook as it enters
    memory (``processing -> memory``), exactly what the hook sees when a computation
    of that many chunks finishes; then cycles run, at the policy's default budget,
    until every key is classified and filed. Reports the cycles, their total time and
    the slowest, and the time per key."""
    index = policy.index
    keys = [k for k, ts in state.scheduler.tasks.items() if ts.state == "memory"]
    for key in keys:
        index.forget(key)
    for key in keys:
        index.transition(key, "processing", "memory")
    gc.collect()
    times = []
    cycles_cpu = []
    cpu = time.thread_time()
    with GcWatch() as watch:
        while index.unclassified:
            state.transfers.clear()
            before = time.thread_time()
            times.append(timed(manager.run_once))
            cycles_cpu.append(time.thread_time() - before)
    cpu = time.thread_time() - cpu
    copies, drops = state.transfers.copies, state.transfers.drops
    state.transfers.clear()
    n = len(keys)
    return {
        "keys": n,
        "governed_keys": governed(policy),
        "cycles": len(times),
        "total_s": sum(times),
        "max_cycle_s": max(times, default=0.0),
        "us_per_key": sum(times) / n * 1e6,
        # The processor time of this thread: what the cycles cost when the machine is
        # shared and the process waits for a core (the budget is wall-clock time).
        "cpu_s": cpu,
        "cpu_us_per_key": cpu / n * 1e6,
        "samples_s": times,
        # Each cycle's processor time (the elapsed time of a cycle on a shared machine
        # includes the time the process waited for a core).
        "samples_cpu_s": cycles_cpu,
        "copies": copies,
        "drops": drops,
        **watch.report(),
    }


def measure_governed_groups(
    state: scheduler_state.BenchState, main: RulesPolicy
) -> dict[str, Any]:
    """:func:`measure_governed` for the group-level rules file, on a policy of its own
    (the main policy is detached meanwhile, then attached again)."""
    scheduler = state.scheduler
    detach(scheduler, main)
    policy = RulesPolicy(rules=GROUP_RULES, audit_interval=AUDIT_NEVER_HERE)
    manager = new_manager(scheduler, policy)
    settle(state, manager, limit=200)
    out = measure_governed(state, manager, policy)
    detach(scheduler, policy)
    reattach(scheduler, main)
    return out


def measure_audit(
    state: scheduler_state.BenchState, manager: ActiveMemoryManagerExtension, policy: RulesPolicy
) -> dict[str, Any]:
    """The cycles of one audit sweep (each checks up to 1,000 governed and 1,000
    replicated keys) on the steady state. The policy's own sweeps are an hour apart, so
    that none lands in the other timed cycles (by default one starts every minute).
    On this state the sweep must find nothing to repair."""
    times = []
    auditor = policy.auditor
    auditor.next_sweep = 0.0  # due now; the next one is an hour away
    sweeps = auditor.sweeps
    with GcWatch() as watch:
        while auditor.sweeps == sweeps:
            state.transfers.clear()
            times.append(timed(manager.run_once))
    copies, drops = state.transfers.copies, state.transfers.drops
    state.transfers.clear()
    return summary(
        times, copies=copies, drops=drops, found=dict(auditor.last or {}), **watch.report()
    )


def measure_observe(
    state: scheduler_state.BenchState,
    manager: ActiveMemoryManagerExtension,
    policy: RulesPolicy,
    n: int,
) -> dict[str, Any]:
    """Status, scrape and explain on the steady state, ``n`` times each, interleaved;
    then ``n`` steady cycles, each after a scrape."""
    import prometheus_client

    registry = prometheus_client.CollectorRegistry(auto_describe=False)
    collector = RulesCollector()
    collector.policies.append(policy)
    registry.register(collector)
    key = next(iter(next(iter(policy.index.governed.groups.values()))))
    times: dict[str, list[float]] = {"status": [], "scrape": [], "explain": []}
    sizes = {}
    for _ in range(n):
        gc.collect()
        start = time.perf_counter()
        report = status_report(policy)
        times["status"].append(time.perf_counter() - start)
        start = time.perf_counter()
        text = prometheus_client.generate_latest(registry)
        times["scrape"].append(time.perf_counter() - start)
        start = time.perf_counter()
        explain_keys(policy, [key])
        times["explain"].append(time.perf_counter() - start)
        sizes = {"status_json_bytes": len(json.dumps(report)), "scrape_bytes": len(text)}
    cycle_times = []
    with GcWatch() as watch:
        for _ in range(n):
            prometheus_client.generate_latest(registry)
            state.transfers.clear()
            cycle_times.append(timed(manager.run_once))
    copies, drops = state.transfers.copies, state.transfers.drops
    state.transfers.clear()
    after = summary(cycle_times, copies=copies, drops=drops, **watch.report())
    return {
        "status": summary(times["status"]),
        "scrape": summary(times["scrape"]),
        "explain_one_key": summary(times["explain"]),
        "steady_after_scrapes": after,
        "fraction": report["conformance"]["fraction"],
        **sizes,
    }


def measure_page(
    state: scheduler_state.BenchState,
    manager: ActiveMemoryManagerExtension,
    n: int,
) -> dict[str, Any]:
    """The dashboard page (``/amm-rules``), as the dashboard's Bokeh server runs it for
    one open browser tab: opening it (building its models, its first update, the
    document sent whole), then ``n`` updates, each after a steady cycle (so the report
    changes as it does live), each timed with its changes serialized as the server
    sends them (one ``PATCH-DOC`` message per change). Every update makes its own
    status report (several open tabs would share one)."""
    from bokeh.document import Document
    from bokeh.protocol import Protocol

    from amm_rules.observe import dashboard, status

    protocol = Protocol()
    events: list[Any] = []
    gc.collect()
    start = time.perf_counter()
    page = dashboard.RulesPage(state.scheduler)
    page.update()
    doc = Document()
    doc.add_root(page.root)
    whole = _message_bytes(protocol.create("PULL-DOC-REPLY", "open", doc))
    open_s = time.perf_counter() - start
    assert page.rules.source.data["rule"], "the page found no policy"
    doc.on_change(events.append)
    update_times, send_times, sent, changes = [], [], [], []
    for _ in range(n):
        state.transfers.clear()
        manager.run_once()
        status._shared.clear()
        events.clear()
        gc.collect()
        start = time.perf_counter()
        page.update()
        update_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        messages = [protocol.create("PATCH-DOC", [event]) for event in events]
        send_times.append(time.perf_counter() - start)
        sent.append(sum(_message_bytes(m) for m in messages))
        changes.append(len(events))
    state.transfers.clear()
    # For scale: dask's own chart of memory per worker, opened on the same scheduler
    # (its /status page needs worker heartbeats, which this state has not).
    from distributed.dashboard.components.scheduler import WorkersMemory, individual_doc

    gc.collect()
    start = time.perf_counter()
    individual_doc(WorkersMemory, 100)(state.scheduler, {}, Document())
    dask_memory_open_s = time.perf_counter() - start
    return {
        "dask_workers_memory_open_s": dask_memory_open_s,
        "open_s": open_s,
        "open_bytes": whole,
        "update": summary(update_times),
        "patch": summary(send_times),
        "patch_bytes_median": statistics.median(sent),
        "changes_median": statistics.median(changes),
    }


def _message_bytes(message: Any) -> int:
    parts = (message.header_json, message.metadata_json, message.content_json)
    return sum(map(len, parts)) + sum(len(b.data) for b in message.buffers)


def measure_memory(state: scheduler_state.BenchState) -> dict[str, Any]:
    """Bytes allocated by attaching a RulesPolicy and running its first cycle, per
    governed key (tracemalloc; the policy is detached afterwards)."""
    scheduler = state.scheduler
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    policy = RulesPolicy(rules=RULES, audit_interval=None)
    manager = new_manager(scheduler, policy)
    manager.run_once()
    catch_up(state, manager)
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    state.transfers.clear()
    n = governed(policy)
    detach(scheduler, policy)
    held = after - before
    return {"bytes": held, "governed_keys": n, "bytes_per_governed_key": held / n if n else None}


def measure_reduce_only(
    state: scheduler_state.BenchState, stock: ActiveMemoryManagerExtension, n_cycles: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """RulesPolicy without rules (only reduce-replicas) and the stock ReduceReplicas,
    on the steady state, cycle for cycle in ABBA order: the two do the same work, and
    on a shared machine the load drifts between two runs in a row; interleaving puts
    both under the same load. Returns (reduce-replicas only, stock)."""
    policy = RulesPolicy(rules=NO_RULES, audit_interval=None)
    manager = new_manager(state.scheduler, policy)
    state.transfers.clear()
    first_s = timed(manager.run_once)
    rest = catch_up(state, manager)
    order = [(manager, stock), (stock, manager)]
    times: dict[Any, list[float]] = {manager: [], stock: []}
    watches = {manager: GcWatch(), stock: GcWatch()}
    asked: dict[Any, tuple[int, int]] = {}
    for n in range(n_cycles):
        for m in order[n % 2]:
            state.transfers.clear()
            # Every sample starts from the same collector state. Otherwise the
            # collections a cycle triggers depend on what the cycle before it (the other
            # policy's) left in the young generations: with seconds-long full
            # collections at a million keys, that decides the ranking of two policies
            # doing the same work more than the policies do.
            gc.collect()
            with watches[m]:
                times[m].append(timed(m.run_once))
            asked[m] = (state.transfers.copies, state.transfers.drops)
    state.transfers.clear()
    detach(state.scheduler, policy)

    def result(m: ActiveMemoryManagerExtension) -> dict[str, Any]:
        copies, drops = asked[m]
        return summary(times[m], copies=copies, drops=drops, **watches[m].report())

    # Each round runs both on the same state under about the same load: the median of
    # the per-round ratios is less noisy than the ratio of the medians.
    ratios = [a / b for a, b in zip(times[manager], times[stock], strict=True)]
    reduce_only = {
        **result(manager),
        "paired_ratio_median": statistics.median(ratios),
        "paired_ratios": ratios,
        "first_cycle_s": first_s,
        "classify_total_s": first_s + rest["total_s"],
        "classified_after_cycles": 1 + rest["cycles"],
    }
    return reduce_only, result(stock)


def measure_changed(
    state: scheduler_state.BenchState,
    manager: ActiveMemoryManagerExtension,
    stock: ActiveMemoryManagerExtension,
    rounds: int,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """1% of the keys change, then one RulesPolicy cycle and one stock cycle; the
    requested transfers then land, the new keys are released, and the next round
    starts from the steady state again."""
    n_keys = len(state.keys)
    n_new = n_lost = max(1, n_keys // 200)
    rules_times: list[float] = []
    stock_times: list[float] = []
    asked: dict[str, int] = {"copies": 0, "drops": 0, "stock_drops": 0}
    rules_gc, stock_gc = GcWatch(), GcWatch()
    for r in range(rounds):
        keys = scheduler_state.new_key_names(state, n_new)
        scheduler_state.compute_keys(state, keys, stimulus=f"changed-{r}")
        scheduler_state.lose_copies(state, n_lost, seed=r)
        state.transfers.clear()
        gc.collect()
        with rules_gc:
            rules_times.append(timed(manager.run_once))
        requested = state.transfers.take()
        asked["copies"] += requested.copies
        asked["drops"] += requested.drops
        with stock_gc:
            stock_times.append(timed(stock.run_once))
        asked["stock_drops"] += state.transfers.take().drops
        # Back to the steady state, untimed.
        requested.apply(state.scheduler)
        settle(state, manager)
        scheduler_state.release_keys(state, keys, stimulus=f"changed-{r}")
        settle(state, manager)
    per_round = {k: v / rounds for k, v in asked.items()}
    return (
        summary(
            rules_times,
            new_keys=n_new,
            lost_copies=n_lost,
            copies=per_round["copies"],
            drops=per_round["drops"],
            **rules_gc.report(),
        ),
        summary(stock_times, drops=per_round["stock_drops"], **stock_gc.report()),
    )


def timed_status(policy: RulesPolicy, n: int) -> tuple[list[float], dict[str, Any]]:
    """``n`` status reports, each timed after a collection; the last report."""
    times = []
    report: dict[str, Any] = {}
    for _ in range(n):
        gc.collect()
        start = time.perf_counter()
        report = status_report(policy)
        times.append(time.perf_counter() - start)
    return times, report


def measure_protect(state: scheduler_state.BenchState, n: int, rounds: int) -> dict[str, Any]:
    """The ``protect`` rows (see the module docstring): a policy of its own on the
    state, alone (the caller detached the others), removed afterwards with the copies it
    made. The groups keep their compute times: the last measurement of a state."""
    scheduler = state.scheduler
    for i, group in enumerate(scheduler.task_groups.values()):
        # What the scheduler adds up from the task-finished messages of the group.
        done = max(1, sum(group.states.values()))
        group.add_duration("compute", 0.0, done * PROTECT_SECONDS[i % len(PROTECT_SECONDS)])
    tmp = tempfile.TemporaryDirectory()  # the policy watches its file: kept until detached
    rules = Path(tmp.name) / "scale-protect.yaml"
    rules.write_text(RULES.read_text() + PROTECT)
    policy = RulesPolicy(rules=rules, audit_interval=AUDIT_NEVER_HERE)
    manager = new_manager(scheduler, policy)
    added: list[tuple[str, Any]] = []
    try:
        state.transfers.clear()
        first_s = timed(manager.run_once)
        landing = 1
        requested = state.transfers.take()
        section = policy.section(ProtectSection)
        # Every copy asked for lands before the next cycle (while keys are classified
        # too), until a cycle asks for none and the section has seen every copy land.
        while landing < 500 and (
            requested.acquire
            or requested.remove
            or unclassified(manager)
            or section.short
            or section.status()["choosing"]
        ):
            added += [(addr, key) for addr, keys in requested.acquire for key in keys]
            requested.apply(scheduler)
            landing += 1
            manager.run_once()
            requested = state.transfers.take()
        steady = timed_cycles(state, manager, n)
        times, report = timed_status(policy, n)
        protect = report.get("protect") or {}
        recompute = report.get("recompute") or {}
        changed_times = []
        n_new = n_lost = max(1, len(state.keys) // 200)
        for r in range(rounds):
            keys = scheduler_state.new_key_names(state, n_new)
            scheduler_state.compute_keys(state, keys, stimulus=f"protect-{r}")
            scheduler_state.lose_copies(state, n_lost, seed=100 + r)
            state.transfers.clear()
            gc.collect()
            changed_times.append(timed(manager.run_once))
            state.transfers.take().apply(scheduler)
            scheduler_state.release_keys(state, keys, stimulus=f"protect-{r}")
            for _ in range(100):
                state.transfers.clear()
                manager.run_once()
                requested = state.transfers.take()
                if not (
                    requested.acquire
                    or requested.remove
                    or section.short
                    or section.status()["choosing"]
                ):
                    break
                requested.apply(scheduler)
        return {
            "first_cycle_s": first_s,
            "landed_after_cycles": landing,
            "choice_cycles": section.status()["choice_cycles"],
            "steady": steady,
            "status": summary(times),
            "status_json_bytes": len(json.dumps(report)),
            "changed": summary(changed_times, new_keys=n_new, lost_copies=n_lost),
            "protected_keys": protect.get("keys", 0),
            "protected_bytes": protect.get("held_bytes", 0),
            "seconds_protected": protect.get("seconds_protected", 0.0),
            "seconds_at_risk": recompute.get("total_seconds", 0.0),
            "groups_known": recompute.get("groups_known", 0),
        }
    finally:
        policy.detach()
        tmp.cleanup()
        state.transfers.clear()
        state.transfers.remove += [(addr, [key]) for addr, key in added]
        state.transfers.apply(scheduler)


class _Stream:
    """A worker's stream from the scheduler, counting what the spill section sends
    (a BatchedSend's ``send`` appends to a buffer: so does this)."""

    def __init__(self) -> None:
        self.messages = 0
        self.values = 0

    def send(self, msg: dict[str, Any]) -> None:
        self.messages += 1
        self.values += len(msg.get("values", ()))


def measure_spill(
    state: scheduler_state.BenchState, n: int, without: ActiveMemoryManagerExtension
) -> dict[str, Any]:
    """The ``spill`` rows: the 20-rule file with a ``spill:`` section (order by value,
    drop-copies), every worker reporting :data:`SPILL_FULLNESS` of its target in use and
    :data:`SPILL_ON_DISK` of its keys on disk: each cycle values keys (its time slice)
    and looks for copies to drop on every worker. No worker runs the plugin here: what
    it would report is fed to the section. Its steady cycles are interleaved with those
    of ``without`` (the same rules without the section, on the same state), in wall and
    CPU time (a loaded machine takes the CPU from either alike)."""
    from amm_rules.engine.sections.spill import SpillSection

    scheduler = state.scheduler
    tmp = tempfile.TemporaryDirectory()
    rules = Path(tmp.name) / "scale-spill.yaml"
    rules.write_text(RULES.read_text() + SPILL)
    policy = RulesPolicy(rules=rules, audit_interval=AUDIT_NEVER_HERE)
    section = policy.section(SpillSection)
    section.installed = ("value", False)  # no worker to install the plugin on
    streams = {address: _Stream() for address in scheduler.workers}
    saved = dict(scheduler.stream_comms)
    scheduler.stream_comms.update(streams)
    manager = new_manager(scheduler, policy)
    try:
        catch_up(state, manager)
        target = 2**30
        for address, ws in scheduler.workers.items():
            keys = list(ws.has_what)
            on_disk = keys[: int(len(keys) * SPILL_ON_DISK)]
            section.on_report(
                worker=address,
                spilled=[(ts.key, 10.0, ts.nbytes) for ts in on_disk],
                fast=SPILL_FULLNESS * target,
                target=target,
                order="value",
            )
        first = timed(manager.run_once)
        steady, others, paired = interleaved(state, manager, without, n)
        times, report = timed_status(policy, n)
        return {
            "first_cycle_s": first,
            "steady": steady,
            "steady_without": others,
            "paired": paired,
            "status_json_bytes": len(json.dumps(report)),
            "status": summary(times),
            "keys_on_disk": len(policy.ctx.spilled),
            "values_sent": sum(st.values for st in streams.values()),
            "messages": sum(st.messages for st in streams.values()),
            "drops_per_cycle": steady.get("drops", 0),
            "load": os.getloadavg()[0],
        }
    finally:
        policy.detach()
        tmp.cleanup()
        for address in streams:
            scheduler.stream_comms.pop(address, None)
        scheduler.stream_comms.update(saved)
        state.transfers.clear()


def interleaved(
    state: scheduler_state.BenchState,
    manager: ActiveMemoryManagerExtension,
    other: ActiveMemoryManagerExtension,
    n: int,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``n`` cycles of ``manager`` and of ``other`` in turn: each one's summary (wall
    time, and CPU time of the thread: ``cpu_median_s``), and the medians of the paired
    differences (``manager``'s cycle minus the ``other`` cycle before it)."""
    runs: dict[str, list[float]] = {"wall": [], "cpu": [], "other_wall": [], "other_cpu": []}
    drops = 0
    with GcWatch() as watch:
        for _ in range(n):
            for m, prefix in ((other, "other_"), (manager, "")):
                state.transfers.clear()
                cpu = time.thread_time()
                runs[prefix + "wall"].append(timed(m.run_once))
                runs[prefix + "cpu"].append(time.thread_time() - cpu)
            drops = state.transfers.drops
    state.transfers.clear()
    mine = summary(runs["wall"], drops=drops, cpu_median_s=statistics.median(runs["cpu"]))
    mine.update(watch.report())
    others = summary(runs["other_wall"], cpu_median_s=statistics.median(runs["other_cpu"]))
    paired = {
        "wall_median_s": statistics.median(
            a - b for a, b in zip(runs["wall"], runs["other_wall"], strict=True)
        ),
        "cpu_median_s": statistics.median(
            a - b for a, b in zip(runs["cpu"], runs["other_cpu"], strict=True)
        ),
    }
    return mine, others, paired


def measure_adaptive(state: scheduler_state.BenchState, n: int) -> dict[str, Any]:
    """The ``adaptive`` rows (see the module docstring): distributed's answers first (the
    caller attached no policy yet), then a policy of its own with the section, once
    every key in memory is classified; detached afterwards (its plugins and wrappers
    gone)."""
    scheduler = state.scheduler
    half = max(1, len(scheduler.workers) // 2)

    def calls(fn: Callable[[], Any]) -> dict[str, Any]:
        times = []
        for _ in range(n):
            gc.collect()
            times.append(timed(fn))
        return summary(times)

    out: dict[str, Any] = {
        "stock_target": calls(scheduler.adaptive_target),
        "stock_close": calls(lambda: scheduler.workers_to_close(n=half)),
    }
    tmp = tempfile.TemporaryDirectory()  # the policy watches its file: kept until detached
    rules = Path(tmp.name) / "scale-adaptive.yaml"
    rules.write_text(RULES.read_text() + ADAPTIVE)
    policy = RulesPolicy(rules=rules, audit_interval=AUDIT_NEVER_HERE)
    manager = new_manager(scheduler, policy)
    try:
        state.transfers.clear()
        manager.run_once()
        for _ in range(500):
            if not unclassified(manager):
                break
            manager.run_once()
        state.transfers.clear()
        out["target"] = calls(scheduler.adaptive_target)
        out["close"] = calls(lambda: scheduler.workers_to_close(n=half))
        report = policy.section(AdaptiveSection).status()
        out["kept"] = len(report["kept"])
        out["half"] = half
        return out
    finally:
        policy.detach()
        tmp.cleanup()
        state.transfers.clear()


def measure_state(n_keys: int, n_workers: int, args: argparse.Namespace) -> dict[str, Any]:
    return asyncio.run(_measure_state(n_keys, n_workers, args))


async def _measure_state(n_keys: int, n_workers: int, args: argparse.Namespace) -> dict[str, Any]:
    ruleset = load_ruleset(RULES)
    out: dict[str, Any] = {"keys": n_keys, "workers": n_workers}
    log(f"{n_keys:,} keys, {n_workers:,} workers: building the state")
    start = time.perf_counter()
    state = await scheduler_state.build_state(n_keys, n_workers, ruleset)
    out["build_s"] = time.perf_counter() - start
    # A full collection walks every object of the process: at a million keys it takes
    # seconds, whoever triggered it. Freezing the built state keeps that cost, which
    # belongs to the scheduler's heap and not to a policy, from landing at random in
    # timed cycles; collections of what a policy allocates are still counted (gc_s).
    gc.collect()
    gc.freeze()
    out["census"] = dict(state.census)
    scheduler = state.scheduler
    big = n_keys >= 1_000_000
    n_cycles = args.cycles
    n_stock = n_cycles
    try:
        # First, while no policy ever attached: distributed's own answers are its own.
        if not args.only_spill:
            log("  adaptive: the target and the choice of workers to close")
            out["adaptive"] = measure_adaptive(state, n_cycles)
        log("  attach + first cycle")
        policy, manager, out["attach"] = measure_attach(state)
        log("  steady cycles")
        out["steady"] = timed_cycles(state, manager, n_cycles)
        if args.only_spill:
            detach(scheduler, policy)
            log("  spill: keys valued and copies dropped on every worker")
            out["spill"] = measure_spill(state, n_cycles, manager)
            return out
        log("  audit cycles")
        out["audit"] = measure_audit(state, manager, policy)
        log("  status, scrape, explain")
        out["observe"] = measure_observe(state, manager, policy, n_cycles)
        log("  dashboard page")
        out["page"] = measure_page(state, manager, n_cycles)
        log("  time to govern every key entering memory at once: per-key rules")
        out["governed_per_key"] = measure_governed(state, manager, policy)
        log("  time to govern every key entering memory at once: group-level rules")
        out["governed_groups"] = measure_governed_groups(state, policy)
        if args.profile:
            out["profile"] = profile_cycle(manager)
        log("  reduce-replicas only and stock ReduceReplicas, interleaved")
        stock = new_manager(scheduler, ReduceReplicas())
        detach(scheduler, policy)  # one plugin at a time
        out["reduce_only"], out["stock_steady"] = measure_reduce_only(state, stock, n_stock)
        reattach(scheduler, policy)
        log("  1% of keys changed")
        out["changed"], out["stock_changed"] = measure_changed(
            state, manager, stock, min(args.rounds, 2) if big else args.rounds
        )
        detach(scheduler, policy)
        if args.memory == "all" or (args.memory == "first" and not args.memory_done):
            log("  memory (tracemalloc)")
            out["memory"] = measure_memory(state)
            args.memory_done = True
        log("  spill: keys valued and copies dropped on every worker")
        out["spill"] = measure_spill(state, n_cycles, manager)
        log("  protect: recompute costs and a budget of copies")
        out["protect"] = measure_protect(
            state, n_cycles, min(args.rounds, 2) if big else args.rounds
        )

    finally:
        await scheduler.close()
        gc.unfreeze()
    return out


# ---------------------------------------------------------------------------------
# Transition throughput
# ---------------------------------------------------------------------------------


def measure_transitions(n_tasks: int, repeats: int) -> dict[str, Any]:
    return asyncio.run(_measure_transitions(n_tasks, repeats))


async def _measure_transitions(n_tasks: int, repeats: int) -> dict[str, Any]:
    """Throughput of the scheduler's transitions on an ``n_tasks`` graph, with and
    without amm-rules, in ABBA order to cancel drift.

    On its own state (100k keys, 100 workers), so that exactly one RulesPolicy has
    ever been attached: "without" removes its plugin and its wrappers of the
    scheduler's methods (``add_replica``...), "with" puts them back.

    Each run submits ``n_tasks / 2`` chains of two tasks through
    ``_create_taskstate_from_graph`` (update_graph's own code), answers every
    ``compute-task`` message with ``handle_task_finished`` as a worker would, then has
    the client release the results: every key goes released -> waiting -> processing
    -> memory -> released -> forgotten, on the scheduler's real code, with the
    scheduler's own plugins (work stealing, shuffle) installed in both cases.
    """
    state = await scheduler_state.build_state(100_000, 100, load_ruleset(RULES))
    scheduler = state.scheduler
    gc.collect()
    gc.freeze()
    try:
        before = dict(vars(scheduler))
        policy = RulesPolicy(rules=RULES, audit_interval=None)
        new_manager(scheduler, policy).run_once()
        wrappers = {
            name: value
            for name, value in vars(scheduler).items()
            if callable(value) and before.get(name) is not value
        }

        def amm_rules(on: bool) -> None:
            for name, value in wrappers.items():
                if on:
                    setattr(scheduler, name, value)
                elif name in before:
                    setattr(scheduler, name, before[name])
                elif name in vars(scheduler):
                    delattr(scheduler, name)  # the class's own method shows through
            (reattach if on else detach)(scheduler, policy)

        rates: dict[str, list[float]] = {"without": [], "with": []}
        counts: list[int] = []
        for r in range(repeats):
            # ABBA order: consecutive runs on this machine alternate fast and slow
            # (seen without any plugin), and drift; ABBA cancels both.
            for mode in ("without", "with") if r % 2 == 0 else ("with", "without"):
                amm_rules(mode == "with")
                keys = scheduler_state.new_key_names(state, n_tasks // 2)
                gc.collect()
                start = time.perf_counter()
                n = scheduler_state.compute_keys(state, keys, chains=True, stimulus=f"tput-{r}")
                n += scheduler_state.release_keys(state, keys, stimulus=f"tput-{r}")
                elapsed = time.perf_counter() - start
                rates[mode].append(n / elapsed)
                counts.append(n)
        amm_rules(False)
        hooks = hook_cost(state, policy, n_tasks)
    finally:
        await scheduler.close()
        gc.unfreeze()
    without = statistics.median(rates["without"])
    with_ = statistics.median(rates["with"])
    # Runs of the same work vary by 10-15% on a shared 2-core machine: compare each
    # run with amm-rules to the run without it just before, and take the median.
    paired = statistics.median(
        w / wo for w, wo in zip(rates["with"], rates["without"], strict=True)
    )
    return {
        "tasks": n_tasks,
        "transitions_per_run": counts[0],
        "wrapped_methods": sorted(wrappers),
        "without_per_s": without,
        "with_per_s": with_,
        "samples_without_per_s": rates["without"],
        "samples_with_per_s": rates["with"],
        "overhead": 1 - paired,
        # The engine's hooks as the scheduler calls them, the index's alone, and the
        # memory flow's share (see hook_cost): seconds per transition, and their share
        # of the scheduler's throughput without amm-rules.
        **hooks,
        "hook_overhead": hooks["hook_s_per_transition"] * without,
        "index_hook_overhead": hooks["index_hook_s_per_transition"] * without,
        "flow_hook_overhead": _times(hooks["flow_hook_s_per_transition"], without),
        "flow_plugin_overhead": _times(hooks["flow_plugin_s_per_transition"], without),
        "two_plugins_flow_share_overhead": _times(
            hooks["two_plugins_flow_share_s_per_transition"], without
        ),
        "hooks_overhead": hooks["hook_s_per_transition"] * without,
    }


class _Recorder(SchedulerPlugin):
    """A scheduler plugin keeping every ``transition`` call as the scheduler made it,
    and each task as it was (its prefix and size stay on the object once forgotten)."""

    def __init__(self, tasks: Any) -> None:
        self.calls: list[tuple[Any, str, str, dict[str, Any]]] = []
        self.tasks: dict[Any, Any] = {}
        self._live = tasks

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        self.calls.append((key, start, finish, kwargs))
        ts = self._live.get(key)
        if ts is not None:
            self.tasks[key] = ts


def _times(a: float | None, b: float) -> float | None:
    return None if a is None else a * b


#: Replays of the recorded calls per way of calling the hooks (see hook_cost).
HOOK_REPEATS = 9


def hook_cost(
    state: scheduler_state.BenchState, policy: RulesPolicy, n_tasks: int
) -> dict[str, Any]:
    """Processor seconds per transition of the engine's ``transition`` hooks.

    The calls of one (untimed) run of the graph are recorded with their arguments, then
    replayed, calling each hook as ``_transition`` does, on fresh objects reading the
    recorded tasks, in :data:`HOOK_REPEATS` interleaved rounds of:

    - ``engine``: what the scheduler calls, the policy's plugins as attached (the index,
      feeding the memory flow where the engine does so; else the index, then the flow
      as a plugin of its own);
    - ``index``: the index's hook alone, without a memory flow;
    - ``flow_plugin``: the memory flow alone, as a scheduler plugin of its own (None
      where the engine has no flow);
    - ``two_plugins``: the index, then the flow as a plugin of its own, on each
      transition (how engines before the index fed the flow called them).

    Returns the medians per transition (``hook_s_per_transition`` is ``engine``), the
    flow's share (``engine`` minus ``index``) and the samples. A steadier estimate of
    the overhead than the difference of two noisy throughputs; it leaves out the
    scheduler's loop over its plugins, a few tens of nanoseconds per plugin."""
    scheduler = state.scheduler
    recorder = _Recorder(scheduler.tasks)
    scheduler.add_plugin(recorder, name="bench-recorder")
    keys = scheduler_state.new_key_names(state, n_tasks // 2)
    scheduler_state.compute_keys(state, keys, chains=True, stimulus="record")
    scheduler_state.release_keys(state, keys, stimulus="record")
    scheduler.remove_plugin(name="bench-recorder")
    calls = recorder.calls
    flow = getattr(policy, "flow", None)
    fed = flow is not None and getattr(policy.index, "flow", None) is flow

    costs = getattr(policy.index, "costs", None)

    def index(with_flow: bool) -> Any:
        out = type(policy.index)()
        out.attach(recorder.tasks)  # the hook reads the task of a key entering memory
        if with_flow:
            out.follow_flow(type(flow)(recorder.tasks))
        if costs is not None:
            out.follow_costs(type(costs)())  # the recompute costs, as the engine feeds them
        return out

    def engine() -> list[Callable[..., None]]:
        if fed:
            return [index(True).transition]
        hooks = [index(False).transition]
        return hooks + ([type(flow)(recorder.tasks).transition] if flow is not None else [])

    def flow_plugin() -> list[Callable[..., None]]:
        return [type(flow)(recorder.tasks).transition]

    ways: dict[str, Callable[[], list[Callable[..., None]]]] = {
        "engine": engine,
        "index": lambda: [index(False).transition],
    }
    if flow is not None:
        ways["flow_plugin"] = flow_plugin
        ways["two_plugins"] = lambda: [index(False).transition, *flow_plugin()]
    samples: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(HOOK_REPEATS):
        for name, make in ways.items():
            hooks = make()
            gc.collect()
            start = time.process_time()
            _replay(calls, hooks)
            samples[name].append((time.process_time() - start) / max(1, len(calls)))
    median = {name: statistics.median(values) for name, values in samples.items()}
    two = median.get("two_plugins")
    return {
        "hook_s_per_transition": median["engine"],
        "index_hook_s_per_transition": median["index"],
        "flow_fed_by_index": fed,
        # The flow's share: what the engine's hooks cost more than the index's alone.
        "flow_hook_s_per_transition": None if flow is None else median["engine"] - median["index"],
        "flow_plugin_s_per_transition": median.get("flow_plugin"),
        # The index, then the flow as a plugin of its own, on each transition.
        "two_plugins_s_per_transition": two,
        "two_plugins_flow_share_s_per_transition": None if two is None else two - median["index"],
        "hook_repeats": HOOK_REPEATS,
        "hook_samples_s_per_transition": samples,
    }


def _replay(calls: list[tuple[Any, str, str, dict[str, Any]]], hooks: list[Any]) -> None:
    """Call the hooks on each recorded transition, one after the other, as the
    scheduler calls its plugins."""
    if len(hooks) == 1:
        (hook,) = hooks
        for key, begin, finish, kwargs in calls:
            hook(key, begin, finish, **kwargs)
        return
    for key, begin, finish, kwargs in calls:
        for hook in hooks:
            hook(key, begin, finish, **kwargs)


# ---------------------------------------------------------------------------------
# Profiling
# ---------------------------------------------------------------------------------


def profile_cycle(manager: ActiveMemoryManagerExtension) -> str | None:
    """pyinstrument's text profile of three steady cycles, if pyinstrument is installed."""
    try:
        from pyinstrument import Profiler
    except ImportError:
        return None
    profiler = Profiler(interval=0.0005)
    profiler.start()
    for _ in range(3):
        manager.run_once()
    profiler.stop()
    text = profiler.output_text(unicode=False, color=False)
    print(text)
    return text


# ---------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------


def ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:,.1f}"


def table(results: list[dict[str, Any]], t: dict[str, Any] | None) -> str:
    head = (
        f"{'keys':>9} {'workers':>7} {'governed':>8} | "
        f"{'measurement':<34} {'median ms':>10} {'p95 ms':>10} {'asked':>16}"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        label = f"{r['keys']:>9,} {r['workers']:>7,} {r['attach']['governed_keys']:>8,} | "
        pad = " " * (len(label) - 2) + "| "
        rows = [
            ("RulesPolicy attach (constructor)", r["attach"]["attach_s"], None, ""),
            ("RulesPolicy first cycle", r["attach"]["first_cycle_s"], None, asked(r["attach"])),
            ("RulesPolicy classifying, all cycles", r["attach"]["classify_total_s"], r["attach"]["classify_max_cycle_s"], f"{r['attach']['classified_after_cycles']} cycles"),
            ("RulesPolicy steady", r["steady"]["median_s"], r["steady"]["p95_s"], asked(r["steady"])),
            ("all keys enter memory: group-level", r["governed_groups"]["total_s"], r["governed_groups"]["max_cycle_s"], per_key(r["governed_groups"])),
            ("all keys enter memory: per-key", r["governed_per_key"]["total_s"], r["governed_per_key"]["max_cycle_s"], per_key(r["governed_per_key"])),
            ("RulesPolicy audit sweep, per cycle", r["audit"]["median_s"], r["audit"]["p95_s"], found(r["audit"])),
            ("status report", r["observe"]["status"]["median_s"], r["observe"]["status"]["p95_s"], f"{r['observe']['status_json_bytes']:,} B json"),
            ("Prometheus scrape (amm-rules)", r["observe"]["scrape"]["median_s"], r["observe"]["scrape"]["p95_s"], f"{r['observe']['scrape_bytes']:,} B"),
            ("explain one governed key", r["observe"]["explain_one_key"]["median_s"], r["observe"]["explain_one_key"]["p95_s"], ""),
            ("dashboard page, opened", r["page"]["open_s"], None, f"{r['page']['open_bytes']:,} B doc"),
            ("  (dask's workers memory, opened)", r["page"]["dask_workers_memory_open_s"], None, ""),
            ("dashboard page update, per second", r["page"]["update"]["median_s"], r["page"]["update"]["p95_s"], f"{r['page']['changes_median']:.0f} changes"),
            ("  its changes serialized", r["page"]["patch"]["median_s"], r["page"]["patch"]["p95_s"], f"{r['page']['patch_bytes_median']:,.0f} B"),
            ("RulesPolicy steady, after scrapes", r["observe"]["steady_after_scrapes"]["median_s"], r["observe"]["steady_after_scrapes"]["p95_s"], asked(r["observe"]["steady_after_scrapes"])),
            ("RulesPolicy 1% changed", r["changed"]["median_s"], r["changed"]["p95_s"], asked(r["changed"])),
            ("RulesPolicy reduce-replicas only", r["reduce_only"]["median_s"], r["reduce_only"]["p95_s"], asked(r["reduce_only"])),
            ("stock ReduceReplicas, steady", r["stock_steady"]["median_s"], r["stock_steady"]["p95_s"], asked(r["stock_steady"])),
            ("stock ReduceReplicas, 1% changed", r["stock_changed"]["median_s"], r["stock_changed"]["p95_s"], asked(r["stock_changed"])),
        ]  # fmt: skip
        if "protect" in r:
            p = r["protect"]
            rows += [
                ("protect: first cycle", p["first_cycle_s"], None, f"{p['landed_after_cycles']} cycles to land"),
                ("protect: steady", p["steady"]["median_s"], p["steady"]["p95_s"], f"{p['protected_keys']:,} keys"),
                ("protect: 1% changed", p["changed"]["median_s"], p["changed"]["p95_s"], ""),
                ("protect: status report", p["status"]["median_s"], p["status"]["p95_s"], f"{p['status_json_bytes']:,} B json"),
            ]  # fmt: skip
        if "spill" in r:
            sp = r["spill"]
            rows += [
                ("spill: first cycle", sp["first_cycle_s"], None, f"{sp['values_sent']:,} values"),
                ("spill: steady", sp["steady"]["median_s"], sp["steady"]["p95_s"], asked(sp["steady"])),
                ("spill: steady, paired difference", sp["paired"]["wall_median_s"], None, f"CPU {ms(sp['paired']['cpu_median_s'])} ms"),
                ("spill: status report", sp["status"]["median_s"], sp["status"]["p95_s"], f"{sp['keys_on_disk']:,} on disk"),
            ]  # fmt: skip
        if "adaptive" in r:
            a = r["adaptive"]
            rows += [
                ("adaptive_target, distributed's", a["stock_target"]["median_s"], a["stock_target"]["p95_s"], ""),
                ("adaptive_target, adaptive section", a["target"]["median_s"], a["target"]["p95_s"], ""),
                ("workers_to_close, distributed's", a["stock_close"]["median_s"], a["stock_close"]["p95_s"], f"n={a['half']:,}"),
                ("workers_to_close, guarded", a["close"]["median_s"], a["close"]["p95_s"], f"{a['kept']:,} kept"),
            ]  # fmt: skip
        for n, (name, median, p95, what) in enumerate(rows):
            lines.append(
                f"{label if n == 0 else pad}{name:<34} {ms(median):>10} {ms(p95):>10} {what:>16}"
            )
        if "memory" in r:
            m = r["memory"]
            lines.append(
                f"{pad}{'engine memory per governed key':<34} {m['bytes_per_governed_key']:>10,.0f} B"
            )
        lines.append("")
    if t:
        lines.append(
            f"transitions ({t['tasks']:,}-task graph, {t['transitions_per_run']:,} transitions): "
            f"{t['without_per_s']:,.0f}/s without amm-rules, {t['with_per_s']:,.0f}/s with "
            f"(paired overhead {t['overhead']:+.1%}); hook {t['hook_s_per_transition'] * 1e6:.2f} us "
            f"per transition = {t['hook_overhead']:.1%} of throughput"
        )
        if t.get("flow_hook_s_per_transition") is not None:
            lines.append(
                f"index alone {t['index_hook_s_per_transition'] * 1e6:.2f} us; memory flow's "
                f"share {t['flow_hook_s_per_transition'] * 1e6:.2f} us per transition "
                f"= {t['flow_hook_overhead']:.1%} of throughput "
                f"({'fed by the index' if t['flow_fed_by_index'] else 'a plugin of its own'}); "
                f"the flow as a plugin of its own {t['flow_plugin_s_per_transition'] * 1e6:.2f} us"
            )
            lines.append(
                f"the index, then the flow as a plugin of its own: "
                f"{t['two_plugins_s_per_transition'] * 1e6:.2f} us per transition, the flow's "
                f"share {t['two_plugins_flow_share_s_per_transition'] * 1e6:.2f} us = "
                f"{t['two_plugins_flow_share_overhead']:.1%} of throughput"
            )
    return "\n".join(lines)


def found(m: dict[str, Any]) -> str:
    """An audit sweep's cycles, and what it repaired (nothing on a consistent index)."""
    repaired = {k: v for k, v in m.get("found", {}).items() if v}
    return ", ".join(f"{k} {v}" for k, v in repaired.items()) or f"{m['n']} cycles, ok"


def per_key(m: dict[str, Any]) -> str:
    """Cycles until every key was governed, and the time per key."""
    return f"{m['cycles']} cyc, {m['us_per_key']:.2f} us/k ({m['cpu_us_per_key']:.2f} cpu)"


def asked(m: dict[str, Any]) -> str:
    copies, drops = m.get("copies", 0), m.get("drops", 0)
    return f"+{copies:,.0f} -{drops:,.0f}"


def targets(results: list[dict[str, Any]], transitions: dict[str, Any] | None) -> dict[str, Any]:
    """Which targets of the scale issue the numbers meet."""
    out: dict[str, Any] = {}
    by_size = {(r["keys"], r["workers"]): r for r in results}
    top = by_size.get((1_000_000, 1_000))
    if top:
        out["steady_1M_1000w_le_20ms"] = top["steady"]["median_s"] <= TARGET_STEADY_S
        out["status_1M_1000w_le_5ms"] = top["observe"]["status"]["median_s"] <= TARGET_OBSERVE_S
        out["scrape_1M_1000w_le_5ms"] = top["observe"]["scrape"]["median_s"] <= TARGET_OBSERVE_S
        if "spill" in top:
            out["spill_steady_1M_1000w_le_20ms"] = (
                top["spill"]["steady"]["median_s"] <= TARGET_STEADY_S
            )
        if "protect" in top:
            protect = top["protect"]
            out["protect_steady_1M_1000w_le_20ms"] = (
                protect["steady"]["median_s"] <= TARGET_STEADY_S
            )
            out["protect_status_1M_1000w_le_5ms"] = (
                protect["status"]["median_s"] <= TARGET_OBSERVE_S
            )
    out["reduce_only_not_slower_than_stock"] = all(
        r["reduce_only"]["median_s"] <= r["stock_steady"]["median_s"] for r in results
    )
    for r in results:
        size = f"{r['keys'] // 1000}k_{r['workers']}w"
        out[f"reduce_only_over_stock_paired_{size}"] = r["reduce_only"]["paired_ratio_median"]
    for r in results:
        size = f"{r['keys'] // 1000}k_{r['workers']}w"
        groups, per = r["governed_groups"], r["governed_per_key"]
        out[f"governed_groups_{size}_us_per_key_le_0.5"] = groups["us_per_key"] <= 0.5
        out[f"governed_per_key_{size}_us_per_key_le_3"] = per["us_per_key"] <= 3.0
        if r["keys"] >= 1_000_000:
            out[f"governed_groups_{size}_within_5_cycles"] = groups["cycles"] <= 5
    for workers in (100, 1_000):
        small, large = by_size.get((100_000, workers)), by_size.get((1_000_000, workers))
        if small and large:
            out[f"steady_growth_100k_to_1M_{workers}w"] = (
                large["steady"]["median_s"] / small["steady"]["median_s"]
            )
    if transitions:
        out["hook_overhead_le_5pct"] = transitions["hook_overhead"] <= TARGET_HOOK_OVERHEAD
        if transitions.get("flow_hook_overhead") is not None:
            out["flow_hook_overhead_le_3pct"] = (
                transitions["flow_hook_overhead"] <= TARGET_FLOW_HOOK_OVERHEAD
            )
        out["paired_overhead_le_5pct"] = transitions["overhead"] <= TARGET_HOOK_OVERHEAD
    return out


def write_spill_only(
    results: list[dict[str, Any]], started: float, args: argparse.Namespace
) -> None:
    """``--only-spill``: the steady cycle without and with the spill section, per size."""
    for r in results:
        sp = r["spill"]
        print(
            f"{r['keys']:>9,} keys {r['workers']:>6,} workers, interleaved: steady without the"
            f" section {ms(sp['steady_without']['median_s'])} ms, with it"
            f" {ms(sp['steady']['median_s'])} ms (p95 {ms(sp['steady']['p95_s'])}); paired"
            f" difference {ms(sp['paired']['wall_median_s'])} ms wall,"
            f" {ms(sp['paired']['cpu_median_s'])} ms CPU; first {ms(sp['first_cycle_s'])} ms,"
            f" status {ms(sp['status']['median_s'])} ms; {sp['values_sent']:,} values in"
            f" {sp['messages']:,} messages, {sp['keys_on_disk']:,} keys on disk;"
            f" load {sp['load']:.1f}"
        )
    path = args.json if args.json != RESULTS else RESULTS.with_name("spill-scale.json")
    report = {
        "date": time.strftime("%Y-%m-%d", time.localtime(started)),
        "duration_s": time.time() - started,
        "load_before": args.load_before,
        "engine_digest": engine_digest(),
        "results": results,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100k keys and 100 workers only")
    parser.add_argument("--cycles", type=int, default=9, help="timed steady cycles per size")
    parser.add_argument("--rounds", type=int, default=4, help="change rounds per size")
    parser.add_argument(
        "--profile", action="store_true", help="print a pyinstrument profile of steady cycles"
    )
    parser.add_argument("--memory", choices=["first", "all", "none"], default=None,
                        help="sizes to measure memory at with tracemalloc, which slows the attach it "
                             "wraps several times (default: the first size)")  # fmt: skip
    parser.add_argument("--size", action="append", default=None, metavar="KEYSxWORKERS",
                        help="measure only these sizes, e.g. --size 1000000x1000 (repeatable)")  # fmt: skip
    parser.add_argument("--no-transitions", dest="transitions", action="store_false")
    parser.add_argument("--only-spill", action="store_true",
                        help="only the steady cycle and the spill rows (to benchmarks/results/"
                             "spill-scale.json unless --json)")  # fmt: skip
    parser.add_argument("--json", type=Path, default=RESULTS)
    args = parser.parse_args()
    sizes = QUICK_SIZES if args.quick else FULL_SIZES
    if args.size:
        sizes = [tuple(int(n) for n in size.lower().split("x")) for size in args.size]  # type: ignore[misc]
    args.graph = 20_000 if args.quick else 100_000
    args.repeats = 3 if args.quick else 2
    args.memory_done = False
    if args.memory is None:
        args.memory = "first"
    # The scheduler logs every worker registration and close at INFO: not our business.
    logging.getLogger("distributed").setLevel(logging.WARNING)

    started = time.time()
    args.load_before = os.getloadavg()[0]
    results = [measure_state(n_keys, n_workers, args) for n_keys, n_workers in sizes]
    if args.only_spill:
        write_spill_only(results, started, args)
        return
    transitions = None
    if args.transitions:
        log(f"transition throughput, {args.graph:,}-task graph")
        transitions = measure_transitions(args.graph, args.repeats)
    report = {
        "date": time.strftime("%Y-%m-%d", time.localtime(started)),
        "mode": "quick" if args.quick else "full",
        "duration_s": time.time() - started,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "python": platform.python_version(),
        "distributed": distributed.__version__,
        "engine_digest": engine_digest(),
        "rules": str(RULES.relative_to(ROOT)),
        "results": results,
        "transitions": transitions,
        "targets": targets(results, transitions),
    }
    print(table(results, transitions))
    print(json.dumps(report["targets"], indent=2))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    for r in results:
        r.pop("profile", None)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json.relative_to(ROOT) if args.json.is_relative_to(ROOT) else args.json}")


if __name__ == "__main__":
    main()
