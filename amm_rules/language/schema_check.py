"""Validation against :data:`amm_rules.language.schema.SCHEMA`, with messages for humans.

jsonschema's own messages ("... is not valid under any of the given schemas") name
validator keywords; this module rewrites those the schema uses into sentences about the
rules file, and says *where*: the path of the offending value, or of the offending key
for unknown fields and bad pool names. :mod:`amm_rules.language.locator` turns paths into
file positions.

jsonschema is imported on first use, so that ``import amm_rules`` stays cheap.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from amm_rules.language.fields import percent_meant, quoted_number
from amm_rules.language.records import record
from amm_rules.language.ruleset import ACTION_FIELDS
from amm_rules.language.schema import SCHEMA
from amm_rules.language.spelling import closest, did_you_mean

Path = tuple[Any, ...]

_TYPE_NAMES = {
    "string": "a string",
    "integer": "a whole number",
    "number": "a number",
    "boolean": "true or false",
    "object": "a mapping",
    "array": "a list",
    "null": "null",
}


@record(frozen=True)
class FileWords:
    """How messages name the parts of one kind of file (rules files; the test files of
    ``amm-rules test`` have their own)."""

    #: What the file is called: ``"rules file"``.
    file: str
    #: Top-level sections whose entries are named, and what an entry is called
    #: (``rules`` -> ``rule``); fields are then named relative to the entry.
    entries: Mapping[str, str]
    #: Top-level mappings of settings, and what they are called; a field in them is
    #: named without the section.
    mappings: Mapping[str, str]
    #: Hints after "missing required field 'NAME'" at the top level, by name.
    top_hints: Mapping[str, str]


RULES_FILE = FileWords(
    "rules file",
    {"rules": "rule", "pools": "pool"},
    {
        "rebalance": "rebalance section",
        "paused-workers": "paused-workers section",
        "demand": "demand section",
    },
    {"version": "a rules file starts with 'version: 1'"},
)


@record(frozen=True)
class SchemaProblem:
    """A structural problem at ``path`` (at its key when ``at_key``)."""

    path: Path
    message: str
    code: str
    at_key: bool = False


@functools.lru_cache(maxsize=1)
def _validator() -> Any:
    from jsonschema import Draft202012Validator

    return Draft202012Validator(SCHEMA)


def schema_problems(
    data: Any, validator: Any = None, words: FileWords = RULES_FILE
) -> list[SchemaProblem]:
    """Every structural problem of ``data`` (plain data read from a rules file, or from
    another kind of file with its own ``validator`` and ``words``)."""
    out: list[SchemaProblem] = []
    for error in (validator or _validator()).iter_errors(data):
        out.extend(_translate(error, words))
    return list(dict.fromkeys(out))  # drop repeats, keep order


def describe(value: Any) -> str:
    """How a value is named in a message."""
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if value is None:
        return "an empty value"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return repr(value if len(value) <= 40 else value[:37] + "...")
    return str(value)


def field_label(path: Path, words: FileWords = RULES_FILE) -> str:
    """The field a path names, relative to its entry: ``replicate.min``, ``gap``."""
    if path and path[0] in words.entries:
        rel = path[2:] if len(path) >= 2 else path
    elif path and path[0] in words.mappings and len(path) >= 2:
        rel = path[1:]
    else:
        rel = path
    return ".".join(str(p) for p in rel if not isinstance(p, int))


def _say_in(path: Path, message: str, words: FileWords = RULES_FILE) -> str:
    label = field_label(path, words)
    return f"{label}: {message}" if label else message


def _entry_kind(path: Path, words: FileWords = RULES_FILE) -> str:
    """``rule``, ``pool``, ``rebalance section``, ``paused-workers section``, or ``rules
    file`` for the top level."""
    if not path:
        return words.file
    if path[0] in words.mappings:
        return words.mappings[path[0]]
    return words.entries.get(path[0], words.file) if len(path) >= 2 else words.file


def _translate(error: Any, words: FileWords = RULES_FILE) -> Iterable[SchemaProblem]:
    """One jsonschema error as the problems a person reads, in the words of a rules file.

    The cases, in order (the first that fits decides; each function's docstring says
    more): 1. a pool name that is not a valid name; 2. unknown fields; 3. missing
    required fields; 4. a rule without any action field; 5. a value that fits none of
    several alternatives; 6. any other single keyword (type, const, enum, bounds...).
    """
    path: Path = tuple(error.absolute_path)
    kind = error.validator
    if "propertyNames" in error.schema_path:
        return [_bad_name(error, path)]
    if kind == "additionalProperties":
        return _unknown_fields(error, path)
    if kind == "required":
        return _missing_fields(error, path, words)
    if kind == "anyOf" and all(set(branch) == {"required"} for branch in error.validator_value):
        return [] if _misspelt_action(error) else [_no_action(error, path)]
    if kind in ("oneOf", "anyOf"):
        return _alternatives(error, path, words)
    return _single_keyword(error, path, words)


def _schema(error: Any) -> dict[str, Any]:
    """The schema that failed, as a mapping (``{}`` for a boolean schema)."""
    return error.schema if isinstance(error.schema, dict) else {}


def _bad_name(error: Any, path: Path) -> SchemaProblem:
    """Case 1: jsonschema reports a bad mapping key at the mapping; the problem is the
    key itself, so it is placed there, with the schema's own words for a valid name."""
    name = error.instance
    message = _schema(error).get("errorMessage", "not a valid name")
    return SchemaProblem(
        (*path, name), f"invalid pool name {name!r}: {message}", "bad-name", at_key=True
    )


def _unknown_fields(error: Any, path: Path) -> Iterable[SchemaProblem]:
    """Case 2: jsonschema reports every unknown field of a mapping at once; each gets its
    own problem at its own key, with the nearest known name (a typo, most often) or the
    list of the known ones."""
    allowed = list(error.schema.get("properties", {}))
    for key in error.instance:
        if key in allowed:
            continue
        hint = did_you_mean(str(key), allowed) or f"; expected one of {', '.join(allowed)}"
        where = "top-level field" if not path else "field"
        yield SchemaProblem(
            (*path, key), f"unknown {where} '{key}'{hint}", "unknown-field", at_key=True
        )


def _missing_fields(error: Any, path: Path, words: FileWords) -> Iterable[SchemaProblem]:
    """Case 3: missing fields, at the mapping that lacks them (they have no position of
    their own). A file missing a top-level field most likely lacks ``version: 1``, the
    only one required: say how a rules file starts."""
    instance = error.instance
    for name in error.validator_value:
        if isinstance(instance, dict) and name not in instance:
            if not path:
                hint = words.top_hints.get(name)
                message = f"missing required field '{name}'" + (f"; {hint}" if hint else "")
            else:
                message = f"{_entry_kind(path, words)} is missing required field '{name}'"
            yield SchemaProblem(path, message, "missing-field")


def _no_action(error: Any, path: Path) -> SchemaProblem:
    """Case 4: the schema says "one of these fields is required" as an ``anyOf`` of
    ``required`` branches; jsonschema's message lists the branches, a person wants the
    fields."""
    fields = ", ".join(branch["required"][0] for branch in error.validator_value)
    return SchemaProblem(path, f"rule has no action; set at least one of {fields}", "no-action")


def _misspelt_action(error: Any) -> bool:
    """Case 4's exception: the rule has an unknown field whose nearest known name is an
    action field (``replicas: 2``). That field is the cause of "no action", and its own
    problem says which action was meant. (``required`` fails only on a mapping.)"""
    rule = error.instance
    known = list(_schema(error).get("properties", {}))
    return any(key not in known and closest(str(key), known) in ACTION_FIELDS for key in rule)


def _alternatives(error: Any, path: Path, words: FileWords) -> Iterable[SchemaProblem]:
    """Case 5: a value that fits none of several alternatives (replicate, pool lists,
    percentages, sizes). If it has the type of one alternative, that is the one meant:
    explain what is wrong within it. Else list the alternatives by name."""
    by_branch: dict[int, list[Any]] = defaultdict(list)
    for sub in error.context:
        by_branch[sub.relative_schema_path[0]].append(sub)
    for index in sorted(by_branch):
        errors = by_branch[index]
        if not any(e.validator == "type" and not e.relative_path for e in errors):
            for sub in errors:
                yield from _translate(sub, words)
            return
    titles = [b.get("title") or _type_name(b.get("type")) for b in error.validator_value]
    yield SchemaProblem(
        path,
        _say_in(path, f"expected {' or '.join(titles)}, got {describe(error.instance)}", words),
        "wrong-type",
    )


def _single_keyword(error: Any, path: Path, words: FileWords) -> list[SchemaProblem]:  # noqa: C901 - a flat list of keywords
    """Case 6: one keyword failed; say what it expects in the rules file's words (a
    "whole number", not an "integer"), with the value found. A keyword this module does
    not know still gets a positioned problem, with jsonschema's own message."""
    kind = error.validator
    value = error.validator_value
    instance = error.instance
    schema = _schema(error)
    code = "bad-value"
    if kind == "type":
        expression = "expression" in str(schema.get("title", ""))
        expected = "an expression (text)" if expression else _type_name(value)
        message = f"expected {expected}, got {describe(instance)}{_value_hint(error, path)}"
        code = "wrong-type"
    elif kind == "const" and path == ("version",):
        return [
            SchemaProblem(
                path,
                f"unsupported version {describe(instance)}; this release reads version {value}",
                "bad-version",
            )
        ]
    elif kind == "const":
        message = f"expected {value!r}"
    elif kind == "enum":
        hint = did_you_mean(str(instance), [str(v) for v in value])
        choices = " or ".join(repr(v) for v in value)
        message = f"expected {choices}, got {describe(instance)}{hint}"
    elif kind in ("minimum", "maximum", "exclusiveMinimum"):
        bound = {"minimum": "at least", "maximum": "at most", "exclusiveMinimum": "more than"}[
            kind
        ]
        why = hint = ""
        if field_label(path, words).startswith("replicate") and kind == "minimum":
            why = " (the AMM never drops the last copy)"
        if (
            kind == "maximum"
            and schema.get("title") == "a fraction from 0 to 1"
            and isinstance(instance, (int, float))
            and not isinstance(instance, bool)
            and 1 < instance <= 100
        ):
            # sender-min: 30 most likely means 30%: say how to write it.
            hint = f"; did you mean '{instance:g}%'? (a plain number is a fraction)"
        message = f"must be {bound} {value}{why}, got {describe(instance)}{hint}"
    elif kind == "minItems":
        count = "one entry" if value == 1 else f"{value} entries"
        got = "an empty list" if not instance else len(instance)
        message = f"expected at least {count}, got {got}"
    elif kind == "maxItems":
        message = f"expected at most {value:,} entries, got {len(instance):,}"
        code = "too-long"
    elif kind == "uniqueItems":
        twice = [i for i, item in enumerate(instance) if item in instance[:i]]
        return [
            SchemaProblem(
                (*path, i),
                _say_in(path, f"{describe(instance[i])} is listed twice", words),
                "duplicate-item",
            )
            for i in twice
        ]
    elif kind == "minProperties":
        names = ", ".join(repr(p) for p in schema.get("properties", {}))
        message = f"expected at least one of {names}"
    elif kind == "minLength":
        message = "must not be empty"
    elif kind == "maxLength":
        message = f"must be at most {value} characters"
    elif kind == "pattern":
        got = describe(instance) + _value_hint(error, path)
        message = f"{schema.get('errorMessage', f'does not match {value}')}, got {got}"
    else:  # a keyword this module does not know: still a readable, positioned message
        text = error.message  # it quotes the value, which may be large: clipped
        message = text if len(text) <= 300 else text[:300] + "..."
        code = "schema"
    return [SchemaProblem(path, _say_in(path, message, words), code)]


def _value_hint(error: Any, path: Path) -> str:
    """What a refused text probably meant: a number in quotes where a number goes
    (``; drop the quotes: ... (replicate: 3)``), a percentage in words (``; did you
    mean '10%'?``); empty otherwise."""
    instance = error.instance
    if quoted_number(instance) and _takes_a_number(error):
        name = path[-1] if path and isinstance(path[-1], str) else None
        written = f"{name}: {instance.strip()}" if name else instance.strip()
        return f"; drop the quotes: a number in quotes is text ({written})"
    meant = percent_meant(instance)
    return f"; did you mean {meant!r}?" if meant is not None else ""


def _takes_a_number(error: Any) -> bool:
    """Whether the schema that failed, or another alternative of the same value, takes
    a number (``replicate``: a number of copies or 'all')."""
    schemas = [_schema(error)]
    parent = getattr(error, "parent", None)
    if parent is not None and parent.validator in ("oneOf", "anyOf"):
        schemas += [b for b in parent.validator_value if isinstance(b, dict)]
    for schema in schemas:
        kinds = schema.get("type")
        if {"integer", "number"} & set(kinds if isinstance(kinds, list) else [kinds]):
            return True
    return False


def _type_name(value: Any) -> str:
    if isinstance(value, list):
        return " or ".join(_TYPE_NAMES.get(v, str(v)) for v in value)
    return _TYPE_NAMES.get(value, str(value))
