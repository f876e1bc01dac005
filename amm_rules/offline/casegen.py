"""Rule test cases from a recorded cluster: ``amm-rules test --from-dump DUMP --rules R``.

A cluster dump (read by :mod:`amm_rules.offline.dump`) already holds the keys a rules
file has to get right. :func:`cases_from_dump` writes a test file of one case: the
dump's workers, a sample of its keys in memory and, as expectations, what the rules
decide for each key today (what it holds is listed in docs/testing-rules.md, "Cases
from a recorded cluster"). The expectations are read from a run of the case itself
(:func:`amm_rules.offline.ruletests.outcome`), so the file passes on the rules it was
written from, and a change of those rules that changes a decision fails it.

Neighbours: :mod:`amm_rules.offline.commands` (``write_tests``) writes the file;
:mod:`amm_rules.offline.ruletests` runs it.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass
from itertools import islice, zip_longest
from typing import Any

from amm_rules.client import plain_actions, plain_target
from amm_rules.engine.decide.view import key_string
from amm_rules.engine.words import counted
from amm_rules.language.ruleset import Desired, Ruleset, Target
from amm_rules.offline.casefile import MAX_WORKERS, parse_test_file, plain_key
from amm_rules.offline.dump import ClusterState, TaskRecord, WorkerRecord

_STATUS = {"paused": "paused", "closing": "closing", "closing_gracefully": "closing"}


class CaseGenError(ValueError):
    """A dump that cannot become a test file (too many workers, no key in memory)."""


@dataclass
class Generated:
    """A test file written from a dump, and what was left out of it."""

    text: str
    #: Keys in memory in the dump, and keys in the case.
    keys_in_memory: int = 0
    keys: int = 0
    #: Keys left out because a test file cannot write them (a key that is neither text
    #: nor a flat tuple), and annotations left out because they are not plain data.
    unwritable_keys: int = 0
    dropped_annotations: int = 0


def cases_from_dump(
    state: ClusterState,
    ruleset: Ruleset,
    rules_path: str,
    output: str,
    *,
    sample: int,
    command: str,
) -> Generated:
    """The test file (YAML text) of ``state`` under ``ruleset`` (read from
    ``rules_path``), to be written at ``output`` (``-``: standard output, ``rules:``
    then relative to the working directory); ``command`` is named in its header."""
    if len(state.workers) > MAX_WORKERS:
        raise CaseGenError(
            f"{state.source} has {len(state.workers):,} workers; a test file holds at most "
            f"{MAX_WORKERS:,}"
        )
    where = os.getcwd() if output == "-" else os.path.dirname(os.path.abspath(output))
    names = _worker_names(state)
    in_memory = [t for t in state.in_memory() if all(a in names for a in t.who_has)]
    if not in_memory:
        raise CaseGenError(f"{state.source} holds no key in memory: no case to write")
    out = Generated("", keys_in_memory=len(in_memory))
    keys = []
    for task in _sampled(in_memory, sample):
        fixture = _key_fixture(task, state, names, ruleset, out)
        if fixture is not None:
            keys.append(fixture)
    out.keys = len(keys)
    data: dict[str, Any] = {
        "rules": os.path.relpath(os.path.abspath(rules_path), where),
        "workers": [_worker_fixture(w, names[a]) for a, w in state.workers.items()],
        "cases": [
            {
                "name": f"the cluster of {os.path.basename(state.source)}: "
                f"{out.keys:,} of its {out.keys_in_memory:,} keys in memory",
                "keys": keys,
            }
        ],
    }
    draft = _yaml(data)
    test = parse_test_file(draft.encode(), os.path.join(where, "cases_test.yaml"))
    if not test.ok:  # (what this module writes is always a valid test file)
        raise CaseGenError("; ".join(str(d) for d in test.diagnostics[:3]))
    from amm_rules.offline.ruletests import outcome

    decided = outcome(test, test.cases[0])
    data["cases"][0]["expect"] = [
        _expectation(k["key"], *decided[plain_key(k["key"])]) for k in keys
    ]
    out.text = _header(state, out, command) + _yaml(data)
    return out


class _Flow(dict[str, Any]):
    """A mapping written on one line (a worker, a key, an expectation)."""


def _yaml(data: dict[str, Any]) -> str:
    """The test file's YAML: sections in blocks, each worker, key and expectation a
    mapping on a line of its own."""
    import yaml

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:
            return True  # a tuple key is written out where it is used, never as &id001

    def flow(dumper: yaml.SafeDumper, value: _Flow) -> Any:
        return dumper.represent_mapping("tag:yaml.org,2002:map", value, flow_style=True)

    Dumper.add_representer(_Flow, flow)
    shaped = {
        **data,
        "workers": [_Flow(w) for w in data["workers"]],
        "cases": [
            {
                name: [_Flow(item) for item in value] if name in ("keys", "expect") else value
                for name, value in case.items()
            }
            for case in data["cases"]
        ],
    }
    text = yaml.dump(shaped, Dumper=Dumper, sort_keys=False, default_flow_style=False, width=4096)
    # A blank line between the sections, as a person writes them.
    return text.replace("\nworkers:", "\n\nworkers:").replace("\ncases:", "\n\ncases:")


def _header(state: ClusterState, out: Generated, command: str) -> str:
    import textwrap

    words = (
        f"Written by `{command}`: the cluster of "
        f"{state.source} (its workers, {out.keys:,} of its {out.keys_in_memory:,} keys in "
        "memory, taken in turn from each task group) and what the rules decided for each "
        "key then, as expectations. Edit it as any test file: a case per concern, fewer "
        "keys, an expectation where the rules should decide otherwise "
        "(docs/testing-rules.md)."
    )
    if out.unwritable_keys:
        words += (
            f" Left out: {counted(out.unwritable_keys, 'key')} that are neither text nor a "
            "flat tuple."
        )
    if out.dropped_annotations:
        words += (
            f" Left out: the annotations of {counted(out.dropped_annotations, 'key')} that "
            "are not plain data."
        )
    lines = textwrap.wrap(words, 86, break_long_words=False, break_on_hyphens=False)
    return "".join(f"# {line}\n" for line in lines) + "\n"


def _sampled(tasks: list[TaskRecord], sample: int) -> Iterator[TaskRecord]:
    """At most ``sample`` tasks, taken in turn from each task group (groups and keys in
    order of their names, so that the same dump gives the same case)."""
    groups: dict[str, list[TaskRecord]] = {}
    for task in tasks:
        groups.setdefault(task.group, []).append(task)
    ordered = [sorted(g, key=lambda t: key_string(t.key)) for _, g in sorted(groups.items())]
    in_turn = (task for row in zip_longest(*ordered) for task in row if task is not None)
    return islice(in_turn, sample)


def _worker_names(state: ClusterState) -> dict[str, str]:
    """A name per worker address: its own, or its address where the name is empty or
    another worker's too."""
    counts = Counter(str(w.name) for w in state.workers.values())
    return {
        a: str(w.name) if str(w.name) and counts[str(w.name)] == 1 else a
        for a, w in state.workers.items()
    }


def _worker_fixture(w: WorkerRecord, name: str) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "host": w.host or name, "address": w.address}
    if w.resources:
        out["resources"] = dict(w.resources)
    out["memory-limit"] = _size(w.memory_limit)
    unmanaged = int(w.memory.get("process", 0)) - int(w.memory.get("managed", 0))
    if unmanaged > 0:
        out["memory"] = unmanaged
    if w.nthreads != 1:
        out["nthreads"] = int(w.nthreads)
    status = _STATUS.get(w.status)
    if status is not None:
        out["status"] = status
    return out


def _key_fixture(
    task: TaskRecord,
    state: ClusterState,
    names: Mapping[str, str],
    ruleset: Ruleset,
    out: Generated,
) -> dict[str, Any] | None:
    key = _written_key(task.key)
    if key is None:
        out.unwritable_keys += 1
        return None
    fixture: dict[str, Any] = {
        "key": key,
        "holders": [names[a] for a in task.who_has],
        "nbytes": _size(task.nbytes),
        "prefix": task.prefix,
        "group": task.group,
    }
    if task.type:
        fixture["type"] = task.type
    if task.resources:
        fixture["resources"] = dict(task.resources)
    if task.annotations:
        plain = {
            k: v for k, v in task.annotations.items() if isinstance(k, str) and _plain_data(v)
        }
        if len(plain) < len(task.annotations):
            out.dropped_annotations += 1
        if plain:
            fixture["annotations"] = plain
    runtime = state.runtime.get(task.key)
    if runtime is not None:
        fixture["target"] = plain_target(Target(*runtime))
    if task.waiters:
        fixture["waiters"] = len(task.waiters)
    recompute = _recompute(task, state)
    if recompute is not None and (ruleset.reads_costs or ruleset.protect is not None):
        fixture["recompute"] = recompute
    return fixture


def _size(n: int) -> int | str:
    """A size as a person writes it where that is exact (``2 GiB``), else bytes."""
    n = int(n)
    for unit, factor in (("GiB", 2**30), ("MiB", 2**20)):
        if n >= factor and n % factor == 0:
            return f"{n // factor} {unit}"
    return n


def _written_key(key: Hashable) -> Any:
    """A key as a test file writes it (text, or a list for a flat tuple); None if it
    cannot be written so."""
    if isinstance(key, str) and key:
        return key
    if (
        isinstance(key, tuple)
        and key
        and all(isinstance(k, (str, int, float)) and not isinstance(k, bool) for k in key)
    ):
        return list(key)
    return None


def _plain_data(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` is YAML's plain data (text, numbers, booleans, null, lists and
    mappings of text keys), which a test file reads back as it was."""
    if depth > 20:
        return False
    if value is None or isinstance(value, (str, bool, int)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, (list, tuple)):
        return all(_plain_data(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain_data(v, depth + 1) for k, v in value.items())
    return False


def _recompute(task: TaskRecord, state: ClusterState) -> float | None:
    """Seconds a task of its group computed on average, where the dump recorded it."""
    group = state.groups.get(task.group)
    if group is None or group.compute <= 0:
        return None
    done = sum(group.states.values()) or 1
    return round(group.compute / done, 6)


def _expectation(key: Any, desired: Desired, copies: int) -> dict[str, Any]:
    """What the rules decided for a key, as an ``expect`` entry."""
    if not desired.governed:
        return {"key": key, "governed": False, "copies": copies}
    out: dict[str, Any] = {"key": key}
    fields = plain_actions(desired)
    if "replicate" in fields:
        out["target"] = fields.pop("replicate")
    out.update(fields)
    out["rules"] = {name: reason.who for name, reason in desired.reasons.items()}
    out["copies"] = copies
    return out
