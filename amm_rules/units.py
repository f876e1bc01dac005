"""Sizes and percentages written as YAML values (``512 MiB``, ``30%``).

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

_SIZE = re.compile(r"^\s*(?P<number>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>[A-Za-z]*)\s*$")
_PERCENT = re.compile(r"^\s*(?P<number>[0-9]+(?:\.[0-9]+)?)\s*%\s*$")


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


def format_fraction(value: float) -> str:
    """0.3 → ``"30%"`` (for messages)."""
    return f"{value * 100:g}%"
