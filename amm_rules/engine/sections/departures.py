"""Workers leaving: what each took with it, said when it happens.

When a worker leaves (killed, lost, closed or retired), the key index tallies its copies
(:mod:`amm_rules.engine.state.departures`); this section emits a ``worker-left`` event
(the governed keys it left below target and the keys that lost their last copy), keeps
the last :data:`RECENT_KEPT` departures for the status (``workers_left``), so that "3
keys with copies in flight" comes with why, and counts them for Prometheus
(docs/observe.md has the fields and the series).

Neighbours: :mod:`amm_rules.engine.state.index` (the hooks),
:mod:`amm_rules.observe.text` and :mod:`amm_rules.observe.dashboard` (what is shown).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from amm_rules.engine.decide.view import key_string
from amm_rules.engine.sections.base import Section
from amm_rules.engine.state.departures import Departure
from amm_rules.engine.words import ago, counted, size

if TYPE_CHECKING:
    from amm_rules.engine.context import EngineContext

logger = logging.getLogger(__name__)

#: Departures kept for status (the newest last).
RECENT_KEPT = 10


class WorkerDepartures(Section):
    """What workers took with them when they left (see the module docstring)."""

    name = "departures"
    status_key = "workers_left"
    offline = ""  # nothing to run: a simulation's --kill reports what it loses itself
    METRICS = {
        "left": ("workers_left", "counter", "Workers that left the cluster"),
        "lost_keys": (
            "worker_left_lost_keys",
            "counter",
            "Keys that lost their last copy with a worker that left",
        ),
    }

    def __init__(self, ctx: EngineContext) -> None:
        super().__init__(ctx)
        #: The latest departures, oldest first (see :meth:`status`).
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT_KEPT)
        self.left = 0
        self.lost_keys = 0

    def attach(self) -> None:
        self.ctx.index.departing.listener = self._left

    def detach(self) -> None:
        departing = self.ctx.index.departing
        if departing.listener == self._left:
            departing.listener = None

    def _left(self, tally: Departure, retired: bool) -> None:
        self.left += 1
        self.lost_keys += tally.lost
        entry = {
            "time": time.time(),
            "worker": tally.address,
            "retired": retired,
            "below": tally.below,
            "below_bytes": tally.below_bytes,
            "below_keys": [key_string(k) for k in tally.below_keys],
            "lost": tally.lost,
            "lost_bytes": tally.lost_bytes,
            "lost_keys": [key_string(k) for k in tally.lost_keys],
        }
        self.recent.append(entry)
        fields = {k: v for k, v in entry.items() if k != "time"}
        self.ctx.events.emit("worker-left", **fields)
        if tally.below or tally.lost:
            logger.warning("amm-rules: %s", departure_sentence(entry))

    def status(self) -> dict[str, Any]:
        return {"recent": [dict(e) for e in self.recent], "left": self.left}

    def metrics(self) -> dict[str, float]:
        return {"left": float(self.left), "lost_keys": float(self.lost_keys)}


def departure_sentence(entry: Mapping[str, Any], now: float | None = None) -> str:
    """``tcp://10.0.0.7:4001 left 2 s ago: 3 keys below target (84 B); 1 key lost its
    last copy`` (without ``now``: no age)."""
    how = "retired" if entry.get("retired") else "left"
    when = f" {ago(now - entry['time'])}" if now is not None else ""
    parts = []
    below, lost = entry.get("below", 0), entry.get("lost", 0)
    if below:
        parts.append(f"{counted(below, 'key')} below target ({size(entry.get('below_bytes', 0))})")
    if lost:
        verb = "lost its" if lost == 1 else "lost their"
        parts.append(
            f"{counted(lost, 'key')} {verb} last copy ({size(entry.get('lost_bytes', 0))})"
        )
    what = "; ".join(parts) or "no key below target"
    return f"{entry['worker']} {how}{when}: {what}"
