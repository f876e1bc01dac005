"""The planner as a pure function: small hand-built views in, exact actions out.

No cluster: each case builds workers and one key, runs :func:`plan_key`, and checks the
actions (op, worker) and the reported state. ``apply`` plays the actions onto the view
as if every transfer landed, for the multi-cycle and idempotence cases.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from amm_rules.engine.adapters import stock_waiter_count
from amm_rules.engine.decide.plan import (
    DEFAULT_SOURCE,
    KeyPlan,
    PlanSettings,
    plan_key,
    reduce_replicas_excess,
)
from amm_rules.engine.decide.view import ClusterView, KeyView, WorkerView
from amm_rules.language.ruleset import Desired, Reason, Target

NOW = 1000.0
SETTINGS = PlanSettings(now=NOW, inflight_timeout=10.0)


def rule(name: str = "r", **fields: object) -> Desired:
    """A Desired whose every field comes from rule ``name``."""
    if isinstance(fields.get("replicate"), int):
        fields["replicate"] = Target.exact(fields["replicate"])  # type: ignore[arg-type]
    for f in ("pool", "avoid"):
        if isinstance(fields.get(f), str):
            fields[f] = (fields[f],)
    return Desired(reasons={f: Reason("rule", name) for f in fields}, **fields)  # type: ignore[arg-type]


def workers(spec: str, **extra: WorkerView) -> ClusterView:
    """``"a b c"`` → workers a, b, c on hosts of the same name, running, memory 0.
    ``"a:gpu b:gpu,fast c"`` puts a and b in pool gpu (b also in fast)."""
    views = []
    for item in spec.split():
        addr, _, pools = item.partition(":")
        views.append(
            WorkerView(addr, host=addr, pools=frozenset(p for p in pools.split(",") if p))
        )
    views.extend(extra.values())
    return ClusterView(views)


def key(desired: Desired, *holders: str, **kw: object) -> KeyView:
    return KeyView(key="x", desired=desired, holders=frozenset(holders), nbytes=100, **kw)  # type: ignore[arg-type]


def ops(plan: KeyPlan) -> list[tuple[str, str]]:
    return [(a.op, a.worker) for a in plan.actions]


def apply(view: KeyView, plan: KeyPlan) -> KeyView:
    """The cluster after every action succeeded and every copy landed (the ledger then
    has nothing in flight, and the copies as just landed)."""
    holders = set(view.holders)
    for a in plan.actions:
        (holders.add if a.op == "replicate" else holders.discard)(a.worker)
    return replace(
        view,
        holders=frozenset(holders),
        inflight={},
        backoff=plan.backoff,
        landed=frozenset(plan.replicas),
    )


def settle(
    view: KeyView, cluster: ClusterView, cycles: int = 5
) -> tuple[KeyView, list[list[tuple[str, str]]]]:
    """Plan and apply until nothing is left to do; returns the final view and the history."""
    history = []
    for _ in range(cycles):
        plan = plan_key(view, cluster, SETTINGS)
        if not plan.actions:
            return view, history
        history.append(ops(plan))
        view = apply(view, plan)
    raise AssertionError(f"no fixed point after {cycles} cycles: {history}")


# ---------------------------------------------------------------------------------
# replication targets


def test_exact_target_adds_on_least_loaded_workers():
    cluster = workers("a b c d")
    cluster.memory.update(a=50, b=10, c=30, d=20)
    plan = plan_key(key(rule(replicate=3), "a"), cluster, SETTINGS)
    assert ops(plan) == [("replicate", "b"), ("replicate", "d")]
    assert plan.actions[0].reason == "below replicate=3 (r)"
    assert plan.actions[0].source == "r"
    assert plan.unmet is None
    assert set(plan.inflight) == {"b", "d"}


def test_exact_target_trims_most_loaded_down_to_target():
    cluster = workers("a b c d")
    cluster.memory.update(a=50, b=10, c=30, d=20)
    plan = plan_key(key(rule(replicate=2), "a", "b", "c", "d"), cluster, SETTINGS)
    assert ops(plan) == [("drop", "a"), ("drop", "c")]
    assert "above max" in plan.actions[0].reason


def test_target_met_does_nothing():
    plan = plan_key(key(rule(replicate=2), "a", "b"), workers("a b c"), SETTINGS)
    assert plan.actions == [] and plan.unmet is None


def test_min_max_adds_below_min_and_trims_above_max():
    d = rule(replicate=Target(2, 3))
    assert ops(plan_key(key(d, "a"), workers("a b c d e"), SETTINGS)) == [("replicate", "b")]
    assert ops(plan_key(key(d, "a", "b", "c"), workers("a b c d e"), SETTINGS)) == []
    assert (
        len(plan_key(key(d, "a", "b", "c", "d", "e"), workers("a b c d e"), SETTINGS).drops) == 2
    )


def test_min_without_max_never_trims():
    d = rule(replicate=Target(2, None))
    assert ops(plan_key(key(d, "a", "b", "c", "d"), workers("a b c d"), SETTINGS)) == []


def test_lost_copies_are_recreated():
    # b held a copy and died: it is not in the cluster any more, nor among the holders.
    cluster = workers("a c")
    plan = plan_key(key(rule(replicate=2), "a"), cluster, SETTINGS)
    assert ops(plan) == [("replicate", "c")]


def test_holders_not_in_cluster_are_ignored():
    plan = plan_key(key(rule(replicate=2), "a", "gone"), workers("a b"), SETTINGS)
    assert ops(plan) == [("replicate", "b")]


# ---------------------------------------------------------------------------------
# in-flight copies (the ledger's: when they land, expire or are forgotten is
# tests/engine/state/test_ledger.py's)


def test_inflight_copy_counts_toward_target_and_is_not_requested_again():
    view = key(rule(replicate=2), "a", inflight={"b": NOW + 5})
    plan = plan_key(view, workers("a b c"), SETTINGS)
    assert plan.actions == []
    assert plan.inflight == {"b": NOW + 5}


def test_new_copies_count_in_flight_with_their_deadline():
    plan = plan_key(key(rule(replicate=2), "a"), workers("a b"), SETTINGS)
    assert plan.inflight == {"b": NOW + SETTINGS.inflight_timeout}


def test_a_landed_copy_counts_as_a_holder():
    view = key(rule(replicate=2), "a", "b", landed=frozenset({"b"}))
    plan = plan_key(view, workers("a b c"), SETTINGS)
    assert plan.actions == [] and plan.inflight == {} and plan.landed == {"b"}


def test_workers_backing_off_are_not_asked():
    view = key(rule(replicate=2), "a", backoff={"b": NOW + 10.0})
    plan = plan_key(view, workers("a b c"), SETTINGS)
    assert ops(plan) == [("replicate", "c")]
    assert plan.backoff == {"b": NOW + 10.0}
    # With every other worker backing off too, nothing is asked, and the key is unmet.
    later = replace(view, backoff={"b": NOW + 10.0, "c": NOW + 10.0})
    plan2 = plan_key(later, workers("a b c"), SETTINGS)
    assert plan2.actions == []
    assert "backing off" in (plan2.unmet or "")


def test_pending_from_other_policies_is_counted():
    view = key(rule(replicate=2), "a", "b", pending_drop=frozenset({"b"}))
    assert ops(plan_key(view, workers("a b c"), SETTINGS)) == [("replicate", "c")]
    view = key(rule(replicate=2), "a", pending_add=frozenset({"c"}))
    assert ops(plan_key(view, workers("a b c"), SETTINGS)) == []


# ---------------------------------------------------------------------------------
# pools, avoid, spread


def test_pool_copies_only_on_pool_workers():
    cluster = workers("a:gpu b c:gpu d:gpu")
    plan = plan_key(key(rule(replicate=3, pool="gpu"), "a"), cluster, SETTINGS)
    assert sorted(plan.replicas) == ["c", "d"]


def test_pool_move_in_copies_first_then_drops_after_landing():
    cluster = workers("a b:gpu")
    view = key(rule(pool="gpu"), "a")
    # Cycle 1: copy onto the pool; the outside copy stays until the copy lands.
    plan1 = plan_key(view, cluster, SETTINGS)
    assert ops(plan1) == [("replicate", "b")]
    assert plan1.misplaced == {"a": "outside pool gpu"}
    # Cycle 2, copy not landed yet: nothing new.
    plan2 = plan_key(replace(view, inflight=plan1.inflight), cluster, SETTINGS)
    assert plan2.actions == []
    # Cycle 3, copy landed: drop the outside copy.
    landed = replace(view, holders=frozenset({"a", "b"}), landed=frozenset({"b"}))
    plan3 = plan_key(landed, cluster, SETTINGS)
    assert ops(plan3) == [("drop", "a")]
    assert plan3.actions[0].reason == "outside pool gpu"


def test_pool_move_in_with_target_keeps_outside_copies_until_target_held_inside():
    cluster = workers("a b p1:gpu p2:gpu")
    view = key(rule(replicate=2, pool="gpu"), "a", "b", "p1")
    plan = plan_key(view, cluster, SETTINGS)
    # One good copy: one outside copy stays until p2 lands; the other is above max.
    assert ops(plan) == [("replicate", "p2"), ("drop", "a")]
    final, history = settle(view, cluster)
    assert final.holders == {"p1", "p2"}
    assert history[-1] == [("drop", "b")]


def test_empty_pool_is_unmet_and_nothing_is_asked():
    cluster = workers("a b")
    plan = plan_key(key(rule(replicate=2, pool="gpu"), "a"), cluster, SETTINGS)
    assert plan.actions == []
    assert plan.eligible == 0
    assert plan.unmet and "0 eligible workers" in plan.unmet


def test_empty_pool_still_trims_above_max():
    plan = plan_key(key(rule(replicate=2, pool="gpu"), "a", "b", "c"), workers("a b c"), SETTINGS)
    assert len(plan.drops) == 1


def test_avoid_is_the_mirror_of_pool():
    cluster = workers("a:spot b c:spot")
    view = key(rule(replicate=2, avoid="spot"), "a")
    plan = plan_key(view, cluster, SETTINGS)
    assert ops(plan) == [("replicate", "b")]  # c is avoided; a's copy stays for now
    final, _ = settle(view, cluster)
    assert final.holders == {"b"}  # only one allowed worker: held as far as possible
    assert "in avoided pool spot" in plan.misplaced["a"]


def test_spread_host_places_copies_on_distinct_hosts():
    cluster = ClusterView(
        [
            WorkerView("a1", host="A"),
            WorkerView("a2", host="A"),
            WorkerView("b1", host="B", memory=100),
            WorkerView("c1", host="C", memory=100),
        ]
    )
    plan = plan_key(key(rule(replicate=3, spread="host"), "a1"), cluster, SETTINGS)
    assert sorted(plan.replicas) == ["b1", "c1"]  # a2 is less loaded but on host A


def test_spread_host_with_too_few_hosts_still_meets_the_count():
    cluster = ClusterView(
        [WorkerView("a1", host="A"), WorkerView("a2", host="A"), WorkerView("b1", host="B")]
    )
    plan = plan_key(key(rule(replicate=3, spread="host"), "a1"), cluster, SETTINGS)
    assert sorted(plan.replicas) == ["a2", "b1"]
    assert plan.unmet is None


def test_spread_host_moves_a_copy_off_a_shared_host():
    cluster = ClusterView(
        [WorkerView("a1", host="A"), WorkerView("a2", host="A"), WorkerView("b1", host="B")]
    )
    view = key(rule(replicate=2, spread="host"), "a1", "a2")
    plan = plan_key(view, cluster, SETTINGS)
    assert ops(plan) == [("replicate", "b1")]
    assert plan.actions[0].reason == "spread: host"
    final, history = settle(view, cluster)
    assert len(final.holders) == 2 and "b1" in final.holders
    assert history[-1][0][0] == "drop" and history[-1][0][1] in {"a1", "a2"}


def test_trim_prefers_duplicated_hosts_under_spread():
    cluster = ClusterView(
        [
            WorkerView("a1", host="A"),
            WorkerView("a2", host="A"),
            WorkerView("b1", host="B", memory=1000),  # most loaded, but alone on its host
        ]
    )
    plan = plan_key(key(rule(replicate=2, spread="host"), "a1", "a2", "b1"), cluster, SETTINGS)
    assert len(plan.drops) == 1 and plan.drops[0] in {"a1", "a2"}


# ---------------------------------------------------------------------------------
# move: never, unmet targets, safety


def test_move_never_is_left_alone():
    for holders in (("a",), ("a", "b", "c")):
        plan = plan_key(key(rule(replicate=2, move="never"), *holders), workers("a b c"), SETTINGS)
        assert plan.actions == [] and plan.frozen


def test_unmet_target_is_held_as_far_as_possible_and_not_retried():
    cluster = workers("a b")
    view = key(rule(replicate=5), "a")
    plan = plan_key(view, cluster, SETTINGS)
    assert ops(plan) == [("replicate", "b")]
    assert plan.unmet == "wants 5 copies, holds or awaits 2: 2 eligible workers"
    again = plan_key(apply(view, plan), cluster, SETTINGS)
    assert again.actions == [] and again.unmet


def test_paused_workers_hold_but_do_not_receive():
    cluster = ClusterView([WorkerView("a"), WorkerView("b", status="paused"), WorkerView("c")])
    plan = plan_key(key(rule(replicate=3), "a"), cluster, SETTINGS)
    assert ops(plan) == [("replicate", "c")]
    assert "1 paused" in (plan.unmet or "")
    # A paused holder counts toward the target.
    assert plan_key(key(rule(replicate=2), "a", "b"), cluster, SETTINGS).actions == []


def test_copies_on_retiring_workers_do_not_count():
    cluster = ClusterView([WorkerView("a", status="closing"), WorkerView("b"), WorkerView("c")])
    view = key(rule(replicate=2), "a", "b")
    plan = plan_key(view, cluster, SETTINGS)
    assert ops(plan) == [("replicate", "c")]
    final, _ = settle(view, cluster)
    assert final.holders == {"b", "c"}


def test_never_drops_the_last_copy():
    # The only copy is outside the pool and the pool cannot take it: it stays.
    cluster = ClusterView(
        [WorkerView("a"), WorkerView("b", pools=frozenset({"gpu"}), status="paused")]
    )
    plan = plan_key(key(rule(pool="gpu"), "a"), cluster, SETTINGS)
    assert plan.drops == []
    # Trimming to max=1 with a single holder: nothing.
    assert plan_key(key(rule(replicate=1), "a"), workers("a b"), SETTINGS).actions == []


def test_never_drops_below_min_counting_landed_eligible_copies():
    # min 3: two good copies and one in flight; an extra outside copy is not dropped
    # before the in-flight copy lands, and good copies are never trimmed below 3.
    cluster = workers("a p1:gpu p2:gpu p3:gpu")
    view = key(rule(replicate=Target(3, 3), pool="gpu"), "a", "p1", "p2", inflight={"p3": NOW + 5})
    plan = plan_key(view, cluster, SETTINGS)
    assert plan.drops == []
    landed = replace(view, holders=view.holders | {"p3"}, inflight={}, landed=frozenset({"p3"}))
    assert ops(plan_key(landed, cluster, SETTINGS)) == [("drop", "a")]


def test_drop_waits_where_a_dependent_is_processing():
    plan = plan_key(
        key(rule(replicate=1), "a", "b", busy=frozenset({"a", "b"})), workers("a b"), SETTINGS
    )
    assert plan.actions == [] and plan.deferred
    plan = plan_key(
        key(rule(replicate=1), "a", "b", busy=frozenset({"a"})), workers("a b"), SETTINGS
    )
    assert ops(plan) == [("drop", "b")]


def test_a_copy_that_just_landed_is_dropped_last():
    cluster = workers("a b c")
    cluster.memory.update(a=0, b=0, c=500)  # c is the most loaded ...
    view = key(rule(replicate=2), "a", "b", "c", landed=frozenset({"c"}))  # ... and just landed
    assert plan_key(view, cluster, SETTINGS).drops == ["a"]


# ---------------------------------------------------------------------------------
# reduce-replicas


def test_pool_without_target_keeps_one_copy_plus_waiters():
    cluster = workers("p1:gpu p2:gpu p3:gpu")
    view = key(rule(pool="gpu"), "p1", "p2", "p3", waiters=2)
    plan = plan_key(view, cluster, SETTINGS)
    assert len(plan.drops) == 1 and plan.source == DEFAULT_SOURCE
    no_reduce = replace(SETTINGS, reduce_replicas=False)
    assert plan_key(view, cluster, no_reduce).actions == []


class _Waiter:
    def __init__(self, processing_on: object):
        self.processing_on = processing_on


@pytest.mark.parametrize(
    "processing_on, expected",
    [
        ([], 0),
        ([None], 1),  # one waiter: counted without looking
        (["w1", "w1"], 1),  # two on the same worker count once
        (["w1", "w2", None, None], 4),  # unassigned waiters count one each
        (["w1"] * 25, 25),  # 20 or more: the plain count, as the stock policy does
    ],
)
def test_stock_waiter_count_matches_reduce_replicas(processing_on, expected):
    ts = SimpleNamespace(waiters={_Waiter(p) for p in processing_on} or None)
    assert stock_waiter_count(ts) == expected


class _Task:
    """The attributes of a scheduler TaskState that ReduceReplicas reads."""

    def __init__(self, holders: int, processing_on: list[object]):
        self.who_has = {f"h{i}" for i in range(holders)}
        self.waiters = {_Waiter(p) for p in processing_on} or None


@pytest.mark.parametrize("holders", [2, 3, 5])
@pytest.mark.parametrize(
    "processing_on", [[], [None], ["w1", "w1"], ["w1", "w2", None], ["w1"] * 25]
)
@pytest.mark.parametrize("pending", [(0, 0), (1, 0), (0, 1)])
def test_reduce_replicas_parity_with_the_stock_policy(holders, processing_on, pending):
    """Run the stock ReduceReplicas on a stand-in scheduler and compare drop counts."""
    from distributed.active_memory_manager import ReduceReplicas

    ts = _Task(holders, processing_on)
    pending_sets = ({f"r{i}" for i in range(pending[0])}, {f"d{i}" for i in range(pending[1])})
    stock = ReduceReplicas()
    stock.manager = SimpleNamespace(  # type: ignore[assignment]
        scheduler=SimpleNamespace(replicated_tasks=[ts]), pending={ts: pending_sets}
    )
    expected = sum(1 for _ in stock.run())
    ours = reduce_replicas_excess(holders, stock_waiter_count(ts), *map(len, pending_sets))
    assert max(ours, 0) == expected


def test_reduce_replicas_excess_matches_stock_arithmetic():
    # len(who_has) - max(1, waiters) + pending replicas - pending drops
    assert reduce_replicas_excess(3, 0) == 2
    assert reduce_replicas_excess(3, 2) == 1
    assert reduce_replicas_excess(3, 5) == -2
    assert reduce_replicas_excess(3, 0, pending_add=1, pending_drop=2) == 1


# ---------------------------------------------------------------------------------
# idempotence and no oscillation


#: (workers, what the key wants, its holders, where it must end: copies, on which workers).
CASES = [
    ("a b c d", rule(replicate=3), ("a",), (3, {"a", "b", "c", "d"})),
    ("a b c d", rule(replicate=2), ("a", "b", "c", "d"), (2, {"a", "b", "c", "d"})),
    ("a b:gpu c:gpu", rule(replicate=2, pool="gpu"), ("a",), (2, {"b", "c"})),
    ("a:spot b c", rule(replicate=Target(1, None), avoid="spot"), ("a",), (1, {"b", "c"})),
    ("a b:gpu", rule(pool="gpu"), ("a", "b"), (1, {"b"})),
]


@pytest.mark.parametrize("spec, desired, holders, end", CASES)
def test_applying_a_plan_then_planning_again_yields_nothing_opposite(spec, desired, holders, end):
    cluster = workers(spec)
    view = key(desired, *holders)
    final, history = settle(view, cluster)
    added = {w for step in history for op, w in step if op == "replicate"}
    dropped = {w for step in history for op, w in step if op == "drop"}
    assert not added & dropped, history  # nothing copied to a worker and dropped there
    # The fixed point (no action left: settle() stops there) is what the key wants.
    count, allowed = end
    assert len(final.holders) == count and final.holders <= allowed, (final.holders, history)
    # It gets there in at most two cycles: copies, then the drops of a move, whose
    # copy must land first.
    assert len(history) <= 2, history


def test_a_copy_made_to_move_a_key_into_its_pool_counts_under_the_pool_rule() -> None:
    """A key with no target of its own, outside its pool: the copy into the pool and the
    drop outside it are both the pool rule's doing (status counters, simulate reports)."""
    desired = Desired(pool=("gpu",), reasons={"pool": Reason("rule", "device")})
    plan = plan_key(key(desired, "a"), workers("a b:gpu"), SETTINGS)
    assert [(a.op, a.worker, a.source) for a in plan.actions] == [("replicate", "b", "device")]
    landed = plan_key(key(desired, "a", "b"), workers("a b:gpu"), SETTINGS)
    assert [(a.op, a.worker, a.source) for a in landed.actions] == [("drop", "a", "device")]
