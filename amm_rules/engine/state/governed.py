"""The governed keys: which keys in memory amm-rules governs, grouped by what they want,
and what they count towards each rule, kept up to date as keys are filed and unfiled so
that status and metrics never sum over keys.

:class:`GovernedKeys` is one of the tables of the key index
(:class:`~amm_rules.engine.state.index.KeyIndex`), which files the keys it classifies here
and unfiles the keys that leave memory. Governed keys live in
:attr:`~GovernedKeys.groups`, one group per :class:`PlanClass` (the resolved fields that
decide the plan, plus the label of the replication target), so that a full check
(:meth:`~GovernedKeys.suspects`) costs one length comparison per key.

Neighbours: :mod:`amm_rules.engine.state.placement` says what a class allows on the
workers (:class:`Placement`); :mod:`amm_rules.engine.decide.plan` plans the suspects.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from itertools import repeat
from operator import attrgetter
from typing import TYPE_CHECKING, Any, NamedTuple

from amm_rules.engine.decide.plan import source_label, target_bounds
from amm_rules.engine.readonly import ReadOnly
from amm_rules.language.ruleset import Desired, Target

if TYPE_CHECKING:
    from amm_rules.engine.decide.classify import Batch
    from amm_rules.engine.state.spilled import RuledKeys

#: Reads a task's size (one copy's bytes; -1 while unknown).
_NBYTES = attrgetter("nbytes")
_WHO_HAS = attrgetter("who_has")
_HOST = attrgetter("host")
_NONE: frozenset[Any] = frozenset()


class PlanClass(NamedTuple):
    """The part of a :class:`Desired` the planner acts on, plus the label counters use."""

    replicate: Target | None
    pool: tuple[str, ...] | None
    avoid: tuple[str, ...] | None
    spread: str | None
    move: str | None
    source: str

    @classmethod
    def of(cls, d: Desired) -> PlanClass:
        return cls(d.replicate, d.pool, d.avoid, d.spread, d.move, source_label(d, "replicate"))


class Placement(NamedTuple):
    """What a :class:`PlanClass` allows on the current workers (recomputed when they change)."""

    #: Workers a good copy may be on (WorkerState objects), or None for any worker.
    ok: frozenset[Any] | None
    #: How many workers may hold a good copy.
    achievable: int
    #: How many distinct hosts those workers are on.
    hosts: int


def labels_of(d: Desired) -> set[str]:
    """The counter labels of the fields of a resolved key (a rule's name,
    ``(annotation)``, ``(runtime)``): the rules a key counts towards."""
    return {source_label(d, f) for f in d.reasons}


class GovernedKeys:
    """Governed keys in memory by plan class, and their counts per rule (see the module
    docstring). ``free``: the keys nobody governs that hold several copies (the index's
    ``replicated_free``: a key filed here leaves it); ``forget_plan(key)``: told when a
    key is unfiled, to forget what the engine planned for it."""

    def __init__(self, free: dict[Hashable, Any], forget_plan: Callable[[Hashable], None]) -> None:
        self._desired: dict[Hashable, Desired] = {}
        self._groups: dict[PlanClass, dict[Hashable, Any]] = {}
        self._governed_by: Counter[str] = Counter()
        self._bytes_by: Counter[str] = Counter()
        self._copies_by: Counter[str] = Counter()
        self._class_labels: dict[PlanClass, Counter[str]] = {}
        self._free = free
        self._forget_plan = forget_plan
        #: id(desired) -> (it, its plan class, its labels), for :meth:`file`.
        self._derived: dict[int, tuple[Desired, PlanClass, set[str]]] = {}
        self._changes = 0
        #: Told of the keys whose rule sets ``spill`` as they are filed (and, by the
        #: replica wrappers, as they gain a copy), while the spill section follows them.
        self._spill_ruled: RuledKeys | None = None

    # -- read-only views of the tables (only the methods below write them) -------------

    #: Governed key -> its resolved wishes.
    desired = ReadOnly[Mapping[Hashable, Desired]]("_desired")
    #: Plan class -> {key: TaskState} for every governed key.
    groups = ReadOnly[Mapping[PlanClass, Mapping[Hashable, Any]]]("_groups")
    #: Governed keys, bytes of one copy and copies in memory, per counter label (rule
    #: name, ``(annotation)``, ``(runtime)``). The copies are kept up to date by the
    #: replica wrappers of :func:`~amm_rules.engine.state.index.watch_scheduler`: a
    #: dashboard shows copies held against copies wanted without counting them key by key.
    governed_by = ReadOnly[Mapping[str, int]]("_governed_by")
    bytes_by = ReadOnly[Mapping[str, int]]("_bytes_by")
    copies_by = ReadOnly[Mapping[str, int]]("_copies_by")
    #: Plan class -> governed keys per counter label: how a class's keys count towards
    #: each rule (the keys of one class may take fields from other rules).
    class_labels = ReadOnly[Mapping[PlanClass, Mapping[str, int]]]("_class_labels")
    #: Every change of the governed keys or of their copies, counted: what was read of
    #: them (the holders scale-down looks at) is current while it stays the same.
    changes = ReadOnly[int]("_changes")
    #: See :meth:`follow_spill_rules`.
    spill_ruled = ReadOnly["RuledKeys | None"]("_spill_ruled")

    def follow_spill_rules(self, ruled: RuledKeys | None) -> None:
        """Tell ``ruled`` of the keys whose rule sets ``spill`` as they are filed;
        None: none."""
        self._spill_ruled = ruled

    def __len__(self) -> int:
        return len(self._desired)

    def put(self, key: Hashable, ts: Any, desired: Desired) -> None:
        """Index a governed key (or move it to its new group)."""
        if self._desired.get(key) is not desired:
            self.file([(desired, [key], [ts])])

    def file(self, batches: Iterable[Batch], fresh: bool = False) -> dict[PlanClass, list[Any]]:
        """Index classified keys (:data:`~amm_rules.engine.decide.classify.Batch` tuples:
        keys and tasks sharing one ``Desired``), as :meth:`put` does one key, with the
        per-class and per-label work done once per batch. Returns the tasks filed (new,
        or moved to another group) by plan class; keys whose ``Desired`` is unchanged
        are left out. ``fresh``: none of the keys is indexed (keys entering memory)."""
        desired_map = self._desired
        filed: dict[PlanClass, list[Any]] = {}
        free = self._free
        self._changes += 1
        derived = self._derived
        governed_by, bytes_by, copies_by = self._governed_by, self._bytes_by, self._copies_by
        for desired, keys, members in batches:
            if not fresh and not desired_map.keys().isdisjoint(keys):
                keys, members = self._refile(desired, keys, members)
            if not keys:
                continue
            desired_map.update(zip(keys, repeat(desired)))
            if desired.spill is not None and self._spill_ruled is not None:
                self._spill_ruled.filed(members)
            known = derived.get(id(desired))
            if known is None or known[0] is not desired:
                if len(derived) >= 10_000:
                    derived.clear()
                cls = PlanClass.of(desired)
                known = derived[id(desired)] = (desired, cls, labels_of(desired))
            _, cls, labels = known
            self._groups.setdefault(cls, {}).update(zip(keys, members, strict=True))
            counts = self._class_labels.get(cls)
            if counts is None:
                counts = self._class_labels[cls] = Counter()
            n = len(keys)
            sizes = list(map(_NBYTES, members))
            nbytes = sum(sizes)
            if min(sizes) < 0:  # -1 while unknown, which a key in memory seldom is
                nbytes = sum(b for b in sizes if b > 0)
            # The copies they hold now: from here on the replica wrappers count changes.
            held = sum(map(len, filter(None, map(_WHO_HAS, members))))
            for label in labels:
                governed_by[label] += n
                counts[label] += n
                if nbytes:
                    bytes_by[label] += nbytes
                if held:
                    copies_by[label] += held
            filed.setdefault(cls, []).extend(members)
            if free and not free.keys().isdisjoint(keys):
                # A governed key is never in replicated_free: reduce-replicas need not ask.
                for key in keys:
                    free.pop(key, None)
        return filed

    def _refile(
        self, desired: Desired, keys: list[Hashable], members: list[Any]
    ) -> tuple[list[Hashable], list[Any]]:
        """The keys of a batch, some of them indexed already: unindex those filed with
        another ``Desired``, leave out those filed with this one."""
        desired_map = self._desired
        out_keys, out_members = [], []
        for key, ts in zip(keys, members, strict=True):
            old = desired_map.get(key)
            if old is desired:
                continue
            if old is not None:
                self.unindex(key)
            out_keys.append(key)
            out_members.append(ts)
        return out_keys, out_members

    def copies_changed(self, key: Hashable, n: int) -> None:
        """A governed key gained (``n > 0``) or lost copies (:func:`watch_scheduler`)."""
        d = self._desired.get(key)
        if d is None:
            return
        self._changes += 1
        labels = labels_of(d)
        if n > 0:
            for label in labels:
                self._copies_by[label] += n
        else:
            _subtract(self._copies_by, labels, -n)

    def suspects(
        self,
        cls: PlanClass,
        placement: Placement,
        reduce_replicas: bool,
        members: Iterable[Any] | None = None,
    ) -> Iterator[Any]:
        """Tasks of a group (or of ``members``, tasks of that group) that may need
        action: one length comparison per key, plus a subset test when the class
        restricts placement. Keys that pass hold their target as far as the workers
        allow; the others go to the planner, which may still decide nothing."""
        if members is None:
            members = self._groups.get(cls, {}).values()
        if cls.move == "never":
            return iter(())
        lo, hi = target_bounds(
            Desired(replicate=cls.replicate), 1, reduce_replicas, placement.achievable
        )
        if cls.replicate is None and not reduce_replicas:
            hi = None
        top = hi if hi is not None else 1 << 62
        ok = placement.ok
        if placement.achievable == 0:
            # Nothing can be placed: only trimming above hi remains possible.
            return (ts for ts in members if len(ts.who_has or ()) > top)
        low = min(lo, placement.achievable)
        if cls.spread == "host" and placement.hosts >= 2:
            # One pass: each task is read once (the hosts of its holders as well).
            goal = min(lo, placement.hosts)
            return (
                ts
                for ts in members
                if not (
                    low <= len(held := ts.who_has or _NONE) <= top
                    and (ok is None or held <= ok)
                    and len(set(map(_HOST, held))) >= goal
                )
            )
        if ok is None:
            return (ts for ts in members if not low <= len(ts.who_has or ()) <= top)
        return (
            ts
            for ts in members
            if not (low <= len(held := ts.who_has or _NONE) <= top and held <= ok)
        )

    def suspects_among(
        self,
        keys: Iterable[Hashable],
        placement_of: Callable[[PlanClass], Placement],
        reduce_replicas: bool,
    ) -> Iterator[Any]:
        """:meth:`suspects` for some keys (those left to look at again, say): the
        governed ones grouped by plan class, each group checked against its placement;
        keys not governed are passed over."""
        by_class: dict[PlanClass, list[Any]] = {}
        for key in keys:
            desired = self._desired.get(key)
            if desired is not None:
                cls = PlanClass.of(desired)
                by_class.setdefault(cls, []).append(self._groups[cls][key])
        for cls, members in by_class.items():
            yield from self.suspects(cls, placement_of(cls), reduce_replicas, members)

    def unindex(self, key: Hashable) -> None:
        """The key is no longer governed (or is being re-filed)."""
        old = self._desired.pop(key, None)
        if old is None:
            return
        self._changes += 1
        self._forget_plan(key)
        cls = PlanClass.of(old)
        group = self._groups.get(cls)
        ts = None
        if group is not None:
            ts = group.pop(key, None)
            if not group:
                del self._groups[cls]
        labels = labels_of(old)
        _subtract(self._governed_by, labels, 1)
        counts = self._class_labels.get(cls)
        if counts is not None:
            _subtract(counts, labels, 1)
            if not counts:
                del self._class_labels[cls]
        # The size the key was filed with: a task's nbytes changes only on its way into
        # memory, or when scattered again (update_data, which un-files the key first).
        nbytes = max(ts.nbytes, 0) if ts is not None else 0
        if nbytes:
            _subtract(self._bytes_by, labels, nbytes)
        # The copies it holds now: the wrappers counted every change since it was filed.
        held = len(ts.who_has or ()) if ts is not None else 0
        if held:
            _subtract(self._copies_by, labels, held)


def _subtract(counter: Counter[str], labels: Iterable[str], n: int) -> None:
    """Take ``n`` from each label's count, dropping counts that reach zero."""
    for label in labels:
        left = counter[label] - n
        if left > 0:
            counter[label] = left
        else:
            del counter[label]
