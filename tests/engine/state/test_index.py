"""The index's per-rule bookkeeping that status and metrics read instead of walking keys:
keys, bytes and copies per rule, keys per class and rule, keys left short. Pure: keys are plain
objects with the attributes the index reads."""

from __future__ import annotations

from types import SimpleNamespace

from amm_rules.engine.state.governed import PlanClass
from amm_rules.engine.state.index import KeyIndex
from amm_rules.engine.state.journal import IN_FLIGHT, Journal
from amm_rules.language.ruleset import Desired, Reason, Target

THREE = Desired(replicate=Target.exact(3), reasons={"replicate": Reason("rule", "three")})
THREE_GPU = Desired(
    replicate=Target.exact(3),
    pool=("gpu",),
    reasons={"replicate": Reason("rule", "three"), "pool": Reason("rule", "gpu")},
)
ANNOTATED = Desired(spread="host", reasons={"spread": Reason("annotation")})


def task(key: str, nbytes: int) -> SimpleNamespace:
    return SimpleNamespace(key=key, nbytes=nbytes, who_has=set())


def test_keys_and_bytes_per_rule_and_class():
    index = KeyIndex()
    a, b, c = task("a", 100), task("b", 1000), task("c", -1)  # -1: size unknown
    index.governed.put("a", a, THREE)
    index.governed.put("b", b, THREE_GPU)
    index.governed.put("c", c, ANNOTATED)
    assert index.governed.governed_by == {"three": 2, "gpu": 1, "(annotation)": 1}
    assert index.governed.bytes_by == {"three": 1100, "gpu": 1000}
    assert index.governed.class_labels == {
        PlanClass.of(THREE): {"three": 1},
        PlanClass.of(THREE_GPU): {"three": 1, "gpu": 1},
        PlanClass.of(ANNOTATED): {"(annotation)": 1},
    }

    # Re-filed under another class: counted once, in its new place.
    index.governed.put("b", b, THREE)
    assert index.governed.governed_by == {"three": 2, "(annotation)": 1}
    assert index.governed.bytes_by == {"three": 1100}
    assert PlanClass.of(THREE_GPU) not in index.governed.class_labels
    assert index.governed.class_labels[PlanClass.of(THREE)] == {"three": 2}

    # Left memory: nothing remains, not even zero counts.
    index.note_plan("a", (IN_FLIGHT, "1 copy in flight"), False)
    index.forget("a")
    index.forget("b")
    index.governed.unindex("c")
    assert (
        not index.governed.governed_by
        and not index.governed.bytes_by
        and not index.governed.class_labels
    )
    assert not index.shortfall


def test_copies_per_rule():
    index = KeyIndex()
    a, b = task("a", 100), task("b", 100)
    a.who_has, b.who_has = {"w1", "w2"}, {"w1"}
    index.governed.put("a", a, THREE)
    index.governed.put("b", b, THREE_GPU)
    assert index.governed.copies_by == {"three": 3, "gpu": 1}
    # The replica wrappers report each change of a governed key; others are ignored.
    b.who_has.add("w2")
    index.governed.copies_changed("b", 1)
    index.governed.copies_changed("not-governed", 1)
    assert index.governed.copies_by == {"three": 4, "gpu": 2}
    # Re-filed: counted once, with the copies it holds now.
    index.governed.put("b", b, THREE)
    assert index.governed.copies_by == {"three": 4}
    # Leaving memory: the scheduler removes every copy (reported), then the key is
    # forgotten with none left.
    index.governed.copies_changed("a", -2)
    a.who_has = None
    index.forget("a")
    assert index.governed.copies_by == {"three": 2}
    index.governed.unindex("b")
    assert not index.governed.copies_by


def test_the_journal_is_bounded_and_finds_a_keys_decisions():
    journal = Journal()
    for i in range(journal.decisions.maxlen + 5):
        journal.decision(f"k-{i % 7}", "replicate", "tcp://w:1", "accepted", "why", "rule")
    assert len(journal.decisions) == journal.decisions.maxlen
    mine = journal.for_key("k-3", limit=4)
    assert len(mine) == 4 and all(d.key == "k-3" for d in mine)
    assert mine == [d for d in journal.decisions if d.key == "k-3"][-4:]
    assert journal.recent(3) == list(journal.decisions)[-3:]
    for seconds in (0.1, 0.3, 0.2):
        journal.cycle(seconds)
    assert journal.cycles == 3 and abs(journal.cycle_seconds_total - 0.6) < 1e-9


def test_the_index_keeps_its_state_in_few_attributes():
    """The transition hook reads the index's attributes for every key entering or
    leaving memory. CPython shares an instance's attribute table with its class's
    other instances (and reads attributes faster) only up to 30 attributes: past that,
    the hook measured about 0.2 µs slower per transition. New state goes into an
    existing attribute's object (as the backlog's does)."""
    assert len(vars(KeyIndex())) < 30
