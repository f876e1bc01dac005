"""The engine's one scheduler plugin: each hook reaches the members that define it, a
member's failure does not keep it from the others, ``transition`` is the only member's
own method, and on a real scheduler the engine is one plugin, which hears transitions,
workers leaving and scale-down questions."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from distributed.diagnostics.plugin import SchedulerPlugin
from distributed.utils_test import gen_cluster

from amm_rules.engine.hooks import EngineHooks, defines
from amm_rules.engine.sections.adaptive import AdaptiveSection
from benchmarks.support.waiting import wait_for
from tests.support.cluster import amm_config, policy_of


class Leaving(SchedulerPlugin):
    def __init__(self) -> None:
        self.left: list[str] = []

    def remove_worker(self, scheduler: Any = None, worker: str = "", **kwargs: Any) -> None:
        self.left.append(worker)


class Seeing:
    """Not a SchedulerPlugin: any object with some of its hooks may be a member."""

    def __init__(self) -> None:
        self.seen: list[tuple[Any, str, str]] = []
        self.started = 0

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        self.seen.append((key, start, finish))

    async def start(self, scheduler: Any) -> None:
        await asyncio.sleep(0)  # work: a start that yields to the loop once
        self.started += 1


class Failing(SchedulerPlugin):
    def remove_worker(self, scheduler: Any = None, worker: str = "", **kwargs: Any) -> None:
        raise RuntimeError("broken member")

    def valid_workers_downscaling(self, scheduler: Any, workers: list[Any]) -> list[Any]:
        raise RuntimeError("broken guard")


class Keeping(SchedulerPlugin):
    def __init__(self, keep: str) -> None:
        self.keep = keep

    def valid_workers_downscaling(self, scheduler: Any, workers: list[Any]) -> list[Any]:
        return [w for w in workers if w != self.keep]


def test_only_the_hooks_a_member_defines_are_its_own() -> None:
    assert defines(Leaving(), "remove_worker")
    assert not defines(Leaving(), "transition")  # SchedulerPlugin's, which does nothing
    assert defines(Seeing(), "transition") and not defines(Seeing(), "log_event")


def test_transition_is_the_only_members_own_method_and_a_fan_out_otherwise() -> None:
    hooks = EngineHooks()
    leaving, seeing = Leaving(), Seeing()
    hooks.add(leaving, "leaving")
    assert "transition" not in vars(hooks)  # no member: SchedulerPlugin's own
    hooks.add(seeing, "seeing")
    assert hooks.transition == seeing.transition
    other = Seeing()
    hooks.add(other, "other")
    hooks.transition("k", "processing", "memory", stimulus_id="s", worker="w")
    assert seeing.seen == other.seen == [("k", "processing", "memory")]
    hooks.remove(other)
    assert hooks.transition == seeing.transition
    hooks.add(seeing, "again")  # a member is added once
    assert [name for _, name in hooks.members] == ["leaving", "seeing"]
    assert seeing in hooks and other not in hooks and len(hooks) == 2


def test_a_failing_member_is_logged_and_the_others_still_hear(caplog: Any) -> None:
    hooks = EngineHooks()
    first, last = Leaving(), Leaving()
    for name, member in (("first", first), ("failing", Failing()), ("last", last)):
        hooks.add(member, name)
    with caplog.at_level(logging.ERROR, logger="amm_rules.engine.hooks"):
        hooks.remove_worker(scheduler=None, worker="w-1", stimulus_id="s")
        kept = hooks.valid_workers_downscaling(None, ["a", "b"])
    assert first.left == last.left == ["w-1"]
    assert kept == ["a", "b"]  # the broken guard filters nothing
    assert "Failing failed in remove_worker" in caplog.text
    assert "Failing failed in valid_workers_downscaling" in caplog.text


def test_scale_down_guards_chain_and_async_hooks_are_awaited() -> None:
    hooks = EngineHooks()
    seeing = Seeing()
    hooks.add(Keeping("a"), "keep-a")
    hooks.add(Keeping("b"), "keep-b")
    hooks.add(seeing, "seeing")
    assert hooks.valid_workers_downscaling(None, ["a", "b", "c"]) == ["c"]
    asyncio.run(hooks.start(None))
    assert seeing.started == 1


@pytest.mark.compat
@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 2,
    config=amm_config(
        {
            "version": 1,
            "adaptive": {},
            "rules": [{"name": "two", "match": "true", "replicate": 2}],
        }
    ),
    timeout=60,
)
async def test_on_a_scheduler_the_engine_is_one_plugin_hearing_everything(c, s, a, b):
    policy = policy_of(s)
    hooks = policy.ctx.hooks
    assert [p for n, p in s.plugins.items() if n.startswith("amm-rules")] == [hooks]
    # Transitions reach the key index: the key is governed and copied.
    future = c.submit(sum, [1, 2], key="summed")
    await future
    await wait_for(lambda: len(s.tasks["summed"].who_has) == 2, "the rule's second copy")
    assert "summed" in policy.index
    # The scale-down guard answers for the rules: closing either worker breaks min 2.
    assert s.workers_to_close(n=1) == []
    kept = policy.section(AdaptiveSection).kept
    (held,) = kept  # the worker distributed proposed, and why it stays
    reasons, _ = kept[held]
    assert [(r.kind, r.source, r.bound) for r in reasons] == [("min", "rule two", 2)]
    # A worker leaving is heard by the guard's member too: its reason is forgotten.
    await next(w for w in (a, b) if w.address == held).close()
    await wait_for(lambda: held not in s.workers, "the worker removed")
    assert held not in kept
