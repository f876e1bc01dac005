"""Safety properties of the pure planner, over random clusters (hypothesis, no cluster).

Each example draws workers (hosts, pools, running / paused / retiring, memory) and keys
(targets exact, ``{min, max}`` or ``all`` in either bound, ``pool``, ``avoid``, ``spread``, ``move``, copies on
live and departed workers, waiters and dependents processing, copies in flight with
live or expired deadlines, workers backed off, what other policies had accepted in the
same cycle, copies the demand hold keeps), plans every key with :func:`amm_rules.engine.decide.plan.plan_key` on one shared
:class:`~amm_rules.engine.decide.view.ClusterView` as the policy does, and checks what the engine
promises (docs/policy.md, "Safety guarantees"):

- never drops the last copy; never drops where a dependent is processing; drops only
  copies that exist and that no other policy is already dropping;
- never drops below a key's ``min`` while it is unmet: eligible copies are never trimmed
  below the target, and a misplaced copy goes only once the eligible copies hold the
  target (as far as the pool allows) or the key is above ``max``;
- a new copy goes only to a running worker inside the key's pool, outside its avoided
  pools, that neither holds the key, nor has it in flight, nor is backed off;
- ``move: never`` keys are never touched;
- a key without a replication target never loses a copy the demand hold keeps;
- no oscillation: a plan never copies to and drops from the same worker; playing plans
  until nothing is left reaches a fixed point in a few cycles, without ever dropping a
  copy from a worker it copied to (or copying back to one it dropped from);
- a repeated cycle with no change in the cluster asks for nothing new.

Example counts: about 3,000 examples in all under the ``ci`` profile (``CI=true``).
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings

from amm_rules.engine.decide.plan import KeyPlan, plan_key
from amm_rules.engine.decide.view import ClusterView, KeyView, WorkerView
from amm_rules.language.ruleset import ALL, Desired, Reason, Target
from tests.support.views import NOW, SETTINGS, reduce_flags, scenarios

# ---------------------------------------------------------------------------------
# Checks


def placeable(workers: dict[str, WorkerView], d: Desired) -> set[str]:
    """Workers where a copy of the key counts (allowed and not retiring)."""
    return {
        a
        for a, w in workers.items()
        if (d.pool is None or not w.pools.isdisjoint(d.pool))
        and (d.avoid is None or w.pools.isdisjoint(d.avoid))
        and w.status != "closing"
    }


def documented_bounds(
    d: Desired, waiters: int, reduce: bool, eligible: int
) -> tuple[int, int | None]:
    """The copies a governed key may hold, ``(least, most)``, as docs/rules.md and
    docs/policy.md state them (written here from the docs, not taken from the planner):
    ``replicate: n`` is exactly n, ``{min, max}`` is min to max (no max: no upper
    bound), and ``all`` is the number of eligible workers (at least one: a key keeps its
    last copy), a ``max: all`` below ``min`` trimming nothing. Without ``replicate`` a key
    keeps one copy, and with reduce-replicas on it is trimmed as the stock
    ReduceReplicas trims, to one copy per worker where its waiters run (``waiters``, at
    least one); with reduce-replicas off it is never trimmed."""
    if d.replicate is None:
        return 1, (max(waiters, 1) if reduce else None)
    every = max(eligible, 1)
    least = every if d.replicate.min == ALL else d.replicate.min
    most = every if d.replicate.max == ALL else d.replicate.max
    if most is not None and most < least:
        most = least  # only where max is all: an explicit max below min does not load
    return least, most


def check_plan(view: KeyView, plan: KeyPlan, workers: dict[str, WorkerView], reduce: bool) -> None:
    """Every safety property of one key's plan, judged from the cluster before it."""
    d = view.desired
    adds = [a.worker for a in plan.actions if a.op == "replicate"]
    drops = [a.worker for a in plan.actions if a.op == "drop"]
    context = f"{view}\nplan: {plan.actions}"

    # move: never is never touched.
    if d.move == "never":
        assert plan.actions == [] and plan.inflight == {}, context
        return

    # No worker is asked twice, nor both to copy and to drop.
    assert len(set(adds)) == len(adds), context
    assert len(set(drops)) == len(drops), context
    assert not set(adds) & set(drops), context

    # New copies: running, inside the pool, outside avoided pools, not holding the key,
    # not already receiving it (from us or another policy), not backed off.
    live_backoff = {a for a, t in view.backoff.items() if t > NOW}
    expired = {a for a, t in view.inflight.items() if t <= NOW and a not in view.holders}
    still_inflight = {
        a for a, t in view.inflight.items() if t > NOW and a in workers and a not in view.holders
    }
    for a in adds:
        w = workers.get(a)
        assert w is not None and w.status == "running", context
        assert d.pool is None or not w.pools.isdisjoint(d.pool), context
        assert d.avoid is None or w.pools.isdisjoint(d.avoid), context
        assert a not in view.holders and a not in view.pending_add, context
        assert a not in still_inflight, f"copy requested again while in flight\n{context}"
        assert a not in live_backoff and a not in expired, context

    # Drops: of live copies nobody else is dropping, never where a dependent runs.
    holders = {a for a in view.holders if a in workers} - view.pending_drop
    for a in drops:
        assert a in holders, context
        assert a not in view.busy, context
    remaining = holders - set(drops)
    # Never the last copy.
    if holders:
        assert remaining, f"last copy dropped\n{context}"

    # Never below min: eligible copies are never trimmed below the target ...
    ok = placeable(workers, d)
    lo, hi = documented_bounds(d, view.waiters, reduce, len(ok))
    good = holders & ok
    assert len(good - set(drops)) >= min(len(good), lo), f"trimmed below min\n{context}"
    # ... and a misplaced copy goes only once the eligible copies hold the target (as
    # far as the pool allows), or when the key holds more than max.
    misplaced_dropped = [a for a in drops if a not in ok]
    if misplaced_dropped:
        holds_target = len(good) >= max(1, min(lo, len(ok)))
        above_max = hi is not None and len(remaining) >= hi
        assert holds_target or above_max, f"misplaced copy dropped below min\n{context}"
    # Good copies are trimmed only above max, and never while copies are being added.
    good_dropped = [a for a in drops if a in ok]
    if d.replicate is None:
        held = [a for a in good_dropped if a in view.held]
        assert not held, f"dropped a copy the demand hold keeps\n{context}"
    if good_dropped:
        assert hi is not None and len(good) > hi, context
        if adds:
            # Only under spread: host, thinning out a host that holds two copies
            # while a copy goes to a new host (a move between hosts).
            hosts = [workers[a].host for a in good]
            shared = all(hosts.count(workers[a].host) > 1 for a in good_dropped)
            assert d.spread == "host" and shared, f"trims while it adds\n{context}"


def plan_all(
    workers: list[WorkerView], views: list[KeyView], reduce: bool
) -> tuple[ClusterView, list[KeyPlan]]:
    cluster = ClusterView(workers)
    plans = [plan_key(v, cluster, replace(SETTINGS, reduce_replicas=reduce)) for v in views]
    return cluster, plans


# ---------------------------------------------------------------------------------
# Properties


@settings(max_examples=1_500)
@given(scenarios(), reduce_flags)
def test_one_cycle_is_safe(scenario: tuple[list[WorkerView], list[KeyView]], reduce: bool) -> None:
    workers, views = scenario
    by_address = {w.address: w for w in workers}
    _, plans = plan_all(workers, views, reduce)
    for view, plan in zip(views, plans, strict=True):
        check_plan(view, plan, by_address, reduce)


def apply(view: KeyView, plan: KeyPlan, now: float) -> KeyView:
    """The next cycle's view of the key: every copy landed (the ledger has them as just
    landed, and still in flight those asked earlier that did not), every drop happened,
    and what other policies did last cycle is no longer pending."""
    holders = set(view.holders) - view.pending_drop | view.pending_add
    for a in plan.actions:
        (holders.add if a.op == "replicate" else holders.discard)(a.worker)
    return replace(
        view,
        holders=frozenset(holders),
        inflight={a: t for a, t in plan.inflight.items() if a not in holders},
        landed=frozenset(a for a in plan.inflight if a in holders),
        backoff=plan.backoff,
        pending_add=frozenset(),
        pending_drop=frozenset(),
        busy=view.busy & holders,
    )


def land(
    workers: list[WorkerView], views: list[KeyView], plans: list[KeyPlan]
) -> list[WorkerView]:
    """Workers' memory after the plans were enacted (as the next cycle measures it)."""
    memory = {w.address: w.memory for w in workers}
    for view, plan in zip(views, plans, strict=True):
        for a in plan.actions:
            delta = view.nbytes if a.op == "replicate" else -view.nbytes
            memory[a.worker] = max(0, memory[a.worker] + delta)
    return [replace(w, memory=memory[w.address]) for w in workers]


@settings(max_examples=800)
@given(scenarios(max_keys=4), reduce_flags)
def test_plans_settle_without_oscillation(
    scenario: tuple[list[WorkerView], list[KeyView]], reduce: bool
) -> None:
    """Play cycles (every copy lands, every drop happens, time stands still) until the
    planner asks for nothing: no copy dropped from a worker it was sent to, no copy
    sent back to a worker it was dropped from, and a fixed point within a few cycles."""
    workers, views = scenario
    by_address = {w.address: w for w in workers}
    history: list[list[set[tuple[str, str]]]] = [[] for _ in views]
    for _ in range(8):
        _, plans = plan_all(workers, views, reduce)
        if not any(p.actions for p in plans):
            break
        for i, (view, plan) in enumerate(zip(views, plans, strict=True)):
            check_plan(view, plan, by_address, reduce)
            history[i].append({(a.op, a.worker) for a in plan.actions})
        workers = land(workers, views, plans)
        views = [apply(v, p, NOW) for v, p in zip(views, plans, strict=True)]
    else:
        raise AssertionError(f"no fixed point after 8 cycles: {history}")
    for steps in history:
        added = {w for step in steps for op, w in step if op == "replicate"}
        dropped = {w for step in steps for op, w in step if op == "drop"}
        assert not added & dropped, f"ping-pong: {steps}"


@settings(max_examples=700)
@given(scenarios(pending=False), reduce_flags)
def test_a_repeated_cycle_with_no_change_asks_for_nothing_new(
    scenario: tuple[list[WorkerView], list[KeyView]], reduce: bool
) -> None:
    """The next cycle comes before any requested copy landed (a slow transfer). Drops
    are not in flight: the scheduler forgets a dropped copy the moment the AMM asks
    for the drop. The planner remembers the copies it asked for and asks for nothing."""
    workers, views = scenario
    _, first = plan_all(workers, views, reduce)
    again = []
    for view, plan in zip(views, first, strict=True):
        holders = set(view.holders) - view.pending_drop - set(plan.drops)
        again.append(
            replace(
                view,
                holders=frozenset(holders),
                inflight=plan.inflight,
                backoff=plan.backoff,
                pending_add=frozenset(),
                pending_drop=frozenset(),
                busy=view.busy & holders,
            )
        )
    _, second = plan_all(workers, again, reduce)
    for view, p1, p2 in zip(again, first, second, strict=True):
        assert p2.actions == [], f"{view}\nfirst: {p1.actions}\nsecond: {p2.actions}"


@settings(max_examples=300)
@given(scenarios(), reduce_flags)
def test_a_cycle_at_the_fixed_point_asks_for_nothing(
    scenario: tuple[list[WorkerView], list[KeyView]], reduce: bool
) -> None:
    """Once a cycle asked for nothing, the same cycle again (same cluster, in-flight
    copies carried over) asks for nothing either: no action storm on an unmet target."""
    workers, views = scenario
    for _ in range(8):
        _, plans = plan_all(workers, views, reduce)
        if not any(p.actions for p in plans):
            break
        workers = land(workers, views, plans)
        views = [apply(v, p, NOW) for v, p in zip(views, plans, strict=True)]
    views = [
        replace(v, inflight=p.inflight, backoff=p.backoff)
        for v, p in zip(views, plans, strict=True)
    ]
    for _ in range(3):
        _, plans = plan_all(workers, views, reduce)
        assert not any(p.actions for p in plans), [p.actions for p in plans]


# ---------------------------------------------------------------------------------
# Regressions: the smallest cases these properties found


def test_a_copy_in_flight_is_not_requested_again_when_the_key_is_short() -> None:
    """A holder died while a copy was in flight: the key is short again. The worker
    receiving the copy already counts; the missing copy goes to another worker."""
    workers = [WorkerView("w0"), WorkerView("w1"), WorkerView("w2", memory=500)]
    d = Desired(replicate=Target.exact(3), reasons={"replicate": Reason("rule", "r")})
    view = KeyView("k", d, holders=frozenset({"w0"}), inflight={"w1": NOW + 5})
    (plan,) = plan_all(workers, [view], True)[1]
    assert plan.replicas == ["w2"]
    assert set(plan.inflight) == {"w1", "w2"}


def test_spread_trim_does_not_thin_out_a_host_spread_needs() -> None:
    """Two copies share a host and dependents run on both; the third copy, alone on
    its host, is not trimmed instead (spread would copy it back next cycle)."""
    workers = [WorkerView("a1", "A"), WorkerView("a2", "A"), WorkerView("b1", "B")]
    d = Desired(
        replicate=Target.exact(2),
        spread="host",
        reasons={"replicate": Reason("rule", "r"), "spread": Reason("rule", "r")},
    )
    view = KeyView("k", d, holders=frozenset({"a1", "a2", "b1"}), busy=frozenset({"a1", "a2"}))
    (plan,) = plan_all(workers, [view], True)[1]
    assert plan.actions == [] and plan.deferred
    # Once a dependent finishes, the shared host is thinned out.
    (plan,) = plan_all(workers, [replace(view, busy=frozenset({"a1"}))], True)[1]
    assert plan.drops == ["a2"]


def spread_pair() -> Desired:
    return Desired(
        replicate=Target.exact(2),
        spread="host",
        reasons={"replicate": Reason("rule", "r"), "spread": Reason("rule", "r")},
    )


def test_spread_waits_for_a_host_another_policy_is_dropping_from() -> None:
    """Another policy drops the only copy on h1 in this cycle; the only other worker is
    on h0, next to the remaining copy. A copy there would be moved to h1 a cycle later,
    and dropped from the worker it was sent to: the planner waits one cycle and copies
    to h1 once the drop is done."""
    workers = [WorkerView("w0", "h0"), WorkerView("w1", "h0"), WorkerView("w2", "h1")]
    view = KeyView(
        "k",
        spread_pair(),
        holders=frozenset({"w0", "w2"}),
        pending_drop=frozenset({"w2"}),
        nbytes=100,
    )
    (plan,) = plan_all(workers, [view], True)[1]
    assert plan.actions == []
    assert plan.unmet is not None
    assert any("waits a cycle for w2" in d for d in plan.deferred), plan.deferred
    # Next cycle the drop is done: the copy goes back to h1, then nothing moves.
    history = []
    view = apply(view, plan, NOW)
    assert view.holders == {"w0"}
    for _ in range(4):
        (plan,) = plan_all(workers, [view], True)[1]
        if not plan.actions:
            break
        history.append([(a.op, a.worker) for a in plan.actions])
        workers = land(workers, [view], [plan])
        view = apply(view, plan, NOW)
    assert history == [[("replicate", "w2")]]
    assert view.holders == {"w0", "w2"} and plan.unmet is None


def test_spread_still_copies_to_a_shared_host_when_it_must() -> None:
    """The wait covers only the copies the dropped worker's host can take: with three
    copies wanted and two hosts, the second copy on h0 goes now."""
    workers = [
        WorkerView("w0", "h0"),
        WorkerView("w1", "h0"),
        WorkerView("w3", "h0", memory=50),
        WorkerView("w2", "h1"),
    ]
    d = replace(spread_pair(), replicate=Target.exact(3))
    view = KeyView("k", d, holders=frozenset({"w0", "w2"}), pending_drop=frozenset({"w2"}))
    (plan,) = plan_all(workers, [view], True)[1]
    assert plan.replicas == ["w1"]
    assert any("waits a cycle for w2" in d for d in plan.deferred), plan.deferred
    # A worker on h1 that is paused (not a drop in progress) gets no wait: the copy is
    # made on the shared host at once.
    workers[3] = replace(workers[3], status="paused")
    view = replace(view, pending_drop=frozenset())
    view = replace(view, holders=frozenset({"w0"}))
    (plan,) = plan_all(workers, [view], True)[1]
    assert sorted(plan.replicas) == ["w1", "w3"] and not plan.deferred
