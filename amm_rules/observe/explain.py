"""``explain``: why one key is where it is, in one screen.

For each key (the form of Elasticsearch's allocation explain, with amm-rules' deciders):

1. ``summary``: one line that answers the question, e.g. ``wants 3 copies, holds 1:
   move: never from rule 'big' forbids new copies``;
2. ``facts``: prefix, group, type, size, annotations, waiters, holders with their pools;
3. ``cascade``: the runtime target, the ``amm`` annotation, then every rule in file
   order, matched or not, with the fields each decided and those already decided by
   something earlier (overridden);
4. ``decisions``: per worker, ``holds``, ``yes`` (a copy may go there now),
   ``throttled`` (not now: paused, a copy on its way, backing off, the key not
   classified yet) or ``no`` (``move: never``, pool, avoid, retiring, spread), with the
   deciders that said no or throttled, the planner's pick for the next cycle, and the
   worker's role in the last rebalancing plan;
5. ``history``: the engine's latest decisions about the key (its bounded journal).

The engine's own fields (``desired``, ``target``, ``eligible``, ``would``,
``workers``...: :mod:`amm_rules.engine.handlers`) are kept alongside. :func:`unmet_keys` picks keys whose
targets are unmet, as allocation explain picks an unassigned shard when asked nothing.
:func:`amm_rules.observe.text.render_explain` is ``amm-rules explain``'s text.

Runs the same planner as the cycle (:func:`amm_rules.engine.decide.plan.plan_key`) on a
throw-away view: explaining changes nothing. Neighbours:
:mod:`amm_rules.engine.handlers` calls it for ``amm_rules_explain``;
:mod:`amm_rules.observe.conformance` says which classes the workers cannot satisfy.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Iterable, Mapping
from itertools import islice
from typing import TYPE_CHECKING, Any

from amm_rules.engine.adapters import TaskFactsAdapter, bounded_repr
from amm_rules.engine.decide.deciders import Question, decide, stays, verdict
from amm_rules.engine.decide.plan import KeyPlan, reduce_replicas_excess
from amm_rules.engine.decide.view import ClusterView, KeyView, key_string
from amm_rules.engine.handlers import KeyExplanation, check_keys, task_of
from amm_rules.engine.handlers import explain_key as engine_explain_key
from amm_rules.engine.state.governed import PlanClass, labels_of
from amm_rules.engine.words import counted
from amm_rules.language.fields import ActionError, parse_actions
from amm_rules.language.ruleset import Actions, Desired, Reason, RuntimeTarget, overrides
from amm_rules.observe.conformance import (
    ANNOTATION,
    LEGACY_RUNTIME,
    RUNTIME,
    TOO_FEW_HOSTS,
    class_problem,
    conformance,
    eligible_words,
    sampled_tasks,
)
from amm_rules.observe.names import name_offer, offer_words
from amm_rules.observe.status import decision_dict

if TYPE_CHECKING:
    from amm_rules.engine.policy import RulesPolicy

#: Decisions of a key shown (the newest).
HISTORY_SHOWN = 10
#: Longest text taken from an annotation value.
CLIP = 200

HOLDS = "holds"


class Explainer:
    """Explains keys one at a time on one view of the workers, taken when it is made
    (what the explain handler does a slice at a time, see
    :func:`amm_rules.engine.handlers.explain_in_slices`)."""

    def __init__(self, policy: RulesPolicy):
        ctx = policy.ctx
        self.policy = policy
        self.scheduler = ctx.scheduler
        # Workers' memory as the AMM measured it in the last cycle, rather than measured
        # afresh: a thousand workers' memory costs milliseconds, and the next cycle
        # measures again anyway.
        measured = ctx.journal.worker_memory
        self.cluster = ctx.placements.cluster_view(measured) if measured else ctx.cluster_view()
        self.now = time.monotonic()
        #: Keys of a sample of those in memory, per group name (taken once, when a name
        #: that is not a key needs it: see :mod:`amm_rules.observe.names`).
        self._by_group: dict[str, list[Hashable]] | None = None

    def __call__(self, key: Hashable) -> tuple[str, dict[str, Any]]:
        """``str(key)`` and the engine's own explanation of the key
        (:func:`amm_rules.engine.handlers.explain_key`: holders, desired, target,
        eligible, would, workers, the sections' entries...) with the fields of this
        module added (see the module docstring), from the one plan the engine made of
        the key."""
        policy, cluster, now = self.policy, self.cluster, self.now
        ts = task_of(self.scheduler, key)
        core = engine_explain_key(policy.ctx, policy.sections, ts, cluster, now)
        answer = core.answer
        answer.update(_explained(policy, key, core, cluster, now))
        if core.ts is None and (offer := name_offer(self.scheduler, key, self._sampled)):
            # A task group's or prefix's name: what to explain instead.
            answer["offer"] = offer
            answer["summary"] = f"{answer['summary']}: {offer_words(offer)}"
        return key_string(key), answer

    def _sampled(self) -> dict[str, list[Hashable]]:
        if self._by_group is None:
            self._by_group = {}
            for ts in sampled_tasks(self.scheduler):
                self._by_group.setdefault(ts.group.name, []).append(ts.key)
        return self._by_group


def explain_keys(policy: RulesPolicy, keys: Any) -> dict[str, dict[str, Any]]:
    """Per ``str(key)``, the explanation of each key (see :class:`Explainer`), all at
    once: for a few keys (the handler explains many a slice at a time).
    ``keys``: a list, tuple or set of keys (``ValueError`` else)."""
    explainer = Explainer(policy)
    return dict(explainer(key) for key in check_keys(keys))


def unmet_keys(policy: RulesPolicy, rule: str | None = None, limit: int = 10) -> list[Hashable]:
    """Up to ``limit`` governed keys whose target or placement is unmet (of ``rule``, a
    rule's name or ``(annotation)``/``(runtime)``, if given): keys of classes the
    workers cannot satisfy first, then keys the engine is working on. Raises
    ``ValueError`` for a rule that governs nothing and is not in the rules."""
    check_rule(policy, rule)
    index = policy.index
    limit = max(0, int(limit))
    out: list[Hashable] = []
    seen: set[Hashable] = set()

    def take(candidates: Iterable[Hashable]) -> None:
        for key in candidates:
            if len(out) >= limit:
                return
            d = index.desired.get(key)
            if key in seen or d is None or (rule is not None and rule not in labels_of(d)):
                continue
            seen.add(key)
            out.append(key)

    for cls, counts in list(index.governed.class_labels.items()):
        if rule is not None and not counts.get(rule):
            continue
        if class_problem(policy, cls) is not None:
            group = index.governed.groups.get(cls, {})
            # Bounded: a class's keys all have the class's problem; a rule filter may
            # skip some (they take the field from another rule), so look a little further.
            take(islice(group, limit * 4 if rule is not None else limit))
    take(list(index.shortfall))
    return out


def check_rule(policy: RulesPolicy, rule: str | None) -> None:
    """``ValueError`` for a ``rule`` that governs nothing and is not in the rules."""
    known = {r.name for r in policy.ruleset.rules} | {ANNOTATION, RUNTIME, *LEGACY_RUNTIME}
    if rule is not None and rule not in known and rule not in policy.index.governed.governed_by:
        names = ", ".join(sorted(known))
        raise ValueError(f"rule: no rule named {rule!r}; the rules are {names}")


def count_unmet(policy: RulesPolicy, rule: str | None = None) -> int:
    """How many governed keys :func:`unmet_keys` could pick without a limit (of
    ``rule``, if given), counted as the conformance counts them: per class, not per key."""
    found = conformance(policy)
    if rule is None:
        return found.governed - found.met
    return sum(sum(r.unmet.values()) for r in found.rules if r.name == rule)


def _explained(
    policy: RulesPolicy, key: Hashable, core: KeyExplanation, cluster: ClusterView, now: float
) -> dict[str, Any]:
    """This module's fields for one key: ``key``, ``summary``, ``facts``, ``cascade``,
    ``decisions``, ``history``, ``unclassified`` and ``problem``, from the engine's
    explanation of it (``core``) on ``cluster``, the planner's view of the workers."""
    ts = core.ts
    name = key_string(key)
    if core.plan is None or core.view is None or core.desired is None:
        state = ts.state if ts is not None else "unknown"
        summary = "not known to the scheduler" if ts is None else f"not in memory ({state})"
        out: dict[str, Any] = {"key": name, "summary": summary, "history": _history(policy, key)}
        pressure = core.answer.get("memory_pressure")
        if pressure is not None:
            out["summary"] = f"{summary}: {pressure['summary']}"
        return out
    index = policy.index
    runtime = index.runtime.get(ts.key)
    desired, view, plan, lo, hi = core.desired, core.view, core.plan, core.lo, core.hi
    unclassified = index.waiting(ts.key)
    problem = class_problem(policy, PlanClass.of(desired)) if desired.governed else None
    annotation, annotation_error = _annotation(policy, ts)
    summary = _summary(policy, view, plan, cluster, lo, hi, problem)
    if unclassified:
        summary += " (not classified by the engine yet: classification budget)"
    return {
        "key": name,
        "summary": summary,
        "facts": _facts(policy, ts, view, cluster),
        "cascade": _cascade(policy, ts, annotation, annotation_error, runtime),
        "decisions": _decisions(policy, view, plan, cluster, unclassified, now),
        "history": _history(policy, ts.key),
        "unclassified": unclassified,
        "problem": None if problem is None else {"reason": problem[0], "why": problem[1]},
    }


# ---------------------------------------------------------------------------------
# 1. The summary line
# ---------------------------------------------------------------------------------


def wants(lo: int, hi: int | None) -> str:
    """``wants 3 copies``, ``wants 2 to 5 copies``, ``wants at least 2 copies``."""
    if hi == lo:
        return f"wants {counted(lo, 'copy')}"
    if hi is None:
        return f"wants at least {counted(lo, 'copy')}"
    return f"wants {lo} to {hi} copies"


def _summary(
    policy: RulesPolicy,
    view: KeyView,
    plan: KeyPlan,
    cluster: ClusterView,
    lo: int,
    hi: int | None,
    problem: tuple[str, str] | None,
) -> str:
    d = view.desired
    n = len(view.holders)
    holds = f"holds {n}"
    # 1. Nobody governs the key.
    if not d.governed:
        if not policy.ruleset.reduce_replicas:
            return f"no rule governs it and reduce-replicas is off: left alone; {holds}"
        excess = reduce_replicas_excess(n, view.waiters) if n else 0
        extra = f"; the next cycle drops {excess}" if excess > 0 else ""
        return (
            "no rule governs it: reduce-replicas keeps one copy plus one per worker where "
            f"its waiters run; {holds}{extra}"
        )
    # 2. move: never.
    if d.move == "never":
        by = f"move: never from {d.reasons['move']}"
        if d.replicate is None:
            return f"left alone by {by}; {holds}"
        # (lo and hi are the target on the current workers: ``all`` counted.)
        if n < lo:
            return f"{wants(lo, hi)}, {holds}: {by} forbids new copies"
        if hi is not None and n > hi:
            return f"{wants(lo, hi)}, {holds}: {by} forbids dropping copies"
        return f"{wants(lo, hi)} and {holds}, but {by}: the engine leaves it alone"
    want = wants(lo, hi) if d.replicate is not None else "wants a copy"
    where = _placement_words(d)
    # 3. The workers cannot satisfy it: the copies it holds, counted as the planner
    #    counts them (in place or misplaced), and what the workers lack.
    if problem is not None:
        return (
            f"{want}{where}: holds {_held_words(n, plan)}; {_problem_words(policy, d, problem[0])}"
        )
    copies = [a for a in plan.actions if a.op == "replicate"]
    drops = [a for a in plan.actions if a.op == "drop"]
    # 4. The next cycle acts.
    if copies or drops:
        parts = []
        if copies:
            parts.append(f"copies to {', '.join(a.worker for a in copies)} ({copies[0].reason})")
        if drops:
            parts.append(f"drops from {', '.join(a.worker for a in drops)} ({drops[0].reason})")
        return f"{want}{where}, {holds}: the next cycle {' and '.join(parts)}"
    # 5. Short and waiting.
    if plan.unmet:
        return plan.unmet
    if plan.inflight:
        return (
            f"{want}{where}, {holds}: {len(plan.inflight)} more on the way to "
            f"{', '.join(sorted(plan.inflight))}"
        )
    if plan.deferred:
        return f"{want}{where}, {holds}: {plan.deferred[0]}"
    if plan.misplaced:
        return (
            f"{want}{where}, {holds}: copies misplaced "
            f"({'; '.join(f'{a} {why}' for a, why in sorted(plan.misplaced.items()))})"
        )
    # 6. Met.
    hosts = ""
    if d.spread == "host":
        n_hosts = len({cluster.host(a) for a in plan.good})
        hosts = f" on {counted(n_hosts, 'host')}"
    return f"holds its target: {counted(n, 'copy')}{hosts} ({d.explain()})"


def _problem_words(policy: RulesPolicy, d: Desired, reason: str) -> str:
    placement = policy.placements.of(PlanClass.of(d))
    if reason == TOO_FEW_HOSTS:
        n = placement.hosts
        return f"the eligible workers are on only {counted(n, 'host')}"
    return eligible_words(d.pool, d.avoid, placement.achievable)


#: How a misplaced copy's reason (decide/plan.py) is told of its worker.
_MISPLACED_WORDS = (
    ("outside pool", "outside its pool"),
    ("in avoided pool", "in a pool it avoids"),
    ("worker is retiring", "that is retiring"),
)


def _held_words(n: int, plan: KeyPlan) -> str:
    """``2 copies``; ``1 copy, on a worker outside its pool``; ``3 copies, 1 of them
    on a worker that is retiring``: the copies held, as the planner counts them."""
    copies = counted(n, "copy")
    bad = [a for a in plan.misplaced if a not in plan.good]
    if not bad:
        return copies
    whys = []
    for address in bad:
        why = plan.misplaced[address]
        words = next((w for start, w in _MISPLACED_WORDS if why.startswith(start)), why)
        if words not in whys:
            whys.append(words)
    on = f"on {'a worker' if len(bad) == 1 else 'workers'} {' or '.join(whys)}"
    if len(bad) == n:
        return f"{copies}, {on}"
    return f"{copies}, {len(bad)} of them {on}"


def _placement_words(d: Desired) -> str:
    parts = []
    if d.pool is not None:
        parts.append(f"in pool {','.join(d.pool)}")
    if d.avoid is not None:
        parts.append(f"outside {','.join(d.avoid)}")
    if d.spread == "host":
        parts.append("on distinct hosts")
    return f" {' '.join(parts)}" if parts else ""


# ---------------------------------------------------------------------------------
# 2. Facts
# ---------------------------------------------------------------------------------


def _facts(policy: RulesPolicy, ts: Any, view: KeyView, cluster: ClusterView) -> dict[str, Any]:
    facts = TaskFactsAdapter(ts)
    holders = []
    for address in sorted(view.holders):
        w = cluster.workers.get(address)
        holders.append(
            {
                "address": address,
                "host": w.host if w is not None else "",
                "status": w.status if w is not None else "gone",
                "pools": sorted(w.pools) if w is not None else [],
            }
        )
    flow = getattr(policy, "flow", None)
    entry = flow.prefixes.get(facts.prefix) if flow is not None else None
    return {
        "prefix": facts.prefix,
        "group": facts.group,
        "type": facts.type,
        "nbytes": facts.nbytes,
        "annotations": plain(dict(facts.annotations)),
        "waiters": len(ts.waiters or ()),
        "holders": holders,
        # What tasks of the key's kind produce and free (engine/state/flow.py), if known.
        "memory_flow": None if entry is None else entry.as_dict(),
    }


def plain(value: Any, depth: int = 0) -> Any:
    """``value`` as plain msgpack/JSON data; anything else as its (clipped) repr."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return value if len(value) <= CLIP else value[:CLIP] + "..."
    if depth < 6 and isinstance(value, Mapping):
        return {str(k): plain(v, depth + 1) for k, v in islice(value.items(), 50)}
    if depth < 6 and isinstance(value, (list, tuple)):
        return [plain(v, depth + 1) for v in value[:50]]
    return bounded_repr(value, CLIP)  # repr() itself would walk a shared structure whole


# ---------------------------------------------------------------------------------
# 3. The cascade
# ---------------------------------------------------------------------------------


def _annotation(policy: RulesPolicy, ts: Any) -> tuple[Actions | None, str | None]:
    """The key's ``amm`` annotation as the engine reads it, and why it is ignored."""
    value = (ts.annotations or {}).get("amm")
    if value is None:
        return None, None
    try:
        return parse_actions(value, known_pools=policy.ruleset.pools), None
    except ActionError as exc:
        return None, str(exc)


def _cascade(
    policy: RulesPolicy,
    ts: Any,
    annotation: Actions | None,
    annotation_error: str | None,
    runtime: RuntimeTarget | None,
) -> list[dict[str, Any]]:
    """Every source of fields in the order the cascade consults them, with what each
    decided and what was already decided before it (overridden). A runtime target is
    named by its origin (``client.replicate``, ``scatter broadcast``) when a call of
    distributed's set it."""
    decided, reasons = overrides(annotation, runtime)
    origin = runtime.origin if runtime is not None else "runtime"
    fields = runtime.fields() if runtime is not None else {}
    out: list[dict[str, Any]] = [
        {
            "source": "runtime target" if origin == "runtime" else origin,
            "sets": {f: _field_text(v) for f, v in fields.items()},
            "decided": list(fields),
            "overridden": {},
        }
    ]
    entry: dict[str, Any] = {
        "source": "amm annotation",
        "sets": {},
        "decided": [],
        "overridden": {},
    }
    if annotation_error is not None:
        entry["error"] = f"ignored: {annotation_error}"
    if annotation is not None:
        for f in annotation.set_fields():
            entry["sets"][f] = _field_text(getattr(annotation, f))
            if reasons[f].kind == "annotation":
                entry["decided"].append(f)
            else:
                entry["overridden"][f] = str(reasons[f])
    out.append(entry)
    # What the engine's classifier sees: demand, the published memory flow and costs.
    facts = policy.ctx.facts(ts)
    for rule in policy.ruleset.rules:
        sets = {f: _field_text(getattr(rule.actions, f)) for f in rule.actions.set_fields()}
        row: dict[str, Any] = {
            "rule": rule.name,
            "match": rule.match_source,
            "matched": None,
            "sets": sets,
            "decided": [],
            "overridden": {},
        }
        try:
            row["matched"] = bool(rule.match(facts))
        except Exception as exc:  # as in the engine: an error is "no match"
            row["error"] = f"match raised {exc!r}: no match"
            row["matched"] = False
        if row["matched"]:
            for f in sets:
                if f in decided:
                    row["overridden"][f] = str(reasons[f])
                else:
                    decided[f] = getattr(rule.actions, f)
                    reasons[f] = Reason("rule", rule.name)
                    row["decided"].append(f)
        out.append(row)
    return out


def _field_text(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value)


# ---------------------------------------------------------------------------------
# 4. Per-worker decisions
# ---------------------------------------------------------------------------------


def _decisions(
    policy: RulesPolicy,
    view: KeyView,
    plan: KeyPlan,
    cluster: ClusterView,
    unclassified: bool,
    now: float,
) -> dict[str, dict[str, Any]]:
    """Per worker: ``holds`` (with why the copy does not count, if it does not), or the
    decider table's verdict on a new copy there (:mod:`amm_rules.engine.decide.deciders`)
    with the deciders that said no or throttled; the planner's pick for the next cycle,
    and the worker's role in the last rebalancing plan."""
    d = view.desired
    copy_to = {a.worker: a.reason for a in plan.actions if a.op == "replicate"}
    drop_from = {a.worker: a.reason for a in plan.actions if a.op == "drop"}
    question = Question(view, cluster, unclassified=unclassified)
    settings = policy.rebalancer.settings
    last = policy.rebalancer.last_plan
    roles = last.roles if last is not None and settings.enabled else {}
    out: dict[str, dict[str, Any]] = {}
    for address, w in sorted(cluster.workers.items()):
        if address in view.holders:
            misplaced = stays(d, w) if address in plan.misplaced else None
            deciders = [] if misplaced is None else [misplaced.as_dict()]
            decision = HOLDS
            note = (
                f"the next cycle drops this copy: {drop_from[address]}"
                if address in drop_from
                else None
            )
        else:
            said = decide(question, w)
            deciders = [x.as_dict() for x in said]
            decision = verdict(said)
            note = (
                f"the next cycle copies here: {copy_to[address]}" if address in copy_to else None
            )
        out[address] = {
            "decision": decision,
            "deciders": deciders,
            "next": note,
            "rebalance": roles.get(address),
        }
    return out


# ---------------------------------------------------------------------------------
# 5. History
# ---------------------------------------------------------------------------------


def _history(policy: RulesPolicy, key: Hashable) -> list[dict[str, Any]]:
    try:
        return [decision_dict(d) for d in policy.journal.for_key(key, HISTORY_SHOWN)]
    except TypeError:  # an unhashable "key" compares unequal to every key anyway
        return []
