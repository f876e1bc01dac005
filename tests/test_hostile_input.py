"""Hostile input: whatever users, clients and the file system hand amm-rules, it answers
with diagnostics, errors or events, never a traceback, never a hang, and the scheduler
keeps running with everything else intact.

- Rules files: a seeded fuzz run of 10,000 generated, mutated and spliced files
  (:mod:`tests.support.fuzzer`; ``benchmarks/fuzz_rules.py`` runs longer ones), each
  checked under a per-file alarm as a hang detector.
- YAML: tags that construct objects are errors and construct nothing; alias bombs,
  recursive aliases and deep nesting are refused with a clear error before they cost
  memory; a size limit.
- Expressions: adversarial glob patterns on long strings complete; limits on length,
  depth and list size.
- Annotations and runtime calls with any value: an error on the client
  (``amm_rules.annotate``, ``amm_rules.replicate``, the raw handlers) or an event on the
  scheduler (raw ``dask.annotate(amm=...)``), and other keys' targets still held.
- Hot reload: missing, half-written, unreadable, a directory, a symlink loop, a named
  pipe, too large, binary: the running rules stay and a ``reload-error`` event says why.

Hang bounds are generous (seconds for work that takes milliseconds): they catch a hang
or a blow-up, they do not measure speed.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dask
import pytest
from distributed.active_memory_manager import ActiveMemoryManagerExtension
from distributed.utils_test import async_poll_for, gen_cluster

import amm_rules
from amm_rules.engine.policy import RulesPolicy
from amm_rules.language.expr import MAX_DEPTH, MAX_LENGTH, MAX_LIST_ITEMS
from amm_rules.language.expr.glob import compile_glob, glob_match
from amm_rules.language.fields import ActionError
from amm_rules.language.loader import check_path, check_text, load_ruleset
from amm_rules.language.ruleset import TaskFacts
from amm_rules.language.yaml_source import MAX_BYTES
from tests.support.cluster import (
    RELOADABLE,
    amm_config,
    events,
    holders,
    inc,
    no_errors,
    policy_of,
    rules,
)
from tests.support.fuzzer import cases, check_and_run, seed_files

#: Generous per-file bound: checking a rules file takes milliseconds.
HANG_SECONDS = 5.0
FUZZ_CASES = int(os.environ.get("AMM_RULES_HOSTILE_CASES", "10000"))
FUZZ_SEED = int(os.environ.get("AMM_RULES_HOSTILE_SEED", "20260806"))


class Hang(BaseException):
    """Raised by the alarm. A BaseException, so that the loader's own safety net
    (which turns any Exception into an "internal error" diagnostic) cannot swallow it."""


@contextmanager
def hang_bound(seconds: float = HANG_SECONDS) -> Iterator[None]:
    """Fail if the block runs longer than ``seconds``: by an alarm where the platform
    has one (interrupting a real hang), and by measuring in any case."""
    use_alarm = hasattr(signal, "setitimer") and _main_thread()
    previous: Any = None
    if use_alarm:

        def on_alarm(signum: int, frame: Any) -> None:
            raise Hang(f"still running after {seconds} s")

        previous = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)
    start = time.monotonic()
    try:
        yield
    finally:
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    elapsed = time.monotonic() - start
    if elapsed > seconds:
        raise Hang(f"took {elapsed:.1f} s (bound {seconds} s)")


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


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
            with hang_bound():
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
# Annotations and runtime calls

RULES = rules(
    {"name": "two", "match": 'task.prefix == "inc"', "replicate": 2},
    pools={"gpu": "worker.resources.GPU >= 1"},
)


def nested(depth: int) -> Any:
    value: Any = {"replicate": 2}
    for i in range(depth):
        value = [value] if i % 2 else {"x": value}
    return value


#: ``amm`` annotations a client can send that mean nothing (every one distinct).
GARBAGE_ANNOTATIONS: list[Any] = [
    {"replicate": math.nan},
    {"replicate": math.inf},
    {"replicate": -math.inf},
    {"replicate": 10**18},  # (larger ints cannot travel: msgpack refuses them)
    {"replicate": -3},
    {"replicate": 0},
    {"replicate": 2.5},
    {"replicate": "2"},
    {"replicate": True},
    {"replicate": None},
    {"replicate": [2]},
    {"replicate": {}},
    {"replicate": {"min": math.nan}},
    {"replicate": {"min": 2, "max": math.inf}},
    {"replicate": {"min": {"x": [1, {"y": None}]}}},
    {"replicate": {"min": 3, "max": 2}},
    {"replicate": 10_001},
    {"pool": 5},
    {"pool": ""},
    {"pool": "nope"},
    {"pool": ["gpu", None]},
    {"pool": []},
    {"avoid": {"gpu": 1}},
    {"spread": ["host"]},
    {"move": "sometimes"},
    {"unknown": 1},
    {},
    "replicate=3",
    42,
    [1, 2, 3],
    {"replicate": 2, "pool": "gpu", "junk": nested(150)},
    nested(150),
    {"replicate": "x" * 100_000},
    {("tuple", 1): 2},
]


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(RULES), timeout=60)
async def test_garbage_annotations_are_events_and_the_rules_still_hold(c, s, *workers):
    # (Keys "inc-<number>": their prefix is "inc", which the rule matches.)
    good = c.map(inc, range(3), key=[f"inc-{i}" for i in range(3)])
    bad = []
    for i, value in enumerate(GARBAGE_ANNOTATIONS):
        with dask.annotate(amm=value):
            bad.append(c.submit(inc, i, key=f"inc-{100 + i}"))
    await c.gather([*good, *bad])
    keys = [f.key for f in [*good, *bad]]
    # Every key follows the rules: an invalid annotation is ignored for its key.
    await async_poll_for(lambda: all(len(holders(s, k)) == 2 for k in keys), timeout=15)
    invalid = events(s, "invalid-annotation")
    assert len(invalid) == len(GARBAGE_ANNOTATIONS), [e["annotation"][:80] for e in invalid]
    for event in invalid:
        # Events stay small whatever the value (the scheduler keeps them in memory).
        assert len(str(event)) < 2_000, len(str(event))
    no_errors(s)
    assert await c.submit(inc, 41, key="after") == 42


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


BAD_TARGETS: list[Any] = [
    math.nan,
    math.inf,
    -math.inf,
    -1,
    0,
    2.5,
    "2",
    True,
    [2],
    {},
    {"min": math.nan},
    {"min": 2, "max": math.inf},
    {"min": {"x": [1]}},
    {"min": 3, "max": 2},
    {"most": 1},
    10**18,
]


@gen_cluster(client=True, nthreads=[("", 1)] * 4, config=amm_config(RULES), timeout=60)
async def test_runtime_calls_with_garbage_are_errors_and_targets_stay(c, s, *workers):
    held = c.submit(inc, 1, key="inc-held")
    await held
    answer = await amm_rules.replicate(held, n=3)
    assert answer["set"] == 1
    await async_poll_for(lambda: len(holders(s, "inc-held")) == 3, timeout=5)

    for target in BAD_TARGETS:
        # Checked on the client, before anything is sent ...
        with pytest.raises(ActionError):
            amm_rules.replicate(held, n=target)
        # ... and by the scheduler, for a client that calls the handler directly.
        with pytest.raises(ValueError):
            await c.scheduler.amm_rules_set_target(keys=[held.key], target=target)
    for keys in ["inc-held", None, 5, {"inc-held": 1}, b"inc-held"]:
        with pytest.raises(ValueError, match="keys"):
            await c.scheduler.amm_rules_set_target(keys=keys, target=2)
        with pytest.raises(ValueError, match="keys"):
            await c.scheduler.amm_rules_explain(keys=keys)
    # Keys that do not exist, or cannot be keys at all, are "missing", not errors.
    answer = await c.scheduler.amm_rules_set_target(
        keys=["nope", ["un", "hashable"], {"a": 1}, None, 3.5], target=2
    )
    assert answer["set"] == 0 and len(answer["missing"]) == 5
    explained = await c.scheduler.amm_rules_explain(keys=["nope", ["un", "hashable"]])
    assert all(e["state"] == "unknown" for e in explained.values())
    with pytest.raises(TypeError):
        await c.scheduler.amm_rules_set_target(keys=[held.key], target=2, evil=1)

    # The scheduler carries on, and the target set before still holds.
    await asyncio.sleep(0.3)
    assert len(holders(s, "inc-held")) == 3
    assert policy_of(s).index.runtime[held.key].target.min == 3
    assert await c.submit(inc, 41, key="after") == 42
    no_errors(s)


# ---------------------------------------------------------------------------------
# Hot reload


async def cycles(amm: ActiveMemoryManagerExtension, n: int = 3) -> None:
    for _ in range(n):
        amm.run_once()
        await asyncio.sleep(0.05)


def replace_with(path: Path, make: Callable[[Path], None]) -> None:
    """Remove whatever is at ``path`` and make something else there."""
    if path.is_symlink() or path.is_file() or path.is_fifo():
        path.unlink()
    elif path.is_dir():
        path.rmdir()
    make(path)


def _half_written(path: Path) -> None:
    # A non-atomic write caught in the middle: the expression's string is cut open.
    text = RELOADABLE.format(n=3)
    path.write_text(text[: text.index("x-*")])


def _symlink_loop(path: Path) -> None:
    other = path.with_name("other.yaml")
    if other.is_symlink():
        other.unlink()
    other.symlink_to(path)
    path.symlink_to(other)


def _too_large(path: Path) -> None:
    path.write_bytes(b"version: 1\n#" + b"x" * MAX_BYTES)


HOSTILE_STATES: list[tuple[str, Callable[[Path], None], str]] = [
    ("missing", lambda p: None, "no such file"),
    ("directory", lambda p: p.mkdir(), "is a directory"),
    ("symlink loop", _symlink_loop, "symbolic links"),
    ("half-written", _half_written, "rules.yaml:4:"),
    ("too large", _too_large, "larger than the limit"),
    ("binary", lambda p: p.write_bytes(b"\x00\x01version: 1"), "binary"),
    ("python tag", lambda p: p.write_text("version: !!python/name:os.system\n"), "not allowed"),
    ("empty", lambda p: p.write_text(""), "empty"),
]
if hasattr(os, "mkfifo"):
    HOSTILE_STATES.append(("named pipe", lambda p: os.mkfifo(p), "not a regular file"))
if os.name == "posix" and os.geteuid() != 0:
    HOSTILE_STATES.append(
        (
            "permission denied",
            lambda p: (p.write_text(RELOADABLE.format(n=3)), p.chmod(0)),
            "ermission",
        )
    )


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(None, start=False))
async def test_hot_reload_of_hostile_files_keeps_the_running_rules(c, s, *workers, tmp_path):
    path = tmp_path / "rules.yaml"
    path.write_text(RELOADABLE.format(n=2))
    policy = RulesPolicy(str(path))
    amm = ActiveMemoryManagerExtension(s, {policy}, register=False, start=False)
    running = policy.ruleset
    futures = await c.scatter({"x-1": 1})
    await cycles(amm)
    assert len(holders(s, "x-1")) == 2
    for seen, (name, make, words) in enumerate(HOSTILE_STATES):
        replace_with(path, make)
        with hang_bound():
            await cycles(amm, 2)
        errors = events(s, "reload-error")
        assert len(errors) == seen + 1, (name, errors[seen:])
        assert words in errors[-1]["error"], (name, errors[-1])
        assert policy.ruleset is running, name
        assert len(holders(s, "x-1")) == 2, name
    if path.exists() and not path.is_dir():
        path.chmod(0o644)
    # Fixed: reloaded at the next cycle.
    replace_with(path, lambda p: p.write_text(RELOADABLE.format(n=3)))
    await cycles(amm)
    assert policy.ruleset is not running
    assert len(holders(s, "x-1")) == 3
    assert list(futures) == ["x-1"]
    no_errors(s)


def test_hang_bound_catches_a_hang() -> None:
    """The hang detector itself works (else every bound above is decoration)."""
    if not (hasattr(signal, "setitimer") and sys.platform != "win32"):
        pytest.skip("no interval timer")
    with pytest.raises(Hang), hang_bound(0.2):
        while True:
            pass
