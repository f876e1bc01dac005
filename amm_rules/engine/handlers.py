"""Scheduler handlers: how clients talk to the rules engine.

Registered on the scheduler by :class:`amm_rules.RulesPolicy` when it is attached to an
Active Memory Manager, and removed at detach; this module is the one owner of their
names. Called by :mod:`amm_rules.client` (``replicate``, ``explain``, ``status``) as
``client.scheduler.<name>(...)``:

- ``amm_rules_set_target(keys, target, fields=None, pending=False)``: set
  (``target=None`` and no ``fields``: remove) a runtime replication target, with other
  action fields (``pool``, ``avoid``, ``spread``, ``move``), on keys in memory; with
  ``pending``, also on keys the scheduler is still computing, from when they enter
  memory (what :func:`amm_rules.persist` asks); returns ``{"set": n, "missing":
  [keys]}``, and with ``pending`` ``"pending": n``;
- ``amm_rules_explain(keys, unmet=False, rule=None, limit=10, counts=False)``: per
  ``str(key)``, what the engine makes of the key (:func:`explain_key`); with
  ``unmet=True``, of up to ``limit`` keys whose target is unmet instead. At most
  :func:`explain_cap` keys, a slice of :data:`EXPLAIN_SLICE` seconds at a time (a
  coroutine: the event loop runs between two); with ``counts=True``: ``{"keys":
  {str(key): ...}, "shown": n, "total": N, "most": cap}``;
- ``amm_rules_status()``: the rules in force, per-rule counters, reload errors, and each
  section's own entry (see :func:`engine_status`);
- ``amm_rules_memory_flow()``: per task prefix, ``{produced, freed, freed_by, live,
  tasks, net_per_task}`` (see :mod:`amm_rules.engine.state.flow`);
- ``amm_rules_drain(workers, deadline, close_workers=False)``: drain workers (addresses
  or names) before a deadline, closing them after with ``close_workers`` (not
  ``close``: the comm takes a message's ``close`` for itself); returns per worker the
  drain's report with its first prediction, and ``amm_rules_drain_report(workers=None)``
  the reports as the drains go (see :mod:`amm_rules.engine.sections.drain`).

The handlers of one engine are a :class:`Handlers` object (the policy's ``handlers``),
built with the engine's context and sections, never the policy. What ``status`` and
``explain`` answer is its :attr:`Handlers.answers`: the engine's own
(:class:`EngineAnswers`) until the observer above the engine
(:mod:`amm_rules.observe.extension`) gives fuller ones.

Bad input is refused: a handler raises ``ValueError`` with a message, and the
answer is then ``{"refused": message}`` (:func:`refusing`), which
:mod:`amm_rules.client`, the command line and the worker preload raise again as that
``ValueError`` (:func:`refused`). A client's mistake is not an error of the scheduler:
it is logged at debug level, never as an ``ERROR`` with a traceback (which distributed
logs for any exception a handler raises). Nothing here may break the scheduler, nor
block its event loop for long. Answers are plain msgpack-able data.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import time
from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from distributed.diagnostics.plugin import SchedulerPlugin

from amm_rules.engine.decide.deciders import worker_reasons
from amm_rules.engine.decide.plan import (
    KeyPlan,
    plan_key,
    source_label,
    target_bounds,
)
from amm_rules.engine.decide.view import ClusterView, KeyView, key_string
from amm_rules.language.fields import ActionError, parse_actions, parse_target
from amm_rules.language.ruleset import ACTION_FIELDS, Actions, Desired, Target

if TYPE_CHECKING:
    from amm_rules.engine.context import EngineContext
    from amm_rules.engine.sections.base import Section
    from amm_rules.engine.sections.drain import DrainSection

logger = logging.getLogger(__name__)

#: Names under which the handlers are registered on the scheduler.
HANDLER_NAMES = (
    "amm_rules_set_target",
    "amm_rules_explain",
    "amm_rules_status",
    "amm_rules_memory_flow",
    "amm_rules_drain",
    "amm_rules_drain_report",
)
#: The scheduler's metadata entry (``Client.get_metadata(["amm-rules"])``) that says the
#: handlers are registered: their names. Clients ask for it
#: before calling a handler (a scheduler does not answer an operation it has no
#: handler for), through the scheduler's own ``get_metadata``, which logs nothing.
METADATA_KEY = "amm-rules"
#: Most keys one call may name (a guard against a runaway client, not a real limit).
MAX_KEYS = 1_000_000
#: Most keys one ``amm_rules_explain`` call explains; the others are counted.
EXPLAIN_KEYS = 1_000
#: Most per-worker rows one call answers (a key in memory has a row per worker, twice):
#: at 1,000 workers, 100 keys (explaining one takes tens of milliseconds there).
EXPLAIN_ROWS = 100_000
#: Seconds of explaining between two yields to the event loop (a slice ends after the
#: key that passes it: one key at 1,000 workers takes 40 to 60 ms).
EXPLAIN_SLICE = 0.02


def explain_cap(workers: int) -> int:
    """Most keys one explain call explains with ``workers`` workers."""
    return max(1, min(EXPLAIN_KEYS, EXPLAIN_ROWS // max(1, workers)))


@dataclass
class Explanation:
    """The work of one explain call, done a slice at a time by the handler."""

    #: The keys to explain, in order (at most :attr:`most`).
    keys: list[Hashable]
    #: How many keys were asked (or, with ``unmet``, are unmet): at least ``len(keys)``.
    total: int
    #: The most keys one call explains (:func:`explain_cap`).
    most: int
    #: Explains one key: its name (``str(key)``) and its answer.
    one: Callable[[Hashable], tuple[str, dict[str, Any]]]


class Answers(Protocol):
    """What answers ``amm_rules_status`` and ``amm_rules_explain`` for a policy."""

    def status(self) -> dict[str, Any]: ...

    def explain(self, keys: list[Hashable], unmet: bool, rule: Any, limit: Any) -> Explanation: ...


#: The one key of a handler's answer to a request it refuses.
REFUSED = "refused"


def refusing(handler: Callable[..., Any]) -> Callable[..., Any]:
    """``handler`` answering ``{"refused": message}`` where it raises ``ValueError``."""

    def refusal(exc: ValueError) -> dict[str, str]:
        logger.debug("amm-rules: refused %s: %s", handler.__name__, exc)
        return {REFUSED: str(exc) or "the request was refused"}

    if inspect.iscoroutinefunction(handler):

        @functools.wraps(handler)
        async def answer_async(**kwargs: Any) -> Any:
            try:
                return await handler(**kwargs)
            except ValueError as exc:
                return refusal(exc)

        return answer_async

    @functools.wraps(handler)
    def answer(**kwargs: Any) -> Any:
        try:
            return handler(**kwargs)
        except ValueError as exc:
            return refusal(exc)

    return answer


def refused(answer: Any) -> Any:
    """A handler's answer, or the ``ValueError`` it stands for if it is a refusal. (No
    answer is a one-entry mapping of ``"refused"`` to a text otherwise: those keyed by
    keys or workers map them to mappings.)"""
    if isinstance(answer, dict) and len(answer) == 1 and isinstance(answer.get(REFUSED), str):
        raise ValueError(answer[REFUSED])
    return answer


def register(scheduler: Any, handlers: Handlers) -> SchedulerPlugin:
    """Install ``handlers`` on ``scheduler`` (replacing any earlier ones). Returns the
    plugin that keeps their metadata entry in place, for the engine to add."""
    for name in HANDLER_NAMES:
        scheduler.handlers[name] = refusing(getattr(handlers, name))
    _publish(scheduler)
    return _Published()


def _publish(scheduler: Any) -> None:
    metadata = getattr(scheduler, "task_metadata", None)
    if isinstance(metadata, dict):
        metadata[METADATA_KEY] = {"handlers": list(HANDLER_NAMES)}


class _Published(SchedulerPlugin):
    """Puts the metadata entry back where the scheduler clears its metadata: when it
    starts (after the policy attached in its constructor) and at ``client.restart()``."""

    name = "amm-rules-handlers"

    async def start(self, scheduler: Any) -> None:
        self.restart(scheduler)

    def restart(self, scheduler: Any) -> None:
        if any(n in scheduler.handlers for n in HANDLER_NAMES):
            _publish(scheduler)


def unregister(scheduler: Any, handlers: Handlers) -> None:
    """Remove ``handlers`` (not those of another policy attached later)."""
    for name in HANDLER_NAMES:
        handler = getattr(scheduler.handlers.get(name), "__wrapped__", None)
        if getattr(handler, "__self__", None) is handlers:
            del scheduler.handlers[name]
    if any(n in scheduler.handlers for n in HANDLER_NAMES):
        return  # another policy's
    metadata = getattr(scheduler, "task_metadata", None)
    if isinstance(metadata, dict):
        metadata.pop(METADATA_KEY, None)


def engine_in_metadata(answer: Any) -> bool:
    """Whether the answer of ``get_metadata(keys=[METADATA_KEY], default=None)`` says the
    handlers are registered (None: the scheduler does not say, e.g. an amm-rules older
    than the entry, or no amm-rules at all)."""
    return isinstance(answer, dict) and all(n in answer.get("handlers", ()) for n in HANDLER_NAMES)


def check_keys(keys: Any) -> list[Hashable]:
    """``keys`` as a list; ``ValueError`` for anything but a list, tuple or set of at most
    :data:`MAX_KEYS` keys."""
    if isinstance(keys, (str, bytes)) or not isinstance(keys, (list, tuple, set, frozenset)):
        raise ValueError(f"keys: expected a list of keys, got {type(keys).__name__}")
    if len(keys) > MAX_KEYS:
        raise ValueError(f"keys: at most {MAX_KEYS} keys per call, got {len(keys)}")
    return list(keys)


def task_of(scheduler: Any, key: Any) -> Any:
    """The scheduler's task of ``key``, or None (also for an unhashable "key")."""
    try:
        return scheduler.tasks.get(key)
    except TypeError:
        return None


class Handlers:
    """The handlers of one engine (bound methods are what the scheduler calls): its
    context, its sections (for status and explain) and its drains."""

    def __init__(
        self, ctx: EngineContext, sections: tuple[Section, ...], drains: DrainSection
    ) -> None:
        self.ctx = ctx
        self.drains = drains
        #: What ``status`` and ``explain`` answer (see the module docstring).
        self.answers: Answers = EngineAnswers(ctx, sections)

    def amm_rules_set_target(
        self, keys: Any = (), target: Any = None, fields: Any = None, pending: Any = False
    ) -> dict[str, Any]:
        """Set a lasting replication target (and other action fields) on keys in
        memory, and with ``pending`` on keys still to compute; None removes it."""
        keys = check_keys(keys)
        ctx = self.ctx
        parsed: Target | None = None
        actions: Actions | None = None
        try:
            if target is not None:
                parsed = parse_target(target, "target")
            if fields is not None:
                if not isinstance(fields, dict) or "replicate" in fields:
                    raise ActionError("fields", "expected pool, avoid, spread or move")
                actions = parse_actions(fields, known_pools=ctx.ruleset.pools)
                if not actions.set_fields():
                    actions = None
        except ActionError as exc:
            raise ValueError(str(exc)) from None
        missing = []
        n = later = 0
        for key in keys:
            ts = task_of(ctx.scheduler, key)
            if ts is not None and ts.state == "memory":
                ctx.set_runtime_target(ts.key, parsed, actions=actions)
                n += 1
            elif pending and (ts is None or ts.state not in ("erred", "forgotten")):
                # Still to compute, or not known yet: the graph of a persist travels on
                # the client's batched stream, this call on another comm, and may be
                # overtaken. Held from when the key enters memory.
                try:
                    ctx.set_runtime_target(key if ts is None else ts.key, parsed, actions=actions)
                except TypeError:  # an unhashable "key"
                    missing.append(key)
                    continue
                later += 1
            else:
                missing.append(key)
        logger.debug(
            "amm-rules: runtime target %s %s set on %d keys (%d pending)",
            parsed,
            actions,
            n,
            later,
        )
        out: dict[str, Any] = {"set": n, "missing": missing}
        if pending:
            out["pending"] = later
        return out

    async def amm_rules_explain(
        self,
        keys: Any = (),
        unmet: bool = False,
        rule: Any = None,
        limit: Any = 10,
        counts: bool = False,
    ) -> dict[str, Any]:
        """Why is each key where it is, and what would the engine do now? (See the
        module docstring: at most :func:`explain_cap` keys, a slice at a time.)"""
        work = self.answers.explain(check_keys(keys), unmet, rule, limit)
        answers, done = await explain_in_slices(self.ctx, work)
        if done < work.total and not counts:
            logger.info(
                "amm-rules: explained %d of %d keys (at most %d in one call)",
                done,
                work.total,
                work.most,
            )
        if counts:
            # shown: the first keys asked that were explained (by position, duplicates
            # counted), so that a caller can ask again for the others.
            return {"keys": answers, "shown": done, "total": work.total, "most": work.most}
        return answers

    def amm_rules_status(self) -> dict[str, Any]:
        """The rules in force, counters per rule (last cycle and totals), the sections."""
        return self.answers.status()

    def amm_rules_memory_flow(self) -> dict[str, dict[str, Any]]:
        """Per task prefix: bytes produced, freed, freed because a task of the prefix
        finished, live now, tasks finished and the net bytes per task."""
        return self.ctx.flow.table()

    def amm_rules_drain(
        self, workers: Any = (), deadline: Any = "60s", close_workers: bool = False
    ) -> dict[str, dict[str, Any]]:
        """Drain ``workers`` before ``deadline``; their reports, with the first prediction."""
        return self.drains.start(workers, deadline, bool(close_workers))

    def amm_rules_drain_report(self, workers: Any = None) -> dict[str, dict[str, Any]]:
        """The drains of ``workers`` (None: all known), as they go."""
        if workers is not None:
            workers = [str(w) for w in check_keys(workers)]
        return self.drains.report(workers)


class EngineAnswers:
    """The engine's own answers to ``status`` and ``explain`` (no observer)."""

    def __init__(self, ctx: EngineContext, sections: tuple[Section, ...]) -> None:
        self.ctx = ctx
        self.sections = sections

    def status(self) -> dict[str, Any]:
        return engine_status(self.ctx, self.sections)

    def explain(
        self, keys: list[Hashable], unmet: bool = False, rule: Any = None, limit: Any = 10
    ) -> Explanation:
        if unmet or rule is not None:
            # Choosing the unmet keys (of a rule) is the observer's conformance: without
            # it, say so rather than explain the keys given (usually none).
            raise ValueError(
                "explaining the unmet keys needs amm_rules.observe, which this scheduler "
                "could not load (its log says why); name the keys to explain instead"
            )
        ctx = self.ctx
        cluster = ctx.cluster_view()
        now = time.monotonic()
        scheduler = ctx.scheduler
        most = explain_cap(len(cluster.workers))

        def one(key: Hashable) -> tuple[str, dict[str, Any]]:
            ts = task_of(scheduler, key)
            return key_string(key), explain_key(ctx, self.sections, ts, cluster, now).answer

        return Explanation(keys[:most], len(keys), most, one)


async def explain_in_slices(ctx: EngineContext, work: Explanation) -> tuple[dict[str, Any], int]:
    """Explain ``work``'s keys, yielding to the event loop every :data:`EXPLAIN_SLICE`
    seconds: the answers, and how many of the keys were explained (all, unless the
    policy detached meanwhile)."""
    answers: dict[str, Any] = {}
    deadline = time.perf_counter() + EXPLAIN_SLICE
    done = 0
    for key in work.keys:
        name, answer = work.one(key)
        answers[name] = answer
        done += 1
        if time.perf_counter() >= deadline:
            await asyncio.sleep(0)
            if not ctx.attached:
                break
            deadline = time.perf_counter() + EXPLAIN_SLICE
    return answers, done


def engine_status(ctx: EngineContext, sections: tuple[Section, ...]) -> dict[str, Any]:
    """The engine's figures for ``amm_rules_status``: whether the AMM runs its cycles
    (``amm``: ``running``, ``since``, ``interval``), the rules in force (and which are
    in dry-run), per-rule counters (``would_request``/``would_drop`` for what dry-run
    held back), reload errors, early cycles, and each section's entry under its
    ``status_key`` (``rebalance``, ``paused_workers``, ``retirements``,
    ``legacy_replicate``, ``demand``, ``memory_flow``, ``memory_pressure``, ``audit``...)."""
    ruleset = ctx.ruleset
    index = ctx.index
    journal = ctx.journal
    rules_file = ctx.rules_file
    labels = set(journal.last_cycle) | set(journal.totals)
    out: dict[str, Any] = {
        # First: whether the AMM runs its cycles at all, since when, and its interval.
        "amm": ctx.amm_running.status(),
        "source": ctx.source,
        "loaded_at": rules_file.loaded_at,
        "reload": rules_file.reload,
        "rules": [r.name for r in ruleset.rules],
        "pools": sorted(ruleset.pools),
        "reduce_replicas": ruleset.reduce_replicas,
        "enforcement": ruleset.enforcement,
        "dry_run": {"rules": sorted(ctx.dry_run.rules), "rebalance": ctx.dry_run.rebalance},
        "governed": len(index),
        # Keys in memory the classification budget has not reached yet.
        "unclassified": index.unclassified,
        "in_flight": len(ctx.ledger),
        "runtime_targets": len(index.runtime),
        "cycles": journal.cycles,
        "last_cycle_ms": round(journal.last_cycle_seconds * 1000, 3),
        "last_cycle": journal.last_cycle,
        "totals": {
            label: {c: journal.totals.get(label, Counter())[c] for c in ("requested", "dropped")}
            for label in sorted(labels)
        },
        "reload_errors": list(rules_file.errors),
        # Features off here for want of an internal of dask or distributed, in words.
        "unsupported": list(ctx.unsupported.values()),
        # Early AMM cycles: settings, requests, cycles run, the last ones and why.
        "early_cycles": ctx.early.status(),
    }
    for section in sections:
        if section.status_key is not None:
            out[section.status_key] = section.status()
    return out


@dataclass
class KeyExplanation:
    """What the engine makes of one key now: the plan a cycle would make, and the
    engine's answer for ``explain`` (:attr:`answer`). For a key not in memory, only
    :attr:`answer` (and :attr:`ts`, None for a key the scheduler does not know)."""

    ts: Any
    answer: dict[str, Any]
    desired: Desired | None = None
    view: KeyView | None = None
    plan: KeyPlan | None = None
    #: The target in copies on the current workers.
    lo: int = 0
    hi: int | None = None


def explain_key(
    ctx: EngineContext, sections: tuple[Section, ...], ts: Any, cluster: ClusterView, now: float
) -> KeyExplanation:
    """Plan one key as a cycle would (on ``cluster``, the planner's view of the workers,
    in which what the planner decides is tallied) and say what the engine makes of it:
    holders, desired, target, eligible, would, workers, and each section's entry under
    its ``explain_key`` (for a key not in memory, those that have something to say).
    Explaining changes nothing of the engine's state."""
    if ts is None or ts.state != "memory":
        answer: dict[str, Any] = {
            "state": ts.state if ts is not None else "unknown",
            "holders": [],
            "governed": False,
            "desired": "not in memory",
        }
        if ts is not None:
            for section in sections:
                if section.explain_key is not None and (said := section.explain(ts, now)):
                    answer[section.explain_key] = said
        return KeyExplanation(ts, answer)
    settings = ctx.settings(now)
    desired = ctx.resolve(ts)
    view = ctx.key_view(ts, desired, now=now)
    plan = plan_key(view, cluster, settings)
    eligible = len(cluster.placeable(desired.pool, desired.avoid))
    lo, hi = target_bounds(desired, view.waiters, settings.reduce_replicas, eligible)
    ignored = ctx.classifier.ignored_annotations(ts)
    answer = {
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
        # min/max in copies on the current workers; "follows_cluster" when the target
        # says 'all' (it grows and shrinks as eligible workers come and go).
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
            "reads": ctx.index.demand.reads.get(ts.key, 0),
            "held": sorted(view.held),
        },
        "eligible": plan.eligible,
        "in_flight": sorted(view.inflight),
        # Who holds the key, and why: the rest of the engine leaves it alone, or keeps
        # its copies (amm_rules.engine.state.claims).
        "held": ctx.claims.explain(ts.key, now),
        "misplaced": dict(plan.misplaced),
        "unmet": plan.unmet,
        "would": [{"op": a.op, "worker": a.worker, "reason": a.reason} for a in plan.actions]
        if desired.governed
        else [],
        "deferred": list(plan.deferred),
        # In dry-run: the label its actions are held back under ("would" lists them);
        # None when they are enacted.
        "dry_run": ctx.dry_run.label(desired),
        "workers": worker_reasons(view, cluster),
        "annotation_ignored": bool(ignored),
        # Which: "amm", "replicate" (the shorthand), or both.
        "annotations_ignored": ignored,
    }
    for section in sections:
        if section.explain_key is not None:
            answer[section.explain_key] = section.explain(ts, now)
    return KeyExplanation(ts, answer, desired, view, plan, lo, hi)


def _plain(value: Any) -> Any:
    if isinstance(value, Target):
        return {"min": value.min, "max": value.max}
    if isinstance(value, tuple):
        return list(value)
    return value
