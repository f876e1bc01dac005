"""A worker whose link is slow, and a task that takes time to compute.

A worker whose link is slow: it sends its data at :attr:`SlowSender.rate` bytes per
second, one request at a time, so that a test can see a transfer take time (a drain
that cannot send everything before its deadline) without a network to throttle. The
data still goes through the worker's own ``get_data``: the heartbeats report what it
sent, as for any worker."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from distributed import Worker


class SlowSender(Worker):
    """A worker sending at most :attr:`rate` bytes per second."""

    rate = 2_000_000.0

    async def get_data(
        self, comm: Any, keys: Any, who: Any = None, serializers: Any = None
    ) -> Any:
        lock = self.__dict__.setdefault("_slow_link", asyncio.Lock())
        async with lock:
            tasks = self.state.tasks
            nbytes = sum((tasks[k].nbytes or 0) for k in keys if k in tasks)
            await asyncio.sleep(nbytes / self.rate)
            return await super().get_data(comm, keys, who=who, serializers=serializers)


def costly(i: int, seconds: float = 0.2) -> bytes:
    """A small result that took ``seconds`` to compute: a key worth recomputing, which
    the recompute cost model measures."""
    time.sleep(seconds)
    return b"d" * 100
