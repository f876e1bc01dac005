"""The rules the tests share, as inline mappings (what a dask config's ``rules:`` holds)
or as file texts, and :func:`rules` to write one-off rules in a line.

One name per meaning, so that a test reads as what its keys want: ``X_THREE`` holds
``x-*`` keys at three copies, ``INC_TWO`` holds the keys of ``inc`` tasks at two.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import version as _version
from typing import Any


def _pandas_version() -> str:
    return _version("pandas")


#: Pool expressions by name.
GPU_POOL = {"gpu": "worker.resources.GPU >= 1"}
SPOT_POOL = {"spot": "worker.resources.SPOT >= 1"}
#: gen_cluster worker specs with those resources.
GPU = {"resources": {"GPU": 1}}
SPOT = {"resources": {"SPOT": 1}}
#: The type name the installed pandas records for a DataFrame: the public name since
#: pandas 3, the module path before (Python 3.10 installs pandas 2).
PANDAS_FRAME = (
    "pandas.DataFrame"
    if int(_pandas_version().split(".")[0]) >= 3
    else ("pandas.core.frame.DataFrame")
)


def rules(*entries: Mapping[str, Any], pools: Mapping[str, str] | None = None, **top: Any) -> dict:
    """An inline rules mapping: ``rules({"name": ..., "match": ..., "replicate": 2})``;
    top-level fields as keywords, ``_`` for ``-`` (``reduce_replicas=False``)."""
    out: dict[str, Any] = {"version": 1, "rules": list(entries)}
    if pools:
        out["pools"] = dict(pools)
    out.update({k.replace("_", "-"): v for k, v in top.items()})
    return out


def rule(name: str, pattern: str, **actions: Any) -> dict[str, Any]:
    """A rule for the keys matching a glob: ``rule("three", "x-*", replicate=3)``."""
    return {"name": name, "match": f'task.key matches "{pattern}"', **actions}


#: ``x-*`` keys: three copies.
X_THREE = rules(rule("three", "x-*", replicate=3))
#: Keys of ``inc`` tasks: two copies; a ``gpu`` pool nobody needs to be in.
INC_TWO = rules({"name": "two", "match": 'task.prefix == "inc"', "replicate": 2}, pools=GPU_POOL)
#: ``pair-*`` keys: two copies.
PAIR = rule("pair", "pair-*", replicate=2)

#: A rules file for hot-reload tests: ``x-*`` keys held at ``n`` copies.
RELOADABLE = """\
version: 1
rules:
  - name: keep
    match: task.key matches "x-*"
    replicate: {n}
"""

#: :data:`RELOADABLE` with a misspelt operator on line 4: it does not validate.
INVALID_RELOAD = """\
version: 1
rules:
  - name: keep
    match: task.key matchs "x-*"
    replicate: 2
"""
