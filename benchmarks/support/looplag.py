"""How late an event loop runs a periodic callback: the loop-lag probe of the hostile
benchmark, of the soak, and (through :mod:`tests.support.looplag`) of the tests.

:class:`LoopLag` schedules a callback every :attr:`LoopLag.TICK` seconds on the
running loop and records how much later than due each one ran. Whatever runs on that
loop without yielding (a handler, a scrape, a cycle, a reload) delays the callback by as
much, so the worst lateness is the longest stall of the loop while the probe ran, to
within one tick. A stall still under way when the probe stops counts too.

The probe also records the interpreter's garbage collections while it runs
(:attr:`LoopLag.collections`): a full collection walks every object of the process
(hundreds of milliseconds beside a large scheduler), whichever allocation triggered it,
so a stall may be the collector's rather than the work measured.
"""

from __future__ import annotations

import asyncio
import gc
import time
from types import TracebackType
from typing import Any


class LoopLag:
    """A periodic callback on the running event loop recording its lateness."""

    #: Seconds between two callbacks.
    TICK = 0.01

    def __init__(self, tick: float | None = None) -> None:
        self.tick = self.TICK if tick is None else float(tick)
        #: Lateness of each callback (seconds), in order.
        self.samples: list[float] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0
        #: The garbage collections seen while the probe ran: (generation, seconds).
        self.collections: list[tuple[int, float]] = []
        self._collecting = 0.0

    @property
    def worst(self) -> float:
        """The longest lateness seen so far (seconds; 0 before any callback)."""
        return max(self.samples, default=0.0)

    @property
    def worst_collection(self) -> float:
        """The longest garbage collection seen (seconds; 0 if none)."""
        return max((seconds for _, seconds in self.collections), default=0.0)

    def start(self) -> LoopLag:
        """Start on the running loop (call from a coroutine)."""
        self._loop = asyncio.get_running_loop()
        self._schedule(self._loop.time())
        gc.callbacks.append(self._collected)
        return self

    def _collected(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._collecting = time.perf_counter()
        elif self._collecting:
            self.collections.append((info["generation"], time.perf_counter() - self._collecting))
            self._collecting = 0.0

    def stop(self) -> float:
        """Stop, counting the lateness of the callback still due; the worst lateness."""
        if self._collected in gc.callbacks:
            gc.callbacks.remove(self._collected)
        if self._handle is not None and self._loop is not None:
            self._handle.cancel()
            self._handle = None
            late = self._loop.time() - self._due
            if late > 0:
                self.samples.append(late)
        return self.worst

    def _schedule(self, now: float) -> None:
        assert self._loop is not None
        self._due = now + self.tick
        self._handle = self._loop.call_at(self._due, self._tick)

    def _tick(self) -> None:
        assert self._loop is not None
        now = self._loop.time()
        self.samples.append(max(now - self._due, 0.0))
        self._schedule(now)

    async def __aenter__(self) -> LoopLag:
        return self.start()

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Any:
        self.stop()
        return None
