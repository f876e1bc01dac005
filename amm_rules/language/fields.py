"""The values a rules file's fields take, checked and converted in one place.

Two families, shared by rules files, ``amm`` annotations and runtime targets:

- *units*: sizes, percentages and durations written as YAML values (``512 MiB``,
  ``30%``, ``30s``), used by :mod:`amm_rules.language.build` for the ``rebalance:``
  section; the expression language (:mod:`amm_rules.language.expr`) has its own size
  and percentage literals with the same units, read from the tables here;
- *action fields* (``replicate``, ``pool``, ``avoid``, ``spread``, ``move``, ``spill``): the rules
  file is checked structurally by the JSON Schema first (see
  :mod:`amm_rules.language.schema`); annotations arrive as arbitrary Python values from
  a client. Both end here, so that a field means exactly the same thing wherever it is
  written.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping
from typing import Any

from amm_rules.language.ruleset import ACTION_FIELDS, ALL, Actions, Count, Target

# --- units ----------------------------------------------------------------------------

#: Size units, case-sensitive as written in the docs: decimal (kB, MB, ...) and binary (KiB, ...).
SIZE_UNITS: dict[str, int] = {
    "B": 1,
    "kB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
}

#: Duration units, case-sensitive like the size units, in seconds. ``m`` and ``min`` are
#: both minutes (there is no month to confuse them with); no days: no timing of the
#: rules may be longer than one.
DURATION_UNITS: dict[str, float] = {
    "ms": 0.001,
    "s": 1.0,
    "m": 60.0,
    "min": 60.0,
    "h": 3600.0,
}

_SIZE = re.compile(r"^\s*(?P<number>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>[A-Za-z]*)\s*$")
_PERCENT = re.compile(r"^\s*(?P<number>[0-9]+(?:\.[0-9]+)?)\s*%\s*$")
# A leading minus is read, to be refused as negative: clearer than "expected a duration".
_DURATION = re.compile(
    r"^\s*(?P<sign>-?)\s*(?P<number>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>[A-Za-z]*)\s*$"
)
#: A percentage written in words: ``10 percent``, ``10 per cent``, ``10 pct``.
_PERCENT_WORDS = re.compile(
    r"^\s*(?P<number>[0-9]+(?:\.[0-9]+)?)\s*(?:percent|per\s*cent|pct|perc)\.?\s*$", re.I
)
#: A number written as text: ``"3"``, ``" 2.5 "``.
_NUMBER_TEXT = re.compile(r"^\s*-?[0-9]+(?:\.[0-9]+)?\s*$")


def percent_meant(value: object) -> str | None:
    """``"10%"`` for ``"10 percent"`` (``per cent``, ``pct``); None for anything else."""
    if isinstance(value, str) and (m := _PERCENT_WORDS.match(value)):
        return f"{m['number']}%"
    return None


def quoted_number(value: object) -> bool:
    """True for a number in quotes (``replicate: "3"``): text where a number goes."""
    return isinstance(value, str) and _NUMBER_TEXT.match(value) is not None


class UnitError(ValueError):
    """A value that is not a size or percentage. ``code`` is ``"unknown-unit"`` when
    only the unit is wrong, else ``"bad-value"``."""

    def __init__(self, message: str, code: str = "bad-value"):
        self.code = code
        super().__init__(message)


def parse_size(value: object) -> int:
    """``"512 MiB"`` → 536870912; an integer is a number of bytes."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if not isinstance(value, str) or not (m := _SIZE.match(value)):
        raise UnitError(f"expected a size like '512 MiB' or a number of bytes, got {value!r}")
    return int(float(m["number"]) * _unit(m["unit"] or "B", SIZE_UNITS, "size"))


def _unit(unit: str, units: Mapping[str, float], kind: str) -> float:
    """The factor of ``unit`` among ``units``; :class:`UnitError` when it is none of them."""
    if unit not in units:
        from amm_rules.language.spelling import closest

        near = closest(unit, units, ignore_case=True)
        hint = f"; did you mean {near!r}?" if near else f"; expected one of {', '.join(units)}"
        raise UnitError(f"unknown {kind} unit {unit!r}{hint}", code="unknown-unit")
    return units[unit]


_RATE = re.compile(r"^(?P<size>.*?)/\s*s\s*$")


def parse_rate(value: object) -> int:
    """``"1 MiB/s"`` → 1048576 bytes per second; a number is bytes per second."""
    if isinstance(value, str):
        m = _RATE.match(value)
        if m is None or not m["size"].strip():
            raise UnitError(
                f"expected a rate like '1 MiB/s' or a number of bytes per second, got {value!r}"
            )
        return parse_size(m["size"])
    if isinstance(value, float) and not value.is_integer():
        raise UnitError(f"expected a whole number of bytes per second, got {value!r}")
    return parse_size(value)


def parse_budget(value: object) -> tuple[float | None, int | None]:
    """A memory budget: ``"10%"`` (of the cluster's memory limit) → ``(0.1, None)``;
    a size (``"4 GiB"``, or a whole number of bytes) → ``(None, 4294967296)``. Never 0."""
    meant = percent_meant(value)
    if meant is not None:
        assert isinstance(value, str)
        unit = value.strip().lstrip("0123456789.").strip()
        raise UnitError(
            f"unknown unit {unit!r}; did you mean {meant!r}? (a share of the cluster's memory)",
            code="unknown-unit",
        )
    if isinstance(value, str) and value.strip().endswith("%"):
        fraction = parse_fraction(value)
        if fraction <= 0:
            raise UnitError(f"a budget must be more than 0%, got {value.strip()!r}")
        return fraction, None
    if isinstance(value, float) and not value.is_integer():
        raise UnitError(
            f"expected a percentage like '10%' or a size like '4 GiB', got {value!r}; "
            f"write '{value * 100:g}%' for a share of the cluster's memory"
        )
    size = parse_size(value)
    if size < 1:
        raise UnitError(f"a budget must be at least 1 byte, got {value!r}")
    return None, size


def parse_fraction(value: object) -> float:
    """``"30%"`` → 0.3; a plain number between 0 and 1 is taken as the fraction itself."""
    if isinstance(value, bool):
        raise UnitError(
            f"expected a percentage like '30%' or a fraction from 0 to 1, got {value!r}"
        )
    if isinstance(value, (int, float)):
        if not (math.isfinite(value) and 0 <= value <= 1):
            raise UnitError(
                f"a plain number is a fraction from 0 to 1, got {value!r}; write '{value}%' "
                "for a percentage"
            )
        return float(value)
    if not isinstance(value, str) or not (m := _PERCENT.match(value)):
        meant = percent_meant(value)
        hint = f"; did you mean {meant!r}?" if meant is not None else ""
        raise UnitError(
            f"expected a percentage like '30%' or a fraction from 0 to 1, got {value!r}{hint}"
        )
    number = float(m["number"])
    if number > 100:
        raise UnitError(f"a percentage is at most 100%, got {value.strip()}")
    return number / 100


def parse_duration(value: object) -> float:
    """``"30s"`` → 30.0, ``"500ms"`` → 0.5, ``"1.5 min"`` → 90.0; a plain number (or a
    number without a unit) is seconds. Never negative, never NaN or infinite: a timing
    that cannot be compared with a clock is refused here, not discovered mid-cycle."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            seconds = float(value)
        except OverflowError:  # an integer beyond any float
            seconds = math.inf if value > 0 else -math.inf
        if math.isnan(seconds) or seconds < 0:
            what = "cannot be negative" if seconds < 0 else "must be a number of seconds"
            raise UnitError(f"a duration {what}, got {value!r}")
        if math.isinf(seconds):
            raise UnitError(f"a duration must be a finite number of seconds, got {value!r}")
        return seconds + 0.0  # -0.0 → 0.0
    if not isinstance(value, str) or not (m := _DURATION.match(value)):
        raise UnitError(
            f"expected a duration like '30s' or '500ms', or a number of seconds, got {value!r}"
        )
    if m["sign"]:
        raise UnitError(f"a duration cannot be negative, got {value.strip()!r}")
    return float(m["number"]) * _unit(m["unit"] or "s", DURATION_UNITS, "duration")


def format_fraction(value: float) -> str:
    """0.3 → ``"30%"`` (for messages)."""
    return f"{value * 100:g}%"


# --- action fields --------------------------------------------------------------------

#: Upper bound on any replication target; larger numbers are almost certainly mistakes
#: and would only ever be "unmet".
MAX_REPLICAS = 10_000
#: Pool names: identifiers, with ``-`` allowed after the first character.
POOL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")
SPREAD_VALUES = ("host", "none")
MOVE_VALUES = ("allowed", "never")
SPILL_VALUES = ("first", "last")
#: ``enforcement`` of a rules file, a rule or the rebalance section: ``enforce`` acts,
#: ``dry-run`` classifies, plans and reports without acting.
ENFORCEMENT_VALUES = ("enforce", "dry-run")


class ActionError(ValueError):
    """An invalid action field. ``field`` names it (``replicate``, ``replicate.min``...)."""

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


def _count(value: Any, field: str) -> int:
    if isinstance(value, str) and value.strip().lower() == ALL and value != ALL:
        raise ActionError(field, f"write 'all' in lower case, got {value!r}")
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        else:
            raise ActionError(field, f"expected a whole number of copies, got {value!r}")
    if value < 1:
        raise ActionError(
            field, f"must be at least 1 (the AMM never drops the last copy), got {value}"
        )
    if value > MAX_REPLICAS:
        raise ActionError(field, f"must be at most {MAX_REPLICAS}, got {value}")
    return value


def _bound(value: Any, field: str) -> Count:
    """A number of copies, or ``"all"`` (every eligible worker)."""
    if value == ALL and isinstance(value, str):
        return ALL
    try:
        return _count(value, field)
    except ActionError as exc:
        if isinstance(value, str) and "lower case" not in exc.message:
            raise ActionError(
                field, f"expected a whole number of copies or 'all', got {value!r}"
            ) from None
        raise


def parse_target(value: Any, field: str = "replicate") -> Target:
    """``3`` → ``Target(3, 3)``; ``{"min": 2, "max": 5}`` → ``Target(2, 5)``;
    ``"all"`` → ``Target("all", "all")``; ``{"min": 2, "max": "all"}`` →
    ``Target(2, "all")``."""
    if isinstance(value, Mapping):
        unknown = sorted(str(k) for k in value if k not in ("min", "max"))
        if unknown:
            raise ActionError(field, f"unknown key {unknown[0]!r}; expected 'min' and/or 'max'")
        if not value:
            raise ActionError(field, "expected at least one of 'min' and 'max'")
        lo = _bound(value["min"], f"{field}.min") if "min" in value else 1
        hi = _bound(value["max"], f"{field}.max") if "max" in value else None
        if hi is not None and hi != ALL and (lo == ALL or hi < lo):
            raise ActionError(field, f"max ({hi}) is below min ({lo})")
        return Target(lo, hi)
    return Target.exact(_bound(value, field))


def parse_pools(value: Any, field: str, known: Collection[str] | None) -> tuple[str, ...]:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)) or not names:
        raise ActionError(
            field, f"expected a pool name or a non-empty list of them, got {value!r}"
        )
    for name in names:
        if not isinstance(name, str) or not POOL_NAME.match(name):
            raise ActionError(field, f"{name!r} is not a pool name")
        if known is not None and name not in known:
            raise ActionError(field, unknown_pool_message(name, known))
    return tuple(dict.fromkeys(names))  # without repeats, in order


def unknown_pool_message(name: str, known: Collection[str]) -> str:
    from amm_rules.language.spelling import did_you_mean

    if not known:
        return f"unknown pool {name!r}: no pools are defined"
    return f"unknown pool {name!r}{did_you_mean(name, known)}"


def _choice(value: Any, field: str, allowed: tuple[str, ...]) -> Any:
    if value not in allowed or not isinstance(value, str):
        expected = " or ".join(repr(a) for a in allowed)
        raise ActionError(field, f"expected {expected}, got {value!r}")
    return value


def parse_actions(value: Any, known_pools: Collection[str] | None = None) -> Actions:
    """Check and convert a mapping of action fields.

    ``known_pools`` is the set of pool names that may be named; ``None`` skips that
    check (a client checking an annotation does not know the scheduler's pools).
    Raises :class:`ActionError` for the first problem found.
    """
    if not isinstance(value, Mapping):
        raise ActionError(
            "amm", f"expected a mapping of action fields, got {type(value).__name__}"
        )
    for key in value:
        if key not in ACTION_FIELDS:
            from amm_rules.language.spelling import did_you_mean

            raise ActionError(
                str(key),
                f"unknown action field{did_you_mean(str(key), ACTION_FIELDS)}; "
                f"expected one of {', '.join(ACTION_FIELDS)}",
            )
    if not value:
        raise ActionError("amm", f"expected at least one of {', '.join(ACTION_FIELDS)}")
    return Actions(
        replicate=parse_target(value["replicate"]) if "replicate" in value else None,
        pool=parse_pools(value["pool"], "pool", known_pools) if "pool" in value else None,
        avoid=parse_pools(value["avoid"], "avoid", known_pools) if "avoid" in value else None,
        spread=_choice(value["spread"], "spread", SPREAD_VALUES) if "spread" in value else None,
        move=_choice(value["move"], "move", MOVE_VALUES) if "move" in value else None,
        spill=_choice(value["spill"], "spill", SPILL_VALUES) if "spill" in value else None,
    )
