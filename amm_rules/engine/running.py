"""Whether distributed's Active Memory Manager runs its cycles, and since when.

The AMM runs its policies every ``interval`` seconds once started: ``start: true`` in
the dask config (the default), or ``client.amm.start()``. Stopped
(``client.amm.stop()``), or configured with ``start: false`` (as several of Dask's own
tests run it), it runs a cycle only when asked (``client.amm.run_once()``): nothing the
engine leaves to "the next cycle" happens. So the engine asks :class:`AmmRunning`:

- distributed's ``replicate`` and ``scatter(broadcast=...)`` are the stock calls while
  no cycle runs (:mod:`amm_rules.engine.sections.legacy`): a trim left to a cycle would
  never come;
- status says it first, with since when, and gives the rules the state
  ``not-running`` (:mod:`amm_rules.observe.conformance`) rather than one that only a
  running cycle could earn.

Whether the AMM runs is its own ``running`` (its periodic callback is registered on the
scheduler), and the policy still among its policies (a test may take it out), read at
each question; since when is noted by wrappers on the manager's
``start`` and ``stop`` (what ``client.amm`` calls, through the AMM's handler), and
when a question finds the answer changed otherwise (the scheduler closing).

Neighbours: :class:`amm_rules.engine.context.EngineContext` holds one;
:mod:`amm_rules.engine.early` asks the manager itself before an early cycle.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class AmmRunning:
    """Whether the AMM of one policy runs periodically, and since when (wall clock)."""

    def __init__(self) -> None:
        self._manager: Any = None
        self._policy: Any = None
        self._last = False
        #: Seconds since the epoch of the last change (or of the attach).
        self._since = time.time()
        self._wrappers: dict[str, Callable[[], None]] = {}

    def attach(self, manager: Any, policy: Any) -> None:
        """Follow ``manager``, whose cycles run ``policy`` while it is among its
        policies. (It is attached before the AMM starts itself: ``start: true`` calls
        the wrapped ``start`` right after.)"""
        self._manager = manager
        self._policy = policy
        self._last = bool(manager.running)
        self._since = time.time()
        for name in ("start", "stop"):
            method = getattr(manager, name)

            def wrapper(_method: Callable[[], None] = method) -> None:
                _method()
                self._observe()

            self._wrappers[name] = wrapper
            setattr(manager, name, wrapper)

    def detach(self) -> None:
        manager = self._manager
        for name, wrapper in self._wrappers.items():
            if vars(manager).get(name) is wrapper:
                delattr(manager, name)
        self._wrappers = {}
        self._manager = self._policy = None

    @property
    def running(self) -> bool:
        """Whether the AMM runs its cycles periodically now (False when detached)."""
        return self._observe()

    def _observe(self) -> bool:
        """Whether the AMM runs now; a change since the last look is noted, with its
        time."""
        manager = self._manager
        now = bool(manager is not None and manager.running and self._policy in manager.policies)
        if now != self._last:
            self._last = now
            self._since = time.time()
        return now

    @property
    def since(self) -> float:
        """When the AMM started or stopped running (seconds since the epoch): the
        attach if it did neither since."""
        self._observe()  # a change made without start or stop is noted now
        return self._since

    def status(self) -> dict[str, Any]:
        """``{"running", "since", "interval"}`` (the AMM's interval in seconds)."""
        running = self._observe()
        interval = getattr(self._manager, "interval", None)
        return {"running": running, "since": self._since, "interval": interval}
