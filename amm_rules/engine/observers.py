"""Who is told when a :class:`~amm_rules.engine.policy.RulesPolicy` attaches to a
scheduler, or leaves it.

The engine does not know what watches it: :mod:`amm_rules.observe` (metrics, the
engine's entry in ``scheduler.extensions`` for cluster dumps, the status and explain
handlers) sits above the engine and adds itself here with :func:`add` when the public
``amm_rules.RulesPolicy`` is first used. Each observer is an object with
``attached(scheduler, policy)`` and ``detached(scheduler, policy)``; a failing observer
is logged and never stops a policy from attaching, detaching or running.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

#: The policy an observer is told about (typed loosely: the policy imports this module,
#: and nothing here reads it).
RulesPolicy = Any

logger = logging.getLogger(__name__)


class Observer(Protocol):
    def attached(self, scheduler: Any, policy: RulesPolicy) -> None: ...

    def detached(self, scheduler: Any, policy: RulesPolicy) -> None: ...


#: The observers, in the order they were added.
OBSERVERS: list[Observer] = []


def add(observer: Observer) -> None:
    """Tell ``observer`` about every policy attaching or detaching from now on (once,
    however often it is added)."""
    if not any(o is observer for o in OBSERVERS):
        OBSERVERS.append(observer)


def attached(scheduler: Any, policy: RulesPolicy) -> None:
    for observer in list(OBSERVERS):
        try:
            observer.attached(scheduler, policy)
        except Exception:
            logger.exception("amm-rules: observer %r failed at attach", observer)


def detached(scheduler: Any, policy: RulesPolicy) -> None:
    for observer in list(OBSERVERS):
        try:
            observer.detached(scheduler, policy)
        except Exception:
            logger.exception("amm-rules: observer %r failed at detach", observer)
