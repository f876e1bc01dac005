"""Hostile input: whatever users, clients and the file system hand amm-rules, it answers
with diagnostics, errors or events, never a traceback, never a hang, and the scheduler
keeps running with everything else intact.

- Rules files: a seeded fuzz run of 10,000 generated, mutated and spliced files
  (:mod:`benchmarks.support.fuzzer`; ``benchmarks/fuzz_rules.py`` runs longer ones), each
  checked under a per-file alarm as a hang detector.
- YAML: tags that construct objects are errors and construct nothing; alias bombs,
  recursive aliases and deep nesting are refused with a clear error before they cost
  memory; a size limit.
- Expressions: adversarial glob patterns on long strings complete; limits on length,
  depth and list size.
- Annotations with any value: an error on the client (``amm_rules.annotate``).

The same on a running cluster (annotations and runtime calls that reach the scheduler,
hostile rules files at a hot reload) is in ``tests/engine/policy/test_hostile_cluster.py``;
the findings of a review of hostile input against the event loop, the dashboard, the
offline commands and the terminal are in ``tests/hostile/``, a module per part.
Hang bounds (:mod:`tests.support.hang`) are generous, seconds for work that takes
milliseconds: they catch a hang or a blow-up, they do not measure speed.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

import amm_rules
from amm_rules.engine.policy import RulesPolicy
from amm_rules.language.expr import MAX_DEPTH, MAX_LENGTH, MAX_LIST_ITEMS
from amm_rules.language.expr.glob import compile_glob, glob_match
from amm_rules.language.loader import check_path, check_text, load_ruleset
from amm_rules.language.ruleset import TaskFacts
from amm_rules.language.yaml_source import MAX_BYTES
from benchmarks.support.fuzzer import cases, check_and_run, seed_files
from tests.support.hang import Hang, hang_bound

#: Per-file bound of the fuzz run: the slowest of 200,000 files took 1.2 s on a quiet
#: machine (the largest ones, lines repeated 50 times); 25 times that catches a hang
#: and leaves room for a loaded machine.
FUZZ_HANG_SECONDS = 30.0
FUZZ_CASES = int(os.environ.get("AMM_RULES_HOSTILE_CASES", "10000"))
FUZZ_SEED = int(os.environ.get("AMM_RULES_HOSTILE_SEED", "20260806"))


# ---------------------------------------------------------------------------------
# Rules files: fuzzing


def test_fuzzed_rules_files_give_diagnostics_never_exceptions_nor_hangs() -> None:
    """FUZZ_CASES files (10,000 by default; seed in AMM_RULES_HOSTILE_SEED): every one
    checks to diagnostics with a message and a position; a file with no error compiles
    to a ruleset whose matches and pools run on any facts without raising."""
    failures: list[str] = []
    valid = 0
    for i, (kind, data) in enumerate(cases(FUZZ_SEED, FUZZ_CASES, seed_files())):
        where = f"seed {FUZZ_SEED} case {i} ({kind}): {data[:300]!r}"
        try:
            with hang_bound(FUZZ_HANG_SECONDS):
                ruleset, diagnostics = check_and_run(data)
        except (Exception, Hang) as exc:
            failures.append(f"{where}\n  {type(exc).__name__}: {exc}")
            continue
        internal = [d.message for d in diagnostics if d.code == "internal"]
        if internal:
            failures.append(f"{where}\n  {internal[0]}")
        if (ruleset is None) != any(d.is_error for d in diagnostics):
            failures.append(f"{where}\n  ruleset and errors disagree: {diagnostics}")
        if any(not d.message or not d.code or d.line < 0 or d.column < 0 for d in diagnostics):
            failures.append(f"{where}\n  malformed diagnostic: {diagnostics}")
        valid += ruleset is not None
        if len(failures) >= 5:
            break
    assert not failures, "\n".join(failures)
    # The generator reaches deep: some files are valid rules files.
    assert valid > FUZZ_CASES // 50


# ---------------------------------------------------------------------------------
# YAML

BILLION_LAUGHS = "\n".join(
    [
        'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]',
        *[
            f"{chr(ord('a') + i)}: &{chr(ord('a') + i)} [{', '.join(['*' + chr(ord('a') + i - 1)] * 9)}]"
            for i in range(1, 9)
        ],
    ]
)


YAML_CASES = [
    ("version: !!python/object/apply:os.getcwd []\n", "yaml-tag", "is not allowed"),
    ("version: !!python/name:builtins.eval\n", "yaml-tag", "is not allowed"),
    ("version: !!python/module:os\n", "yaml-tag", "is not allowed"),
    ("!!python/object/new:builtins.dict {}\n", "yaml-tag", "is not allowed"),
    ("version: !<tag:yaml.org,2002:python/object/apply:os.getpid> []\n", "yaml-tag", ""),
    ("%TAG !p! tag:yaml.org,2002:python/\n---\nversion: !p!name:os.system\n", "yaml-tag", ""),
    ("version: !!binary aGVsbG8=\n", "yaml-tag", "!!binary"),
    ("version: 1\nrules: !!set {a, b}\n", "yaml-tag", "!!set"),
    ("version: 1\nrules: !!omap [a: 1]\n", "yaml-tag", "!!omap"),
    ("version: !custom 1\n", "yaml-tag", "!custom"),
    ("version: 1\nrules: &a [*a]\n", "alias-limit", "recursive"),
    (BILLION_LAUGHS, "alias-limit", "alias bomb"),
    ("version: 1\nx: [" + ", ".join(["*a"] * 150) + "]\n", "yaml", ""),
    ("version: 1\nx: &a 1\ny: [" + ", ".join(["*a"] * 150) + "]\n", "alias-limit", "aliases"),
    ("x: " + "[" * 100_000 + "]" * 100_000, "too-deep", "nesting deeper"),
    ("x: " + "{a: " * 5000 + "1" + "}" * 5000, "too-deep", "nesting deeper"),
    ("".join(f"{' ' * 2 * i}k{i}:\n" for i in range(200)), "too-deep", "nesting deeper"),
    ("version: 1\n# " + "x" * MAX_BYTES, "too-large", "larger than the limit"),
    ("version: 1\n---\nversion: 1\n", "yaml", "second one"),
    ("version: 1\nx: \x00\n", "binary", "NUL"),
    # A tag on a rule's `name` key (found by the long fuzz run: it was an internal error).
    (
        "version: 1\nrules:\n  - !custom name: r\n    match: task.replicas == 0\n    replicate: 2\n",
        "yaml-tag",
        "not allowed on a key",
    ),
]


@pytest.mark.parametrize(
    "text, code, words", YAML_CASES, ids=[f"{c}-{i}" for i, (_, c, _) in enumerate(YAML_CASES)]
)
def test_yaml_that_constructs_or_explodes_is_refused(text: str, code: str, words: str) -> None:
    tracemalloc.start()
    try:
        with hang_bound():
            ruleset, diagnostics = check_text(text.encode(), "hostile.yaml")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert ruleset is None
    codes = {d.code for d in diagnostics}
    assert code in codes, diagnostics
    assert any(words in d.message for d in diagnostics if d.code == code), diagnostics
    # Refused before anything big was built (the text itself is up to 1 MiB).
    assert peak < 64 * 2**20, peak


def test_object_constructing_tags_construct_nothing(tmp_path: Path) -> None:
    """A tag that would create a directory when loaded unsafely: checked, loaded
    through the scheduler's entry point, nothing is created."""
    target = tmp_path / "created"
    text = f'version: 1\nrules: !!python/object/apply:os.mkdir ["{target}"]\n'
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    _, diagnostics = check_text(text)
    assert [d.code for d in diagnostics if d.code == "yaml-tag"]
    with pytest.raises(amm_rules.RulesError, match="is not allowed"):
        load_ruleset(str(path))
    with pytest.raises(amm_rules.RulesError):
        RulesPolicy(str(path))
    assert not target.exists()


def test_the_size_limit_holds_for_files_and_reads_no_further(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    with path.open("wb") as f:
        f.write(b"version: 1\n")
        f.seek(64 * MAX_BYTES)  # a sparse 64 MiB file: only MAX_BYTES + 1 are read
        f.write(b"\n")
    tracemalloc.start()
    try:
        with hang_bound():
            result = check_path(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [d.code for d in result.diagnostics] == ["too-large"]
    assert peak < 8 * MAX_BYTES


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
def test_a_named_pipe_as_rules_file_is_refused_without_waiting(tmp_path: Path) -> None:
    """Opening a pipe for reading waits for a writer: the scheduler would hang at
    start (or at a reload) if the loader opened it like a file."""
    path = tmp_path / "rules.yaml"
    os.mkfifo(path)
    with hang_bound():
        result = check_path(path)
    assert [d.code for d in result.diagnostics] == ["unreadable"]
    assert "not a regular file" in result.diagnostics[0].message


# ---------------------------------------------------------------------------------
# Expressions

LONG = 100_000
ADVERSARIAL_GLOBS = [
    ("*" + "a*" * 200 + "b", "a" * LONG),
    ("*" + "[a]" * 1000 + "b*", "a" * LONG),
    ("*" + "a?" * 1000 + "b*", "a" * LONG),
    ("*" + "?" * 2000 + "b", "a" * LONG),
    ("*" + "[!b]" * 1000 + "b*", "a" * LONG),
    ("[a-z]*" * 600 + "!", "ab" * (LONG // 2)),
    ("*" + "a" * 2000 + "b*", "a" * LONG),
]


@pytest.mark.parametrize(
    "pattern, text", ADVERSARIAL_GLOBS, ids=[p[:12] + f"-{len(p)}" for p, _ in ADVERSARIAL_GLOBS]
)
def test_adversarial_globs_on_long_keys_complete(pattern: str, text: str) -> None:
    """Backtracking matchers take exponential (or, in Python loops, minutes of
    quadratic) time on these; the scheduler runs matches on its event loop."""
    with hang_bound():
        assert compile_glob(pattern)(text) is False
        assert glob_match(pattern, text) is False
    # The same pattern, through a rules file and a compiled match.
    ruleset = load_ruleset(
        {
            "version": 1,
            "rules": [{"name": "r", "match": f"task.key matches {pattern!r}", "replicate": 2}],
        }
    )
    with hang_bound():
        assert ruleset.rules[0].match(TaskFacts(key=text)) is False


def test_runtime_patterns_are_bounded() -> None:
    """``task.key matches task.annotations.p``: the pattern comes from a client."""
    ruleset = load_ruleset(
        {
            "version": 1,
            "rules": [
                {"name": "r", "match": "task.key matches task.annotations.p", "replicate": 2}
            ],
        }
    )
    match = ruleset.rules[0].match
    assert match(TaskFacts(key="x-1", annotations={"p": "x-*"}))
    with hang_bound():
        for p in ["?" * 5000 + "*", "*" + "[!b]" * 1000 + "b*", "[" * 3000, 7, None, ["x"]]:
            assert not match(TaskFacts(key="a" * LONG, annotations={"p": p}))


LIMIT_CASES = [
    ("task.key == " + '"' + "x" * MAX_LENGTH + '"', "too-long"),
    ("(" * (MAX_DEPTH + 1) + "task.replicas > 1" + ")" * (MAX_DEPTH + 1), "too-deep"),
    ("not " * (MAX_DEPTH + 1) + "task.replicas > 1", "too-deep"),
    ("task.replicas in [" + ", ".join(["1"] * (MAX_LIST_ITEMS + 1)) + "]", "too-long"),
    ("(" * 10_000, "too-long"),
]


@pytest.mark.parametrize(
    "expression, code", LIMIT_CASES, ids=[f"{c}-{i}" for i, (_, c) in enumerate(LIMIT_CASES)]
)
def test_expression_limits(expression: str, code: str) -> None:
    text = f"version: 1\nrules:\n  - name: r\n    match: '{expression}'\n    replicate: 2\n"
    with hang_bound():
        ruleset, diagnostics = check_text(text)
    assert ruleset is None
    assert code in {d.code for d in diagnostics}, [(d.code, d.message) for d in diagnostics]
    assert all(d.line >= 1 for d in diagnostics if d.code == code)


# ---------------------------------------------------------------------------------
# Annotations on the client (on a cluster: tests/engine/policy/test_hostile_cluster.py)


@pytest.mark.parametrize(
    "fields",
    [
        {"replicate": math.nan},
        {"replicate": math.inf},
        {"replicate": 10**30},
        {"replicate": -1},
        {"replicate": 0},
        {"replicate": "3"},
        {"replicate": None},
        {"replicate": {"min": math.nan}},
        {"replicate": {"min": 1, "max": -1}},
        {"pool": 7},
        {"pool": "not a name"},
        {"pool": []},
        {"avoid": [None]},
        {"spread": "everywhere"},
        {"move": True},
        {"bogus": 1},
        {},
    ],
)
def test_annotate_refuses_garbage_on_the_client(fields: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        amm_rules.annotate(**fields)


def test_hang_bound_catches_a_hang() -> None:
    """The hang detector itself works (else every bound above is decoration)."""
    if not (hasattr(signal, "setitimer") and sys.platform != "win32"):
        pytest.skip("no interval timer")
    with pytest.raises(Hang), hang_bound(0.2):
        while True:
            pass
