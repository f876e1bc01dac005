"""The work the sections that empty workers share: the retirements, the drains that
pace them and the paused-workers section.

What they ask of the evacuation planner
(:func:`~amm_rules.engine.decide.evacuate.plan_evacuation`) is built here from the
engine's context (:func:`evacuation_input`: the keys' views, with the ledger's copies in
flight, and the cluster with the leaving workers marked); the copies it plans are
suggested with the recipient as the only candidate (:func:`suggest_copies`) and
recorded in the ledger with who asked (:func:`record_copy`). A leaving worker's keys in
the drain's order of value (:func:`rank_views`, :func:`drain_item`) serve the drains and
the retirements adaptive scale-down asks for.

Neighbours: :mod:`amm_rules.engine.sections.retirement`,
:mod:`amm_rules.engine.sections.drain`, :mod:`amm_rules.engine.sections.paused_workers`,
:mod:`amm_rules.engine.sections.adaptive` and ``amm-rules simulate --drain``
(:mod:`amm_rules.offline.drain`) use it; sections never import each other.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Hashable, Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from dask.utils import key_split
from distributed.active_memory_manager import Suggestion

from amm_rules.engine import key_logger
from amm_rules.engine.decide.drain import DrainItem, rank
from amm_rules.engine.decide.evacuate import Copy, Evacuation, leaving_view
from amm_rules.engine.decide.plan import needed_copies, source_label
from amm_rules.engine.decide.view import ClusterView, KeyView, key_string
from amm_rules.language.ruleset import UNGOVERNED, Desired

if TYPE_CHECKING:
    from amm_rules.engine.context import EngineContext

#: Keys named in an event or a status line (the count is always given).
KEYS_SHOWN = 20


def desired_of(ctx: EngineContext, ts: Any) -> Desired:
    """What the rules want for a key in memory, classifying (and filing) it now if the
    policy has not yet (it entered memory since the last cycle: a retirement may come
    before that cycle)."""
    index = ctx.index
    key = ts.key
    if not index.may_be_unclassified(key):
        return index.desired.get(key, UNGOVERNED)
    desired = ctx.resolve(ts)
    index.unqueue(key)
    if desired.governed:
        index.governed.put(key, ts, desired)
    else:
        index.governed.unindex(key)
    return desired


def evacuation_input(
    ctx: EngineContext, tasks: Iterable[Any], leaving: Iterable[str]
) -> tuple[list[KeyView], ClusterView]:
    """Key views of ``tasks`` (with the ledger's copies in flight) and the cluster with
    ``leaving`` marked, for :func:`~amm_rules.engine.decide.evacuate.plan_evacuation`."""
    # Workers that joined since the policy's last cycle: a retirement may come before it.
    ctx.placements.include_new_workers(ctx.amm.measure)
    manager = ctx.manager
    pending = getattr(manager, "pending", None)  # only exists during an AMM cycle
    cluster = leaving_view(ctx.cluster_view().workers.values(), leaving)
    views = []
    dry_run = ctx.dry_run
    for ts in tasks:
        desired = desired_of(ctx, ts)
        view = ctx.key_view(ts, desired, pending)
        if desired.governed and dry_run.keys_active and dry_run.label(desired) is not None:
            # In dry-run its rules do not act: placed as if nothing governed it (one
            # copy on any worker that stays), its copies in flight kept.
            view = replace(view, desired=UNGOVERNED)
        views.append(view)
    return views, cluster


def dry_run_keys(ctx: EngineContext, views: Iterable[KeyView]) -> list[Hashable]:
    """The keys of ``views`` that their rules govern but placed as ungoverned: in
    dry-run (see :func:`evacuation_input`)."""
    governed = ctx.index.desired
    return [v.key for v in views if not v.desired.governed and v.key in governed]


def record_copy(ctx: EngineContext, by: str, copy: Copy, now: float) -> None:
    """Remember a copy the AMM accepted, asked by ``by``, until it lands or its deadline
    passes (the ledger)."""
    ctx.ledger.record(copy.key, copy.worker, by, now + ctx.inflight_timeout, copy.nbytes)


def suggest_copies(
    plan: Evacuation, by_key: Mapping[Hashable, Any], workers: Mapping[str, Any], why: str
) -> Generator[Suggestion, Any, list[tuple[Copy, Any]]]:
    """Suggest each copy of an evacuation plan (its worker the only candidate), logging
    each answer with ``why`` (``retiring ADDRESS``); returns the copies the AMM accepted,
    with their tasks."""
    accepted = []
    for copy in plan.copies:
        ts = by_key[copy.key]
        choice = yield Suggestion("replicate", ts, {workers[copy.worker]})
        key_logger.debug(
            "(replicate, %s, %s) %s: %s (%s)",
            copy.key,
            copy.worker,
            "accepted" if choice else "refused",
            copy.reason,
            why,
        )
        if choice is not None:
            accepted.append((copy, ts))
    return accepted


def shown_keys(keys: Iterable[Hashable]) -> list[str]:
    return [key_string(k) for k in list(keys)[:KEYS_SHOWN]]


def blocked_fields(stuck: Mapping[Hashable, tuple[str, str]]) -> dict[str, Any]:
    """An event's words for the keys that keep a worker from leaving (``stuck``: key ->
    (why, rule)): the first keys, their count, the rules and the reasons, sorted."""
    return {
        "keys": shown_keys(stuck),
        "count": len(stuck),
        "rules": sorted({rule for _, rule in stuck.values()}),
        "why": sorted({why for why, _ in stuck.values()}),
    }


# -- the order of value of a worker's keys ------------------------------------------


def rank_views(
    views: list[KeyView],
    cluster: ClusterView,
    tasks: Mapping[Hashable, Any],
    estimate: Callable[[Any], float | None],
    on_disk: Mapping[Hashable, Any] | None = None,
) -> tuple[list[KeyView], dict[Hashable, DrainItem]]:
    """``views`` in the drain's order of value, and the drain's item of each key
    (``tasks``: the scheduler's, for the keys' groups; ``estimate``: a group's recompute
    estimate; ``on_disk``: the keys the worker holds on disk, read back before they
    leave). Shared by the section and ``amm-rules simulate --drain``."""
    items = [drain_item(v, cluster, tasks.get(v.key), estimate) for v in views]
    if on_disk:
        items = [replace(i, on_disk=i.nbytes) if i.key in on_disk else i for i in items]
    pairs = list(zip(views, items, strict=True))
    view_of = {id(item): view for view, item in pairs}
    return [view_of[id(i)] for i in rank(items)], {view.key: item for view, item in pairs}


def drain_item(
    view: KeyView, cluster: ClusterView, ts: Any, estimate: Callable[[Any], float | None]
) -> DrainItem:
    """The drain's view of one key: size, copies needed, recompute estimate, target,
    and its group (the task group's name; else the key's prefix, as dask's
    ``key_split`` gives it)."""
    d = view.desired
    placeable = cluster.placeable(d.pool, d.avoid)
    staying = len((view.holders - cluster.closing) & placeable)
    minimum = needed_copies(d.replicate, len(placeable)) if d.replicate is not None else 0
    group = getattr(ts, "group", None)
    return DrainItem(
        key=view.key,
        nbytes=view.nbytes,
        copies=max(1, (minimum or 1) - staying),
        seconds=estimate(group) if group is not None else None,
        minimum=minimum,
        staying=staying,
        rule=source_label(d, "replicate") if d.replicate is not None else "",
        group=getattr(group, "name", "") or key_split(view.key),
    )
