"""``record`` behaves as ``dataclass`` for what the language's classes use: construction
(positional, by name, defaults, factories, non-init fields, ``__post_init__``, the
errors), equality, hashing, repr, frozenness, and the dataclasses functions."""

from __future__ import annotations

import dataclasses
import pickle
from dataclasses import FrozenInstanceError, dataclass, field

import pytest

from amm_rules.language.records import record


def pair(**options):
    """The same class body under ``dataclass`` and under ``record``."""

    def body():
        class Point:
            """A point."""

            x: int
            y: int = 0
            tags: list[str] = field(default_factory=list)
            note: str | None = field(default=None, compare=False, repr=False)
            seen: int = field(default=0, init=False)

            def __post_init__(self) -> None:
                object.__setattr__(self, "seen", self.x + self.y)

        return Point

    return dataclass(**options)(body()), record(**options)(body())


@pytest.mark.parametrize("frozen", [True, False])
def test_construction_equality_and_repr_match_dataclass(frozen):
    for make in pair(frozen=frozen):
        a, b = make(1, 2, ["t"], note="n"), make(x=1, y=2, tags=["t"], note="other")
        assert (a.x, a.y, a.tags, a.note, a.seen) == (1, 2, ["t"], "n", 3)
        assert a == b  # note is compare=False
        assert a != make(1, 3)
        assert make(5).tags == [] and make(5).tags is not make(5).tags
        assert repr(a).endswith(".Point(x=1, y=2, tags=['t'], seen=3)")
        assert dataclasses.replace(a, y=7) == make(1, 7, ["t"])
        assert dataclasses.asdict(a) == {"x": 1, "y": 2, "tags": ["t"], "note": "n", "seen": 3}
        assert [f.name for f in dataclasses.fields(a)] == ["x", "y", "tags", "note", "seen"]
        assert (a == 1) is False


def test_hash_of_frozen_records_and_unhashable_plain_ones():
    dc, rec = pair(frozen=True)
    assert hash(rec(1, 2, ())) == hash(rec(1, 2, (), note="x"))
    assert hash(rec(1, 2, ())) == hash(dc(1, 2, ()))
    assert {rec(1, 2, ()), rec(1, 2, ())} == {rec(1, 2, ())}
    for make in pair(frozen=False):
        with pytest.raises(TypeError):
            hash(make(1))


def test_frozen_records_refuse_assignment_and_deletion():
    _, rec = pair(frozen=True)
    point = rec(1)
    with pytest.raises(FrozenInstanceError):
        point.x = 2
    with pytest.raises(FrozenInstanceError):
        del point.y
    assert pickle.loads(pickle.dumps(Kept(1, "a"))) == Kept(1, "a")


@record(frozen=True)
class Kept:
    """A module-level record, which pickle can find by name."""

    n: int
    s: str


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((), {}, "missing 1 required positional argument: 'x'"),
        ((1, 2, [], None, 5), {}, "positional arguments but 6 were given"),
        ((1,), {"x": 2}, "got multiple values for argument 'x'"),
        ((1,), {"z": 2}, "got an unexpected keyword argument 'z'"),
        ((1,), {"seen": 2}, "got an unexpected keyword argument 'seen'"),
    ],
)
def test_wrong_arguments_are_type_errors_like_dataclass(args, kwargs, message):
    for make in pair(frozen=True):
        with pytest.raises(TypeError, match=message):
            make(*args, **kwargs)


def test_identity_equality_and_methods_written_in_the_body_are_kept():
    @record(frozen=True, eq=False)
    class Box:
        value: int

    a = Box(1)
    assert a != Box(1) and a == a and hash(a) == object.__hash__(a)

    @record(frozen=True)
    class Named:
        name: str

        def __repr__(self) -> str:
            return f"<{self.name}>"

    assert repr(Named("n")) == "<n>" and Named("n") == Named("n")


def test_match_statements_read_record_fields():
    _, rec = pair(frozen=True)
    match rec(4, 5):
        case rec(x, y):  # type: ignore[misc]
            assert (x, y) == (4, 5)
        case _:
            pytest.fail("no match")
