"""The decider table (:mod:`amm_rules.engine.decide.deciders`), and the planner's fast path
held to it.

The replication planner (:func:`~amm_rules.engine.decide.plan.plan_key`) does not ask the
table worker by worker (that would cost O(workers) per key at a million keys); explain,
the rebalancer and the demo do. Both read what is in flight and backing off from the
same view of the engine's ledger (what it records is tests/engine/state/test_ledger.py's,
nothing is derived twice); over random clusters and keys (``tests.support.views``), their
placements must agree:

- every worker the planner copies a key to is ``yes`` in the table (the first copy with
  every decider; later ones, which see the first, with all but ``spread``);
- a key the planner leaves short, asking nothing, has no ``yes`` worker;
- the copies the planner calls misplaced are exactly those :func:`stays` refuses, for
  the same reason;
- the workers where a copy counts are the cluster view's ``placeable`` workers, and
  :func:`count_copies` counts the target as the planner bounds it.

Plus the table's own cases, one decider at a time.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings

from amm_rules.engine.decide.deciders import (
    DECIDERS,
    MOVE,
    NO,
    THROTTLED,
    YES,
    Question,
    count_copies,
    decide,
    eligible,
    first_refusal,
    stays,
    verdict,
    worker_reasons,
)
from amm_rules.engine.decide.plan import plan_key, target_bounds
from amm_rules.engine.decide.view import ClusterView, KeyView, WorkerView
from amm_rules.engine.state.ledger import Ledger
from amm_rules.language.ruleset import Desired, Reason, Target
from tests.support.views import NOW, SETTINGS, reduce_flags, scenarios


@settings(max_examples=1_000)
@given(scenarios(pending=False), reduce_flags)
def test_the_planners_fast_path_agrees_with_the_decider_table(scenario, reduce) -> None:
    workers, views = scenario
    for view in views:
        cluster = ClusterView(workers)  # a fresh tally per key: each is judged alone
        plan = plan_key(view, cluster, replace(SETTINGS, reduce_replicas=reduce))
        question = Question(view, ClusterView(workers))
        by_address = question.cluster.workers
        context = f"{view}\nplan: {plan.actions}"
        copies = [a.worker for a in plan.actions if a.op == "replicate"]
        for i, address in enumerate(copies):
            said = decide(question, by_address[address], spread=i == 0)
            assert verdict(said) == YES, f"{context}\n{address}: {said}"
        counted = (plan.good | plan.inflight.keys()) if not plan.frozen else plan.good
        if not copies and len(counted) < plan.lo:
            yes = [a for a, w in by_address.items() if verdict(decide(question, w)) == YES]
            assert not yes, f"{context}\nshort, nothing asked, yet yes on {yes}"
        if not plan.frozen:
            expected = {
                a: said.why
                for a in view.holders - view.pending_drop
                if a in by_address and (said := stays(view.desired, by_address[a])) is not None
            }
            assert plan.misplaced == expected, context


@settings(max_examples=300)
@given(scenarios(), reduce_flags)
def test_eligible_workers_and_copy_counts_are_the_planners(scenario, reduce) -> None:
    workers, views = scenario
    cluster = ClusterView(workers)
    for view in views:
        d = view.desired
        placeable = cluster.placeable(d.pool, d.avoid)
        assert eligible(d, workers) == placeable
        count = count_copies(d, view.holders, placeable, view.waiters, reduce)
        assert (count.lo, count.hi) == target_bounds(d, view.waiters, reduce, len(placeable))
        assert count.good == view.holders & placeable
        assert count.misplaced == view.holders - placeable
        assert count.short == max(0, count.lo - len(count.good))


# -- the table, case by case ---------------------------------------------------------


def wish(**fields) -> Desired:
    return Desired(reasons={f: Reason("rule", "r") for f in fields}, **fields)


def ask(d: Desired, workers: list[WorkerView], **key) -> dict[str, list[tuple[str, str]]]:
    q = Question(KeyView("k", d, **{"holders": frozenset({"w0"}), **key}), ClusterView(workers))
    return {w.address: [(x.decider, x.says) for x in decide(q, w)] for w in workers}


def test_every_decider_says_what_it_is_about() -> None:
    workers = [
        WorkerView("w0", "h0", pools=frozenset({"gpu"})),
        WorkerView("w1", "h1", pools=frozenset({"gpu", "spot"})),
        WorkerView("w2", "h2", "paused", frozenset({"gpu"})),
        WorkerView("w3", "h3", "closing", frozenset({"gpu"})),
        WorkerView("w4", "h4"),
        WorkerView("w5", "h5", pools=frozenset({"gpu"})),
        WorkerView("w6", "h0", pools=frozenset({"gpu"})),
    ]
    d = wish(replicate=Target.exact(3), pool=("gpu",), avoid=("spot",), spread="host")
    said = ask(d, workers, inflight={"w5": NOW + 5}, backoff={"w6": NOW + 5})
    assert said == {
        "w0": [("holds", NO)],
        "w1": [("avoid", NO)],
        "w2": [("paused", THROTTLED)],
        "w3": [("retiring", NO)],
        "w4": [("pool", NO)],
        "w5": [("in flight", THROTTLED)],
        # Same host as w0's copy, but no other host is open: spread lets it be.
        "w6": [("backoff", THROTTLED)],
    }


def test_spread_says_no_only_while_another_host_is_open() -> None:
    workers = [WorkerView("w0", "h0"), WorkerView("w1", "h0"), WorkerView("w2", "h1")]
    d = wish(replicate=Target.exact(2), spread="host")
    assert ask(d, workers)["w1"] == [("spread", NO)]
    # h1's worker backed off: w1 is the only place, and spread does not stand in the way.
    assert ask(d, workers, backoff={"w2": NOW + 5})["w1"] == []


def test_a_move_may_not_land_on_a_host_with_another_copy() -> None:
    workers = [WorkerView("w0", "h0"), WorkerView("w1", "h1"), WorkerView("w2", "h1")]
    d = wish(spread="host")
    key = KeyView("k", d, frozenset({"w0", "w1"}))
    q = Question(key, ClusterView(workers), MOVE, sender="w0")
    assert first_refusal(q, ClusterView(workers).workers["w2"]).decider == "spread"
    # The sender's own copy is the one that leaves: its host does not count.
    q = Question(replace(key, holders=frozenset({"w0"})), ClusterView(workers), MOVE, sender="w0")
    assert first_refusal(q, ClusterView(workers).workers["w2"]) is None


def test_move_never_and_ungoverned_keys_get_no_copy() -> None:
    workers = [WorkerView("w0"), WorkerView("w1")]
    assert ask(wish(move="never"), workers)["w1"] == [("move: never", NO)]
    assert ask(Desired(), workers)["w1"] == [("no target", NO)]
    # Not classified yet: what it wants is unknown, the budget throttles it.
    q = Question(
        KeyView("k", Desired(), frozenset({"w0"})), ClusterView(workers), unclassified=True
    )
    assert [(x.decider, x.says) for x in decide(q, q.cluster.workers["w1"])] == [
        ("budget", THROTTLED)
    ]


def test_the_table_reads_the_ledger_as_the_planner_does() -> None:
    workers = [WorkerView("w0"), WorkerView("w1"), WorkerView("w2"), WorkerView("w3")]
    d = wish(replicate=Target.exact(4))
    ledger = Ledger()
    ledger.record("k", "w1", "replication", NOW - 1)
    ledger.back_off("k", ["w2"], NOW - 1)
    ledger.record("k", "w3", "protect", NOW + 5)
    ledger.expire(NOW, 10.0, lambda key: {"w0"}, lambda w: True)
    key = KeyView(
        "k",
        d,
        frozenset({"w0"}),
        inflight={a: c.deadline for a, c in ledger.in_flight("k").items()},
        backoff=dict(ledger.backing_off("k")),
    )
    q = Question(key, ClusterView(workers))
    # The copy to w1 timed out: backed off; w2's back-off is over; w3's copy (asked by
    # another section) is on its way.
    assert [x.decider for x in decide(q, q.cluster.workers["w1"])] == ["backoff"]
    assert decide(q, q.cluster.workers["w2"]) == []
    assert [x.decider for x in decide(q, q.cluster.workers["w3"])] == ["in flight"]
    plan = plan_key(key, ClusterView(workers), SETTINGS)
    assert plan.replicas == ["w2"] and set(plan.inflight) == {"w2", "w3"}


def test_recipient_max_for_moves() -> None:
    workers = [WorkerView("w0", memory=10), WorkerView("w1", memory=90)]
    key = KeyView("k", Desired(), frozenset({"w0"}))
    q = Question(key, ClusterView(workers), MOVE, recipient_max=0.8, limits={"w1": 100})
    assert first_refusal(q, q.cluster.workers["w1"]).decider == "recipient-max"


def test_worker_reasons_name_the_first_decider() -> None:
    workers = [WorkerView("w0"), WorkerView("w1", pools=frozenset({"gpu"})), WorkerView("w2")]
    key = KeyView("k", wish(replicate=Target.exact(2), pool=("gpu",)), frozenset({"w0"}))
    assert worker_reasons(key, ClusterView(workers)) == {
        "w0": "holds a copy",
        "w1": "candidate",
        "w2": "outside pool gpu",
    }


def test_the_table_lists_each_decider_once() -> None:
    names = [name for name, _ in DECIDERS]
    assert len(names) == len(set(names))
    assert {"pool", "avoid", "spread", "paused", "retiring", "in flight", "backoff"} <= set(names)
    assert {"move: never", "budget", "recipient-max"} <= set(names)
