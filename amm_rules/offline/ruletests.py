"""``amm-rules test``: rules tested as code, as ``opa test`` tests policies.

Each case of a test file (:mod:`amm_rules.offline.casefile`) becomes a small cluster
(:class:`~amm_rules.offline.dump.ClusterState` built from the fixtures), on which the
simulator (:class:`~amm_rules.offline.simulate.Simulation`, the engine's own classifier
and planners) runs until nothing changes, or for ``cycles``, after the case's ``kill``.
Then every expectation is checked against what the rules wanted for each key (the
cascade's answer, with the rule behind each field) and where its copies ended up. A
case PASSes when every expectation holds; a FAIL lists each one that did not, with what
differed and the ``file:line:column`` of the expectation.

``--coverage`` adds, per rules file, the rules that decided no field of any key in any
case, and the pools no key's ``pool``/``avoid`` named and no ``expect-pools`` checked.
"""

from __future__ import annotations

import os
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from amm_rules.engine.decide.view import key_string
from amm_rules.engine.words import counted
from amm_rules.language.diagnostics import Diagnostic
from amm_rules.language.ruleset import Desired
from amm_rules.offline.casefile import Case, TestFile, read_test_file
from amm_rules.offline.dump import (
    ClusterState,
    GroupRecord,
    TaskRecord,
    WorkerRecord,
    group_of,
    prefix_of,
)
from amm_rules.offline.sim_cluster import SimCluster
from amm_rules.offline.simulate import DEFAULT_INTERVAL, DEFAULT_MEASURE, Result, Simulation

#: Test files a directory argument contributes.
PATTERNS = ("_test.yaml", "_test.yml")
_STATUS = {"running": "running", "paused": "paused", "closing": "closing_gracefully"}


@dataclass
class CaseResult:
    name: str
    line: int
    #: What differed, one positioned line each (empty: PASS).
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures


@dataclass
class FileResult:
    test: TestFile
    cases: list[CaseResult] = field(default_factory=list)


@dataclass
class Coverage:
    """Per rules file: its rules and pools, and those some case exercised."""

    rules: dict[str, list[str]] = field(default_factory=dict)
    pools: dict[str, list[str]] = field(default_factory=dict)
    used_rules: dict[str, set[str]] = field(default_factory=dict)
    used_pools: dict[str, set[str]] = field(default_factory=dict)

    def missing(self, rules_file: str) -> dict[str, list[str]]:
        """The rules and the pools of ``rules_file`` no case exercised (as JSON says them)."""
        return {
            "rules_not_exercised": [
                r for r in self.rules[rules_file] if r not in self.used_rules[rules_file]
            ],
            "pools_not_exercised": [
                p for p in self.pools[rules_file] if p not in self.used_pools[rules_file]
            ],
        }


def find_test_files(paths: Iterable[str]) -> list[str]:
    """Files named, and in directories every ``*_test.yaml``/``*_test.yml``, sorted."""
    out: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            found = []
            for root, dirs, files in os.walk(path):
                dirs.sort()
                found += [os.path.join(root, f) for f in files if f.endswith(PATTERNS)]
            out += sorted(found)
        else:
            out.append(path)
    return list(dict.fromkeys(out))


#: What marks the root of the tree a test file belongs to (a repository, a project).
TREE_MARKERS = (".git", "pyproject.toml")


def tree_of(path: str) -> str:
    """The tree the test file ``path`` belongs to: the nearest directory holding
    ``.git`` or ``pyproject.toml`` (its own directory included), else its own
    directory; resolved (``..`` and symlinks)."""
    here = os.path.dirname(os.path.realpath(path))
    directory = here
    while True:
        if any(os.path.exists(os.path.join(directory, m)) for m in TREE_MARKERS):
            return directory
        parent = os.path.dirname(directory)
        if parent == directory:
            return here
        directory = parent


def allowed_roots(paths: Iterable[str]) -> list[str]:
    """The directories given (files' own count through their tree, see :func:`tree_of`),
    resolved, so that ``..`` and symlinks cannot lead out. Where a test file's ``rules:``
    may be besides its tree: a directory named on the command line is a tree too."""
    return list(dict.fromkeys(os.path.realpath(p) for p in paths if os.path.isdir(p)))


def run_files(
    paths: Sequence[str], roots: Sequence[str] | None = None
) -> tuple[list[FileResult], Coverage]:
    """Run test files. ``roots``: besides each file's tree (:func:`tree_of`), the
    directories its rules file may be in; None: anywhere (``--allow-outside``)."""
    coverage = Coverage()
    results = []
    for p in paths:
        bounds = None if roots is None else list(dict.fromkeys([tree_of(p), *roots]))
        results.append(run_file(read_test_file(p, bounds), coverage))
    return results, coverage


def run_file(test: TestFile, coverage: Coverage) -> FileResult:
    result = FileResult(test)
    if not test.ok:
        return result
    assert test.rules is not None and test.rules.ruleset is not None and test.rules_path
    ruleset = test.rules.ruleset
    name = test.rules_path
    coverage.rules.setdefault(name, [r.name for r in ruleset.rules])
    coverage.pools.setdefault(name, list(ruleset.pools))
    used_rules = coverage.used_rules.setdefault(name, set())
    used_pools = coverage.used_pools.setdefault(name, set())
    for case in test.cases:
        run = _Run(test, case)
        result.cases.append(run.check())
        for desired in run.wishes.values():
            used_rules.update(
                r.rule for r in desired.reasons.values() if r.kind == "rule" and r.rule
            )
            used_pools.update(desired.pool or ())
            used_pools.update(desired.avoid or ())
        used_pools.update(case.expect_pools or ())
        used_pools.update(case.kill_pools)
    return result


def outcome(test: TestFile, case: Case) -> dict[Hashable, tuple[Desired, int]]:
    """What the rules decided for each key of a case, with the copies it ended with,
    as the checks of the expectations see them (``test --from-dump`` writes these)."""
    run = _Run(test, case)
    return {k.key: (run.desired(k.key), len(run.holders(k.key))) for k in case.keys}


def cluster_of(test: TestFile, case: Case) -> ClusterState:
    """The case's cluster, as a dump would record it."""
    state = ClusterState(f"{test.path}: case '{case.name}'")
    by_name = {w.name: w for w in test.workers}
    held: dict[str, list[Hashable]] = {w.name: [] for w in test.workers}
    managed: dict[str, int] = dict.fromkeys(by_name, 0)
    for k in case.keys:
        waiters = tuple((f"{key_string(k.key)}-waiter", j) for j in range(k.waiters))
        prefix = k.prefix if k.prefix is not None else prefix_of(k.key)
        state.tasks[k.key] = TaskRecord(
            key=k.key,
            state="memory",
            prefix=prefix,
            group=k.group if k.group is not None else group_of(k.key),
            type=k.type,
            nbytes=k.nbytes,
            who_has=tuple(by_name[h].address for h in k.holders),
            waiters=waiters,
            annotations=dict(k.annotations),
            resources=dict(k.resources),
        )
        for w in waiters:
            state.tasks[w] = TaskRecord(key=w, state="waiting", prefix="waiter", group="waiter")
        if k.recompute is not None:
            # As the scheduler records a task group: its compute seconds and states.
            name = state.tasks[k.key].group
            group = state.groups.setdefault(name, GroupRecord(name))
            group.compute += k.recompute
            group.states["memory"] = group.states.get("memory", 0) + 1
        for h in k.holders:
            held[h].append(k.key)
            managed[h] += k.nbytes
    for worker in test.workers:
        state.workers[worker.address] = WorkerRecord(
            address=worker.address,
            name=worker.name,
            host=worker.host,
            status=_STATUS[worker.status],
            resources=dict(worker.resources),
            nthreads=worker.nthreads,
            memory_limit=worker.memory_limit,
            memory={
                "process": worker.memory + managed[worker.name],
                "managed": managed[worker.name],
                "spilled": 0,
                "unmanaged_old": worker.memory,
            },
            has_what=held[worker.name],
        )
    return state


class _Run:
    """One case, simulated, and its expectations checked."""

    def __init__(self, test: TestFile, case: Case):
        assert test.rules is not None and test.rules.ruleset is not None
        self.test = test
        self.case = case
        self.ruleset = test.rules.ruleset
        runtime = {k.key: k.target for k in case.keys if k.target is not None}
        self.sim = Simulation(
            self.ruleset,
            SimCluster(cluster_of(test, case)),
            measure=DEFAULT_MEASURE,
            interval=DEFAULT_INTERVAL,
            runtime=runtime,
        )
        #: What the rules want for each key, before anything happens.
        self.wishes: dict[Hashable, Desired] = dict(self.sim.desired)
        self.names = {w.address: w.name for w in test.workers}
        self.hosts = {w.name: w.host for w in test.workers}
        self.pools = {self.names[a]: p for a, p in self.sim.initial_pools.items()}
        addresses = {w.name: w.address for w in test.workers}
        victims = {addresses[n] for n in case.kill_workers}
        victims |= {w.address for w in test.workers if w.host in case.kill_hosts}
        victims |= {w.address for w in test.workers if set(case.kill_pools) & self.pools[w.name]}
        self.lost = {ts.key for ts in self.sim.kill(sorted(victims))} if victims else set()
        self.result: Result = self.sim.run(case.cycles)
        self.failures: list[str] = []

    def fail(self, path: tuple[Any, ...], message: str) -> None:
        line, column = self.test.locator.position(path)
        self.failures.append(f"{self.test.path}:{line}:{column}: {message}")

    def check(self) -> CaseResult:
        case = self.case
        for path, exp in case.expect:
            failed = len(self.failures)
            self.key(path, exp)
            if len(self.failures) > failed:
                self.seen_as(exp["key"])
        if case.expect_actions is not None:
            self.actions()
        if case.expect_lost is not None:
            got = sorted(map(key_string, self.lost))
            want = sorted(map(key_string, case.expect_lost))
            if got != want:
                self.fail((*case.path, "expect-lost"), f"lost: expected {want}, got {got}")
        for pool, members in (case.expect_pools or {}).items():
            got = sorted(n for n, pools in self.pools.items() if pool in pools)
            if got != sorted(members):
                self.fail(
                    (*case.path, "expect-pools", pool),
                    f"pool '{pool}': expected workers {sorted(members)}, got {got}",
                )
        return CaseResult(case.name, self.test.locator.position(case.path)[0], self.failures)

    def desired(self, key: Hashable) -> Desired:
        """What the rules want for ``key`` (after the run; before it for a key lost)."""
        return self.sim.desired.get(key) or self.wishes.get(key) or Desired()

    def holders(self, key: Hashable) -> list[str]:
        ts = self.sim.cluster.tasks[key]
        return sorted(self.names[ws.address] for ws in ts.who_has or ())

    def seen_as(self, key: Hashable) -> None:
        """After a key's failed expectation: what a match saw of the key (its prefix,
        group, type and resources), and where the prefix and group came from, at the
        key's declaration. A key ``features-abc`` has prefix ``features-abc`` to dask's
        ``key_split``: a case expecting a rule on ``task.prefix == "features"`` fails, and
        this says why."""
        fixture = next((k for k in self.case.keys if k.key == key), None)
        task = self.sim.cluster.tasks.get(key)
        if fixture is None or task is None:
            return
        resources = dict(task.resource_restrictions or {})
        names = f"prefix {task.prefix.name!r} and group {task.group.name!r}"
        derived = [
            n for n, v in (("prefix", fixture.prefix), ("group", fixture.group)) if v is None
        ]
        if derived:
            names += (
                " (named from the key by dask's key_split, as the scheduler names them; "
                f"set {' and '.join(repr(n + ':') for n in derived)} on the key to change "
                f"{'it' if len(derived) == 1 else 'them'})"
            )
        parts = [
            names,
            f"type {task.type}" if task.type else "no type",
            f"resources {resources}" if resources else "no resources",
        ]
        note = ""
        if "resources" in fixture.annotations and not fixture.resources:
            note = (
                " ('annotations: {resources: ...}' is an annotation; what resources= sets is "
                "'resources:' on the key)"
            )
        self.fail(fixture.path, f"key {key_string(key)!r} is seen as {', '.join(parts)}{note}")

    def key(self, path: tuple[Any, ...], exp: dict[str, Any]) -> None:
        key = exp["key"]
        shown = f"key {key_string(key)!r}"
        desired = self.desired(key)
        holders = self.holders(key)
        final = self.result.keys.get(key)
        hosts = sorted(self.hosts[n] for n in holders)
        got: dict[str, Any] = {
            "governed": desired.governed,
            "target": desired.replicate,
            "rule": _who(desired, "replicate"),
            "spread": desired.spread or "none",
            "move": desired.move or "allowed",
            "dry-run": self.sim.ctx.dry_run.label(desired) is not None,
            "copies": len(holders),
            "hosts": len(set(hosts)),
            "lost": key in self.lost,
        }
        for name, want in exp.items():
            at = (*path, name)
            if name == "key":
                continue
            if name in got:
                if got[name] != want:
                    self.fail(
                        at, f"{shown}: {name}: expected {_show(want)}, got {_show(got[name])}"
                    )
            elif name in ("pool", "avoid"):
                have = sorted(getattr(desired, name) or ())
                want_set = sorted([want] if isinstance(want, str) else want)
                if have != want_set:
                    self.fail(at, f"{shown}: {name}: expected {want_set}, got {have or 'not set'}")
            elif name == "rules":
                for field_name, rule in want.items():
                    decided = _who(desired, field_name)
                    if decided != rule:
                        self.fail(
                            (*at, field_name),
                            f"{shown}: {field_name} decided by: expected {rule!r}, got {_show(decided)}",
                        )
            elif name == "holders" and sorted(want) != holders:
                self.fail(at, f"{shown}: holders: expected {sorted(want)}, got {holders}")
            elif name == "holders-include" and not set(want) <= set(holders):
                self.fail(
                    at,
                    f"{shown}: expected on {sorted(set(want) - set(holders))}; holders: {holders}",
                )
            elif name == "holders-exclude" and set(want) & set(holders):
                self.fail(
                    at,
                    f"{shown}: expected not on {sorted(set(want) & set(holders))}; holders: {holders}",
                )
            elif name == "in-pool":
                outside = [n for n in holders if want not in self.pools.get(n, ())]
                if outside or not holders:
                    self.fail(
                        at,
                        f"{shown}: expected every copy in pool '{want}'; outside it: {outside or 'no copy at all'}",
                    )
            elif name == "copies-on-distinct-hosts":
                distinct = len(set(hosts)) == len(hosts) and bool(hosts)
                if distinct != want:
                    self.fail(
                        at,
                        f"{shown}: copies-on-distinct-hosts: expected {_show(want)}, got {_show(distinct)} (hosts: {', '.join(hosts) or 'none'})",
                    )
            elif name == "unmet":
                reason = final.unmet if final is not None else None
                ok = (
                    (bool(reason) == want)
                    if isinstance(want, bool)
                    else (reason is not None and want in reason)
                )
                if not ok:
                    self.fail(
                        at, f"{shown}: unmet: expected {_show(want)}, got {_show(reason or False)}"
                    )

    def actions(self) -> None:
        case = self.case
        assert case.expect_actions is not None
        actual = [
            (a.op, a.key, self.names.get(a.worker, a.worker), a.rule) for a in self.result.actions
        ]
        missing = []
        for op, key, worker, rule in case.expect_actions:
            match = next(
                (
                    a
                    for a in actual
                    if a[:3] == (op, key, worker) and (rule is None or a[3] == rule)
                ),
                None,
            )
            if match is None:
                missing.append(
                    f"{op} {key_string(key)} on {worker}" + (f" ({rule})" if rule else "")
                )
            else:
                actual.remove(match)
        extra = [
            f"{op} {key_string(key)} on {worker} ({rule})" for op, key, worker, rule in actual
        ]
        if missing or extra:
            parts = []
            if missing:
                parts.append(f"missing: {'; '.join(missing)}")
            if extra:
                parts.append(f"unexpected: {'; '.join(extra)}")
            self.fail((*case.path, "expect-actions"), "actions: " + ", ".join(parts))


def _who(desired: Desired, name: str) -> str | None:
    """The rule that decided field ``name``, or ``annotation``/``runtime``; None if unset."""
    reason = desired.reasons.get(name)
    return None if reason is None else reason.who


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "nothing"
    return repr(value) if isinstance(value, str) else str(value)


# -- reporting ---------------------------------------------------------------------------------


def render_text(results: Sequence[FileResult], coverage: Coverage | None) -> str:
    from amm_rules.language.loader import CheckResult
    from amm_rules.language.reporters import format_text

    lines: list[str] = []
    for r in results:
        test = r.test
        if not test.ok:
            errors = [CheckResult(test.path, None, test.diagnostics, test.text)]
            if test.rules is not None and test.rules.ruleset is None:
                errors.append(test.rules)
            lines.append(f"ERROR {test.path}")
            for chunk in errors:
                text = format_text([chunk])
                lines += ["  " + line for line in text.splitlines()[:-1]]
            continue
        lines.append(f"{test.path} (rules: {test.rules_path})")
        for c in r.cases:
            lines.append(f"  {'PASS' if c.passed else 'FAIL'}  {c.name}")
            lines += [f"        {f}" for f in c.failures]
    lines.append(summary(results))
    if coverage is not None:
        lines += coverage_lines(coverage)
    return "\n".join(lines) + "\n"


def counts(results: Sequence[FileResult]) -> dict[str, int]:
    """Files, cases, cases passed and failed, files with errors."""
    cases = [c for r in results for c in r.cases]
    passed = sum(c.passed for c in cases)
    return {
        "files": len(results),
        "cases": len(cases),
        "passed": passed,
        "failed": len(cases) - passed,
        "files_with_errors": sum(not r.test.ok for r in results),
    }


def summary(results: Sequence[FileResult]) -> str:
    n = counts(results)
    out = (
        f"{counted(n['files'], 'file')}, {counted(n['cases'], 'case')}: {n['passed']} passed, "
        f"{n['failed']} failed"
    )
    if n["files_with_errors"]:
        out += f"; {counted(n['files_with_errors'], 'file')} with errors"
    return out


def coverage_lines(coverage: Coverage) -> list[str]:
    lines = []
    for name in sorted(coverage.rules):
        missing = coverage.missing(name)
        rules, pools = missing["rules_not_exercised"], missing["pools_not_exercised"]
        n_rules, n_pools = len(coverage.rules[name]), len(coverage.pools[name])
        lines.append(
            f"coverage of {name}: {n_rules - len(rules)} of {counted(n_rules, 'rule')}, "
            f"{n_pools - len(pools)} of {counted(n_pools, 'pool')} exercised"
        )
        lines += [f"  not exercised: rule '{r}'" for r in rules]
        lines += [f"  not exercised: pool '{p}'" for p in pools]
    return lines


def render_json(results: Sequence[FileResult], coverage: Coverage | None) -> dict[str, Any]:
    files = []
    for r in results:
        diagnostics: list[Diagnostic] = list(r.test.diagnostics)
        if r.test.rules is not None and r.test.rules.ruleset is None:
            diagnostics += r.test.rules.diagnostics
        files.append(
            {
                "file": r.test.path,
                "rules": r.test.rules_path,
                "errors": [d.to_dict() for d in diagnostics if d.is_error],
                "cases": [
                    {"name": c.name, "line": c.line, "passed": c.passed, "failures": c.failures}
                    for c in r.cases
                ],
            }
        )
    out: dict[str, Any] = {"files": files, "summary": counts(results)}
    if coverage is not None:
        out["coverage"] = {name: coverage.missing(name) for name in sorted(coverage.rules)}
    return out


def exit_status(results: Sequence[FileResult]) -> int:
    """0: every case passed; 1: a case failed or a file has errors."""
    n = counts(results)
    return 1 if n["failed"] or n["files_with_errors"] else 0
