"""Rule test files: their JSON Schema, and reading one into checked fixtures with positions.

A test file (``amm-rules test``, docs/testing-rules.md) names a rules file, describes a
small cluster and lists cases: keys in memory, workers lost first, and what is
expected. :data:`TEST_SCHEMA` says all of it for editors (``amm-rules test --schema``,
the shipped ``amm-rules-test.schema.json``), with a description on every field.

Reading goes through the rules files' own machinery, so a test file gets the same
safety limits and the same ``file:line:column`` diagnostics:
:mod:`amm_rules.language.yaml_source` (positioned YAML), the schema check of
:mod:`amm_rules.language.schema_check` (with this schema and its own words), and a
:class:`~amm_rules.language.locator.Locator` that names entries ``case 'NAME'`` or
``worker 'NAME'``. Then the meaning: the rules file loads, names refer to workers,
keys, pools and rules that exist, sizes and targets parse. The result is a
:class:`TestFile` of plain fixtures; :mod:`amm_rules.offline.ruletests` runs it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from amm_rules.language.diagnostics import Diagnostic
from amm_rules.language.fields import (
    ActionError,
    UnitError,
    parse_duration,
    parse_size,
    parse_target,
)
from amm_rules.language.loader import CheckResult, check_path, read_source
from amm_rules.language.locator import Locator
from amm_rules.language.ruleset import Target
from amm_rules.language.schema import ACTION_PROPERTIES
from amm_rules.language.schema_check import FileWords, Path

#: Defaults of a worker's fixture.
DEFAULT_MEMORY_LIMIT = "16 GiB"
#: Default size of a key.
DEFAULT_NBYTES = "1 MiB"
#: Most keys one ``count`` may generate, most keys the cases of one file may declare in
#: all, and most workers of a file (a 14 kB file of 200 keys of count 100,000 grew past
#: 9.8 GB).
MAX_COUNT = 100_000
MAX_KEYS = 100_000
MAX_WORKERS = 1_000

TEST_FILE = FileWords(
    "test file", {"cases": "case", "workers": "worker"}, {}, {"rules": "the rules file to test"}
)

_SIZE = {
    "title": "size",
    "oneOf": [
        {
            "title": "a size like '512 MiB'",
            "type": "string",
            "pattern": r"^\s*[0-9]+(\.[0-9]+)?\s*[A-Za-z]*\s*$",
            "errorMessage": "expected a size like '512 MiB' (units: B, kB, MB, GB, TB, KiB, "
            "MiB, GiB, TiB)",
        },
        {"title": "a number of bytes", "type": "integer", "minimum": 0},
    ],
}
_KEY = {
    "title": "key",
    "description": "A key: text, or a list for a tuple key (['x', 0] is ('x', 0)).",
    "oneOf": [
        {"title": "a key", "type": "string", "minLength": 1},
        {
            "title": "a tuple key",
            "type": "array",
            "minItems": 1,
            "items": {"type": ["string", "integer", "number"]},
        },
    ],
}
_NAMES = {"type": "array", "items": {"type": "string", "minLength": 1}, "uniqueItems": True}
_WORKERS = {**_NAMES, "description": "Worker names."}
_POOLS = {
    "oneOf": [
        {"title": "a pool name", "type": "string", "minLength": 1},
        {"title": "a list of pool names", **_NAMES, "minItems": 1},
    ]
}

_WORKER = {
    "title": "worker",
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "name": {
            "description": "The worker's name (what worker.name reads; cases name workers by it).",
            "type": "string",
            "minLength": 1,
        },
        "host": {"description": "Its host (default: its name).", "type": "string", "minLength": 1},
        "address": {
            "description": "Its address (default: tcp://HOST:PORT, a port per worker).",
            "type": "string",
            "minLength": 1,
        },
        "resources": {
            "description": "Its resources, e.g. {GPU: 1}.",
            "type": "object",
            "additionalProperties": {"type": "number"},
        },
        "memory-limit": {"description": f"Default {DEFAULT_MEMORY_LIMIT}.", **_SIZE},
        "memory": {
            "description": "Memory it uses besides the keys of the case (default 0).",
            **_SIZE,
        },
        "nthreads": {"type": "integer", "minimum": 1, "default": 1},
        "status": {
            "description": "'paused' holds data and receives none; 'closing' is retiring.",
            "enum": ["running", "paused", "closing"],
            "default": "running",
        },
    },
}
_KEY_FIXTURE = {
    "title": "key in memory",
    "type": "object",
    "required": ["key", "holders"],
    "additionalProperties": False,
    "properties": {
        "key": _KEY,
        "holders": {**_WORKERS, "minItems": 1, "description": "The workers holding a copy now."},
        "nbytes": {"description": f"Its size (default {DEFAULT_NBYTES}).", **_SIZE},
        "prefix": {
            "description": "task.prefix (default: as dask names it from the key, "
            "dask's key_split: 'features-abc' stays whole, 'x-<hash>' is 'x').",
            "type": "string",
        },
        "group": {
            "description": "task.group (default: as the scheduler names it, distributed's "
            "key_split_group of the key: the prefix of a text key, the first element of a "
            "tuple key).",
            "type": "string",
        },
        "type": {"description": "task.type, e.g. numpy.ndarray.", "type": "string"},
        "resources": {
            "description": "task.resources: the resource restriction of the task that "
            "made it (resources= when it was submitted), e.g. {GPU: 1}.",
            "type": "object",
            "additionalProperties": {"type": "number", "minimum": 0},
        },
        "annotations": {
            "description": "task.annotations; 'amm' is read as the engine reads it.",
            "type": "object",
        },
        "target": {
            **ACTION_PROPERTIES["replicate"],
            "title": "runtime target",
            "description": "A runtime target, as amm_rules.replicate sets it.",
        },
        "waiters": {
            "description": "Dependents still to run (reduce-replicas keeps a copy each).",
            "type": "integer",
            "minimum": 0,
        },
        "recompute": {
            "description": "Seconds its task computed (a duration like '20 min', or a "
            "number of seconds): what task.recompute_seconds and protect read, as the "
            "scheduler would have measured it. Default: not measured (null).",
            "type": ["string", "number"],
        },
        "count": {
            "description": "This many keys, '{i}' in the key replaced by 0, 1, 2...",
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_COUNT,
        },
    },
}
_EXPECTATION = {
    "title": "expectation about one key",
    "type": "object",
    "required": ["key"],
    "additionalProperties": False,
    "properties": {
        "key": _KEY,
        "governed": {"description": "A rule, annotation or target governs it.", "type": "boolean"},
        "target": {
            "description": "Its replication target (null: none, one copy).",
            "oneOf": [ACTION_PROPERTIES["replicate"], {"title": "no target", "type": "null"}],
        },
        "rule": {
            "description": "What set its target: a rule name, 'annotation' or 'runtime' "
            "(null: nothing did).",
            "type": ["string", "null"],
        },
        "rules": {
            "description": "What decided each field: {pool: NAME, spread: NAME, ...}.",
            "type": "object",
            "propertyNames": {"enum": list(ACTION_PROPERTIES)},
            "additionalProperties": {"type": "string"},
        },
        "pool": {"description": "Its resolved pool(s).", **_POOLS},
        "avoid": {"description": "Its resolved avoided pool(s).", **_POOLS},
        "spread": {"enum": ["host", "none"]},
        "move": {"enum": ["allowed", "never"]},
        "dry-run": {"description": "Its actions are held back by dry-run.", "type": "boolean"},
        "copies": {"description": "How many copies it ends with.", "type": "integer"},
        "holders": {**_WORKERS, "description": "Exactly the workers it ends on."},
        "holders-include": {**_WORKERS, "description": "Workers it ends on (among others)."},
        "holders-exclude": {**_WORKERS, "description": "Workers it does not end on."},
        "in-pool": {"description": "Every copy ends in this pool.", "type": "string"},
        "hosts": {"description": "How many hosts its copies end on.", "type": "integer"},
        "copies-on-distinct-hosts": {
            "description": "true: no two copies end on one host; false: some do.",
            "type": "boolean",
        },
        "unmet": {
            "description": "Its target stays unmet (true/false), or: the reason contains "
            "this text.",
            "type": ["boolean", "string"],
        },
        "lost": {"description": "A kill left it with no copy.", "type": "boolean"},
    },
}
_ACTION = {
    "title": "action",
    "type": "object",
    "required": ["op", "key", "worker"],
    "additionalProperties": False,
    "properties": {
        "op": {"enum": ["replicate", "drop"]},
        "key": _KEY,
        "worker": {"description": "A worker name.", "type": "string"},
        "rule": {"description": "The rule (counter label) it is made for.", "type": "string"},
    },
}
_CASE = {
    "title": "case",
    "type": "object",
    "required": ["name", "keys"],
    "additionalProperties": False,
    "properties": {
        "name": {"description": "Shown with PASS or FAIL.", "type": "string", "minLength": 1},
        "keys": {"type": "array", "items": _KEY_FIXTURE, "description": "Keys in memory."},
        "kill": {
            "description": "Workers lost before the first cycle.",
            "type": "object",
            "additionalProperties": False,
            "minProperties": 1,
            "properties": {"workers": _WORKERS, "hosts": _NAMES, "pools": _NAMES},
        },
        "cycles": {
            "description": "Stop after this many cycles (default: until nothing changes; "
            "1: the next cycle's actions).",
            "type": "integer",
            "minimum": 1,
        },
        "expect": {"type": "array", "items": _EXPECTATION},
        "expect-actions": {
            "description": "Exactly these copies and drops, in any order (dry-run ones excluded).",
            "type": "array",
            "items": _ACTION,
        },
        "expect-lost": {
            "description": "Exactly these keys lose their last copy.",
            "type": "array",
            "items": _KEY,
        },
        "expect-pools": {
            "description": "Exactly these workers in these pools: {gpu: [a, b]}.",
            "type": "object",
            "additionalProperties": _WORKERS,
        },
    },
}
TEST_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "amm-rules test file",
    "description": "Cases run by 'amm-rules test': a rules file, a small cluster, keys, and "
    "what the rules should do with them. See docs/testing-rules.md.",
    "type": "object",
    "required": ["rules", "workers", "cases"],
    "additionalProperties": False,
    "properties": {
        "rules": {
            "description": "The rules file to test, relative to this file.",
            "type": "string",
            "minLength": 1,
        },
        "workers": {"type": "array", "minItems": 1, "maxItems": MAX_WORKERS, "items": _WORKER},
        "cases": {"type": "array", "minItems": 1, "items": _CASE},
    },
}


# -- the fixtures -----------------------------------------------------------------------------


@dataclass
class WorkerFixture:
    name: str
    host: str
    address: str
    resources: dict[str, float]
    memory_limit: int
    memory: int
    nthreads: int
    status: str


@dataclass
class KeyFixture:
    key: Hashable
    holders: list[str]
    nbytes: int
    prefix: str | None
    group: str | None
    type: str | None
    annotations: dict[str, Any]
    target: Target | None
    waiters: int
    path: Path
    #: Seconds its task computed, if the case says (``recompute``).
    recompute: float | None = None
    #: The resource restriction of the task that made it (``resources``).
    resources: dict[str, float] = field(default_factory=dict)


@dataclass
class Case:
    name: str
    path: Path
    keys: list[KeyFixture]
    kill_workers: list[str] = field(default_factory=list)
    kill_hosts: list[str] = field(default_factory=list)
    kill_pools: list[str] = field(default_factory=list)
    cycles: int | None = None
    #: (path, the expectation's mapping with its key resolved)
    expect: list[tuple[Path, dict[str, Any]]] = field(default_factory=list)
    expect_actions: list[tuple[str, Hashable, str, str | None]] | None = None
    expect_lost: list[Hashable] | None = None
    expect_pools: dict[str, list[str]] | None = None


@dataclass
class TestFile:
    """A checked test file (``cases`` empty when it has errors)."""

    path: str
    text: str | None
    locator: Locator
    rules_path: str | None = None
    rules: CheckResult | None = None
    workers: list[WorkerFixture] = field(default_factory=list)
    cases: list[Case] = field(default_factory=list)

    @property
    def diagnostics(self) -> list[Diagnostic]:
        return self.locator.diagnostics

    @property
    def ok(self) -> bool:
        return not self.locator.has_errors


class CaseLocator(Locator):
    """A :class:`Locator` for test files: entries are ``cases.NAME`` and ``workers.NAME``."""

    def entry(self, path: Path) -> str | None:
        if len(path) >= 2 and path[0] in ("cases", "workers") and isinstance(path[1], int):
            return f"{path[0]}.{self.item_name(path[0], path[1])}"
        return None


@lru_cache(maxsize=1)
def _validator() -> Any:
    from jsonschema import Draft202012Validator

    return Draft202012Validator(TEST_SCHEMA)


def read_test_file(path: str, roots: Sequence[str] | None = None) -> TestFile:
    """Read and check a test file; problems are positioned diagnostics on the result.
    ``roots``: the directories its rules file must be in, the first the tree the file
    belongs to (None: anywhere)."""
    from amm_rules.language.yaml_source import MAX_BYTES

    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as exc:
        where = CaseLocator(path, None)
        message = f"cannot read the file: {exc.strerror or exc}"
        where.diagnostics.append(Diagnostic(path, 0, 0, "error", message, None, "unreadable"))
        return TestFile(path, None, where)
    return parse_test_file(raw, path, roots)


def parse_test_file(raw: bytes, path: str, roots: Sequence[str] | None = None) -> TestFile:
    """Check the bytes of a test file as if read from ``path`` (its ``rules:`` is
    relative to that path); see :func:`read_test_file`."""
    from amm_rules.language.schema_check import schema_problems

    text, source, problems = read_source(raw, path)
    where = CaseLocator(path, source.data if source else None, source)
    where.diagnostics.extend(problems)
    out = TestFile(path, text, where)
    if source is None or where.has_errors:
        return out
    data = source.data
    if not isinstance(data, dict):
        where.add((), "a test file is a mapping with 'rules', 'workers' and 'cases'", "wrong-type")
        return out
    where.add_schema(schema_problems(data, _validator(), TEST_FILE))
    # Meaning is checked too, skipping what the schema reported: every problem is told.
    _Builder(out, data, roots).build()
    return out


class _Builder:
    """The meaning of a schema-valid test file (names, sizes, targets, the rules file)."""

    def __init__(self, out: TestFile, data: dict[str, Any], roots: Sequence[str] | None):
        self.out = out
        self.data = data
        self.where = out.locator
        self.roots = roots
        #: Keys the cases declared so far (bounded: see MAX_KEYS).
        self.keys = 0

    def error(self, path: Path, message: str, code: str = "bad-value") -> None:
        self.where.add(path, message, code)

    def skip(self, path: Path) -> bool:
        """An error was reported at or inside ``path``: leave it alone."""
        return self.where.reported_under(path)

    def field(self, item: Any, path: Path, name: str, kind: type | tuple[type, ...]) -> Any:
        """``item[name]`` if it is there and of ``kind`` and, for a scalar, no error was
        reported at it; else None. A list or a mapping is returned even with errors
        inside it: its entries are checked one by one. So a problem in one field never
        hides the problems of its neighbours (every problem in one pass)."""
        if not isinstance(item, dict) or name not in item:
            return None
        value = item[name]
        if not isinstance(value, kind):
            return None
        if not isinstance(value, (list, dict)) and self.skip((*path, name)):
            return None
        return value

    def build(self) -> None:
        if not self.skip(("rules",)) and isinstance(self.data.get("rules"), str):
            self._rules()
        if not all(isinstance(self.data.get(name), list) for name in ("workers", "cases")):
            return
        self._workers()
        # What the cases may name.
        self.worker_names = {w.name for w in self.out.workers}
        self.hosts = {w.host for w in self.out.workers}
        self.ruleset = self.out.rules.ruleset if self.out.rules is not None else None
        seen: set[str] = set()
        cases = []
        for i, item in enumerate(self.data["cases"]):
            path = ("cases", i)
            if not isinstance(item, dict):
                continue
            name = self.field(item, path, "name", str)
            if name is not None:
                if name in seen:
                    self.error((*path, "name"), f"duplicate case name '{name}'", "duplicate-case")
                seen.add(name)
            cases.append(_CaseBuilder(self, item, path).build())
        if not self.where.has_errors:
            self.out.cases = cases

    def _rules(self) -> None:
        base = os.path.dirname(os.path.abspath(self.out.path))
        rel = self.data["rules"]
        full = os.path.normpath(os.path.join(base, rel))
        shown = os.path.normpath(os.path.join(os.path.dirname(self.out.path), rel))
        self.out.rules_path = shown
        if self.roots is not None and not _inside(full, self.roots):
            tree, *given = self.roots
            others = f" and the directories given ({', '.join(given)})" if given else ""
            self.error(
                ("rules",),
                f"the rules file {shown} is outside the tree this test file belongs to "
                f"({tree}: the nearest directory holding .git or pyproject.toml, else the "
                f"file's own){others}; pass --allow-outside to use it",
                "outside",
            )
            return
        result = check_path(full, display=shown)
        self.out.rules = result
        if result.ruleset is None:
            first = next((d for d in result.diagnostics if d.is_error), None)
            why = f": {first.message}" if first is not None and first.line == 0 else ""
            self.error(("rules",), f"the rules file {shown} cannot be used{why}", "bad-rules")

    def _workers(self) -> None:
        seen_names: set[str] = set()
        seen_addresses: set[str] = set()
        for i, item in enumerate(self.data["workers"]):
            path = ("workers", i)
            if not isinstance(item, dict):
                continue
            name = self.field(item, path, "name", str)
            if name is None:  # its other fields are still checked
                self.size(item.get("memory-limit", 0), (*path, "memory-limit"))
                self.size(item.get("memory", 0), (*path, "memory"))
                continue
            host: str = self.field(item, path, "host", str) or name
            address = self.field(item, path, "address", str) or f"tcp://{host}:{9000 + i}"
            if name in seen_names:
                self.error((*path, "name"), f"duplicate worker name '{name}'", "duplicate-worker")
            if address in seen_addresses:
                self.error(path, f"duplicate worker address '{address}'", "duplicate-worker")
            seen_names.add(name)
            seen_addresses.add(address)
            self.out.workers.append(
                WorkerFixture(
                    name=name,
                    host=host,
                    address=address,
                    resources=self.field(item, path, "resources", dict) or {},
                    memory_limit=self.size(
                        item.get("memory-limit", DEFAULT_MEMORY_LIMIT), (*path, "memory-limit")
                    ),
                    memory=self.size(item.get("memory", 0), (*path, "memory")),
                    nthreads=item.get("nthreads", 1),
                    status=item.get("status", "running"),
                )
            )

    def size(self, value: Any, path: Path) -> int:
        return self.unit(parse_size, value, path) or 0

    def unit(self, parse: Callable[[Any], Any], value: Any, path: Path) -> Any:
        """``parse(value)``; None if an error was reported at ``path``, or now is."""
        if self.skip(path):
            return None
        try:
            return parse(value)
        except UnitError as exc:
            self.error(path, f"{path[-1]}: {exc}", exc.code)
            return None

    def target(self, value: Any, path: Path) -> Target | None:
        try:
            return parse_target(value, str(path[-1]))
        except ActionError as exc:
            self.error(path, str(exc))
            return None


def _inside(path: str, roots: Sequence[str]) -> bool:
    """Whether ``path`` (resolved: ``..`` and symlinks) is inside one of ``roots``."""
    real = os.path.realpath(path)
    return any(os.path.commonpath([real, root]) == root for root in roots)


def plain_key(value: Any) -> Hashable:
    """A key as written in a test file: a list is a tuple key."""
    if isinstance(value, list):
        return tuple(plain_key(v) for v in value)
    return value


class _CaseBuilder:
    """One case: its keys (``count`` expanded) and expectations, names checked."""

    def __init__(self, b: _Builder, item: dict[str, Any], path: Path):
        self.b = b
        self.item = item
        self.path = path
        self.workers = b.worker_names
        self.hosts = b.hosts
        self.ruleset = b.ruleset

    def names(self, values: Any, path: Path, known: set[str], what: str) -> None:
        from amm_rules.language.spelling import did_you_mean

        if not isinstance(values, list):
            return  # the schema said what it should be
        for j, name in enumerate(values):
            if not isinstance(name, str) or self.b.skip((*path, j)):
                continue
            if name not in known:
                self.b.error(
                    (*path, j),
                    f"unknown {what} '{name}'{did_you_mean(name, sorted(known))}",
                    f"unknown-{what}",
                )

    def pools(self, value: Any, path: Path) -> None:
        if self.ruleset is None or not isinstance(value, (str, list)):
            return
        names = [value] if isinstance(value, str) else list(value)
        paths = [path] if isinstance(value, str) else [(*path, j) for j in range(len(names))]
        for name, at in zip(names, paths, strict=True):
            if not isinstance(name, str) or (at != path and self.b.skip(at)):
                continue
            if name not in self.ruleset.pools:
                from amm_rules.language.fields import unknown_pool_message

                self.b.error(at, unknown_pool_message(name, self.ruleset.pools), "unknown-pool")

    def build(self) -> Case:
        """The case, every field checked on its own (a case with errors is never run:
        its fields are read only to report every problem at once)."""
        item, path = self.item, self.path
        field = self.b.field
        case = Case(item.get("name", ""), path, self.keys())
        at = (*path, "kill")
        kill = field(item, path, "kill", dict) or {}
        workers = field(kill, at, "workers", list) or []
        hosts = field(kill, at, "hosts", list) or []
        pools = field(kill, at, "pools", list) or []
        self.names(workers, (*at, "workers"), self.workers, "worker")
        self.names(hosts, (*at, "hosts"), self.hosts, "host")
        for j, pool in enumerate(pools):
            self.pools(pool, (*at, "pools", j))
        case.kill_workers, case.kill_hosts, case.kill_pools = workers, hosts, pools
        case.cycles = field(item, path, "cycles", int)
        known = {k.key for k in case.keys}
        for j, exp in enumerate(field(item, path, "expect", list) or []):
            if isinstance(exp, dict):
                case.expect.append(self.expectation(exp, (*path, "expect", j), known))
        actions = field(item, path, "expect-actions", list)
        if actions is not None:
            case.expect_actions = []
            for j, a in enumerate(actions):
                at = (*path, "expect-actions", j)
                key = self.known_key(a, at, known)
                worker = field(a, at, "worker", str)
                self.names([worker] if worker else [], (*at, "worker"), self.workers, "worker")
                if isinstance(a, dict):  # (a case with errors is never run: "" is unseen)
                    op, rule = str(a.get("op", "")), a.get("rule")
                    case.expect_actions.append((op, key, worker or "", rule))
        lost = field(item, path, "expect-lost", list)
        if lost is not None:
            case.expect_lost = [
                self.known_key({"key": k}, (*path, "expect-lost", j), known, here=True)
                for j, k in enumerate(lost)
            ]
        expect_pools = field(item, path, "expect-pools", dict)
        if expect_pools is not None:
            case.expect_pools = {}
            for pool, members in expect_pools.items():
                at = (*path, "expect-pools", pool)
                self.pools(pool, at)
                self.names(members, at, self.workers, "worker")
                case.expect_pools[pool] = list(members) if isinstance(members, list) else []
        return case

    def keys(self) -> list[KeyFixture]:
        out: list[KeyFixture] = []
        seen: set[Hashable] = set()
        keys = self.item.get("keys")
        field = self.b.field
        for j, k in enumerate(keys if isinstance(keys, list) else []):
            at = (*self.path, "keys", j)
            if not isinstance(k, dict):
                continue
            holders = field(k, at, "holders", list) or []
            self.names(holders, (*at, "holders"), self.workers, "worker")
            nbytes = self.b.size(k.get("nbytes", DEFAULT_NBYTES), (*at, "nbytes"))
            target = (
                self.b.target(k["target"], (*at, "target"))
                if "target" in k and not self.b.skip((*at, "target"))
                else None
            )
            recompute = (
                self.b.unit(parse_duration, k["recompute"], (*at, "recompute"))
                if "recompute" in k
                else None
            )
            count = field(k, at, "count", int)
            raw = field(k, at, "key", (str, list))
            if raw is None or self.b.skip((*at, "key")):
                continue  # no key, or one the schema refused: nothing to declare
            if count is not None and (not isinstance(raw, str) or "{i}" not in raw):
                self.b.error((*at, "key"), "with 'count', the key must contain '{i}'", "bad-value")
                count = None
            declared = count or 1
            if self.b.keys + declared > MAX_KEYS:
                self.b.error(
                    (*at, "count") if count else (*at, "key"),
                    f"the cases declare more than {MAX_KEYS:,} keys in all "
                    f"(with these, {self.b.keys + declared:,})",
                    "too-many-keys",
                )
                return out
            self.b.keys += declared
            keys = (
                [raw.replace("{i}", str(i)) for i in range(count)] if count else [plain_key(raw)]
            )
            for key in keys:
                if key in seen:
                    self.b.error((*at, "key"), f"key {key!r} is listed twice", "duplicate-key")
                seen.add(key)
                out.append(
                    KeyFixture(
                        key=key,
                        holders=list(holders),
                        nbytes=nbytes,
                        prefix=k.get("prefix"),
                        group=k.get("group"),
                        type=k.get("type"),
                        annotations=field(k, at, "annotations", dict) or {},
                        target=target,
                        waiters=k.get("waiters", 0),
                        path=at,
                        recompute=recompute,
                        resources=field(k, at, "resources", dict) or {},
                    )
                )
        return out

    def known_key(
        self, item: Any, path: Path, known: set[Hashable], *, here: bool = False
    ) -> Hashable:
        """The key of ``item`` (its ``key`` field; ``here``: ``path`` is the key's own),
        checked against the case's keys; None if it is missing or refused."""
        at = path if here else (*path, "key")
        if not isinstance(item, dict) or "key" not in item or self.b.skip(at):
            return None
        value = item["key"]
        if not isinstance(value, (str, list)):
            return None
        key = plain_key(value)
        if key not in known:
            self.b.error(at, f"key {key!r} is not among the case's keys", "unknown-key")
        return key

    def expectation(
        self, exp: dict[str, Any], path: Path, known: set[Hashable]
    ) -> tuple[Path, dict[str, Any]]:
        out = dict(exp)
        out["key"] = self.known_key(exp, path, known)
        if exp.get("target") is not None and not self.b.skip((*path, "target")):
            out["target"] = self.b.target(exp["target"], (*path, "target"))
        for name in ("holders", "holders-include", "holders-exclude"):
            if name in exp and not self.b.skip((*path, name)):
                self.names(exp[name], (*path, name), self.workers, "worker")
        for name in ("pool", "avoid", "in-pool"):
            if name in exp and not self.b.skip((*path, name)):
                self.pools(exp[name], (*path, name))
        if self.ruleset is None:
            return path, out
        from amm_rules.language.spelling import did_you_mean

        deciders = sorted({r.name for r in self.ruleset.rules} | {"annotation", "runtime"})
        named = [((*path, "rule"), exp.get("rule"))]
        rules = self.b.field(exp, path, "rules", dict) or {}
        named += [((*path, "rules", name), rule) for name, rule in rules.items()]
        for at, rule in named:
            if isinstance(rule, str) and not self.b.skip(at) and rule not in deciders:
                self.b.error(
                    at,
                    f"unknown rule '{rule}'{did_you_mean(rule, deciders)} (a rule name, "
                    "'annotation' or 'runtime')",
                    "unknown-rule",
                )
        return path, out
