"""The classifier's per-class memo gives exactly the cascade's answer.

:class:`amm_rules.engine.classify.Classifier` runs the rules that read only class attributes
once per class of keys and keeps, per class, only the rules that read the key itself.
These tests compare it with :meth:`Ruleset.resolve <amm_rules.language.ruleset.Ruleset.resolve>`
(the definition of the cascade) on random rules files and random tasks, the tasks of
one example all going through one classifier so that memo entries are reused across
keys, annotations and runtime targets.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from amm_rules import load_ruleset
from amm_rules.engine.adapters import TaskFactsAdapter
from amm_rules.engine.classify import Classifier
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
