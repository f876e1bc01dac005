"""Hostile input on a running cluster: whatever clients send and whatever the rules
file becomes, the engine answers with errors or events, never a traceback, and the
scheduler keeps running with every other key's target held.

- ``amm`` annotations of any value through plain ``dask.annotate(amm=...)``: one
  ``invalid-annotation`` event per distinct value, small whatever the value, and the
  keys follow the rules;
- runtime calls with any target or keys: refused on the client (``amm_rules.replicate``)
  and by the scheduler handlers, the target set before still held;
- a hot reload of a rules file that became missing, half-written, unreadable (also for
  root), a directory, a path inside a file, a symlink loop, a named pipe, too large,
  binary: the running rules stay and a ``reload-error`` event says exactly why.

The same inputs without a cluster are in ``tests/test_hostile_input.py``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dask
import pytest
from distributed.active_memory_manager import ActiveMemoryManagerExtension
from distributed.utils_test import gen_cluster

import amm_rules
from amm_rules.engine.handlers import refused
from amm_rules.engine.policy import RulesPolicy
from amm_rules.language.fields import ActionError
from amm_rules.language.yaml_source import MAX_BYTES
from benchmarks.support.waiting import cycle_until, cycles, wait_cycles, wait_for
from tests.support.cluster import Requests, amm_config, counts, events, inc, keep, policy_of
from tests.support.hang import hang_bound
from tests.support.rules_files import clear, make_readable, make_unreadable
from tests.support.rulesets import INC_TWO as RULES
from tests.support.rulesets import RELOADABLE

# ---------------------------------------------------------------------------------
# Annotations and runtime calls


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
    await wait_for(lambda: counts(s, keys) == [2] * len(keys), "every key at its rule's 2")
    invalid = events(s, "invalid-annotation")
    assert len(invalid) == len(GARBAGE_ANNOTATIONS), [e["annotation"][:80] for e in invalid]
    assert {e["example_key"] for e in invalid} == {f.key for f in bad}
    for event in invalid:
        # Events stay small whatever the value (the scheduler keeps them in memory).
        assert len(str(event)) < 2_000, len(str(event))
    assert await c.submit(inc, 41, key="after") == 42


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
    assert answer == {"set": 1, "missing": []}
    await wait_for(lambda: counts(s, [held]) == [3], "inc-held at its runtime target of 3")

    requests = Requests(s)
    for target in BAD_TARGETS:
        # Checked on the client, before anything is sent ...
        with pytest.raises(ActionError, match=r"^n(\.min|\.max)?: "):
            amm_rules.replicate(held, n=target)
        # ... and by the scheduler, for a client that calls the handler directly.
        with pytest.raises(ValueError, match=r"^target(\.min|\.max)?: "):
            refused(await c.scheduler.amm_rules_set_target(keys=[held.key], target=target))
    for keys in ["inc-held", None, 5, {"inc-held": 1}, b"inc-held"]:
        with pytest.raises(ValueError, match="keys: expected a list of keys"):
            refused(await c.scheduler.amm_rules_set_target(keys=keys, target=2))
        with pytest.raises(ValueError, match="keys: expected a list of keys"):
            refused(await c.scheduler.amm_rules_explain(keys=keys))
    # Keys that do not exist, or cannot be keys at all, are "missing", not errors.
    answer = await c.scheduler.amm_rules_set_target(
        keys=["nope", ["un", "hashable"], {"a": 1}, None, 3.5], target=2
    )
    assert answer["set"] == 0 and len(answer["missing"]) == 5
    explained = await c.scheduler.amm_rules_explain(keys=["nope", ["un", "hashable"]])
    assert [e["state"] for e in explained.values()] == ["unknown", "unknown"]
    with pytest.raises(TypeError, match="evil"):
        await c.scheduler.amm_rules_set_target(keys=[held.key], target=2, evil=1)

    # The scheduler carries on, and the target set before still holds.
    await wait_cycles(s, 10)
    assert (requests.acquire, requests.remove) == ({}, {})
    assert counts(s, [held]) == [3]
    assert policy_of(s).index.runtime[held.key].target.min == 3
    assert await c.submit(inc, 41, key="after") == 42


# ---------------------------------------------------------------------------------
# Hot reload


def _half_written(path: Path) -> None:
    # A non-atomic write caught in the middle: the expression's string is cut open.
    text = RELOADABLE.format(n=3)
    path.write_text(text[: text.index("x-*")])


def _symlink_loop(path: Path) -> None:
    other = path.with_name("other.yaml")
    clear(other)
    other.symlink_to(path)
    path.symlink_to(other)


def _inside_a_file(path: Path) -> None:
    # The rules file's directory replaced by a regular file: nobody, root included,
    # can read a path under it.
    path.parent.rmdir()
    path.parent.write_text("not a directory")


def _too_large(path: Path) -> None:
    path.write_bytes(b"version: 1\n#" + b"x" * MAX_BYTES)


#: (what the file became, how, the reload-error event's whole text with {path}).
HOSTILE_STATES: list[tuple[str, Callable[[Path], Any], str]] = [
    ("missing", lambda p: None, "{path}: error: no such file"),
    ("directory", lambda p: p.mkdir(), "{path}: error: is a directory, not a rules file"),
    (
        "inside a file",
        _inside_a_file,
        "{path}: error: cannot read the file: Not a directory",
    ),
    (
        "symlink loop",
        _symlink_loop,
        "{path}: error: cannot read the file: Too many levels of symbolic links",
    ),
    (
        "half-written",
        _half_written,
        "{path}:3:5: error: rule has no action; set at least one of replicate, pool, avoid, "
        "spread, move, spill (in rule 'keep')\n"
        "{path}:4:29: error: match: unexpected character '\"'; this string has no closing "
        "quote on its line (in rule 'keep')",
    ),
    (
        "too large",
        _too_large,
        "{path}: error: file is larger than the limit of 1 MiB for rules files (1048577 bytes)",
    ),
    (
        "binary",
        lambda p: p.write_bytes(b"\x00\x01version: 1"),
        "{path}: error: binary file (contains NUL bytes); rules files are UTF-8 YAML text",
    ),
    (
        "python tag",
        lambda p: p.write_text("version: !!python/name:os.system\n"),
        "{path}:1:10: error: YAML tag '!!python/name:os.system' is not allowed: rules files "
        "hold plain data (strings, numbers, booleans, lists, mappings)",
    ),
    (
        "empty",
        lambda p: p.write_text(""),
        "{path}:1:1: error: the rules file is empty; it needs at least 'version: 1'",
    ),
    (
        "permission denied",
        lambda p: make_unreadable(p, RELOADABLE.format(n=3)),
        "{path}: error: cannot read the file: permission denied",
    ),
]
if hasattr(os, "mkfifo"):
    HOSTILE_STATES.append(
        (
            "named pipe",
            os.mkfifo,
            "{path}: error: is not a regular file (a pipe, socket or device); rules files "
            "are regular files",
        )
    )


#: Seconds for a reload-error to be reported: one cycle, where a cycle takes milliseconds.
STATE_TIMEOUT = 10.0


def _reset(path: Path) -> None:
    """Back to: no rules file, its directory in place."""
    if path.parent.is_file():
        path.parent.unlink()
        path.parent.mkdir()
    make_readable(path)
    clear(path)


@gen_cluster(
    client=True, nthreads=[("", 1)] * 3, config=amm_config(None, start=False), timeout=200
)
async def test_hot_reload_of_hostile_files_keeps_the_running_rules(c, s, *workers, tmp_path):
    path = tmp_path / "conf" / "rules.yaml"
    path.parent.mkdir()
    path.write_text(RELOADABLE.format(n=2))
    policy = RulesPolicy(str(path))
    amm = ActiveMemoryManagerExtension(s, {policy}, register=False, start=False)
    running = policy.ruleset
    futures = await c.scatter({"x-1": 1})
    await cycle_until(amm, lambda: counts(s, futures) == [2], "x-1 at 2 copies")
    requests = Requests(s)
    for seen, (name, make, expected) in enumerate(HOSTILE_STATES):
        _reset(path)
        make(path)
        with hang_bound():
            await cycle_until(
                amm,
                lambda seen=seen: len(events(s, "reload-error")) > seen,
                f"a reload-error ({name})",
                timeout=STATE_TIMEOUT,
            )
        (error,) = events(s, "reload-error")[seen:]
        assert error["error"] == expected.format(path=path), name
        assert policy.ruleset is running, name
    _reset(path)
    await cycles(amm, 3)
    # Through it all, the running rules held x-1 at 2 copies and asked for nothing.
    assert (requests.acquire, requests.remove) == ({}, {})
    assert counts(s, futures) == [2]
    # Fixed: reloaded at the next cycle.
    path.write_text(RELOADABLE.format(n=3))
    await cycle_until(amm, lambda: counts(s, futures) == [3], "x-1 at 3 after the reload")
    assert policy.ruleset is not running
    keep(futures)
