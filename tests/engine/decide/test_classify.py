"""The classifier's per-class and per-group memos give exactly the cascade's answer.

:class:`amm_rules.engine.decide.classify.Classifier` runs the rules that read only class attributes
once per class of keys and keeps, per class, only the rules that read the key itself.
These tests compare it with :meth:`Ruleset.resolve <amm_rules.language.ruleset.Ruleset.resolve>`
(the definition of the cascade) on random rules files and random tasks, the tasks of
one example all going through one classifier so that memo entries are reused across
keys, annotations and runtime targets. The cycle's path (:meth:`KeyIndex.classify
<amm_rules.engine.state.index.KeyIndex.classify>`, which classifies by task group) is checked
the same way while keys change type or annotations within a group, leave and enter
memory, and the rules are reloaded mid-classification.
"""

from __future__ import annotations

import copy
from collections import Counter
from types import SimpleNamespace
from typing import Any
from unittest.mock import patch

from hypothesis import given, settings
from hypothesis import strategies as st

from amm_rules import load_ruleset
from amm_rules.engine.adapters import TaskFactsAdapter
from amm_rules.engine.decide.classify import Classifier
from amm_rules.engine.decide.plan import source_label
from amm_rules.engine.state import backlog as backlog_module
from amm_rules.engine.state.governed import PlanClass
from amm_rules.engine.state.index import KeyIndex
from amm_rules.language.ruleset import Target

#: Matches reading class attributes only, the key itself only, or both.
MATCHES = (
    'task.prefix == "a"',
    'task.prefix in ["a", "b"]',
    'task.group matches "g1*"',
    'task.type == "numpy.ndarray"',
    "task.annotations.tier == 'hot'",
    "task.annotations.pin",
    "task.nbytes >= 100",
    'task.key matches "a-1*"',
    "task.replicas > 1",
    'task.type == "numpy.ndarray" and task.nbytes >= 100',
    'task.prefix == "b" or task.nbytes < 50',
    'not (task.group == "g2" and task.key matches "*3")',
    # Split into a class part and a per-key part (in either order, with several of each).
    'task.prefix in ["a", "b"] and task.key matches "*1*"',
    'task.nbytes >= 60 and task.annotations.pin and task.group matches "g1*"',
    'task.replicas >= 1 and task.type == "builtins.bytes" and task.nbytes < 5000',
    "task.key matches 'c-*' and (task.prefix == 'c' or task.nbytes == 10)",
    "true",
)
ACTIONS = st.fixed_dictionaries(
    {},
    optional={
        "replicate": st.sampled_from([1, 2, 3, {"min": 2}, {"min": 1, "max": 3}]),
        "pool": st.sampled_from(["p1", "p2", ["p1", "p2"]]),
        "avoid": st.sampled_from(["p1", "p2"]),
        "spread": st.sampled_from(["host", "none"]),
        "move": st.sampled_from(["never", "allowed"]),
    },
).filter(bool)


@st.composite
def rulesets(draw: Any) -> dict[str, Any]:
    entries = draw(st.lists(st.tuples(st.sampled_from(MATCHES), ACTIONS), max_size=8))
    return {
        "version": 1,
        "pools": {"p1": "worker.nthreads >= 2", "p2": "worker.nthreads < 2"},
        "rules": [
            {"name": f"r{i}", "match": match, **actions}
            for i, (match, actions) in enumerate(entries)
        ],
    }


ANNOTATIONS = st.one_of(
    st.none(),
    st.just({}),
    st.fixed_dictionaries(
        {},
        optional={
            "tier": st.sampled_from(["hot", "cold", 1]),
            "pin": st.booleans(),
            "amm": st.sampled_from([{"replicate": 2}, {"pool": "p1", "move": "never"}]),
        },
    ),
)


@st.composite
def tasks(draw: Any) -> SimpleNamespace:
    """Something with the attributes of a scheduler TaskState that a match reads."""
    prefix = draw(st.sampled_from(["a", "b", "c"]))
    return SimpleNamespace(
        key=f"{prefix}-{draw(st.integers(0, 40))}",
        prefix=SimpleNamespace(name=prefix),
        group=SimpleNamespace(name=draw(st.sampled_from(["g1", "g12", "g2"]))),
        type=draw(st.sampled_from(["numpy.ndarray", "builtins.bytes", None])),
        nbytes=draw(st.sampled_from([-1, 10, 60, 100, 5000])),
        who_has=set(range(draw(st.integers(0, 3)))),
        annotations=draw(ANNOTATIONS),
    )


RUNTIME = st.one_of(st.none(), st.just(Target(3, 3)), st.just(Target(2, None)))


@settings(max_examples=300, deadline=None)
@given(rulesets(), st.lists(st.tuples(tasks(), RUNTIME), min_size=1, max_size=30))
def test_classifier_gives_the_cascade_answer(mapping, keyed):
    ruleset = load_ruleset(mapping)
    classifier = Classifier(ruleset)
    # Twice over: the second pass is answered from the memo tables.
    for ts, runtime in keyed + keyed:
        annotation = classifier.annotation(ts)
        expected = ruleset.resolve(TaskFactsAdapter(ts), annotation=annotation, runtime=runtime)
        assert classifier.resolve(ts, runtime) == expected


def test_keys_of_one_class_share_one_desired():
    ruleset = load_ruleset(
        {
            "version": 1,
            "rules": [
                {"name": "big", "match": "task.nbytes >= 100", "move": "never"},
                {"name": "a", "match": 'task.prefix == "a"', "replicate": 2},
            ],
        }
    )
    classifier = Classifier(ruleset)

    def task(i: int, nbytes: int) -> SimpleNamespace:
        return SimpleNamespace(
            key=f"a-{i}",
            prefix=SimpleNamespace(name="a"),
            group=SimpleNamespace(name="g"),
            type=None,
            nbytes=nbytes,
            who_has=set(),
            annotations=None,
        )

    small = [classifier.resolve(task(i, 10)) for i in range(5)]
    large = [classifier.resolve(task(i, 1000)) for i in range(5)]
    assert all(d is small[0] for d in small) and all(d is large[0] for d in large)
    assert small[0].explain() == "replicate=2 from rule a"
    assert large[0].explain() == "replicate=2 from rule a, move=never from rule big"


def test_a_split_match_reads_the_key_only_where_its_class_part_holds():
    """``task.type == ... and task.nbytes >= ...``: the type is read once per class,
    the size only for keys of the classes of that type."""
    ruleset = load_ruleset(
        {
            "version": 1,
            "rules": [
                {
                    "name": "big-arrays",
                    "match": 'task.nbytes >= 100 and task.type == "numpy.ndarray"',
                    "move": "never",
                },
            ],
        }
    )
    classifier = Classifier(ruleset)
    reads: list[str] = []

    class Task(SimpleNamespace):
        @property
        def nbytes(self) -> int:
            reads.append(self.key)
            return self.size

    def task(key: str, type_: str, size: int) -> Task:
        return Task(
            key=key, prefix=SimpleNamespace(name="p"), type=type_, size=size,
            who_has=set(), annotations=None,
        )  # fmt: skip

    frames = [classifier.resolve(task(f"f-{i}", "pandas.DataFrame", 1000)) for i in range(5)]
    arrays = [classifier.resolve(task(f"a-{i}", "numpy.ndarray", 10**i)) for i in range(5)]
    assert not any(d.governed for d in frames)
    assert [d.move for d in arrays] == [None, None, "never", "never", "never"]
    assert reads == [f"a-{i}" for i in range(5)]


def test_a_raising_match_is_no_match_reported_once():
    ruleset = load_ruleset(
        {"version": 1, "rules": [{"name": "r", "match": "task.nbytes > 1", "replicate": 2}]}
    )
    failed = []
    classifier = Classifier(ruleset, on_rule_error=lambda rule, exc: failed.append(rule.name))

    class Broken(SimpleNamespace):
        @property
        def nbytes(self) -> int:
            raise RuntimeError("no size")

    for i in range(3):
        ts = Broken(
            key=f"k-{i}", prefix=SimpleNamespace(name="k"), who_has=set(), annotations=None
        )
        assert not classifier.resolve(ts).governed
    assert failed == ["r"]


# -- classification by task group, as the cycle runs it (KeyIndex.classify) -----------


class Prefix:
    def __init__(self, name: str):
        self.name = name


class Group:
    """A task group: hashable by identity, fixing its prefix, as ``TaskGroup``."""

    def __init__(self, name: str, prefix: Prefix):
        self.name = name
        self.prefix = prefix


class Task:
    """What the classifier reads of a ``TaskState``; the prefix is the group's."""

    def __init__(self, key: str, group: Group, type_: str | None, nbytes: int, annotations: Any):
        self.key = key
        self.group = group
        self.type = type_
        self.nbytes = nbytes
        self.who_has: set[int] = {0}
        self.annotations = annotations
        self.state = "memory"

    @property
    def prefix(self) -> Prefix:
        return self.group.prefix


#: Groups (name, prefix) that the matches of MATCHES tell apart.
GROUPS = (("g1", "a"), ("g12", "a"), ("g2", "b"), ("g2", "c"), ("g1", "c"))
TYPES = ("numpy.ndarray", "builtins.bytes", None)
#: Annotation values that are equal in Python and not to a rule (1, 1.0, True), or not
#: equal at all; ``shared`` stands for the one dict object the keys of a group share.
GROUP_ANNOTATIONS = st.sampled_from(
    [
        "shared",
        "copy",
        None,
        {},
        {"tier": "hot"},
        {"tier": "cold"},
        {"tier": 1},
        {"tier": 1.0},
        {"tier": True},
        {"pin": True},
        {"pin": False},
        {"amm": {"replicate": 2}},
        {"amm": {"replicate": 3}},
        {"amm": {"replicate": 2.0}},
        {"amm": {"replicate": 1}},
        {"amm": {"replicate": True}},
        {"amm": {"pool": "p1", "move": "never"}},
        {"tier": "hot", "amm": {"replicate": 2}},
    ]
)


@st.composite
def cluster_keys(draw: Any) -> list[Task]:
    """Keys of a few task groups; most keys of a group share its type and its
    annotations (one dict, or equal copies), some do not."""
    shared = [
        draw(st.sampled_from([None, {"tier": "hot"}, {"pin": True}, {"amm": {"replicate": 2}}]))
        for _ in GROUPS
    ]
    groups = [Group(name, Prefix(prefix)) for name, prefix in GROUPS]
    # Two groups of the same name in turn (a group forgotten, then made again).
    groups.append(Group(groups[0].name, groups[0].prefix))
    shared.append(shared[0])
    out = []
    for i in range(draw(st.integers(1, 40))):
        g = draw(st.integers(0, len(groups) - 1))
        usual = TYPES[g % len(TYPES)]
        type_ = draw(st.sampled_from([usual, usual, usual, *TYPES]))
        annotations = draw(GROUP_ANNOTATIONS)
        if annotations == "shared":
            annotations = shared[g]
        elif annotations == "copy":
            annotations = copy.deepcopy(shared[g])
        nbytes = draw(st.sampled_from([10, 60, 100, 5000]))
        out.append(Task(f"{groups[g].prefix.name}-{i}", groups[g], type_, nbytes, annotations))
    return out


#: What happens between two classifications: ("classify", how many keys),
#: ("reload",), ("retype" / "reannotate" / "leave" / "enter" / "runtime" / "copies", key, value),
#: ("scatter", key).
STEPS = st.one_of(
    st.tuples(st.just("classify"), st.integers(1, 12)),
    st.tuples(st.just("reload")),
    st.tuples(st.just("retype"), st.integers(0, 39), st.sampled_from(TYPES)),
    st.tuples(st.just("reannotate"), st.integers(0, 39), GROUP_ANNOTATIONS),
    st.tuples(st.just("leave"), st.integers(0, 39)),
    st.tuples(st.just("enter"), st.integers(0, 39)),
    st.tuples(st.just("runtime"), st.integers(0, 39), RUNTIME),
    st.tuples(st.just("copies"), st.integers(0, 39), st.integers(1, 3)),
    st.tuples(st.just("scatter"), st.integers(0, 39)),
)


class Harness:
    """A KeyIndex fed as the scheduler and the policy feed it, without a scheduler."""

    def __init__(self, ruleset: Any, keys: list[Task]):
        self.ruleset = ruleset
        self.classifier = Classifier(ruleset)
        self.index = KeyIndex()
        self.tasks = {ts.key: ts for ts in keys}
        self.index.attach(self.tasks)
        for ts in keys:
            self.index.transition(ts.key, "processing", "memory")

    def classify(self, n: int) -> None:
        self.index.classify(self.classifier, self.tasks, n)

    def reload(self, ruleset: Any) -> None:
        """As RulesPolicy._maybe_reload: a new classifier, every key in memory again."""
        self.ruleset = ruleset
        self.classifier = Classifier(ruleset)
        self.index.reclassify(k for k, ts in self.tasks.items() if ts.state == "memory")

    def leave(self, ts: Task) -> None:
        if ts.state == "memory":
            ts.state = "released"
            self.index.transition(ts.key, "memory", "released")

    def enter(self, ts: Task) -> None:
        if ts.state != "memory":
            ts.state = "memory"
            self.index.transition(ts.key, "processing", "memory")

    def step(self, step: tuple, other: Any) -> None:
        kind = step[0]
        if kind == "classify":
            self.classify(step[1])
            return
        if kind == "reload":
            self.reload(other if self.ruleset is not other else self.first)
            return
        ts = list(self.tasks.values())[step[1] % len(self.tasks)]
        if kind in ("retype", "reannotate"):
            # Recomputed: the key leaves memory and enters it again, changed.
            self.leave(ts)
            if kind == "retype":
                ts.type = step[2]
            else:
                ts.annotations = None if step[2] in ("shared", "copy") else step[2]
            self.enter(ts)
        elif kind == "leave":
            self.leave(ts)
        elif kind == "enter":
            self.enter(ts)
        elif kind == "runtime" and ts.state == "memory":
            # As EngineContext.set_runtime_target.
            self.index.set_runtime_target(ts.key, step[2])
        elif kind == "copies" and ts.state == "memory":
            before = len(ts.who_has)
            ts.who_has = set(range(step[2]))
            if len(ts.who_has) != before:  # as the scheduler's replica wrappers tell it
                self.index.governed.copies_changed(ts.key, len(ts.who_has) - before)
            if self.classifier.replicas_sensitive:
                self.index.reclassify((ts.key,))  # as the policy re-dirties touched keys
        elif kind == "scatter" and ts.state == "memory":
            # Scattered again (as the update_data wrapper): un-filed, then queued.
            if ts.key in self.index:
                self.index.governed.unindex(ts.key)
            self.index.queue((ts.key,))

    def check(self) -> None:
        """Every key in memory and classified is filed as Ruleset.resolve says; keys
        out of memory are not filed; the groups and counters agree with the files."""
        index = self.index
        # In the order they are to be classified; a key waiting in the backlog that
        # must be classified again (a reload, a runtime target) waits in dirty too.
        queued = index.unclassified_keys()
        waiting = set(queued)
        assert index.unclassified >= len(queued)
        assert all(index.may_be_unclassified(key) for key in queued)
        for key, ts in self.tasks.items():
            assert index.waiting(key) == (key in waiting)
            if ts.state != "memory":
                assert key not in index.desired and key not in waiting
                continue
            if key in waiting:
                continue  # not classified yet
            expected = self.ruleset.resolve(
                TaskFactsAdapter(ts),
                annotation=self.classifier.annotation(ts),
                runtime=index.runtime.get(key),
            )
            if expected.governed:
                assert index.desired.get(key) == expected, (key, index.desired.get(key))
                assert index.governed.groups[PlanClass.of(expected)][key] is ts
            else:
                assert key not in index.desired
        filed = {k for group in index.governed.groups.values() for k in group}
        assert filed == set(index.desired)
        labels: Counter[str] = Counter()
        copies: Counter[str] = Counter()
        for key, d in index.desired.items():
            mine = {source_label(d, f) for f in d.reasons}
            labels.update(mine)
            held = len(self.tasks[key].who_has)
            copies.update({label: held for label in mine})
        assert +index.governed.governed_by == labels
        assert +index.governed.copies_by == +copies


@settings(max_examples=300, deadline=None)
@given(
    rulesets(),
    rulesets(),
    cluster_keys(),
    st.lists(STEPS, max_size=25),
    st.integers(1, 8),
)
def test_classification_by_group_gives_the_cascade_answer(first, second, keys, steps, chunk):
    """Keys classified a few at a time by task group, while keys are recomputed with
    another type or other annotations, leave and enter memory, get runtime targets or
    copies, and the rules are reloaded mid-way: every key classified is filed exactly
    as ``Ruleset.resolve`` says, under the rules in force. The chunks a cycle takes
    from the keys to classify (and files, one at a time) are drawn small, so that the
    classification runs over several chunks."""
    with patch.object(backlog_module, "CLASSIFY_CHUNK", chunk):
        _classify_by_group(first, second, keys, steps)


def _classify_by_group(first: Any, second: Any, keys: list[Task], steps: list[tuple]) -> None:
    first_rules, second_rules = load_ruleset(first), load_ruleset(second)
    harness = Harness(first_rules, keys)
    harness.first = first_rules
    for step in steps:
        harness.step(step, second_rules)
        harness.check()
    harness.classify(harness.index.unclassified)
    assert not harness.index.unclassified and not harness.index.backlog
    harness.check()


def test_a_group_is_classified_once_and_its_keys_only_read():
    """A thousand keys of one group: the class attributes are read for the first key;
    the others cost a look at their type and annotations, plus their own operands."""
    ruleset = load_ruleset(
        {
            "version": 1,
            "rules": [
                {"name": "a", "match": 'task.prefix == "a"', "replicate": 2},
                {"name": "big", "match": "task.nbytes >= 100", "move": "never"},
            ],
        }
    )
    reads = Counter()

    class Counted(Task):
        @property
        def prefix(self) -> Prefix:
            reads["prefix"] += 1
            return self.group.prefix

        @property
        def nbytes(self) -> int:  # type: ignore[override]
            reads["nbytes"] += 1
            return self.size

        @nbytes.setter
        def nbytes(self, value: int) -> None:
            self.size = value

    group = Group("a-1", Prefix("a"))
    keys = [Counted(f"a-{i}", group, "numpy.ndarray", 10 * (i % 20), None) for i in range(1000)]
    classifier = Classifier(ruleset)
    batches, dropped = classifier.classify(
        [ts.key for ts in keys], [ts for ts in keys], {}, {}, {}
    )
    assert reads["prefix"] <= 2 and reads["nbytes"] == 1000 and not dropped
    by_move = {d.move: len(k) for d, k, _ in batches}
    assert by_move == {None: 500, "never": 500}
    # A key of the group with annotations of its own takes the full path, once.
    odd = Counted("a-odd", group, "numpy.ndarray", 10, {"amm": {"replicate": 3}})
    (batch,), _ = classifier.classify(["a-odd"], [odd], {}, {}, {})
    assert batch[0].explain() == "replicate=3 from amm annotation"
