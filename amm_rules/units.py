"""Sizes, percentages and durations written as YAML values (``512 MiB``, ``30%``, ``30s``).

Used by :mod:`amm_rules.build` for the ``rebalance:`` section. The expression language
(:mod:`amm_rules.expr`) has its own size and percentage literals with the same units;
the tables here are the reference the documentation describes.
"""

from __future__ import annotations

import math
import re

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
_DURATION_EXAMPLE = "expected a duration like '30s' or '500ms', or a number of seconds"


class UnitError(ValueError):
    """A value that is not a size or percentage. ``code`` is ``"unknown-unit"`` when
    only the unit is wrong, else ``"bad-value"``."""

    def __init__(self, message: str, code: str = "bad-value"):
        self.code = code
        super().__init__(message)


def parse_size(value: object) -> int:
    """``"512 MiB"`` → 536870912; an integer is a number of bytes."""
    if isinstance(value, bool):
        raise UnitError(f"expected a size like '512 MiB' or a number of bytes, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if not isinstance(value, str) or not (m := _SIZE.match(value)):
        raise UnitError(f"expected a size like '512 MiB' or a number of bytes, got {value!r}")
    unit = m["unit"] or "B"
    if unit not in SIZE_UNITS:
        from amm_rules.suggest import closest

        near = closest(unit, SIZE_UNITS, ignore_case=True)
        hint = (
            f"; did you mean {near!r}?" if near else f"; expected one of {', '.join(SIZE_UNITS)}"
        )
        raise UnitError(f"unknown size unit {unit!r}{hint}", code="unknown-unit")
    return int(float(m["number"]) * SIZE_UNITS[unit])


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
        raise UnitError(
            f"expected a percentage like '30%' or a fraction from 0 to 1, got {value!r}"
        )
    number = float(m["number"])
    if number > 100:
        raise UnitError(f"a percentage is at most 100%, got {value.strip()}")
    return number / 100


def parse_duration(value: object) -> float:
    """``"30s"`` → 30.0, ``"500ms"`` → 0.5, ``"1.5 min"`` → 90.0; a plain number (or a
    number without a unit) is seconds. Never negative, never NaN or infinite: a timing
    that cannot be compared with a clock is refused here, not discovered mid-cycle."""
    if isinstance(value, bool):
        raise UnitError(f"{_DURATION_EXAMPLE}, got {value!r}")
    if isinstance(value, (int, float)):
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
        raise UnitError(f"{_DURATION_EXAMPLE}, got {value!r}")
    if m["sign"]:
        raise UnitError(f"a duration cannot be negative, got {value.strip()!r}")
    unit = m["unit"] or "s"
    if unit not in DURATION_UNITS:
        from amm_rules.suggest import closest

        near = closest(unit, DURATION_UNITS, ignore_case=True)
        hint = (
            f"; did you mean {near!r}?"
            if near
            else f"; expected one of {', '.join(DURATION_UNITS)}"
        )
        raise UnitError(f"unknown duration unit {unit!r}{hint}", code="unknown-unit")
    return float(m["number"]) * DURATION_UNITS[unit]


def format_fraction(value: float) -> str:
    """0.3 → ``"30%"`` (for messages)."""
    return f"{value * 100:g}%"
