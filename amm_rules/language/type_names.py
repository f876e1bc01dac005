"""Type names that mean the same type: the public name and the module path.

The scheduler records a result's type as ``module.name`` of its class
(``TaskState.type``), and libraries have moved their classes' ``__module__`` over time:
pandas 3 records a DataFrame as ``pandas.DataFrame`` where pandas 2 recorded
``pandas.core.frame.DataFrame``. A rules file may write either; :data:`ALIASES` makes
``task.type == "pandas.DataFrame"`` and ``task.type == "pandas.core.frame.DataFrame"``
both match a DataFrame, whichever pandas recorded it.

The one table of these names: :mod:`amm_rules.language.expr.compiler` compares
``task.type`` through :func:`names_of`, :mod:`amm_rules.language.expr.checker` warns on a
name the table does not know that looks like a misspelling of one it does
(:func:`misspelt`), and ``docs/expressions.md`` lists the same entries with the versions
that changed (a test compares the two). Pure data: nothing here imports a library.
"""

from __future__ import annotations

from collections.abc import Iterable

from amm_rules.language.records import record


@record(frozen=True)
class TypeAlias:
    """One type under its public name and the module paths releases have recorded."""

    #: The name a user writes, and what current releases record (``pandas.DataFrame``).
    public: str
    #: The other names the scheduler has recorded for it, newest first.
    paths: tuple[str, ...]
    #: Which releases record which name, for the documentation.
    versions: str

    @property
    def names(self) -> tuple[str, ...]:
        return (self.public, *self.paths)


_PANDAS = "pandas 3.0 and later record the public name (3.1 checked); pandas 2 and earlier the module path"
_CUPY = (
    "current cupy records the public name; older releases recorded the module path "
    "(cupy.core.core, later cupy._core.core)"
)
_CUDF = "cudf records the module path; the public name matches it too"
_NUMPY_MA = "numpy 2.4 records the public name; earlier releases the module path"

#: The table (see the module docstring). A name appears in one entry only.
ALIASES: tuple[TypeAlias, ...] = (
    TypeAlias("pandas.DataFrame", ("pandas.core.frame.DataFrame",), _PANDAS),
    TypeAlias("pandas.Series", ("pandas.core.series.Series",), _PANDAS),
    TypeAlias("pandas.Index", ("pandas.core.indexes.base.Index",), _PANDAS),
    TypeAlias("pandas.RangeIndex", ("pandas.core.indexes.range.RangeIndex",), _PANDAS),
    TypeAlias("pandas.MultiIndex", ("pandas.core.indexes.multi.MultiIndex",), _PANDAS),
    TypeAlias("pandas.DatetimeIndex", ("pandas.core.indexes.datetimes.DatetimeIndex",), _PANDAS),
    TypeAlias("pandas.Categorical", ("pandas.core.arrays.categorical.Categorical",), _PANDAS),
    TypeAlias("cudf.DataFrame", ("cudf.core.dataframe.DataFrame",), _CUDF),
    TypeAlias("cudf.Series", ("cudf.core.series.Series",), _CUDF),
    TypeAlias("cudf.Index", ("cudf.core.index.Index",), _CUDF),
    TypeAlias("cupy.ndarray", ("cupy._core.core.ndarray", "cupy.core.core.ndarray"), _CUPY),
    TypeAlias("numpy.ma.MaskedArray", ("numpy.ma.core.MaskedArray",), _NUMPY_MA),
)

#: Names every release records the same way (no alias needed), known to the
#: misspelling check.
PLAIN_NAMES: tuple[str, ...] = (
    "numpy.ndarray",
    "numpy.float64",
    "numpy.float32",
    "numpy.int64",
    "numpy.int32",
)

_BY_NAME: dict[str, tuple[str, ...]] = {
    name: alias.names for alias in ALIASES for name in alias.names
}
#: Every name the table knows.
KNOWN: frozenset[str] = frozenset(_BY_NAME) | frozenset(PLAIN_NAMES)


def names_of(name: str) -> tuple[str, ...]:
    """Every name of the type ``name`` stands for (``name`` itself first)."""
    names = _BY_NAME.get(name)
    if names is None:
        return (name,)
    return (name, *(n for n in names if n != name))


def expand(names: Iterable[str]) -> frozenset[str]:
    """The names, each with its aliases."""
    return frozenset(alias for name in names for alias in names_of(name))


def public_name(name: str) -> str:
    """The public name of a type (``name`` itself when the table has no entry)."""
    names = _BY_NAME.get(name)
    return names[0] if names is not None else name


def misspelt(name: str) -> str | None:
    """The known name ``name`` looks like a misspelling of, or None: when ``name`` is
    known, or close to nothing known. Only names of a library the table knows
    (``pandas.``, ``cudf.``, ``cupy.``, ``numpy.``) are compared: a
    type of the user's own is never called a misspelling."""
    if name in KNOWN:
        return None
    root = name.split(".", 1)[0].casefold()
    if root not in _ROOTS:
        return None
    from amm_rules.language.spelling import closest

    library = _ROOTS[root]
    rests = {n.split(".", 1)[1]: n for n in KNOWN if n.split(".", 1)[0] == library}
    # Compared without the library's name, which every candidate shares.
    rest = name.split(".", 1)[1] if "." in name else ""
    close = closest(rest, sorted(rests), ignore_case=True) if rest else None
    if close is not None:
        return rests[close]
    # ``pandas.core.DataFrame``: the last part is a known class under another path.
    last = name.rsplit(".", 1)[-1].casefold()
    same = sorted(n for n in rests.values() if n.rsplit(".", 1)[-1].casefold() == last)
    return same[0] if same else None


_ROOTS = {
    root.casefold(): root for root in {n.split(".", 1)[0] for n in (*_BY_NAME, *PLAIN_NAMES)}
}
