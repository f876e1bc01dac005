"""Recompute costs on a real scheduler (:mod:`amm_rules.engine.state.costs`, the
recompute-costs section): what tasks cost is learnt as they finish, ancestors released
make their dependents dearer, the work at risk follows the sole copies, and status,
explain and metrics show it."""

from __future__ import annotations

import time
from typing import Any

import pytest
from distributed.utils_test import gen_cluster

from amm_rules.engine.sections.costs import RecomputeCostsSection
from amm_rules.observe.explain import explain_keys
from amm_rules.observe.status import status_report
from amm_rules.observe.text import render_explain
from benchmarks.support.waiting import wait_for
from tests.support.cluster import amm_config, no_errors, policy_of

#: Seconds each first-stage task works (measured by the scheduler, not asserted on).
WORK = 0.3


def slow(i: int, seconds: float = WORK) -> bytes:
    time.sleep(seconds)  # work: a task that computes for a while
    return bytes(100 + i)


def combine(x: bytes) -> int:
    return len(x)


def costs_of(s: Any) -> Any:
    return policy_of(s).ctx.costs


KEPT = {"version": 1, "protect": {"budget": "1 kB"}}


@pytest.mark.parametrize("rules", [None, KEPT], ids=["group-figures", "keys-kept"])
def test_costs_learnt_and_ancestors_released_make_dependents_dearer(rules: Any) -> None:
    # Without the protect section the model reads the scheduler's figures per group;
    # with it, the keys are kept per group and each task finishing is counted.
    gen_cluster(client=True, nthreads=[("", 2)] * 2, config=amm_config(rules), timeout=90)(
        _costs_learnt
    )(kept=rules is not None)


async def _costs_learnt(c: Any, s: Any, a: Any, b: Any, kept: bool) -> None:
    first = c.map(slow, range(4), key=[f"first-{i}" for i in range(4)])
    second = c.map(combine, first, key=[f"second-{i}" for i in range(4)])
    await c.gather(second)
    policy = policy_of(s)
    costs = costs_of(s)
    group_first = s.tasks["first-0"].group
    group_second = s.tasks["second-0"].group

    def estimate(group: Any) -> float | None:
        return costs.estimate(group)

    await wait_for(lambda: (estimate(group_first) or 0) > 0, "the first stage's estimate")
    own = estimate(group_first)
    assert own is not None and own >= WORK * 0.9  # what the tasks took, per task
    entry = costs.groups[group_first]
    if kept:
        assert entry.source == "measured" and entry.finished == 4
        assert costs.groups[group_second].fanin == {group_first: 1}
    else:
        assert entry.source == "group average" and entry.finished == 0
        assert costs.groups[group_second].fanin is None  # the groups' sizes: 4 and 4
    # While the first stage is in memory, the second stage costs only its own time.
    assert (estimate(group_second) or 0) < WORK / 2
    del first
    await wait_for(
        lambda: "first-0" not in s.tasks or s.tasks["first-0"].state == "released",
        "the first stage released",
    )
    await wait_for(
        lambda: (estimate(group_second) or 0) >= own * 0.9,
        "the second stage now carries its released ancestor",
        show=lambda: estimate(group_second),
    )
    section = policy.section(RecomputeCostsSection)
    explained = section.explain(s.tasks["second-0"], 0.0)
    assert explained["ancestors"] == 1.0
    assert explained["text"].startswith("recompute ≈ ")
    assert "1 ancestor released" in explained["text"]
    text = render_explain(explain_keys(policy, ["second-0"]))
    assert "\n  recompute ≈ " in text and "1 ancestor released" in text
    assert "recompute  recompute" not in text
    no_errors(s)


@gen_cluster(client=True, nthreads=[("", 2)] * 2, config=amm_config(), timeout=90)
async def test_work_at_risk_follows_the_sole_copies(c, s, a, b):
    futures = c.map(slow, range(4), key=[f"w-{i}" for i in range(4)], workers=[a.address])
    await c.gather(futures)
    costs = costs_of(s)
    await wait_for(lambda: costs.at_risk.get(a.address, 0) > 0, "work at risk on a")
    group = s.tasks["w-0"].group
    per_key = costs.estimate(group)
    assert costs.sole[group] == {a.address: 4}
    assert abs(costs.at_risk[a.address] - 4 * per_key) < 1e-6
    assert costs.at_risk.get(b.address, 0) == 0
    # A second copy: the key is no longer a's alone.
    await c.replicate([futures[0]], n=2)
    await wait_for(lambda: costs.sole[group].get(a.address) == 3, "one key on two workers")
    assert abs(costs.at_risk[a.address] - 3 * per_key) < 1e-6
    report = status_report(policy_of(s))["recompute"]
    assert report["workers"][0] == {
        "worker": a.address,
        "seconds": round(3 * per_key, 3),
        "keys": 3,
    }
    assert report["total_seconds"] == round(3 * per_key, 3)
    del futures
    await wait_for(lambda: not costs.sole[group].get(a.address), "the keys released")
    assert costs.total_at_risk() < 1e-6
    no_errors(s)
