"""Recompute costs: what each key in memory would cost the scheduler to compute again if
every copy of it were lost, and the work at risk on each worker (for users:
docs/rules.md, "protect", which lists the approximations).

:class:`RecomputeCosts` keeps, per task group (the keys of a group are one function on
different chunks, and share their lineage), what the scheduler itself records as its
tasks finish, read when the estimates are refreshed, never per task:

- the seconds its tasks computed: the scheduler's own sum of the task-finished
  messages' start/stop times for the group (``TaskGroup.all_durations["compute"]``,
  which ``_transition_processing_memory`` adds to before any plugin hears of the
  transition; every distributed version since the floor records it);
- the tasks that did so: the group's tasks done (``TaskGroup.states``: in memory,
  released or forgotten); while keys are kept per group (below), each task finishing
  is counted instead (:attr:`GroupCost.finished`, which recomputed tasks count again,
  as their seconds are);
- its dependencies per task (:attr:`GroupCost.fanin`): while keys are kept per group,
  counted on the first of its tasks seen finishing (``ts.dependencies`` by group);
  else the ratio of the two groups' sizes.

The key index's ``transition`` hook (:class:`~amm_rules.engine.state.index.KeyIndex`)
only sets a flag when a key enters or leaves memory: the cost of the model on the
scheduler's transitions is one attribute write. While the protect section is in the
rules, or a rule reads ``task.recompute_seconds``, the model keeps the keys in memory
per group (:attr:`RecomputeCosts.track_keys`), and the hook then hands it each key
entering or leaving memory.

From these, once per cycle and only if something entered or left memory since the
last, :meth:`RecomputeCosts.refresh` estimates for every group the seconds to bring
one of its keys back, walking the *group* graph
(``TaskGroup.dependencies``), memoized, never the task graph:

    cost(G) = own(G) + sum over dependency groups D of fanin(G, D) * missing(D) * cost(D)

``own(G)`` is the group's compute seconds per finished task; ``missing(D)`` the share of
D's tasks released (not in memory, and not forgotten: a forgotten dependency is never
asked for again).

**Work at risk.** The replica wrappers of :func:`~amm_rules.engine.state.index.watch_scheduler`
tell the model when a key gets or loses its only copy; per group and worker, the keys of
which the worker holds the only copy are counted (:attr:`RecomputeCosts.sole`), and per
worker the seconds they would cost (:attr:`RecomputeCosts.at_risk`): the count times the
group's published estimate, kept up to date as estimates are republished. A status call
reads one number per worker, never the keys.

Neighbours: :mod:`amm_rules.engine.state.index` feeds it;
:mod:`amm_rules.engine.sections.costs` refreshes it each cycle and shows it;
:mod:`amm_rules.engine.sections.protect` spends a memory budget on the dearest keys;
:mod:`amm_rules.engine.adapters` shows :attr:`RecomputeCosts.published` to expressions.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

#: A published estimate is replaced when it moved by more than this share of itself.
REPUBLISH_TOLERANCE = 0.05
#: Groups kept beyond those the scheduler still has, before the others are forgotten.
SPARE_GROUPS = 1_000

#: Where a group's own time per task came from (see :meth:`RecomputeCosts.own`).
MEASURED = "measured"
GROUP_AVERAGE = "group average"
PREFIX_AVERAGE = "prefix average"
UNKNOWN = "unknown"


class GroupCost:
    """What the model knows of one task group (see the module docstring)."""

    __slots__ = ("group", "finished", "fanin", "ancestors", "own", "source", "published", "keys")

    def __init__(self, group: Any):
        self.group = group
        #: Tasks of the group that finished, counted while keys are kept (0: not).
        self.finished = 0
        #: Dependencies per task, by dependency group (None: not sampled).
        self.fanin: dict[Any, int] | None = None
        #: As of the last refresh: ancestor tasks that would run again per key, own
        #: seconds per task and where they came from.
        self.ancestors = 0.0
        self.own: float | None = None
        self.source = UNKNOWN
        #: The estimate published (what rules and the work at risk read).
        self.published: float | None = None
        #: Keys of the group in memory, while kept (see RecomputeCosts.track_keys).
        self.keys: dict[Hashable, Any] | None = None


class RecomputeCosts:
    """Recompute estimates per task group and work at risk per worker (module docstring)."""

    def __init__(self) -> None:
        #: task group -> what is known of it.
        self.groups: dict[Any, GroupCost] = {}
        #: task group -> its published estimate, seconds per key (what expressions read).
        self.published: dict[Any, float] = {}
        #: Set by the hooks when a key entered or left memory: the next refresh recomputes.
        self.changed = False
        #: task group -> {worker address: keys of the group of which it holds the only copy}.
        self.sole: dict[Any, dict[str, int]] = {}
        #: worker address -> seconds of recompute its death would cost now.
        self.at_risk: dict[str, float] = {}
        #: Keep the keys in memory per group (the protect section, or rules reading
        #: ``task.recompute_seconds``, need them); else only counts.
        self.track_keys = False
        #: While the protect section asks (a set, else None): keys whose copies fell to
        #: one, or that left memory, since it last looked.
        self.reduced: set[Hashable] | None = None
        #: Refreshes that recomputed, since the start.
        self.refreshes = 0

    # -- the hooks: keep them minimal ---------------------------------------------------

    def finished(self, ts: Any) -> None:
        """A task finished (``processing -> memory``), while keys are kept: counted for
        its group."""
        self.changed = True
        entry = self.groups.get(ts.group)
        if entry is None or entry.fanin is None:
            entry = self._first(ts)
        else:
            entry.finished += 1
        keys = entry.keys
        if keys is not None:
            keys[ts.key] = ts

    def entered(self, ts: Any) -> None:
        """A key entered memory otherwise than by finishing (kept, if keys are)."""
        self.changed = True
        if self.track_keys:
            entry = self.groups.get(ts.group) or self._entry(ts.group)
            if entry.keys is not None:
                entry.keys[ts.key] = ts

    def left(self, ts: Any) -> None:
        """A key left memory, while keys are kept (the hook sets :attr:`changed`)."""
        entry = self.groups.get(ts.group)
        if entry is not None and entry.keys is not None:
            entry.keys.pop(ts.key, None)
        if (reduced := self.reduced) is not None:
            reduced.add(ts.key)

    def _first(self, ts: Any) -> GroupCost:
        """The first task of a group seen finishing: the group's entry, its tasks done
        so far (this one, and any that finished before the engine watched) and its
        dependencies per task, counted on this task."""
        group = ts.group
        entry = self.groups.get(group) or self._entry(group)
        entry.finished = max(1, _done(group))
        entry.fanin = Counter(dts.group for dts in ts.dependencies)
        return entry

    def _entry(self, group: Any) -> GroupCost:
        entry = self.groups[group] = GroupCost(group)
        if self.track_keys:
            entry.keys = {}
        return entry

    # -- copies: the work at risk ---------------------------------------------------------

    def copy_added(self, ts: Any, ws: Any, held: int) -> None:
        """``ws`` got a copy of ``ts``, which now has ``held`` (1 or 2) copies."""
        if held == 1:
            self._sole(ts.group, ws.address, 1)
        else:
            for other in ts.who_has:
                if other is not ws:
                    self._sole(ts.group, other.address, -1)

    def copy_removed(self, ts: Any, ws: Any, held: int) -> None:
        """``ws`` lost its copy of ``ts``, which now has ``held`` (0 or 1) copies."""
        if held == 0:
            self._sole(ts.group, ws.address, -1)
        else:
            for other in ts.who_has:
                self._sole(ts.group, other.address, 1)
            if (reduced := self.reduced) is not None:
                reduced.add(ts.key)

    def all_removed(self, ts: Any) -> None:
        """Every copy of ``ts`` goes (it leaves memory); it had exactly one."""
        for ws in ts.who_has:
            self._sole(ts.group, ws.address, -1)

    def _sole(self, group: Any, address: str, n: int) -> None:
        by_worker = self.sole.get(group)
        if by_worker is None:
            # A group seen for the first time: estimated at the next refresh.
            by_worker = self.sole[group] = {}
            if group not in self.groups:
                self._entry(group)
            self.changed = True
        by_worker[address] = by_worker.get(address, 0) + n
        cost = self.published.get(group)
        if cost:
            at_risk = self.at_risk
            at_risk[address] = at_risk.get(address, 0.0) + n * cost

    def seed(self, in_memory: Iterable[Any], track: bool) -> None:
        """Count the keys in memory when the engine attaches (the one scan that costs):
        sole copies per worker and group, and their keys if ``track``."""
        self.changed = True
        for ts in in_memory:
            group = ts.group
            entry = self.groups.get(group) or self._entry(group)
            who_has = ts.who_has
            if who_has is not None and len(who_has) == 1:
                for ws in who_has:
                    self._sole(group, ws.address, 1)
            if track and entry.keys is not None:
                entry.keys[ts.key] = ts

    def worker_left(self, address: str) -> None:
        """A worker left (its copies were removed one by one before): forget it."""
        self.at_risk.pop(address, None)
        for by_worker in self.sole.values():
            by_worker.pop(address, None)

    def start_tracking(self, in_memory: Iterable[Any]) -> None:
        """Keep the keys in memory per group from now on; ``in_memory``: those in memory."""
        self.track_keys = True
        for entry in self.groups.values():
            entry.keys = {}
        for ts in in_memory:
            entry = self.groups.get(ts.group) or self._entry(ts.group)
            assert entry.keys is not None
            entry.keys[ts.key] = ts

    def stop_tracking(self) -> None:
        self.track_keys = False
        for entry in self.groups.values():
            entry.keys = None

    # -- the estimates -----------------------------------------------------------------

    def refresh(self, task_groups: Mapping[str, Any] | None = None) -> list[Any]:
        """Estimate every group again if keys entered or left memory since the last
        refresh, republishing those that moved by more than :data:`REPUBLISH_TOLERANCE`
        (the work at risk follows). Returns the groups republished. ``task_groups``
        (the scheduler's): groups it forgot are dropped once many are kept."""
        if not self.changed:
            return []
        self.changed = False
        self.refreshes += 1
        memo: dict[Any, tuple[float, float]] = {}
        out = []
        for group, entry in self.groups.items():
            cost, ancestors = self._estimate(group, memo)
            entry.ancestors = ancestors
            entry.own, entry.source = self.own(group)
            estimate = None if entry.own is None and cost == 0 else cost
            if _moved(entry.published, estimate):
                self._publish(group, entry, estimate)
                out.append(group)
        if task_groups is not None and len(self.groups) > 2 * len(task_groups) + SPARE_GROUPS:
            self._forget_groups(task_groups)
        return out

    def own(self, group: Any) -> tuple[float | None, str]:
        """Seconds one task of ``group`` computes, and where the figure came from: its
        tasks counted finishing (``measured``), its tasks done (``group average``), the
        prefix's average duration, or nothing."""
        total = group.all_durations.get("compute", 0.0)
        entry = self.groups.get(group)
        if entry is not None and entry.finished > 0 and total > 0:
            return total / entry.finished, MEASURED
        done = _done(group)
        if total > 0 and done > 0:
            return total / done, GROUP_AVERAGE
        average = getattr(group.prefix, "duration_average", None)
        if average is not None and average >= 0:
            return float(average), PREFIX_AVERAGE
        return None, UNKNOWN

    def _estimate(self, root: Any, memo: dict[Any, tuple[float, float]]) -> tuple[float, float]:
        """``(cost, ancestors)`` of one task of ``root``: depth first over the group
        graph, without recursion (chains of thousands of groups), each group once per
        refresh; a group met again on its own path (a cycle of groups) counts 0."""
        if root in memo:
            return memo[root]
        on_path: set[Any] = {root}
        stack: list[tuple[Any, list[Any]]] = [(root, list(root.dependencies))]
        while stack:
            group, todo = stack[-1]
            while todo:
                dep = todo.pop()
                if dep not in memo and dep not in on_path:
                    on_path.add(dep)
                    stack.append((dep, list(dep.dependencies)))
                    break
            else:
                stack.pop()
                on_path.discard(group)
                memo[group] = self._combine(group, memo)
        return memo[root]

    def _combine(self, group: Any, memo: Mapping[Any, tuple[float, float]]) -> tuple[float, float]:
        """The formula of the module docstring, for ``group`` once its dependencies
        are estimated (those absent from ``memo`` closed a cycle: they count 0)."""
        own, _ = self.own(group)
        cost = own or 0.0
        ancestors = 0.0
        entry = self.groups.get(group)
        fanin = entry.fanin if entry is not None else None
        size = max(1, len(group))
        for dep in group.dependencies:
            known = memo.get(dep)
            if known is None:
                continue
            states = dep.states
            alive = len(dep) - states.get("forgotten", 0)
            released = states.get("released", 0)
            if released <= 0 or alive <= 0:
                continue
            missing = released / alive
            per_task: float | None = fanin.get(dep) if fanin is not None else None
            if per_task is None:
                per_task = max(1.0, len(dep) / size)
            need = per_task * missing
            cost += need * known[0]
            ancestors += need * (1.0 + known[1])
        return cost, ancestors

    def _publish(self, group: Any, entry: GroupCost, value: float | None) -> None:
        """Publish ``value`` for ``group``; the work at risk of every worker holding a
        sole copy of one of its keys moves with it."""
        delta = (value or 0.0) - (entry.published or 0.0)
        entry.published = value
        if value is None:
            self.published.pop(group, None)
        else:
            self.published[group] = value
        by_worker = self.sole.get(group)
        if by_worker and delta:
            at_risk = self.at_risk
            for address, n in by_worker.items():
                if n:
                    at_risk[address] = at_risk.get(address, 0.0) + n * delta

    def _forget_groups(self, task_groups: Mapping[str, Any]) -> None:
        """Forget the groups the scheduler no longer has (nothing of theirs is in
        memory); an ancestor forgotten here is estimated from the scheduler's figures."""
        for group in [g for g in self.groups if task_groups.get(g.name) is not g]:
            if any(self.sole.get(group, {}).values()):
                continue
            del self.groups[group]
            self.published.pop(group, None)
            self.sole.pop(group, None)

    # -- reading ---------------------------------------------------------------------

    def estimate(self, group: Any) -> float | None:
        """The published estimate of a key of ``group``, seconds (None: unknown)."""
        return self.published.get(group)

    def total_at_risk(self) -> float:
        """Seconds of recompute that every sole copy in the cluster stands for."""
        return sum(v for v in self.at_risk.values() if v > 0)

    def top_at_risk(self, n: int) -> list[tuple[str, float]]:
        """The ``n`` workers with the most work at risk, most first."""
        rows = [(a, v) for a, v in self.at_risk.items() if v > 1e-9]
        rows.sort(key=lambda kv: (-kv[1], kv[0]))
        return rows[:n]

    def sole_keys(self, address: str) -> int:
        """Keys of which the worker at ``address`` holds the only copy (any group)."""
        return sum(by_worker.get(address, 0) for by_worker in self.sole.values())

    def keys_of(self, group: Any) -> Mapping[Hashable, Any]:
        """The keys of ``group`` in memory (empty unless :attr:`track_keys`)."""
        entry = self.groups.get(group)
        return entry.keys if entry is not None and entry.keys is not None else {}


def _done(group: Any) -> int:
    """The group's tasks done: in memory, released or forgotten."""
    states = group.states
    return states.get("memory", 0) + states.get("released", 0) + states.get("forgotten", 0)


def _moved(old: float | None, new: float | None) -> bool:
    """Whether a published estimate ``old`` should give way to ``new``."""
    if old is None or new is None:
        return old is not new
    return abs(new - old) > REPUBLISH_TOLERANCE * max(abs(old), abs(new))


__all__ = ["GroupCost", "RecomputeCosts", "REPUBLISH_TOLERANCE"]
