"""Matching data the way Dask names it: type names and their aliases, task resources,
spans, nested annotations; and the diagnostics of each (issue 26).

The engine's side (the scheduler's tasks read as these facts) is in
tests/engine/policy/test_names_cluster.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from amm_rules.language.expr import compile_expression
from amm_rules.language.loader import check_text
from amm_rules.language.type_names import ALIASES, KNOWN, misspelt, names_of
from tests.language.test_expressions import problems, run, task

ROOT = Path(__file__).resolve().parents[2]


# -- type names --------------------------------------------------------------------------

PANDAS_3 = "pandas.DataFrame"
PANDAS_2 = "pandas.core.frame.DataFrame"


@pytest.mark.parametrize("written", [PANDAS_3, PANDAS_2])
@pytest.mark.parametrize("recorded", [PANDAS_3, PANDAS_2])
def test_a_public_name_and_its_module_path_match_each_other(written: str, recorded: str) -> None:
    facts = task(type=recorded)
    assert run(f'task.type == "{written}"', facts)
    assert not run(f'task.type != "{written}"', facts)
    assert run(f'task.type in ["numpy.ndarray", "{written}"]', facts)
    assert not run(f'task.type not in ["{written}"]', facts)


def test_other_types_and_null_are_not_aliases() -> None:
    series = task(type="pandas.core.series.Series")
    assert not run(f'task.type == "{PANDAS_3}"', series)
    assert run(f'task.type != "{PANDAS_3}"', series)
    assert run('task.type == "pandas.Series"', series)
    unknown = task(type=None)
    assert not run(f'task.type == "{PANDAS_3}"', unknown)
    assert not run(f'task.type != "{PANDAS_3}"', unknown)
    assert not run(f'task.type not in ["{PANDAS_3}"]', unknown)
    # A type the table does not know is compared as written.
    mine = task(type="mylib.Frame")
    assert run('task.type == "mylib.Frame"', mine)
    assert not run('task.type == "mylib.core.Frame"', mine)


def test_a_pattern_matches_a_type_by_any_of_its_names() -> None:
    modern = task(type=PANDAS_3)
    assert run('task.type matches "pandas.core.*"', modern)
    assert run('task.type matches "*.DataFrame"', task(type=PANDAS_2))
    assert not run('task.type matches "numpy.*"', modern)


def test_type_compared_with_another_attribute_goes_by_public_names() -> None:
    facts = task(type=PANDAS_2, annotations={"kind": PANDAS_3})
    assert run("task.type == task.annotations.kind", facts)
    assert not run("task.type != task.annotations.kind", facts)


def test_every_alias_names_one_type() -> None:
    seen: set[str] = set()
    for alias in ALIASES:
        for name in alias.names:
            assert name not in seen, name
            seen.add(name)
            assert set(names_of(name)) == set(alias.names)
    assert names_of("numpy.ndarray") == ("numpy.ndarray",)


def test_the_documented_table_is_the_table() -> None:
    text = (ROOT / "docs" / "expressions.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `([\w.]+)` \| (`.*`) \| (.*) \|$", text, flags=re.M)
    documented = {
        public: (tuple(re.findall(r"`([\w.]+)`", paths)), versions)
        for public, paths, versions in rows
    }
    assert documented == {a.public: (a.paths, a.versions) for a in ALIASES}


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("pandas.Dataframe", "pandas.DataFrame"),
        ("pandas.core.frame.Dataframe", "pandas.core.frame.DataFrame"),
        ("pandas.core.DataFrame", "pandas.DataFrame"),
        ("cupy.ndarry", "cupy.ndarray"),
        ("numpy.ndaray", "numpy.ndarray"),
    ],
)
def test_a_misspelt_known_name_is_found(name: str, hint: str) -> None:
    found = misspelt(name)
    assert found is not None and found in names_of(hint)


@pytest.mark.parametrize("name", [*sorted(KNOWN)[:5], "mylib.DataFrame", "pandas.zzzz", "x"])
def test_known_names_and_other_libraries_are_not_misspellings(name: str) -> None:
    assert misspelt(name) is None


def test_validate_warns_on_a_misspelt_type_at_its_position() -> None:
    text = 'version: 1\nrules:\n  - name: frames\n    match: task.type == "pandas.Dataframe"\n    replicate: 2\n'
    ruleset, diagnostics = check_text(text)
    assert ruleset is not None  # a warning: the file loads
    (d,) = diagnostics
    assert (d.severity, d.code, d.line, d.column) == ("warning", "type-name", 4, 25)
    assert "did you mean 'pandas.DataFrame'" in d.message
    assert d.rule == "frames"


def test_the_type_name_warning_can_be_silenced() -> None:
    text = (
        "version: 1\nrules:\n  - name: frames\n"
        '    match: task.type == "pandas.Dataframe"  # amm-rules: disable=type-name\n'
        "    replicate: 2\n"
    )
    _, diagnostics = check_text(text)
    assert diagnostics == []


def test_a_type_in_a_pattern_is_not_called_misspelt() -> None:
    compiled = compile_expression('task.type matches "pandas.Data*"', "task")
    assert compiled.warnings == ()


# -- task.resources ----------------------------------------------------------------------


def test_task_resources_read_the_resource_restriction() -> None:
    gpu = task(resources={"GPU": 1})
    assert run("task.resources.GPU >= 1", gpu)
    assert not run("task.resources.GPU >= 1", task())
    assert run("task.resources.GPU == 0", task())  # 0 when none, as worker.resources
    assert run('task.resources["gpu-a100"] == 0.5', task(resources={"gpu-a100": 0.5}))
    assert run("not task.resources.GPU", task(resources={"MEMORY": 10}))


@pytest.mark.parametrize(
    ("text", "column", "says"),
    [
        ('task.resources[""] > 0', 16, "cannot be empty"),
        ('task.resources["GPU 1"] > 0', 16, "did you mean 'GPU1'?"),
        ('worker.resources["GPU=1"] > 0', 18, "without spaces, '=' or ','"),
    ],
)
def test_a_resource_name_that_is_no_word_is_an_error(text: str, column: int, says: str) -> None:
    (p,) = problems(text, "worker" if text.startswith("worker") else "task")
    assert p.column == column
    assert says in p.message


@pytest.mark.parametrize(
    ("text", "context", "suggested"),
    [
        ("task.resources.GPU.memory > 0", "task", 'task.resources["GPU.memory"] > 0'),
        ("worker.resources.gpu.a100 > 0", "worker", 'worker.resources["gpu.a100"] > 0'),
    ],
)
def test_too_many_names_suggest_what_parses(text: str, context: str, suggested: str) -> None:
    (p,) = problems(text, context)
    attribute = suggested.split(" ")[0]
    assert f"write {attribute}" in p.message
    compile_expression(suggested, context)  # type: ignore[arg-type]  # the suggestion parses


def test_the_resources_annotation_is_a_warning_saying_what_to_write() -> None:
    compiled = compile_expression("task.annotations.resources.GPU >= 1", "task")
    (w,) = compiled.warnings
    assert w.code == "resources-annotation"
    assert "write task.resources.GPU" in w.message
    assert (w.line, w.column) == (1, 1)
    compile_expression("task.resources.GPU >= 1", "task")
    (member,) = compile_expression('"GPU" in task.annotations.resources', "task").warnings
    assert member.column == 10


# -- nested annotations ------------------------------------------------------------------


def test_nested_annotations_read_mappings_name_by_name() -> None:
    facts = task(annotations={"resources": {"GPU": 1}, "placement": {"tier": {"x": "hot"}}})
    assert run("task.annotations.resources.GPU == 1", facts)
    assert run('task.annotations.placement.tier.x == "hot"', facts)
    assert run('task.annotations["placement"]["tier"]["x"] == "hot"', facts)
    assert not run("task.annotations.resources.FPGA == 1", facts)
    assert not run("task.annotations.resources.GPU.deeper == 1", facts)  # 1 is no mapping
    assert not run("task.annotations.missing.GPU == 1", facts)
    # A name with a dot in brackets is one name, not a path.
    assert run('task.annotations["a.b"] == 2', task(annotations={"a.b": 2}))


def test_in_looks_for_a_name_among_a_mappings_names() -> None:
    facts = task(annotations={"limits": {"GPU": 1}})
    assert run('"GPU" in task.annotations.limits', facts)
    assert not run('"FPGA" in task.annotations.limits', facts)
    assert run('"FPGA" not in task.annotations.limits', facts)
    assert not run("true in task.annotations.limits", facts)


# -- spans -------------------------------------------------------------------------------


def test_span_paths_and_patterns() -> None:
    load = task(span="etl/load")
    assert run('task.span == "etl/load"', load)
    assert run('task.span matches "etl/*"', load)
    assert not run('task.span matches "train/*"', load)
    assert run('task.span == "default"', task())
    assert run('task.span matches "train/*" and not task.span_done', task(span="train/a"))
    assert not run(
        'task.span matches "train/*" and not task.span_done',
        task(span="train/a", span_done=True),
    )


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('task.span == "/etl"', "did you mean 'etl'?"),
        ('task.span matches "etl//*"', "did you mean 'etl/*'?"),
        ('task.span in ["ok", "etl/"]', "did you mean 'etl'?"),
        ("task.span == \"('etl', 'load')\"", "e.g. 'etl/load'"),
        ('task.span == ""', "cannot be empty"),
    ],
)
def test_a_span_no_span_can_have_is_an_error_at_its_literal(text: str, says: str) -> None:
    (p,) = problems(text)
    assert p.code == "bad-literal"
    assert says in p.message
    literal = re.search(r"\"[^\"]*\"(?!.*\"(?:/|\(|$))" if "in [" not in text else r'"etl/"', text)
    assert literal is not None
    assert p.column == literal.start() + 1


def test_span_errors_are_positioned_in_the_rules_file() -> None:
    text = 'version: 1\nrules:\n  - name: etl\n    match: task.span matches "etl//*"\n    replicate: 2\n'
    ruleset, diagnostics = check_text(text)
    assert ruleset is None
    (d,) = diagnostics
    assert (d.severity, d.line, d.column, d.code) == ("error", 4, 30, "bad-literal")
