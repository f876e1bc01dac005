"""Helpers shared by the tests that run RulesPolicy on a real scheduler (policy, client,
rebalance and chaos tests) and by :mod:`tests.support.chaos`.

Clusters come from ``distributed.utils_test.gen_cluster``; :func:`amm_config` turns on
the scheduler's own AMM with a short interval and RulesPolicy as its only policy.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Mapping
from typing import Any

from distributed.utils_test import inc

from amm_rules.engine.policy import RulesPolicy

__all__ = [
    "CountingDict",
    "INTERVAL",
    "RELOADABLE",
    "amm_config",
    "copies",
    "events",
    "holders",
    "inc",
    "more_cycles",
    "no_errors",
    "policy_of",
    "rules",
]

#: Short enough that a test sees several cycles in a fraction of a second.
INTERVAL = 0.05

#: A rules file for hot-reload tests: ``x-*`` keys held at ``n`` copies.
RELOADABLE = """\
version: 1
rules:
  - name: keep
    match: task.key matches "x-*"
    replicate: {n}
"""


def rules(*entries: Mapping[str, Any], pools: Mapping[str, str] | None = None, **top: Any) -> dict:
    """An inline rules mapping: ``rules({"name": ..., "match": ..., "replicate": 2})``."""
    out: dict[str, Any] = {"version": 1, "rules": list(entries)}
    if pools:
        out["pools"] = dict(pools)
    out.update({k.replace("_", "-"): v for k, v in top.items()})
    return out


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


def policy_of(scheduler: Any) -> RulesPolicy:
    (policy,) = [p for p in scheduler.extensions["amm"].policies if isinstance(p, RulesPolicy)]
    return policy


def events(scheduler: Any, action: str | None = None) -> list[dict[str, Any]]:
    out = [msg for _, msg in scheduler.get_events("amm-rules")]
    return [m for m in out if action is None or m["action"] == action]


def no_errors(scheduler: Any) -> None:
    """The engine logged no failed cycle and no failing expression."""
    bad = [m for m in events(scheduler) if m["action"] in ("error", "rule-error")]
    assert not bad, bad


def holders(scheduler: Any, key: Hashable) -> set[str]:
    ts = scheduler.tasks.get(key)
    return {ws.address for ws in (ts.who_has or ())} if ts is not None else set()


def copies(scheduler: Any, key: Hashable) -> int:
    """Copies of ``key`` in memory (0 once it is released or lost)."""
    ts = scheduler.tasks.get(key)
    return len(ts.who_has or ()) if ts is not None and ts.state == "memory" else 0


async def more_cycles(scheduler: Any, n: int = 3) -> None:
    """Run n more AMM cycles, letting the messages of each reach the workers."""
    for _ in range(n):
        scheduler.extensions["amm"].run_once()
        await asyncio.sleep(0.05)


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
