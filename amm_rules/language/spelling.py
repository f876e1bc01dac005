"""Suggestions ("did you mean ...?") for misspelt names: keys, attributes, pools, units."""

from __future__ import annotations

from collections.abc import Iterable


def closest(name: str, choices: Iterable[str], *, ignore_case: bool = False) -> str | None:
    """The choice closest to ``name``, or ``None`` when nothing is close.

    With ``ignore_case``, a choice that differs from ``name`` only in case wins first
    (``"gib"`` → ``"GiB"``): case-sensitive names are easy to get wrong that way, and
    difflib alone would not find them.
    """
    options = list(choices)
    if ignore_case:
        folded = name.casefold()
        for option in options:
            if option.casefold() == folded and option != name:
                return option
    import difflib  # only when a name is misspelt: validating a clean file never needs it

    close = difflib.get_close_matches(name, options, n=1, cutoff=0.6)
    return close[0] if close else None


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """``"; did you mean 'replicate'?"`` or ``""`` when nothing is close."""
    close = closest(name, choices)
    return f"; did you mean {close!r}?" if close else ""
