"""What a name that is not a key stands for, for ``explain``: a task group, or a prefix.

``amm-rules explain features-bd20...`` names a task group (a key's string form without
its index), not a key. The scheduler knows the group (``scheduler.task_groups``), with
its tasks counted per state, but keeps no list of a group's keys. :func:`name_offer`
finds the first few: dask collections name their keys ``(group, i)``, ``(group, i, j)``
..., which are looked up directly (at most :data:`PROBES` lookups); keys of other shapes
are looked for in a bounded sample of the keys in memory
(:func:`~amm_rules.observe.conformance.sampled_tasks`, taken once per explanation). A
prefix (``features``) is offered its groups. Never a walk over all tasks.

Neighbours: :class:`amm_rules.observe.explain.Explainer` adds the offer to the answer
for a key the scheduler does not know; :mod:`amm_rules.cli.remote` prints it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import Any

from amm_rules.engine.decide.view import key_string
from amm_rules.engine.words import counted

#: Keys (or groups of a prefix) an offer shows.
SHOWN = 5
#: Most lookups of ``(group, i, ...)`` keys spent on one name.
PROBES = 200
#: Dimensions of a collection's keys tried: ``(group, i)`` to ``(group, i, j, k)``.
MAX_DIMENSIONS = 3


def name_offer(
    scheduler: Any, name: Hashable, sampled: Callable[[], Mapping[str, list[Hashable]]]
) -> dict[str, Any] | None:
    """What ``name`` (not a key) names, with what to explain instead: a task group
    and its first keys, or a task prefix and its groups; None for neither.
    ``sampled()``: the keys of a bounded sample of those in memory, per group name
    (for groups whose keys are not ``(group, i, ...)``)."""
    if not isinstance(name, str):
        return None
    group = getattr(scheduler, "task_groups", {}).get(name)
    if group is not None:
        keys = probe(scheduler.tasks, name) or sampled().get(name, [])
        return {
            "kind": "group",
            "name": name,
            **_counts(group),
            "keys": [key_string(k) for k in keys[:SHOWN]],
        }
    prefix = getattr(scheduler, "task_prefixes", {}).get(name)
    if prefix is not None:
        groups = sorted(prefix.groups, key=lambda g: g.name)
        return {
            "kind": "prefix",
            "name": name,
            **_counts(prefix),
            "groups": [{"name": g.name, **_counts(g)} for g in groups[:SHOWN]],
            "more_groups": max(0, len(groups) - SHOWN),
        }
    return None


def _counts(collection: Any) -> dict[str, int]:
    """The ``tasks`` of a group or prefix the scheduler still knows (not forgotten), and
    those ``in_memory``."""
    states = collection.states
    known = sum(n for state, n in states.items() if state != "forgotten")
    return {"tasks": known, "in_memory": states.get("memory", 0)}


def probe(tasks: Mapping[Hashable, Any], name: str, want: int = SHOWN) -> list[Hashable]:
    """The first keys ``(name, i, ...)`` that ``tasks`` holds, in order of their
    indices, in at most :data:`PROBES` lookups: the last index counts up until a key is
    missing, then the one before it moves on (a chunked array's keys)."""
    for dimensions in range(1, MAX_DIMENSIONS + 1):
        if (name, *([0] * dimensions)) in tasks:
            break
    else:
        return []
    index = [0] * dimensions
    found: list[Hashable] = []
    for _ in range(PROBES):
        key = (name, *index)
        if key in tasks:
            found.append(key)
            if len(found) >= want:
                break
            index[-1] += 1
            continue
        # Missing: carry to the previous index (none left, or it was at 0 too: done).
        d = dimensions - 1
        while d >= 0 and index[d] == 0:
            d -= 1
        if d <= 0:
            break
        index[d:] = [0] * (dimensions - d)
        index[d - 1] += 1
    return found


def offer_words(offer: Mapping[str, Any]) -> str:
    """The offer in a sentence: ``a task group of 100 tasks (100 in memory), not a
    key; its first keys: ('x-1a2b', 0), ('x-1a2b', 1), ... (explain one of them)``."""
    n, memory = offer["tasks"], offer["in_memory"]
    counts = f"{counted(n, 'task')} ({memory:,} in memory)"
    if offer["kind"] == "group":
        keys = offer["keys"]
        if not keys:
            return (
                f"a task group of {counts}, not a key; none of its keys is among those "
                "sampled in memory"
            )
        more = n - len(keys)
        listed = ", ".join(keys) + (f" and {more:,} more" if more > 0 else "")
        return f"a task group of {counts}, not a key; its keys: {listed}"
    groups = offer["groups"]
    listed = ", ".join(f"{g['name']} ({g['tasks']:,})" for g in groups)
    if offer["more_groups"]:
        listed += f" and {offer['more_groups']:,} more"
    return f"a task prefix of {counts}, not a key; its task groups: {listed}"
