"""Helpers shared by the tests that run RulesPolicy on a real scheduler (policy, client,
rebalance and chaos tests); those the benchmarks use too (:func:`copies`,
:func:`policy_of`, :class:`TransitionCounter`) are :mod:`benchmarks.support.cluster`'s.

Clusters come from ``distributed.utils_test.gen_cluster``; :func:`amm_config` turns on
the scheduler's own AMM with a short interval and RulesPolicy as its only policy. What a
test reads of the scheduler: :func:`holders`, :func:`copies`, :func:`counts` (and
:func:`who_has` through a synchronous client), :func:`events`; what it records:
:class:`Requests` (copies and drops sent to workers) and :class:`TransitionCounter`
(where copies landed: :class:`benchmarks.support.retire.ReplicaLog`).
Waiting is in :mod:`benchmarks.support.waiting`, shared rules in :mod:`tests.support.rulesets`.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterable
from typing import Any

from distributed import LocalCluster
from distributed.utils_test import inc

from benchmarks.support.cluster import TransitionCounter, copies, policy_of
from tests.support.rulesets import RELOADABLE, rules

__all__ = [
    "CopiesFloor",
    "CountingDict",
    "INTERVAL",
    "RELOADABLE",
    "Requests",
    "TransitionCounter",
    "amm_config",
    "copies",
    "counts",
    "events",
    "holders",
    "inc",
    "keep",
    "no_errors",
    "policy_of",
    "rules",
    "skipped",
    "who_has",
]

#: Short enough that a test sees several cycles in a fraction of a second.
INTERVAL = 0.05


def amm_config(rules_: Any = None, *, start: bool = True, **kwargs: Any) -> dict[str, Any]:
    """gen_cluster ``config``: the scheduler's AMM runs RulesPolicy only (or nothing,
    with ``start=False``, for tests that drive an ad-hoc manager). No rules: an empty
    rules file (reduce-replicas only)."""
    if rules_ is None:
        rules_ = {"version": 1}
    prefix = "distributed.scheduler.active-memory-manager"
    return {
        f"{prefix}.start": start,
        f"{prefix}.interval": INTERVAL,
        f"{prefix}.policies": [{"class": "amm_rules.RulesPolicy", "rules": rules_, **kwargs}]
        if start
        else [],
        "optimization.fuse.active": False,
    }


def events(scheduler: Any, action: str | None = None) -> list[dict[str, Any]]:
    out = [msg for _, msg in scheduler.get_events("amm-rules")]
    # Clients may log anything to the topic (tests/hostile does): skip what is not an event.
    out = [m for m in out if isinstance(m, dict) and "action" in m]
    return [m for m in out if action is None or m["action"] == action]


def no_errors(scheduler: Any) -> None:
    """The engine logged no failed cycle and no failing expression so far. (Every test
    is checked for that when it ends, by ``tests/conftest.py``; this is for a check in
    the middle of a test.)"""
    bad = [m for m in events(scheduler) if m["action"] in ("error", "rule-error")]
    assert not bad, bad


#: An AMM interval longer than any test: a cycle after the first is an early one.
LONG_INTERVAL = 60.0


def long_interval(rules_: Any, **kwargs: Any) -> dict[str, Any]:
    """:func:`amm_config` with the AMM's interval at :data:`LONG_INTERVAL`."""
    interval = "distributed.scheduler.active-memory-manager.interval"
    return {**amm_config(rules_, **kwargs), interval: LONG_INTERVAL}


def holders(scheduler: Any, key: Hashable) -> set[str]:
    ts = scheduler.tasks.get(key)
    return {ws.address for ws in (ts.who_has or ())} if ts is not None else set()


def counts(scheduler: Any, keys: Iterable[Any]) -> list[int]:
    """:func:`copies` of each key (or future) in turn."""
    return [copies(scheduler, getattr(k, "key", k)) for k in keys]


def process_cluster(n_workers: int = 2, memory_limit: str | int = "1 GiB") -> LocalCluster:
    """An asynchronous LocalCluster of worker processes under nannies (one thread each,
    named 0, 1, ...), for the tests that kill, restart or measure real processes; the
    scheduler is in the test's process, so ``cluster.scheduler`` is the real one."""
    return LocalCluster(
        n_workers=n_workers,
        threads_per_worker=1,
        processes=True,
        asynchronous=True,
        dashboard_address=":0",
        memory_limit=memory_limit,
    )


def who_has(client: Any, future: Any) -> int:
    """Copies of a future's key, asked through a synchronous client."""
    return len(client.who_has(future).get(future.key, ()))


def keep(*things: Any) -> None:
    """Nothing: a test passes the futures that keep its keys in memory here, so that
    they visibly live until this line (a future's release drops its key)."""


class Requests:
    """Records the copies (``request_acquire_replicas``) and drops
    (``request_remove_replicas``) the scheduler sends to workers, per (worker, key).
    The AMM enacts every accepted suggestion through these two methods.

    With ``forward=False`` nothing is sent: the test sees what would have been asked
    while the cluster stays as it is.
    """

    def __init__(self, scheduler: Any, forward: bool = True):
        self.scheduler = scheduler
        self.acquire: Counter[tuple[str, Hashable]] = Counter()
        self.remove: Counter[tuple[str, Hashable]] = Counter()
        #: Every request in order: (``time.monotonic()``, "acquire" or "remove", worker, key).
        self.log: list[tuple[float, str, str, Hashable]] = []
        self._originals = {
            "request_acquire_replicas": scheduler.request_acquire_replicas,
            "request_remove_replicas": scheduler.request_remove_replicas,
        }
        for name, op, counter in (
            ("request_acquire_replicas", "acquire", self.acquire),
            ("request_remove_replicas", "remove", self.remove),
        ):
            original = self._originals[name]
            setattr(scheduler, name, self._recorder(original, op, counter, forward))

    def _recorder(
        self, original: Callable[..., None], op: str, counter: Counter, forward: bool
    ) -> Any:
        def record(addr: str, keys: Iterable[Hashable], *, stimulus_id: str) -> None:
            keys = list(keys)
            now = time.monotonic()
            counter.update((addr, key) for key in keys)
            self.log.extend((now, op, addr, key) for key in keys)
            if forward:
                original(addr, keys, stimulus_id=stimulus_id)

        return record

    def of(self, key: Hashable) -> tuple[dict[str, int], dict[str, int]]:
        """Copies and drops asked for ``key``: ({worker: n}, {worker: n})."""
        return (
            {a: n for (a, k), n in self.acquire.items() if k == key},
            {a: n for (a, k), n in self.remove.items() if k == key},
        )

    def clear(self) -> None:
        self.acquire.clear()
        self.remove.clear()
        self.log.clear()

    def stop(self) -> None:
        """Put the scheduler's own methods back."""
        for name in self._originals:
            vars(self.scheduler).pop(name, None)


class CountingDict(dict):
    """``scheduler.tasks`` that counts every walk over it."""

    walks = 0

    def __iter__(self):
        type(self).walks += 1
        return super().__iter__()

    def items(self):
        type(self).walks += 1
        return super().items()

    def values(self):
        type(self).walks += 1
        return super().values()

    def keys(self):
        type(self).walks += 1
        return super().keys()


def skipped(s: Any) -> Counter[str]:
    """Keys rebalancing looked at and did not move, by reason, over the cycle events."""
    out: Counter[str] = Counter()
    for e in events(s, "cycle"):
        out.update(e.get("rebalance", {}).get("skipped", {}))
    return out


class CopiesFloor:
    """The fewest copies any of ``keys`` held while it watched: it looks every few
    milliseconds in the background, from its creation until :meth:`stop`."""

    def __init__(self, scheduler: Any, keys: Iterable[Hashable], every: float = 0.005):
        self.scheduler, self.keys, self.every = scheduler, list(keys), every
        self.fewest = min(counts(scheduler, self.keys), default=0)
        self._task = asyncio.create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            self.fewest = min(self.fewest, *counts(self.scheduler, self.keys))
            await asyncio.sleep(self.every)

    def stop(self) -> int:
        self._task.cancel()
        self.fewest = min(self.fewest, *counts(self.scheduler, self.keys))
        return self.fewest
