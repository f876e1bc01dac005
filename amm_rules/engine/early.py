"""Early cycles: ask distributed's Active Memory Manager for a cycle now, instead of at
its next tick, when something happened that the engine should repair at once.

Without them a governed key that lost a copy with its worker waits up to a whole AMM
interval (2 s by default) before its copy is requested. :class:`EarlyCycles` is told of
such events by the engine's scheduler hooks (:mod:`amm_rules.engine.state.index`) and runs
the AMM's own ``ActiveMemoryManagerExtension.run_once()``, the method the AMM's periodic
callback calls, so every policy runs and the AMM validates and enacts the suggestions
as in any cycle. An early cycle is:

- **wanted**: asked for when something happened that a cycle should repair at once (a
  worker leaving, a governed key below its ``min``...: docs/policy.md, "Early cycles",
  lists what asks);
- **debounced**: it runs ``delay`` seconds after the first request, so that a worker's
  removal (a request per key it held) or two workers dying together cost one cycle;
- **rate-limited**: it starts at least ``gap`` seconds after the start of the previous
  cycle, periodic or early, and at least :data:`COST_FACTOR` times the duration of the
  last cycle after its end, so early cycles add at most ``1 / gap`` cycles per second and
  keep the AMM's share of the event loop bounded whatever the cluster's size;
- **superseded**: a cycle that starts after the request (a periodic one, say) answers
  it, and the early one is called off;
- **never on top of a cycle**: it runs from the event loop, never from inside a cycle,
  and is put off if the AMM is in the middle of one (it has ``pending`` then); it runs
  only while the AMM runs periodically (``start: true``) and the scheduler is running.

Neighbours: :mod:`amm_rules.engine.policy` owns the instance (attaches it to the AMM,
reports each cycle's start and end, closes it); :mod:`amm_rules.engine.state.index` calls
:meth:`EarlyCycles.request` from its hooks, and the policy from
:mod:`amm_rules.engine.worker_watch`'s. Nothing here reads rules or keys.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque
from typing import Any

logger = logging.getLogger(__name__)

#: An early cycle starts at least this many times the last cycle's duration after its
#: end: early cycles then take at most about 1 / (1 + COST_FACTOR) of the event loop.
COST_FACTOR = 9.0
#: How many early cycles are remembered (time, reasons) for status and benchmarks.
HISTORY = 256


class EarlyCycles:
    """Debounced, rate-limited early AMM cycles (see the module docstring)."""

    def __init__(self, delay: float = 0.02, gap: float | None = 0.1):
        #: Seconds from the first request to the early cycle (gathers a burst of events).
        self.delay = _seconds("early_cycle_delay", delay, zero_ok=True)
        #: Minimum seconds between the start of any cycle and an early cycle; None: off.
        self.gap = None if gap is None else _seconds("early_cycle_gap", gap, zero_ok=False)
        #: Requests made, early cycles run, and requests answered by another cycle.
        self.counts: Counter[str] = Counter()
        #: (monotonic start time, reasons) of the last early cycles, oldest first.
        self.history: deque[tuple[float, tuple[str, ...]]] = deque(maxlen=HISTORY)
        #: The most early cycles that started within one second, so far.
        self.max_per_second = 0
        #: (monotonic time of the first request, time the timer was set for, time the
        #: cycle started) of the last early cycles: what the debounce and the rate limit
        #: chose (``planned - requested``) apart from how late the event loop ran the timer
        #: (``started - planned``).
        self.timings: deque[tuple[float, float, float]] = deque(maxlen=HISTORY)
        self._planned = 0.0
        self._manager: Any = None
        self._handle: asyncio.TimerHandle | None = None
        #: Monotonic time of the first request not answered yet (None: none pending).
        self._requested_at: float | None = None
        self._reasons: set[str] = set()
        self._last_start = float("-inf")
        self._last_end = float("-inf")
        self._last_duration = 0.0
        self._early = False

    @property
    def enabled(self) -> bool:
        return self.gap is not None

    @property
    def pending(self) -> bool:
        """True if an early cycle has been asked for and not run or superseded yet."""
        return self._requested_at is not None

    def attach(self, manager: Any) -> None:
        """Run early cycles on this AMM extension."""
        self._manager = manager

    def close(self) -> None:
        """No more early cycles (the policy is detached or the scheduler closes)."""
        self._cancel()
        self._forget()
        self._manager = None

    # -- what the hooks call: keep it cheap, a worker's removal calls it per key -------

    def request(self, reason: str) -> None:
        """Ask for an early cycle. Costs a comparison when one is already pending."""
        if self._requested_at is not None:
            self._reasons.add(reason)
            return
        if self.gap is None or self._manager is None:
            return
        self._requested_at = time.monotonic()
        self._reasons.add(reason)
        self.counts["requested"] += 1
        self._schedule(self._requested_at + self.delay)

    # -- what the policy calls at each cycle -----------------------------------------

    def cycle_started(self) -> None:
        """A cycle starts (periodic or early): it answers every request made before it."""
        now = time.monotonic()
        self._last_start = now
        if self._requested_at is not None and not self._early:
            self.counts["superseded"] += 1
            self._cancel()
            self._forget()

    def cycle_ended(self) -> None:
        now = time.monotonic()
        self._last_end = now
        self._last_duration = max(now - self._last_start, 0.0)

    # -- the timer -------------------------------------------------------------------

    def earliest(self) -> float:
        """The earliest monotonic time the rate limit allows an early cycle to start."""
        assert self.gap is not None
        return max(self._last_start + self.gap, self._last_end + COST_FACTOR * self._last_duration)

    def _schedule(self, at: float) -> None:
        self._cancel()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop here (a scheduler built by hand): no timer
            self._forget()
            return
        at = max(at, self.earliest())
        self._planned = at
        self._handle = loop.call_later(max(at - time.monotonic(), 0.0), self._fire)

    def _forget(self) -> None:
        """No request pending any more."""
        self._requested_at = None
        self._reasons.clear()

    def _cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fire(self) -> None:
        """The timer: run the AMM's cycle if everything allows it, else wait or give up."""
        self._handle = None
        manager = self._manager
        if self._requested_at is None or manager is None or self.gap is None:
            return
        # Case 1: the AMM does not run periodically (stopped, or an ad-hoc manager), or
        # the scheduler is closing: nobody wants cycles from us.
        scheduler = manager.scheduler
        status = getattr(getattr(scheduler, "status", None), "name", "running")
        if not manager.running or status not in ("running", "init", "starting"):
            self._forget()
            return
        # Case 2: a cycle is in progress (the AMM holds ``pending`` during one): later.
        if hasattr(manager, "pending"):
            self._schedule(time.monotonic() + max(self.delay, 0.001))
            return
        # Case 3: too soon after the last cycle: at the earliest allowed time.
        now = time.monotonic()
        if now < self.earliest():
            self._schedule(self.earliest())
            return
        # Case 4: run it, as the periodic callback does.
        reasons = tuple(sorted(self._reasons))
        self.timings.append((self._requested_at, self._planned, now))
        self._forget()
        self.counts["ran"] += 1
        self.history.append((now, reasons))
        in_last_second = sum(1 for start, _ in self.history if start > now - 1.0)
        self.max_per_second = max(self.max_per_second, in_last_second)
        logger.debug("amm-rules: early AMM cycle for %s", ", ".join(reasons))
        self._early = True
        try:
            manager.run_once()
        except Exception:  # run_once logs its own errors; a timer must not raise
            logger.exception("amm-rules: early AMM cycle failed")
        finally:
            self._early = False

    def status(self) -> dict[str, Any]:
        """What ``amm_rules_status`` reports: settings, counts, the last early cycles."""
        return {
            "enabled": self.enabled,
            "delay": self.delay,
            "gap": self.gap,
            "pending": self.pending,
            **{k: self.counts[k] for k in ("requested", "ran", "superseded")},
            "max_per_second": self.max_per_second,
            "last": [
                {"seconds_ago": round(time.monotonic() - t, 3), "reasons": list(r)}
                for t, r in list(self.history)[-5:]
            ],
        }


def _seconds(name: str, value: Any, zero_ok: bool) -> float:
    """A duration parameter as float seconds, or a ValueError saying what is wrong."""
    bound = "at least 0" if zero_ok else "more than 0"
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not (value >= 0 if zero_ok else value > 0) or value == float("inf"):
        raise ValueError(f"{name}: expected a number of seconds ({bound}), got {value!r}")
    return float(value)
