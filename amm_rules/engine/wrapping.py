"""Putting the engine's wrappers on a scheduler's methods, and taking them off.

The engine learns what the scheduler does by wrapping some of its methods: replica
changes (:func:`amm_rules.engine.state.index.watch_scheduler`), workers' resources and
heartbeats (:mod:`amm_rules.engine.worker_watch`), ``replicate`` and ``scatter``
(:mod:`amm_rules.engine.sections.legacy`). Some of those methods are also comm handlers, bound
when the scheduler was built, so the handler is replaced too. Each wrapper is set on
the scheduler instance, over whatever was there (another policy's wrapper, or the
class's method); undoing puts that back only where the wrapper is still the one in
place: a wrapper that something else wrapped since stays in that chain, and its owner
makes it pass calls through once detached (removing it would remove the later wrapper
too).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


def wrap_methods(
    scheduler: Any,
    wrappers: Mapping[str, Callable[..., Any]],
    handlers: Mapping[str, str] | None = None,
) -> Callable[[], None]:
    """Set each of ``wrappers`` (method name -> wrapper) on ``scheduler`` and, for the
    names in ``handlers`` (method name -> comm handler name) that the scheduler serves,
    as that handler too. Returns the function that undoes it."""
    handlers = handlers or {}
    before = {name: vars(scheduler).get(name) for name in wrappers}
    handlers_before = {h: scheduler.handlers.get(h) for h in handlers.values()}
    for name, wrapper in wrappers.items():
        wrapper.__name__ = name
        setattr(scheduler, name, wrapper)
        handler = handlers.get(name)
        if handler is not None and handler in scheduler.handlers:
            scheduler.handlers[handler] = wrapper

    def unwrap() -> None:
        for name, wrapper in wrappers.items():
            if vars(scheduler).get(name) is wrapper:
                if before[name] is None:
                    delattr(scheduler, name)  # the class's own method shows through again
                else:
                    setattr(scheduler, name, before[name])
            handler = handlers.get(name)
            if handler is not None and scheduler.handlers.get(handler) is wrapper:
                scheduler.handlers[handler] = handlers_before[handler]

    return unwrap
