"""The audit: the safety net behind the engine's scheduler hooks.

The engine learns of changes through hooks (a scheduler plugin for keys entering and
leaving memory, wrappers of ``add_replica``/``remove_replica``/``update_data``; see
:mod:`amm_rules.engine.state.index`). A change that reaches the scheduler some other way, in this
version of ``distributed`` or a later one, would leave the index wrong for good. The
audit compares the index with the scheduler, a slice per cycle, and repairs it:

- a governed key whose task left memory, or was replaced by a new task under the same
  key, is forgotten (``governed_gone``);
- every other governed key is checked by the planner again, as after workers change, so
  that copies made or lost unseen are seen;
- a key the scheduler lists as holding several copies (``replicated_tasks``) that the
  engine does not know as governed is classified again if the hooks never reported its
  copies, or if the rules say it is governed after all (``replicated_unknown``): until
  then reduce-replicas would trim it like a key no rule governs.

A sweep looks at every governed key and every replicated key once, :data:`CHUNK` of each
per cycle, from lists taken when it starts; a key that changed since is looked up afresh.
A sweep starts every ``audit_interval`` seconds, or when the previous one ends if that is
later. It never scans ``scheduler.tasks``.

Neighbours: :class:`AuditSection` runs :meth:`Auditor.step` once per cycle, first (after
the placements are fresh, before classification), and reports a finished sweep that
found something as an ``audit`` event and a warning.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Iterable
from typing import TYPE_CHECKING, Any

from amm_rules.engine.sections.base import Cycle, Section
from amm_rules.engine.state.governed import PlanClass
from amm_rules.engine.state.index import KeyIndex

if TYPE_CHECKING:
    from amm_rules.engine.context import EngineContext

logger = logging.getLogger(__name__)

#: Governed keys, and replicated keys, looked at per cycle.
CHUNK = 1_000

#: What a sweep counts (all zero on a consistent index).
FOUND = ("governed_gone", "replicated_unknown")


class Auditor:
    """Sweeps the index against the scheduler, :data:`CHUNK` keys of each kind per cycle."""

    def __init__(self, interval: float | None, chunk: int = CHUNK):
        #: Seconds between the starts of two sweeps; None: never audit.
        self.interval = interval
        self.chunk = chunk
        #: When the next sweep may start (``time.monotonic()``).
        self.next_sweep = 0.0
        #: Sweeps finished, and what the last one found.
        self.sweeps = 0
        self.last: dict[str, int] | None = None
        #: The sweep's governed keys still to look at, by plan class.
        self._governed: list[tuple[PlanClass, list[Hashable]]] = []
        self._replicated: list[Any] = []
        self._found = dict.fromkeys(FOUND, 0)
        #: Whether a sweep is under way.
        self.sweeping = False

    def start_in(self, now: float) -> None:
        """No sweep before ``now + interval`` (called when the policy attaches)."""
        if self.interval is not None:
            self.next_sweep = now + self.interval

    def step(
        self,
        now: float,
        index: KeyIndex,
        scheduler: Any,
        resolve: Callable[[Any], Any],
        suspects: Callable[[PlanClass, list[Any]], Iterable[Any]],
        kept: Callable[[Hashable], int] | None = None,
    ) -> dict[str, int] | None:
        """This cycle's slice of the sweep. Returns the counts of a sweep that finished
        in this cycle, else None. ``resolve(ts)`` is what the rules want for a task;
        ``suspects(cls, tasks)`` those of a class's tasks that may need the planner
        (:meth:`KeyIndex.suspects` with the class's placement); ``kept(key)``: the copies
        a claim keeps of a key (:meth:`Claims.keeps
        <amm_rules.engine.state.claims.Claims.keeps>`: out of reduce-replicas' walk
        while it holds no more than those copies)."""
        if not self.sweeping:
            if self.interval is None or now < self.next_sweep:
                return None
            self.next_sweep = now + self.interval
            self._governed = [(cls, list(group)) for cls, group in index.governed.groups.items()]
            self._replicated = list(scheduler.replicated_tasks)
            self._found = dict.fromkeys(FOUND, 0)
            self.sweeping = True
        self._check_governed(index, scheduler.tasks, suspects)
        self._check_replicated(index, resolve, kept)
        if self._governed or self._replicated:
            return None
        self.sweeping = False
        self.sweeps += 1
        self.last = dict(self._found)
        return self.last

    def _check_governed(
        self,
        index: KeyIndex,
        tasks: Any,
        suspects: Callable[[PlanClass, list[Any]], Iterable[Any]],
    ) -> None:
        budget = self.chunk
        while budget and self._governed:
            cls, keys = self._governed[-1]
            take = keys[-budget:]
            del keys[-budget:]
            if not keys:
                self._governed.pop()
            budget -= len(take)
            group = index.governed.groups.get(cls, {})
            alive = []
            for key in take:
                ts = group.get(key)
                if ts is None:
                    continue  # left or re-filed since the sweep started: the hooks saw it
                if ts.state != "memory" or tasks.get(key) is not ts:
                    index.forget(key)
                    self._found["governed_gone"] += 1
                else:
                    alive.append(ts)
            # The planner's own cheap test (copies, placement); keys that fail it are
            # planned in this cycle, as after workers change.
            index.look_again(ts.key for ts in suspects(cls, alive))

    def _check_replicated(
        self,
        index: KeyIndex,
        resolve: Callable[[Any], Any],
        kept: Callable[[Hashable], int] | None,
    ) -> None:
        todo = self._replicated
        desired, free = index.desired, index.replicated_free
        waiting = index.may_be_unclassified
        # Keys whose copies changed since the last cycle are filed by this cycle, after
        # the audit step: the hooks saw them (a key scattered with one copy, classified,
        # then broadcast, is in none of the other sets yet).
        touched = index.touched
        for _ in range(min(self.chunk, len(todo))):
            ts = todo.pop()
            key = ts.key
            if ts.state != "memory" or key in desired or key in touched or waiting(key):
                continue
            if kept is not None and len(ts.who_has or ()) <= kept(key):
                continue  # out of the walk while it holds no more than the copies kept
            if key not in free or resolve(ts).governed:
                # Unknown to reduce-replicas' walk, or filed there though a rule
                # governs it: classified again in this cycle.
                # Routed once classified: to reduce-replicas' walk if no rule governs it.
                index.requeue(key)
                self._found["replicated_unknown"] += 1


class AuditSection(Section):
    """The audit sweeps in the policy's cycle; ``interval``: seconds between the starts
    of two sweeps (None: never)."""

    offline = "audit: not simulated: a simulation keeps its index itself"
    name = "audit"
    status_key = "audit"

    def __init__(self, ctx: EngineContext, interval: float | None = 60.0):
        super().__init__(ctx)
        self.auditor = Auditor(None if interval is None else float(interval))

    def attach(self) -> None:
        self.auditor.start_in(time.monotonic())

    def run(self, cycle: Cycle) -> tuple[()]:
        """This cycle's slice of the sweep; report a finished sweep that found state the
        hooks had missed (it has been repaired by then)."""
        ctx = self.ctx
        index = ctx.index
        placements = ctx.placements
        reduce_replicas = ctx.ruleset.reduce_replicas
        found = self.auditor.step(
            time.monotonic(),
            index,
            ctx.scheduler,
            resolve=ctx.resolve,
            suspects=lambda cls, members: index.governed.suspects(
                cls, placements.of(cls), reduce_replicas, members
            ),
            kept=ctx.claims.keeps if ctx.claims.held else None,
        )
        if found is not None and any(found.values()):
            logger.warning("amm-rules: the audit found state the hooks missed: %s", found)
            ctx.events.emit("audit", **found)
        return ()

    def status(self) -> dict[str, Any]:
        auditor = self.auditor
        return {"sweeps": auditor.sweeps, "sweeping": auditor.sweeping, "last": auditor.last}
