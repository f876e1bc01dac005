"""The glob matcher behind ``matches``: semantics, errors, and adversarial input.

fnmatch.fnmatchcase serves as the reference for patterns both accept; the matcher
must also stay correct (and linear) on patterns that make backtracking matchers blow
up. Tests assert results only, never wall time.
"""

from __future__ import annotations

import fnmatch

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amm_rules.language.expr.glob import GlobError, compile_glob, glob_match, regex_meant


@pytest.mark.parametrize(
    ("pattern", "text", "expected"),
    [
        ("", "", True),
        ("", "a", False),
        ("abc", "abc", True),
        ("abc", "abcd", False),
        ("*", "", True),
        ("*", "anything/at.all", True),
        ("a*", "abc", True),
        ("a*", "ba", False),
        ("*c", "abc", True),
        ("*b*", "abc", True),
        ("*b*", "acd", False),
        ("a*c", "ac", True),
        ("a*c", "abbbc", True),
        ("a*c", "abbbd", False),
        ("a**c", "abc", True),
        ("?", "a", True),
        ("?", "", False),
        ("??", "a", False),
        ("a?c", "abc", True),
        ("a?c", "a\nc", True),
        ("[abc]", "b", True),
        ("[abc]", "d", False),
        ("[!abc]", "d", True),
        ("[!abc]", "a", False),
        ("[a-c]x", "bx", True),
        ("[a-c]x", "dx", False),
        ("[!a-c]x", "dx", True),
        ("[]]", "]", True),
        ("[!]]", "a", True),
        ("[!]]", "]", False),
        ("[a-]", "-", True),
        ("[-a]", "-", True),
        ("[*]", "*", True),
        ("[*]", "a", False),
        ("[?]", "?", True),
        ("[[]", "[", True),
        ("x-[0-9][0-9]", "x-42", True),
        ("x-[0-9][0-9]", "x-4a", False),
        ("*.parquet", "part.0.parquet", True),
        ("*-[0-9]*", "load-1-x", True),
        ("a*b?c*[de]", "aXXbYcZZe", True),
        ("a*b?c*[de]", "aXXbYcZZf", False),
        ("*a*a", "aa", True),
        ("*a*a", "a", False),
        ("a*ab", "aab", True),
        ("a*ab*b", "aabb", True),
        ("*?", "", False),
        ("*?*", "x", True),
        ("Pandas*", "pandas.core", False),  # case-sensitive
        ("ü*", "über", True),
    ],
)
def test_match(pattern: str, text: str, expected: bool) -> None:
    assert compile_glob(pattern)(text) is expected
    assert glob_match(pattern, text) is expected


@pytest.mark.parametrize(
    ("pattern", "offset", "fragment"),
    [("[abc", 0, "unclosed '['"), ("x[!", 1, "unclosed '['"), ("a[z-a]", 2, "empty range 'z-a'")],
)
def test_invalid_patterns(pattern: str, offset: int, fragment: str) -> None:
    with pytest.raises(GlobError) as info:
        compile_glob(pattern)
    assert info.value.offset == offset
    assert fragment in info.value.message


def test_invalid_pattern_at_run_time_matches_nothing() -> None:
    assert glob_match("[abc", "[abc") is False


@pytest.mark.parametrize(
    ("pattern", "text", "expected"),
    [
        ("a*a*a*a*a*a*b", "a" * 100_000, False),
        ("a*a*a*a*a*a*b", "a" * 100_000 + "b", True),
        ("*a*a*a*a*a*a*a*a*a*a*b", "a" * 50_000, False),
        ("*?*?*?*?*?*?*?*?*?*b", "x" * 50_000, False),
        ("*[ab]*[ab]*[ab]*[ab]*c", "ab" * 50_000, False),
        ("*ab*ab*ab*ab*abc", "ab" * 50_000, False),
        ("*ab*ab*ab*ab*abc", "ab" * 50_000 + "c", True),
        ("*" + "a?" * 20 + "*b", "a" * 20_000, False),
        ("*" + "*".join("a" * 30) + "*", "a" * 29, False),
        ("*" + "*".join("a" * 30) + "*", "a" * 30, True),
    ],
)
def test_adversarial_patterns(pattern: str, text: str, expected: bool) -> None:
    # A backtracking matcher would take exponential time on these; the answer is
    # what is asserted (the run simply finishes).
    assert compile_glob(pattern)(text) is expected


# Patterns over a small alphabet hit every case of the segment algorithm. '-' is left
# out: fnmatch and this matcher read a few odd multi-dash classes differently, and
# ranges are covered above.
_PATTERN = st.text(alphabet="ab*?[]!", max_size=12)
_TEXT = st.text(alphabet="ab]![", max_size=14)


@given(_PATTERN, _TEXT)
def test_agrees_with_fnmatch(pattern: str, text: str) -> None:
    try:
        matcher = compile_glob(pattern)
    except GlobError:
        return  # fnmatch reads a bad class as literal text; we refuse it instead
    assert matcher(text) is fnmatch.fnmatchcase(text, pattern)


@pytest.mark.parametrize(
    ("pattern", "meant"),
    [
        ("^x-.*$", "x-*"),
        ("^x-", "x-"),
        ("stage[0-9]+", "stage[0-9]*"),
        (".+[.]parquet$", "*.parquet"),
        ("^chunk-\\d$", "chunk-[0-9]"),
        ("^[^a]b$", "[!a]b"),
        ("^(a|b)$", None),
        ("^x{3}$", None),
        ("\\w+", None),
    ],
)
def test_a_regular_expression_is_told_with_the_glob_meant(pattern: str, meant: str | None) -> None:
    assert regex_meant(pattern) == (True, meant)
    if meant is not None:
        compile_glob(meant)  # the suggestion is a valid glob


@pytest.mark.parametrize(
    "pattern", ["pandas.*", "x-*", "('shuffle-*", "stage[0-9]*", "*$*", "a.b", "?", "[$]"]
)
def test_a_glob_is_no_regular_expression(pattern: str) -> None:
    assert regex_meant(pattern) == (False, None)
