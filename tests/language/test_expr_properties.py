"""Property-based tests of the expression language: whatever the input, the only
exception is ExpressionError, every problem has a position inside the text, and a
compiled predicate never raises on facts of the documented types."""

from __future__ import annotations

from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from amm_rules.language.expr import CompiledExpression, ExpressionError, compile_expression
from amm_rules.language.ruleset import TaskFacts, WorkerFacts

VALID_TASK = [
    'task.prefix == "stage1" or task.key matches "checkpoint-*"',
    'task.type in ["cupy.ndarray", "cudf.core.dataframe.DataFrame"]',
    'task.type matches "pandas.*" and task.nbytes > 512 MiB',
    "not (task.replicas >= 2) and task.annotations.priority > 3",
    "task.annotations.tier != 'gold' or task.annotations.tags",
    "task.nbytes < 1.5 GiB and task.group matches '[!x]*'",
    '"a" in task.annotations.tags and task.annotations["x-y"] == true',
]
VALID_WORKER = [
    "worker.resources.GPU >= 1",
    "worker.memory_limit >= 64 GiB and not worker.resources.GPU",
    "worker.memory_fraction < 30% or worker.nthreads > 4",
    'worker.host in ["a", "b"] and worker.address matches "tcp://*"',
]

_ANNOTATION_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True),
    st.text(max_size=5),
    st.lists(st.one_of(st.integers(), st.text(max_size=3)), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
TASKS = st.builds(
    TaskFacts,
    key=st.text(max_size=20),
    prefix=st.text(max_size=10),
    group=st.text(max_size=10),
    type=st.one_of(st.none(), st.sampled_from(["numpy.ndarray", "pandas.core.frame.DataFrame"])),
    nbytes=st.integers(min_value=0, max_value=2**42),
    replicas=st.integers(min_value=0, max_value=10),
    annotations=st.dictionaries(
        st.sampled_from(["priority", "tier", "tags", "x-y", "precious"]), _ANNOTATION_VALUES
    ),
)
WORKERS = st.builds(
    WorkerFacts,
    address=st.text(max_size=20),
    name=st.text(max_size=10),
    host=st.text(max_size=10),
    resources=st.dictionaries(st.sampled_from(["GPU", "TPU"]), st.floats(0, 8)),
    memory_limit=st.integers(0, 2**40),
    nthreads=st.integers(1, 64),
    memory=st.integers(0, 2**40),
    memory_fraction=st.floats(0, 1),
)

# Characters the grammar cares about, plus some it does not.
_ALPHABET = (
    "taskworker.prefixnbytes annotations[]()\"'\\*?!=<>%,01239 GiBMkT-\n\tandornotinmatches_é#{"
)


def _compile_or_error(text: str, context: str) -> CompiledExpression | None:
    try:
        return compile_expression(text, context)  # type: ignore[arg-type]
    except ExpressionError as exc:
        assert exc.problems
        lines = text.split("\n")
        for problem in exc.problems:
            assert problem.code in {
                "syntax",
                "unknown-attribute",
                "wrong-context",
                "type-mismatch",
                "unknown-unit",
                "bad-literal",
                "too-long",
                "too-deep",
            }
            assert 1 <= problem.line <= len(lines)
            assert 1 <= problem.column <= len(lines[problem.line - 1]) + 1
        str(exc)
        return None


@given(st.text(alphabet=_ALPHABET, max_size=80), st.sampled_from(["task", "worker"]))
@example("(" * 3000, "task")
@example("not " * 900 + "x", "task")
@example("[" + "1," * 2000 + "]", "task")
def test_random_text_only_raises_expression_error(text: str, context: str) -> None:
    _compile_or_error(text, context)


@given(st.text(max_size=60), st.sampled_from(["task", "worker"]))
def test_any_unicode_only_raises_expression_error(text: str, context: str) -> None:
    _compile_or_error(text, context)


@st.composite
def _mutated(draw: Any, sources: list[str]) -> str:
    text = draw(st.sampled_from(sources))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(text)))
        action = draw(st.sampled_from(["insert", "delete", "replace", "duplicate"]))
        piece = draw(st.text(alphabet=_ALPHABET, min_size=1, max_size=3))
        if action == "insert":
            text = text[:at] + piece + text[at:]
        elif action == "delete":
            text = text[:at] + text[at + len(piece) :]
        elif action == "replace":
            text = text[:at] + piece + text[at + len(piece) :]
        else:
            text = text[:at] + text[at : at + 8] + text[at:]
    return text


@given(_mutated(VALID_TASK), TASKS)
def test_mutated_task_expressions(text: str, facts: TaskFacts) -> None:
    compiled = _compile_or_error(text, "task")
    if compiled is not None:
        assert compiled.predicate(facts) in (True, False)


@given(_mutated(VALID_WORKER), WORKERS)
def test_mutated_worker_expressions(text: str, facts: WorkerFacts) -> None:
    compiled = _compile_or_error(text, "worker")
    if compiled is not None:
        assert compiled.predicate(facts) in (True, False)


@given(st.sampled_from(VALID_TASK), TASKS)
def test_valid_task_expressions_never_raise(text: str, facts: TaskFacts) -> None:
    compiled = compile_expression(text, "task")
    assert compiled.predicate(facts) in (True, False)
    # The negation is computed by the same closures; it must be the exact opposite
    # (null makes both comparisons false, but not flips the whole result).
    negated = compile_expression(f"not ({text})", "task")
    assert negated.predicate(facts) is (not compiled.predicate(facts))


@given(st.sampled_from(VALID_WORKER), WORKERS)
def test_valid_worker_expressions_never_raise(text: str, facts: WorkerFacts) -> None:
    assert compile_expression(text, "worker").predicate(facts) in (True, False)
