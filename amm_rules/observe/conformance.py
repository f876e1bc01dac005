"""Conformance: how far the cluster holds what each rule asks, in one word and one
sentence per rule, and the fraction of governed keys that meet their target.

The states and the reasons (:data:`STATES`, :data:`REASONS`) are those of
docs/observe.md's tables, which say what each means. ``not-running`` outranks the
others: they are earned by cycles, and what the last cycle saw may be long gone.
``shadowed`` and ``idle`` (rules that govern nothing) are told from one sample of at
most :data:`SAMPLE` keys in memory, taken from the workers' keys again at most every
:data:`HINTS_FOR` seconds (an open dashboard page asks for a status every second), with
at most :data:`SHADOW_BUDGET` match evaluations
(:mod:`amm_rules.engine.decide.shadows`, :mod:`amm_rules.language.near_miss`).

A key counts towards every rule that decided one of its fields, so one key short of
its target shows under each of them; annotations and runtime targets are two groups,
``(annotation)`` and ``(runtime)``.

Computed from the engine's own bookkeeping, never from ``scheduler.tasks``: the keys
per class and label (:attr:`KeyIndex.class_labels`, hence the copies wanted), the
copies held per label (:attr:`KeyIndex.copies_by`), the placement of each class on the
current workers (cached by the policy per worker change), and the keys the last plans
left short (:attr:`KeyIndex.shortfall`). The figures are those of the last cycle, but
for the copies held, which the replica hooks keep current.

Neighbours: :mod:`amm_rules.observe.status` and :mod:`amm_rules.observe.metrics` show it;
:mod:`amm_rules.engine.state.journal` defines the in-progress reasons.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

from amm_rules.engine.decide.shadows import IDLE, SHADOWED, Shadow, shadow_words
from amm_rules.engine.dryrun import HELD_BACK
from amm_rules.engine.sections.activity import census_of, rule_matches
from amm_rules.engine.state.governed import PlanClass, labels_of
from amm_rules.engine.state.journal import BUSY, IN_FLIGHT, IN_PROGRESS_REASONS, WAITING
from amm_rules.engine.words import counted
from amm_rules.language.near_miss import Census, near_misses

if TYPE_CHECKING:
    from amm_rules.engine.policy import RulesPolicy

SATISFIED = "satisfied"
IN_PROGRESS = "in-progress"
UNSATISFIABLE = "unsatisfiable"
DRY_RUN = "dry-run"
NOT_RUNNING = "not-running"
#: Every state, best first (``dry-run``: held back by its own enforcement; ``shadowed``
#: and ``idle``: a rule that governs nothing; ``not-running``: no cycle enforces the
#: rules, last).
STATES = (SATISFIED, IN_PROGRESS, UNSATISFIABLE, DRY_RUN, SHADOWED, IDLE, NOT_RUNNING)
#: The sentence of every row while the AMM runs no cycle.
NOT_RUNNING_SENTENCE = (
    "not enforced: the Active Memory Manager runs no cycle (stopped, or start: false)"
)
#: Most keys in memory looked at for the shadows and near-miss hints of the rules that
#: govern nothing.
SAMPLE = 2_000

#: Why keys cannot be satisfied on the current workers.
MOVE_NEVER = "move-never"
TOO_FEW_WORKERS = "too-few-workers"
TOO_FEW_HOSTS = "too-few-hosts"
UNSATISFIABLE_REASONS = (TOO_FEW_WORKERS, TOO_FEW_HOSTS, MOVE_NEVER)
#: Every reason a key does not meet its target (the ``reason`` label of the metrics).
REASONS = (*UNSATISFIABLE_REASONS, *IN_PROGRESS_REASONS, HELD_BACK)

#: The groups of targets that do not come from a rule.
ANNOTATION = "(annotation)"
RUNTIME = "(runtime)"
#: Runtime targets set by distributed's own calls (``legacy-replicate: honour``): a row
#: each, of kind ``runtime``, when they govern keys.
LEGACY_RUNTIME = ("(client.replicate)", "(scatter broadcast)")

#: How each in-progress reason is told, per key count.
_PROGRESS_WORDS = {
    IN_FLIGHT: "with copies or drops in flight",
    BUSY: "waiting for a busy worker",
    WAITING: "waiting for eligible workers (paused, backing off or refused)",
}


@dataclass
class RuleConformance:
    """The conformance of one rule, or of the annotation or runtime group."""

    #: The rule's name, or ``(annotation)`` / ``(runtime)``.
    name: str
    #: ``"rule"``, ``"annotation"`` or ``"runtime"``.
    kind: str
    #: False for a rule that is no longer in the file (keys not classified again yet).
    in_file: bool = True
    keys: int = 0
    bytes: int = 0
    #: Copies the keys hold now, and the copies their targets want at least (a key
    #: without a ``replicate`` target wants one).
    copies_held: int = 0
    copies_wanted: int = 0
    #: Keys not meeting their target, by reason (see :data:`REASONS`).
    unmet: Counter[str] = field(default_factory=Counter)
    #: One sentence per reason, as the engine words it (the first cause seen).
    why: dict[str, str] = field(default_factory=dict)
    #: Keys per cause: (reason, sentence) -> keys. Two classes short for one reason
    #: (a pool with no running worker, a cluster too small) are two causes, told apart.
    causes: Counter[tuple[str, str]] = field(default_factory=Counter)
    state: str = SATISFIED
    sentence: str = ""
    #: For a ``shadowed`` rule: the keys of the sample it matches, and who took its
    #: fields (see :mod:`amm_rules.engine.decide.shadows`).
    shadow: Shadow | None = None

    @property
    def met(self) -> int:
        return max(0, self.keys - sum(self.unmet.values()))

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "in_file": self.in_file,
            "state": self.state,
            "sentence": self.sentence,
            "keys": self.keys,
            "bytes": self.bytes,
            "copies_held": self.copies_held,
            "copies_wanted": self.copies_wanted,
            "met": self.met,
            "unmet": sum(self.unmet.values()),
            "unmet_by_reason": dict(self.unmet),
            "why": dict(self.why),
            "causes": [
                {"reason": reason, "why": why, "keys": n}
                for (reason, why), n in self.causes.most_common()
            ],
            "shadowed": self.shadow.to_dict() if self.shadow is not None else None,
        }


@dataclass
class Conformance:
    """Every rule's conformance, in file order, then ``(annotation)`` and ``(runtime)``."""

    rules: list[RuleConformance]
    #: Governed keys, and those among them that meet target and placement.
    governed: int
    met: int
    #: Keys in memory the classification budget left for the next cycles.
    backlog: int
    #: Whether the AMM runs its cycles (False: every row is ``not-running``), and since
    #: when it runs or does not (seconds since the epoch).
    running: bool = True
    since: float | None = None

    @property
    def fraction(self) -> float:
        """Governed keys meeting target and placement (1.0 when nothing is governed)."""
        return self.met / self.governed if self.governed else 1.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "running": self.running,
            "since": self.since,
            "governed": self.governed,
            "met": self.met,
            "fraction": self.fraction,
            "classification_backlog": self.backlog,
            "rules": [r.to_dict() for r in self.rules],
        }


def conformance(policy: RulesPolicy) -> Conformance:
    """The conformance of every rule of ``policy`` (see the module docstring)."""
    index = policy.index
    rows = {r.name: RuleConformance(r.name, "rule") for r in policy.ruleset.rules}
    rows[ANNOTATION] = RuleConformance(ANNOTATION, "annotation")
    rows[RUNTIME] = RuleConformance(RUNTIME, "runtime")

    def row(label: str) -> RuleConformance:
        r = rows.get(label)
        if r is None and label in LEGACY_RUNTIME:
            r = rows[label] = RuleConformance(label, "runtime")
        elif r is None:  # a rule of the previous rules file, keys not classified again yet
            r = rows[label] = RuleConformance(label, "rule", in_file=False)
        return r

    for label, n in index.governed.governed_by.items():
        row(label).keys = n
    for label, n in index.governed.bytes_by.items():
        row(label).bytes = n
    for label, n in index.governed.copies_by.items():
        row(label).copies_held = n

    # 1. Whole classes the current workers cannot satisfy.
    unmet = 0
    hopeless: set[PlanClass] = set()
    for cls, counts in index.governed.class_labels.items():
        wanted = copies_wanted(policy, cls)
        for label, n in counts.items():
            row(label).copies_wanted += n * wanted
        problem = class_problem(policy, cls)
        if problem is None:
            continue
        reason, sentence = problem
        hopeless.add(cls)
        unmet += len(index.governed.groups.get(cls, ()))
        for label, n in counts.items():
            r = row(label)
            r.unmet[reason] += n
            r.why.setdefault(reason, sentence)
            r.causes[reason, sentence] += n

    # 2. Keys the last plans left short (a few: what the engine is working on).
    desired = index.desired
    for key, (reason, sentence) in index.shortfall.items():
        d = desired.get(key)
        if d is None or PlanClass.of(d) in hopeless:
            continue
        unmet += 1
        for label in labels_of(d):
            r = row(label)
            r.unmet[reason] += 1
            r.why.setdefault(reason, sentence)

    backlog = policy.journal.backlog
    amm = policy.ctx.amm_running
    running = amm.running
    for r in rows.values():
        r.state, r.sentence = (
            _judge(r, backlog) if running else (NOT_RUNNING, NOT_RUNNING_SENTENCE)
        )
    if running:
        _idle(policy, rows, backlog)
    governed = len(index)
    return Conformance(
        rules=list(rows.values()),
        governed=governed,
        met=governed - unmet,
        backlog=backlog,
        running=running,
        since=amm.since,
    )


def _idle(policy: RulesPolicy, rows: dict[str, RuleConformance], backlog: int) -> None:
    """Mark the rules that governed no key since they were loaded, while keys are in
    memory and all of them classified: ``shadowed`` when they match keys of the sample
    whose fields earlier rules (or annotations, runtime targets) all decide, else
    ``idle``, with near-miss hints."""
    activity = policy.activity
    if not activity.cycles or backlog:
        return
    candidates = [
        r
        for r in rows.values()
        if r.kind == "rule" and r.in_file and not r.keys and r.name not in activity.matched
    ]
    if not candidates:
        return
    in_memory = keys_in_memory(policy.scheduler)
    if not in_memory:
        return
    rules = {rule.name: rule for rule in policy.ruleset.rules}
    looked = _looked(policy, [rules[r.name] for r in candidates])
    for r in candidates:
        shadow = looked.shadows.get(r.name)
        if shadow is not None and shadow.shadowed:
            r.state = SHADOWED
            r.shadow = shadow
            exact = looked.sampled >= in_memory
            r.sentence = shadow_words(shadow, None if exact else looked.sampled)
            continue
        r.state = IDLE
        head = f"0 keys since the rules were loaded, {counted(in_memory, 'key')} in memory"
        r.sentence = "; ".join([head, *looked.hints.get(r.name, ())])


@dataclass
class _Looked:
    """What a sample of the keys in memory says of the rules that govern none."""

    when: float
    ruleset: Any
    #: Keys in the sample.
    sampled: int
    #: Rule name -> near-miss hints (of the rules the sample does not match).
    hints: dict[str, list[str]]
    #: Rule name -> the keys of the sample it matches and who took its fields.
    shadows: dict[str, Shadow]


#: policy -> what the last sample said of the rules that govern nothing, reused for
#: :data:`HINTS_FOR` seconds.
_LOOKED: WeakKeyDictionary[Any, _Looked] = WeakKeyDictionary()
#: Seconds the near-miss hints and the shadows of a status are reused: a sample, its
#: matches and a parse of each idle rule cost milliseconds, a status is asked for every
#: second by an open page.
HINTS_FOR = 10.0
#: Most match evaluations spent on the shadows of one sample (a match that reads only
#: what a class of keys shares costs one per class of the sample, another one per key):
#: rules past it are told as idle.
SHADOW_BUDGET = 20_000


def _looked(policy: RulesPolicy, rules: list[Any]) -> _Looked:
    """The near-miss hints and the shadows of ``rules`` (governing nothing), from one
    sample of the keys in memory, taken again at most every :data:`HINTS_FOR` seconds,
    or when the rules in force or those governing nothing change."""
    now = time.monotonic()
    cached = _LOOKED.get(policy)
    names = {rule.name for rule in rules}
    if (
        cached is not None
        and cached.ruleset is policy.ruleset
        and now - cached.when < HINTS_FOR
        and names <= cached.hints.keys() | cached.shadows.keys()
    ):
        return cached
    tasks = list(sampled_tasks(policy.scheduler))
    shadows = rule_matches(policy.ctx, rules, tasks, budget=SHADOW_BUDGET)
    census = census_of(tasks)
    hints = {
        rule.name: near_miss_hints(rule.match_source, census)
        for rule in rules
        if rule.name not in shadows or not shadows[rule.name].shadowed
    }
    looked = _LOOKED[policy] = _Looked(now, policy.ruleset, len(tasks), hints, shadows)
    return looked


def near_miss_hints(match: str, census: Census) -> list[str]:
    """The near-miss hints of a ``match`` expression against ``census``."""
    from amm_rules.language.expr import ExpressionError
    from amm_rules.language.expr.parser import parse

    try:
        return near_misses(parse(match), census)
    except ExpressionError:  # (the rules in force compiled: never)
        return []


def keys_in_memory(scheduler: Any) -> int:
    """Keys in memory, from the task prefixes' counts of their tasks' states."""
    prefixes = getattr(scheduler, "task_prefixes", None)
    if prefixes is None:
        return sum(1 for _ in scheduler.tasks.values() if _.state == "memory")
    return sum(tp.states.get("memory", 0) for tp in prefixes.values())


def sampled_tasks(scheduler: Any, limit: int = SAMPLE) -> Iterator[Any]:
    """At most ``limit`` tasks in memory, each once, taken from the workers' keys in
    turn (a share of each worker's), never a walk over all of them."""
    workers = list(scheduler.workers.values())
    seen: set[Any] = set()
    share = max(1, limit // max(1, len(workers)))
    for ws in workers:
        for ts in islice(ws.has_what, share):
            if ts.key in seen:
                continue
            seen.add(ts.key)
            yield ts
        if len(seen) >= limit:
            return


def copies_wanted(policy: RulesPolicy, cls: PlanClass) -> int:
    """The least copies a key of the class wants on the current workers (``all``: one
    per eligible worker; without ``replicate``: one)."""
    if cls.replicate is None:
        return 1
    return cls.replicate.bounds(policy.placements.of(cls).achievable)[0]


def class_problem(policy: RulesPolicy, cls: PlanClass) -> tuple[str, str] | None:
    """Why the current workers cannot satisfy any key of a plan class, as
    ``(reason, sentence)``; None if they can."""
    if cls.move == "never":
        if cls.replicate is None:
            return None  # left alone, as asked
        return MOVE_NEVER, (
            f"move: never leaves them alone, so replicate: {cls.replicate} is not held"
        )
    placement = policy.placements.of(cls)
    lo = copies_wanted(policy, cls)
    every = cls.replicate is not None and cls.replicate.min == "all"
    if lo > placement.achievable:
        eligible = eligible_words(cls.pool, cls.avoid, placement.achievable)
        if placement.achievable == 0:
            return TOO_FEW_WORKERS, eligible
        wanted = f"wants {counted(lo, 'copy')}" if cls.replicate is not None else "wants a copy"
        return TOO_FEW_WORKERS, f"{wanted}, {eligible}"
    if cls.spread == "host" and lo > placement.hosts and not every:
        return TOO_FEW_HOSTS, (
            f"spread: host wants {counted(lo, 'host')}, eligible workers are on "
            f"{counted(placement.hosts, 'host')}"
        )
    return None


def eligible_words(pool: tuple[str, ...] | None, avoid: tuple[str, ...] | None, n: int) -> str:
    """How many workers may hold a class's copies, named by what limits them (its pool,
    its avoided pools, or the cluster itself): ``only 2 workers in pool gpu``, ``no
    worker in pool gpu is running``, ``only 3 workers in the cluster``. (Workers that
    are closing do not count; paused ones do.)"""
    parts = []
    if pool is not None:
        parts.append(f"in pool {','.join(pool)}")
    if avoid is not None:
        parts.append(f"outside pool {','.join(avoid)}")
    if n == 0:
        return f"no worker {' '.join(parts)} is running" if parts else "no worker is running"
    where = " ".join(parts) or "in the cluster"
    return f"only {counted(n, 'worker')} {where}"


def _judge(r: RuleConformance, backlog: int) -> tuple[str, str]:
    """The state and the sentence of one row."""
    hopeless = {k: n for k, n in r.unmet.items() if k in UNSATISFIABLE_REASONS and n}
    progress = {k: n for k, n in r.unmet.items() if k in IN_PROGRESS_REASONS and n}
    if hopeless:
        n = sum(hopeless.values())
        causes = sorted(
            ((why, k) for (c, why), k in r.causes.items() if c in hopeless and k),
            key=lambda item: (-item[1], item[0]),  # most keys first, then by their words
        )
        if len(causes) > 1:  # one per cause, with its keys
            why = "; ".join(f"{counted(k, 'key')}: {w}" for w, k in causes)
        elif causes:
            why = causes[0][0]
        else:
            why = "; ".join(r.why[k] for k in UNSATISFIABLE_REASONS if k in hopeless)
        sentence = f"{counted(n, 'key')} of {r.keys:,} cannot be satisfied now: {why}"
        if progress:
            sentence += f"; {_progress(progress, r)}"
        return UNSATISFIABLE, sentence
    if progress:
        return IN_PROGRESS, _progress(progress, r)
    if r.unmet.get(HELD_BACK):
        n = r.unmet[HELD_BACK]
        return (
            DRY_RUN,
            f"{counted(n, 'key')} of {r.keys:,} held back by dry-run (e.g. {r.why[HELD_BACK]})",
        )
    if backlog:
        return IN_PROGRESS, (
            f"{counted(backlog, 'key')} in memory not classified yet (classification budget); "
            f"{r.keys:,} governed so far hold their target"
        )
    if not r.keys:
        return SATISFIED, "no keys in memory"
    if r.keys == 1:
        return SATISFIED, "its one key holds its target and placement"
    return SATISFIED, f"all {counted(r.keys, 'key')} hold their target and placement"


def _progress(progress: dict[str, int], r: RuleConformance) -> str:
    parts = [f"{counted(n, 'key')} {_PROGRESS_WORDS[k]}" for k, n in progress.items()]
    first = next(iter(progress))
    return f"{', '.join(parts)} (e.g. {r.why[first]})"
