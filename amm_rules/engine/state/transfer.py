"""How fast a worker sends data, measured while it drains.

:class:`TransferMeter` keeps, per watched worker, what its heartbeats said it sent:
every heartbeat carries the worker's fine performance metrics since the previous one
(``ws.metrics["digests_total_since_heartbeat"]``), among them the bytes its
``get-data`` handler read to send to other workers (``("get-data", "memory-read",
"bytes")`` and, for spilled keys, ``("get-data", "disk-read", "bytes")``). The meter
adds them up over a sliding window (:data:`WINDOW` seconds): the rate is the bytes of
the heartbeats in the window over the time since the heartbeat before the first of
them (the first heartbeat after the watch began only marks the time: what it counts was
partly sent before). Until two heartbeats arrived, the meter has no rate and
says so (None): the caller falls back on what it measured itself (copies landed) or on
distributed's own estimate (``Scheduler.bandwidth``).

Cost: one dictionary lookup per heartbeat of a watched worker, nothing for the others.

Neighbours: :mod:`amm_rules.engine.sections.drain` feeds it with the heartbeats of the
draining workers (``ws.metrics`` when ``ws.last_seen`` moved) and reads it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from itertools import islice
from typing import Any

#: Seconds of heartbeats the rate is measured over.
WINDOW = 10.0
#: The fine performance metrics counting the bytes a worker's get-data handler sent.
SENT_DIGESTS = (("get-data", "memory-read", "bytes"), ("get-data", "disk-read", "bytes"))


def sent_bytes(metrics: Mapping[str, Any] | None) -> int | None:
    """Bytes a worker sent since its previous heartbeat, from the heartbeat's metrics
    (None: the heartbeat does not carry the figures, as before distributed 2023.9)."""
    if not metrics:
        return None
    digests = metrics.get("digests_total_since_heartbeat")
    if not isinstance(digests, Mapping):
        return None
    total = 0
    for name in SENT_DIGESTS:
        value = digests.get(name)
        if isinstance(value, (int, float)):
            total += int(value)
    return total


class TransferMeter:
    """Bytes sent per second by the watched workers (see the module docstring)."""

    def __init__(self, window: float = WINDOW):
        self.window = window
        #: address -> (time of the heartbeat, bytes sent since the previous one), oldest
        #: first; the first entry's bytes do not count (it marks where the time starts).
        self.samples: dict[str, deque[tuple[float, int]]] = {}
        #: Heartbeats heard from watched workers in all, and those without the figures.
        self.heard = 0
        self.blind = 0

    def watch(self, address: str) -> None:
        """Begin measuring ``address`` (from its next heartbeat)."""
        self.samples.setdefault(address, deque())

    def forget(self, address: str) -> None:
        self.samples.pop(address, None)

    def heartbeat(self, address: str, now: float, metrics: Mapping[str, Any] | None) -> None:
        """A heartbeat of ``address`` arrived at ``now`` with ``metrics``."""
        entries = self.samples.get(address)
        if entries is None:
            return
        self.heard += 1
        sent = sent_bytes(metrics)
        if sent is None:
            self.blind += 1
            return
        entries.append((now, sent))
        # Keep one entry older than the window: where the window's time starts.
        while len(entries) > 2 and entries[1][0] < now - self.window:
            entries.popleft()

    def rate(self, address: str) -> float | None:
        """Bytes per second ``address`` sent over the window (None: not measured yet)."""
        entries = self.samples.get(address)
        if not entries or len(entries) < 2:
            return None
        start, end = entries[0][0], entries[-1][0]
        return self.sent(address) / (end - start) if end > start else None

    def sent(self, address: str) -> int:
        """Bytes ``address`` sent within the window."""
        entries = self.samples.get(address)
        return sum(n for _, n in islice(entries, 1, None)) if entries else 0


__all__ = ["SENT_DIGESTS", "TransferMeter", "WINDOW", "sent_bytes"]
