"""Read-only attributes: what an object keeps, shown to its readers and written only by
its own methods.

``ReadOnly[T]("_table")`` is a class attribute that reads ``obj._table`` (a dotted
path too: ``"ctx.index"``) and refuses to be assigned: at run time an
``AttributeError``, and to mypy, which types the assigned value as impossible. Give it a
read-only type (``Mapping``, ``Set``) and the table it shows cannot be written through it
either, where mypy checks (the whole package). The key index and the governed keys
(:mod:`amm_rules.engine.state.index`, :mod:`~amm_rules.engine.state.governed`) show
their tables this way, and the policy what its context holds
(:mod:`amm_rules.engine.policy`).
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any, Generic, NoReturn, TypeVar, overload

T = TypeVar("T")


class ReadOnly(Generic[T]):
    """A read-only attribute showing ``path`` of its object (see the module docstring)."""

    __slots__ = ("get", "path")

    def __init__(self, path: str) -> None:
        self.path = path
        self.get = attrgetter(path)

    @overload
    def __get__(self, obj: None, owner: Any = None) -> ReadOnly[T]: ...

    @overload
    def __get__(self, obj: object, owner: Any = None) -> T: ...

    def __get__(self, obj: object, owner: Any = None) -> Any:
        return self if obj is None else self.get(obj)

    def __set__(self, obj: object, value: NoReturn) -> None:
        raise AttributeError(f"read-only: written by its owner's methods ({self.path})")


__all__ = ["ReadOnly"]
