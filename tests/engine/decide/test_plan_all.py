"""``replicate: all`` and ``{min: N, max: all}`` in the pure planner, and the demand hold.

No cluster: hand-built views in, exact actions out (helpers from ``test_planner``).
``all`` is one copy on every eligible worker: inside the key's pool, outside its avoided
pools, not retiring; it grows with workers that join and shrinks with those that leave.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from amm_rules.client import plain_target, validate_annotation
from amm_rules.engine.decide.plan import plan_key, target_bounds
from amm_rules.engine.decide.view import ClusterView, WorkerView
from amm_rules.engine.state.governed import Placement, PlanClass
from amm_rules.engine.state.index import KeyIndex
from amm_rules.language.fields import ActionError, parse_target
from amm_rules.language.ruleset import ALL, Desired, Target
from tests.engine.decide.test_plan import SETTINGS, key, ops, rule, settle, workers

EVERY = Target.exact(ALL)


@dataclass(frozen=True)
class Holder:
    """A stand-in for a WorkerState in ``ts.who_has``."""

    address: str
    host: str


def test_all_bounds_follow_the_eligible_workers():
    assert EVERY.bounds(4) == (4, 4)
    assert EVERY.bounds(0) == (1, 1)  # a key keeps its last copy, eligible or not
    assert Target(2, ALL).bounds(5) == (2, 5)
    assert Target(2, ALL).bounds(1) == (2, 2)  # max never below min
    assert Target(1, ALL).bounds(3) == (1, 3)
    assert Target(ALL, None).bounds(3) == (3, None)
    assert EVERY.follows_cluster and Target(2, ALL).follows_cluster
    assert not Target.exact(3).follows_cluster
    assert str(EVERY) == "all" and str(Target(2, ALL)) == "{min: 2, max: all}"
    d = rule(replicate=EVERY)
    assert target_bounds(d, 0, True, 3) == (3, 3)


def test_all_is_written_as_users_write_it():
    assert parse_target("all") == EVERY
    assert parse_target({"min": 2, "max": "all"}) == Target(2, ALL)
    assert plain_target(EVERY) == "all"
    assert plain_target(Target(2, ALL)) == {"min": 2, "max": "all"}
    assert validate_annotation({"replicate": "all", "pool": "gpu"}) == {
        "replicate": "all",
        "pool": "gpu",
    }
    assert validate_annotation({"replicate": {"min": 2, "max": "all"}}) == {
        "replicate": {"min": 2, "max": "all"}
    }
    with pytest.raises(ActionError, match="max \\(3\\) is below min \\(all\\)"):
        parse_target({"min": "all", "max": 3})
    with pytest.raises(ActionError, match="write 'all' in lower case"):
        parse_target("ALL")
    with pytest.raises(ActionError, match="expected a whole number of copies or 'all'"):
        parse_target("everywhere")


def test_all_copies_to_every_worker():
    cluster = workers("a b c d")
    view, history = settle(key(rule(replicate=EVERY), "a"), cluster)
    assert view.holders == {"a", "b", "c", "d"}
    assert history == [[("replicate", "b"), ("replicate", "c"), ("replicate", "d")]]


def test_all_inside_a_pool_counts_only_that_pool():
    cluster = workers("a:gpu b:gpu c d")
    plan = plan_key(key(rule(replicate=EVERY, pool="gpu"), "c"), cluster, SETTINGS)
    assert sorted(ops(plan)) == [("replicate", "a"), ("replicate", "b")]
    assert (plan.lo, plan.hi, plan.eligible) == (2, 2, 2)
    # Once both gpu workers hold it, the copy outside the pool goes.
    view, _ = settle(key(rule(replicate=EVERY, pool="gpu"), "c"), cluster)
    assert view.holders == {"a", "b"}


def test_all_outside_avoided_pools():
    cluster = workers("a:spot b c")
    view, _ = settle(key(rule(replicate=EVERY, avoid="spot"), "a"), cluster)
    assert view.holders == {"b", "c"}


def test_all_expands_to_a_joining_worker_and_shrinks_with_a_leaving_one():
    held = key(rule(replicate=EVERY), "a", "b", "c")
    assert plan_key(held, workers("a b c"), SETTINGS).actions == []
    # d joined: one copy, to d, in the first cycle that sees it.
    plan = plan_key(held, workers("a b c d"), SETTINGS)
    assert ops(plan) == [("replicate", "d")] and plan.unmet is None
    # c left: the two copies left are the target, not an unmet one.
    plan = plan_key(key(rule(replicate=EVERY), "a", "b"), workers("a b"), SETTINGS)
    assert plan.actions == [] and plan.unmet is None and plan.lo == 2


def test_all_over_retiring_and_paused_workers():
    closing = WorkerView("c", host="c", status="closing")
    paused = WorkerView("p", host="p", status="paused")
    cluster = workers("a b", c=closing, p=paused)
    plan = plan_key(key(rule(replicate=EVERY), "a"), cluster, SETTINGS)
    # A retiring worker is not eligible; a paused one is, but cannot receive now.
    assert ops(plan) == [("replicate", "b")]
    assert plan.lo == 3 and "1 paused" in (plan.unmet or "")


def test_min_with_max_all_adds_to_min_and_never_trims_good_copies():
    d = rule(replicate=Target(2, ALL))
    plan = plan_key(key(d, "a"), workers("a b c d"), SETTINGS)
    assert len(plan.replicas) == 1 and plan.drops == []
    plan = plan_key(key(d, "a", "b", "c", "d"), workers("a b c d"), SETTINGS)
    assert plan.actions == []
    # Outside the pool is not "all": a misplaced copy still goes.
    d = rule(replicate=Target(2, ALL), pool="gpu")
    view, _ = settle(key(d, "a", "b", "c"), workers("a:gpu b:gpu c"))
    assert view.holders == {"a", "b"}


def test_all_with_spread_host_covers_every_worker_not_only_hosts():
    cluster = ClusterView(
        [WorkerView("a1", host="h1"), WorkerView("a2", host="h1"), WorkerView("b1", host="h2")]
    )
    view, _ = settle(key(rule(replicate=EVERY, spread="host"), "a1"), cluster)
    assert view.holders == {"a1", "a2", "b1"}


def test_no_eligible_worker_keeps_the_last_copy_and_says_so():
    plan = plan_key(key(rule(replicate=EVERY, pool="gpu"), "a"), workers("a b"), SETTINGS)
    assert plan.actions == [] and plan.lo == 1
    assert "0 eligible workers" in (plan.unmet or "")


def test_the_index_checks_all_against_the_current_workers():
    """KeyIndex.suspects, the cheap per-cycle test: a key held on every eligible worker
    passes; the same key once a worker joined does not."""
    index = KeyIndex()
    d = rule(replicate=EVERY)
    holders = [Holder("a", "h"), Holder("b", "h")]
    ts = SimpleNamespace(key="x", who_has=set(holders), nbytes=8)
    index.governed.put("x", ts, d)
    cls = PlanClass.of(d)
    assert list(index.governed.suspects(cls, Placement(None, 2, 1), True)) == []
    assert list(index.governed.suspects(cls, Placement(None, 3, 1), True)) == [ts]


def test_the_demand_hold_keeps_copies_recently_read():
    """Keys without a replication target: the default trimming keeps one copy plus the
    waiters' (here none), except copies the hold keeps."""
    d = rule(pool=None, spread="none")
    cluster = workers("a b c d")
    plan = plan_key(key(d, "a", "b", "c"), cluster, SETTINGS)
    assert len(plan.drops) == 2
    plan = plan_key(key(d, "a", "b", "c", held=frozenset({"b", "c"})), cluster, SETTINGS)
    assert plan.drops == ["a"]
    plan = plan_key(key(d, "a", "b", "c", held=frozenset({"a", "b", "c"})), cluster, SETTINGS)
    assert plan.actions == []
    # A replication target wins over the hold: max is max.
    held = frozenset({"a", "b", "c"})
    plan = plan_key(key(rule(replicate=1), "a", "b", "c", held=held), cluster, SETTINGS)
    assert len(plan.drops) == 2


def test_a_desired_without_all_is_unchanged():
    d = Desired()
    assert target_bounds(d, 0, True, 5) == (1, 1)
    assert target_bounds(d, 3, True, 5) == (1, 3)
    assert target_bounds(d, 3, False, 5) == (1, None)
