"""Scheduler handlers: how clients talk to the rules engine.

Registered on the scheduler by :class:`amm_rules.RulesPolicy` when it is attached to an
Active Memory Manager; called by :mod:`amm_rules.client` (``replicate``, ``explain``,
``status``) as ``client.scheduler.<name>(...)``:

- ``amm_rules_set_target(keys, target)``: set (``target=None``: remove) a runtime
  replication target on keys in memory; returns ``{"set": n, "missing": [keys]}``;
- ``amm_rules_explain(keys)``: per ``str(key)``, where the key is, what is wanted for
  it and why (a runtime target names its origin: ``amm_rules.replicate``,
  ``client.replicate`` or ``scatter broadcast``), its demand, and what the planner would
  do now (``dry_run``: the rule holding its actions back, if it is in dry-run);
- ``amm_rules_status()``: the rules in force (and which are in dry-run), per-rule
  counters (``would_request``/``would_drop`` for what dry-run held back), reload errors,
  rebalancing (``rebalance``: settings, the last plan's roles and skipped keys, moves in
  flight, totals, why moves were abandoned), paused workers (``paused_workers``: the
  section, a line per paused worker, cool-downs, totals), retirements placed by the
  rules (``retirements``), the legacy calls honoured (``legacy_replicate``), the
  demand hold (``demand``), the memory flow's top prefixes (``memory_flow``) and the
  memory-pressure section (``memory_pressure``);
- ``amm_rules_memory_flow()``: per task prefix, ``{produced, freed, freed_by, live,
  tasks, net_per_task}`` (see :mod:`amm_rules.engine.flow`).

Bad input raises ``ValueError`` with a message (the client sees it); nothing here may
break the scheduler. Answers are plain msgpack-able data.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

from amm_rules.engine.planner import explain_workers, plan_key, source_label, target_bounds
from amm_rules.engine.view import key_string
from amm_rules.language.fields import ActionError, parse_target
from amm_rules.language.ruleset import ACTION_FIELDS, Target

if TYPE_CHECKING:
    from amm_rules.engine.policy import RulesPolicy

logger = logging.getLogger(__name__)

#: Names under which the handlers are registered on the scheduler.
HANDLER_NAMES = (
    "amm_rules_set_target",
    "amm_rules_explain",
    "amm_rules_status",
    "amm_rules_memory_flow",
)
#: Most keys one call may name (a guard against a runaway client, not a real limit).
MAX_KEYS = 1_000_000


def register(scheduler: Any, policy: RulesPolicy) -> None:
    """Install the handlers of ``policy`` on ``scheduler`` (replacing any earlier ones)."""
    handlers = Handlers(policy)
    scheduler.handlers["amm_rules_set_target"] = handlers.amm_rules_set_target
    scheduler.handlers["amm_rules_explain"] = handlers.amm_rules_explain
    scheduler.handlers["amm_rules_status"] = handlers.amm_rules_status
    scheduler.handlers["amm_rules_memory_flow"] = handlers.amm_rules_memory_flow


def unregister(scheduler: Any, policy: RulesPolicy) -> None:
    """Remove the handlers of ``policy`` (not those of another policy attached later)."""
    for name in HANDLER_NAMES:
        handler = scheduler.handlers.get(name)
        if getattr(getattr(handler, "__self__", None), "policy", None) is policy:
            del scheduler.handlers[name]


def _keys(keys: Any) -> list[Hashable]:
    if isinstance(keys, (str, bytes)) or not isinstance(keys, (list, tuple, set, frozenset)):
        raise ValueError(f"keys: expected a list of keys, got {type(keys).__name__}")
    if len(keys) > MAX_KEYS:
        raise ValueError(f"keys: at most {MAX_KEYS} keys per call, got {len(keys)}")
    return list(keys)


class Handlers:
    """The handlers of one policy (bound methods are what the scheduler calls)."""

    def __init__(self, policy: RulesPolicy):
        self.policy = policy

    def _task(self, key: Any) -> Any:
        try:
            return self.policy.scheduler.tasks.get(key)
        except TypeError:  # an unhashable "key"
            return None

    def amm_rules_set_target(self, keys: Any = (), target: Any = None) -> dict[str, Any]:
        """Set a lasting replication target on keys in memory; None removes it."""
        keys = _keys(keys)
        parsed: Target | None = None
        if target is not None:
            try:
                parsed = parse_target(target, "target")
            except ActionError as exc:
                raise ValueError(str(exc)) from None
        missing = []
        n = 0
        for key in keys:
            ts = self._task(key)
            if ts is None or ts.state != "memory":
                missing.append(key)
                continue
            self.policy.set_runtime_target(ts.key, parsed)
            n += 1
        logger.debug("amm-rules: runtime target %s set on %d keys", parsed, n)
        return {"set": n, "missing": missing}

    def amm_rules_explain(self, keys: Any = ()) -> dict[str, dict[str, Any]]:
        """Why is each key where it is, and what would the engine do now?"""
        keys = _keys(keys)
        policy = self.policy
        cluster = policy.cluster_view()
        now = time.monotonic()
        settings = policy.settings(now)
        out: dict[str, dict[str, Any]] = {}
        for key in keys:
            ts = self._task(key)
            name = key_string(key)
            if ts is None or ts.state != "memory":
                out[name] = {
                    "state": ts.state if ts is not None else "unknown",
                    "holders": [],
                    "governed": False,
                    "desired": "not in memory",
                }
                continue
            desired = policy.resolve(ts)
            view = policy.key_view(ts, desired, now=now)
            plan = plan_key(view, cluster, settings)
            eligible = len(cluster.placeable(desired.pool, desired.avoid))
            lo, hi = target_bounds(desired, view.waiters, settings.reduce_replicas, eligible)
            out[name] = {
                "state": ts.state,
                "holders": sorted(view.holders),
                "governed": desired.governed,
                "desired": desired.explain(),
                "fields": {
                    f: _plain(getattr(desired, f))
                    for f in ACTION_FIELDS
                    if getattr(desired, f) is not None
                },
                "reasons": {f: str(r) for f, r in desired.reasons.items()},
                # min/max in copies on the current workers; "follows_cluster" when the
                # target says 'all' (it grows and shrinks as eligible workers come and go).
                "target": {
                    "min": lo,
                    "max": hi,
                    "source": source_label(desired, "replicate"),
                    "follows_cluster": bool(
                        desired.replicate is not None and desired.replicate.follows_cluster
                    ),
                },
                "demand": {
                    "waiters": len(ts.waiters or ()),
                    "reads": policy.index.demand.reads.get(ts.key, 0),
                    "held": sorted(view.held),
                },
                "copying": ts.key in policy.legacy.copying,
                "eligible": plan.eligible,
                "in_flight": sorted(view.inflight),
                "misplaced": dict(plan.misplaced),
                "unmet": plan.unmet,
                "would": [
                    {"op": a.op, "worker": a.worker, "reason": a.reason} for a in plan.actions
                ]
                if desired.governed
                else [],
                "deferred": list(plan.deferred),
                # In dry-run: the label its actions are held back under ("would" lists
                # them); None when they are enacted.
                "dry_run": policy.dry_run.label(desired),
                "workers": explain_workers(view, cluster),
                "annotation_ignored": bool(ignored := policy.classifier.ignored_annotations(ts)),
                # Which: "amm", "replicate" (the shorthand), or both.
                "annotations_ignored": ignored,
                # Mid-move (copy in flight or landed, sender's drop pending) or cooling
                # down after a move; None otherwise.
                "rebalance": policy.rebalancer.explain(ts.key, now),
                # Paused workers holding the key, and whether it keeps one from leaving.
                "paused_workers": policy.paused.explain(ts),
            }
            # Explaining must not change the index: the tally in `cluster` is local.
        return out

    def amm_rules_status(self) -> dict[str, Any]:
        """The rules in force, counters per rule (last cycle and totals), reload errors."""
        policy = self.policy
        ruleset = policy.ruleset
        labels = set(policy.last_cycle) | set(policy.totals)
        return {
            "source": policy.path if policy.path is not None else ruleset.source,
            "loaded_at": policy.loaded_at,
            "reload": policy.reload,
            "rules": [r.name for r in ruleset.rules],
            "pools": sorted(ruleset.pools),
            "reduce_replicas": ruleset.reduce_replicas,
            "enforcement": ruleset.enforcement,
            "dry_run": {
                "rules": sorted(policy.dry_run.rules),
                "rebalance": policy.dry_run.rebalance,
            },
            "governed": len(policy.index),
            # Keys in memory the classification budget has not reached yet.
            "unclassified": policy.index.unclassified,
            "in_flight": sum(len(v) for v in policy.index.inflight.values()),
            "runtime_targets": len(policy.index.runtime),
            "cycles": policy.cycles,
            "last_cycle_ms": round(policy.last_cycle_seconds * 1000, 3),
            "last_cycle": policy.last_cycle,
            "totals": {
                label: {
                    "requested": policy.totals[label]["requested"],
                    "dropped": policy.totals[label]["dropped"],
                }
                for label in sorted(labels)
            },
            "reload_errors": list(policy.reload_errors),
            "audit": {
                "sweeps": policy.auditor.sweeps,
                "sweeping": policy.auditor.sweeping,
                "last": policy.auditor.last,
            },
            "rebalance": policy.rebalancer.status(),
            "paused_workers": policy.paused.status(),
            "retirements": policy.retirements.status(),
            "legacy_replicate": policy.legacy.status(),
            "demand": {
                "following": policy.index.demand.enabled,
                "hold": ruleset.demand.hold,
                "match": ruleset.demand.match_source,
                "keys_read": len(policy.index.demand.reads),
            },
            # Early AMM cycles: settings, requests, cycles run, the last ones and why.
            "early_cycles": policy.early.status(),
            "memory_flow": memory_flow_status(policy),
            "memory_pressure": policy.pressure.status(),
        }

    def amm_rules_memory_flow(self) -> dict[str, dict[str, Any]]:
        """Per task prefix: bytes produced, freed, freed because a task of the prefix
        finished, live now, tasks finished and the net bytes per task."""
        return self.policy.flow.table()


#: Prefixes listed per ranking in the status (top producers, top freers).
STATUS_TOP = 5


def memory_flow_status(policy: RulesPolicy) -> dict[str, Any]:
    """The memory flow in the status: how many prefixes are kept, the top producers
    (largest positive net bytes per task) and freers (most bytes freed by finishing),
    each with its figures, and the totals over every prefix."""
    flow = policy.flow
    producers = [
        {"prefix": name, **e.as_dict()}
        for name, e in flow.top(STATUS_TOP, "net_per_task")
        if (e.net_per_task or 0) > 0
    ]
    freers = [
        {"prefix": name, **e.as_dict()}
        for name, e in flow.top(STATUS_TOP, "freed_by")
        if e.freed_by > 0
    ]
    return {
        "prefixes": len(flow.prefixes),
        "evicted": flow.evicted,
        "totals": flow.totals(),
        "top_producers": producers,
        "top_freers": freers,
    }


def _plain(value: Any) -> Any:
    if isinstance(value, Target):
        return {"min": value.min, "max": value.max}
    if isinstance(value, tuple):
        return list(value)
    return value
