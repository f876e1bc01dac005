"""Decoding literal tokens: strings with escapes, numbers, sizes, durations and
percentages.

:mod:`amm_rules.language.expr.parser` calls these on lark's tokens; a :class:`LiteralError`
becomes a ``bad-literal`` or ``unknown-unit`` problem at the token (or at the exact
escape inside a string). The size and duration units are those of
:mod:`amm_rules.language.fields`, so that ``512 MiB`` and ``10 min`` mean the same in an
expression and in a YAML value. A number and a unit are one grammar rule (``NUMBER
NAME``): the unit says whether the literal is a size or a duration.
"""

from __future__ import annotations

import math
from decimal import Decimal, InvalidOperation

from amm_rules.language.expr.errors import BAD_LITERAL, UNKNOWN_UNIT
from amm_rules.language.fields import DURATION_UNITS, SIZE_UNITS
from amm_rules.language.spelling import closest

_ESCAPES = {"\\": "\\", '"': '"', "'": "'", "n": "\n", "t": "\t"}


class LiteralError(ValueError):
    """A literal that cannot be decoded. ``offset``/``length`` locate the bad part
    within the token text (the whole token by default)."""

    def __init__(self, message: str, code: str = BAD_LITERAL, offset: int = 0, length: int = 0):
        super().__init__(message)
        self.message = message
        self.code = code
        self.offset = offset
        self.length = length


def decode_string(token: str) -> str:
    """``'"a\\tb"'`` → ``"a<tab>b"``. Only ``\\\\ \\" \\' \\n \\t`` are escapes."""
    body = token[1:-1]
    if "\\" not in body:
        return body
    out: list[str] = []
    i = 0
    while i < len(body):
        ch = body[i]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        nxt = body[i + 1]  # the token pattern guarantees a character after a backslash
        if nxt not in _ESCAPES:
            raise LiteralError(
                f"unknown escape '\\{nxt}' in a string; the escapes are \\\\ \\\" \\' \\n \\t "
                "(write '\\\\' for a backslash)",
                offset=i + 1,
                length=2,
            )
        out.append(_ESCAPES[nxt])
        i += 2
    return "".join(out)


def decode_number(token: str) -> int | float:
    """``"12"`` → 12, ``"1.5"`` → 1.5."""
    if "." not in token:
        return int(token)
    value = float(token)
    if not math.isfinite(value):
        raise LiteralError(f"the number {token} is too large")
    return value


def decode_size(number: str, unit: str) -> int:
    """``("1.5", "GiB")`` → 1610612736 bytes, rounded down to whole bytes."""
    if unit not in SIZE_UNITS:
        hint = closest(unit, [*SIZE_UNITS, *DURATION_UNITS], ignore_case=True)
        # The units of the kind the hint is of; both kinds' when nothing is close.
        if hint in SIZE_UNITS:
            known = "units are " + ", ".join(SIZE_UNITS)
        elif hint in DURATION_UNITS:
            known = "duration units are " + ", ".join(DURATION_UNITS)
        else:
            known = (
                f"size units are {', '.join(SIZE_UNITS)}; "
                f"duration units are {', '.join(DURATION_UNITS)}"
            )
        detail = f"did you mean {hint!r}? ({known})" if hint else known
        raise LiteralError(f"unknown unit {unit!r}; {detail}", code=UNKNOWN_UNIT)
    if number.startswith("-"):
        raise LiteralError(f"a size cannot be negative: {number} {unit}")
    # Decimal, not float: 1.1 kB is exactly 1100 bytes.
    return int(_decimal(number) * SIZE_UNITS[unit])


def decode_duration(number: str, unit: str) -> float:
    """``("10", "min")`` → 600.0 seconds; ``unit`` is one of the duration units."""
    if number.startswith("-"):
        raise LiteralError(f"a duration cannot be negative: {number} {unit}")
    return float(_decimal(number) * Decimal(str(DURATION_UNITS[unit])))


def decode_percent(number: str) -> float:
    """``"30"`` (of ``30%``) → 0.3; only 0% to 100% exist."""
    value = _decimal(number)
    if not 0 <= value <= 100:
        raise LiteralError(f"a percentage is between 0% and 100%, not {number}%")
    return float(value / 100)


def _decimal(number: str) -> Decimal:
    try:
        return Decimal(number)
    except InvalidOperation:  # pragma: no cover - the token pattern admits only decimals
        raise LiteralError(f"{number!r} is not a number") from None
