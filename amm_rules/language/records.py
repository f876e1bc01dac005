"""Records: :func:`dataclasses.dataclass` classes without its code generation.

Python 3.11's ``dataclass`` compiles each method it writes (``__init__``, ``__repr__``,
``__eq__``, ``__hash__``, ``__setattr__``, ``__delattr__``) with its own ``exec``: about
half a millisecond per class, which for the classes of the rules language was a third of
what ``amm-rules validate`` costs over importing its parsing dependencies. :func:`record`
asks ``dataclass`` for the fields only (so :func:`dataclasses.fields`,
:func:`dataclasses.replace`, :func:`dataclasses.asdict` and ``match`` keep working) and
attaches shared methods that read the field list instead. Their behaviour is the
dataclass's (defaults and factories, ``__post_init__``, ``compare=False`` and
``repr=False`` fields, the hash of a frozen class, a method written in the class body
kept); ``tests/language/test_records.py`` compares them with ``dataclass`` itself.

The shared ``__init__`` is slower per call than a generated one, so classes built per key
or per worker on the scheduler (``TaskFacts``, ``Desired``, ...) keep ``dataclass``.
Used by the language package only; its neighbours import nothing from here.

Kept, measured again against plain dataclasses (the 34 records made ``@dataclass`` with
the same arguments; Python 3.11, a loaded machine, alternating runs): importing the
language's loader and reporters took 23.8 ms of CPU with records and 30.7 ms with
dataclasses (medians of 40 pairs, paired ratio 0.76), and the whole
``python -m amm_rules validate examples/rules/demo.yaml`` 342 and 373 ms (medians of 30
pairs, paired ratio 0.94): about 30 ms of a start-up whose goal is 1.3 times the
import of its parsing dependencies (docs/performance.md). ``slots=True`` is not an
option at no cost either: it makes a second class per record, and classes that set
private attributes after construction (``Actions``) would need them declared.

Type checkers see :func:`record` as ``dataclass`` (PEP 681's ``dataclass_transform``),
so that ``Pool("gpu", ...)`` is checked against the fields. The marker is imported for
type checkers only (``typing_extensions`` ships with every type checker's stubs):
nothing is imported at run time, and no dependency is added.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import MISSING, FrozenInstanceError
from operator import attrgetter
from typing import TYPE_CHECKING, Any, TypeVar, overload

if TYPE_CHECKING:
    from typing_extensions import dataclass_transform
else:

    def dataclass_transform(**_: Any) -> Callable[[Any], Any]:
        return lambda decorator: decorator


C = TypeVar("C", bound=type)


@overload
def record(cls: C, /) -> C: ...


@overload
def record(*, frozen: bool = False, eq: bool = True) -> Callable[[C], C]: ...


@dataclass_transform(field_specifiers=(dataclasses.field,))
def record(cls: C | None = None, /, *, frozen: bool = False, eq: bool = True) -> Any:
    """``@record``, ``@record(frozen=True)``, ``@record(frozen=True, eq=False)``: as
    ``@dataclass`` with the same arguments."""

    def wrap(cls: C) -> C:
        return _build(cls, frozen=frozen, eq=eq)

    return wrap if cls is None else wrap(cls)


def _build(cls: C, *, frozen: bool, eq: bool) -> C:
    own = dict(cls.__dict__)
    klass: type[Any] = cls
    dataclasses.dataclass(klass, init=False, repr=False, eq=False)  # fields; returns klass
    fields = dataclasses.fields(klass)
    names = frozenset(f.name for f in fields)

    def put(name: str, method: Callable[..., Any] | None) -> None:
        if name not in own:  # a method written in the class body wins, as in dataclass
            if method is not None:
                method.__qualname__ = f"{klass.__qualname__}.{name}"
            setattr(klass, name, method)

    put("__init__", _init(klass, fields))
    shown_names = [f.name for f in fields if f.repr]
    shown = _key(shown_names)

    def __repr__(self: Any) -> str:
        inner = ", ".join(f"{n}={v!r}" for n, v in zip(shown_names, shown(self), strict=True))
        return f"{type(self).__qualname__}({inner})"

    put("__repr__", __repr__)
    if eq:
        key = _key([f.name for f in fields if f.compare])

        def __eq__(self: Any, other: Any) -> Any:
            if other.__class__ is self.__class__:
                return key(self) == key(other)
            return NotImplemented

        put("__eq__", __eq__)
        explicit_hash = "__hash__" in own and not (own["__hash__"] is None and "__eq__" in own)
        if not explicit_hash:
            own.pop("__hash__", None)
            if frozen:
                hashed = _key(
                    [f.name for f in fields if (f.compare if f.hash is None else f.hash)]
                )
                put("__hash__", lambda self: hash(hashed(self)))
            else:
                put("__hash__", None)
    if frozen:

        def __setattr__(self: Any, name: str, value: Any) -> None:
            if type(self) is klass or name in names:
                raise FrozenInstanceError(f"cannot assign to field {name!r}")
            super(klass, self).__setattr__(name, value)

        def __delattr__(self: Any, name: str) -> None:
            if type(self) is klass or name in names:
                raise FrozenInstanceError(f"cannot delete field {name!r}")
            super(klass, self).__delattr__(name)

        put("__setattr__", __setattr__)
        put("__delattr__", __delattr__)
    return cls


def _key(names: list[str]) -> Callable[[Any], tuple[Any, ...]]:
    """The tuple of ``names``' values of an instance."""
    if not names:
        return lambda self: ()
    get = attrgetter(*names)
    if len(names) == 1:
        return lambda self: (get(self),)
    return get


def _init(cls: type, fields: tuple[dataclasses.Field[Any], ...]) -> Callable[..., None]:
    """An ``__init__`` taking the ``init`` fields by position or name, in order."""
    params = [f.name for f in fields if f.init]
    defaults: dict[str, tuple[bool, Any]] = {}
    for f in fields:
        if f.default is not MISSING:
            defaults[f.name] = (False, f.default)
        elif f.default_factory is not MISSING:
            defaults[f.name] = (True, f.default_factory)
    later = [(f.name, defaults[f.name]) for f in fields if not f.init and f.name in defaults]
    post_init = hasattr(cls, "__post_init__")
    setter = object.__setattr__
    title = cls.__qualname__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if len(args) > len(params):
            raise TypeError(
                f"{title}.__init__() takes {len(params) + 1} positional arguments "
                f"but {len(args) + 1} were given"
            )
        for name, value in zip(params, args, strict=False):  # args may be fewer
            if name in kwargs:
                raise TypeError(f"{title}.__init__() got multiple values for argument {name!r}")
            setter(self, name, value)
        for name in params[len(args) :]:
            if name in kwargs:
                value = kwargs.pop(name)
            else:
                try:
                    factory, value = defaults[name]
                except KeyError:
                    raise TypeError(
                        f"{title}.__init__() missing 1 required positional argument: {name!r}"
                    ) from None
                if factory:
                    value = value()
            setter(self, name, value)
        if kwargs:
            raise TypeError(
                f"{title}.__init__() got an unexpected keyword argument {next(iter(kwargs))!r}"
            )
        for name, (factory, value) in later:
            setter(self, name, value() if factory else value)
        if post_init:
            self.__post_init__()

    return __init__
