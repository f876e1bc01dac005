"""The ``protect:`` section on a real scheduler: the keys worth most recompute per byte
get a second copy within the budget, reduce-replicas leaves those copies alone, a
rule's own replication target wins, and the death of the worker that held a protected
key alone recomputes nothing; keys persisted before the section are protected on a quiet
cluster."""

from __future__ import annotations

import time
from typing import Any

from distributed import Worker
from distributed.active_memory_manager import ActiveMemoryManagerExtension
from distributed.utils_test import gen_cluster

from amm_rules import RulesPolicy
from amm_rules.engine.sections import protect as protect_module
from amm_rules.engine.sections.protect import ProtectSection
from amm_rules.observe.status import status_report
from amm_rules.observe.text import render_status
from benchmarks.support.waiting import wait_cycles, wait_for
from tests.support.cluster import (
    TransitionCounter,
    amm_config,
    copies,
    holders,
    no_errors,
    policy_of,
)

#: Seconds a dear task works; cheap ones work a tenth of it.
WORK = 0.3


def make(seconds: float, size: int) -> bytes:
    time.sleep(seconds)  # work: a task that computes for a while
    return b"x" * size


def protect_rules(budget: Any, **extra: Any) -> dict[str, Any]:
    return {
        "version": 1,
        "protect": {"budget": budget, "min-recompute": "0.1s", **extra.pop("protect", {})},
        **extra,
    }


async def stage(c: Any, name: str, n: int, seconds: float, size: int, **kwargs: Any) -> list:
    futures = [
        c.submit(make, seconds, size, key=f"{name}-{i}", pure=False, **kwargs) for i in range(n)
    ]
    await c.gather(futures)
    return futures


@gen_cluster(
    client=True,
    nthreads=[("", 2)] * 3,
    config=amm_config(protect_rules(6000)),
    timeout=90,
)
async def test_the_dearest_keys_per_byte_are_protected_within_the_budget(c, s, a, b, w):
    dear = await stage(c, "dear", 4, WORK, 1000, workers=[a.address])
    bulky = await stage(c, "bulky", 2, WORK, 100_000, workers=[a.address])
    cheap = await stage(c, "cheap", 4, WORK / 10, 10, workers=[a.address])
    policy = policy_of(s)
    section = policy.section(ProtectSection)
    dear_keys = {f.key for f in dear}
    await wait_for(
        lambda: all(copies(s, k) == 2 for k in dear_keys),
        "every dear key on two workers",
        show=lambda: (dict(policy.ctx.claims.of("protect")), [copies(s, k) for k in dear_keys]),
    )
    assert set(policy.ctx.claims.of("protect")) == dear_keys
    # The bulky keys are as dear but do not fit; the cheap ones are below min-recompute.
    assert [copies(s, f.key) for f in bulky + cheap] == [1] * 6
    # Both bulky keys are left out once a choice saw both (choices are made at most
    # every few cycles while keys come and go: the first may have seen one).
    await wait_for(
        lambda: status_report(policy)["protect"]["left_out"] == 2,
        "both bulky keys left out by a choice",
        show=lambda: status_report(policy)["protect"],
    )
    report = status_report(policy)["protect"]
    assert report["keys"] == 4 and report["keys_held"] == 4
    assert report["held_bytes"] <= report["budget_bytes"] == 6000
    assert report["budget_exhausted"] is True
    text = render_status(status_report(policy))
    assert "protect      4 keys (4 holding 2 copies)" in text
    assert "budget exhausted" in text and "at risk      " in text
    # The copies stay: reduce-replicas spares them cycle after cycle.
    await wait_cycles(s, 5)
    assert all(copies(s, k) == 2 for k in dear_keys)
    explained = section.explain(s.tasks[bulky[0].key], 0.0)
    assert explained["protected"] is False
    assert "budget is spent on keys worth more" in explained["why"]
    assert any(e.get("action") == "protect-budget-exhausted" for _, e in s.get_events("amm-rules"))
    no_errors(s)


@gen_cluster(
    client=True,
    nthreads=[("", 2)] * 3,
    config=amm_config(
        protect_rules(
            "1 MiB",
            rules=[
                {"name": "one", "match": "task.prefix == 'exact'", "replicate": 1},
                {"name": "frozen", "match": "task.prefix == 'frozen'", "move": "never"},
            ],
        )
    ),
    timeout=90,
)
async def test_a_rule_of_the_key_wins_over_protection(c, s, a, b, w):
    exact = await stage(c, "exact", 2, WORK, 100, workers=[a.address])
    frozen = await stage(c, "frozen", 2, WORK, 100, workers=[a.address])
    free = await stage(c, "free", 2, WORK, 100, workers=[a.address])
    policy = policy_of(s)
    await wait_for(
        lambda: all(copies(s, f.key) == 2 for f in free), "the keys no rule governs protected"
    )
    await wait_cycles(s, 5)
    assert [copies(s, f.key) for f in exact + frozen] == [1] * 4
    assert set(policy.ctx.claims.of("protect")) == {f.key for f in free}
    why = policy.section(ProtectSection).explain(s.tasks[exact[0].key], 0.0)["why"]
    assert why == "its replication target decides its copies (rule one)"
    no_errors(s)


@gen_cluster(
    client=True,
    nthreads=[("", 2)] * 3,
    config=amm_config(protect_rules("1 MiB", protect={"min-recompute": "0.2s"})),
    timeout=90,
)
async def test_losing_the_only_holder_of_a_protected_key_recomputes_nothing(c, s, a, b, w):
    counter = TransitionCounter.on(s)
    # Computed on a, free to run elsewhere once a is gone.
    on_a = {"workers": [a.address], "allow_other_workers": True}
    dear = await stage(c, "dear", 3, WORK, 1000, **on_a)
    cheap = await stage(c, "cheap", 3, 0.0, 1000, **on_a)
    await wait_for(lambda: all(copies(s, f.key) == 2 for f in dear), "the dear keys protected")
    assert all(copies(s, f.key) == 1 for f in cheap)
    assert policy_of(s).ctx.costs.at_risk.get(a.address, 0) < WORK  # only the cheap keys
    await a.close()
    await wait_for(lambda: a.address not in s.workers, "the worker gone")
    results = await c.gather(dear + cheap)
    assert [len(r) for r in results] == [1000] * 6
    assert [counter.processing[f.key] for f in dear] == [1, 1, 1]  # never recomputed
    assert [counter.processing[f.key] for f in cheap] == [2, 2, 2]  # recomputed
    # Down to one copy each: protected again on the workers left.
    await wait_for(
        lambda: all(copies(s, f.key) == 2 for f in dear), "the dear keys two copies again"
    )
    no_errors(s)


@gen_cluster(
    client=True,
    nthreads=[("", 2)] * 3,
    config=amm_config(protect_rules("1 MiB")),
    timeout=90,
)
async def test_copies_on_a_worker_on_its_way_out_do_not_count(c, s, a, b, w):
    """A worker drained (it keeps its copies until it leaves, and leaves at its
    deadline) holds the second copy of protected keys: those copies count no more, as
    the planner counts them; each key gets its second copy on a worker that stays
    before the drained one goes."""
    dear = await stage(c, "dear", 3, WORK, 1000, workers=[a.address])
    keys = {f.key for f in dear}
    await wait_for(lambda: all(copies(s, k) == 2 for k in keys), "the dear keys protected")
    # The worker holding most of the second copies leaves.
    second = [h for k in keys for h in holders(s, k) if h != a.address]
    gone = max({b.address, w.address}, key=second.count)
    stays = ({b.address, w.address} - {gone}).pop()
    await c.scheduler.amm_rules_drain(workers=[gone], deadline="60s")

    def staying() -> list[set[str]]:
        return [holders(s, k) - {gone} for k in sorted(keys)]

    await wait_for(
        lambda: all(h == {a.address, stays} for h in staying()),
        "two copies of each on the workers that stay",
        show=lambda: (staying(), policy_of(s).ctx.leaving()),
    )
    no_errors(s)


@gen_cluster(client=True, nthreads=[("", 2)] * 3, config=amm_config(None, start=False), timeout=90)
async def test_keys_already_in_memory_on_a_quiet_cluster_are_protected(c, s, a, b, w):
    """The section attached over data persisted before it, with nothing computing: its
    first choice comes while the keys wait to be classified, and no key entering
    memory brings another; the keys are protected once classified all the same."""
    dear = await stage(c, "dear", 3, WORK, 1000, workers=[a.address])
    # One key classified per cycle: the first choices see the others waiting.
    policy = RulesPolicy(rules=protect_rules("1 MiB"), classify_keys=1)
    amm = ActiveMemoryManagerExtension(s, {policy}, register=False, start=True, interval=0.05)
    try:
        await wait_for(
            lambda: all(copies(s, f.key) == 2 for f in dear),
            "the keys persisted before the section protected",
            show=lambda: (dict(policy.ctx.claims.of("protect")), status_report(policy)["protect"]),
        )
        assert set(policy.ctx.claims.of("protect")) == {f.key for f in dear}
    finally:
        amm.stop()
        policy.detach()
    no_errors(s)


@gen_cluster(
    client=True,
    nthreads=[("", 2)],
    config=amm_config(protect_rules("1 MiB"), inflight_timeout=600),
    timeout=90,
)
async def test_a_key_no_worker_can_take_is_put_off_until_a_worker_joins(c, s, a):
    """Alone on its worker, a protected key has nowhere to go: it is put off (for the
    in-flight timeout, here ten minutes) rather than looked at every cycle, and copied
    as soon as a worker joins."""
    dear = await stage(c, "dear", 2, WORK, 1000)
    section = policy_of(s).section(ProtectSection)
    keys = {f.key for f in dear}
    await wait_for(
        lambda: set(section.later) == keys,
        "both keys put off",
        show=lambda: (dict(policy_of(s).ctx.claims.of("protect")), dict(section.later)),
    )
    assert set(section.short) == set()
    async with Worker(s.address, nthreads=1):
        await wait_for(lambda: all(copies(s, k) == 2 for k in keys), "copied once a worker joined")
        assert section.later == {}
        no_errors(s)


@gen_cluster(client=True, nthreads=[("", 2)] * 2, config=amm_config(None, start=False), timeout=90)
async def test_a_choice_among_many_keys_is_made_over_several_cycles(c, s, a, b, monkeypatch):
    """No cycle spends more than CHOOSE_SLICE looking at candidates: here one key per
    slice, so a choice among four keys takes four cycles, and the keys are protected
    once it is made."""
    monkeypatch.setattr(protect_module, "GATHER_CHUNK", 1)
    monkeypatch.setattr(protect_module, "CHOOSE_SLICE", 0.0)
    dear = await stage(c, "dear", 4, WORK, 1000, workers=[a.address])
    policy = RulesPolicy(rules=protect_rules("1 MiB"))
    amm = ActiveMemoryManagerExtension(s, {policy}, register=False, start=False)
    section = policy.section(ProtectSection)
    keys = {f.key for f in dear}
    try:
        seen_choosing = 0
        for _ in range(40):
            amm.run_once()
            seen_choosing += section.status()["choosing"]
            if set(policy.ctx.claims.of("protect")) == keys:
                break
        assert set(policy.ctx.claims.of("protect")) == keys
        assert section.status()["choice_cycles"] == 4
        assert seen_choosing >= 3  # the cycles before the last of the choice
        await wait_for(lambda: all(copies(s, k) == 2 for k in keys), "the four keys copied")
    finally:
        policy.detach()
    no_errors(s)


@gen_cluster(
    client=True,
    nthreads=[("", 2)] * 2,
    # Workers that keep their data in a plain dict (nothing to spill), with a 10 MiB
    # limit: by process memory (the test process's, hundreds of MiB) every one is past
    # a 70% spill threshold. The AMM measures managed memory, far below protect's 80%.
    worker_kwargs={"memory_limit": "10 MiB", "data": dict},
    config={
        **amm_config(protect_rules("1 MiB")),
        "distributed.scheduler.active-memory-manager.measure": "managed",
        "distributed.worker.memory.target": False,
        "distributed.worker.memory.spill": 0.7,
        "distributed.worker.memory.pause": False,
        "distributed.worker.memory.terminate": False,
    },
    timeout=90,
)
async def test_no_protection_copy_goes_to_a_worker_at_its_spill_threshold(c, s, a, b):
    import dask

    dear = await stage(c, "dear", 2, WORK, 1000, workers=[a.address])
    policy = policy_of(s)
    await wait_for(lambda: set(policy.ctx.claims.of("protect")) == {f.key for f in dear}, "chosen")
    await wait_cycles(s, 10)
    assert [copies(s, f.key) for f in dear] == [1, 1]  # b spills already: no copy there
    with dask.config.set({"distributed.worker.memory.spill": False}):
        await wait_for(lambda: all(copies(s, f.key) == 2 for f in dear), "copies once no spill")
    no_errors(s)
