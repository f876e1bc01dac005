"""The engine's state as one JSON-able report, and its rendering as text.

:func:`status_report` is the one source of ``amm-rules status --format json``, of the
``amm_rules_status`` scheduler handler (hence :func:`amm_rules.status`), of the
``status`` part of cluster dumps, and of anything that draws the engine (a dashboard
page, a JSON route): they all show the same figures.
:func:`amm_rules.observe.text.render_status` is ``amm-rules status``'s text.

Costs (see ``benchmarks/scale.py``): the report reads counters and per-class
tables, plus one line per worker; nothing scans ``scheduler.tasks``. What readers
poll (``/amm-rules/status.json``, every open dashboard page) is :func:`shared_report`
and :func:`shared_json`: one report, and one serialisation of it, per
:data:`SHARED_FOR` seconds whatever the number of requests. Texts a report embeds
(reload errors, event fields) are clipped to :data:`TEXT_SHOWN` characters with a
marker, and its events are those the engine wrote (:attr:`EventLog.recent
<amm_rules.engine.events.EventLog.recent>`), never what clients log to the topic.

Neighbours: :mod:`amm_rules.observe.conformance` computes the per-rule states;
:mod:`amm_rules.engine.state.journal` keeps cycle durations, decisions and reloads;
:mod:`amm_rules.engine.rebalance.rebalancer` reports its own section.
"""

from __future__ import annotations

import json
import math
import statistics
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import islice
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from amm_rules.engine.adapters import worker_status
from amm_rules.engine.decide.view import key_string
from amm_rules.engine.events import clip_text
from amm_rules.engine.handlers import engine_status
from amm_rules.engine.state.journal import Decision
from amm_rules.observe.conformance import SATISFIED, conformance

if TYPE_CHECKING:
    from amm_rules.engine.policy import RulesPolicy

#: Latest events and decisions a report carries.
EVENTS_KEPT = 20
DECISIONS_SHOWN = 20
#: Workers in no pool, in ``memory_by_pool``.
NO_POOL = "(no pool)"
#: Seconds one report (and its JSON) serves every reader: ten open pages and twenty
#: requests to status.json cost one report.
SHARED_FOR = 0.5
#: Longest text a report embeds (a reload error's diagnostics, a field of an event),
#: and most entries of a list or mapping inside an event; beyond, clipped with a marker.
TEXT_SHOWN = 2_000
ITEMS_SHOWN = 50


def status_report(policy: RulesPolicy) -> dict[str, Any]:
    """Everything ``amm-rules status`` shows, as plain data (str keys, numbers, strings,
    lists, dicts, None), for one attached :class:`~amm_rules.engine.policy.RulesPolicy`.

    The shape (times are seconds since the epoch; sizes are bytes)::

        {
          "amm": {"running": True, "since": 1764400000.0, "interval": 2.0},  # cycles run?
          "scheduler": "tcp://10.0.0.1:8786",        # None before the scheduler starts
          "time": 1764500000.0,                       # when the report was made
          # the rules in force
          "source": "/etc/dask/rules.yaml",           # or "<rules>" for inline rules
          "sha256": "3f2a...",                        # of the file's bytes (None: unknown)
          "loaded_at": 1764400000.0,
          "reload": True,                             # reloaded when the file changes
          "reloads": {"ok": 2, "error": 1},           # since the policy started
          "reload_errors": [{"time": ..., "error": "rules.yaml:6:17: error: ..."}],
          # since_reloaded: rules were installed after it (the error is past)
          "last_reload_error": {"time": ..., "error": ..., "since_reloaded": False} or None,
          "rules": ["precious", ...],                 # rule names, file order
          "pools": ["gpu", ...],
          "reduce_replicas": True,
          # conformance (amm_rules.observe.conformance)
          "conformance": {
            "running": True, "since": 1764400000.0,  # as "amm"; False: all "not-running"
            "governed": 1200, "met": 1180, "fraction": 0.983,
            "classification_backlog": 0,
            "rules": [                                 # rules in file order, then the groups
              {"name": "precious", "kind": "rule",    # or "annotation", "runtime"
               "in_file": True,
               "state": "unsatisfiable",              # "satisfied", "in-progress", "idle"...
               "sentence": "20 keys of 200 cannot be satisfied now: wants 3 copies, ...",
               "keys": 200, "bytes": 1073741824,
               "copies_held": 560, "copies_wanted": 600,  # copies now; at least wanted
               "met": 180, "unmet": 20,
               "unmet_by_reason": {"too-few-workers": 20},
               "why": {"too-few-workers": "wants 3 copies, only 2 workers in pool gpu"},
               # one entry per cause (two classes short for one reason are two causes)
               "causes": [{"reason": "too-few-workers", "why": "...", "keys": 20}]},
              ...
            ],
          },
          "states": {"precious": "unsatisfiable", ...},   # name -> state, same rows
          # the engine's work
          "governed": 1200,                           # keys governed
          "unclassified": 0,                          # keys waiting for classification now
          "classification_backlog": 0,                # left over by the last cycle's budget
          "in_flight": 3, "in_flight_keys": 2,        # copies asked, not landed
          "runtime_targets": 1,
          "cycles": 340, "last_cycle_ms": 1.9,
          "cycle_ms": {"last": 1.9, "median": 1.7, "worst": 8.2, "mean": 2.0, "recent": 100},
          "last_cycle": {label: {"governed", "requested", "dropped", "unmet"}},
          "totals": {label: {"requested": n, "dropped": n}},   # since the policy started
          "audit": {"sweeps": n, "sweeping": bool, "last": {...} or None},
          "rebalance": {... Rebalancer.status(): settings (sender_min, recipient_max, gap,
                        measure, ...), in_flight, in_flight_bytes, totals, last_plan
                        (with the roles and the cluster "mean") ...},
          # the workers, for charts: memory by the rebalance measure when rebalancing is
          # enabled, else by the AMM's measure
          "memory_measure": "optimistic",
          "workers": {"address": [...], "name": [...], "host": [...],   # columns:
                      "status": [...],          # running/paused/closing   # a worker
                      "pools": [[...], ...], "memory": [...],              # per index
                      "memory_limit": [...], "fraction": [... or None],
                      "spilled": [...], "role": [... or None]},  # role in the last plan
          "memory_by_pool": {"gpu": {"workers": [addresses], "memory": n,
                                     "memory_limit": n}, "(no pool)": {...}},
          # the last workers that left, and what they took (the worker-left event)
          "workers_left": {"recent": [{"time", "worker", "retired", "below",
                                       "below_bytes", "below_keys", "lost", "lost_bytes",
                                       "lost_keys"}], "left": n},
          # the latest events the engine wrote to "amm-rules" (but cycle summaries), and
          # its latest decisions
          "events": [{"time": ..., "action": "reload-error", ...}],
          "decisions": [{"time", "key", "op", "worker", "outcome", "reason", "source"}],
        }
    """
    report = engine_status(policy.ctx, policy.sections)  # its counters and sections
    c = conformance(policy)
    errors, last = _reload_errors(policy, report["reload_errors"])
    journal = policy.journal
    report.update(
        scheduler=_address(policy),
        time=time.time(),
        sha256=policy.ruleset.sha256,
        reloads={"ok": journal.reloads["ok"], "error": journal.reloads["error"]},
        reload_errors=errors,
        last_reload_error=last,
        conformance=c.to_dict(),
        states={r.name: r.state for r in c.rules},
        classification_backlog=journal.backlog,
        in_flight_keys=len(policy.ctx.ledger.copies),
        cycle_ms=_cycle_ms(policy),
        rebalance=_finite(report["rebalance"]),
        **_workers(policy),
        events=_events(policy),
        decisions=[decision_dict(d) for d in journal.recent(DECISIONS_SHOWN)],
    )
    return report


def _reload_errors(
    policy: RulesPolicy, errors: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The reload errors, their texts clipped, and the last one, said as past when rules
    were installed after it (they replaced the file it was about)."""
    kept = [{"time": e["time"], "error": clip_text(str(e["error"]), TEXT_SHOWN)} for e in errors]
    if not kept:
        return kept, None
    return kept, {**kept[-1], "since_reloaded": bool(policy.loaded_at > kept[-1]["time"])}


def status_json(report: Mapping[str, Any]) -> str:
    """The report as ``amm-rules status --format json`` prints it, and as
    ``/amm-rules/status.json`` serves it."""
    return json.dumps(report, indent=2, default=str) + "\n"


@dataclass(slots=True)
class _Shared:
    """One report of a policy and, once asked for, its JSON (see :func:`shared_report`)."""

    made: float
    report: dict[str, Any]
    text: str | None = None


_shared: weakref.WeakKeyDictionary[Any, _Shared] = weakref.WeakKeyDictionary()


def _current(policy: RulesPolicy) -> _Shared:
    now = time.monotonic()
    made = _shared.get(policy)
    if made is None or now - made.made >= SHARED_FOR:
        made = _shared[policy] = _Shared(now, status_report(policy))
    return made


def shared_report(policy: RulesPolicy) -> dict[str, Any]:
    """The status report of ``policy``, made at most once per :data:`SHARED_FOR`
    seconds whatever the number of readers (open pages, requests). Read-only."""
    return _current(policy).report


def shared_json(policy: RulesPolicy) -> str:
    """:func:`status_json` of :func:`shared_report`, serialised once per report."""
    made = _current(policy)
    if made.text is None:
        made.text = status_json(made.report)
    return made.text


def clipped(value: Any, depth: int = 0) -> Any:
    """A bounded copy of plain data for a report: texts clipped to :data:`TEXT_SHOWN`
    characters, lists and mappings to :data:`ITEMS_SHOWN` entries and four levels, each
    cut said by a marker."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return clip_text(value, TEXT_SHOWN)
    if depth >= 4 or not isinstance(value, (Mapping, list, tuple)):
        return clip_text(f"<{type(value).__name__}>", TEXT_SHOWN)
    more = len(value) - ITEMS_SHOWN
    if isinstance(value, Mapping):
        out = {
            clip_text(str(k), 200): clipped(v, depth + 1)
            for k, v in islice(value.items(), ITEMS_SHOWN)
        }
        if more > 0:
            out["..."] = f"[clipped: {more:,} more entries]"
        return out
    items = [clipped(v, depth + 1) for v in islice(value, ITEMS_SHOWN)]
    if more > 0:
        items.append(f"[clipped: {more:,} more items]")
    return items


def all_satisfied(report: Mapping[str, Any]) -> bool:
    """True when every rule of a report is ``satisfied`` (``amm-rules status --check``)."""
    return all(r["state"] == SATISFIED for r in report["conformance"]["rules"])


def decision_dict(d: Decision) -> dict[str, Any]:
    """A decision as plain data: its fields in order, the key as a string."""
    return {**d._asdict(), "key": key_string(d.key)}


def _address(policy: RulesPolicy) -> str | None:
    try:
        return str(policy.scheduler.address)
    except (AttributeError, ValueError):  # not attached, or not started yet
        return None


def _cycle_ms(policy: RulesPolicy) -> dict[str, Any]:
    journal = policy.journal
    recent = list(journal.cycle_seconds)
    if not recent:
        return {"last": None, "median": None, "worst": None, "mean": None, "recent": 0}
    return {
        "last": round(recent[-1] * 1000, 3),
        "median": round(statistics.median(recent) * 1000, 3),
        "worst": round(max(recent) * 1000, 3),
        "mean": round(journal.cycle_seconds_total / journal.cycles * 1000, 3),
        "recent": len(recent),
    }


#: The columns of ``workers`` in a report, in order (as :func:`_workers` makes them).
WORKER_COLUMNS = (
    "address",
    "name",
    "host",
    "status",
    "pools",
    "memory",
    "memory_limit",
    "fraction",
    "spilled",
    "role",
    "at_risk",
)


def _workers(policy: RulesPolicy) -> dict[str, Any]:
    """The workers as columns (one list per field, a worker per index: what a chart's
    data source takes, and a third of the JSON of one mapping per worker) and the
    totals per pool. Built column by column with C-level iteration where it can be:
    at a thousand workers, per-worker Python code is what this report costs."""
    try:
        scheduler = policy.scheduler
        manager = policy.manager
    except AttributeError:
        no_workers: dict[str, list[Any]] = {name: [] for name in WORKER_COLUMNS}
        return {"memory_measure": None, "workers": no_workers, "memory_by_pool": {}}
    rebalancer = policy.rebalancer
    settings = rebalancer.settings
    measure = settings.measure if settings.enabled else manager.measure
    plan = rebalancer.last_plan
    roles = plan.roles if plan is not None and settings.enabled else {}
    workers = scheduler.workers
    # The scheduler's SortedDict iterates slowly from Python: read its dict in C.
    if isinstance(workers, dict):
        addresses, states = list(dict.keys(workers)), list(dict.values(workers))
    else:  # pragma: no cover - a plain mapping
        addresses, states = list(workers.keys()), list(workers.values())
    # The AMM measured every worker in its last cycle: reuse that when it is the measure
    # shown (building a worker's MemoryState costs microseconds, a thousand of them
    # milliseconds); measure afresh otherwise, and for workers that joined since.
    measured = (
        {ws.address: m for ws, m in policy.journal.worker_memory.items()}
        if measure == manager.measure
        else {}
    )
    memory = [
        max(0, int(m if m is not None else getattr(ws.memory, measure)))
        for m, ws in zip(map(measured.get, addresses), states, strict=True)
    ]
    limits = [x or 0 for x in map(_LIMIT, states)]
    pools_of = policy.placements.pools
    named: dict[frozenset[str], list[str]] = {}
    pools = []
    for member in map(pools_of.get, addresses):
        names = named.get(member or _NONE)
        if names is None:
            names = named[member or _NONE] = sorted(member or ())
        pools.append(names)
    columns = {
        "address": addresses,
        "name": list(map(str, map(_NAME, states))),
        "host": list(map(_HOST, states)),
        "status": list(map(worker_status, states)),
        "pools": pools,
        "memory": memory,
        "memory_limit": limits,
        "fraction": [m / x if x else None for m, x in zip(memory, limits, strict=True)],
        "spilled": [
            (metrics.get("spilled_bytes") or {}).get("disk", 0)
            for metrics in map(_METRICS, states)
        ],
        "role": list(map(roles.get, addresses)),
        # Seconds of recompute each worker holds alone (the recompute costs' table).
        "at_risk": [round(v or 0.0, 3) for v in map(policy.ctx.costs.at_risk.get, addresses)],
    }
    by_pool: dict[str, dict[str, Any]] = {}
    for address, names, m, x in zip(addresses, pools, memory, limits, strict=True):
        for name in names or (NO_POOL,):
            acc = by_pool.get(name)
            if acc is None:
                acc = by_pool[name] = {"workers": [], "memory": 0, "memory_limit": 0}
            acc["workers"].append(address)
            acc["memory"] += m
            acc["memory_limit"] += x
    return {"memory_measure": measure, "workers": columns, "memory_by_pool": by_pool}


_NONE: frozenset[str] = frozenset()
_LIMIT = attrgetter("memory_limit")
_NAME = attrgetter("name")
_HOST = attrgetter("host")
_METRICS = attrgetter("metrics")


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities as None: the report is served as strict JSON
    (a plan with no worker to measure has no mean)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _events(policy: RulesPolicy) -> list[dict[str, Any]]:
    """The latest events the engine wrote (never what a client logged to the topic),
    clipped, each with the time it was written."""
    recent = policy.events.recent
    return [
        {"time": stamp, **clipped(msg)}
        for stamp, msg in islice(recent, max(0, len(recent) - EVENTS_KEPT), None)
    ]
