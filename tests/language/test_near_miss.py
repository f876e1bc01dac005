"""Near-miss hints for a rule that matched no key (amm_rules.language.near_miss): what
a census of keys suggests the rule meant. On a cluster: tests/observe/test_idle_rules.py
and tests/offline/test_validate_dump.py."""

from __future__ import annotations

from amm_rules.language.expr.parser import parse
from amm_rules.language.near_miss import Census, near_misses


def census() -> Census:
    out = Census()
    for _ in range(3):
        out.add("pandas.DataFrame", "readparquetfsspec", "etl/load", {}, ())
    for _ in range(12):
        out.add("numpy.ndarray", "inc", "default", {"GPU": 1}, ("resources",))
    return out


def hints(match: str) -> list[str]:
    return near_misses(parse(match), census())


def test_type_prefix_span_and_resource_hints() -> None:
    assert hints('task.type == "pandas.Dataframe"') == [
        "3 keys of type pandas.DataFrame in memory (the rule says pandas.Dataframe)"
    ]
    assert hints('task.prefix == "read_parquet"') == [
        "3 keys of prefix readparquetfsspec in memory (the rule says read_parquet)"
    ]
    assert hints('task.span matches "train/*"') == [
        "keys in memory are in spans default (12), etl/load (3) (the rule says train/*)"
    ]
    assert hints("task.annotations.resources.GPU >= 1") == [
        "12 keys were made by tasks with resources={'GPU': 1} (use task.resources.GPU)"
    ]
    # A resource read as an annotation of its own name.
    assert hints("task.annotations.GPU >= 1") == [
        "12 keys were made by tasks with resources={'GPU': 1} (use task.resources.GPU)"
    ]
    assert hints("task.annotations.gpu >= 1") == [
        "12 keys were made by tasks with resources={'GPU': 1} (use task.resources.GPU)"
    ]
    assert hints("task.resources.FPGA >= 1") == [
        "12 keys were made by tasks with resources={'GPU': 1} (the rule reads "
        "task.resources.FPGA; use task.resources.GPU)"
    ]


def test_no_hint_where_the_data_has_what_the_rule_names() -> None:
    # The module path of a type the census holds under its public name: an alias.
    assert hints('task.type == "pandas.core.frame.DataFrame"') == []
    assert hints('task.span == "etl/load" and task.nbytes > 1 GiB') == []
    assert hints("task.resources.GPU >= 2") == []
    assert hints('task.key == "x"') == []
    # An annotation the keys carry is no resource misread.
    assert hints("task.annotations.resources == 1") != []  # (the nested one is)
    census_ = census()
    census_.add("numpy.ndarray", "inc", "default", {"GPU": 1}, ("GPU",))
    assert near_misses(parse("task.annotations.GPU >= 1"), census_) == []
