"""Where a leaving worker's keys go, as a pure function (:mod:`amm_rules.engine.decide.evacuate`):
hand-built views in, exact copies and verdicts out."""

from __future__ import annotations

from amm_rules.engine.decide.evacuate import leaving_view, plan_evacuation
from amm_rules.engine.decide.view import KeyView, WorkerView
from amm_rules.language.ruleset import UNGOVERNED, Desired, Reason, Target

NOW = 1000.0


def rule(name: str = "r", **fields: object) -> Desired:
    if isinstance(fields.get("replicate"), int):
        fields["replicate"] = Target.exact(fields["replicate"])  # type: ignore[arg-type]
    for f in ("pool", "avoid"):
        if isinstance(fields.get(f), str):
            fields[f] = (fields[f],)
    return Desired(reasons={f: Reason("rule", name) for f in fields}, **fields)  # type: ignore[arg-type]


def cluster(spec: str, leaving: str = "", **memory: int):
    """``"a:gpu b c@h1"``: workers a (pool gpu), b, c (on host h1; else its own host);
    ``paused`` workers end with ``!``; ``leaving`` names the leaving ones."""
    views = []
    for item in spec.split():
        paused = item.endswith("!")
        item = item.rstrip("!")
        name, _, host = item.partition("@")
        addr, _, pools = name.partition(":")
        views.append(
            WorkerView(
                addr,
                host=host or addr,
                status="paused" if paused else "running",
                pools=frozenset(p for p in pools.split(",") if p),
                memory=memory.get(addr, 0),
            )
        )
    return leaving_view(views, leaving.split())


def key(name: str, desired: Desired, *holders: str, nbytes: int = 100, **kw: object) -> KeyView:
    return KeyView(key=name, desired=desired, holders=frozenset(holders), nbytes=nbytes, **kw)  # type: ignore[arg-type]


def copies(plan) -> list[tuple[str, str]]:
    return [(c.key, c.worker) for c in plan.copies]


def test_a_key_held_alone_goes_to_the_least_loaded_worker_that_stays():
    view = cluster("a b c", leaving="a", b=50, c=10)
    plan = plan_evacuation([key("k", UNGOVERNED, "a")], view, now=NOW)
    assert copies(plan) == [("k", "c")]
    assert plan.copies[0].reason == "held only on leaving workers"
    assert not plan.settled


def test_a_key_held_elsewhere_is_satisfied_and_the_plan_settled():
    view = cluster("a b", leaving="a")
    plan = plan_evacuation([key("k", UNGOVERNED, "a", "b")], view, now=NOW)
    assert plan.satisfied == ["k"] and plan.copies == [] and plan.settled


def test_pool_copies_stay_in_the_pool_even_when_other_workers_are_emptier():
    view = cluster("g0:gpu g1:gpu c0 c1", leaving="g0", g1=1000)
    plan = plan_evacuation([key("k", rule("dev", pool="gpu"), "g0")], view, now=NOW)
    assert copies(plan) == [("k", "g1")] and plan.copies[0].source == "(reduce-replicas)"


def test_a_copy_outside_the_pool_does_not_satisfy_a_pool_key():
    view = cluster("g0:gpu g1:gpu c0", leaving="g0")
    plan = plan_evacuation([key("k", rule("dev", pool="gpu"), "g0", "c0")], view, now=NOW)
    assert copies(plan) == [("k", "g1")]


def test_avoid_keeps_copies_off_the_avoided_pool():
    view = cluster("a b s0:spot s1:spot", leaving="a", b=1000)
    plan = plan_evacuation([key("k", rule("safe", avoid="spot"), "a")], view, now=NOW)
    assert copies(plan) == [("k", "b")]


def test_spread_puts_the_copies_on_hosts_without_one_first():
    # b1 and b2 share host h2, which holds a copy already; c is on its own host.
    view = cluster("a@h1 b1@h2 b2@h2 c@h3", leaving="a", c=1000)
    d = rule("spread", replicate=2, spread="host")
    plan = plan_evacuation([key("k", d, "a", "b1")], view, now=NOW)
    assert copies(plan) == [("k", "c")]
    assert plan.copies[0].reason == "below replicate=2 on the workers that stay"


def test_the_target_is_recreated_on_the_workers_that_stay():
    view = cluster("a b c d", leaving="a")
    plan = plan_evacuation([key("k", rule("three", replicate=3), "a", "b", "c")], view, now=NOW)
    assert copies(plan) == [("k", "d")]


def test_the_target_is_held_as_far_as_the_eligible_workers_allow():
    view = cluster("a:gpu b:gpu c", leaving="a")
    plan = plan_evacuation([key("k", rule("r", replicate=3, pool="gpu"), "a", "b")], view, now=NOW)
    assert plan.satisfied == ["k"]  # one eligible worker stays, and holds it


def test_move_never_held_alone_is_stuck_and_names_its_rule():
    view = cluster("a b", leaving="a")
    plan = plan_evacuation([key("k", rule("frozen", move="never"), "a")], view, now=NOW)
    assert plan.copies == [] and [(s.key, s.why, s.rule) for s in plan.stuck] == [
        ("k", "move: never", "frozen")
    ]


def test_move_never_with_a_copy_that_stays_is_satisfied():
    view = cluster("a b", leaving="a")
    plan = plan_evacuation([key("k", rule("frozen", move="never"), "a", "b")], view, now=NOW)
    assert plan.satisfied == ["k"] and not plan.stuck


def test_no_eligible_worker_is_stuck_and_says_which_pool_and_what_is_paused():
    view = cluster("g0:gpu g1:gpu! c0", leaving="g0")
    plan = plan_evacuation([key("k", rule("dev", pool="gpu"), "g0")], view, now=NOW)
    (stuck,) = plan.stuck
    assert stuck.rule == "dev"
    assert stuck.why == "no eligible worker: pool gpu has no running worker that stays (1 paused)"


def test_a_key_surviving_outside_its_empty_pool_is_not_stuck():
    view = cluster("g0:gpu c0", leaving="g0")
    plan = plan_evacuation([key("k", rule("dev", pool="gpu"), "g0", "c0")], view, now=NOW)
    assert plan.satisfied == ["k"] and not plan.stuck and not plan.copies


def test_copies_in_flight_or_pending_count_and_are_not_asked_again():
    view = cluster("a b c", leaving="a")
    flying = key("k1", UNGOVERNED, "a", inflight={"b": NOW + 5})
    pending = key("k2", UNGOVERNED, "a", pending_add=frozenset({"c"}))
    expired = key("k3", UNGOVERNED, "a", inflight={"b": NOW - 1})
    plan = plan_evacuation([flying, pending, expired], view, now=NOW)
    assert plan.waiting == {"k1": "copy in flight", "k2": "copy in flight"}
    assert [c.key for c in plan.copies] == ["k3"]


def test_backing_off_workers_are_not_chosen():
    view = cluster("a b c", leaving="a", c=1000)
    plan = plan_evacuation([key("k", UNGOVERNED, "a", backoff={"b": NOW + 5})], view, now=NOW)
    assert copies(plan) == [("k", "c")]


def test_room_is_respected_and_updated_as_copies_are_planned():
    view = cluster("a b c", leaving="a", b=50, c=10)
    room = {"b": 250, "c": 100}
    keys = [key(f"k{i}", UNGOVERNED, "a", nbytes=100) for i in range(4)]
    plan = plan_evacuation(keys, view, now=NOW, room=room)
    # c is the least loaded but has room for one; b for two; the fourth key waits.
    assert copies(plan) == [("k0", "c"), ("k1", "b"), ("k2", "b")]
    assert plan.waiting == {"k3": "no eligible worker has room for it"}
    assert room == {"b": 50, "c": 0}


def test_the_budget_stops_the_plan_but_always_lets_one_copy_through():
    view = cluster("a b", leaving="a")
    keys = [key(f"k{i}", UNGOVERNED, "a", nbytes=100) for i in range(3)]
    plan = plan_evacuation(keys, view, now=NOW, budget=250)
    assert [c.key for c in plan.copies] == ["k0", "k1"] and plan.budget_spent
    big = plan_evacuation([key("huge", UNGOVERNED, "a", nbytes=10_000)], view, now=NOW, budget=250)
    assert [c.key for c in big.copies] == ["huge"]
    spent = plan_evacuation(keys, view, now=NOW, budget=0, first_free=False)
    assert spent.copies == [] and set(spent.waiting) == {"k0", "k1", "k2"}


def test_several_leaving_workers_none_is_a_recipient_nor_counts():
    view = cluster("a b c d", leaving="a b", d=1000)
    plan = plan_evacuation([key("k", rule("two", replicate=2), "a", "b")], view, now=NOW)
    assert sorted(w for _, w in copies(plan)) == ["c", "d"]
