"""The demo's workload, planned from its rules file: for each rule, keys it matches,
and where to put them so that the rule has something to do.

:func:`plan` reads a :class:`~amm_rules.language.ruleset.Ruleset` and, for each rule,
searches a small catalogue of keys the demo can make for one the rule matches and
decides a field of (the cascade of :meth:`Ruleset.resolve` says which rule decides
what): keys named after the strings in the rule's ``match`` (``task.prefix ==
"precious"`` gives ``precious-0``, ``task.key matches "tmp-*"`` gives ``tmp-0``) or
after the rule, holding ``bytes`` (or numpy arrays, or pandas frames, when those are
installed) of a size the ``match`` asks for, up to :data:`MAX_NBYTES`, with the
annotations the ``match`` reads set to the values it compares them with. A rule no
such key satisfies is listed in :attr:`Workload.unmatched`, and the demo says so.

Each key is then put where its rule does not want it: outside its ``pool``, inside the
pools it must ``avoid``, on one worker when it wants more copies; with ``move: never``,
on two workers, copies that ``reduce-replicas`` would otherwise trim.

Pure: no cluster, no ``distributed``; :mod:`amm_rules.demo` makes the keys and runs the
cluster. Kept apart from it so that the plan is tested on its own.
"""

from __future__ import annotations

import importlib.util
import itertools
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from dask.utils import key_split, typename

from amm_rules.language.fields import SIZE_UNITS
from amm_rules.language.ruleset import Desired, Rule, Ruleset, TaskFacts

#: Bytes per ordinary demo key: big enough to show in the memory table, small enough to
#: be quick.
KEY_NBYTES = 256 * 2**10
#: Largest key the demo makes (a rule about big objects gets keys just above its size).
MAX_NBYTES = 96 * 2**20
#: Most candidate annotations tried per rule.
MAX_ANNOTATIONS = 24

#: What the demo can put in a key: kind -> (the type's public name, the module it
#: needs, if any). The type name the scheduler records is the installed library's own
#: (:func:`type_name`): pandas 3 records ``pandas.DataFrame``, pandas 2
#: ``pandas.core.frame.DataFrame``.
KINDS: dict[str, tuple[str, str | None]] = {
    "bytes": ("bytes", None),
    "numpy": ("numpy.ndarray", "numpy"),
    "pandas": ("pandas.DataFrame", "pandas"),
}


def type_name(kind: str) -> str:
    """The type name the scheduler records for a key of ``kind``, as the installed
    library names its class (dask's ``typename``, which distributed uses)."""
    if kind == "pandas":
        import pandas

        return typename(pandas.DataFrame)
    if kind == "numpy":
        import numpy

        return typename(numpy.ndarray)
    return KINDS[kind][0]


_STRING = re.compile(r"\"((?:[^\"\\]|\\.)*)\"|'((?:[^'\\]|\\.)*)'")
_SIZE = re.compile(
    r"(?<![\w.])([0-9]+(?:\.[0-9]+)?)\s*(" + "|".join(sorted(SIZE_UNITS, key=len)[::-1]) + r")\b"
)
_NUMBER = re.compile(r"(?<![\w.\"'])(-?[0-9]+)(?![\w.%])")
_ANNOTATION = re.compile(
    r"task\.annotations(?:\.([A-Za-z_]\w*)|\[\s*\"([^\"]*)\"\s*\]|\[\s*'([^']*)'\s*\])"
)
_PREFIX = re.compile(r"[A-Za-z][A-Za-z0-9_]*(?:-[A-Za-z][A-Za-z0-9_]*)*")


@dataclass(frozen=True)
class KeySpec:
    """The keys the demo makes for one rule, and where it puts them."""

    rule: str
    #: Keys are ``PREFIX-N``.
    prefix: str
    #: What each key holds: a :data:`KINDS` name, and its size in bytes.
    kind: str
    nbytes: int
    annotations: Mapping[str, Any]
    count: int
    #: What the rules want for these keys.
    desired: Desired
    #: ``outside-pool``, ``avoided``, ``one-worker`` or ``two-workers``.
    placement: str


@dataclass
class Workload:
    specs: list[KeySpec] = field(default_factory=list)
    #: Rules no key of the catalogue is decided by.
    unmatched: list[str] = field(default_factory=list)
    #: The prefix of the keys no rule governs (broadcast, to show ``reduce-replicas``),
    #: or None when every candidate prefix is governed.
    scratch: str | None = None
    #: Per unmatched rule, the modules not installed whose keys it would match, each
    #: with the type it would make (``("pandas", "pandas.DataFrame")``): the cause to
    #: tell, rather than the types the demo makes.
    missing: dict[str, list[tuple[str, str]]] = field(default_factory=dict)


def available_kinds() -> list[str]:
    """The kinds this installation can make (numpy and pandas are optional)."""
    return [k for k, (_, module) in KINDS.items() if module is None or _installed(module)]


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def plan(
    ruleset: Ruleset,
    kinds: list[str] | None = None,
    group_of: Callable[[str], str] | None = None,
) -> Workload:
    """The demo's keys for ``ruleset`` (see the module docstring). ``group_of`` names a
    key's task group as the scheduler does (distributed's ``key_split_group``)."""
    kinds = kinds if kinds is not None else available_kinds()
    group_of = group_of or key_split
    out = Workload()
    for rule in ruleset.rules:
        spec = _spec(rule, ruleset, kinds, group_of)
        if spec is None:
            out.unmatched.append(rule.name)
            missing = missing_modules(rule, kinds)
            if missing:
                out.missing[rule.name] = missing
        else:
            out.specs.append(spec)
    for prefix in ("scratch", "spare", "unruled"):
        facts = key_facts(f"{prefix}-0", type_name("bytes"), KEY_NBYTES, {}, group_of)
        if not ruleset.resolve(facts).governed:
            out.scratch = prefix
            break
    return out


def _spec(
    rule: Rule, ruleset: Ruleset, kinds: list[str], group_of: Callable[[str], str]
) -> KeySpec | None:
    """The first candidate key that ``rule`` matches and decides a field of."""
    for prefix, kind, nbytes, annotated in _candidates(rule, kinds):
        facts = key_facts(f"{prefix}-0", type_name(kind), nbytes, annotated, group_of)
        if not _safe_match(rule, facts):
            continue
        desired = ruleset.resolve(facts)
        if not any(r.rule == rule.name for r in desired.reasons.values()):
            continue  # an earlier rule decides everything this one would
        return KeySpec(
            rule.name,
            prefix,
            kind,
            nbytes,
            annotated,
            _count(desired, nbytes),
            desired,
            _placement(desired),
        )
    return None


def missing_modules(rule: Rule, kinds: list[str]) -> list[tuple[str, str]]:
    """The modules not installed (kinds missing from ``kinds``) that would make a key
    ``rule`` matches, with that key's type: ``[("pandas", "pandas.DataFrame")]`` for
    ``task.type == "pandas.DataFrame"`` where pandas is not installed. Tried with every
    name the type is recorded under."""
    from amm_rules.language.type_names import names_of

    out = []
    for kind, (public, module) in KINDS.items():
        if module is None or kind in kinds:
            continue
        for prefix, _, nbytes, annotated in _candidates(rule, [kind]):
            facts = (
                key_facts(f"{prefix}-0", name, nbytes, annotated, key_split)
                for name in names_of(public)
            )
            if any(_safe_match(rule, f) for f in facts):
                out.append((module, public))
                break
    return out


def _safe_match(rule: Rule, facts: TaskFacts) -> bool:
    try:
        return bool(rule.match(facts))
    except Exception:  # a match that raises is "no match", as in the scheduler
        return False


def key_facts(
    key: str,
    of_type: str,
    nbytes: int,
    annotations: Mapping[str, Any],
    group_of: Callable[[str], str],
) -> TaskFacts:
    """The facts of ``key``, of type ``of_type`` and ``nbytes``, held once."""
    return TaskFacts(
        key=key,
        prefix=key_split(key),
        group=group_of(key),
        type=of_type,
        nbytes=nbytes,
        replicas=1,
        annotations=dict(annotations),
    )


def _candidates(rule: Rule, kinds: list[str]) -> Iterator[tuple[str, str, int, Mapping[str, Any]]]:
    """Candidate (prefix, kind, nbytes, annotations), plainest first."""
    source = rule.match_source
    strings = [a if a else b for a, b in _STRING.findall(source)]
    prefixes = _prefixes([*strings, rule.name, "demo"])
    sizes = _sizes(source)
    annotations = _annotations(source, strings)
    for ann, kind, nbytes, prefix in itertools.product(annotations, kinds, sizes, prefixes):
        yield prefix, kind, nbytes, ann


def _prefixes(words: list[str]) -> list[str]:
    """Key prefixes from the strings of a match (a glob is cut at its first wildcard)."""
    out: list[str] = []
    for word in words:
        head = re.split(r"[*?\[]", word, maxsplit=1)[0].strip("-_. ")
        if _PREFIX.fullmatch(head) and key_split(f"{head}-0") == head and head not in out:
            out.append(head)
    return out


def _sizes(source: str) -> list[int]:
    """:data:`KEY_NBYTES`, then just above every size the match names (within
    :data:`MAX_NBYTES`)."""
    out = [KEY_NBYTES]
    for number, unit in _SIZE.findall(source):
        size = int(float(number) * SIZE_UNITS[unit])
        above = size + max(2**20, size // 64)
        if above <= MAX_NBYTES and above not in out:
            out.append(above)
    return sorted(out)


def _annotations(source: str, strings: list[str]) -> list[Mapping[str, Any]]:
    """No annotations, then each annotation the match reads set to each value it names."""
    names = [a or b or c for a, b, c in _ANNOTATION.findall(source)]
    values: list[Any] = [True, *strings, *(int(n) for n in _NUMBER.findall(source))]
    out: list[Mapping[str, Any]] = [{}]
    for name, value in itertools.product(dict.fromkeys(names), values):
        if len(out) >= MAX_ANNOTATIONS:
            break
        out.append({name: value})
    return out


def _count(desired: Desired, nbytes: int) -> int:
    if nbytes > 16 * 2**20 or desired.move == "never":
        return 2
    return 4 if desired.pool is not None or desired.avoid is not None else 3


def _placement(desired: Desired) -> str:
    if desired.move == "never":
        return "two-workers"
    if desired.pool is not None:
        return "outside-pool"
    if desired.avoid is not None:
        return "avoided"
    return "one-worker"


def workers_for(
    spec: KeySpec, pools: Mapping[str, tuple[str, ...]], order: list[str]
) -> list[str]:
    """The workers to put ``spec``'s keys on, in ``order`` (worker addresses; ``pools``
    gives each worker's pools): where the rule does not want them, when there is such a
    place."""
    desired = spec.desired
    chosen: list[str] = []
    if spec.placement == "outside-pool":
        chosen = [a for a in order if not set(pools[a]) & set(desired.pool or ())]
    elif spec.placement == "avoided":
        chosen = [a for a in order if set(pools[a]) & set(desired.avoid or ())]
    elif spec.placement == "two-workers":
        chosen = order[:2]
    return chosen or order[:1]
