"""Counts with nouns: ``1 key``, ``2 keys``, ``1 copy``, ``3 copies``, ``1,200 prefixes``.

The one plural rule of the package's sentences. It is here, in the language half,
because every part of the package may import it: the language half imports nothing
outside itself (its reporters count files, errors and warnings; its near-miss hints
count keys), and the engine's pure parts (``engine/decide/``) import no dask. The sizes
and durations dask formats are in :mod:`amm_rules.engine.words`, which gives this
module's functions to the parts above the engine with its own.
"""

from __future__ import annotations


def plural(n: float, noun: str, many: str | None = None) -> str:
    """``noun`` for one, its plural otherwise (``many`` when the rule does not make
    it): ``key`` -> ``keys``, ``copy`` -> ``copies``, ``prefix`` -> ``prefixes``."""
    if n == 1:
        return noun
    if many is not None:
        return many
    if noun.endswith("y") and noun[-2:-1] not in tuple("aeiou"):
        return noun[:-1] + "ies"
    if noun.endswith(("s", "x", "ch", "sh")):
        return noun + "es"
    return noun + "s"


def counted(n: int, noun: str, many: str | None = None) -> str:
    """``1 key``, ``2 keys``, ``1,200 copies``: the number with thousands separated,
    then :func:`plural`."""
    return f"{n:,} {plural(n, noun, many)}"


__all__ = ["counted", "plural"]
