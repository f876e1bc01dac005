"""Validation against :data:`amm_rules.language.schema.SCHEMA`, with messages for humans.

jsonschema's own messages ("... is not valid under any of the given schemas") name
validator keywords; this module rewrites the common ones (type, const, enum, required,
additionalProperties, propertyNames, minimum/maximum, minItems, uniqueItems,
minProperties, minLength/maxLength, pattern, oneOf, anyOf) into sentences about the
rules file, and says *where*: the path of the offending value, or of the offending key
for unknown fields and bad pool names. :mod:`amm_rules.language.locator` turns paths into file
positions.

jsonschema is imported on first use, so that ``import amm_rules`` stays cheap.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from amm_rules.language.schema import SCHEMA
from amm_rules.language.spelling import did_you_mean

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
_SECTIONS = {
    "rules": "rule",
    "pools": "pool",
    "rebalance": "rebalance section",
    "paused-workers": "paused-workers section",
}
#: Top-level mappings of settings: a field in them is named without the section.
_SETTINGS_SECTIONS = ("rebalance", "paused-workers")


@dataclass(frozen=True)
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


def schema_problems(data: Any) -> list[SchemaProblem]:
    """Every structural problem of ``data`` (plain data read from a rules file)."""
    out: list[SchemaProblem] = []
    for error in _validator().iter_errors(data):
        out.extend(_translate(error))
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


def field_label(path: Path) -> str:
    """The field a path names, relative to its entry: ``replicate.min``, ``gap``."""
    if path and path[0] in ("rules", "pools"):
        rel = path[2:] if len(path) >= 2 else path
    elif path and path[0] in _SETTINGS_SECTIONS and len(path) >= 2:
        rel = path[1:]
    else:
        rel = path
    return ".".join(str(p) for p in rel if not isinstance(p, int))


def _say(path: Path, message: str) -> str:
    label = field_label(path)
    return f"{label}: {message}" if label else message


def _entry_kind(path: Path) -> str:
    """``rule``, ``pool``, ``rebalance section``, ``paused-workers section``, or ``rules
    file`` for the top level."""
    if not path:
        return "rules file"
    if path[0] in _SETTINGS_SECTIONS:
        return _SECTIONS[path[0]]
    return _SECTIONS.get(path[0], "rules file") if len(path) >= 2 else "rules file"


def _translate(error: Any) -> Iterable[SchemaProblem]:  # noqa: C901 - a flat list of cases
    path: Path = tuple(error.absolute_path)
    kind = error.validator
    value = error.validator_value
    instance = error.instance
    schema = error.schema if isinstance(error.schema, dict) else {}

    # 1. A pool name (a mapping key) that is not a valid name: point at the key.
    if "propertyNames" in error.schema_path:
        message = schema.get("errorMessage", "not a valid name")
        yield SchemaProblem(
            (*path, instance),
            f"invalid pool name {instance!r}: {message}",
            "bad-name",
            at_key=True,
        )
        return
    # 2. Unknown fields: one problem per key, at the key, with a suggestion.
    if kind == "additionalProperties":
        allowed = list(error.schema.get("properties", {}))
        for key in instance:
            if key in allowed:
                continue
            hint = did_you_mean(str(key), allowed) or f"; expected one of {', '.join(allowed)}"
            where = "top-level field" if not path else "field"
            yield SchemaProblem(
                (*path, key), f"unknown {where} '{key}'{hint}", "unknown-field", at_key=True
            )
        return
    # 3. Missing fields, reported at the mapping that lacks them.
    if kind == "required":
        for name in value:
            if isinstance(instance, dict) and name not in instance:
                if not path:
                    yield SchemaProblem(
                        path,
                        f"missing required field '{name}'; a rules file starts with 'version: 1'",
                        "missing-field",
                    )
                else:
                    yield SchemaProblem(
                        path,
                        f"{_entry_kind(path)} is missing required field '{name}'",
                        "missing-field",
                    )
        return
    # 4. A rule without any action field.
    if kind == "anyOf" and all(set(branch) == {"required"} for branch in value):
        fields = ", ".join(branch["required"][0] for branch in value)
        yield SchemaProblem(path, f"rule has no action; set at least one of {fields}", "no-action")
        return
    # 5. Alternatives (replicate, pool lists, percentages, sizes): if the value has the
    #    type of one alternative, explain what is wrong within it; else list them.
    if kind in ("oneOf", "anyOf"):
        by_branch: dict[int, list[Any]] = defaultdict(list)
        for sub in error.context:
            by_branch[sub.relative_schema_path[0]].append(sub)
        for index in sorted(by_branch):
            errors = by_branch[index]
            if not any(e.validator == "type" and not e.relative_path for e in errors):
                for sub in errors:
                    yield from _translate(sub)
                return
        titles = [b.get("title") or _type_name(b.get("type")) for b in value]
        yield SchemaProblem(
            path,
            _say(path, f"expected {' or '.join(titles)}, got {describe(instance)}"),
            "wrong-type",
        )
        return
    # 6. Single-keyword failures.
    if kind == "type":
        if "expression" in str(schema.get("title", "")):
            expected = "an expression (text)"
        else:
            expected = _type_name(value)
        yield SchemaProblem(
            path, _say(path, f"expected {expected}, got {describe(instance)}"), "wrong-type"
        )
    elif kind == "const":
        if path == ("version",):
            yield SchemaProblem(
                path,
                f"unsupported version {describe(instance)}; this release reads version {value}",
                "bad-version",
            )
        else:
            yield SchemaProblem(path, _say(path, f"expected {value!r}"), "bad-value")
    elif kind == "enum":
        hint = did_you_mean(str(instance), [str(v) for v in value])
        choices = " or ".join(repr(v) for v in value)
        yield SchemaProblem(
            path, _say(path, f"expected {choices}, got {describe(instance)}{hint}"), "bad-value"
        )
    elif kind in ("minimum", "maximum", "exclusiveMinimum"):
        bound = {"minimum": "at least", "maximum": "at most", "exclusiveMinimum": "more than"}[
            kind
        ]
        why = ""
        if field_label(path).startswith("replicate") and kind == "minimum":
            why = " (the AMM never drops the last copy)"
        yield SchemaProblem(
            path,
            _say(path, f"must be {bound} {value}{why}, got {describe(instance)}"),
            "bad-value",
        )
    elif kind == "minItems":
        count = "one entry" if value == 1 else f"{value} entries"
        yield SchemaProblem(
            path,
            _say(
                path,
                f"expected at least {count}, got "
                f"{'an empty list' if not instance else len(instance)}",
            ),
            "bad-value",
        )
    elif kind == "uniqueItems":
        seen: list[Any] = []
        for index, item in enumerate(instance):
            if item in seen:
                yield SchemaProblem(
                    (*path, index),
                    _say(path, f"{describe(item)} is listed twice"),
                    "duplicate-item",
                )
            seen.append(item)
    elif kind == "minProperties":
        names = ", ".join(repr(p) for p in schema.get("properties", {}))
        yield SchemaProblem(path, _say(path, f"expected at least one of {names}"), "bad-value")
    elif kind == "minLength":
        yield SchemaProblem(path, _say(path, "must not be empty"), "bad-value")
    elif kind == "maxLength":
        yield SchemaProblem(path, _say(path, f"must be at most {value} characters"), "bad-value")
    elif kind == "pattern":
        message = schema.get("errorMessage", f"does not match {value}")
        yield SchemaProblem(path, _say(path, f"{message}, got {describe(instance)}"), "bad-value")
    else:  # a keyword this module does not know: still a readable, positioned message
        yield SchemaProblem(path, _say(path, error.message), "schema")


def _type_name(value: Any) -> str:
    if isinstance(value, list):
        return " or ".join(_TYPE_NAMES.get(v, v) for v in value)
    return _TYPE_NAMES.get(value, str(value))
