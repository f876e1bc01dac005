"""The words of the package's sentences (amm_rules.engine.words, with the plural rule of
amm_rules.language.plurals): dask's sizes, dask's durations from ten minutes up and
readable ones below, counts with nouns."""

from __future__ import annotations

import pytest
from dask.utils import format_bytes, format_time

from amm_rules.engine.words import ago, bytes_per_second, duration, signed_size, size
from amm_rules.language.plurals import counted, plural


@pytest.mark.parametrize("n", [0, 1, 1000, 2 * 2**20, 1_234_567_890, 3 * 2**50])
def test_sizes_are_dasks(n):
    assert size(n) == format_bytes(n)
    assert size(-n) == ("-" + format_bytes(n) if n else "0 B")


def test_sizes_with_a_sign_and_rates():
    assert size(2 * 2**20) == "2.00 MiB"
    assert signed_size(-8_000_000) == "-7.63 MiB"
    assert signed_size(16 * 2**20) == "+16.00 MiB"
    assert signed_size(None) == "-"
    assert bytes_per_second(40 * 2**20) == "40.00 MiB/s"


@pytest.mark.parametrize(
    ("seconds", "words"),
    [
        (None, "unknown"),
        (float("inf"), "forever"),
        (0, "0 ms"),
        (0.0004, "0.4 ms"),
        (0.0032, "3.2 ms"),
        (0.029, "29 ms"),  # ms below a second, whole from ten
        (0.45, "450 ms"),
        (0.9996, "1.0 s"),
        (2.5, "2.5 s"),
        (12, "12 s"),
        (95.4, "95 s"),
        (600, "600 s"),
        (-3, "-3.0 s"),
    ],
)
def test_durations_below_ten_minutes(seconds, words):
    assert duration(seconds) == words


@pytest.mark.parametrize("seconds", [601, 1234.5, 12345.6, 123456.7, 1234567.8])
def test_durations_from_ten_minutes_are_dasks(seconds):
    assert duration(seconds) == format_time(seconds)
    assert duration(1234.5) == "20m 34s"


def test_ages():
    assert ago(3) == "3.0 s ago"
    assert ago(1234.5) == "20m 34s ago"
    assert ago(0.2) == ago(-5) == "just now"  # (clocks apart: never "in the future")


@pytest.mark.parametrize(
    ("n", "noun", "words"),
    [
        (0, "key", "0 keys"),
        (1, "key", "1 key"),
        (2, "key", "2 keys"),
        (1, "copy", "1 copy"),
        (3, "copy", "3 copies"),
        (2, "day", "2 days"),
        (2, "prefix", "2 prefixes"),
        (1_200, "worker", "1,200 workers"),
        (2, "more line", "2 more lines"),
    ],
)
def test_counts_with_nouns(n, noun, words):
    assert counted(n, noun) == words


def test_a_plural_the_rule_does_not_make():
    assert plural(1, "was", "were") == "was"
    assert plural(2, "was", "were") == "were"
    assert counted(2, "child", "children") == "2 children"
