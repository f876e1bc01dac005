"""YAML value units: durations (:func:`parse_duration`, the ``rebalance:`` section's and
others') and rates (:func:`parse_rate`, the ``adaptive:`` section's ``disk-rate``)."""

from __future__ import annotations

import math

import pytest

from amm_rules.language.fields import DURATION_UNITS, UnitError, parse_duration, parse_rate


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("30s", 30.0),
        ("30 s", 30.0),
        ("  30s  ", 30.0),
        ("500ms", 0.5),
        ("1.5 min", 90.0),
        ("2m", 120.0),
        ("1h", 3600.0),
        ("0.25h", 900.0),
        ("30", 30.0),  # text without a unit is seconds, like a plain number
        ("0s", 0.0),
        (0, 0.0),
        (45, 45.0),
        (12.5, 12.5),
        (-0.0, 0.0),
    ],
)
def test_parse_duration(value: object, seconds: float) -> None:
    parsed = parse_duration(value)
    assert parsed == seconds and isinstance(parsed, float)
    assert math.copysign(1.0, parsed) == 1.0  # never -0.0


@pytest.mark.parametrize(
    ("value", "code", "words"),
    [
        ("-1s", "bad-value", "a duration cannot be negative, got '-1s'"),
        (" - 5 min", "bad-value", "cannot be negative"),
        (-1, "bad-value", "a duration cannot be negative, got -1"),
        (-0.5, "bad-value", "cannot be negative"),
        (-math.inf, "bad-value", "cannot be negative"),
        (math.nan, "bad-value", "a duration must be a number of seconds, got nan"),
        (math.inf, "bad-value", "a duration must be a finite number of seconds, got inf"),
        (10**400, "bad-value", "must be a finite number of seconds"),
        (True, "bad-value", "expected a duration like '30s' or '500ms', or a number of seconds"),
        (False, "bad-value", "got False"),
        (None, "bad-value", "got None"),
        ("soon", "bad-value", "expected a duration like '30s'"),
        ("", "bad-value", "expected a duration"),
        ("+5s", "bad-value", "expected a duration"),
        ("1e3s", "bad-value", "expected a duration"),
        ("30 s s", "bad-value", "expected a duration"),
        ("30S", "unknown-unit", "unknown duration unit 'S'; did you mean 's'?"),
        ("1 MIN", "unknown-unit", "did you mean 'min'?"),
        ("3 days", "unknown-unit", "expected one of ms, s, m, min, h"),
        ("30 sec", "unknown-unit", "unknown duration unit 'sec'"),
    ],
)
def test_parse_duration_refuses(value: object, code: str, words: str) -> None:
    with pytest.raises(UnitError) as info:
        parse_duration(value)
    assert info.value.code == code
    assert words in str(info.value)


def test_every_duration_unit_reads() -> None:
    for unit, seconds in DURATION_UNITS.items():
        assert parse_duration(f"2{unit}") == pytest.approx(2 * seconds)
        assert parse_duration(f"2 {unit}") == pytest.approx(2 * seconds)


@pytest.mark.parametrize(
    ("value", "rate"),
    [("1 MiB/s", 2**20), ("1MiB/s", 2**20), (" 2.5 kB / s ", 2500), ("10/s", 10), (4000, 4000)],
)
def test_parse_rate(value: object, rate: int) -> None:
    assert parse_rate(value) == rate


@pytest.mark.parametrize(
    ("value", "code", "words"),
    [
        ("10 MiB", "bad-value", "expected a rate like '1 MiB/s'"),
        ("/s", "bad-value", "expected a rate like '1 MiB/s'"),
        ("3 parsecs/s", "unknown-unit", "unknown size unit 'parsecs'"),
        ("1 mib/s", "unknown-unit", "did you mean 'MiB'?"),
        (1.5, "bad-value", "expected a whole number of bytes per second, got 1.5"),
        (True, "bad-value", "got True"),
    ],
)
def test_parse_rate_refuses(value: object, code: str, words: str) -> None:
    with pytest.raises(UnitError) as info:
        parse_rate(value)
    assert info.value.code == code
    assert words in str(info.value)
