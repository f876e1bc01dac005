"""The expression language: parsing, checking and the compiled predicates.

Every example in docs/expressions.md is compiled here too. The glob matcher has its
own file (test_expr_glob.py), and so do the property-based tests
(test_expr_properties.py).
"""

from __future__ import annotations

import importlib.resources
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from amm_rules.language.expr import (
    MAX_DEPTH,
    MAX_LENGTH,
    CompiledExpression,
    ExpressionError,
    Problem,
    ast,
    compile_expression,
)
from amm_rules.language.expr.attributes import ATTRIBUTES, ValueType
from amm_rules.language.expr.parser import get_parser, parse
from amm_rules.language.expr.table import grammar_text
from amm_rules.language.ruleset import TASK_ATTRIBUTES, WORKER_ATTRIBUTES, TaskFacts, WorkerFacts

ROOT = Path(__file__).resolve().parents[2]
GiB = 2**30
MiB = 2**20


def task(**kwargs: Any) -> TaskFacts:
    kwargs.setdefault("key", "x-1")
    return TaskFacts(**kwargs)


def worker(**kwargs: Any) -> WorkerFacts:
    kwargs.setdefault("address", "tcp://10.0.0.1:4567")
    return WorkerFacts(**kwargs)


def run(text: str, facts: Any) -> bool:
    context = "worker" if isinstance(facts, WorkerFacts) else "task"
    return compile_expression(text, context).predicate(facts)


def problems(text: str, context: str = "task") -> list[Problem]:
    with pytest.raises(ExpressionError) as info:
        compile_expression(text, context)  # type: ignore[arg-type]
    return info.value.problems


def only(text: str, context: str = "task") -> Problem:
    found = problems(text, context)
    assert len(found) == 1, found
    return found[0]


# -- the documentation --------------------------------------------------------------

_BLOCK = re.compile(r"^```(amm-expr-[a-z]+)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _doc_blocks() -> list[tuple[str, str]]:
    text = (ROOT / "docs" / "expressions.md").read_text(encoding="utf-8")
    return [(m.group(1), m.group(2).rstrip("\n")) for m in _BLOCK.finditer(text)]


def test_docs_have_examples_of_every_kind() -> None:
    kinds = [kind for kind, _ in _doc_blocks()]
    assert kinds.count("amm-expr-task") >= 20
    assert kinds.count("amm-expr-worker") >= 5
    assert kinds.count("amm-expr-invalid") >= 5
    assert set(kinds) == {"amm-expr-task", "amm-expr-worker", "amm-expr-invalid"}


#: What each example of docs/expressions.md means: facts it is true of, and facts it
#: is false of (what the page says of it, or of the attributes and operators it uses).
MEANING: dict[str, list[tuple[Any, bool]]] = {
    'task.prefix == "read_parquet"': [
        (task(prefix="read_parquet"), True),
        (task(prefix="read_csv"), False),
    ],
    'task.type == "pandas.DataFrame" and task.nbytes > 100 MiB': [
        (task(type="pandas.DataFrame", nbytes=100 * MiB + 1), True),
        # pandas 2 recorded the module path: the same type.
        (task(type="pandas.core.frame.DataFrame", nbytes=100 * MiB + 1), True),
        (task(type="pandas.DataFrame", nbytes=100 * MiB), False),
        (task(type="numpy.ndarray", nbytes=GiB), False),
    ],
    "task.resources.GPU >= 1": [
        (task(resources={"GPU": 1}), True),
        (task(resources={"GPU": 0.5}), False),
        (task(), False),
    ],
    'task.span matches "train/*" and not task.span_done': [
        (task(span="train/epoch-1"), True),
        (task(span="train/epoch-1", span_done=True), False),
        (task(span="train"), False),
    ],
    'task.span == "etl/load" or task.span == "default"': [
        (task(span="etl/load"), True),
        (task(), True),
        (task(span="etl"), False),
    ],
    'task.annotations.placement.tier == "hot" or task.annotations["placement"]["zone"] == "a"': [
        (task(annotations={"placement": {"tier": "hot"}}), True),
        (task(annotations={"placement": {"zone": "a"}}), True),
        (task(annotations={"placement": "hot"}), False),
        (task(), False),
    ],
    '"GPU" in task.annotations.limits': [
        (task(annotations={"limits": {"GPU": 2}}), True),
        (task(annotations={"limits": ["GPU"]}), True),
        (task(annotations={"limits": {"CPU": 2}}), False),
    ],
    'task.type in ["pandas.core.frame.DataFrame", "cupy.ndarray"] or task.type matches "pandas.*"': [
        (task(type="pandas.DataFrame"), True),
        (task(type="cupy._core.core.ndarray"), True),
        (task(type="pandas.Series"), True),
        (task(type="numpy.ndarray"), False),
    ],
    "task.replicas < 2": [(task(replicas=1), True), (task(replicas=2), False)],
    # The memory flow of the key's prefix: null before its first task finished.
    "task.prefix_net_per_task > 64 MiB": [
        (task(prefix_tasks=3, prefix_net_per_task=64 * MiB + 1), True),
        (task(prefix_tasks=3, prefix_net_per_task=64 * MiB), False),
        (task(), False),  # a kind never seen: null, and null > 64 MiB is false
    ],
    "task.prefix_tasks >= 10 and task.prefix_freed_by_per_task > 1 MiB": [
        (task(prefix_tasks=10, prefix_freed_by_per_task=2 * MiB), True),
        (task(prefix_tasks=9, prefix_freed_by_per_task=2 * MiB), False),
        (task(prefix_tasks=10, prefix_freed_by_per_task=MiB), False),
    ],
    "task.prefix_net_per_task < 0": [
        (task(prefix_tasks=3, prefix_net_per_task=-1.0), True),
        (task(prefix_tasks=3, prefix_net_per_task=0.0), False),
        (task(), False),
    ],
    # A chunk of the array named checkpoint-1a2b: its key is a tuple, written as a string.
    'task.group matches "checkpoint-*" or task.prefix == "checkpoint"': [
        (task(key="('checkpoint-1a2b', 0)", group="checkpoint-1a2b", prefix="checkpoint"), True),
        (task(key="checkpoint-3", group="checkpoint-3", prefix="checkpoint"), True),
        (task(key="('stage1-5e6f', 0)", group="stage1-5e6f", prefix="stage1"), False),
    ],
    'task.key matches "checkpoint-*" or task.key matches "(\'checkpoint-*"': [
        (task(key="('checkpoint-1a2b', 0)"), True),
        (task(key="checkpoint-3"), True),
        (task(key="('stage1-5e6f', 0)"), False),
    ],
    'task.prefix == "stage1" or task.group matches "checkpoint-*"': [
        (task(key="stage1-5e6f", prefix="stage1", group="stage1-5e6f"), True),
        (task(key="('checkpoint-1a2b', 2)", prefix="checkpoint", group="checkpoint-1a2b"), True),
        (task(key="stage2-1", prefix="stage2", group="stage2-1"), False),
    ],
    "task.waiters >= 20 or task.reads >= 200": [
        (task(waiters=20, reads=0), True),
        (task(waiters=0, reads=200), True),
        (task(waiters=19, reads=199), False),
    ],
    "task.annotations.priority >= 10": [
        (task(annotations={"priority": 10}), True),
        (task(annotations={"priority": 9}), False),
        (task(annotations={}), False),  # not set: null, and null >= 10 is false
        (task(annotations={"priority": "10"}), False),  # a string is not a number
    ],
    'task.annotations["cache-tier"] == "hot"': [
        (task(annotations={"cache-tier": "hot"}), True),
        (task(annotations={"cache-tier": "cold"}), False),
        (task(annotations={"cache_tier": "hot"}), False),
    ],
    "worker.resources.GPU >= 1": [
        (worker(resources={"GPU": 1}), True),
        (worker(resources={"GPU": 0.5}), False),
        (worker(resources={}), False),
    ],
    "worker.memory_limit >= 64 GiB and not worker.resources.GPU": [
        (worker(memory_limit=64 * GiB), True),
        (worker(memory_limit=64 * GiB, resources={"GPU": 1}), False),
        (worker(memory_limit=32 * GiB), False),
    ],
    'worker.host in ["10.0.0.1", "10.0.0.2"]': [
        (worker(host="10.0.0.2"), True),
        (worker(host="10.0.0.3"), False),
    ],
    'worker.name matches "big-*"': [
        (worker(name="big-7"), True),
        (worker(name="small-big-7"), False),
    ],
    "worker.memory_fraction < 60% and worker.nthreads >= 4": [
        (worker(memory_fraction=0.59, nthreads=4), True),
        (worker(memory_fraction=0.6, nthreads=4), False),
        (worker(memory_fraction=0.1, nthreads=2), False),
    ],
    'worker.resources["gpu-a100"] > 0': [
        (worker(resources={"gpu-a100": 2}), True),
        (worker(resources={"gpu-a100": 0}), False),
        (worker(resources={"GPU": 1}), False),
    ],
    'not (task.prefix == "shuffle" or task.prefix == "split") and task.nbytes >= 1 MiB': [
        (task(prefix="sum", nbytes=MiB), True),
        (task(prefix="split", nbytes=GiB), False),
        (task(prefix="sum", nbytes=MiB - 1), False),
    ],
    'task.type not in ["numpy.ndarray", "pandas.core.frame.DataFrame"]': [
        (task(type="cupy.ndarray"), True),
        (task(type="numpy.ndarray"), False),
    ],
    "1 MiB < task.nbytes and task.nbytes < 1 GiB": [
        (task(nbytes=MiB + 1), True),
        (task(nbytes=MiB), False),
        (task(nbytes=GiB), False),
    ],
    "task.annotations.precious": [
        (task(annotations={"precious": True}), True),
        (task(annotations={"precious": "yes"}), True),
        (task(annotations={"precious": 0}), False),
        (task(annotations={"precious": ""}), False),
        (task(annotations={}), False),
    ],
    "not worker.resources.GPU": [
        (worker(resources={}), True),
        (worker(resources={"GPU": 0}), True),
        (worker(resources={"GPU": 2}), False),
    ],
    'task.key matches "(\'shuffle-*"': [
        (task(key="('shuffle-8b1d', 3)"), True),
        (task(key="shuffle-8b1d"), False),
    ],
    'task.type matches "cupy.*" or task.type matches "cudf.*"': [
        (task(type="cupy.ndarray"), True),
        (task(type="cudf.core.dataframe.DataFrame"), True),
        (task(type="numpy.ndarray"), False),
        (task(type=None), False),  # matches on null is false
    ],
    'task.prefix matches "stage[0-9]"': [
        (task(prefix="stage7"), True),
        (task(prefix="stage10"), False),
        (task(prefix="stagex"), False),
    ],
    'task.group matches "*[!0-9]"': [
        (task(group="load-a"), True),
        (task(group="load-1"), False),
    ],
    "task.nbytes >= 1.5 GiB": [
        (task(nbytes=3 * GiB // 2), True),
        (task(nbytes=3 * GiB // 2 - 1), False),
    ],
    "task.recompute_seconds > 10 min": [
        (task(recompute_seconds=601.0), True),
        (task(recompute_seconds=600.0), False),
        (task(recompute_seconds=None), False),  # unknown: any comparison is false
    ],
    "task.recompute_seconds >= 30s and task.nbytes < 64 MiB": [
        (task(recompute_seconds=30.0, nbytes=MiB), True),
        (task(recompute_seconds=29.5, nbytes=MiB), False),
        (task(recompute_seconds=3600.0, nbytes=64 * MiB), False),
    ],
    "task.nbytes < 512MiB": [(task(nbytes=512 * MiB - 1), True), (task(nbytes=512 * MiB), False)],
    "task.nbytes > 250000000": [
        (task(nbytes=250_000_001), True),
        (task(nbytes=250_000_000), False),
    ],
    "task.annotations.label == 'it\\'s here'": [
        (task(annotations={"label": "it's here"}), True),
        (task(annotations={"label": "its here"}), False),
    ],
    "task.annotations.retries in [1, 2, 3,]": [
        (task(annotations={"retries": 3}), True),
        (task(annotations={"retries": 4}), False),
        (task(annotations={"retries": "3"}), False),
    ],
    "worker.memory_fraction >= 0.3": [
        (worker(memory_fraction=0.3), True),
        (worker(memory_fraction=0.29), False),
    ],
    "true": [(task(), True)],
    '"gpu" in task.annotations.tags': [
        (task(annotations={"tags": ["cpu", "gpu"]}), True),
        (task(annotations={"tags": ["cpu"]}), False),
        (task(annotations={"tags": "gpu"}), False),  # not a list
        (task(annotations={}), False),
    ],
    'task.prefix in ["a", "b"]': [(task(prefix="b"), True), (task(prefix="c"), False)],
    'task.annotations.tier == "gold" or task.annotations.tier == 1': [
        (task(annotations={"tier": "gold"}), True),
        (task(annotations={"tier": 1}), True),
        (task(annotations={"tier": True}), False),  # a boolean is not the number 1
        (task(annotations={}), False),
    ],
    'not (task.annotations.tier == "gold")': [
        (task(annotations={"tier": "silver"}), True),
        (task(annotations={}), True),
        (task(annotations={"tier": "gold"}), False),
    ],
    'task.type == "numpy.ndarray" or not task.type': [
        (task(type="numpy.ndarray"), True),
        (task(type=None), True),  # not known yet
        (task(type="pandas.core.frame.DataFrame"), False),
    ],
    "task.nbytes > 1 GiB or true": [(task(nbytes=0), True), (task(nbytes=2 * GiB), True)],
    'task.type matches "pandas.*"\n  and task.nbytes > 512 MiB': [
        (task(type="pandas.core.series.Series", nbytes=GiB), True),
        (task(type="pandas.core.series.Series", nbytes=512 * MiB), False),
        (task(type="numpy.ndarray", nbytes=GiB), False),
    ],
}


def test_every_docs_example_has_its_meaning_checked() -> None:
    documented = {text for kind, text in _doc_blocks() if kind != "amm-expr-invalid"}
    assert documented == set(MEANING)
    for text, cases in MEANING.items():
        if text not in ("true", "task.nbytes > 1 GiB or true"):  # constant: always true
            assert {expected for _, expected in cases} == {True, False}, text


@pytest.mark.parametrize(("kind", "text"), _doc_blocks())
def test_docs_example(kind: str, text: str) -> None:
    if kind == "amm-expr-invalid":
        for context in ("task", "worker"):
            with pytest.raises(ExpressionError):
                compile_expression(text, context)  # type: ignore[arg-type]
        return
    context = "task" if kind == "amm-expr-task" else "worker"
    compiled = compile_expression(text, context)  # type: ignore[arg-type]
    for facts, expected in MEANING[text]:
        assert compiled.predicate(facts) is expected, (text, facts)


def test_docs_error_example_is_what_we_print() -> None:
    text = (ROOT / "docs" / "expressions.md").read_text(encoding="utf-8")
    shown = re.search(r"```text\n(.*?)```", text, re.DOTALL)
    assert shown is not None
    with pytest.raises(ExpressionError) as info:
        compile_expression('task.nbytes > "x" and task.prefx == 1', "task")
    assert str(info.value) == shown.group(1).rstrip("\n")


# -- registry and grammar -----------------------------------------------------------


def test_registry_matches_the_facts() -> None:
    assert tuple(ATTRIBUTES["task"]) == TASK_ATTRIBUTES
    assert tuple(ATTRIBUTES["worker"]) == WORKER_ATTRIBUTES
    assert set(TASK_ATTRIBUTES) <= set(TaskFacts.__dataclass_fields__)
    assert set(WORKER_ATTRIBUTES) <= set(WorkerFacts.__dataclass_fields__)


def test_every_attribute_is_documented() -> None:
    text = (ROOT / "docs" / "expressions.md").read_text(encoding="utf-8")
    for specs in ATTRIBUTES.values():
        for spec in specs.values():
            assert f"`{spec.display}`" in text, spec.display


def test_grammar_loads_and_parser_is_shared() -> None:
    assert grammar_text() == (ROOT / "grammar" / "expr.lark").read_text(encoding="utf-8")
    assert get_parser() is get_parser()


def test_grammar_is_read_from_the_installed_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # In a wheel, grammar/ is installed as amm_rules/grammar/ (pyproject force-include).
    (tmp_path / "grammar").mkdir()
    (tmp_path / "grammar" / "expr.lark").write_text("// installed copy\n", encoding="utf-8")
    monkeypatch.setattr(importlib.resources, "files", lambda package: tmp_path)
    assert grammar_text() == "// installed copy\n"


# -- parsing ------------------------------------------------------------------------


def test_ast_of_a_comparison_has_spans() -> None:
    node = parse('task.prefix == "x"')
    assert isinstance(node, ast.Compare)
    assert node.op == "=="
    assert node.span == ast.Span(1, 1, 1, 19)
    assert node.op_span == ast.Span(1, 13, 1, 15)
    assert isinstance(node.left, ast.Attribute)
    assert node.left.parts == ("task", "prefix")
    assert node.left.part_spans == (ast.Span(1, 1, 1, 5), ast.Span(1, 6, 1, 12))
    assert node.right == ast.Literal("x", "string", '"x"', ast.Span(1, 16, 1, 19))


def test_precedence_not_and_or() -> None:
    node = parse("not a and b or c")
    assert isinstance(node, ast.Or)
    first, second = node.operands
    assert isinstance(first, ast.And)
    assert isinstance(first.operands[0], ast.Not)
    assert isinstance(second, ast.Attribute)


def test_chains_are_flat() -> None:
    node = parse(" or ".join(f"task.replicas == {i}" for i in range(150)))
    assert isinstance(node, ast.Or)
    assert len(node.operands) == 150


def test_parentheses_leave_no_node() -> None:
    assert parse("((task.key))") == parse("task.key").__class__(
        ("task", "key"), ast.Span(1, 3, 1, 11), (ast.Span(1, 3, 1, 7), ast.Span(1, 8, 1, 11))
    )


def test_multiline_positions() -> None:
    node = parse('task.prefix == "a"\n  and task.nbytes >\n    1 GiB')
    assert isinstance(node, ast.And)
    size = node.operands[1].right  # type: ignore[union-attr]
    assert size == ast.Literal(GiB, "size", "1 GiB", ast.Span(3, 5, 3, 10))


def test_bracketed_names() -> None:
    node = parse('task.annotations["a-b.c"]')
    assert isinstance(node, ast.Attribute)
    assert node.parts == ("task", "annotations", "a-b.c")
    assert node.name == "task.annotations['a-b.c']"


# -- literals -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0 B", 0),
        ("100 B", 100),
        ("1 kB", 1000),
        ("1 MB", 10**6),
        ("1 GB", 10**9),
        ("1 TB", 10**12),
        ("1 KiB", 1024),
        ("1 MiB", MiB),
        ("1 GiB", GiB),
        ("1 TiB", 2**40),
        ("512MiB", 512 * MiB),
        ("512   MiB", 512 * MiB),
        ("1.5 GiB", 3 * GiB // 2),
        ("1.1 kB", 1100),
        ("0.5 B", 0),  # rounded down to whole bytes
    ],
)
def test_size_literals(text: str, value: int) -> None:
    node = parse(f"task.nbytes == {text}")
    assert isinstance(node, ast.Compare) and isinstance(node.right, ast.Literal)
    assert node.right.value == value
    assert type(node.right.value) is int
    assert run(f"task.nbytes == {text}", task(nbytes=value))


@pytest.mark.parametrize(
    ("text", "value"), [("30%", 0.3), ("0%", 0.0), ("100%", 1.0), ("12.5%", 0.125), ("5 %", 0.05)]
)
def test_percentages(text: str, value: float) -> None:
    node = parse(f"worker.memory_fraction > {text}")
    assert node.right.value == pytest.approx(value)  # type: ignore[union-attr]
    assert node.right.kind == "fraction"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ('"plain"', "plain"),
        ("'single'", "single"),
        (r'"a\"b"', 'a"b'),
        (r"'a\'b'", "a'b"),
        (r'"back\\slash"', "back\\slash"),
        (r'"tab\there"', "tab\there"),
        (r'"new\nline"', "new\nline"),
        ('"it\'s"', "it's"),
        ("''", ""),
    ],
)
def test_string_literals(text: str, value: str) -> None:
    node = parse(f"task.prefix == {text}")
    assert node.right.value == value  # type: ignore[union-attr]
    assert run(f"task.prefix == {text}", task(prefix=value))


@pytest.mark.parametrize(
    ("text", "value"), [("3", 3), ("-1", -1), ("0.25", 0.25), ("true", True), ("false", False)]
)
def test_scalar_literals(text: str, value: Any) -> None:
    node = parse(f"task.annotations.x == {text}")
    assert node.right.value == value  # type: ignore[union-attr]
    assert type(node.right.value) is type(value)  # type: ignore[union-attr]


def test_list_literals() -> None:
    node = parse('task.prefix in ["a", \'b\', "c",]')
    assert isinstance(node, ast.Compare) and isinstance(node.right, ast.ListLiteral)
    assert [item.value for item in node.right.items] == ["a", "b", "c"]
    assert run("task.prefix in []", task(prefix="a")) is False
    assert run("task.prefix not in []", task(prefix="a")) is True
    assert run("task.nbytes in [1 KiB, 2 KiB]", task(nbytes=2048))
    assert run("task.replicas in [1, 2.0]", task(replicas=2))


# -- operators on task facts --------------------------------------------------------

FACTS = task(
    key="('shuffle-abc', 3)",
    prefix="shuffle",
    group="shuffle-abc",
    type="pandas.core.frame.DataFrame",
    nbytes=600 * MiB,
    replicas=2,
    annotations={"tier": "gold", "priority": 5, "precious": True, "tags": ["a", "b"]},
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('task.prefix == "shuffle"', True),
        ('task.prefix != "shuffle"', False),
        ('task.group == "shuffle-abc"', True),
        ("task.nbytes > 512 MiB", True),
        ("task.nbytes >= 600 MiB", True),
        ("task.nbytes < 600 MiB", False),
        ("task.nbytes <= 600 MiB", True),
        ("512 MiB < task.nbytes", True),
        ("1 GiB <= task.nbytes", False),
        ("task.replicas == 2", True),
        ("task.replicas > 2", False),
        ('task.prefix < "t"', True),
        ('task.type in ["pandas.core.frame.DataFrame", "numpy.ndarray"]', True),
        ('task.type not in ["pandas.core.frame.DataFrame"]', False),
        ('task.type matches "pandas.*"', True),
        ('task.key matches "(\'shuffle-*"', True),
        ('task.key matches "*, [0-9])"', True),
        ('task.key matches "*, [!0-9])"', False),
        ('task.prefix == "shuffle" and task.replicas == 2', True),
        ('task.prefix == "x" or task.replicas == 2', True),
        ('task.prefix == "x" or task.replicas == 3', False),
        ('not task.prefix == "x"', True),
        ('not (task.prefix == "shuffle" and task.replicas == 2)', False),
        ("task.annotations.precious", True),
        ("not task.annotations.missing", True),
        ("task.annotations.priority >= 5", True),
        ('task.annotations.tier == "gold"', True),
        ('"a" in task.annotations.tags', True),
        ('"z" not in task.annotations.tags', True),
        ('task.prefix == "shuffle" and task.replicas == 2 and task.nbytes > 1 MiB', True),
        ('task.prefix == "shuffle" and task.replicas == 2 and task.nbytes > 1 GiB', False),
        ('task.prefix == "x" or task.replicas == 5 or task.nbytes > 1 MiB', True),
        ('task.prefix == "x" or task.replicas == 5 or task.nbytes > 1 GiB', False),
        ("(task.nbytes > 1 GiB) == false", True),
        ("task.replicas", True),
        ('task.prefix and task.annotations.tier matches "g*"', True),
    ],
)
def test_task_operators(text: str, expected: bool) -> None:
    assert run(text, FACTS) is expected


WORKER = worker(
    name="big-1",
    host="10.0.0.1",
    resources={"GPU": 2, "gpu-a100": 1},
    memory_limit=64 * GiB,
    nthreads=8,
    memory=16 * GiB,
    memory_fraction=0.25,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("worker.resources.GPU >= 1", True),
        ("worker.resources.TPU >= 1", False),
        ("worker.resources.TPU == 0", True),  # missing resources are 0
        ("not worker.resources.TPU", True),
        ('worker.resources["gpu-a100"] == 1', True),
        ("worker.memory_limit >= 64 GiB and not worker.resources.GPU", False),
        ("worker.memory_fraction < 30%", True),
        ("worker.memory_fraction < 0.2", False),
        ("worker.memory > 8 GiB", True),
        ("worker.nthreads >= 4", True),
        ('worker.host in ["10.0.0.1", "10.0.0.2"]', True),
        ('worker.address matches "tcp://10.0.0.*"', True),
        ('worker.name matches "big-?"', True),
    ],
)
def test_worker_operators(text: str, expected: bool) -> None:
    assert run(text, WORKER) is expected


def test_missing_resources_mapping_counts_as_zero() -> None:
    compiled = compile_expression("worker.resources.GPU == 0", "worker")
    assert compiled.predicate(worker(resources=None))  # type: ignore[arg-type]


# -- null and run-time kinds --------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        'task.type == "x"',
        'task.type != "x"',
        'task.type < "x"',
        'task.type <= "x"',
        'task.type > "x"',
        'task.type >= "x"',
        'task.type in ["x"]',
        'task.type not in ["x"]',
        'task.type matches "*"',
        "task.type",
        "task.annotations.x == 1",
        "task.annotations.x != 1",
        "task.annotations.x < 1",
        "task.annotations.x in [1]",
        "task.annotations.x not in [1]",
        "task.annotations.x not in []",
        'task.annotations.x matches "*"',
        "task.annotations.x",
        "task.annotations.x == task.annotations.y",
        "task.annotations.x != task.annotations.y",
        "task.annotations.x in task.annotations.y",
    ],
)
def test_comparisons_with_null_are_false(text: str) -> None:
    facts = task(type=None, annotations={})
    assert run(text, facts) is False
    assert run(f"not ({text})", facts) is True


def test_annotations_mapping_may_be_none() -> None:
    assert run("task.annotations.x == 1", task(annotations=None)) is False  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "text", "expected"),
    [
        (3, 'task.annotations.v == "gold"', False),
        (3, 'task.annotations.v != "gold"', False),  # kinds differ: false, like null
        (3, "task.annotations.v != 4", True),
        (True, "task.annotations.v == 1", False),  # true is not the number 1
        (1, "task.annotations.v == true", False),
        (True, "task.annotations.v == true", True),
        (1.0, "task.annotations.v == 1", True),
        ("3", "task.annotations.v > 2", False),
        (True, "task.annotations.v in [1, 2]", False),
        (1, "task.annotations.v in [true]", False),
        (1, 'task.annotations.v in ["a", 1]', True),
        (1, 'task.annotations.v not in ["a"]', False),
        (1, "task.annotations.v not in []", True),
        ([1], "task.annotations.v == 1", False),
        ({"a": 1}, 'task.annotations.v in ["a"]', False),
        (5, 'task.annotations.v matches "5"', False),
        ("abc", 'task.annotations.v matches "a*"', True),
        (["x", 1], '"x" in task.annotations.v', True),
        (["x", 1], "1 in task.annotations.v", True),
        (["x", 1], "true in task.annotations.v", False),
        (["x", 1], '"y" not in task.annotations.v', True),
        ([1, 2], '"y" not in task.annotations.v', False),
        ([], '"y" not in task.annotations.v', True),
        ("abc", '"a" in task.annotations.v', False),  # a string is not a list
        ("b", 'task.annotations.v > "a"', True),
        (True, "task.annotations.v > task.annotations.w", False),
        ("x", "task.prefix == task.annotations.v", True),
        (5, "task.prefix == task.annotations.v", False),
    ],
)
def test_annotation_kinds_at_run_time(value: Any, text: str, expected: bool) -> None:
    facts = task(prefix="x", annotations={"v": value, "w": False})
    assert run(text, facts) is expected


def test_strange_annotation_values_never_raise() -> None:
    class NoTruth:
        def __bool__(self) -> bool:
            raise ValueError("ambiguous")

    facts = task(annotations={"v": NoTruth()})
    assert run("task.annotations.v", facts) is False
    assert run("task.annotations.v == 1", facts) is False
    assert run('task.annotations.v matches "*"', facts) is False


def test_numpy_annotation_values() -> None:
    facts = task(annotations={"n": np.int64(5), "f": np.float32(0.5), "a": np.arange(3)})
    assert run("task.annotations.n == 5", facts)
    assert run("task.annotations.n in [4, 5]", facts)
    assert run("task.annotations.f < 1", facts)
    assert run("task.annotations.a == 1", facts) is False
    assert run("task.annotations.a", facts) is False


# -- depends and constants ----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "depends"),
    [
        ('task.prefix == "x"', {"prefix"}),
        ('task.prefix == "x" and task.annotations.a == 1', {"prefix", "annotations"}),
        ('task.key matches "a*" or task.nbytes > 1 GiB', {"key", "nbytes"}),
        ("task.annotations.a in task.annotations.b", {"annotations"}),
        ('true and task.type == "t"', {"type"}),
    ],
)
def test_depends(text: str, depends: set[str]) -> None:
    compiled = compile_expression(text, "task")
    assert compiled.depends == frozenset(depends)
    assert compiled.constant is None


def test_worker_depends() -> None:
    compiled = compile_expression(
        "worker.memory_fraction < 50% and worker.resources.GPU", "worker"
    )
    assert compiled.depends == {"memory_fraction", "resources"}


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("true", True),
        ("false", False),
        ("1 < 2", True),
        ("5 MiB > 1 GiB", False),
        ('"a" in ["a", "b"]', True),
        ('"abc" matches "a*"', True),
        ("not true", False),
        ("task.nbytes > 1 GiB or true", True),
        ("task.nbytes > 1 GiB and false", False),
        ("(1 < 2) == true", True),
        ("30% == 0.3", True),
    ],
)
def test_constants_fold(text: str, value: bool) -> None:
    compiled = compile_expression(text, "task")
    assert compiled.constant is value
    assert compiled.depends == frozenset()
    assert compiled.predicate(task()) is value


def test_compiled_expression_fields() -> None:
    compiled = compile_expression('task.prefix == "a"', "task")
    assert isinstance(compiled, CompiledExpression)
    assert compiled.source == 'task.prefix == "a"'
    assert compiled.context == "task"
    assert isinstance(compiled.ast, ast.Compare)
    assert compiled(task(prefix="a")) is True
    assert "task.prefix" in repr(compiled)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="context"):
        compile_expression("true", "rule")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        compile_expression(True, "task")  # type: ignore[arg-type]


# -- errors, with positions ---------------------------------------------------------


def test_unknown_attribute_points_at_the_misspelt_part() -> None:
    problem = only('task.prefx == "a"')
    assert problem == Problem(
        "task has no attribute 'prefx'; did you mean 'task.prefix'?", 1, 6, "unknown-attribute", 11
    )


def test_unknown_worker_attribute() -> None:
    problem = only("worker.resorces.GPU > 0", "worker")
    assert (problem.code, problem.column, problem.end_column) == ("unknown-attribute", 8, 16)
    assert "did you mean 'worker.resources'?" in problem.message


@pytest.mark.parametrize(
    ("text", "column", "fragment"),
    [
        ("tsk.prefix == 'a'", 1, "did you mean 'task'?"),
        ("prefix == 'a'", 1, "did you mean 'task.prefix'?"),
        ("task.prefix == stage1", 16, 'a string needs quotes: "stage1"'),
        ("True", 1, "did you mean 'true'?"),
        ("task.annotations == 1", 1, "needs a name"),
        ("task.key.x == 'a'", 10, "task.key has no attributes"),
        ("task.resources.a.b == 1", 18, "exactly one name"),
        ("task", 1, "'task' needs an attribute"),
        ("task.nothing == 1", 6, "task attributes are key, prefix"),
    ],
)
def test_unknown_attributes(text: str, column: int, fragment: str) -> None:
    problem = only(text)
    assert problem.code == "unknown-attribute"
    assert problem.column == column
    assert fragment in problem.message


def test_wrong_context() -> None:
    problem = only("task.nbytes > 1 GiB and worker.memory > 1 GiB")
    assert problem.code == "wrong-context"
    assert (problem.line, problem.column, problem.end_column) == (1, 25, 38)
    assert problem.message.startswith("worker attributes cannot be used in a rule's match;")
    problem = only('worker.name == "a" or task.prefix == "b"', "worker")
    assert problem.code == "wrong-context"
    assert problem.column == 23
    assert problem.message.startswith("task attributes cannot be used in a pool;")


@pytest.mark.parametrize(
    ("text", "column", "end", "fragment"),
    [
        (
            'task.nbytes > "x"',
            15,
            18,
            "task.nbytes is a size in bytes; compare it with a size such as 512 MiB",
        ),
        ("task.prefix == 5", 16, 17, "task.prefix is a string"),
        ("task.nbytes > 30%", 15, 18, "task.nbytes is a size in bytes"),
        (
            "task.replicas > 2 GiB",
            17,
            22,
            "task.replicas is a count; compare it with a whole number",
        ),
        ('"x" < task.nbytes', 1, 4, "task.nbytes is a size in bytes"),
        ("task.key matches 5", 18, 19, "'matches' needs a glob pattern"),
        ('task.nbytes matches "a*"', 1, 12, "'matches' compares a string"),
        ('task.prefix in "abc"', 16, 21, "needs a list on its right"),
        ("task.prefix in task.key", 16, 24, "needs a list"),
        ('task.prefix in ["a", 1]', 22, 23, "task.prefix is a string"),
        ("task.nbytes == task.prefix", 16, 27, "(task.prefix is a string)"),
        ("1 == 'a'", 6, 9, "cannot compare 1 (a number) with 'a' (a string)"),
        ("task.annotations.x < true", 22, 26, "cannot be ordered"),
        ("task.annotations.x == [1]", 23, 26, "a list can only follow 'in'"),
        ("[1] in [1]", 1, 4, "a list cannot be looked up"),
        ('"a" or task.key == "b"', 1, 4, 'e.g. task.prefix == "a"'),
        ("5", 1, 2, "5 is a number, not a condition"),
        ("[true]", 1, 7, "the list is a list, not a condition"),
    ],
)
def test_type_mismatches(text: str, column: int, end: int, fragment: str) -> None:
    problem = only(text)
    assert problem.code == "type-mismatch"
    assert (problem.line, problem.column, problem.end_column) == (1, column, end)
    assert fragment in problem.message


def test_worker_type_mismatch() -> None:
    problem = only("worker.memory_fraction > 1 GiB", "worker")
    assert (problem.code, problem.column) == ("type-mismatch", 26)
    assert problem.message.startswith("worker.memory_fraction is a fraction between 0 and 1;")
    problem = only('worker.resources.GPU == "1"', "worker")
    assert problem.message.startswith("worker.resources.GPU is a number; compare it with a number")


def test_numbers_fit_every_numeric_type() -> None:
    for text in ("task.nbytes > 1000", "task.replicas >= 2", "task.replicas > 1.5"):
        compile_expression(text, "task")
    for text in (
        "worker.memory_fraction > 0.5",
        "worker.resources.GPU > 1 GiB",
        "worker.resources.GPU >= 50%",
        "worker.memory < worker.memory_limit",
    ):
        compile_expression(text, "worker")
    assert only("worker.nthreads > worker.memory", "worker").code == "type-mismatch"


@pytest.mark.parametrize(
    ("text", "column", "end", "fragment"),
    [
        ("task.nbytes > 5 XB", 17, 19, "unknown unit 'XB'"),
        ("task.nbytes > 5 gb", 17, 19, "did you mean 'GB'?"),
        ("task.nbytes > 5GiBs", 16, 20, "did you mean 'GiB'?"),
        ("task.nbytes > 5 kb", 17, 19, "did you mean 'kB'?"),
        ("task.nbytes > 1 bytes", 17, 22, "units are B, kB, MB, GB, TB, KiB, MiB, GiB, TiB"),
    ],
)
def test_unknown_units(text: str, column: int, end: int, fragment: str) -> None:
    problem = only(text)
    assert (problem.code, problem.column, problem.end_column) == ("unknown-unit", column, end)
    assert fragment in problem.message


@pytest.mark.parametrize(
    ("text", "column", "end", "fragment"),
    [
        ("task.annotations.x > 101%", 22, 25, "between 0% and 100%"),
        ("task.annotations.x > -1%", 22, 24, "between 0% and 100%"),
        ("task.nbytes > -1 GiB", 15, 17, "cannot be negative"),
        (r'task.prefix == "a\qb"', 18, 20, r"unknown escape '\q'"),
        ('task.key matches "a[b"', 20, 21, "unclosed '['"),
        ('task.key matches "[z-a]"', 20, 21, "empty range 'z-a'"),
        ('task.key matches "a\\tb[c"', 18, 26, "unclosed '['"),  # escapes: whole literal
        ("task.type == null", 14, 18, "there is no 'null'"),
    ],
)
def test_bad_literals(text: str, column: int, end: int, fragment: str) -> None:
    problem = only(text)
    assert (problem.code, problem.column, problem.end_column) == ("bad-literal", column, end)
    assert fragment in problem.message


@pytest.mark.parametrize(
    ("text", "line", "column", "fragment"),
    [
        ("task.nbytes >", 1, 14, "unexpected end of the expression; expected a value"),
        ("task.nbytes = 1", 1, 13, "use '==' to compare"),
        ("task.a AND task.b", 1, 8, "keywords are lowercase: write 'and'"),
        ("a && b", 1, 3, "use 'and'"),
        ("a || b", 1, 3, "use 'or'"),
        ('task.prefix == "abc', 1, 16, "no closing quote"),
        ("(task.key", 1, 10, "expected ')'"),
        ("task.key)", 1, 9, "unexpected ')'"),
        ("1 < task.replicas < 3", 1, 19, "unexpected '<'"),
        ("task.nbytes > 1 2", 1, 17, "expected a unit (such as MiB)"),
        ("task.", 1, 6, "expected a name"),
        ("", 1, 1, "the expression is empty"),
        ("   \n  ", 1, 1, "the expression is empty"),
        ("task.prefix in [[1]]", 1, 17, "unexpected '['"),
        ("task.key\n  and\n  task.prefix ==", 3, 17, "unexpected end"),
        ("task.key\n  and )", 2, 7, "unexpected ')'"),
    ],
)
def test_syntax_errors(text: str, line: int, column: int, fragment: str) -> None:
    problem = only(text)
    assert problem.code == "syntax"
    assert (problem.line, problem.column) == (line, column)
    assert fragment in problem.message


def test_syntax_error_stops_at_the_first() -> None:
    assert len(problems("task.prefx == 1 == 2 and (")) == 1


def test_all_type_problems_are_reported_together() -> None:
    found = problems(
        'task.nbytes > "x"\n  and task.prefx == 1\n  or worker.memory > 5 XB\n  or task.replicas > 30%'
    )
    assert [(p.code, p.line, p.column) for p in found] == [
        ("type-mismatch", 1, 15),
        ("unknown-attribute", 2, 12),
        ("wrong-context", 3, 6),
        ("unknown-unit", 3, 24),
        ("type-mismatch", 4, 22),
    ]


def test_error_rendering_with_caret() -> None:
    with pytest.raises(ExpressionError) as info:
        compile_expression('task.prefix == "a"\n\tand task.nbytes > 5 XB', "task")
    assert str(info.value) == (
        "2:22: unknown unit 'XB'; did you mean 'B'? "
        "(units are B, kB, MB, GB, TB, KiB, MiB, GiB, TiB)\n"
        "\tand task.nbytes > 5 XB\n"
        "\t                    ^~"
    )
    assert info.value.source.startswith("task.prefix")


def test_error_survives_copy() -> None:
    import copy

    with pytest.raises(ExpressionError) as info:
        compile_expression("task.x", "task")
    clone = copy.copy(info.value)
    assert clone.problems == info.value.problems
    assert str(clone) == str(info.value)


# -- limits -------------------------------------------------------------------------


def test_length_limit() -> None:
    filler = "task.key == '" + "a" * (MAX_LENGTH - 15) + "'"
    assert len(filler) == MAX_LENGTH - 1
    compile_expression(filler, "task")
    compile_expression(filler + " ", "task")
    problem = only(filler + "  ")
    assert (problem.code, problem.line, problem.column) == ("too-long", 1, 1)
    assert "4097 characters" in problem.message


def test_depth_limit_parentheses() -> None:
    ok = "(" * MAX_DEPTH + "task.replicas > 1" + ")" * MAX_DEPTH
    assert compile_expression(ok, "task").predicate(task(replicas=2))
    deep = "(" * (MAX_DEPTH + 1) + "task.key" + ")" * (MAX_DEPTH + 1)
    problem = only(deep)
    assert (problem.code, problem.column, problem.end_column) == (
        "too-deep",
        MAX_DEPTH + 1,
        MAX_DEPTH + 2,
    )


def test_depth_limit_not() -> None:
    ok = "not " * MAX_DEPTH + "task.replicas"
    assert compile_expression(ok, "task").predicate(task(replicas=1)) is True
    problem = only("not " * (MAX_DEPTH + 1) + "task.replicas")
    assert (problem.code, problem.column) == ("too-deep", 4 * MAX_DEPTH + 1)
    mixed = "not (" * 33 + "task.key" + ")" * 33
    assert only(mixed).code == "too-deep"


def test_very_deep_input_is_an_error_not_a_crash() -> None:
    for text in ("(" * 2000 + "x" + ")" * 2000, "not " * 1000 + "x", "(" * 4000, "[" * 4000):
        found = problems(text)
        assert found[0].code in ("too-deep", "syntax")


def test_deep_caller_stack_never_raises_recursion_error() -> None:
    expression = "(" * MAX_DEPTH + "task.replicas > 1" + ")" * MAX_DEPTH

    def nested(n: int) -> object:
        if n:
            return nested(n - 1)
        try:
            return compile_expression(expression, "task")
        except ExpressionError as exc:
            return exc

    result = nested(sys.getrecursionlimit() - 120)
    if isinstance(result, ExpressionError):
        assert result.problems[0].code == "too-deep"
    else:
        assert isinstance(result, CompiledExpression)


def test_value_types_are_described() -> None:
    assert ValueType.SIZE.value == "a size in bytes"


def test_no_dynamic_code_and_no_distributed() -> None:
    """Closures only: no eval/exec/compile()/pickle, and the language half never
    imports distributed."""
    forbidden = re.compile(
        r"(?<![\w.])(eval|exec|compile)\(|^\s*import (pickle|marshal)\b"
        r"|^\s*(import|from) distributed\b"
    )
    for path in sorted((ROOT / "amm_rules" / "expr").glob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("#", 1)[0]
            assert not forbidden.search(code), f"{path.name}:{number}: {line}"
