"""The engine's one scheduler plugin.

The scheduler calls every plugin's ``transition`` on every transition, whether the
plugin does anything there or not: a plugin that only wants to hear of workers leaving
still costs a call with the transition's keyword arguments, about a microsecond, on the
scheduler's hottest path. The engine's parts that hear the scheduler (the key index, the
retirements, the scale-down guard, the handlers' metadata, the memory-pressure and
paused-workers sections while the rules have them) are members of one
:class:`EngineHooks`, the only plugin the engine adds: each hook is passed on to the
members that define it, and ``transition`` is the one member's own bound method when
only one defines it (the key index), so that a transition costs what it costs that
member and nothing more.

A member is any object with some of ``SchedulerPlugin``'s hooks; a member's failure in
a hook is logged and does not keep the hook from the others, as the scheduler does for
its plugins. Neighbours: :class:`~amm_rules.engine.context.EngineContext` owns the
instance (``ctx.add_plugin`` / ``ctx.remove_plugin``) and adds it to the scheduler while
it has members.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

logger = logging.getLogger(__name__)

#: The hooks passed on to the members (every hook of ``SchedulerPlugin``).
HOOKS = (
    "start",
    "before_close",
    "close",
    "update_graph",
    "restart",
    "transition",
    "add_worker",
    "remove_worker",
    "add_client",
    "remove_client",
    "log_event",
    "valid_workers_downscaling",
)


def defines(member: Any, hook: str) -> bool:
    """Whether ``member`` has a hook of its own (not ``SchedulerPlugin``'s, which does
    nothing)."""
    own = getattr(type(member), hook, None)
    return own is not None and own is not getattr(SchedulerPlugin, hook, None)


class EngineHooks(SchedulerPlugin):
    """One scheduler plugin for the whole engine (see the module docstring)."""

    idempotent = False

    def __init__(self) -> None:
        #: The members and the names they were added under, in the order added (a
        #: list: members are told apart by identity).
        self.members: list[tuple[Any, str]] = []
        self._hooks: dict[str, list[Callable[..., Any]]] = {h: [] for h in HOOKS}

    def add(self, member: Any, name: str) -> None:
        if member not in self:
            self.members.append((member, name))
            self._bind()

    def remove(self, member: Any) -> None:
        if member in self:
            self.members = [(m, n) for m, n in self.members if m is not member]
            self._bind()

    def __contains__(self, member: object) -> bool:
        return any(m is member for m, _ in self.members)

    def __len__(self) -> int:
        return len(self.members)

    def _bind(self) -> None:
        self._hooks = {h: [getattr(m, h) for m, _ in self.members if defines(m, h)] for h in HOOKS}
        transition = self._hooks["transition"]
        # An instance attribute: the scheduler's ``plugin.transition(...)`` finds it first.
        if len(transition) == 1:
            self.transition = transition[0]  # type: ignore[method-assign]
        else:
            self.__dict__.pop("transition", None)

    def _each(self, hook: str, *args: Any, **kwargs: Any) -> None:
        for call in self._hooks[hook]:
            try:
                call(*args, **kwargs)
            except Exception:
                logger.exception("amm-rules: %s failed in %s", _owner(call), hook)

    async def _each_async(self, hook: str, *args: Any, **kwargs: Any) -> None:
        for call in self._hooks[hook]:
            try:
                result = call(*args, **kwargs)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                logger.exception("amm-rules: %s failed in %s", _owner(call), hook)

    # -- the hooks ----------------------------------------------------------------------

    def transition(self, *args: Any, **kwargs: Any) -> None:
        # Reached only while no member or several members define it (see _bind).
        self._each("transition", *args, **kwargs)

    async def start(self, scheduler: Any) -> None:
        await self._each_async("start", scheduler)

    async def before_close(self) -> None:
        await self._each_async("before_close")

    async def close(self) -> None:
        await self._each_async("close")

    def update_graph(self, scheduler: Any, **kwargs: Any) -> None:
        self._each("update_graph", scheduler, **kwargs)

    def restart(self, scheduler: Any) -> None:
        self._each("restart", scheduler)

    def add_worker(self, scheduler: Any, worker: str) -> None:
        self._each("add_worker", scheduler=scheduler, worker=worker)

    def remove_worker(self, scheduler: Any, worker: str, **kwargs: Any) -> None:
        self._each("remove_worker", scheduler=scheduler, worker=worker, **kwargs)

    def add_client(self, scheduler: Any, client: str) -> None:
        self._each("add_client", scheduler=scheduler, client=client)

    def remove_client(self, scheduler: Any, client: str) -> None:
        self._each("remove_client", scheduler=scheduler, client=client)

    def log_event(self, topic: str, msg: Any) -> None:
        self._each("log_event", topic, msg)

    def valid_workers_downscaling(self, scheduler: Any, workers: list[Any]) -> list[Any]:
        for call in self._hooks["valid_workers_downscaling"]:
            try:
                workers = call(scheduler, workers)
            except Exception:
                logger.exception("amm-rules: %s failed in valid_workers_downscaling", _owner(call))
        return workers


def _owner(call: Callable[..., Any]) -> str:
    return type(getattr(call, "__self__", call)).__name__


__all__ = ["HOOKS", "EngineHooks", "defines"]
