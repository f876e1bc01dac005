"""Memory flow per task prefix: how many bytes each kind of task produces, how many
leave memory, and how many leave *because* a task of the kind finished.

distributed keeps ``TaskPrefix.nbytes_total`` (bytes produced, never decreased while the
prefix's groups live) and nothing about freed bytes. :class:`MemoryFlow`, fed by the
scheduler's transitions, keeps per prefix the counters of :class:`PrefixFlow`, the
figures docs/memory-flow.md tabulates. ``freed_by`` (bytes of other keys that left
memory in the same stimulus as a task of the prefix finishing) rests on the scheduler
handling a ``task-finished`` message as one stimulus: the task enters memory, then its
inputs whose last waiter it was are released, with the same ``stimulus_id`` (checked
against the installed distributed by
``tests/engine/sections/memory_flow/test_memory_flow.py``).

It is fed in one of two ways. In the engine, the index's ``transition`` hook
(:class:`~amm_rules.engine.state.index.KeyIndex`), which already looks at every key entering
or leaving memory and reads its task, hands those to :meth:`MemoryFlow.entered` and
:meth:`MemoryFlow.left`: the flow costs no scheduler-plugin call of its own, and nothing
on the transitions that neither enter nor leave memory. On its own, :class:`MemoryFlow`
is a scheduler plugin whose ``transition`` hook does the same (two string comparisons
for the other transitions). Either way, a transition into or out of memory costs a dict
lookup and a few additions (the scale benchmark measures both ways).
At most :data:`MAX_PREFIXES` prefixes are kept: past that, prefixes with nothing in
memory are forgotten, oldest first, and counted in :attr:`MemoryFlow.evicted`.

Rules read the flow as ``task.prefix_*`` attributes (:data:`FLOW_ATTRIBUTES`) through
:meth:`MemoryFlow.publish`: a snapshot, republished per prefix when a figure moved by
more than :data:`REPUBLISH_TOLERANCE`, so that rules see stable values and keys are
classified again only when their kind's figures really changed (the keys in memory per
prefix are kept only while some rule reads these attributes).

Neighbours: :mod:`amm_rules.engine.policy` has its index feed the flow, and publishes each
cycle; :mod:`amm_rules.engine.state.index` calls the two hooks;
:mod:`amm_rules.engine.adapters` shows published figures to expressions;
:mod:`amm_rules.engine.handlers` answers ``amm_rules_memory_flow``;
:mod:`amm_rules.engine.sections.memory_pressure` reads producers from here.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from typing import Any, NamedTuple

from distributed.diagnostics.plugin import SchedulerPlugin

from amm_rules.language.ruleset import FLOW_ATTRIBUTES

#: Most prefixes kept (see the module docstring).
MAX_PREFIXES = 10_000
#: A published figure is replaced when it moved by more than this share of its size.
REPUBLISH_TOLERANCE = 0.10
#: The counters that only grow (totals over every prefix, see :meth:`MemoryFlow.totals`).
TOTALS = ("produced", "freed", "freed_by", "tasks")


class PrefixFlow:
    """The counters of one prefix (bytes, and tasks finished)."""

    __slots__ = ("name", "produced", "freed", "freed_by", "live", "tasks", "keys", "dirty")

    def __init__(self, name: str) -> None:
        self.name = name
        self.produced = 0
        self.freed = 0
        self.freed_by = 0
        self.live = 0
        self.tasks = 0
        #: Keys of the prefix in memory, while rules read flow attributes; else None.
        self.keys: set[Hashable] | None = None
        #: Changed since the last :meth:`MemoryFlow.publish`.
        self.dirty = False

    @property
    def net_per_task(self) -> float | None:
        """(produced - freed_by) / tasks; None before the first task finished."""
        if not self.tasks:
            return None
        return (self.produced - self.freed_by) / self.tasks

    def as_dict(self) -> dict[str, int | float | None]:
        net = self.net_per_task
        return {
            "produced": self.produced,
            "freed": self.freed,
            "freed_by": self.freed_by,
            # A key's size can be re-reported while it is in memory: never below 0.
            "live": max(self.live, 0),
            "tasks": self.tasks,
            "net_per_task": None if net is None else round(net, 1),
        }


class PrefixFacts(NamedTuple):
    """What expressions see of a prefix (``task.prefix_*``): a published snapshot.
    Field names are those of :data:`~amm_rules.language.ruleset.FLOW_ATTRIBUTES`
    without ``prefix_``."""

    tasks: int
    produced_per_task: float
    freed_by_per_task: float
    net_per_task: float

    @classmethod
    def of(cls, entry: PrefixFlow) -> PrefixFacts:
        n = entry.tasks
        return cls(
            n, entry.produced / n, entry.freed_by / n, (entry.produced - entry.freed_by) / n
        )


def _moved(old: PrefixFacts, new: PrefixFacts) -> bool:
    """Whether ``new`` differs from ``old`` enough to be published."""
    for a, b in zip(old, new, strict=True):
        if (a > 0) != (b > 0) or (a < 0) != (b < 0):
            return True
        if abs(b - a) > REPUBLISH_TOLERANCE * max(abs(a), abs(b)):
            return True
    return False


class MemoryFlow(SchedulerPlugin):
    """Per-prefix memory flow, fed by the scheduler's transitions (module docstring)."""

    name = "amm-rules-memory-flow"

    def __init__(self, tasks: Mapping[Hashable, Any] | None = None) -> None:
        #: The scheduler's tasks (set at attach).
        self.tasks: Mapping[Hashable, Any] = tasks if tasks is not None else {}
        #: prefix name -> its counters, oldest prefix first.
        self.prefixes: dict[str, PrefixFlow] = {}
        #: Prefixes forgotten to stay within :data:`MAX_PREFIXES`, and their counters
        #: (so that totals over every prefix never decrease).
        self.evicted = 0
        self.evicted_counts: dict[str, int] = dict.fromkeys(TOTALS, 0)
        #: prefix name -> the figures rules see (see :meth:`publish`).
        self.published: dict[str, PrefixFacts] = {}
        #: Keep the keys in memory per prefix (some rule reads flow attributes).
        self.track_keys = False
        self._dirty: list[PrefixFlow] = []
        # The last task that finished: its stimulus, its key and its prefix's counters.
        self._stimulus: str | None = None
        self._finished: Hashable = None
        self._by: PrefixFlow | None = None

    # -- the hooks: keep them minimal, they run on every transition ---------------------

    def transition(
        self,
        key: Hashable,
        start: str,
        finish: str,
        *args: Any,
        stimulus_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        """The hook when the flow is a scheduler plugin of its own (the engine's index
        calls :meth:`entered` and :meth:`left` instead)."""
        if finish == "memory":
            ts = self.tasks.get(key)
            if ts is not None:
                self.entered(key, ts, start, stimulus_id)
        elif start == "memory":
            ts = self.tasks.get(key)
            if ts is not None:
                self.left(key, ts, stimulus_id)

    def entered(self, key: Hashable, ts: Any, start: str, stimulus_id: str | None) -> None:
        """``key`` (task ``ts``) entered memory from ``start``."""
        entry = self.prefixes.get(ts.prefix.name) or self._entry(ts.prefix.name)
        nbytes = ts.nbytes
        if nbytes < 0:
            nbytes = 0
        entry.live += nbytes
        if start == "processing":
            entry.produced += nbytes
            entry.tasks += 1
            self._stimulus = stimulus_id
            self._finished = key
            self._by = entry
            if not entry.dirty:  # its published figures may move
                entry.dirty = True
                self._dirty.append(entry)
        if entry.keys is not None:
            entry.keys.add(key)

    def left(self, key: Hashable, ts: Any, stimulus_id: str | None) -> None:
        """``key`` (task ``ts``) left memory."""
        entry = self.prefixes.get(ts.prefix.name) or self._entry(ts.prefix.name)
        nbytes = ts.nbytes
        if nbytes < 0:
            nbytes = 0
        entry.live -= nbytes
        entry.freed += nbytes
        if stimulus_id == self._stimulus and key != self._finished:
            by = self._by
            if by is not None:
                by.freed_by += nbytes
                if not by.dirty:
                    by.dirty = True
                    self._dirty.append(by)
        if entry.keys is not None:
            entry.keys.discard(key)

    def _entry(self, prefix: str) -> PrefixFlow:
        """The counters of a prefix, created if needed (the hook looks first)."""
        entry = self.prefixes.get(prefix)
        if entry is None:
            if len(self.prefixes) >= MAX_PREFIXES:
                self._evict()
            entry = self.prefixes[prefix] = PrefixFlow(prefix)
            if self.track_keys:
                entry.keys = set()
        return entry

    def _evict(self) -> None:
        """Forget a tenth of the prefixes, oldest first, those with nothing in memory
        before the others."""
        n = max(1, MAX_PREFIXES // 10)
        order = sorted(self.prefixes, key=lambda p: self.prefixes[p].live > 0)
        counts = self.evicted_counts
        for name in order[:n]:
            entry = self.prefixes.pop(name)
            self.published.pop(name, None)
            for field in TOTALS:
                counts[field] += getattr(entry, field)
            if entry is self._by:
                self._by = None
        prefixes = self.prefixes
        self._dirty = [e for e in self._dirty if prefixes.get(e.name) is e]
        self.evicted += n

    def scattered(self, keys: Iterable[Hashable], before: set[Hashable]) -> None:
        """Keys that entered memory through ``update_data`` (scatter), without a
        transition; ``before`` are those that were in memory already."""
        for key in keys:
            if key in before:
                continue
            ts = self.tasks.get(key)
            if ts is None or ts.state != "memory":
                continue
            entry = self._entry(ts.prefix.name)
            entry.live += ts.nbytes if ts.nbytes > 0 else 0
            if entry.keys is not None:
                entry.keys.add(key)

    def restart(self, scheduler: Any) -> None:
        """The scheduler forgot every task: nothing is in memory any more."""
        for entry in self.prefixes.values():
            entry.live = 0
            if entry.keys is not None:
                entry.keys.clear()
        self._by = None

    # -- reading ---------------------------------------------------------------------

    def table(self) -> dict[str, dict[str, int | float | None]]:
        """prefix -> {produced, freed, freed_by, live, tasks, net_per_task}."""
        return {name: entry.as_dict() for name, entry in self.prefixes.items()}

    def top(self, n: int, by: str) -> list[tuple[str, PrefixFlow]]:
        """The ``n`` prefixes with the largest value of the counter or property ``by``;
        prefixes without a value are left out."""
        rows = [(name, e) for name, e in self.prefixes.items() if getattr(e, by) is not None]
        rows.sort(key=lambda kv: getattr(kv[1], by), reverse=True)
        return rows[:n]

    def totals(self) -> dict[str, int]:
        """The counters of :data:`TOTALS` over every prefix since the engine started
        (forgotten prefixes included), and the bytes live now."""
        out = dict(self.evicted_counts)
        live = 0
        for entry in self.prefixes.values():
            for field in TOTALS:
                out[field] += getattr(entry, field)
            live += max(entry.live, 0)
        out["live"] = live
        return out

    def facts(self, prefix: str) -> PrefixFacts | None:
        """The published figures of a prefix (None before its first task finished)."""
        return self.published.get(prefix)

    # -- publishing ------------------------------------------------------------------

    def publish(self) -> list[str]:
        """Publish the figures of the prefixes that changed since the last call, where
        they moved by more than :data:`REPUBLISH_TOLERANCE` (or changed sign). Returns
        the prefixes republished."""
        dirty, self._dirty = self._dirty, []
        out = []
        for entry in dirty:
            entry.dirty = False
            name = entry.name
            if not entry.tasks or self.prefixes.get(name) is not entry:
                continue
            new = PrefixFacts.of(entry)
            old = self.published.get(name)
            if old is None or _moved(old, new):
                self.published[name] = new
                out.append(name)
        return out

    def keys_of(self, prefix: str) -> set[Hashable]:
        """The keys of ``prefix`` in memory (empty unless :attr:`track_keys`)."""
        entry = self.prefixes.get(prefix)
        return entry.keys if entry is not None and entry.keys is not None else set()

    def start_tracking(self, in_memory: Iterable[Any]) -> None:
        """Keep the keys in memory per prefix from now on; ``in_memory`` are the tasks
        in memory now (the engine passes them from the one scan a reload costs)."""
        self.track_keys = True
        for entry in self.prefixes.values():
            entry.keys = set()
        for ts in in_memory:
            entry = self._entry(ts.prefix.name)
            assert entry.keys is not None
            entry.keys.add(ts.key)

    def stop_tracking(self) -> None:
        self.track_keys = False
        for entry in self.prefixes.values():
            entry.keys = None


__all__ = ["FLOW_ATTRIBUTES", "MemoryFlow", "PrefixFacts", "PrefixFlow"]
